/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A page's state byte in the residency map (resmap.h: states and flags), and
 * the only ways the pager changes one.
 *
 * Three states are holds: FILLING, UPDATING and LEAVING. Whoever moves a
 * page into a hold (by compare-and-swap, so exactly one thread wins) owns it
 * until it stores a settled state; nobody else changes it meanwhile, and a
 * thread that needs the page waits for it to settle (wait.h). Every change
 * is checked against the table below: a transition the pager never makes is
 * a bug in the pager, and the program stops before it runs on with a page
 * whose books are wrong.
 */
#ifndef FARMEM_PAGE_H
#define FARMEM_PAGE_H

#include <stdint.h>

#include "fatal.h"
#include "resmap.h"

#define PG_SIZE 4096u
#define PG_SHIFT 12

#define PGB(s) (1u << (s))
/* fm_pg_next[from]: the states a page may go to from `from` (a flag change keeps the state). */
static const uint8_t fm_pg_next[8] = {
	[FM_PG_UNTOUCHED] = PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_FILLING) | PGB(FM_PG_UPDATING) |
			    PGB(FM_PG_UNMANAGED),
	[FM_PG_FILLING]   = PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_CLEAN) | PGB(FM_PG_DIRTY) | PGB(FM_PG_REMOTE),
	[FM_PG_CLEAN]     = PGB(FM_PG_CLEAN) | PGB(FM_PG_FILLING) | PGB(FM_PG_UPDATING) | PGB(FM_PG_LEAVING) |
			    PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_UNMANAGED),
	[FM_PG_UPDATING]  = PGB(FM_PG_CLEAN) | PGB(FM_PG_DIRTY) | PGB(FM_PG_UNTOUCHED),
	[FM_PG_DIRTY]     = PGB(FM_PG_DIRTY) | PGB(FM_PG_FILLING) | PGB(FM_PG_UPDATING) | PGB(FM_PG_LEAVING) |
			    PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_UNMANAGED),
	[FM_PG_LEAVING]   = PGB(FM_PG_REMOTE) | PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_CLEAN) | PGB(FM_PG_DIRTY),
	[FM_PG_REMOTE]    = PGB(FM_PG_REMOTE) | PGB(FM_PG_FILLING) | PGB(FM_PG_UNTOUCHED) | PGB(FM_PG_UNMANAGED),
	[FM_PG_UNMANAGED] = PGB(FM_PG_UNMANAGED),
};
#undef PGB

static inline int pg_is_hold(unsigned s)
{
	return s == FM_PG_FILLING || s == FM_PG_UPDATING || s == FM_PG_LEAVING;
}

static inline uint8_t pg_load(const uint8_t *b)
{
	return __atomic_load_n(b, __ATOMIC_ACQUIRE);
}

static inline uint8_t pg_make(unsigned state, uint8_t flags)
{
	return (uint8_t)((flags & ~FM_PG_STATE_MASK) | state);
}

static inline void pg_check(uint8_t from, uint8_t to)
{
	if (!(fm_pg_next[fm_pg_state(from)] & (1u << fm_pg_state(to))))
		fm_fatal("pager bug: page state %u -> %u", fm_pg_state(from), fm_pg_state(to));
}

/* Change *b from *old to nv if it still is *old; else *old gets what it is. */
static inline int pg_cas(uint8_t *b, uint8_t *old, uint8_t nv)
{
	pg_check(*old, nv);
	return __atomic_compare_exchange_n(b, old, nv, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE);
}

/* The owner of a hold (held: the byte it stored) lets the page go as nv. */
static inline void pg_release(uint8_t *b, uint8_t held, uint8_t nv)
{
	uint8_t cur = pg_load(b);

	if (cur != held)
		fm_fatal("pager bug: a held page changed under its owner (%#x, held as %#x)", cur, held);
	pg_check(held, nv);
	__atomic_store_n(b, nv, __ATOMIC_SEQ_CST);
}

/* The same, for a page held in state `state` whose flags the owner did not keep. */
static inline void pg_release_from(uint8_t *b, unsigned state, uint8_t nv)
{
	uint8_t cur = pg_load(b);

	if (fm_pg_state(cur) != state)
		fm_fatal("pager bug: a held page changed under its owner (%#x, held in state %u)", cur, state);
	pg_check(cur, nv);
	__atomic_store_n(b, nv, __ATOMIC_SEQ_CST);
}

/* A region's bytes before it goes live (registration), when nobody else can see them. */
static inline void pg_init(uint8_t *b, uint8_t v)
{
	__atomic_store_n(b, v, __ATOMIC_RELAXED);
}

#endif /* FARMEM_PAGE_H */
