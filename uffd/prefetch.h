/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sequential and strided runs of one thread's faults, fetched ahead: remote
 * pages in one batched read, installed write-protected (clean); untouched
 * pages as zeros, in runs of up to ZERO_RUN_PAGES, writable when the stream
 * writes (allocation streams through fresh memory, writing it).
 */
#ifndef FARMEM_PREFETCH_H
#define FARMEM_PREFETCH_H

#include <stdint.h>

struct fm_pager;
struct fm_borrowed;
struct region;

/*
 * After a fault on page idx of region r (slot ridx) by fc->tid: record it,
 * and if it continues a run, fill the run ahead. A thread has several runs:
 * its faults on fresh pages (fresh: the fault was a zero-fill) and on remote
 * ones, which interleave (a collector copies objects it reads here and there
 * into fresh pages in a row; a program allocates while it reads old data),
 * and each alone is a run; a GC thread's writes to old pages are a run of
 * their own too (a full GC's compaction reads a page and writes a lower one,
 * in turn). A fresh run fills only untouched pages.
 *
 * Remote pages ahead: up to `prefetch` for the program's threads, up to
 * `gc_window` for GC threads (gc: is_gc_thread said so). A collector's run
 * is a pause walking the heap (a full GC compacts every old region in
 * address order, and pays a fault, a read and an install per page without
 * this); what it fetches ahead goes in cold (FM_PGF_GC: the clock takes it
 * at once), so it does not push the program's pages out for long.
 * Its writes' runs and, with gc_writable, its reads' too are installed
 * writable and booked DIRTY: a compaction writes the pages it read soon
 * after, and a write-protect fault on each would cost a fault and a TLB
 * shootdown (the unprotect); the price is a write-back of what it only read,
 * and that the program's later writes to such a page are not seen (it stays
 * cold). wake: handler-thread mode. Caller holds rlock.
 */
void fm_prefetch(struct fm_pager *p, struct fm_borrowed *fc, int ridx, struct region *r, uint64_t idx,
		 int write, int fresh, int gc, unsigned back, int wake);

/*
 * A program thread's fault on remote page idx of r touched an object that
 * goes on to page last (the agent read its header: pager.h, object_end;
 * the caller bounds it by `prefetch`): its other remote pages, up to
 * MAX_AHEAD, in one read, installed as the fault's page is (clean unless
 * the region's installs are open, referenced). Caller holds rlock.
 */
void fm_prefetch_object(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, uint64_t idx, uint64_t last,
			int wake);

/* At most this many objects a full GC worker's fault on one's header brings with it (fm_prefetch_referents). */
#define MAX_REFERENTS 64u

/*
 * A full GC worker's fault on an object's header, taken in a loop over
 * reference slots that goes on to the objects of pages[] (n, ascending, of
 * r: the agent read the slots, pager.h, referents): their remote pages, up
 * to MAX_REFERENTS, in one read, each claimed with room as the fault's page
 * was, and installed as it was (open: writable; flags: FM_PGF_GC, cold, or
 * FM_PGF_REF). Caller holds rlock.
 */
void fm_prefetch_referents(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, const uint64_t *pages,
			   unsigned n, int open, uint8_t flags, int wake);

#endif
