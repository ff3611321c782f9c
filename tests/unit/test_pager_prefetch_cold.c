// SPDX-License-Identifier: Apache-2.0
/*
 * Pages fetched ahead of a run go in unreferenced, and a run that goes on
 * through them references them (uffd/prefetch.c), against a real memd, with
 * ASan and UBSan.
 *
 * A region's first pages are written and pushed out to memd, then left
 * alone for three budgets (their return must not count as soon: no heat).
 * Run U reads pages 100-102 and stops: 103-110 come in ahead, unused. Run R
 * reads 200-202, then 203-210 (ahead, no fault) and 211, where the run's
 * thread finds its pages used. Then fresh pages are written until all of
 * them have left: U's pages ahead must go a hand's pass before page 102,
 * which its fault referenced (before, both went in one pass); R's pages
 * ahead go with page 202, not before. Nothing written is lost. Both fault
 * modes. Run from the repository root.
 */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (32ul << 20)
#define NPAGES (REGION / PG)
#define BUDGET_PAGES 256ul /* "1M" */
#define WRITTEN 320ul      /* pages 0..319 written first */
#define FRESH 1024ul       /* fresh pages from here */

static unsigned state_at(struct fm_resmap_hdr *h, uint64_t i)
{
	return fm_pg_state(__atomic_load_n((uint8_t *)h + h->regions[0].map_offset + i, __ATOMIC_ACQUIRE));
}

/* The write count at which page i left, if it left by now and was not seen to before. */
static void note_left(struct fm_resmap_hdr *h, uint64_t i, uint64_t n, uint64_t *left)
{
	if (!*left && state_at(h, i) == FM_PG_REMOTE)
		*left = n;
}

/*
 * Pages ahead go in after the faulting page, which its thread may use
 * meanwhile (a pool thread fetches them with fault=signal; with
 * fault=thread the thread is woken first): wait until the counter says so.
 */
static int settled(const uint64_t *counter, uint64_t at_least)
{
	for (int ms = 0; ms < 5000; ms++) {
		if (__atomic_load_n(counter, __ATOMIC_ACQUIRE) >= at_least)
			return 1;
		usleep(1000);
	}
	return 0;
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint64_t next = FRESH, bad = 0, issued, all_out = 0;
	uint64_t u_left[8] = { 0 }, r_left[8] = { 0 }, k1 = 0, k2 = 0, unused_last = 0, used_first = UINT64_MAX;
	uint8_t *a;

	p = unit_pager_at(sock, fault, "1M", (const char *const[]){ "transport", "shm", "prefetch", "8", "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	if (!a)
		goto out;

	for (uint64_t i = 0; i < WRITTEN; i++)
		write_page(a, i, 1);
	while (!all_out && next < NPAGES / 2) {
		write_page(a, next++, 1);
		all_out = 1;
		for (uint64_t i = 100; i <= 211 && all_out; i++)
			all_out = state_at(h, i) == FM_PG_REMOTE;
	}
	CHECK(all_out);
	for (uint64_t n = 0; n < 3 * BUDGET_PAGES; n++)
		write_page(a, next++, 1);

	issued = h->stats.prefetch_issued;
	bad += !page_ok(a, 100, 1) + !page_ok(a, 101, 1) + !page_ok(a, 102, 1);
	CHECK(settled(&h->stats.prefetch_issued, issued + 8));
	for (uint64_t i = 103; i <= 110; i++)
		CHECK(state_at(h, i) == FM_PG_CLEAN || state_at(h, i) == FM_PG_DIRTY);
	CHECK(state_at(h, 111) == FM_PG_REMOTE);
	for (uint64_t i = 200; i <= 202; i++)
		bad += !page_ok(a, i, 1);
	CHECK(settled(&h->stats.prefetch_issued, issued + 16));
	for (uint64_t i = 203; i <= 211; i++)
		bad += !page_ok(a, i, 1);
	CHECK(settled(&h->stats.prefetch_used, 8));
	CHECK(h->stats.refaults_soon == 0);

	for (uint64_t n = 1; next < NPAGES && !(k1 && k2 && r_left[7]); n++) {
		write_page(a, next++, 1);
		for (unsigned k = 0; k < 8; k++) {
			note_left(h, 103 + k, n, &u_left[k]);
			note_left(h, 203 + k, n, &r_left[k]);
		}
		note_left(h, 102, n, &k1);
		note_left(h, 202, n, &k2);
	}
	for (unsigned k = 0; k < 8; k++) {
		unused_last = u_left[k] > unused_last ? u_left[k] : unused_last;
		used_first = r_left[k] < used_first ? r_left[k] : used_first;
	}
	fprintf(stderr, "test_pager_prefetch_cold (fault=%s): ahead and unused left by write %llu, page 102 at %llu; "
		"ahead and used from write %llu, page 202 at %llu\n", fault, (unsigned long long)unused_last,
		(unsigned long long)k1, (unsigned long long)used_first, (unsigned long long)k2);
	for (unsigned k = 0; k < 8; k++)
		CHECK(u_left[k] && r_left[k]);
	CHECK(k1 && k2 && unused_last + BUDGET_PAGES / 4 < k1);
	CHECK(used_first + BUDGET_PAGES / 4 > k2);
	for (uint64_t i = 0; i < WRITTEN; i++)
		bad += !page_ok(a, i, 1);
	for (uint64_t i = FRESH; i < next; i++)
		bad += !page_ok(a, i, 1);
	unit_region_end(p, a, REGION, bad);
out:
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_prefetch_cold", exercise);
}
