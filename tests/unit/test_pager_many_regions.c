// SPDX-License-Identifier: Apache-2.0
/*
 * More paged ranges than the residency map's first table holds (64), against
 * a real memd, with ASan and UBSan: a program with a glibc heap per busy
 * arena, or jemalloc's extents at a small threshold, registers one region
 * per range. Every range is paged, its slot past 64 is in more_regions[]
 * (fm_resmap_slot), every page survives eviction, and slots freed by
 * unregistering are taken again, with their state bytes' place in the map
 * (its used length stays put over 500 unregistrations). Run from the
 * repository root.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define NRANGES 200
#define RANGE (64 * PG)
#define NPG (RANGE / PG)

/* No two live regions' state bytes overlap in the map. */
static int extents_apart(const struct fm_resmap_hdr *h)
{
	for (unsigned i = 0; i < FM_RESMAP_SLOTS; i++)
		for (unsigned j = i + 1; j < FM_RESMAP_SLOTS; j++) {
			const struct fm_resmap_region *r = fm_resmap_slot_ro(h, i), *q = fm_resmap_slot_ro(h, j);
			if ((r->flags & FM_REGION_F_LIVE) && (q->flags & FM_REGION_F_LIVE) &&
			    r->map_offset < q->map_offset + q->npages && q->map_offset < r->map_offset + r->npages)
				return 0;
		}
	return 1;
}

static void run_case(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	char addr[128];
	uint8_t *a[NRANGES] = { 0 };
	uint64_t bad = 0, live = 0, past = 0, used;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	/* A budget of a sixteenth of what is written: most pages go to memd and come back. */
	p = unit_pager(fault, addr, "1M", (const char *const[]){ "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	for (int k = 0; k < NRANGES; k++) {
		a[k] = unit_region(p, RANGE, 0);
		if (!a[k])
			goto out;
	}
	CHECK(h->nregions == NRANGES);
	for (unsigned i = 0; i < FM_RESMAP_SLOTS; i++) {
		const struct fm_resmap_region *r = fm_resmap_slot_ro(h, i);
		if (!(r->flags & FM_REGION_F_LIVE))
			continue;
		live++;
		past += i >= FM_RESMAP_MAX_REGIONS;
		/* Each slot names one of our ranges. */
		int ours = 0;
		for (int k = 0; k < NRANGES; k++)
			ours |= r->base == (uintptr_t)a[k] && r->npages == NPG;
		CHECK(ours);
	}
	CHECK(live == NRANGES && past == NRANGES - FM_RESMAP_MAX_REGIONS);

	for (int round = 1; round <= 2; round++)
		for (int k = 0; k < NRANGES; k++)
			for (uint64_t i = 0; i < NPG; i++)
				write_page(a[k], i, (uint32_t)(round * 100000 + k * 100 + (int)i));
	CHECK(h->stats.evictions_clean + h->stats.evictions_dirty > NRANGES * NPG);
	for (int k = NRANGES - 1; k >= 0; k--)
		for (uint64_t i = 0; i < NPG; i++)
			bad += !page_ok(a[k], i, (uint32_t)(200000 + k * 100 + (int)i));
	CHECK(bad == 0);
	CHECK(h->stats.remote_reads > 0 && h->stats.crc_errors == 0);

	/*
	 * Slots freed in both tables are taken again, and so are their state
	 * bytes in the map: it does not grow however often ranges come and go.
	 */
	used = h->map_used;
	for (int round = 0; round < 50; round++)
		for (int k = 10; k < NRANGES; k += 20) {
			CHECK(fm_pager_unregister(p, a[k], RANGE) == 0);
			CHECK(fm_pager_register(p, a[k], RANGE, 0) == 0);
			write_page(a[k], 3, 7);
		}
	CHECK(h->nregions == NRANGES);
	CHECK(h->map_used == used);
	CHECK(extents_apart(h));
	for (int k = 10; k < NRANGES; k += 20)
		bad += !page_ok(a[k], 3, 7);
	CHECK(bad == 0);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	printf("test_pager_many_regions: fault=%s done (%llu slots past the first table)\n", fault,
	       (unsigned long long)past);
out:
	for (int k = 0; k < NRANGES; k++)
		if (a[k]) {
			CHECK(fm_pager_unregister(p, a[k], RANGE) == 0);
			munmap(a[k], RANGE);
		}
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_many_regions", run_case);
}
