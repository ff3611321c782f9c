// SPDX-License-Identifier: Apache-2.0
/*
 * The shim's covers for POSIX AIO: aio_read, aio_write and lio_listio.
 *
 * glibc does a request later, in a thread of its own, with its internal
 * pread and pwrite, which no cover sees. In fault=signal mode a buffer in
 * paged memory that is not resident when that thread gets to it fails the
 * request with EFAULT (fio's posixaio engine, every run), and the pages of
 * an O_DIRECT read evicted while the device writes them lose the read. That
 * thread also runs with every signal blocked, so it must not fault on its
 * aiocb either (a SIGBUS it blocks kills the process). So a request's buffer
 * and aiocb are made resident and pinned (fm_pager_io_begin) from submission
 * until the program learns that the request is over: aio_error no longer
 * says EINPROGRESS, aio_return collects it, or lio_listio waited for it.
 * A request finding no room among HELD keeps its pages resident at
 * submission only. Pinned buffers stay local however large: a 64 MiB read
 * in flight holds 64 MiB over a smaller budget until it is collected.
 * With handler threads (fault=thread) the kernel waits for pages and a
 * page the kernel pinned is kept by the move's refusal: nothing to do.
 */
#include <aio.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "pager.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))
#define HELD 512
#define TAKING ((const struct aiocb *)1)

/* A request in flight and its pins; pid: the process whose pager pinned (a fork's child has its own). */
static struct held {
	_Atomic(const struct aiocb *) cb;
	atomic_int buf_pin, cb_pin;
	pid_t pid;
} held[HELD];
static atomic_int held_top; /* slots at and above were never taken */
static atomic_int nheld;

FM_IO_NEXT(aio_read_next, "aio_read");
FM_IO_NEXT(aio_write_next, "aio_write");
FM_IO_NEXT(lio_listio_next, "lio_listio");
FM_IO_NEXT(aio_error_next, "aio_error");
FM_IO_NEXT(aio_return_next, "aio_return");

/* On 64-bit targets the *64 functions are the same as the others, on the same struct (glibc aliases them). */
_Static_assert(sizeof(struct aiocb) == sizeof(struct aiocb64), "struct aiocb64 is struct aiocb");

#define LIBC(name) ((__typeof__(&name))fm_io_next(&name##_next))

static void hold(const struct aiocb *cb, int into)
{
	struct fm_pager *p = fm_preload_pager();
	int bp, cp;

	if (!p)
		return;
	bp = into ? fm_pager_read_begin(p, (void *)cb->aio_buf, cb->aio_nbytes, cb->aio_fildes)
		  : fm_pager_io_begin(p, (const void *)cb->aio_buf, cb->aio_nbytes, 0);
	cp = fm_pager_io_begin(p, cb, sizeof(*cb), 1);
	if (bp < 0 && cp < 0)
		return;
	for (int k = 0; k < HELD; k++) {
		const struct aiocb *none = NULL;
		/* Taken under a name no request has, until its pins are in. */
		if (atomic_compare_exchange_strong(&held[k].cb, &none, TAKING)) {
			int top = atomic_load(&held_top);
			held[k].pid = getpid();
			atomic_store(&held[k].buf_pin, bp);
			atomic_store(&held[k].cb_pin, cp);
			atomic_fetch_add(&nheld, 1);
			while (top <= k && !atomic_compare_exchange_weak(&held_top, &top, k + 1))
				;
			atomic_store(&held[k].cb, cb);
			return;
		}
	}
	fm_pager_io_end(p, bp);
	fm_pager_io_end(p, cp);
}

/* The request is over: its pins go back. Async-signal-safe (aio_return in a handler). */
static void let_go(const struct aiocb *cb)
{
	struct fm_pager *p;
	int top;

	if (!atomic_load(&nheld))
		return;
	p = fm_preload_pager_nowait();
	top = atomic_load(&held_top);
	for (int k = 0; k < top; k++) {
		int bp, cp;
		if (atomic_load(&held[k].cb) != cb)
			continue;
		/* The exchange makes one thread the owner of the pins: two may collect the same request. */
		bp = atomic_exchange(&held[k].buf_pin, -1);
		cp = atomic_exchange(&held[k].cb_pin, -1);
		if (bp < 0 && cp < 0)
			continue;
		if (p && held[k].pid == getpid()) {
			fm_pager_io_end(p, bp);
			fm_pager_io_end(p, cp);
		}
		atomic_store(&held[k].cb, NULL);
		atomic_fetch_sub(&nheld, 1);
	}
}

static int submit(struct aiocb *cb, int into)
{
	int (*f)(struct aiocb *) = into ? LIBC(aio_read) : LIBC(aio_write);
	int r, e;

	if (!f) {
		errno = ENOSYS;
		return -1;
	}
	hold(cb, into);
	r = f(cb);
	e = errno;
	if (r)
		let_go(cb); /* not queued */
	errno = e;
	return r;
}

EXPORT int aio_read(struct aiocb *cb)
{
	return submit(cb, 1);
}

EXPORT int aio_read64(struct aiocb64 *cb)
{
	return submit((struct aiocb *)cb, 1);
}

EXPORT int aio_write(struct aiocb *cb)
{
	return submit(cb, 0);
}

EXPORT int aio_write64(struct aiocb64 *cb)
{
	return submit((struct aiocb *)cb, 0);
}

EXPORT int lio_listio(int mode, struct aiocb *const list[], int n, struct sigevent *sev)
{
	int (*f)(int, struct aiocb *const[], int, struct sigevent *) = LIBC(lio_listio);
	int r, e;

	if (!f) {
		errno = ENOSYS;
		return -1;
	}
	for (int k = 0; k < n; k++)
		if (list[k] && (list[k]->aio_lio_opcode == LIO_READ || list[k]->aio_lio_opcode == LIO_WRITE))
			hold(list[k], list[k]->aio_lio_opcode == LIO_READ);
	r = f(mode, list, n, sev);
	e = errno;
	/*
	 * LIO_WAIT: every request is over. LIO_NOWAIT: those not queued say so
	 * in aio_error, and go when the program asks.
	 */
	for (int k = 0; mode == LIO_WAIT && k < n; k++)
		if (list[k])
			let_go(list[k]);
	errno = e;
	return r;
}

EXPORT int lio_listio64(int mode, struct aiocb64 *const list[], int n, struct sigevent *sev)
{
	return lio_listio(mode, (struct aiocb *const *)list, n, sev);
}

EXPORT int aio_error(const struct aiocb *cb)
{
	int (*f)(const struct aiocb *) = LIBC(aio_error);
	int r, e;

	if (!f) {
		errno = ENOSYS;
		return -1;
	}
	r = f(cb);
	e = errno;
	if (r != EINPROGRESS)
		let_go(cb);
	errno = e;
	return r;
}

EXPORT int aio_error64(const struct aiocb64 *cb)
{
	return aio_error((const struct aiocb *)cb);
}

EXPORT ssize_t aio_return(struct aiocb *cb)
{
	ssize_t (*f)(struct aiocb *) = LIBC(aio_return);
	ssize_t r;
	int e;

	if (!f) {
		errno = ENOSYS;
		return -1;
	}
	r = f(cb);
	e = errno;
	let_go(cb);
	errno = e;
	return r;
}

EXPORT ssize_t aio_return64(struct aiocb64 *cb)
{
	return aio_return((struct aiocb *)cb);
}
