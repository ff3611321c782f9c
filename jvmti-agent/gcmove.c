// SPDX-License-Identifier: Apache-2.0
/* A stock JVM's compaction moves and G1's promotions of arrays, done where the pages lie (gcmove.h). */
#include "gcmove.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fm_util.h"
#include "gccounts.h"
#include "gcfree.h"
#include "got.h"
#include "klass.h"
#include "pager.h"
#include "resmap.h"
#include "vmstructs.h"

static void *(*real_memmove)(void *, const void *, size_t) = memmove;
static void *(*real_memcpy)(void *, const void *, size_t) = memcpy;

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
/* The collection counts (gccounts.h): a full count that moved since the pause began says a full GC is under way. */
static const volatile uint32_t *collections;
static uint32_t full_at_start;
static atomic_int refused; /* the pager cannot move in memd (its transport): memmove from now on */
static int copies_on;  /* primitive arrays' copies too: their klasses can be read (klass.h) */
static int promote_on; /* and those to pages memd holds go there: under pressure, not held */
static uint64_t evict_batches_seen; /* the pager's eviction batches at the last pause's start */

/*
 * Whether the program reads its promoted arrays back soon. GcChurn's
 * promoted arrays wait in memd for the rare check; AllocRace reads nearly
 * each one once more right after its promotion, before the next pause, and
 * written in memd they cost it a fetch per page (its allocation fell 11% at
 * 25% local, bench/RESULTS.md, session 70). So each pause notes, of its
 * first promotions, the first page each left in memd, and the next pause's
 * start looks at them: a page the program faulted back in since (resident,
 * no GC thread's mark) was read. Where a quarter are, promotions go through
 * local memory for the next hold_pauses pauses, then one pause promotes
 * again to look once more; each look that finds them read doubles the hold.
 */
#define READ_BACK_SAMPLES 256u
#define READ_BACK_MIN 16u /* samples for a verdict */
#define HOLD_FIRST 8u
#define HOLD_MOST 128u
static uintptr_t promoted_pages[READ_BACK_SAMPLES];
static atomic_uint npromoted; /* this pause's promotions, the first READ_BACK_SAMPLES noted */
static unsigned hold_pauses, hold_len = HOLD_FIRST;
static int read_back_told;

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
 * The page the collector writes next, made resident and writable here
 * rather than by its fault: the same read from memd, without the signal.
 * A full GC writes each moved object's header (init_mark) right after the
 * move, on a destination page the move left in memd; that fault cost its
 * phase 4 a fifth of its time (GcChurn at 50% local: 2.07 -> 1.65 s).
 */
static void write_next(struct fm_pager *p, uintptr_t a, size_t len)
{
	int pin;

	if (!len || all_resident(a, len))
		return;
	pin = fm_pager_io_begin(p, (const void *)a, len, 1);
	if (pin != -1)
		fm_pager_io_end(p, pin);
}

/*
 * A full GC's compaction slides each worker's objects down, in address
 * order: the destination pages below the one a move starts on are final for
 * the pause (every later move of that worker writes and reads higher up).
 * Handed to the pager as done, they leave first when room is needed; left
 * to the clock, which sweeps addresses, the pages it took were as often the
 * source headers the compaction was about to read, which phase 3 had just
 * read (GcChurn at 50% local: 252k pages came in in phase 4, 210k so). A move
 * more than DONE_GAP past the end of the worker's last starts a new run: the
 * worker went on to another region, and what lies between is not its own.
 */
#define DONE_GAP ((uintptr_t)64 << 10)
static atomic_uint pause_seq;
static _Thread_local unsigned done_pause;
static _Thread_local uintptr_t done_to, done_next; /* handed on below done_to; the last move ended at done_next */

static void compacted(struct fm_pager *p, uintptr_t dst, size_t n)
{
	uintptr_t page = dst & ~(((uintptr_t)1 << page_shift) - 1);
	unsigned seq = atomic_load_explicit(&pause_seq, memory_order_relaxed);

	if (collections && collections[1] == full_at_start)
		return; /* a young pause's memmove: not a compaction */
	if (done_pause != seq || dst < done_next || dst - done_next > DONE_GAP) {
		done_pause = seq;
		done_to = page;
	} else if (page > done_to) {
		fm_pager_passed(p, (const void *)done_to, page - done_to);
		done_to = page;
	}
	done_next = dst + n;
}

/*
 * The page a moved object ends on holds the next one's header, which the
 * collector writes right after that move (write_next brought it from memd
 * for that, 19k pages a full GC, GcChurn at 50% local). In G1's full GC all
 * of a worker's destination region above the object it writes has moved
 * already or was garbage, up to the object's source when that lies in the
 * same region (G1 compacts its regions in the order it forwarded them, each
 * in address order, into the same or earlier ones): such a page's old bytes
 * are dead. It comes in as zeros, the move writes its tail there, and the
 * next header's page is resident. Only where the JDK 17 collection counts
 * read right (gccounts.h): a full GC must be known to be under way.
 */
static void fresh_tail(struct fm_pager *p, uintptr_t dst, uintptr_t src, size_t n)
{
	uintptr_t page = (uintptr_t)1 << page_shift, tail = (dst + n) & ~(page - 1);
	uint64_t grain = fm_gcfree_granule();

	if (!grain || fm_gcfree_kind() != FM_GCFREE_G1 || !collections || collections[1] == full_at_start)
		return;
	if (tail < dst || (tail & ~(grain - 1)) != (dst & ~(grain - 1)) || all_resident(tail, 1))
		return;
	if ((src & ~(grain - 1)) == (dst & ~(grain - 1)) && (src < dst || tail + page > src))
		return;
	fm_pager_discard_reused(p, (void *)tail, page);
	write_next(p, tail, page);
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

		if (p && (!all_resident(m.src, n) || !all_resident(m.dst, n))) {
			fresh_tail(p, m.dst, m.src, n);
			rc = fm_pager_move_bytes(p, &m, 1);
		}
		if (rc == 1)
			write_next(p, m.dst, n < 16 ? n : 16);
		if (p)
			compacted(p, m.dst, n);
		ref.leave();
		if (rc == 1)
			return dst;
		if (rc == -EOPNOTSUPP && !atomic_exchange(&refused, 1))
			fm_info("the pager cannot move pages inside memd here: full GCs copy through local memory");
	}
	return real_memmove(dst, src, n);
}

/*
 * G1's copies of primitive arrays in its pauses (evacuation:
 * Copy::aligned_disjoint_words, libjvm's memcpy over 8 words). With the
 * budget full, the pages an array is copied to are not resident: each is
 * filled with zeros by a fault, written, and written back to memd when room
 * is made, the same bytes crossing twice;
 * the farmem JDK promotes such arrays in memd instead (docs/patched-jdk.md).
 * Here the whole destination pages between the array's first page (its
 * header, which the collector writes right after the copy) and its last
 * (shared with the next object) are written where they lie: a page memd
 * holds, or none yet, in memd's store. Only primitive arrays: the collector
 * then reads nothing of the copy but its header; an object with references
 * it scans at once, which would fetch every page back.
 */
#define PROMOTE_MIN_PAGES 1u /* whole destination pages, not resident, for a copy to go to memd */

/*
 * A promotion's first page that the move left in memd (a page that was
 * resident, zeros filled ahead of the collector's copies, was written here).
 */
static void note_promoted(uintptr_t first, uintptr_t end)
{
	/* A look, not a count: past the samples, the workers' shared counter stays unwritten. */
	if (atomic_load_explicit(&npromoted, memory_order_relaxed) >= READ_BACK_SAMPLES)
		return;
	for (uintptr_t a = first; a < end; a += (uintptr_t)1 << page_shift) {
		if (fm_pg_state(states[(a - base) >> page_shift]) == FM_PG_REMOTE) {
			unsigned k = atomic_fetch_add_explicit(&npromoted, 1, memory_order_relaxed);

			if (k < READ_BACK_SAMPLES)
				promoted_pages[k] = a;
			return;
		}
	}
}

static void *hook_memcpy(void *dst, const void *src, size_t n)
{
	uint64_t npages;
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src, first, end;

	if (n < ((size_t)(PROMOTE_MIN_PAGES + 1) << page_shift) ||
	    !(npages = atomic_load_explicit(&pages, memory_order_acquire)) || !copies_on)
		return real_memcpy(dst, src, n);
	/* The header's 16 bytes stay with the first page; the last page is shared with what follows. */
	first = (d + 16 + ((uintptr_t)1 << page_shift) - 1) & ~(((uintptr_t)1 << page_shift) - 1);
	end = (d + n) & ~(((uintptr_t)1 << page_shift) - 1);
	if (end < first + ((uintptr_t)PROMOTE_MIN_PAGES << page_shift) || !in_heap(s, n, npages) ||
	    !in_heap(d, n, npages))
		return real_memcpy(dst, src, n);
	/*
	 * Through memd: a copy to pages memd holds (a promotion), or one from
	 * pages it holds to resident ones (a mixed pause evacuating an old
	 * region that left, a survivor that did): the store's bytes are copied
	 * into the destination without a fault or a fetch of the source, whose
	 * pages are dead after the copy. Copied here, each source page came in
	 * with a fault, pushed a page out, and left again as garbage.
	 */
	if (all_resident(first, end - first) ? all_resident(s + (first - d), end - first) : !promote_on)
		return real_memcpy(dst, src, n);
	if (!fm_klass_type_array_at(s) || fm_gcfree_in_young(d) != 0)
		return real_memcpy(dst, src, n);
	{
		struct fm_byte_move m = { .src = s + (first - d), .dst = first, .len = end - first };
		struct fm_pager *p = ref.enter();
		long rc = p ? fm_pager_move_bytes(p, &m, 1) : 0;

		if (rc == 1) {
			note_promoted(first, end);
			write_next(p, d, first - d);
			write_next(p, end, d + n - end);
		}
		ref.leave();
		if (rc != 1) {
			if (rc == -EOPNOTSUPP && !atomic_exchange(&refused, 1))
				fm_info("the pager cannot move pages inside memd here: pauses copy through local memory");
			return real_memcpy(dst, src, n);
		}
	}
	real_memcpy(dst, src, first - d);
	real_memcpy((void *)end, (const void *)(s + (end - d)), d + n - end);
	return dst;
}

int fm_gcmove_full_gc(void)
{
	return atomic_load_explicit(&pages, memory_order_acquire) && collections &&
	       collections[1] != full_at_start;
}

/*
 * At a pause's start, before its workers run (the last pause's promotions
 * are all noted): were they read back since (1), or not (0)? -1: too few
 * promotions to tell.
 */
static int promoted_read_back(const struct fm_resmap_region *r, const volatile uint8_t *map, unsigned shift)
{
	unsigned n = atomic_exchange_explicit(&npromoted, 0, memory_order_relaxed), seen = 0, read = 0;

	if (n > READ_BACK_SAMPLES)
		n = READ_BACK_SAMPLES;
	for (unsigned k = 0; k < n; k++) {
		uint64_t i;
		uint8_t b;

		if (promoted_pages[k] < r->base || (i = (promoted_pages[k] - r->base) >> shift) >= r->npages)
			continue;
		b = map[i];
		seen++;
		read += fm_pg_is_resident(b) && !(b & FM_PGF_GC);
	}
	return seen < READ_BACK_MIN ? -1 : read * 4 >= seen;
}

void fm_gcmove_pause(int in_pause)
{
	struct fm_pager *p;
	const struct fm_resmap_hdr *h;
	const struct fm_resmap_region *r;
	int read_back;

	atomic_store_explicit(&pages, 0, memory_order_release); /* until this pause's heap is found */
	atomic_fetch_add_explicit(&pause_seq, 1, memory_order_relaxed);
	if (!in_pause || !atomic_load(&enabled) || atomic_load(&refused))
		return;
	collections = fm_gc_counts();
	/*
	 * G1's only: Serial's young collections ran slower with it (GcChurn at
	 * 25%, 22.5 -> 24.9 s: faults 1.53M -> 1.97M), Parallel's copied few
	 * arrays this way and no faster (bench/RESULTS.md, session 70). Not the
	 * farmem JDK's G1 when it promotes arrays in memd itself
	 * (-XX:+UseFarmemInPlace with -XX:+FarmemPromoteInPlace): what it copies
	 * it chose to, and taken here it ran slower (GcChurn at 50%, 6.2 -> 6.5 s).
	 * Read from its flags, not from its calls: its full GCs call us with
	 * promotion off too, and then nobody promoted in memd.
	 */
	copies_on = fm_klass_setup() && fm_gcfree_kind() == FM_GCFREE_G1 &&
		    !(fm_vms_flag_bool("UseFarmemInPlace") && fm_vms_flag_bool("FarmemPromoteInPlace"));
	promote_on = copies_on;
	if (collections)
		full_at_start = collections[1];
	p = ref.enter();
	h = p ? fm_pager_map(p) : NULL;
	if (h && (r = fm_resmap_heap(h))) {
		uint64_t limit = h->stats.local_limit_pages, batches = h->stats.evict_batches;
		/*
		 * Promotions only under pressure, as the farmem JDK's: the pager
		 * evicted since the last pause and is near its budget. With room, a
		 * promoted array stays here like anything else: AllocRace, whose
		 * arrays are checked once more soon after their promotion, read them
		 * back from memd (bench/RESULTS.md, session 70).
		 */
		promote_on = promote_on && limit && batches != evict_batches_seen &&
			     h->stats.resident_pages * 10 >= limit * 9;
		evict_batches_seen = batches;
		base = r->base;
		page_shift = h->page_shift;
		states = (const uint8_t *)h + r->map_offset;
		read_back = promoted_read_back(r, states, page_shift);
		if (read_back == 1) {
			hold_pauses = hold_len;
			hold_len = hold_len * 2 > HOLD_MOST ? HOLD_MOST : hold_len * 2;
			if (!read_back_told) {
				read_back_told = 1;
				fm_info("gc_moves: this program reads its promoted arrays back soon: "
					"they are promoted through local memory for a while");
			}
		} else if (read_back == 0) {
			hold_len = HOLD_FIRST;
		}
		if (hold_pauses) {
			hold_pauses--;
			promote_on = 0;
		}
		/*
		 * Every registered page fits the budget: nothing has to leave, and
		 * a move through memd would only put there what is read back. The
		 * hooks pass the pause's copies through untouched; each of them
		 * cost a fitting heap's full GCs a look at the residency bytes and
		 * a hand-on to the clock (GcChurn at --local 100%).
		 */
		if (!limit || h->stats.registered_pages > limit)
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
		orig = NULL;
		/* Without it only the full GCs' moves are done in memd. */
		if (fm_got_interpose("libjvm.so", "memcpy", (void *)hook_memcpy, &orig) > 0 && orig &&
		    orig != (void *)hook_memcpy)
			real_memcpy = (void *(*)(void *, const void *, size_t))orig;
		hooked = 1;
	}
	atomic_store(&refused, 0);
	atomic_store(&enabled, 1);
	return 1;
}
