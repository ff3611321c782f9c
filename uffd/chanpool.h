/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memd channels that faulting threads borrow for the length of one fault
 * (transport.h: a channel belongs to one thread at a time). Opened when the
 * pager starts, since a fault, in a signal handler, may not allocate or
 * connect. A thread that finds them all busy sleeps until one comes back.
 */
#ifndef FARMEM_CHANPOOL_H
#define FARMEM_CHANPOOL_H

#include <sys/types.h>

struct fm_pager;
struct fm_chan;
struct chan_slot;

/*
 * The channel one fault uses: the thread's own (a handler thread, the
 * evictor) or one borrowed from the pool on first need and given back when
 * the fault is done, so a zero fill never touches the pool.
 */
struct fm_borrowed {
	struct fm_chan *chan;
	struct chan_slot *slot;
	pid_t tid;
};
/*
 * The calling thread's id, asked of the kernel once per thread (a collector
 * asks for every header it reads where the page lies, the shim for every
 * system call on paged memory). It names the thread for the channel pool,
 * prefetch streams and GC books.
 */
pid_t fm_thread_id(void);
/* In a forked child's only thread (fork.c): the id cached is the forking thread's, in the parent. */
void fm_thread_id_forked(void);

struct fm_chan *fm_borrow(struct fm_pager *p, struct fm_borrowed *b);
void fm_give_back(struct fm_pager *p, struct fm_borrowed *b);

int fm_pool_open(struct fm_pager *p, unsigned n);
void fm_pool_close(struct fm_pager *p);
struct chan_slot *fm_pool_take(struct fm_pager *p, pid_t tid);
void fm_pool_give(struct fm_pager *p, struct chan_slot *s);

#endif
