/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The local budget: how many pages may be resident, and the watermarks that
 * wake the evictor. The check and the count of a new resident page are one
 * compare-and-swap, so faulting threads together never pass the budget.
 */
#ifndef FARMEM_BUDGET_H
#define FARMEM_BUDGET_H

#include <stdint.h>

struct fm_pager;

/* Recompute limit and watermarks from the knobs and what is registered. */
void fm_budget_set(struct fm_pager *p);
/* Count one more resident page if that keeps resident <= cap; 1 if it did. */
int fm_budget_reserve(struct fm_pager *p, uint64_t cap);
/* Resident pages came (delta > 0) or went. */
void fm_resident_add(struct fm_pager *p, int64_t delta);
/*
 * n pages a registration found present join the resident count, which may
 * pass the budget: the peak leaves them out (adopt_peak_pages records them)
 * until fm_resident_settled, once the registering thread has evicted what
 * did not fit.
 */
void fm_resident_adopt(struct fm_pager *p, uint64_t n);
void fm_resident_settled(struct fm_pager *p);
/* MemLiner's swap epoch: pages in plus out since the last one. */
void fm_churn(struct fm_pager *p, uint64_t pages);
/*
 * Every registered page fits the budget (`--local 100%`): nothing can ever
 * have to leave, though resident pages reach the watermarks (a heap as large
 * as its budget sits at them). The evictor thread then evicts nothing, and a
 * discard makes no garbage: until session 66 both did, for nothing (GcChurn
 * wholly local under farmem: 795k pages made garbage, each a write-protect
 * fault when reused, 1.06-1.17x its time without farmem; bench/RESULTS.md).
 * A registration that outgrows the budget later finds that free space dirty:
 * evicted with a write-back until the next cycle's discard marks it garbage.
 */
int fm_budget_all_fits(struct fm_pager *p);
/* Resident at or over the low watermark, and not all fits: eviction is near, and garbage worth marking. */
int fm_budget_pressed(struct fm_pager *p);

/* The evictor's side: sleep until kicked (or timeout_ms), and kick it. */
void fm_evictor_sleep(struct fm_pager *p, int timeout_ms);
void fm_evictor_kick(struct fm_pager *p);

#endif
