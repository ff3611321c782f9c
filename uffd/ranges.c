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

int fm_pager_forget(struct fm_pager *p, void *addr, size_t len)
{
	struct fm_overlap o = { 0 };

	/* Only whole pages are dropped by madvise: the iterator keeps whole pages. */
	rlock_rd(p);
	while (fm_overlap_next(p, (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1), (uintptr_t)addr + len, &o))
		fm_region_forget(p, o.r, o.first, o.n, FM_PG_UNTOUCHED);
	rlock_un(p);
	return 0;
}

/* Write-protect pages [run, end) of r, held UPDATING, and let them go as garbage. */
static void protect_run(struct fm_pager *p, struct region *r, uint64_t run, uint64_t end)
{
	atomic_fetch_sub(&p->garbage_quota, (int_fast64_t)(end - run));
	fm_uffd_wp(p->uffd, r->base + (run << PG_SHIFT), (size_t)(end - run) << PG_SHIFT, 1);
	for (uint64_t j = run; j < end; j++)
		pg_release_from(&r->pg[j], FM_PG_UPDATING, pg_make(FM_PG_CLEAN, FM_PGF_GARBAGE));
	STAT_ADD(p, garbage_marked, end - run);
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
 * Pressure means resident pages at the low watermark and a cycle's quota of
 * garbage not used up (pager.c: about what the evictor took last cycle).
 * Without pressure a heap that fits its budget pays nothing: no protection,
 * no fault on reuse. Every remote copy dies, once its page is ours. A run of
 * pages to protect costs one call.
 */
static long discard_region(struct fm_pager *p, struct region *r, int ridx, uint64_t first, uint64_t end,
			   struct fm_dead *dead)
{
	int_fast64_t allow = fm_budget_pressed(p) ? atomic_load(&p->garbage_quota) : 0;
	uint64_t run = UINT64_MAX;
	long affected = 0;

	/* One step past the end flushes the last run. */
	for (uint64_t i = first; i <= end; i++) {
		int held = 0;
		while (i < end) {
			uint8_t b = fm_settle(p, &r->pg[i]), nb;
			unsigned st = fm_pg_state(b);
			if (st == FM_PG_REMOTE)
				nb = pg_make(FM_PG_UNTOUCHED, 0); /* the next touch is a zero-fill */
			else if (st == FM_PG_CLEAN)
				nb = pg_make(FM_PG_CLEAN, FM_PGF_GARBAGE);
			else if (st == FM_PG_DIRTY)
				nb = allow > 0 ? pg_make(FM_PG_UPDATING, b)
					       : pg_make(FM_PG_DIRTY, (uint8_t)(b & ~FM_PGF_HAS_REMOTE));
			else
				break;
			if (nb == b)
				break; /* garbage already, or dirty with nothing remote */
			if (!pg_cas(&r->pg[i], &b, nb))
				continue;
			/* The page is ours now (or its copy dead to us): only now may the remote copy die. */
			if (b & FM_PGF_HAS_REMOTE)
				fm_dead_add(p, dead, r->space, i);
			if (fm_pg_state(nb) == FM_PG_UPDATING) {
				held = 1;
				allow--;
			}
			else if (nb & FM_PGF_GARBAGE)
				STAT_ADD(p, garbage_marked, 1);
			affected++;
			break;
		}
		if (!held && run != UINT64_MAX) {
			protect_run(p, r, run, i);
			run = UINT64_MAX;
		} else if (held && run == UINT64_MAX) {
			run = i;
		}
	}
	fm_evict_hint(p, ridx, first, end - first);
	return affected;
}

long fm_pager_discard(struct fm_pager *p, void *addr, size_t len)
{
	struct fm_overlap o = { 0 };
	struct fm_dead dead = { .n = 0 };
	long affected = 0;

	rlock_rd(p);
	while (fm_overlap_next(p, (uintptr_t)addr, (uintptr_t)addr + len, &o))
		affected += discard_region(p, o.r, (int)(o.r - p->regions), o.first, o.first + o.n, &dead);
	fm_dead_flush(p, &dead);
	rlock_un(p);
	fm_settled(p);
	STAT_ADD(p, discards, (uint64_t)affected);
	return affected;
}

int fm_pager_fetch_all(struct fm_pager *p, void *addr, size_t len)
{
	struct fm_overlap o = { 0 };
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);

	rlock_rd(p);
	while (fm_overlap_next(p, a, e, &o)) {
		struct region *r = o.r;
		/* Until the caller unregisters it, nothing of it may leave again. */
		atomic_store(&r->pinned, 1);
		for (uint64_t i = o.first; i < o.first + o.n;) {
			uint8_t b = fm_settle(p, &r->pg[i]), held = pg_make(FM_PG_FILLING, b);
			const void *src;
			uint64_t skipped;
			int rc;

			if (fm_pg_state(b) != FM_PG_REMOTE) {
				i++;
				continue;
			}
			if (!pg_cas(&r->pg[i], &b, held))
				continue; /* changed under us: look again */
			pthread_mutex_lock(&p->misc_lock);
			rc = fm_chan_read(p->misc_chan, r->space, &i, 1, &src);
			if (rc)
				fm_fatal("page %#lx is in memd but cannot be read back (%s)",
					 (unsigned long)(r->base + (i << PG_SHIFT)), strerror(-rc));
			STAT_ADD(p, remote_reads, 1);
			STAT_ADD(p, remote_read_bytes, PG_SIZE);
			fm_uffd_install(p->uffd, r->base + (i << PG_SHIFT), src, 1, 0, !p->in_thread, &skipped);
			pthread_mutex_unlock(&p->misc_lock);
			fm_release(p, &r->pg[i], held,
				   skipped ? b : pg_make(FM_PG_DIRTY, (uint8_t)(b & FM_PGF_HAS_REMOTE)));
			if (!skipped)
				fm_resident_add(p, 1);
			i++;
		}
	}
	rlock_un(p);
	return 0;
}
