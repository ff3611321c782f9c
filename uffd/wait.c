// SPDX-License-Identifier: Apache-2.0
#include "wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager_internal.h"

#define SETTLE_SPIN_NS (60ull * 1000)

void fm_futex_wait(atomic_uint *word, unsigned seen, int timeout_ms)
{
	struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };

	syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, timeout_ms > 0 ? &ts : NULL, NULL, 0);
}

void fm_futex_wake(atomic_uint *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

void fm_settled(struct fm_pager *p)
{
	/* seq_cst with the waiter's count-then-look: one of the two sees the other. */
	if (atomic_load(&p->settle_waiters)) {
		atomic_fetch_add(&p->settle_seq, 1);
		fm_futex_wake(&p->settle_seq);
	}
}

void fm_release(struct fm_pager *p, uint8_t *b, uint8_t held, uint8_t nv)
{
	pg_release(b, held, nv);
	fm_settled(p);
}

uint8_t fm_settle(struct fm_pager *p, uint8_t *b)
{
	uint8_t v = pg_load(b);

	/* Most holds last a few microseconds: look again a few times before sleeping. */
	if (pg_is_hold(fm_pg_state(v))) {
		uint64_t until = fm_now_ns() + SETTLE_SPIN_NS;
		do {
			sched_yield();
			v = pg_load(b);
		} while (pg_is_hold(fm_pg_state(v)) && fm_now_ns() < until);
	}
	while (pg_is_hold(fm_pg_state(v))) {
		unsigned seen;
		atomic_fetch_add(&p->settle_waiters, 1);
		seen = atomic_load(&p->settle_seq);
		v = pg_load(b);
		/* The timeout only covers a waker that let go before we counted ourselves. */
		if (pg_is_hold(fm_pg_state(v)))
			fm_futex_wait(&p->settle_seq, seen, 10);
		atomic_fetch_sub(&p->settle_waiters, 1);
		v = pg_load(b);
	}
	return v;
}

uint8_t fm_claim(struct fm_pager *p, uint8_t *b)
{
	for (;;) {
		uint8_t v = fm_settle(p, b);
		if (pg_cas(b, &v, pg_make(FM_PG_FILLING, v)))
			return v;
	}
}
