/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Regions: the ranges the program gave the pager (fm_pager_register), each
 * with its state bytes in the residency map and a space in memd.
 */
#ifndef FARMEM_REGION_H
#define FARMEM_REGION_H

#include <stdint.h>

#include "transport.h"

struct fm_pager;
struct region;

/*
 * The region that pages addr, or NULL. Caller holds rlock (read or write).
 * A page given up by a partial unmap stays in its old region as UNMANAGED;
 * a new mapping at that address is a region of its own, so the lookup
 * passes over unmanaged pages.
 */
struct region *fm_region_find(struct fm_pager *p, uintptr_t addr, int *idx);

/*
 * The parts of live regions that overlap [a, e), one per call:
 *
 *     struct fm_overlap o = { 0 };
 *     while (fm_overlap_next(p, a, e, &o))
 *             ... o.r, pages [o.first, o.first + o.n) ...
 *
 * Caller holds rlock. Pages are whole pages of the region inside [a, e).
 */
struct fm_overlap {
	struct region *r;
	uint64_t first, n;
	int next;              /* the slot to look at next */
};
int fm_overlap_next(struct fm_pager *p, uintptr_t a, uintptr_t e, struct fm_overlap *o);

/*
 * Remote copies that died, gathered into runs and sent to memd 64 runs at a
 * time (over the misc channel). A copy may die only once its page is ours:
 * claimed, or gone from the books.
 */
struct fm_dead {
	struct fm_range rg[64];
	unsigned n;
	uint32_t space;
	/*
	 * The pages are free space about to be written again (a collector's
	 * discard): memd keeps their memory for a while (fm_chan_forget), up to
	 * a bound, and the oldest is given back first (region.c).
	 */
	int keep;
};
void fm_dead_add(struct fm_pager *p, struct fm_dead *d, uint32_t space, uint64_t i);
void fm_dead_flush(struct fm_pager *p, struct fm_dead *d);

/*
 * Pages [first, first+n) of r leave the books: each waits until it settles,
 * then becomes `to` (UNTOUCHED or UNMANAGED); remote copies die, and a page
 * that stays ours is held until memd has forgotten its copy. Local copies
 * are the caller's to drop. Caller holds rlock.
 */
void fm_region_forget(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n, unsigned to);

/*
 * Every page of [first, end) of r that is in memd comes home, read in
 * batches and installed clean (memd keeps its copy); a page in a hold is
 * waited for, then looked at again. Returns the pages brought. Only pages
 * that nothing evicts meanwhile stay home (a pinned region, a fork).
 * Caller holds rlock. In ranges.c.
 */
uint64_t fm_region_home(struct fm_pager *p, struct region *r, uint64_t first, uint64_t end);

/*
 * [s, e) stopped being paged just now. A SIGBUS there in the next moments
 * was raised before, and its thread retries (fm_region_gone_recently).
 */
void fm_region_gone(struct fm_pager *p, uintptr_t s, uintptr_t e);
int fm_region_gone_recently(struct fm_pager *p, uintptr_t addr);

/* Without the lock: addr may be in a region (a cheap first test; fm_region_find decides). */
int fm_region_maybe(struct fm_pager *p, uintptr_t addr, uintptr_t end);
/* Without the lock: [addr, end) overlaps a region whose faults raise SIGBUS (not FM_REG_KERNEL_WAITS). */
int fm_region_signals(struct fm_pager *p, uintptr_t addr, uintptr_t end);

#endif
