// SPDX-License-Identifier: Apache-2.0
/* A stock JVM's compaction moves, done where the pages lie (gcmove.h). */
#include "gcmove.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fm_util.h"
#include "got.h"
#include "pager.h"
#include "resmap.h"
#include "vmstructs.h"

static void *(*real_memmove)(void *, const void *, size_t) = memmove;

static struct fm_pager_ref ref; /* fm_gcmove_setup's, set before moves are enabled */

/*
 * The heap's residency bytes, looked up at each pause's start by the VM
 * thread before the workers run (a pause is where the heap's registration
 * can change), read by the workers: pages is 0 outside pauses and when no
 * pager pages a heap.
 */
static _Atomic uint64_t pages;
static uint64_t base;
static const volatile uint8_t *states;
static unsigned page_shift;
static atomic_int enabled; /* gc_moves=1 and libjvm's memmove is ours */
/*
 * CollectedHeap::_total_collections and the _total_full_collections declared
 * right after it (JDK 17's collectedHeap.hpp: both unsigned int; VMStructs
 * lists only the first). Each collection counts itself once it has begun,
 * after GarbageCollectionStart, so a full count that moved since the pause
 * began says a full GC is under way in it (Serial's may follow its young
 * collection in the same pause).
 */
static const volatile uint32_t *collections;
static uint32_t full_at_start;
static int counts_unreadable;
static atomic_int refused; /* the pager cannot move in memd (its transport): memmove from now on */

static int in_heap(uintptr_t a, size_t len, uint64_t npages)
{
	return a >= base && a + len > a && ((a + len - 1 - base) >> page_shift) < npages;
}

static int all_resident(uintptr_t a, size_t len)
{
	for (uint64_t i = (a - base) >> page_shift; i <= (a + len - 1 - base) >> page_shift; i++)
		if (!fm_pg_is_resident(states[i]))
			return 0;
	return 1;
}

/*
 * Only in a pause: then the program's threads are stopped and the collector
 * threads move objects no other thread touches, which fm_pager_move_bytes
 * asks of its callers (two workers that share a page, as Parallel's may at a
 * region's edge, meet in the pager's holds: one of them is declined). A move
 * it declines (a page held, memd full) is done here as always.
 */
static void *hook_memmove(void *dst, const void *src, size_t n)
{
	uint64_t npages = atomic_load_explicit(&pages, memory_order_acquire);

	if (npages && n && in_heap((uintptr_t)src, n, npages) && in_heap((uintptr_t)dst, n, npages)) {
		struct fm_byte_move m = { .src = (uintptr_t)src, .dst = (uintptr_t)dst, .len = n };
		struct fm_pager *p = ref.enter(); /* before the residency bytes: a detach unmaps them */
		long rc = 0;

		if (p && (!all_resident(m.src, n) || !all_resident(m.dst, n)))
			rc = fm_pager_move_bytes(p, &m, 1);
		ref.leave();
		if (rc == 1)
			return dst;
		if (rc == -EOPNOTSUPP && !atomic_exchange(&refused, 1))
			fm_info("the pager cannot move pages inside memd here: full GCs copy through local memory");
	}
	return real_memmove(dst, src, n);
}

int fm_gcmove_reads_ahead(void)
{
	return !atomic_load_explicit(&pages, memory_order_acquire) || !collections ||
	       collections[1] == full_at_start;
}

/* The collection counts, once the heap exists; left NULL if they do not read as counts. */
static void find_collections(void)
{
	int64_t off;
	uintptr_t heap_ptr_addr, heap;

	if (collections || counts_unreadable || fm_vms_field("CollectedHeap", "_total_collections", &off, NULL) ||
	    fm_vms_field("Universe", "_collectedHeap", NULL, &heap_ptr_addr) ||
	    !(heap = *(const uintptr_t *)heap_ptr_addr))
		return;
	collections = (const volatile uint32_t *)(heap + (uintptr_t)off);
}

void fm_gcmove_pause(int in_pause)
{
	struct fm_pager *p;
	const struct fm_resmap_hdr *h;
	const struct fm_resmap_region *r;

	atomic_store_explicit(&pages, 0, memory_order_release); /* until this pause's heap is found */
	if (!in_pause || !atomic_load(&enabled) || atomic_load(&refused))
		return;
	find_collections();
	if (collections) {
		full_at_start = collections[1];
		if (full_at_start > collections[0]) {
			fm_warn("gc_moves: this JVM's collection counts are not where JDK 17 keeps them: "
				"its GC threads read ahead in full GCs too");
			collections = NULL;
			counts_unreadable = 1;
		}
	}
	p = ref.enter();
	h = p ? fm_pager_map(p) : NULL;
	if (h && (r = fm_resmap_heap(h))) {
		base = r->base;
		page_shift = h->page_shift;
		states = (const uint8_t *)h + r->map_offset;
		atomic_store_explicit(&pages, r->npages, memory_order_release);
	}
	ref.leave();
}

int fm_gcmove_setup(const struct fm_pager_ref *r, int on)
{
	static int hooked;
	void *orig = NULL;
	int rc;

	atomic_store(&enabled, 0);
	if (!on)
		return 0;
	ref = *r;
	if (!hooked) {
		rc = fm_got_interpose("libjvm.so", "memmove", (void *)hook_memmove, &orig);
		if (rc <= 0)
			return rc ? rc : -ENOENT;
		if (orig && orig != (void *)hook_memmove)
			real_memmove = (void *(*)(void *, const void *, size_t))orig;
		hooked = 1;
	}
	atomic_store(&refused, 0);
	atomic_store(&enabled, 1);
	return 1;
}
