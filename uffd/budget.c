// SPDX-License-Identifier: Apache-2.0
#include "budget.h"

#include "pager_internal.h"
#include "wait.h"

#define MIN_LIMIT_PAGES 256

void fm_budget_set(struct fm_pager *p)
{
	uint64_t reg = atomic_load(&p->registered);
	uint64_t lim = p->cfg.local_bytes ? p->cfg.local_bytes / PG_SIZE
					  : reg * p->cfg.local_pct / 100;
	if (lim < MIN_LIMIT_PAGES)
		lim = MIN_LIMIT_PAGES;
	atomic_store(&p->limit, lim);
	atomic_store(&p->high, lim * p->cfg.evict_high / 100);
	atomic_store(&p->low, lim * p->cfg.evict_low / 100);
	/*
	 * With nothing registered (before the first mapping, after the last
	 * munmap) the gauges keep the budget that was in force: the summary is
	 * read after the program has exited and unmapped everything.
	 */
	if (reg) {
		__atomic_store_n(&p->st->local_limit_pages, lim, __ATOMIC_RELAXED);
		fm_raise_peak(&p->st->peak_limit_pages, lim);
		__atomic_store_n(&p->st->registered_pages, reg, __ATOMIC_RELAXED);
		fm_raise_peak(&p->st->peak_registered_pages, reg);
	}
}

static void changed(struct fm_pager *p, uint64_t now, int grew)
{
	__atomic_store_n(&p->st->resident_pages, now, __ATOMIC_RELAXED);
	if (!grew)
		return;
	fm_raise_peak(&p->st->peak_resident_pages, now);
	/* The evictor thread keeps ahead of faults when there is one; else faults evict themselves. */
	if (p->evictor_started && now > atomic_load(&p->high) && !fm_budget_all_fits(p) && !fm_in_gc_pause(p))
		fm_evictor_kick(p);
}

void fm_resident_adopt(struct fm_pager *p, uint64_t n)
{
	uint64_t now = atomic_fetch_add(&p->resident, n) + n;

	__atomic_store_n(&p->st->resident_pages, now, __ATOMIC_RELAXED);
	fm_raise_peak(&p->st->adopt_peak_pages, now);
}

void fm_resident_settled(struct fm_pager *p)
{
	changed(p, atomic_load(&p->resident), 1);
}

void fm_resident_add(struct fm_pager *p, int64_t delta)
{
	uint64_t now = atomic_fetch_add(&p->resident, (uint64_t)delta) + (uint64_t)delta;
	changed(p, now, delta > 0);
}

int fm_budget_reserve(struct fm_pager *p, uint64_t cap)
{
	uint_fast64_t cur = atomic_load(&p->resident);

	do {
		if (cur + 1 > cap)
			return 0;
	} while (!atomic_compare_exchange_weak(&p->resident, &cur, cur + 1));
	changed(p, cur + 1, 1);
	return 1;
}

int fm_budget_all_fits(struct fm_pager *p)
{
	return atomic_load(&p->registered) <= atomic_load(&p->limit);
}

int fm_budget_pressed(struct fm_pager *p)
{
	return atomic_load(&p->resident) >= atomic_load(&p->low) && !fm_budget_all_fits(p);
}

void fm_churn(struct fm_pager *p, uint64_t pages)
{
	uint64_t c = __atomic_add_fetch(&p->hdr->churn_pages, pages, __ATOMIC_RELAXED);
	uint64_t reg = atomic_load(&p->registered);

	if (reg && c * 100 >= reg * p->cfg.epoch_pct &&
	    __atomic_compare_exchange_n(&p->hdr->churn_pages, &c, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		__atomic_add_fetch(&p->hdr->swap_epoch, 1, __ATOMIC_RELEASE);
}

void fm_evictor_kick(struct fm_pager *p)
{
	if (!atomic_exchange(&p->ev_kick, 1))
		fm_futex_wake(&p->ev_kick);
}

void fm_evictor_sleep(struct fm_pager *p, int timeout_ms)
{
	if (!atomic_load(&p->ev_kick))
		fm_futex_wait(&p->ev_kick, 0, timeout_ms);
	atomic_store(&p->ev_kick, 0);
}
