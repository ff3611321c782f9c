// SPDX-License-Identifier: Apache-2.0
/*
 * The fault handlers (fault.h). Every page's life is its state byte (page.h);
 * a handler changes one only by compare-and-swap into a hold, so a faulting
 * thread, the evictor and a program thread that frees memory agree on who
 * owns a page at each moment. A thread that meets another's hold waits for
 * the page to settle, then looks again.
 *
 * This file runs inside a SIGBUS handler in fault=signal mode: no malloc, no
 * stdio, no lock that the interrupted code could hold (the pager's own code
 * never touches paged memory while holding one).
 */
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "evict.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "pins.h"
#include "prefetch.h"
#include "region.h"
#include "shmem.h"
#include "uffd_ops.h"
#include "wait.h"

/* A written garbage page opens this many pages of its run at once (allocation streams on). */
#define GARBAGE_RUN_PAGES 512
/* A pause worker's write to a clean page opens at most this many clean pages after it (open_clean). */
#define OPEN_AHEAD_PAGES 32

/* 0, FM_GC_PAUSE or FM_GC_CONC (pager.h). */
static int is_gc(struct fm_pager *p, pid_t tid)
{
	return p->cfg.is_gc_thread && tid > 0 ? p->cfg.is_gc_thread(tid) : 0;
}

static void count_fault(struct fm_pager *p, int gc)
{
	STAT_ADD(p, faults, 1);
	if (gc)
		STAT_ADD(p, gc_faults, 1);
	else
		STAT_ADD(p, app_faults, 1);
	if (gc == FM_GC_CONC || gc == FM_GC_SCAN)
		STAT_ADD(p, gc_conc_faults, 1);
}

/* Fetch page i of r from memd; a page memd cannot give back stops the program. */
static const void *fetch_one(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i)
{
	const void *src;
	int rc = fm_chan_read(fm_borrow(p, &f->fc), r->space, &i, 1, &src);

	if (rc) {
		STAT_ADD(p, transport_errors, 1);
		if (rc == -EIO)
			STAT_ADD(p, crc_errors, 1);
		fm_fatal("page %#lx is in memd but cannot be read back (%s%s)",
			 (unsigned long)(r->base + (i << PG_SHIFT)), fm_strerror(-rc),
			 rc == -EIO ? ": checksum mismatch" : "");
	}
	STAT_ADD(p, remote_reads, 1);
	STAT_ADD(p, remote_read_bytes, PG_SIZE);
	return src;
}

/*
 * Wait for another thread's hold on a page to end. A borrowed channel goes
 * back first: the holder may need one to finish (a fetch, a write-back), and
 * the pool is smaller than the number of threads that can wait here.
 */
static uint8_t wait_settle(struct fm_pager *p, struct fm_fault *f, uint8_t *b)
{
	fm_give_back(p, &f->fc);
	return fm_settle(p, b);
}

/*
 * Room for one more resident page: at the limit the faulting thread evicts a
 * batch itself, looking again FM_EVICT_LOOKS times if it finds nothing. Only
 * then (memd unusable or full, every page busy or pinned) does the page come
 * in over the budget (over_budget_fills). A GC worker's page at attach did,
 * now and then, in a whole make test only (bench/RESULTS.md, sessions 77-79).
 */
static void reserve_room(struct fm_pager *p, struct fm_fault *f)
{
	unsigned empty = 0;

	while (!fm_budget_reserve(p, atomic_load(&p->limit))) {
		unsigned n = atomic_load(&p->evict_broken)
				     ? 0 : fm_evict_batch(p, fm_borrow(p, &f->fc), p->cfg.evict_batch);
		STAT_ADD(p, direct_evictions, n);
		if (n)
			continue;
		if (atomic_load(&p->evict_broken) || ++empty == FM_EVICT_LOOKS) {
			STAT_ADD(p, over_budget_fills, 1);
			fm_resident_add(p, 1);
			return;
		}
		sched_yield();
	}
}

/* An access this near a page's start walked in from the page before (a loop over an array). */
#define OBJECT_WALKED_IN 64u

/*
 * An array whose header is on the fault's page (its length was read):
 * read whole with the fault only if it ends within `prefetch` pages. A
 * longer one may be a table read at random after its length (a hash
 * lookup); read in order, its fault on the next page walks in and brings
 * the pages after it (Neo4j at 25% read 9% more pages back when a long
 * array's length brought `prefetch` pages).
 */
static uintptr_t short_object(struct fm_pager *p, uintptr_t page, uintptr_t end)
{
	return end && end - page <= ((uintptr_t)p->cfg.prefetch + 1) << PG_SHIFT ? end : 0;
}

/*
 * A program thread's fault on remote page i, which is filled and still
 * held: the end of the array it touched, if the agent finds the array's
 * header on this page before the address touched, or on the page before
 * when the thread walked into this one from there (an access at this
 * page's start). That page is held meanwhile, so that the agent reads
 * only pages nobody can take away. 0: no array found, or not a heap.
 */
static uintptr_t object_end(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i)
{
	uintptr_t page = r->base + (i << PG_SHIFT), end;
	uint8_t b, held;
	unsigned s;

	if (!p->cfg.object_end || !p->cfg.prefetch ||
	    !(fm_resmap_slot(p->hdr, (unsigned)r->slot)->flags & FM_REGION_F_HEAP))
		return 0;
	if (i == 0 || f->addr - page >= OBJECT_WALKED_IN)
		return short_object(p, page, p->cfg.object_end(f->addr, page));
	b = pg_load(&r->pg[i - 1]);
	s = fm_pg_state(b);
	if ((s != FM_PG_CLEAN && s != FM_PG_DIRTY) || !pg_cas(&r->pg[i - 1], &b, held = pg_make(FM_PG_UPDATING, b)))
		return short_object(p, page, p->cfg.object_end(f->addr, page));
	end = p->cfg.object_end(f->addr, page - PG_SIZE);
	fm_release(p, &r->pg[i - 1], held, b);
	return end;
}

/*
 * A full GC follows references twice over the whole heap: its marking, and
 * its pointer adjustment, which reads the header (the forwarding pointer) of
 * every object a moved reference points at. Each walks an object's slots in
 * a loop and reads a header for each: scattered pages, a fault each. The
 * loop's slot is in a register at the fault, or on the stack: the agent says
 * which holds a reference to the object touched (pager.h, referents), and the
 * objects the slots after it refer to come in with the fault's page. Not G1's
 * concurrent marking, which reads an object only the first time it is
 * marked: objects shared or marked already, the next slots' objects were
 * mostly read for nothing (Neo4j at 25%: twice the pages read back), and
 * GcChurn's gain came from its full GCs. Not a young pause, which reads only
 * the young objects its old slots refer to.
 */
static int follows_references(struct fm_pager *p, struct fm_fault *f, int gc)
{
	/* gc_window bounds a collector's reads ahead: up to it (MAX_REFERENTS), none at 0. */
	return p->cfg.referents && f->regs && p->cfg.gc_window && gc == FM_GC_PAUSE && fm_in_full_gc(p);
}

/* Words at the top of a faulting thread's stack looked at for the loop's slot (referent_pages). */
#define STACK_WORDS 16u

/*
 * A word of the faulting thread's stack above its stack pointer: its
 * callers' frames, which a sanitizer has poisoned in parts (redzones) that
 * are still memory this thread may read.
 */
__attribute__((no_sanitize("address"))) static uintptr_t stack_word(uintptr_t sp, unsigned k)
{
	return __atomic_load_n((const uintptr_t *)sp + k, __ATOMIC_RELAXED);
}

/* pages[0..m) ascending, each once (at most MAX_REFERENTS: no allocation in a signal handler). */
static unsigned sort_unique(uint64_t *pages, unsigned m)
{
	unsigned u = 0;

	for (unsigned k = 1; k < m; k++) {
		uint64_t v = pages[k];
		unsigned q = k;

		for (; q > 0 && pages[q - 1] > v; q--)
			pages[q] = pages[q - 1];
		pages[q] = v;
	}
	for (unsigned k = 0; k < m; k++)
		if (!u || pages[k] != pages[u - 1])
			pages[u++] = pages[k];
	return u;
}

/*
 * A full GC worker's fault on remote page i of heap region r, filled and held:
 * the pages of r, other than i, of the objects the references after the
 * loop's slot refer to (ascending, each once), if a register or a word at
 * the top of the stack holds that slot. The slot's page is held while the
 * agent reads it.
 */
static unsigned referent_pages(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i,
			       uint64_t *pages)
{
	uintptr_t end = r->base + (r->npages << PG_SHIFT), obj[MAX_REFERENTS];
	/*
	 * The stack's top words too: a function the loop calls for each slot
	 * (JDK 21's full GC marking, mark_and_push) saves the loop's registers
	 * there before it takes them for its own. Not a stack in paged memory,
	 * whose words could fault here.
	 */
	int stack_ok = f->sp && !(f->sp & 7) && !fm_region_maybe(p, f->sp, f->sp + STACK_WORDS * 8);
	unsigned n = 0, m = 0, nstack = stack_ok ? STACK_WORDS : 0;
	unsigned max = p->cfg.gc_window < MAX_REFERENTS ? p->cfg.gc_window : MAX_REFERENTS;

	if (!(fm_resmap_slot(p->hdr, (unsigned)r->slot)->flags & FM_REGION_F_HEAP))
		return 0;
	for (unsigned k = 0; k < f->nregs + nstack && !n; k++) {
		uintptr_t v = k < f->nregs ? f->regs[k] : stack_word(f->sp, k - f->nregs);
		uint64_t j;
		uint8_t b, held;
		unsigned s;

		if (v < r->base || v >= end)
			continue;
		j = (v - r->base) >> PG_SHIFT;
		if (j == i) {
			n = p->cfg.referents(f->addr, v, r->base + ((j + 1) << PG_SHIFT), obj, max);
			continue;
		}
		b = pg_load(&r->pg[j]);
		s = fm_pg_state(b);
		if ((s != FM_PG_CLEAN && s != FM_PG_DIRTY) || !pg_cas(&r->pg[j], &b, held = pg_make(FM_PG_UPDATING, b)))
			continue;
		n = p->cfg.referents(f->addr, v, r->base + ((j + 1) << PG_SHIFT), obj, max);
		fm_release(p, &r->pg[j], held, b);
	}
	for (unsigned k = 0; k < n; k++) {
		uint64_t j;

		/* A word that points out of the heap is no reference: the loop's slots ended before it. */
		if (obj[k] < r->base || obj[k] >= end)
			break;
		if ((j = (obj[k] - r->base) >> PG_SHIFT) != i)
			pages[m++] = j;
	}
	return sort_unique(pages, m);
}

/* Page i of r is held FILLING (was b) and has room: fill it from memd or with zeros. */
static void fill(struct fm_pager *p, struct fm_fault *f, struct region *r, int ridx, uint64_t i, uint8_t b)
{
	uintptr_t addr = r->base + (i << PG_SHIFT);
	uint8_t held = pg_make(FM_PG_FILLING, b), fl;
	int remote = fm_pg_state(b) == FM_PG_REMOTE, gc = is_gc(p, f->fc.tid), wr, cold;
	unsigned back;
	uint64_t t_xport = 0, t_copy, skipped;
	uintptr_t end;
	const void *src;
	uint64_t referents[MAX_REFERENTS];
	unsigned nref;

	if (remote) {
		t_xport = fm_now_ns();
		src = fetch_one(p, f, r, i);
		t_xport = fm_now_ns() - t_xport;
		fm_churn(p, 1);
	} else {
		src = p->zero_run;
	}
	/*
	 * A read installs the page write-protected: it stays clean (no
	 * write-back) until written. Unless it was written in its last stay,
	 * or a collector reads old data (gc_writable: prefetch.h says why),
	 * or a handler thread serves the region (fm_region_installs_open):
	 * then it goes in writable, a guess that costs a write-back if wrong.
	 */
	wr = f->write || fm_region_installs_open(r) ||
	     (remote && ((b & FM_PGF_REWRITE) || fm_gc_read_opens(p, gc)));
	t_copy = fm_now_ns();
	fm_uffd_install(r->uffd, addr, src, 1, !wr, !f->in_thread, &skipped);
	if (skipped) {
		/*
		 * There already (a stale fault) or an unmap is under way behind
		 * the shim: nothing of ours went in. The page goes back as it was
		 * and its thread faults again, into whatever is mapped there then.
		 */
		fm_release(p, &r->pg[i], held, b);
		fm_resident_add(p, -1);
		return;
	}
	if (remote) {
		uint64_t t_end = fm_now_ns();
		STAT_ADD(p, split_faults, 1);
		STAT_ADD(p, split_handler_ns, t_end - f->t0);
		STAT_ADD(p, split_transport_ns, t_xport);
		STAT_ADD(p, split_copy_ns, t_end - t_copy);
	} else {
		STAT_ADD(p, zero_fills, 1);
		if (gc)
			STAT_ADD(p, gc_zero_fills, 1);
	}
	/*
	 * What only a collector touched leaves first (gc_aware): what it read,
	 * and old data it wrote (a compaction's destination is no hotter than
	 * its source). Fresh pages it writes are the survivors it evacuates.
	 * Not in a full GC whose moves memd does: each of its phases reads every
	 * live header again, and let go first the clock took the marking's
	 * pages before the next phase came back to them (GcChurn at 25% local:
	 * phase 2 read 258k pages back under JDK 21, 66k kept a pass).
	 */
	cold = gc && (!f->write || remote) && !fm_in_full_gc(p);
	fl = (uint8_t)((b & FM_PGF_HAS_REMOTE) | (cold ? FM_PGF_GC : FM_PGF_REF) |
		       (wr && !f->write && remote ? FM_PGF_REWRITE : 0));
	back = fm_heat_filled(p, r, i, b);
	/* Asked while the page is held: nobody can take it from under the agent's reads. */
	end = remote && !gc ? object_end(p, f, r, i) : 0;
	nref = remote && follows_references(p, f, gc) ? referent_pages(p, f, r, i, referents) : 0;
	if (remote && !gc) {
		atomic_fetch_add_explicit(&p->app_remote_faults, 1, memory_order_relaxed);
		if (back & FM_BACK_BUDGET)
			atomic_fetch_add_explicit(&p->app_back_soon, 1, memory_order_relaxed);
	}
	fm_release(p, &r->pg[i], held, pg_make(wr ? FM_PG_DIRTY : FM_PG_CLEAN, fl));
	count_fault(p, gc);
	if (r->kernel_waits && p->in_thread)
		STAT_ADD(p, heap_faults, 1);
	if (end > addr + PG_SIZE && end <= r->base + (r->npages << PG_SHIFT)) {
		/*
		 * At most `prefetch` pages, as a run's read-ahead: an array read
		 * at random (a hash table's) would bring all of itself for one
		 * element. Spark at 25% read 7% more with no such bound.
		 */
		uint64_t last = (end - 1 - r->base) >> PG_SHIFT;

		fm_prefetch_object(p, &f->fc, r, i, last - i > p->cfg.prefetch ? i + p->cfg.prefetch : last,
				   !f->in_thread);
		return;
	}
	if (nref) {
		int open = fm_gc_read_opens(p, gc) || fm_region_installs_open(r);

		fm_prefetch_referents(p, &f->fc, r, referents, nref, open, cold ? FM_PGF_GC : FM_PGF_REF,
				      !f->in_thread);
		return;
	}
	if (p->cfg.prefetch)
		fm_prefetch(p, &f->fc, ridx, r, i, f->write, !remote, gc, back, !f->in_thread);
}

/*
 * Resident by our books, yet the thread faulted as missing. Either the fault
 * is stale (the page went in after it was raised) or the program dropped the
 * page behind our back, which for private anonymous memory means zeros. A
 * zero copy tells the two apart: the kernel skips a page that is there. The
 * page is held across the copy: unheld, the evictor could drop it between
 * our look and the copy, which would then map zeros, writable, over a page
 * memd holds while the books say REMOTE.
 */
static int missing_but_resident(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i,
				uint8_t b)
{
	uint8_t held = pg_make(FM_PG_UPDATING, b);
	uint64_t skipped;

	/*
	 * It changed: look again. Returning would do in SIGBUS mode (the access
	 * runs again), but a thread asleep in the kernel waits for a wake that
	 * only an install or an unprotect of its page gives.
	 */
	if (!pg_cas(&r->pg[i], &b, held))
		return 0;
	fm_uffd_install(r->uffd, r->base + (i << PG_SHIFT), p->zero_run, 1, 0, !f->in_thread, &skipped);
	if (skipped) {
		fm_release(p, &r->pg[i], held, b);
	} else {
		fm_release(p, &r->pg[i], held, pg_make(FM_PG_DIRTY, FM_PGF_REF));
		STAT_ADD(p, zero_fills, 1);
	}
	return 1;
}

static void missing(struct fm_pager *p, struct fm_fault *f, struct region *r, int ridx, uint64_t i)
{
	for (;;) {
		uint8_t b = pg_load(&r->pg[i]);
		unsigned s = fm_pg_state(b);

		switch (s) {
		case FM_PG_UNTOUCHED:
		case FM_PG_REMOTE:
			reserve_room(p, f);
			if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_FILLING, b))) {
				fm_resident_add(p, -1);
				continue;
			}
			fill(p, f, r, ridx, i, b);
			return;
		/*
		 * Another thread holds it. Not every FILLING hold ends in an
		 * install that wakes a thread asleep in the kernel: a stale
		 * write-protect fault on a page that left, a compaction's remote
		 * page, a move's source, a kept slot given back go back unfilled.
		 * So wait, and look again (holders owe a handler nothing but
		 * fm_settled): a page filled meanwhile is a stale fault, whose
		 * wake missing_but_resident gives.
		 */
		case FM_PG_FILLING:
		case FM_PG_LEAVING:
		case FM_PG_UPDATING:
			wait_settle(p, f, &r->pg[i]);
			continue;
		case FM_PG_UNMANAGED:
			if (!f->in_thread)
				fm_uffd_wake(r->uffd, r->base + (i << PG_SHIFT), PG_SIZE);
			return;
		default:
			if (!missing_but_resident(p, f, r, i, b))
				continue;
			return;
		}
	}
}

/*
 * A write to a clean page. A garbage page (discarded, write-protected since)
 * opens the rest of its run with it: the program is allocating there, and
 * every page it opens is live from now on (dirty).
 */
static int open_clean(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i, uint8_t b)
{
	uintptr_t addr = r->base + (i << PG_SHIFT);
	uint8_t fl = (uint8_t)((b | FM_PGF_REF) & ~(FM_PGF_PREFETCH | FM_PGF_GARBAGE));
	uint8_t held = pg_make(FM_PG_UPDATING, b);
	uint8_t ahead[OPEN_AHEAD_PAGES];
	uint64_t n = 1, na = 0;
	int gc = is_gc(p, f->fc.tid);

	if (!gc)
		fl &= (uint8_t)~FM_PGF_GC;
	if (!pg_cas(&r->pg[i], &b, held))
		return 0;
	if (b & FM_PGF_PREFETCH)
		STAT_ADD(p, prefetch_used, 1);
	if (b & FM_PGF_GARBAGE) {
		/* Claim the garbage run after it, stopping at the first page that is not. */
		while (n < GARBAGE_RUN_PAGES && i + n < r->npages) {
			uint8_t c = pg_load(&r->pg[i + n]);
			if (fm_pg_state(c) != FM_PG_CLEAN || !(c & FM_PGF_GARBAGE) ||
			    !pg_cas(&r->pg[i + n], &c, pg_make(FM_PG_UPDATING, c)))
				break;
			n++;
		}
		STAT_ADD(p, garbage_reused, n);
	} else if (gc == FM_GC_PAUSE && fm_xport_kind(p->x) == FM_XPORT_SHM) {
		/*
		 * A pause worker writing an old page goes on to the pages after
		 * it: a full GC forwards, adjusts and compacts region by region
		 * in address order. The clean ones after it open with it, one
		 * unprotect (one TLB shootdown) for the run, where each was a
		 * fault and a shootdown, a fifth of a full GC's time. A guess
		 * (FM_PGF_REWRITE), taken only where one left unwritten leaves
		 * clean (shm: eviction compares it with memd's copy, evict.c);
		 * elsewhere each is a write-back (GcChurn over TCP: half again
		 * the remote writes, 7% slower).
		 */
		while (na < OPEN_AHEAD_PAGES && i + n < r->npages) {
			uint8_t c = pg_load(&r->pg[i + n]);
			if (fm_pg_state(c) != FM_PG_CLEAN || (c & FM_PGF_GARBAGE) ||
			    !pg_cas(&r->pg[i + n], &c, pg_make(FM_PG_UPDATING, c)))
				break;
			ahead[na++] = c;
			n++;
		}
		STAT_ADD(p, wp_opened_ahead, na);
	}
	/* Unprotect before DIRTY is visible: the evictor must not protect a page we then open. */
	fm_uffd_wp(r->uffd, addr, (size_t)n << PG_SHIFT, 0);
	for (uint64_t k = 1; k < n; k++)
		pg_release_from(&r->pg[i + k], FM_PG_UPDATING,
				na ? pg_make(FM_PG_DIRTY, (uint8_t)((ahead[k - 1] & ~FM_PGF_PREFETCH) | FM_PGF_REWRITE))
				   : pg_make(FM_PG_DIRTY, FM_PGF_REF));
	fm_release(p, &r->pg[i], held, pg_make(FM_PG_DIRTY, fl));
	STAT_ADD(p, wp_faults, 1);
	return 1;
}

static void write_protected(struct fm_pager *p, struct fm_fault *f, struct region *r, uint64_t i)
{
	uintptr_t addr = r->base + (i << PG_SHIFT);

	for (;;) {
		uint8_t b = pg_load(&r->pg[i]), held;
		unsigned s = fm_pg_state(b);

		/*
		 * Lost a race for it (the evictor took it, say): look again. A
		 * thread asleep in the kernel on a page that then leaves is woken
		 * by nothing but us.
		 */
		if (s == FM_PG_CLEAN) {
			if (open_clean(p, f, r, i, b))
				return;
			continue;
		}
		if (pg_is_hold(s)) {
			/* The evictor has it (the write waits until memd holds it, then faults it back), or a handler. */
			wait_settle(p, f, &r->pg[i]);
			continue;
		}
		if (s == FM_PG_REMOTE) {
			/* It left meanwhile: the retried write faults as missing. */
			if (!f->in_thread)
				fm_uffd_wake(r->uffd, addr, PG_SIZE);
			return;
		}
		if (s == FM_PG_UNMANAGED) {
			fm_uffd_wp(r->uffd, addr, PG_SIZE, 0);
			return;
		}
		/*
		 * DIRTY: another thread opened it already. UNTOUCHED: the program
		 * is freeing it. Either way the message is stale, so the page is
		 * held while it is opened: unheld, the evictor could protect a
		 * DIRTY page and copy it out between our look and the unprotect
		 * (the write then lands after the copy and is dropped with the
		 * page), or an UNTOUCHED page could be filled write-protected and
		 * CLEAN meanwhile (opened, it takes writes a clean eviction throws
		 * away). Unprotecting wakes the writer.
		 */
		held = pg_make(s == FM_PG_DIRTY ? FM_PG_UPDATING : FM_PG_FILLING, b);
		if (!pg_cas(&r->pg[i], &b, held))
			continue;
		fm_uffd_wp(r->uffd, addr, PG_SIZE, 0);
		fm_release(p, &r->pg[i], held, b);
		return;
	}
}

/*
 * A shmem page that is not mapped: in the file (a minor fault: map the
 * file's page again, UFFDIO_CONTINUE) or not (missing). By our books it is
 * resident (the usual case), or was never ours (it came back from swap or
 * another mapping: adopt it), or remote (then the file's copy is stale:
 * punch it, and fetch). In SIGBUS mode the kernel does not say which kind
 * of fault it was; a continue that finds nothing in the file tells.
 */
static void shmem_not_present(struct fm_pager *p, struct fm_fault *f, struct region *r, int ridx, uint64_t i)
{
	uintptr_t addr = r->base + (i << PG_SHIFT);
	int gc = is_gc(p, f->fc.tid);

	for (;;) {
		uint8_t b = pg_load(&r->pg[i]), fl, held;
		unsigned s = fm_pg_state(b), to;
		int rc;

		if (s == FM_PG_CLEAN || s == FM_PG_DIRTY || s == FM_PG_UNTOUCHED) {
			fl = (uint8_t)((b | FM_PGF_REF) & ~(FM_PGF_PREFETCH | FM_PGF_GC | FM_PGF_GARBAGE));
			to = s == FM_PG_CLEAN && !f->write ? FM_PG_CLEAN : FM_PG_DIRTY;
			/* UPDATING keeps the evictor off while the page is mapped writable. */
			held = pg_make(FM_PG_UPDATING, b);
			if (!pg_cas(&r->pg[i], &b, held))
				continue;
			rc = fm_uffd_continue(r->uffd, addr, to == FM_PG_CLEAN, !f->in_thread);
			if (rc == -EFAULT && s == FM_PG_UNTOUCHED && f->in_thread) {
				/* Not in the file: a missing fault after all. */
				fm_release(p, &r->pg[i], held, b);
				missing(p, f, r, ridx, i);
				return;
			}
			if (rc) {
				/* Its missing fault sorts it out (a resident page gone from the file reads as zeros). */
				fm_release(p, &r->pg[i], held, b);
				if (f->in_thread && rc == -EFAULT)
					missing_but_resident(p, f, r, i, pg_load(&r->pg[i]));
				return;
			}
			fm_release(p, &r->pg[i], held, pg_make(to, fl));
			if (s == FM_PG_UNTOUCHED)
				fm_resident_add(p, 1);
			STAT_ADD(p, minor_faults, 1);
			count_fault(p, gc);
			return;
		}
		if (s == FM_PG_REMOTE) {
			/*
			 * Held across the punch: unheld, another thread or a prefetch
			 * could fill the page from memd between our look and the punch,
			 * the program write it, and the punch then throw that write
			 * away under books that say resident.
			 */
			held = pg_make(FM_PG_FILLING, b);
			if (!pg_cas(&r->pg[i], &b, held))
				continue;
			fm_shmem_drop(r, addr, PG_SIZE);
			fm_release(p, &r->pg[i], held, b);
			if (f->in_thread)
				missing(p, f, r, ridx, i);
			else
				fm_uffd_wake(r->uffd, addr, PG_SIZE);
			return;
		}
		if (pg_is_hold(s)) {
			/* Every hold, FILLING too: as in missing(), not every one ends in a wake. */
			wait_settle(p, f, &r->pg[i]);
			continue;
		}
		/* UNMANAGED: not ours. */
		if (!f->in_thread)
			fm_uffd_wake(r->uffd, addr, PG_SIZE);
		return;
	}
}

int fm_fault(struct fm_pager *p, struct fm_fault *f)
{
	struct region *r;
	int ridx;
	uint64_t i;

	rlock_rd(p);
	r = fm_region_find(p, f->addr, &ridx);
	if (!r) {
		rlock_un(p);
		/* Unregistered while the fault waited: the thread retries on plain memory. */
		if (!f->in_thread) {
			uintptr_t a = f->addr & ~(uintptr_t)(PG_SIZE - 1);
			fm_uffd_wake(p->uffd, a, PG_SIZE);
			if (p->uffd_waits >= 0)
				fm_uffd_wake(p->uffd_waits, a, PG_SIZE);
		}
		return -ENOENT;
	}
	if (f->in_thread && r->kernel_waits) {
		/* Its uffd raises no SIGBUS: this one is the program's own, or the kernel's. */
		rlock_un(p);
		return -ENOENT;
	}
	i = (f->addr - r->base) >> PG_SHIFT;
	if (f->kind == FM_FAULT_GUESS) {
		/* A clean page is mapped, so the access was a write to it; anything else faults as missing. */
		f->write = fm_pg_state(pg_load(&r->pg[i])) == FM_PG_CLEAN;
		f->kind = f->write ? FM_FAULT_WP : FM_FAULT_MISSING;
	}
	/* A handler thread is told which kind a shmem fault is; the SIGBUS handler is not. */
	if (f->kind == FM_FAULT_WP)
		write_protected(p, f, r, i);
	else if (f->kind == FM_FAULT_MINOR || (r->alias && f->in_thread))
		shmem_not_present(p, f, r, ridx, i);
	else
		missing(p, f, r, ridx, i);
	rlock_un(p);
	fm_give_back(p, &f->fc);
	__atomic_fetch_add(&p->st->lat_hist[fm_lat_bucket(fm_now_ns() - f->t0)], 1, __ATOMIC_RELAXED);
	return 0;
}

void fm_fault_unmap(struct fm_pager *p, uintptr_t start, uintptr_t end)
{
	struct fm_overlap o = { 0 };

	rlock_rd(p);
	while (fm_overlap_next(p, start, end, &o))
		fm_region_forget(p, o.r, o.first, o.n, FM_PG_UNMANAGED);
	fm_region_gone(p, start, end);
	rlock_un(p);
}

/* --- system calls on paged memory (the shim) ------------------------------------ */

int fm_pager_kernel_waits(const struct fm_pager *p)
{
	return !p->in_thread;
}

int fm_pager_io_needed(struct fm_pager *p, const void *addr, size_t len)
{
	return p->in_thread && fm_region_signals(p, (uintptr_t)addr, (uintptr_t)addr + len);
}

/*
 * An O_DIRECT read's buffer where the kernel waits (glibc's heaps) in
 * fault=signal mode. Nothing to fetch first, but the device writes the pages
 * the read pinned by DMA at its end, past the page table: one evicted (its
 * bytes captured) meanwhile would lose the read. With handler threads such a
 * page is kept by the move's refusal (evict_move). O_DIRECT wants the
 * buffer's address and length aligned to the device's logical block, 512
 * bytes at least: other reads cost this test only, and an aligned one the
 * fd's flags (a socket's recv into a page-aligned buffer may block for
 * hours, and would hold a pin slot for nothing).
 */
static int dma_target(struct fm_pager *p, const void *addr, size_t len, int fd)
{
	int fl;

	if ((((uintptr_t)addr | len) & 511) || !p->in_thread || !fm_pager_owns_nolock(p, addr, len))
		return 0;
	fl = fcntl(fd, F_GETFL);
	return fl >= 0 && (fl & O_DIRECT);
}

int fm_pager_pin_in_place(struct fm_pager *p, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1), e = (uintptr_t)addr + len;
	struct fm_fault f = { .in_thread = 1, .kind = FM_FAULT_MISSING };
	struct fm_overlap o = { 0 };
	int slot;

	if (!len || !fm_pager_owns(p, addr, len))
		return -1;
	slot = fm_pin(p, a, e);
	/*
	 * A batch that chose its victims before the pin still drops them: until
	 * it has, the kernel could pin one of those pages and write it after
	 * the drop, where nobody reads it again.
	 */
	rlock_rd(p);
	while (fm_overlap_next(p, a, (e + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1), &o))
		for (uint64_t i = o.first; i < o.first + o.n; i++)
			wait_settle(p, &f, &o.r->pg[i]);
	rlock_un(p);
	fm_give_back(p, &f.fc);
	return slot >= 0 ? slot : FM_IO_UNPINNED;
}

int fm_pager_read_begin(struct fm_pager *p, void *addr, size_t len, int fd)
{
	if (!len)
		return -1;
	if (fm_pager_io_needed(p, addr, len))
		return fm_pager_io_begin(p, addr, len, 1);
	return dma_target(p, addr, len, fd) ? fm_pager_pin_in_place(p, addr, len) : -1;
}

struct io_begin_call {
	struct fm_pager *p;
	const void *addr;
	size_t len;
	int write, slot;
};

static void io_begin_run(void *v)
{
	struct io_begin_call *c = v;

	c->slot = fm_pager_io_begin(c->p, c->addr, c->len, c->write);
}

int fm_pager_io_begin(struct fm_pager *p, const void *addr, size_t len, int write)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1), e = (uintptr_t)addr + len;
	struct fm_fault f = { .in_thread = 1, .write = write, .kind = FM_FAULT_MISSING };
	struct fm_overlap o = { 0 };
	struct io_begin_call c = { p, addr, len, write, -1 };
	int slot;

	/*
	 * With handler threads, and in a heap's region, the kernel waits for a
	 * page a system call touches. Nothing pinned for a range with no paged
	 * page (a poll's array on the stack, slept on for hours, would hold a
	 * pin slot for nothing).
	 */
	if (!len)
		return -1;
	if (!fm_pager_io_needed(p, addr, len))
		return -1;
	/*
	 * The pages are made resident here, in this thread, evicting as they
	 * come: on farmem's stack when this one is paged (region.c), or a batch
	 * could drop the stack's own pages under the frames that write it back.
	 */
	if (fm_region_off_paged_stack(p, io_begin_run, &c))
		return c.slot;
	slot = fm_pin(p, a, e);
	f.fc.tid = fm_thread_id();
	rlock_rd(p);
	while (fm_overlap_next(p, a, (e + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1), &o)) {
		int ridx = (int)(o.r - p->regions);
		/* The kernel waits there, and an install must wake whoever sleeps on it. */
		if (o.r->kernel_waits)
			continue;
		for (uint64_t i = o.first; i < o.first + o.n; i++) {
			/* Bounded: a page the kernel keeps skipping (an unmap under way) is left to EFAULT. */
			for (int tries = 0; tries < 64; tries++) {
				uint8_t b = wait_settle(p, &f, &o.r->pg[i]);
				unsigned s = fm_pg_state(b);
				f.addr = o.r->base + (i << PG_SHIFT);
				f.t0 = fm_now_ns();
				if (s == FM_PG_UNTOUCHED || s == FM_PG_REMOTE) {
					if (o.r->alias)
						shmem_not_present(p, &f, o.r, ridx, i);
					else
						missing(p, &f, o.r, ridx, i);
				} else if (s == FM_PG_CLEAN && write) {
					write_protected(p, &f, o.r, i);
				} else {
					break;
				}
				STAT_ADD(p, io_prefaults, 1);
			}
		}
	}
	rlock_un(p);
	fm_give_back(p, &f.fc);
	return slot >= 0 ? slot : FM_IO_UNPINNED;
}

int fm_pager_pins_scarce(struct fm_pager *p)
{
	/* Room for two calls' worth of pins (the shim's FM_IO_PINS is 16) is scarce. */
	return atomic_load(&p->npins) > MAX_PINS - 32;
}

void fm_pager_io_end(struct fm_pager *p, int slot)
{
	if (slot >= 0)
		fm_unpin(p, slot);
}

void fm_pager_io_retried(struct fm_pager *p)
{
	STAT_ADD(p, io_retries, 1);
}
