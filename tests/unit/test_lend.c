// SPDX-License-Identifier: Apache-2.0
/*
 * The lender (uffd/lend.h) of a real pager on a real memd, asked over its
 * socket as another process's process_vm_readv cover asks it, with ASan and
 * UBSan. With fault=signal: ranges that had left for memd are made resident
 * and stay while the budget is pressed; the next request gives the last
 * one's pins back, and so does the connection's end; requests that are not
 * well formed (magic, count, size, too many bytes) are refused with the
 * connection kept; a write into a region where the kernel waits is pinned
 * where the pages lie; every page is checked byte for byte. With fault=thread
 * there is no lender (the kernel waits for the pages there). Run from the
 * repository root.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "lend.h"
#include "page.h"
#include "pager_internal.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (8ul << 20)
#define NPAGES (REGION / PG)
#define LENT_A 0ul /* pages [0, 128): the first request */
#define LENT_B 1024ul /* pages [1024, 1040): the second */

static uint8_t state_of(const struct fm_resmap_hdr *h, uint64_t i)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;

	return fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE));
}

static unsigned remote_in(const struct fm_resmap_hdr *h, uint64_t first, uint64_t n)
{
	unsigned r = 0;

	for (uint64_t i = first; i < first + n; i++)
		r += state_of(h, i) == FM_PG_REMOTE;
	return r;
}

/* Rewrite the pages outside both lent ranges at random, three budgets over. */
static void press(uint8_t *a, uint32_t *ver, unsigned *seed)
{
	for (unsigned n = 0; n < 3 * 256; n++) {
		uint64_t i = 128 + (uint64_t)rand_r(seed) % (NPAGES - 128);
		if (i >= LENT_B && i < LENT_B + 16)
			continue;
		write_page(a, i, ++ver[i]);
	}
}

/* The lender's status for a raw message of len bytes; 1 when no answer came. */
static int status_of(int fd, const struct fm_lend_request *q, size_t len)
{
	struct fm_lend_reply a;
	struct pollfd pf = { .fd = fd, .events = POLLIN };

	if (send(fd, q, len, MSG_NOSIGNAL) != (ssize_t)len || poll(&pf, 1, 10000) != 1 ||
	    read(fd, &a, sizeof(a)) != (ssize_t)sizeof(a) || a.magic != FM_LEND_MAGIC)
		return 1;
	return a.status;
}

static void refused(int fd)
{
	struct fm_lend_request q = { .magic = FM_LEND_MAGIC, .n = 1, .r = { { 4096, 4096 } } };
	size_t one = offsetof(struct fm_lend_request, r) + sizeof(q.r[0]);

	q.magic = 0x12345678;
	CHECK(status_of(fd, &q, one) == -EINVAL);
	q.magic = FM_LEND_MAGIC;
	CHECK(status_of(fd, &q, one - 1) == -EINVAL); /* shorter than its count says */
	q.n = FM_LEND_RANGES + 1;
	CHECK(status_of(fd, &q, sizeof(q)) == -EINVAL);
	q.n = 2;
	q.r[1] = (struct fm_lend_range){ 8192, FM_LEND_BYTES };
	CHECK(status_of(fd, &q, one + sizeof(q.r[0])) == -E2BIG);
	q.n = 1;
	q.r[0] = (struct fm_lend_range){ UINT64_MAX - 10, 4096 };
	CHECK(status_of(fd, &q, one) == -EINVAL);
	q.r[0] = (struct fm_lend_range){ 4096, 4096 };
	q.write = 2;
	CHECK(status_of(fd, &q, one) == -EINVAL);
	/* Still served: a range in no paged memory is lent, and pins nothing. */
	q.write = 0;
	CHECK(status_of(fd, &q, one) == 0);
}

/*
 * A region where the kernel waits for pages: a write into it is lent as a pin
 * where the pages lie (the kernel writes past the page table, and eviction
 * must leave them alone), a read is not lent at all.
 */
static void in_place(struct fm_pager *p)
{
	char err[256];
	uint8_t *k;
	int fd, pins = atomic_load(&p->npins);

	CHECK(fm_pager_open_kernel_waits(p, err, sizeof(err)) == 0);
	k = unit_region(p, 1ul << 20, FM_REG_KERNEL_WAITS);
	fd = fm_lend_connect(getpid());
	CHECK(k && fd >= 0);
	if (!k || fd < 0)
		goto out;
	memset(k, 0x5a, 1ul << 20);
	CHECK(fm_lend_ask(fd, &(struct iovec){ k, 16 * PG }, 1, 1) == 0);
	CHECK(atomic_load(&p->npins) == pins + 1);
	CHECK(fm_lend_ask(fd, &(struct iovec){ k, 16 * PG }, 1, 0) == 0);
	CHECK(atomic_load(&p->npins) == pins);
	CHECK(fm_pager_unregister(p, k, 1ul << 20) == 0);
out:
	if (fd >= 0)
		close(fd);
	if (k)
		munmap(k, 1ul << 20);
}

static void lend(const char *sock, const char *fault)
{
	struct fm_pager *p = unit_pager_at(sock, fault, "1M", (const char *const[]){ "fault", fault, NULL });
	const struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(NPAGES, sizeof(*ver));
	unsigned seed = 11;
	uint64_t bad = 0;
	uint8_t *a;
	int fd;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	CHECK(a && ver);
	if (!a || !ver)
		goto out;
	for (uint64_t i = 0; i < NPAGES; i++)
		write_page(a, i, ver[i] = 1);
	fd = fm_lend_connect(getpid());
	if (!strcmp(fault, "thread")) {
		CHECK(fd < 0);
		if (fd >= 0)
			close(fd);
		goto check;
	}
	CHECK(fd >= 0);
	if (fd < 0)
		goto check;
	CHECK(remote_in(h, LENT_A, 128) > 100);
	{
		struct iovec v[2] = { { a + LENT_A * PG, 64 * PG }, { a + (LENT_A + 64) * PG, 64 * PG } };
		CHECK(fm_lend_ask(fd, v, 2, 1) == 0);
	}
	CHECK(remote_in(h, LENT_A, 128) == 0 && h->stats.lend_requests == 1 && atomic_load(&p->npins) == 2);
	press(a, ver, &seed);
	CHECK(remote_in(h, LENT_A, 128) == 0);
	/* The next request gives the first one's pins back: the first range leaves again. */
	CHECK(fm_lend_ask(fd, &(struct iovec){ a + LENT_B * PG, 16 * PG }, 1, 0) == 0);
	CHECK(atomic_load(&p->npins) == 1 && remote_in(h, LENT_B, 16) == 0);
	press(a, ver, &seed);
	for (uint64_t i = LENT_A; i < LENT_A + 128; i += 2)
		write_page(a, i, ++ver[i]); /* they came back written: nothing lost meanwhile */
	press(a, ver, &seed);
	CHECK(remote_in(h, LENT_A, 128) > 0 && remote_in(h, LENT_B, 16) == 0);
	{
		uint64_t lent = h->stats.lend_requests;
		refused(fd);
		CHECK(h->stats.lend_requests == lent + 1); /* the one well-formed request only */
	}
	CHECK(atomic_load(&p->npins) == 0);
	CHECK(fm_lend_ask(fd, &(struct iovec){ a + LENT_B * PG, 16 * PG }, 1, 0) == 0);
	CHECK(atomic_load(&p->npins) == 1);
	in_place(p);
	/* The connection's end gives its pins back. */
	close(fd);
	for (int tries = 0; tries < 1000 && atomic_load(&p->npins); tries++)
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	CHECK(atomic_load(&p->npins) == 0);
	CHECK(h->stats.peak_pins >= 2 && h->stats.pins_refused == 0);
check:
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	unit_region_end(p, a, REGION, bad);
	a = NULL;
out:
	if (a)
		munmap(a, REGION);
	free(ver);
	fm_pager_stop(p);
	printf("test_lend: fault=%s done\n", fault);
}

int main(void)
{
	return unit_main("test_lend", lend);
}
