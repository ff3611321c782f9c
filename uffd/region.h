/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Regions: the ranges the program gave the pager (fm_pager_register), each
 * with its state bytes in the residency map and a space in memd.
 */
#ifndef FARMEM_REGION_H
#define FARMEM_REGION_H

#include <stddef.h>
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
 * When this thread's stack pointer is in paged memory, or within the pager's
 * frames' reach above it: runs fn(arg) on farmem's stack for this thread and
 * returns 1. Otherwise 0, and the caller runs it where it is.
 */
int fm_region_off_paged_stack(struct fm_pager *p, void (*fn)(void *), void *arg);

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
 * The parts of registration, for callers that put books together
 * themselves (remap.c). Caller holds rlock for writing.
 *
 * fm_region_book: a free slot and a place for cap state bytes, filled in
 * for [a, a + npages pages) with memd space `space` (of cap pages) and
 * userfaultfd `uffd`; not live, nothing registered. NULL when the table
 * or the map is full. fm_region_publish: the slot goes into the residency
 * map (flags: FM_REGION_F_*) and the region is live. fm_region_retire: it is not,
 * its state bytes give their memory back, and with close_space its memd
 * space closes (a region whose space another took over keeps it open).
 * fm_region_resize: a non-sparse region covers npages from its base now
 * (at most its cap; the caller counts `registered`). fm_region_bounds: the
 * SIGBUS handler's quick bounds, from the live regions.
 * fm_region_uffd_register: UFFDIO_REGISTER for paging (and MADV_DONTFORK,
 * no huge pages), minor faults for shared memory.
 */
struct region *fm_region_book(struct fm_pager *p, uintptr_t a, uint64_t npages, uint64_t cap, uint32_t space,
			      int uffd);
void fm_region_publish(struct fm_pager *p, struct region *r, uint32_t flags);
void fm_region_retire(struct fm_pager *p, struct region *r, int close_space);
void fm_region_resize(struct fm_pager *p, struct region *r, uint64_t npages);
void fm_region_bounds(struct fm_pager *p);
int fm_region_uffd_register(const struct region *r, uintptr_t a, size_t len, int minor);

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
 * that stays ours (UNTOUCHED) is held until memd has forgotten its copy:
 * hold_dropped, the flush, release_dropped. Local copies are the caller's
 * to drop. Caller holds rlock.
 */
void fm_region_forget(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n, unsigned to);
/*
 * The same to UNTOUCHED in two steps, for a drop the program makes itself
 * (madvise) between them: hold takes every managed page of [first,
 * first+n) (each once it settles), counts the resident ones out and gathers
 * remote copies into dead; release makes them UNTOUCHED once memd has
 * forgotten the copies (the caller flushes dead) and the kernel has dropped
 * the pages. Between the two no fault fills a page of the range and no
 * eviction takes one. Caller holds rlock across both.
 */
void fm_region_hold_dropped(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n, struct fm_dead *dead);
void fm_region_release_dropped(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n);

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
