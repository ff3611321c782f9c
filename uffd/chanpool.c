// SPDX-License-Identifier: Apache-2.0
#include "chanpool.h"

#include <unistd.h>

#include "pager_internal.h"
#include "wait.h"

/* Initial-exec TLS: static TLS even in the dlopen'ed agent (as libjvm's own), so a signal handler reading it never allocates. */
static __thread pid_t my_tid __attribute__((tls_model("initial-exec")));

pid_t fm_thread_id(void)
{
	if (!my_tid)
		my_tid = gettid();
	return my_tid;
}

void fm_thread_id_forked(void)
{
	my_tid = 0;
}

int fm_pool_open(struct fm_pager *p, unsigned n)
{
	if (n > MAX_POOL)
		n = MAX_POOL;
	for (p->npool = 0; p->npool < n; p->npool++) {
		int rc = fm_chan_open(p->x, &p->pool[p->npool].chan);
		if (rc)
			return rc;
	}
	return 0;
}

void fm_pool_close(struct fm_pager *p)
{
	for (unsigned i = 0; i < p->npool; i++)
		fm_chan_close(p->pool[i].chan);
	p->npool = 0;
}

struct chan_slot *fm_pool_take(struct fm_pager *p, pid_t tid)
{
	unsigned start = (unsigned)tid % p->npool;

	for (;;) {
		unsigned seen;
		for (unsigned k = 0; k < p->npool; k++) {
			struct chan_slot *s = &p->pool[(start + k) % p->npool];
			int free_ = 0;
			if (atomic_compare_exchange_strong(&s->busy, &free_, 1))
				return s;
		}
		atomic_fetch_add(&p->pool_waiters, 1);
		seen = atomic_load(&p->pool_seq);
		fm_futex_wait(&p->pool_seq, seen, 1);
		atomic_fetch_sub(&p->pool_waiters, 1);
	}
}

void fm_pool_give(struct fm_pager *p, struct chan_slot *s)
{
	atomic_store(&s->busy, 0);
	if (atomic_load(&p->pool_waiters)) {
		atomic_fetch_add(&p->pool_seq, 1);
		fm_futex_wake(&p->pool_seq);
	}
}

struct fm_chan *fm_borrow(struct fm_pager *p, struct fm_borrowed *b)
{
	if (!b->chan) {
		b->slot = fm_pool_take(p, b->tid);
		b->chan = b->slot->chan;
	}
	return b->chan;
}

void fm_give_back(struct fm_pager *p, struct fm_borrowed *b)
{
	if (b->slot) {
		fm_pool_give(p, b->slot);
		b->slot = NULL;
		b->chan = NULL;
	}
}
