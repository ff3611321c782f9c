// SPDX-License-Identifier: Apache-2.0
/*
 * Eviction by move (evict_move, uffd/capture.h's stages) against a real memd,
 * with ASan and UBSan: a page the kernel has pinned for I/O must not leave.
 * The pin here is io_uring's buffer registration, which pins its pages for as
 * long as they are registered, as an O_DIRECT read in flight pins its buffer
 * until the device has written it (fio's verify lost such reads when
 * eviction dropped them: bench/RESULTS.md, session 47). While the buffer is
 * registered its pages stay resident however hard the rest of the region
 * presses the budget; once it is not, they leave like the others. The same
 * again in a region whose pages a fork shared. Every page is checked byte
 * for byte. Run from the repository root.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (8ul << 20)
#define NPAGES (REGION / PG)
#define PINNED 32ul /* pages [0, PINNED) are the registered buffer */
#define REGISTER_BUFFERS 0
#define UNREGISTER_BUFFERS 1

static uint8_t state_of(const struct fm_resmap_hdr *h, uint64_t i)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;

	return fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE));
}

static unsigned pinned_remote(const struct fm_resmap_hdr *h)
{
	unsigned n = 0;

	for (uint64_t i = 0; i < PINNED; i++)
		n += state_of(h, i) == FM_PG_REMOTE;
	return n;
}

/* Rewrite the pages after the buffer at random, several times the budget over. */
static void press(uint8_t *a, uint32_t *ver, unsigned *seed)
{
	for (unsigned n = 0; n < 3 * NPAGES; n++) {
		uint64_t i = PINNED + (uint64_t)rand_r(seed) % (NPAGES - PINNED);
		write_page(a, i, ++ver[i]);
	}
}

/*
 * forked: the region's pages were shared with a child of a fork, which has
 * exited: the kernel refuses to move such a page until it is written or
 * unshared, as it refuses a pinned one (before session 51 eviction took every
 * refusal there for sharing, and dropped the pinned pages too).
 */
static void pinned_in(const char *sock, const char *fault, int forked)
{
	struct fm_pager *p = unit_pager_at(sock, fault, "1M", (const char *const[]){ "evict_move", "1", "fault", fault, NULL });
	struct iovec buf;
	uint32_t params[30] = { 0 }; /* struct io_uring_params, 120 bytes */
	const struct fm_resmap_hdr *h;
	unsigned seed = 7, tries = 0;
	uint32_t *ver = calloc(NPAGES, sizeof(*ver));
	uint64_t bad = 0, moved;
	uint8_t *a;
	long ring, rc = -1;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	ring = syscall(SYS_io_uring_setup, 4, params);
	CHECK(a && ver && ring >= 0);
	if (!a || !ver || ring < 0)
		goto out;
	for (uint64_t i = 0; i < NPAGES; i++)
		write_page(a, i, ver[i] = 1);
	if (forked) {
		pid_t child = fork();
		int status = -1;
		if (child == 0)
			_exit(0);
		CHECK(child > 0 && waitpid(child, &status, 0) == child && status == 0);
	}
	/* With fault=signal a pin of a page that is not resident fails (EFAULT): write them again and retry. */
	buf = (struct iovec){ a, PINNED * PG };
	while (rc && tries++ < 200) {
		for (uint64_t i = 0; i < PINNED; i++)
			write_page(a, i, ++ver[i]);
		rc = syscall(SYS_io_uring_register, ring, REGISTER_BUFFERS, &buf, 1);
		CHECK(!rc || errno == EFAULT);
	}
	CHECK(rc == 0);
	for (uint64_t i = 0; i < PINNED; i++)
		write_page(a, i, ++ver[i]);
	moved = h->stats.evictions_moved;
	press(a, ver, &seed);
	CHECK(h->stats.evictions_moved > moved);
	/* Chosen as victims, and kept: the kernel would not move them. */
	CHECK(h->stats.evict_pinned > 0);
	CHECK(pinned_remote(h) == 0);
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	CHECK(syscall(SYS_io_uring_register, ring, UNREGISTER_BUFFERS, NULL, 0) == 0);
	press(a, ver, &seed);
	CHECK(pinned_remote(h) > 0);
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	unit_region_end(p, a, REGION, bad);
	a = NULL;
out:
	if (ring >= 0)
		close((int)ring);
	if (a)
		munmap(a, REGION);
	free(ver);
	fm_pager_stop(p);
	printf("test_pager_pinned: fault=%s%s done\n", fault, forked ? ", forked" : "");
}

static void pinned(const char *sock, const char *fault)
{
	pinned_in(sock, fault, 0);
	pinned_in(sock, fault, 1);
}

int main(void)
{
	return unit_main("test_pager_pinned", pinned);
}
