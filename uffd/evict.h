/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Eviction (evict.c says how, and why no write is ever lost). Faulting
 * threads evict a batch themselves when the budget is full; an evictor
 * thread, when there is one, keeps resident pages between the watermarks.
 */
#ifndef FARMEM_EVICT_H
#define FARMEM_EVICT_H

#include <stdint.h>

struct fm_pager;
struct fm_chan;
struct fm_borrowed;
struct region;

/* The most pages one batch takes: its books live on the evicting thread's stack. */
#define FM_EVICT_MAX 64

/*
 * A batch that found nothing is looked at again this many times, with a
 * yield between, before its caller gives up and lets a page come in (or
 * stay) over the budget: the clock may have met only pages in holds of a
 * few microseconds (other threads' batches and moves), or a batch of one
 * its one victim pinned.
 */
#define FM_EVICT_LOOKS 4

/* Evict up to want (<= FM_EVICT_MAX) pages now, over chan; returns pages dropped. */
unsigned fm_evict_batch(struct fm_pager *p, struct fm_chan *chan, unsigned want);
/*
 * Evict in the calling thread until resident pages are within the budget
 * (pages a registration adopted, or a fork brought home, may pass it).
 * adopted: count them as adopt_evictions. Not for a fault handler: it takes
 * a lock and a channel of its own. Returns pages dropped.
 */
uint64_t fm_evict_to_budget(struct fm_pager *p, int adopted);
void *fm_evictor_main(void *arg);
/*
 * Where no evictor thread runs, pages leave when a fault asks for room. A
 * batch that could not leave (pinned for I/O, memd full) lets the page in
 * over the budget, and a program that faults no more after that stays over
 * it (dd reading again into its resident buffer). A handler that sleeps
 * between faults keeps this watch: fm_budget_watch_ms is how long it may
 * sleep (-1: until a fault), fm_budget_watch_look evicts (over b's channel,
 * borrowed only then) once the rest is up, a longer rest each time nothing
 * could leave.
 */
struct fm_budget_watch {
	uint64_t next_ns; /* 0: within the budget when last looked */
	int rest_ms;
};
int fm_budget_watch_ms(struct fm_pager *p, struct fm_budget_watch *w);
void fm_budget_watch_look(struct fm_pager *p, struct fm_budget_watch *w, struct fm_borrowed *b);
/* What fm_heat_filled saw of a page that came back. */
#define FM_BACK_SOON 1u /* it left at most three budgets of evictions ago (or, the clock wrapping at eight, a multiple of eight more) */
#define FM_BACK_LOOP 2u /* the loop rule had chosen it (pick_passed, FM_PGF_LOOPED) */
#define FM_BACK_BUDGET 4u /* it left at most one budget of evictions ago (refaults_soon) */
/*
 * Page i of r, whose byte was was, was filled (from memd if was is REMOTE)
 * under a FILLING hold: a page back soon after it left is one the clock
 * should keep longer (evict.c). Returns FM_BACK_* flags.
 */
unsigned fm_heat_filled(struct fm_pager *p, struct region *r, uint64_t i, uint8_t was);
/*
 * Pages last, last - stride, ... (n of them) of region ridx are what a
 * thread's run over memory larger than the budget has just gone through:
 * they leave before the clock's (evict.c says why).
 */
void fm_evict_passed(struct fm_pager *p, int ridx, uint64_t last, int64_t stride, uint64_t n);
/*
 * Pages [first, first+n) of region ridx are done with for now: a full GC's
 * compaction has moved past them (fm_pager_passed). They leave with the
 * loop rule's, before the clock's choice.
 */
void fm_evict_done(struct fm_pager *p, int ridx, uint64_t first, uint64_t n);
/* Pages [first, first+n) of region ridx are garbage the program discarded: look there first. */
void fm_evict_hint(struct fm_pager *p, int ridx, uint64_t first, uint64_t n);

#endif
