// SPDX-License-Identifier: Apache-2.0
/*
 * Regions whose faults the kernel waits for (FM_REG_KERNEL_WAITS), against a
 * real memd, with ASan and UBSan. A malloc heap holds what a program hands
 * the kernel in small pieces; with fault=signal a system call that touches
 * an evicted page of a plain region fails with EFAULT, while in such a
 * region it sleeps until a handler thread installs the page.
 *
 * A region of each kind is written; rewriting the plain one pushes the
 * other out to memd. Then each evicted page of the waits region goes
 * through a pipe by raw system calls (write from it, read into another),
 * and is checked, as is every page of both regions afterwards. With
 * fault=signal the registration is refused before fm_pager_open_kernel_waits
 * and the second uffd's handler thread ("farmem-fault1") serves the region;
 * the shim's covers are not needed there (fm_pager_io_needed). Run from the
 * repository root.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define WAITS (8ul << 20)
#define PLAIN (24ul << 20)
#define NW (WAITS / PG)
#define NP (PLAIN / PG)

static uint64_t word(uint64_t page, uint32_t ver)
{
	return (page << 20) ^ ((uint64_t)ver * 0x9e3779b97f4a7c15ull);
}

static void fill(uint8_t *a, uint64_t i, uint32_t ver)
{
	uint64_t *w = (uint64_t *)(a + i * PG);

	for (unsigned k = 0; k < PG / 8; k += 64)
		w[k] = word(i, ver) + k;
}

/* Page at of a holds what fill wrote into page `page` at version ver. */
static int holds(const uint8_t *a, uint64_t at, uint64_t page, uint32_t ver)
{
	const uint64_t *w = (const uint64_t *)(a + at * PG);

	for (unsigned k = 0; k < PG / 8; k += 64)
		if (w[k] != word(page, ver) + k)
			return 0;
	return 1;
}

/* State of page i of the region in slot. */
static unsigned state(struct fm_resmap_hdr *h, int slot, uint64_t i)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[slot].map_offset;

	return fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE));
}

static void run(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	char addr[128], err[256];
	uint8_t *w, *pl;
	uint32_t *ver;
	unsigned seed = 7;
	uint64_t bad = 0, remote = 0, moved = 0, faults0;
	int pipefd[2], signal_mode = strcmp(fault, "signal") == 0;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	p = unit_pager(fault, addr, "6M", (const char *const[]){ "fault", fault, "transport", "stream", NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	w = mmap(NULL, WAITS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ver = calloc(NW, sizeof(*ver));
	CHECK(w != MAP_FAILED && ver && pipe(pipefd) == 0);
	if (w == MAP_FAILED || !ver)
		goto out;
	if (signal_mode) {
		CHECK(fm_pager_register(p, w, WAITS, FM_REG_KERNEL_WAITS) == -ENOTCONN);
		CHECK(!unit_thread_named("farmem-fault1"));
	}
	CHECK(fm_pager_open_kernel_waits(p, err, sizeof(err)) == 0);
	CHECK(fm_pager_open_kernel_waits(p, err, sizeof(err)) == 0); /* once */
	CHECK(fm_pager_register(p, w, WAITS, FM_REG_KERNEL_WAITS) == 0);
	if (signal_mode) /* a handler thread for these regions only (and its helper, fill_threads 2) */
		CHECK(unit_thread_started("farmem-fault1", 2000) && unit_thread_started("farmem-fault2", 2000));
	else /* the pager's own handler and its helper serve them: no third */
		CHECK(!unit_thread_named("farmem-fault2"));
	pl = unit_region(p, PLAIN, 0);
	if (!pl)
		goto out;
	/* The shim covers system calls on plain regions in SIGBUS mode only, and never on these. */
	CHECK(!fm_pager_io_needed(p, w + PG, 16));
	CHECK(fm_pager_io_needed(p, pl + PG, 16) == signal_mode);

	for (uint64_t i = 0; i < NW; i++)
		fill(w, i, ver[i] = 1);
	for (uint64_t i = 0; i < NP; i++)
		fill(pl, i, 1);
	for (unsigned n = 0; n < 2 * NP; n++)
		fill(pl, (uint64_t)rand_r(&seed) % NP, 1);
	faults0 = h->stats.faults;

	/*
	 * Page i of the waits region goes out through the pipe, from its
	 * evicted page, and comes back into page NW-1-i, evicted too (the
	 * plain region is rewritten in between): both are the kernel's faults.
	 */
	for (uint64_t i = 0; i < NW / 2; i++) {
		uint64_t j = NW - 1 - i;
		long n;

		if (state(h, 0, i) == FM_PG_REMOTE && state(h, 0, j) == FM_PG_REMOTE)
			remote++;
		n = syscall(SYS_write, pipefd[1], w + i * PG, PG);
		CHECK(n == (long)PG);
		n = syscall(SYS_read, pipefd[0], w + j * PG, PG);
		CHECK(n == (long)PG);
		if (n != (long)PG) {
			fprintf(stderr, "test_pager_kernel_waits (%s): page %llu: %s\n", fault, (unsigned long long)i,
				strerror(errno));
			break;
		}
		moved++;
		bad += !holds(w, j, i, ver[i]);
		for (unsigned k = 0; k < 16; k++)
			fill(pl, (uint64_t)rand_r(&seed) % NP, 1);
	}
	CHECK(moved == NW / 2 && bad == 0);
	/* Most pages went to memd before their system call: the kernel waited for them. */
	CHECK(remote > NW / 8);
	CHECK(h->stats.faults > faults0);
	bad = 0;
	for (uint64_t i = 0; i < NW / 2; i++)
		bad += !holds(w, i, i, ver[i]) || !holds(w, NW - 1 - i, i, ver[i]);
	for (uint64_t i = 0; i < NP; i++)
		bad += !holds(pl, i, i, 1);
	CHECK(bad == 0);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	/* One thread never has two faults waiting: the helper was never called (test_pager_helpers). */
	CHECK(h->stats.helped_faults == 0);
	CHECK(fm_pager_unregister(p, w, WAITS) == 0 && fm_pager_unregister(p, pl, PLAIN) == 0);
	munmap(pl, PLAIN);
out:
	if (w != MAP_FAILED)
		munmap(w, WAITS);
	free(ver);
	close(pipefd[0]);
	close(pipefd[1]);
	fm_pager_stop(p);
	printf("test_pager_kernel_waits: fault=%s done (%llu pages through a pipe, %llu both remote)\n", fault,
	       (unsigned long long)moved, (unsigned long long)remote);
}

int main(void)
{
	return unit_main("test_pager_kernel_waits", run);
}
