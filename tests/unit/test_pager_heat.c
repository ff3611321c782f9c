// SPDX-License-Identifier: Apache-2.0
/*
 * The eviction clock keeps longer a page that came back soon after it left
 * (uffd/evict.c, the heat byte), against a real memd, with ASan and UBSan.
 *
 * A page H is written, then fresh pages are written one after another until
 * H leaves; H is read back at once (a refault within one budget's worth of
 * evictions: refaults_soon counts it), and its neighbour K is written for the
 * first time in the same moment. Then fresh pages again: K, referenced once,
 * goes at the hand's second pass; H, on the same passes, must stay three
 * passes longer (more than one budget's worth of writes after K left). A
 * plain clock takes both in the same pass. Nothing written is lost.
 * Both fault modes. Run from the repository root.
 */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (32ul << 20)
#define NPAGES (REGION / PG)
#define BUDGET_PAGES 256 /* "1M" */

static unsigned state_at(struct fm_resmap_hdr *h, uint64_t i)
{
	return fm_pg_state(__atomic_load_n((uint8_t *)h + h->regions[0].map_offset + i, __ATOMIC_ACQUIRE));
}

static void exercise(const char *sock, const char *fault)
{
	const uint64_t H = 0, K = 1;
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint64_t next = 16, k_left = 0, h_left = 0, bad = 0;
	uint8_t *a;

	p = unit_pager_at(sock, fault, "1M", (const char *const[]){ "transport", "shm", "prefetch", "0", "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	if (!a)
		goto out;

	write_page(a, H, 1);
	while (state_at(h, H) != FM_PG_REMOTE && next < NPAGES / 2)
		write_page(a, next++, 1);
	CHECK(state_at(h, H) == FM_PG_REMOTE && h->stats.refaults_soon == 0);
	/* Back at once: a refault within the budget's reach. K is new. */
	CHECK(page_ok(a, H, 1));
	write_page(a, K, 1);
	CHECK(h->stats.refaults_soon == 1);
	for (uint64_t n = 0; next < NPAGES && !(k_left && h_left); n++) {
		write_page(a, next++, 1);
		if (!k_left && state_at(h, K) == FM_PG_REMOTE)
			k_left = n + 1;
		if (!h_left && state_at(h, H) == FM_PG_REMOTE)
			h_left = n + 1;
	}
	fprintf(stderr, "test_pager_heat (fault=%s): K left after %llu writes, H after %llu\n", fault,
		(unsigned long long)k_left, (unsigned long long)h_left);
	CHECK(k_left && h_left && h_left > k_left + BUDGET_PAGES);
	bad += !page_ok(a, H, 1) + !page_ok(a, K, 1);
	for (uint64_t i = 16; i < next; i++)
		bad += !page_ok(a, i, 1);
	unit_region_end(p, a, REGION, bad);
out:
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_heat", exercise);
}
