// SPDX-License-Identifier: Apache-2.0
/*
 * What the program says of its memory: a range it dropped (forget), a range
 * it freed but keeps mapped (discard), a range it is about to move (fetch
 * everything home).
 */

#include <errno.h>
#include <string.h>

#include "budget.h"
#include "evict.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "uffd_ops.h"
#include "wait.h"

/*
 * Taken apart, a forget and then the program's madvise left a window in
 * which a fault's run of zero fills ahead took a page of the range again,
 * an eviction chose it, and the madvise dropped it under the eviction: its
 * capture (vmsplice) then faulted on the missing page and, where the kernel
 * waits for faults, waited for a handler that waited on the eviction's
 * hold. jemalloc_prog hung so in one clean-clone CI run of session 83 and
 * once in 92 runs beside two busy loops in session 84.
 */
int fm_pager_forget(struct fm_pager *p, void *addr, size_t len, int advice)
{
	struct fm_overlap o = { 0 };
	struct fm_dead dead = { .n = 0 };
	/* The kernel's madvise drops the page its length ends in too (it rounds the length up). */
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);
	int rc;

	rlock_rd(p);
	while (fm_overlap_next(p, a, e, &o))
		fm_region_hold_dropped(p, o.r, o.first, o.n, &dead);
	/* Each copy is forgotten before its page is ours again: a write and an eviction would put a new one there. */
	fm_dead_flush(p, &dead);
	rc = fm_sys_madvise(addr, len, advice) ? -errno : 0;
	o = (struct fm_overlap){ 0 };
	while (fm_overlap_next(p, a, e, &o))
		fm_region_release_dropped(p, o.r, o.first, o.n);
	rlock_un(p);
	return rc;
}

/*
 * A discard's dirty pages to write-protect, as runs of them held UPDATING,
 * protected in one call across the gaps between them (protect_batch).
 */
#define PROTECT_RUNS 64
struct protect_batch {
	uint64_t lo[PROTECT_RUNS], hi[PROTECT_RUNS]; /* the held runs, in order */
	unsigned n;
	unsigned gap_present; /* resident pages in the gap after the last run */
	struct fm_dead *dead; /* remote copies of pages in it (kills): forgotten before the pages go */
	int kills;
};

/*
 * A gap between two runs goes into one call with them when protecting it
 * does nothing (an anonymous page that is not mapped, for a private mapping
 * without UFFD_FEATURE_WP_UNPOPULATED) or does again what was done (a CLEAN
 * page is write-protected already), and is short. A page that changed
 * between our look and the call, filled or opened by another thread, is at
 * worst DIRTY and protected: its next write is a stale write-protect fault,
 * which opens it (fault.c, write_protected); a CLEAN page is never left
 * writable. A call costs its system call and a TLB flush, a resident page
 * in it a page-table entry rewritten: one call per run took 107k calls a
 * run of GcChurn at 50% local (7.7 pages each, the VM thread's, at the end
 * of every pause), 2k since.
 */
#define BRIDGE_PAGES 512u
#define BRIDGE_PRESENT 16u

/* Write-protect the batch's runs in one call and let their pages go as garbage. */
static void protect_flush(struct fm_pager *p, struct region *r, struct protect_batch *pb)
{
	uint64_t pages = 0;

	if (!pb->n)
		return;
	if (pb->kills)
		fm_dead_flush(p, pb->dead);
	pb->kills = 0;
	fm_uffd_wp(r->uffd, r->base + (pb->lo[0] << PG_SHIFT), (size_t)(pb->hi[pb->n - 1] - pb->lo[0]) << PG_SHIFT,
		   1);
	for (unsigned k = 0; k < pb->n; k++) {
		for (uint64_t j = pb->lo[k]; j < pb->hi[k]; j++)
			pg_release_from(&r->pg[j], FM_PG_UPDATING, pg_make(FM_PG_CLEAN, FM_PGF_GARBAGE));
		pages += pb->hi[k] - pb->lo[k];
	}
	atomic_fetch_sub(&p->garbage_quota, (int_fast64_t)pages);
	STAT_ADD(p, garbage_marked, pages);
	pb->n = 0;
}

/* Page i, which we hold UPDATING, joins the batch. */
static void protect_add(struct fm_pager *p, struct region *r, struct protect_batch *pb, uint64_t i)
{
	if (pb->n && pb->hi[pb->n - 1] == i) {
		pb->hi[pb->n - 1]++;
		return;
	}
	if (pb->n == PROTECT_RUNS)
		protect_flush(p, r, pb);
	pb->lo[pb->n] = i;
	pb->hi[pb->n] = i + 1;
	pb->n++;
	pb->gap_present = 0;
}

/*
 * Page i, not in the batch, follows its last run: bridged over, or the batch
 * is protected now. s: the state the page is in, or goes to once the hold
 * on it while its remote copy dies ends (forget_batch).
 */
static void protect_gap(struct fm_pager *p, struct region *r, struct protect_batch *pb, uint64_t i, unsigned s)
{
	if (!pb->n)
		return;
	if (s == FM_PG_CLEAN)
		pb->gap_present++;
	if (r->alias || (s != FM_PG_UNTOUCHED && s != FM_PG_CLEAN) || i + 1 - pb->hi[pb->n - 1] > BRIDGE_PAGES ||
	    pb->gap_present > BRIDGE_PRESENT)
		protect_flush(p, r, pb);
}

/*
 * Pages a discard holds while memd forgets their remote copies: let go
 * earlier, one the evictor wrote to memd again before the forget arrived
 * lost that new copy to it (REMOTE in the books, nothing in memd;
 * tests/unit/test_pager_discard_forget.c).
 */
#define FORGET_HOLDS 256
struct forget_batch {
	uint64_t i[FORGET_HOLDS];
	uint8_t held_in[FORGET_HOLDS], then[FORGET_HOLDS];
	unsigned n;
};

static void forget_flush(struct fm_pager *p, struct region *r, struct forget_batch *fb, struct fm_dead *dead)
{
	if (!fb->n)
		return;
	fm_dead_flush(p, dead);
	for (unsigned k = 0; k < fb->n; k++)
		pg_release_from(&r->pg[fb->i[k]], fb->held_in[k], fb->then[k]);
	fm_settled(p);
	fb->n = 0;
}

/* Page i, held in state held_in, goes to `then` once its remote copy is forgotten. */
static void forget_hold(struct fm_pager *p, struct region *r, struct forget_batch *fb, struct fm_dead *dead,
			uint64_t i, unsigned held_in, uint8_t then)
{
	if (fb->n == FORGET_HOLDS)
		forget_flush(p, r, fb, dead);
	fb->i[fb->n] = i;
	fb->held_in[fb->n] = (uint8_t)held_in;
	fb->then[fb->n++] = then;
}

/*
 * What becomes of a discarded page:
 *
 *   page      under pressure               no pressure
 *   remote    untouched                    untouched
 *   clean     garbage                      garbage
 *   dirty     write-protected: garbage     dirty (stays as it is)
 *
 * Garbage is CLEAN | FM_PGF_GARBAGE, write-protected: the evictor takes it
 * first, with no write-back; a write opens it and its run again (fault.c).
 * Pressure means resident pages at the low watermark, more registered than
 * the budget holds (budget.h), and a cycle's quota of garbage not used up
 * (pager.c: about what the evictor took last cycle).
 * Without pressure a heap that fits its budget pays nothing: no protection,
 * no fault on reuse. Nor does space that is reused soon (fm_pager_discard_reused),
 * whose dirty pages the clock passes once more besides: taken before the
 * program writes them again, their dead bytes went to memd and came back
 * (without that pass GcChurn at 25% wrote a tenth more pages to memd, and
 * took 10.97 s against 10.63).
 * Every remote copy dies, once its page is ours, and the page stays held
 * until memd has forgotten that copy (forget_batch). A run of pages to
 * protect costs one call.
 */
static long discard_region(struct fm_pager *p, struct region *r, int ridx, uint64_t first, uint64_t end,
			   struct fm_dead *dead, int reused)
{
	int_fast64_t allow = !reused && fm_budget_pressed(p) ? atomic_load(&p->garbage_quota) : 0;
	struct protect_batch pb = { .n = 0, .dead = dead };
	struct forget_batch fb = { .n = 0 };
	long affected = 0;

	for (uint64_t i = first; i < end; i++) {
		int held = 0;
		unsigned now = FM_PG_UNTOUCHED;
		for (;;) {
			uint8_t b = fm_settle(p, &r->pg[i]), nb, hold;
			unsigned st = fm_pg_state(b);
			now = st;
			if (st == FM_PG_REMOTE)
				nb = pg_make(FM_PG_UNTOUCHED, 0); /* the next touch is a zero-fill */
			else if (st == FM_PG_CLEAN)
				nb = pg_make(FM_PG_CLEAN, FM_PGF_GARBAGE);
			else if (st == FM_PG_DIRTY)
				nb = allow > 0 ? pg_make(FM_PG_UPDATING, b)
					       : pg_make(FM_PG_DIRTY, (uint8_t)((b & ~FM_PGF_HAS_REMOTE) |
										(reused ? FM_PGF_REF : 0)));
			else
				break;
			if (nb == b)
				break; /* garbage already, or dirty with nothing remote */
			/* A page whose copy dies is held till memd forgot it (or the protect batch is). */
			hold = (b & FM_PGF_HAS_REMOTE) && fm_pg_state(nb) != FM_PG_UPDATING
				       ? pg_make(st == FM_PG_REMOTE ? FM_PG_FILLING : FM_PG_UPDATING, b)
				       : nb;
			if (!pg_cas(&r->pg[i], &b, hold))
				continue;
			now = fm_pg_state(nb);
			if (b & FM_PGF_HAS_REMOTE)
				fm_dead_add(p, dead, r->space, i);
			if (hold != nb)
				forget_hold(p, r, &fb, dead, i, fm_pg_state(hold), nb);
			if (fm_pg_state(nb) == FM_PG_UPDATING) {
				held = 1;
				allow--;
				pb.kills |= !!(b & FM_PGF_HAS_REMOTE);
			}
			else if (nb & FM_PGF_GARBAGE)
				STAT_ADD(p, garbage_marked, 1);
			affected++;
			break;
		}
		if (held)
			protect_add(p, r, &pb, i);
		else
			protect_gap(p, r, &pb, i, now);
	}
	protect_flush(p, r, &pb);
	forget_flush(p, r, &fb, dead);
	if (!reused)
		fm_evict_hint(p, ridx, first, end - first);
	return affected;
}

void fm_pager_passed(struct fm_pager *p, const void *addr, size_t len)
{
	struct fm_overlap o = { 0 };
	uintptr_t first = ((uintptr_t)addr + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t end = ((uintptr_t)addr + len) & ~(uintptr_t)(PG_SIZE - 1);

	if (end <= first)
		return;
	rlock_rd(p);
	while (fm_overlap_next(p, first, end, &o))
		fm_evict_done(p, (int)(o.r - p->regions), o.first, o.n);
	rlock_un(p);
}

static long discard(struct fm_pager *p, void *addr, size_t len, int reused)
{
	struct fm_overlap o = { 0 };
	struct fm_dead dead = { .n = 0, .keep = 1 }; /* free space: written again soon */
	long affected = 0;

	/*
	 * Nothing in memd to kill and nothing that could ever have to leave
	 * (every registered page fits the budget): the pages stay as they are,
	 * and the walk over every free page's state, in the VM thread that
	 * ends the pause, would change nothing (its cost was not seen in
	 * GcChurn's pause totals; bench/RESULTS.md, session 87).
	 */
	if (!atomic_load_explicit(&p->memd_holds, memory_order_relaxed) && fm_budget_all_fits(p))
		return 0;
	rlock_rd(p);
	while (fm_overlap_next(p, (uintptr_t)addr, (uintptr_t)addr + len, &o))
		affected += discard_region(p, o.r, (int)(o.r - p->regions), o.first, o.first + o.n, &dead, reused);
	fm_dead_flush(p, &dead);
	rlock_un(p);
	fm_settled(p);
	STAT_ADD(p, discards, (uint64_t)affected);
	return affected;
}

long fm_pager_discard(struct fm_pager *p, void *addr, size_t len)
{
	return discard(p, addr, len, 0);
}

long fm_pager_discard_reused(struct fm_pager *p, void *addr, size_t len)
{
	return discard(p, addr, len, 1);
}

#define HOME_BATCH 64

/* Pages idx[0..n) of r, held FILLING (were was[]), come home from memd, clean and write-protected. */
static void home_batch(struct fm_pager *p, struct region *r, const uint64_t *idx, const uint8_t *was, unsigned n)
{
	const void *src[HOME_BATCH];
	int rc;

	pthread_mutex_lock(&p->misc_lock);
	rc = fm_chan_read(p->misc_chan, r->space, idx, n, src);
	if (rc) {
		STAT_ADD(p, transport_errors, 1);
		if (rc == -EIO)
			STAT_ADD(p, crc_errors, 1);
		fm_fatal("%u pages from %#lx on are in memd but cannot be read back (%s%s)", n,
			 (unsigned long)(r->base + (idx[0] << PG_SHIFT)), strerror(-rc),
			 rc == -EIO ? ": checksum mismatch" : "");
	}
	STAT_ADD(p, remote_reads, n);
	STAT_ADD(p, remote_read_bytes, (uint64_t)n * PG_SIZE);
	for (unsigned k = 0; k < n; k++) {
		uint8_t held = pg_make(FM_PG_FILLING, was[k]);
		uint64_t skipped;
		/* Clean: memd keeps its copy, so a later eviction writes nothing. */
		fm_uffd_install(r->uffd, r->base + (idx[k] << PG_SHIFT), src[k], 1, 1, r->kernel_waits, &skipped);
		if (skipped) {
			/* Mapped meanwhile, not by us: not booked as ours; its own fault sorts it out. */
			fm_release(p, &r->pg[idx[k]], held, was[k]);
			continue;
		}
		fm_release(p, &r->pg[idx[k]], held, pg_make(FM_PG_CLEAN, FM_PGF_HAS_REMOTE));
		fm_resident_add(p, 1);
	}
	pthread_mutex_unlock(&p->misc_lock);
}

uint64_t fm_region_home(struct fm_pager *p, struct region *r, uint64_t first, uint64_t end)
{
	uint64_t idx[HOME_BATCH], total = 0;
	uint8_t was[HOME_BATCH];
	unsigned n = 0;

	for (uint64_t i = first; i < end;) {
		uint8_t b = pg_load(&r->pg[i]);
		if (pg_is_hold(fm_pg_state(b))) {
			/* Its owner may be waiting for a page we hold: ours go first. */
			if (n)
				home_batch(p, r, idx, was, n);
			total += n;
			n = 0;
			fm_settle(p, &r->pg[i]);
			continue;
		}
		if (fm_pg_state(b) != FM_PG_REMOTE) {
			i++;
			continue;
		}
		if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_FILLING, b)))
			continue; /* a fault took it: look again */
		idx[n] = i++;
		was[n++] = b;
		if (n == HOME_BATCH) {
			home_batch(p, r, idx, was, n);
			total += n;
			n = 0;
		}
	}
	if (n)
		home_batch(p, r, idx, was, n);
	return total + n;
}

int fm_pager_fetch_all(struct fm_pager *p, void *addr, size_t len)
{
	struct fm_overlap o = { 0 };
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);

	rlock_rd(p);
	while (fm_overlap_next(p, a, e, &o)) {
		/* Until the caller unregisters it, nothing of it may leave again. */
		atomic_store(&o.r->pinned, 1);
		fm_region_home(p, o.r, o.first, o.first + o.n);
	}
	rlock_un(p);
	return 0;
}
