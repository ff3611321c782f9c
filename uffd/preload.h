/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside the preload shim: preload.c (mappings, malloc), preload_io.c (system
 * calls, stdio, SIGBUS), preload_sync.c (glibc's futex waits),
 * preload_syscall.c (glibc's syscall()) and preload_aio.c (POSIX AIO).
 */
#ifndef FARMEM_PRELOAD_H
#define FARMEM_PRELOAD_H

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct fm_pager;

/* The pager, once it runs; NULL before, in a forked child, or when the shim stays out of the way. */
struct fm_pager *fm_preload_pager(void);
/*
 * The same without waiting for a forked child's pager to start: for covers
 * that the pager's own code calls too (its locks and condition variables go
 * through preload_sync.c's), which must never wait for the pager.
 */
struct fm_pager *fm_preload_pager_nowait(void);

/*
 * The JVMTI agent, loaded into a JVM that the shim was preloaded into (a JVM
 * started by a script under farmem run, which hands every JVM the agent in
 * JAVA_TOOL_OPTIONS), asks the shim to stay out of its process: two pagers
 * would each take SIGBUS. Looked up by name (the agent does not link the
 * shim): 0 when the shim stood aside, -EBUSY when it pages this process
 * already (the agent then runs without farmem).
 */
#define FM_PRELOAD_YIELD_SYMBOL "farmem_preload_yield"
typedef int (*fm_preload_yield_fn)(void);

/*
 * The ranges one covered call keeps resident and pinned while the kernel
 * touches them (fault=signal only; pins.h). A range outside paged memory
 * costs a bounds check; one the pin table has no room for is still made
 * resident, but may leave again before the kernel reads it.
 */
#define FM_IO_PINS 16
/*
 * A buffer in paged memory larger than this moves in pieces of this size,
 * each pinned while the kernel moves it: one pin over all of it would make
 * all of it resident at once, past the budget.
 */
#define FM_IO_PIECE (1u << 20)
/*
 * Ranges past a call's own pins (a recvmmsg's 64 buffers) gather into one
 * span while it stays this short, and the span takes the last pin: a
 * buffer made resident but not pinned could leave while the call sleeps,
 * and a datagram whose copy then fails is dropped by the kernel.
 */
#define FM_IO_SPAN (4u << 20)
struct fm_io_pins {
	struct fm_pager *p;
	int slot[FM_IO_PINS];
	unsigned n;
	/* A range the pin table had no room for (FM_IO_UNPINNED): the call may have moved less. */
	int unpinned;
	/* The span of the ranges past FM_IO_PINS - 1, pinned by fm_io_pin_rest; 0, 0: none. */
	uintptr_t rest_lo, rest_hi;
	int rest_write;
};

void fm_io_pin(struct fm_io_pins *io, const void *buf, size_t len, int write);
/* After the last fm_io_pin of a call: the span of the ranges that had no pin of their own. */
void fm_io_pin_rest(struct fm_io_pins *io);
void fm_io_unpin(struct fm_io_pins *io);
/* For pthread_cleanup_push: a thread cancelled inside a covered call gives its pins back. */
void fm_io_unpin_on_cancel(void *io);
/*
 * libc's function NAME after the shim's. Every one is declared with
 * FM_IO_NEXT (a table in section fm_io_next_refs) and bound by fm_io_bind
 * before anything is paged: a lookup walks the dynamic linker's link maps
 * and scope lists, which a program that dlopens keeps in its paged heap, and
 * a lookup made later by a pager thread (its locks go through the covers)
 * could fault on a page only that thread can bring in. A function libc
 * lacks is kept as FM_IO_NONE, so it too is looked up once.
 */
/* Aligned to its size, so that the section is an array with no gaps between entries. */
struct fm_io_next_ref {
	void *fn;
	const char *name;
} __attribute__((aligned(16)));
#define FM_IO_NEXT(var, fname) \
	static struct fm_io_next_ref var __attribute__((used, section("fm_io_next_refs"))) = { NULL, fname }

/* Bind every FM_IO_NEXT. In the program's context, before the pager starts. */
void fm_io_bind(void);
/*
 * A thread's stack of the program's own, in attr (pthread_attr_setstack, or
 * pthread_attr_setstackaddr, which hands over its top only, its size perhaps
 * after): at pthread_create it is known whole and leaves paged memory there.
 * Nothing when attr gives no stack of its own.
 */
void fm_thread_stack_stays_local(const pthread_attr_t *attr);
/* What glibc's start_thread reads before it unblocks signals leaves paged memory (at pthread_create). */
void fm_thread_start_data_stays_local(void);
/*
 * mmap as the program's, made by the code at caller: the program's allocator
 * (tcmalloc's mmap is syscall(SYS_mmap)) maps where the kernel waits.
 */
void *fm_shim_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off, const void *caller);
/*
 * The program sets up io_uring or native AIO through syscall() (what: which
 * of them, as a log line names it), with no library the shim can see: the
 * kernel will touch its buffers after the submitting calls return.
 */
void fm_shim_async_io(const char *what);

#define FM_IO_NONE ((void *)~(uintptr_t)0)

/* The function, or NULL when libc has none. */
static inline void *fm_io_next(struct fm_io_next_ref *r)
{
	void *f = __atomic_load_n(&r->fn, __ATOMIC_ACQUIRE);

	if (!f) {
		f = dlsym(RTLD_NEXT, r->name);
		__atomic_store_n(&r->fn, f ? f : FM_IO_NONE, __ATOMIC_RELEASE);
	}
	return f == FM_IO_NONE ? NULL : f;
}

#endif
