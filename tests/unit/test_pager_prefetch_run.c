// SPDX-License-Identifier: Apache-2.0
/*
 * A run of faults goes on through what was fetched ahead (uffd/prefetch.c),
 * against a real memd, with ASan and UBSan.
 *
 * One thread reads back pages that went to memd in order: forwards, every
 * third page, and backwards. With `prefetch` pages fetched ahead, the fault
 * just past them continues the run, so each fault brings prefetch + 1 pages.
 * Until session 52 that fault was taken for a new stride and broke the run:
 * a sequential read took a fault every 3.4 pages with 8 ahead, not every 9.
 * With an evictor thread too: until session 53 pages ahead were refused
 * above its high mark, and a read that outran it faulted every 1.3 to 8
 * pages. And a run through pages it finds resident goes on past them.
 * Every page read back is checked. Run from the repository root.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (64ul << 20)
#define READ_BACK 2048ul /* the first 8 MiB: in memd by the time the last page is written */
#define AHEAD 8

/* A pager at 8 MiB that fetches AHEAD pages ahead, the handler not following the faulting thread. */
static struct fm_pager *pager(const char *sock, const char *fault, const char *evict_threads)
{
	return unit_pager_at(sock, fault, "8M",
			     (const char *const[]){ "transport", "shm", "prefetch", "8", "fault", fault, "fill_follow", "0",
						    "evict_threads", evict_threads, NULL });
}

/* Faults and pages fetched ahead while READ_BACK / |stride| pages are read back, stride apart. */
static void read_back(const char *sock, const char *fault, long stride, const char *evict_threads)
{
	struct fm_pager *p = pager(sock, fault, evict_threads);
	const struct fm_resmap_hdr *h;
	uint64_t f0, pf0, faults, ahead, bad = 0, n = READ_BACK / (uint64_t)(stride < 0 ? -stride : stride);
	uint64_t slack = strcmp(evict_threads, "0") ? n / 32 + 16 : 16; /* faults past n / 9 (below) */
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region_written(p, REGION, 5);
	if (!a)
		goto out;
	f0 = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED);
	pf0 = __atomic_load_n(&h->stats.prefetch_issued, __ATOMIC_RELAXED);
	for (uint64_t k = 0; k < n; k++) {
		uint64_t i = stride > 0 ? k * (uint64_t)stride : READ_BACK - 1 - k;
		bad += !page_ok(a, i, 5);
	}
	faults = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED) - f0;
	ahead = __atomic_load_n(&h->stats.prefetch_issued, __ATOMIC_RELAXED) - pf0;
	fprintf(stderr,
		"test_pager_prefetch_run (fault=%s, stride %ld, evict_threads %s): %llu pages, %llu faults, %llu fetched ahead\n",
		fault, stride, evict_threads, (unsigned long long)n, (unsigned long long)faults, (unsigned long long)ahead);
	/*
	 * Two faults make a run, and from then on a fault every AHEAD + 1
	 * pages: n / 9 and a few to start; a broken run took n / 3.6, and with
	 * an evictor thread refusing pages ahead above its high mark n / 8 to
	 * n / 1 (session 52, run to run). An evictor thread's clock may take a
	 * page ahead before the reader gets there (they go in unreferenced): up
	 * to n / 32 more then (247 of 2048 once, with two busy loops beside).
	 */
	CHECK(faults >= n / (AHEAD + 1) && faults <= n / (AHEAD + 1) + slack);
	CHECK(ahead + faults >= n - 16);
	unit_region_end(p, a, REGION, bad);
out:
	fm_pager_stop(p);
}

/*
 * A run through pages it found resident: every fifth page of the first
 * 1024 is brought back first, then all 1024 are read in order. A fetch
 * ahead stops at a resident page, the run goes on through it and faults
 * past it, a whole number of its strides on: that fault continues the run,
 * so a fault every five pages. Taken for a new stride, as until session 64,
 * each cost two more before the run was one again: three faults every five
 * pages (a stencil's two buffers faulted 3.6 times as often so).
 */
static void through_resident(const char *sock, const char *fault)
{
	struct fm_pager *p = pager(sock, fault, "0");
	const struct fm_resmap_hdr *h;
	const uint64_t n = 1024;
	uint64_t f0, faults, bad = 0;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region_written(p, REGION, 5);
	if (!a)
		goto out;
	for (uint64_t i = 0; i < n; i += 5)
		bad += !page_ok(a, i, 5);
	f0 = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED);
	for (uint64_t i = 0; i < n; i++)
		bad += !page_ok(a, i, 5);
	faults = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED) - f0;
	fprintf(stderr, "test_pager_prefetch_run (fault=%s, through resident pages): %llu pages, %llu faults\n", fault,
		(unsigned long long)n, (unsigned long long)faults);
	CHECK(faults >= n / 5 - 8 && faults <= n / 5 + 32);
	unit_region_end(p, a, REGION, bad);
out:
	fm_pager_stop(p);
}

/*
 * Fresh memory written in order: while every registered page fits the
 * budget a run goes on to the end of its 2 MiB window (a fault per 512
 * pages, and one to start it); with less room than the region, 64 pages
 * at a time (a fault per 65). Every page is checked after.
 */
static void fresh_run(const char *sock, const char *fault, const char *local, uint64_t most, uint64_t least)
{
	const uint64_t n = 4096; /* 16 MiB */
	struct fm_pager *p = unit_pager_at(sock, fault, local,
					   (const char *const[]){ "transport", "shm", "fill_follow", "0",
								  "evict_threads", "0", NULL });
	const struct fm_resmap_hdr *h;
	uint64_t f0, faults, bad = 0;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, n * PG, 0);
	if (!a)
		goto out;
	f0 = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED);
	for (uint64_t i = 0; i < n; i++)
		write_page(a, i, 7);
	faults = __atomic_load_n(&h->stats.faults, __ATOMIC_RELAXED) - f0;
	for (uint64_t i = 0; i < n; i++)
		bad += !page_ok(a, i, 7);
	fprintf(stderr, "test_pager_prefetch_run (fault=%s, fresh, local %s): %llu pages, %llu faults\n", fault, local,
		(unsigned long long)n, (unsigned long long)faults);
	CHECK(faults >= least && faults <= most);
	unit_region_end(p, a, n * PG, bad);
out:
	fm_pager_stop(p);
}

static void exercise(const char *sock, const char *fault)
{
	through_resident(sock, fault);
	fresh_run(sock, fault, "16M", 4096 / 512 * 2 + 8, 1);
	fresh_run(sock, fault, "8M", 4096 / 16, 4096 / 65);
	/* 0: faults make their own room; 1: an evictor thread does. */
	for (int e = 0; e < 2; e++) {
		const char *evict_threads = e ? "1" : "0";
		read_back(sock, fault, 1, evict_threads);
		read_back(sock, fault, 3, evict_threads);
		read_back(sock, fault, -1, evict_threads);
	}
}

int main(void)
{
	return unit_main("test_pager_prefetch_run", exercise);
}
