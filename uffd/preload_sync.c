// SPDX-License-Identifier: Apache-2.0
/*
 * The shim's covers for glibc's waits on a futex word in paged memory.
 *
 * A thread that waits on a semaphore, a condition variable, a barrier, a
 * rwlock, a once flag or a timed mutex reads the object's word in user space
 * and then asks the kernel to sleep while the word still holds that value
 * (FUTEX_WAIT); the kernel reads the word again. With faults served in the
 * faulting thread (fault=signal) a page evicted in between makes the kernel's
 * read fail with EFAULT, and glibc takes an EFAULT from a wait for a bug of
 * its own: "The futex facility returned an unexpected error code", abort.
 * So each of these calls makes its objects resident and pins them until it
 * returns (preload_io.c's pins, pins.h). A mutex is pinned only when someone
 * else holds it: an uncontended lock is the one compare-and-swap it always
 * was, behind the cover's call.
 * Signalling a condition variable, and destroying one or a barrier, can wait
 * too (for the waiters to leave), so those are covered as well. Unlocking a
 * priority-inheritance mutex, and the kernel's walk of a dead thread's robust
 * mutexes, touch the word from the kernel too; those are not covered.
 *
 * A wait holds its pin for as long as it sleeps. Sleepers on one object share
 * its page, so a full pin table (pins.h) leaves a later sleeper unpinned only
 * on an object no other sleeper holds. A futex system call of the
 * program's own through glibc's syscall() is covered by preload_syscall.c;
 * its own syscall instruction is not (docs/pager.md).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <threads.h>
#include <time.h>

#include "pager.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

/*
 * Only an object in paged memory, and only with faults served in the faulting
 * thread: the pager's own locks go through these covers too, and pinning
 * takes its region lock.
 */
#define PIN(obj)                                                                        \
	do {                                                                            \
		if (io_.p && fm_pager_io_needed(io_.p, (obj), sizeof(*(obj))))          \
			fm_io_pin(&io_, (obj), sizeof(*(obj)), 1);                      \
	} while (0)

/*
 * TYPE NAME PARAMS: call libc's NAME with ARGS, PINS pinned around it; NOSYS
 * when libc has no NAME. errno is the call's, not the unpin's. A thread
 * cancelled in a wait (sem_wait, pthread_cond_wait) gives its pins back
 * (f_ is volatile for the cleanup's setjmp).
 */
#define WAIT_COVER(type, name, params, args, nosys, pins)                               \
	EXPORT type name params                                                         \
	{                                                                               \
		FM_IO_NEXT(next_, #name);                                               \
		type (*volatile f_) params = (type (*) params)fm_io_next(&next_);            \
		struct fm_io_pins io_;                                                  \
		type r_;                                                                \
		int e_;                                                                 \
		if (!f_)                                                                \
			return nosys;                                                   \
		io_.p = fm_preload_pager_nowait();                                      \
		io_.n = 0;                                                              \
		pins;                                                                   \
		if (io_.n) {                                                            \
			pthread_cleanup_push(fm_io_unpin_on_cancel, &io_);              \
			r_ = f_ args;                                                   \
			pthread_cleanup_pop(0);                                         \
		} else {                                                                \
			r_ = f_ args;                                                   \
		}                                                                       \
		e_ = errno;                                                             \
		fm_io_unpin(&io_);                                                      \
		errno = e_;                                                             \
		return r_;                                                              \
	}

/* sem_* say -1 and errno; pthread_* return the error; C11's say thrd_error. */
#define SEM_NOSYS (errno = ENOSYS, -1)

WAIT_COVER(int, sem_wait, (sem_t *s), (s), SEM_NOSYS, PIN(s))
WAIT_COVER(int, sem_timedwait, (sem_t *s, const struct timespec *t), (s, t), SEM_NOSYS, PIN(s))
WAIT_COVER(int, sem_clockwait, (sem_t *s, clockid_t c, const struct timespec *t), (s, c, t), SEM_NOSYS, PIN(s))

WAIT_COVER(int, pthread_cond_wait, (pthread_cond_t *c, pthread_mutex_t *m), (c, m), ENOSYS,
	   PIN(c); PIN(m))
WAIT_COVER(int, pthread_cond_timedwait, (pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t),
	   (c, m, t), ENOSYS, PIN(c); PIN(m))
WAIT_COVER(int, pthread_cond_clockwait,
	   (pthread_cond_t *c, pthread_mutex_t *m, clockid_t k, const struct timespec *t), (c, m, k, t), ENOSYS,
	   PIN(c); PIN(m))
WAIT_COVER(int, pthread_cond_signal, (pthread_cond_t *c), (c), ENOSYS, PIN(c))
WAIT_COVER(int, pthread_cond_broadcast, (pthread_cond_t *c), (c), ENOSYS, PIN(c))
WAIT_COVER(int, pthread_cond_destroy, (pthread_cond_t *c), (c), ENOSYS, PIN(c))

WAIT_COVER(int, pthread_barrier_wait, (pthread_barrier_t *b), (b), ENOSYS, PIN(b))
WAIT_COVER(int, pthread_barrier_destroy, (pthread_barrier_t *b), (b), ENOSYS, PIN(b))

WAIT_COVER(int, pthread_rwlock_rdlock, (pthread_rwlock_t *l), (l), ENOSYS, PIN(l))
WAIT_COVER(int, pthread_rwlock_wrlock, (pthread_rwlock_t *l), (l), ENOSYS, PIN(l))
WAIT_COVER(int, pthread_rwlock_timedrdlock, (pthread_rwlock_t *l, const struct timespec *t), (l, t), ENOSYS,
	   PIN(l))
WAIT_COVER(int, pthread_rwlock_timedwrlock, (pthread_rwlock_t *l, const struct timespec *t), (l, t), ENOSYS,
	   PIN(l))
WAIT_COVER(int, pthread_rwlock_clockrdlock, (pthread_rwlock_t *l, clockid_t k, const struct timespec *t),
	   (l, k, t), ENOSYS, PIN(l))
WAIT_COVER(int, pthread_rwlock_clockwrlock, (pthread_rwlock_t *l, clockid_t k, const struct timespec *t),
	   (l, k, t), ENOSYS, PIN(l))

/*
 * A trylock first, for every mutex: the same compare-and-swap the lock would
 * make, and the same answer for a recursive, error-checking or robust mutex
 * the caller owns or whose owner died. Only a mutex someone else holds is
 * looked up, and pinned if it is paged: an uncontended lock pays the cover's
 * call and nothing else.
 */
#define LOCK_COVER(type, name, try_name, nosys, busy)                                   \
	EXPORT int name(type *m)                                                        \
	{                                                                               \
		FM_IO_NEXT(lock_, #name);                                               \
		FM_IO_NEXT(try_, #try_name);                                            \
		int (*lock)(type *) = (int (*)(type *))fm_io_next(&lock_);                   \
		int (*try)(type *) = (int (*)(type *))fm_io_next(&try_);                    \
		struct fm_io_pins io_;                                                  \
		int r;                                                                  \
		if (!lock || !try)                                                      \
			return nosys;                                                   \
		r = try(m);                                                             \
		if (r != busy)                                                          \
			return r;                                                       \
		io_.p = fm_preload_pager_nowait();                                      \
		if (!io_.p || !fm_pager_io_needed(io_.p, m, sizeof(*m)))                \
			return lock(m);                                                 \
		io_.n = 0;                                                              \
		fm_io_pin(&io_, m, sizeof(*m), 1);                                      \
		r = lock(m);                                                            \
		fm_io_unpin(&io_);                                                      \
		return r;                                                               \
	}

LOCK_COVER(pthread_mutex_t, pthread_mutex_lock, pthread_mutex_trylock, ENOSYS, EBUSY)
LOCK_COVER(mtx_t, mtx_lock, mtx_trylock, thrd_error, thrd_busy)

WAIT_COVER(int, pthread_mutex_timedlock, (pthread_mutex_t *m, const struct timespec *t), (m, t), ENOSYS, PIN(m))
WAIT_COVER(int, pthread_mutex_clocklock, (pthread_mutex_t *m, clockid_t k, const struct timespec *t), (m, k, t),
	   ENOSYS, PIN(m))

WAIT_COVER(int, pthread_once, (pthread_once_t *o, void (*init)(void)), (o, init), ENOSYS, PIN(o))

/* C11 threads: glibc calls its pthread functions inside, past the covers above. */
WAIT_COVER(int, cnd_wait, (cnd_t *c, mtx_t *m), (c, m), thrd_error, PIN(c); PIN(m))
WAIT_COVER(int, cnd_timedwait, (cnd_t *restrict c, mtx_t *restrict m, const struct timespec *restrict t),
	   (c, m, t), thrd_error, PIN(c); PIN(m))
WAIT_COVER(int, cnd_signal, (cnd_t *c), (c), thrd_error, PIN(c))
WAIT_COVER(int, cnd_broadcast, (cnd_t *c), (c), thrd_error, PIN(c))
WAIT_COVER(int, mtx_timedlock, (mtx_t *restrict m, const struct timespec *restrict t), (m, t), thrd_error, PIN(m))

EXPORT void call_once(once_flag *o, void (*init)(void))
{
	FM_IO_NEXT(next, "call_once");
	void (*f)(once_flag *, void (*)(void)) = (void (*)(once_flag *, void (*)(void)))fm_io_next(&next);
	struct fm_io_pins io_ = { .p = fm_preload_pager_nowait() };

	if (!f)
		return;
	PIN(o);
	f(o, init);
	fm_io_unpin(&io_);
}

EXPORT void cnd_destroy(cnd_t *c)
{
	FM_IO_NEXT(next, "cnd_destroy");
	void (*f)(cnd_t *) = (void (*)(cnd_t *))fm_io_next(&next);
	struct fm_io_pins io_ = { .p = fm_preload_pager_nowait() };

	if (!f)
		return;
	PIN(c);
	f(c);
	fm_io_unpin(&io_);
}
