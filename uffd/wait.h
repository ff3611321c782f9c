/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waiting for a page to settle: a thread that meets a page in a hold (page.h)
 * sleeps until its owner lets it go. One futex word per pager; an owner that
 * lets a page go wakes the sleepers only when there are any, so a fault that
 * nobody waits for pays one load. Async-signal-safe: the SIGBUS handler waits
 * here too.
 */
#ifndef FARMEM_WAIT_H
#define FARMEM_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

struct fm_pager;

/* Wait until *b is not a hold; returns the settled byte. */
uint8_t fm_settle(struct fm_pager *p, uint8_t *b);
/* Wait out a hold, then take the page (FILLING, its flags kept): an install's or a move's claim. Returns its byte before. */
uint8_t fm_claim(struct fm_pager *p, uint8_t *b);
/* The owner of a hold lets the page go as nv (pg_release) and wakes whoever waits. */
void fm_release(struct fm_pager *p, uint8_t *b, uint8_t held, uint8_t nv);
/* Wake whoever waits in fm_settle (after stores of settled states made otherwise). */
void fm_settled(struct fm_pager *p);

/* A futex wait on *word while it holds seen (timeout_ms > 0 bounds it), and a wake of all. */
void fm_futex_wait(atomic_uint *word, unsigned seen, int timeout_ms);
void fm_futex_wake(atomic_uint *word);

#endif
