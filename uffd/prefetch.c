// SPDX-License-Identifier: Apache-2.0
/* Runs of one thread's faults, fetched ahead (prefetch.h). */
#include "prefetch.h"

#include <errno.h>
#include <string.h>

#include "budget.h"
#include "chanpool.h"
#include "evict.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "uffd_ops.h"
#include "wait.h"

#define MAX_AHEAD ZERO_RUN_PAGES
/* Pages, a power of two: how far a fresh run goes when everything fits (2 MiB, a huge page's worth). */
#define FRESH_WINDOW 512u

/* Pages a stream ran through without faulting were used: referenced now, their marks cleared, counted. */
static unsigned count_used(struct region *r, uint64_t first, int64_t stride, unsigned n)
{
	unsigned used = 0;

	for (unsigned k = 0; k < n; k++) {
		int64_t j = (int64_t)first + stride * (int64_t)k;
		uint8_t b;
		if (j < 0 || (uint64_t)j >= r->npages)
			break;
		b = pg_load(&r->pg[j]);
		while ((b & FM_PGF_PREFETCH) && fm_pg_is_resident(b) && !pg_is_hold(fm_pg_state(b)) &&
		       !pg_cas(&r->pg[j], &b, (uint8_t)((b & ~FM_PGF_PREFETCH) | FM_PGF_REF)))
			;
		if ((b & FM_PGF_PREFETCH) && fm_pg_is_resident(b))
			used++;
	}
	return used;
}

/*
 * Whether pages last + stride, ... up to the one before last + steps *
 * stride are resident: a run that faulted steps strides on went through
 * them, where a program that jumped ahead skipped pages it would have
 * faulted on.
 */
static int went_through(struct region *r, uint64_t last, int64_t stride, uint64_t steps)
{
	for (uint64_t k = 1; k < steps; k++) {
		int64_t j = (int64_t)last + stride * (int64_t)k;

		if (j < 0 || (uint64_t)j >= r->npages || !fm_pg_is_resident(pg_load(&r->pg[j])))
			return 0;
	}
	return 1;
}

/*
 * The loop rule's record (evict.c, pick_passed). A loop over more than the
 * budget comes back to the pages the rule let go in a run of faults, the
 * loop's own; memory a run wrote and the program then uses at random (a
 * copying collector's to-space: BEAM's, V8's, SBCL's) comes back a fault
 * at a time, and there the clock would have kept it: a semispace copy
 * with random work between took 41% more faults with the rule
 * (bench/RESULTS.md, session 62). A run's pages fetched ahead count too.
 * The score halves at each budget of evictions, so that a program whose
 * pattern changes gets the rule back.
 */
#define LOOP_SCORE_MAX 4096
/* Pages runs of writes may let go of with no record yet, each budget of evictions: a 1024th of it. */
#define LOOP_PROBE(limit) ((limit) / 1024 > 16 ? (limit) / 1024 : 16)
#define LOOPED_READ 1
#define LOOPED_WRITE 2

/* n of the rule's pages came back, in a run or not: a fault, or a run's pages fetched ahead. */
static void loop_judge(struct fm_pager *p, int in_run, unsigned n)
{
	int s = atomic_load(&p->loop_score);

	if (in_run ? s < LOOP_SCORE_MAX : s > -LOOP_SCORE_MAX)
		atomic_fetch_add(&p->loop_score, in_run ? (int)n : -(int)n);
	if (in_run)
		STAT_ADD(p, loop_back_run, n);
	else
		STAT_ADD(p, loop_back_random, n);
}

/*
 * A run of writes over pages that left (a to-space, a buffer refilled)
 * needs the record to speak for the rule first; a run of reads, only that
 * it does not speak against it. The copy's writes are what hurt: with the
 * writes held back, the two spaces' faults are the clock's. With the
 * record alone the first copies paid before any page came back (15% more
 * faults), and Node, rustc and zstd took 3-9% more (session 62). But a
 * stencil's two buffers that each fit but not together come back to its
 * writes in a run, and with no record to start from its writes never got
 * the rule (51k faults against 8.6k): so while the record is empty, runs
 * of writes may let go of a few pages (LOOP_PROBE) each budget, to get
 * one. Few: with a 64th of the budget Node (V8's young generation) took
 * 16% more faults (bench/RESULTS.md, session 64).
 */
static int loop_trusted(struct fm_pager *p, int wrote)
{
	uint64_t limit = atomic_load(&p->limit), budgets = fm_evicted(p) / (limit ? limit : 1);
	uint_fast64_t seen = atomic_load(&p->loop_epoch);
	int score;

	if (budgets != seen && atomic_compare_exchange_strong(&p->loop_epoch, &seen, budgets)) {
		atomic_store(&p->loop_score, atomic_load(&p->loop_score) / 2);
		atomic_store(&p->loop_probe, 0);
	}
	score = atomic_load(&p->loop_score);
	if (!wrote)
		return score >= 0;
	return score > 0 || (score == 0 && atomic_load(&p->loop_probe) < LOOP_PROBE(limit));
}

/*
 * Record the fault in the thread's stream; returns how many pages ahead to
 * fill (0: not a run yet) and the stride. Two faults with the same small
 * stride make a run.
 */
static unsigned follow(struct fm_pager *p, pid_t tid, unsigned kind, int ridx, struct region *r, uint64_t idx,
		       int looped, int back_loop, int64_t *stride_out, struct stream **out)
{
	struct stream *s;
	unsigned used = 0, ahead = 0;
	int64_t stride;
	uint64_t passed_last = 0, passed_n = 0;
	int64_t passed_stride = 0;
	int passed_wrote = 0; /* a run of writes: its pages count against the probe (loop_trusted) */

	pthread_mutex_lock(&p->stream_lock);
	/* One per region too: a copy from one mapping to another is two runs, not one that breaks at each fault. */
	s = &p->streams[((unsigned)tid * 4 + kind + (unsigned)ridx * 36) % NSTREAMS];
	if (s->tid != tid || s->region != ridx) {
		*s = (struct stream){ .tid = tid, .region = ridx, .last = idx };
		pthread_mutex_unlock(&p->stream_lock);
		return 0;
	}
	stride = (int64_t)idx - (int64_t)s->last;
	if (s->pf_count && idx == s->pf_next) {
		used = count_used(r, s->pf_next - (uint64_t)((int64_t)s->pf_count * s->stride), s->stride,
				  s->pf_count);
		/*
		 * The run's last fault and the pages fetched after it are behind
		 * it now; a run of pages back soon after they left is a loop over
		 * more than the budget, which comes back to them last (evict.c).
		 */
		if (s->looped && kind == 0 && loop_trusted(p, s->looped == LOOPED_WRITE)) {
			passed_n = s->pf_count + 1u;
			passed_wrote = s->looped == LOOPED_WRITE;
			passed_stride = s->stride;
			passed_last = s->pf_next - (uint64_t)s->stride;
		}
		/*
		 * The run went through what we fetched ahead and faulted just past
		 * it: it goes on, with its stride. (idx - last spans the pages
		 * fetched; taken for a new stride, it broke every run after its
		 * first fetch ahead: a fault every 3.4 pages of a sequential read
		 * with 8 ahead, not every 9; tests/unit/test_pager_prefetch_run.c.)
		 */
		stride = s->stride;
	} else if (s->hits >= 1 && stride != s->stride && stride % s->stride == 0 && stride / s->stride > 0 &&
		   stride / s->stride <= (int64_t)MAX_AHEAD + 16 &&
		   went_through(r, s->last, s->stride, (uint64_t)(stride / s->stride))) {
		/*
		 * The run faulted further on, a whole number of its strides: a
		 * page it fetched ahead left before the run got there (a budget
		 * full of other streams' pages), or pages it found resident ended
		 * the fetch and the run went on through them (they are resident:
		 * a jump ahead over pages that are not is no run). It goes on all
		 * the same. Taken for a new stride, each such fault cost two more
		 * before the run was one again: a stencil's two buffers, each
		 * read and written in order, faulted 3.6 times as often (most
		 * faults one page after the last; bench/RESULTS.md, session 64).
		 * What it went through is not handed to the loop rule: a run
		 * through memory partly resident is not one over more than the
		 * budget, and rustc at 25% read 2.4 times the pages back when it
		 * was.
		 */
		uint64_t steps = (uint64_t)(stride / s->stride);

		used = count_used(r, s->last + (uint64_t)s->stride, s->stride,
				  (unsigned)(steps - 1 < s->pf_count ? steps - 1 : s->pf_count));
		stride = s->stride;
	}
	s->pf_count = 0;
	if (stride != 0 && stride == s->stride && stride >= -16 && stride <= 16)
		s->hits++;
	else
		s->hits = 0;
	s->stride = stride;
	s->last = idx;
	s->looped = looped;
	if (s->hits >= 1)
		ahead = MAX_AHEAD;
	pthread_mutex_unlock(&p->stream_lock);
	if (back_loop)
		loop_judge(p, ahead > 0, 1);
	if (passed_n && passed_wrote)
		atomic_fetch_add(&p->loop_probe, (unsigned)passed_n);
	if (passed_n)
		fm_evict_passed(p, ridx, passed_last, passed_stride, passed_n);
	if (used)
		STAT_ADD(p, prefetch_used, used);
	*stride_out = stride;
	*out = s;
	return ahead;
}

/*
 * Room for one more page ahead. With an evictor thread, up to the limit but
 * no eviction here: that thread makes the room. (Kept under its high mark,
 * pages ahead were refused whenever a read outran the evictor, which is
 * whenever a read goes in order: a fault every 1.3 to 8 pages with 8 ahead,
 * each at the limit evicting a batch itself all the same; session 53.)
 * Without one, the budget is full most of the time, so the run's first page
 * makes room itself: one batch, as a fault at the limit does.
 */
static int reserve(struct fm_pager *p, struct fm_borrowed *fc, unsigned claimed)
{
	if (fm_budget_reserve(p, atomic_load(&p->limit)))
		return 1;
	if ((p->evictor_started && !fm_in_gc_pause(p)) || claimed || atomic_load(&p->evict_broken) ||
	    !fm_evict_batch(p, fm_borrow(p, fc), p->cfg.evict_batch))
		return 0;
	return fm_budget_reserve(p, atomic_load(&p->limit));
}

/*
 * Pages claimed (held FILLING, room reserved): the remote ones (remote[],
 * a subset of want[], both ascending) read from memd in one call, then all
 * installed in runs. A remote page goes in with remote_flags (what a guess
 * is worth: FM_PGF_PREFETCH, or FM_PGF_REF when the program reads it now).
 * Returns the pages filled from memd; *zeros_out those filled with zeros.
 */
static unsigned install_claimed(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, const uint64_t *want,
				const uint8_t *was, unsigned nw, const uint64_t *remote, unsigned nr, int open_remote,
				int open_fresh, uint8_t remote_flags, int wake, unsigned *zeros_out)
{
	const void *src[MAX_AHEAD];
	unsigned got = 0, zeros = 0;

	if (nr) {
		int rc = fm_chan_read(fm_borrow(p, fc), r->space, remote, nr, src);
		if (rc)
			fm_fatal("a read ahead of %u pages from memd failed: %s", nr, fm_strerror(-rc));
		STAT_ADD(p, remote_reads, nr);
		STAT_ADD(p, remote_read_bytes, (uint64_t)nr * PG_SIZE);
		fm_churn(p, nr);
	}
	for (unsigned k = 0, ri = 0; k < nw;) {
		/* A run: consecutive pages of one kind whose sources are consecutive too. */
		int is_remote = ri < nr && remote[ri] == want[k];
		const uint8_t *from = is_remote ? src[ri] : p->zero_run;
		/* A remote page written in its last stay goes in writable, as its own fault would put it (fault.c). */
		int open = is_remote && (open_remote || (was[k] & FM_PGF_REWRITE));
		unsigned n = 1;
		uint64_t skipped;

		while (k + n < nw && want[k + n] == want[k] + n &&
		       (is_remote ? (ri + n < nr && remote[ri + n] == want[k + n] &&
				     (const uint8_t *)src[ri + n] == from + ((size_t)n << PG_SHIFT) &&
				     (open_remote || !(was[k + n] & FM_PGF_REWRITE) == !open))
				  : fm_pg_state(was[k + n]) == FM_PG_UNTOUCHED && n < ZERO_RUN_PAGES))
			n++;
		fm_uffd_install(r->uffd, r->base + (want[k] << PG_SHIFT), from, n,
				is_remote ? !open : !open_fresh, wake, &skipped);
		for (unsigned q = 0; q < n; q++) {
			uint8_t b = was[k + q], held = pg_make(FM_PG_FILLING, b);
			/*
			 * A page that was there already holds bytes we did not put
			 * there: booking it as our copy (CLEAN) would let a clean
			 * eviction throw them away. It goes back as it was; its own
			 * fault sorts it out.
			 */
			if (skipped & (1ull << q)) {
				pg_release(&r->pg[want[k + q]], held, b);
				fm_resident_add(p, -1);
			} else {
				pg_release(&r->pg[want[k + q]], held, is_remote
				 ? pg_make(open ? FM_PG_DIRTY : FM_PG_CLEAN,
					   (uint8_t)((b & FM_PGF_HAS_REMOTE) | remote_flags |
						     (open ? FM_PGF_REWRITE : 0)))
				 : pg_make(open_fresh ? FM_PG_DIRTY : FM_PG_CLEAN, FM_PGF_REF));
			}
		}
		/*
		 * One wake for the run: with anyone waiting on any page, each
		 * release's wake is a system call that rouses every waiter (a
		 * collector's other worker, faulting on a page of this run).
		 */
		fm_settled(p);
		if (is_remote) {
			got += n;
			ri += n;
		} else {
			zeros += n;
		}
		k += n;
	}
	*zeros_out = zeros;
	return got;
}

void fm_prefetch(struct fm_pager *p, struct fm_borrowed *fc, int ridx, struct region *r, uint64_t idx,
		 int write, int fresh, int gc, unsigned back, int wake)
{
	uint64_t want[MAX_AHEAD], remote[MAX_AHEAD];
	uint8_t was[MAX_AHEAD];
	unsigned nw = 0, nr = 0, got = 0, zeros = 0, looped_ahead = 0, ahead, remote_max, total;
	/*
	 * A page fetched ahead has not been used: it goes in unreferenced, so
	 * that the hand's next pass takes it unless it is written or its
	 * thread's run goes on through it (count_used), as Linux keeps its
	 * readahead on the inactive list until used. Referenced, the pages a
	 * run guessed wrong held their room for two passes: PHP at 25% took
	 * 2.41M faults against 2.06M (bench/RESULTS.md, sessions 42-43). What a GC
	 * thread fetched ahead leaves first (evict.c, gc_aware).
	 */
	uint8_t cold = gc ? FM_PGF_GC : 0;
	/*
	 * A collector writing old pages in a row (a compaction's destination)
	 * writes the pages ahead too, and with gc_writable so does one reading
	 * them (prefetch.h): they go in writable, booked DIRTY, rather than
	 * protected, each to cost a write-protect fault and an unprotect (a TLB
	 * shootdown) a moment later. A guess (FM_PGF_REWRITE): on shm one left
	 * unwritten leaves clean (evict.c). So does every page of a region a
	 * handler thread serves (fm_region_installs_open), fresh ones too, and
	 * any page written in its last stay (below).
	 */
	int open_all = fm_region_installs_open(r);
	int open_remote = (gc && write) || fm_gc_read_opens(p, gc) || open_all;
	int open_fresh = write || open_all;
	struct stream *s = NULL;
	int64_t stride = 0;
	int looped;

	/*
	 * A collector's writes and reads of old data are two runs as well: a
	 * compaction reads objects at one place and writes them at another, a
	 * little lower, page after page.
	 */
	/*
	 * Not a collector's run (what it fetches goes in cold already), nor a
	 * program's in a JVM's heap: its collector walks what the program went
	 * through, and taking that first made it fetch again (Spark PageRank at
	 * 25%: its pause workers' faults a third more; bench/RESULTS.md).
	 */
	looped = (back & FM_BACK_SOON) && !gc && p->cfg.loop_evict &&
			 !(fm_resmap_slot(p->hdr, (unsigned)r->slot)->flags & FM_REGION_F_HEAP)
		 ? (write ? LOOPED_WRITE : LOOPED_READ)
		 : 0;
	ahead = follow(p, fc->tid, (unsigned)fresh | (unsigned)(gc && write) << 1, ridx, r, idx, looped,
		       (back & FM_BACK_LOOP) != 0, &stride, &s);
	/* Remote pages ahead: none of a fresh run; a GC thread's as many as gc_window allows, when it may. */
	remote_max = fresh ? 0
		     : gc  ? (fm_in_full_gc(p) ? 0 : p->cfg.gc_window)
			   : p->cfg.prefetch;
	/*
	 * A fresh page right after a resident one extends memory in use:
	 * allocation (a TLAB, a PLAB, a heap growing) goes on from there, so
	 * the fresh pages after it go in now, one call, even before the thread
	 * has made a run of faults. Zeros nobody writes leave again with no
	 * write-back (evict.c).
	 */
	if (!ahead && fresh && idx > 0 && fm_pg_is_resident(pg_load(&r->pg[idx - 1]))) {
		ahead = MAX_AHEAD;
		stride = 1;
	}
	/*
	 * Claim the pages ahead that are not resident, stopping at the first
	 * that is. Remote pages: at most `prefetch` of them (each costs a
	 * transfer and room that may hold something in use); untouched ones
	 * cost neither, so a run of fresh memory goes in MAX_AHEAD at a time.
	 */
	for (unsigned k = 1; k <= ahead && nw < MAX_AHEAD; k++) {
		int64_t j = (int64_t)idx + stride * (int64_t)k;
		uint8_t b;
		unsigned st;
		if (j < 0 || (uint64_t)j >= r->npages)
			break;
		b = pg_load(&r->pg[j]);
		st = fm_pg_state(b);
		if ((st != FM_PG_REMOTE && st != FM_PG_UNTOUCHED) ||
		    (st == FM_PG_REMOTE && nr >= remote_max) || !reserve(p, fc, nw))
			break;
		if (!pg_cas(&r->pg[j], &b, pg_make(FM_PG_FILLING, b))) {
			fm_resident_add(p, -1);
			break;
		}
		was[nw] = b;
		want[nw++] = (uint64_t)j;
		if (st == FM_PG_REMOTE)
			remote[nr++] = (uint64_t)j;
		looped_ahead += st == FM_PG_REMOTE && (b & FM_PGF_LOOPED);
	}
	if (looped_ahead)
		loop_judge(p, 1, looped_ahead);
	if (!nw)
		return;
	got = install_claimed(p, fc, r, want, was, nw, remote, nr, open_remote, open_fresh,
			      (uint8_t)(FM_PGF_PREFETCH | cold), wake, &zeros);
	total = nw;
	/*
	 * Fresh memory in order while every registered page fits the budget:
	 * nothing will ever make it leave, so the run goes on to the end of its
	 * FRESH_WINDOW, a call per MAX_AHEAD pages and a fault per window.
	 */
	while (fresh && stride == 1 && nw == MAX_AHEAD && !nr && fm_budget_all_fits(p)) {
		uint64_t next = want[nw - 1] + 1, end = (next + FRESH_WINDOW) & ~(uint64_t)(FRESH_WINDOW - 1);
		unsigned more;

		if (!(next & (FRESH_WINDOW - 1)))
			break; /* the window ended with the last call */
		nw = 0;
		for (uint64_t j = next; j < end && j < r->npages && nw < MAX_AHEAD; j++) {
			uint8_t b = pg_load(&r->pg[j]);

			if (fm_pg_state(b) != FM_PG_UNTOUCHED || !fm_budget_reserve(p, atomic_load(&p->limit)))
				break;
			if (!pg_cas(&r->pg[j], &b, pg_make(FM_PG_FILLING, b))) {
				fm_resident_add(p, -1);
				break;
			}
			was[nw] = b;
			want[nw++] = j;
		}
		if (!nw)
			break;
		install_claimed(p, fc, r, want, was, nw, remote, 0, open_remote, open_fresh, 0, wake, &more);
		zeros += more;
		total += nw;
	}
	if (got)
		STAT_ADD(p, prefetch_issued, got);
	if (zeros)
		STAT_ADD(p, zero_fills, zeros);
	pthread_mutex_lock(&p->stream_lock);
	if (s && s->tid == fc->tid) {
		s->pf_count = total;
		s->pf_next = (uint64_t)((int64_t)idx + stride * (int64_t)(total + 1));
	}
	pthread_mutex_unlock(&p->stream_lock);
}

/*
 * Remote page j of r, which its thread reads now, claimed as a fault's page
 * would be: room made (an eviction batch if need be), then held FILLING.
 * 1: claimed (*was: its byte before); 0: not remote, or another thread got
 * it first (it fills it); -1: no room.
 */
static int claim_read_now(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, uint64_t j, uint8_t *was)
{
	uint8_t b = pg_load(&r->pg[j]);

	/* Its remote pages only: a resident one is there, a held one its holder fills. */
	if (fm_pg_state(b) != FM_PG_REMOTE)
		return 0;
	if (!reserve(p, fc, 0))
		return -1;
	if (!pg_cas(&r->pg[j], &b, pg_make(FM_PG_FILLING, b))) {
		fm_resident_add(p, -1);
		return 0;
	}
	*was = b;
	return 1;
}

void fm_prefetch_object(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, uint64_t idx, uint64_t last,
			int wake)
{
	uint64_t want[MAX_AHEAD];
	uint8_t was[MAX_AHEAD];
	unsigned nw = 0, got, zeros, back_soon = 0;
	int open = fm_region_installs_open(r);

	if (last >= r->npages)
		last = r->npages - 1;
	for (uint64_t j = idx + 1; j <= last && nw < MAX_AHEAD; j++) {
		int c = claim_read_now(p, fc, r, j, &was[nw]);

		if (c < 0)
			break;
		if (!c)
			continue;
		/*
		 * Read now, as if each had faulted: its heat, and the program's
		 * record of pages back soon that the discard's verdict reads
		 * (fm_pager_short_of_room). Left out, the faults that remained
		 * were mostly such pages, and the verdict took a budget that
		 * holds GcChurn's arrays for one too small (test_discard.py,
		 * test_next_eden_left_writable: 58% of the garbage written again).
		 */
		back_soon += (fm_heat_filled(p, r, j, was[nw]) & FM_BACK_BUDGET) != 0;
		want[nw++] = j;
	}
	if (!nw)
		return;
	atomic_fetch_add_explicit(&p->app_remote_faults, nw, memory_order_relaxed);
	atomic_fetch_add_explicit(&p->app_back_soon, back_soon, memory_order_relaxed);
	got = install_claimed(p, fc, r, want, was, nw, want, nw, open, open, FM_PGF_REF, wake, &zeros);
	STAT_ADD(p, object_reads, got);
}

void fm_prefetch_referents(struct fm_pager *p, struct fm_borrowed *fc, struct region *r, const uint64_t *pages,
			   unsigned n, int open, uint8_t flags, int wake)
{
	uint64_t want[MAX_REFERENTS];
	uint8_t was[MAX_REFERENTS];
	unsigned nw = 0, got, zeros;

	/* The collector reads each of them next: claimed as its fault's page would be. */
	for (unsigned k = 0; k < n && nw < MAX_REFERENTS; k++) {
		int c = claim_read_now(p, fc, r, pages[k], &was[nw]);

		if (c < 0)
			break;
		if (c)
			want[nw++] = pages[k];
	}
	if (!nw)
		return;
	got = install_claimed(p, fc, r, want, was, nw, want, nw, open, open, flags, wake, &zeros);
	STAT_ADD(p, referent_reads, got);
}
