// SPDX-License-Identifier: Apache-2.0
/*
 * libfarmem_preload.so: puts a program that knows nothing of farmem under
 * the pager. Private anonymous mappings of at least FARMEM_THRESHOLD bytes
 * are registered, whether they come from mmap or from malloc (glibc maps big
 * blocks with an internal mmap that LD_PRELOAD cannot see, so big blocks are
 * mapped here instead). munmap, mremap and MADV_DONTNEED-like advice on a
 * paged range go through the pager first, so no stale page ever comes back.
 *
 * The interposers call the kernel directly (syscall(2)): this file runs
 * inside malloc and inside the dynamic loader's own allocations.
 *
 * Safe from the program's first instruction. Other libraries' constructors
 * run before ours (a program linked with libjemalloc maps its arenas from
 * jemalloc's constructor), so every hook reads the configuration on first
 * use, never a half-set one. The program keeps its own allocator (the next
 * malloc after this library: glibc's, or jemalloc's, ...), but nothing of
 * farmem's ever allocates through it: its hooks run inside that allocator,
 * which may hold its own locks there. farmem's allocations (the shim's, the
 * pager's, and all of the pager's threads') come from a private arena
 * instead, and free() tells them apart by address.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <limits.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fm_fds.h"
#include "fm_util.h"
#include "fork.h"
#include "monitor.h"
#include "page.h"
#include "pager.h"
#include "preload.h"
#include "uffd_ops.h"

#define EXPORT __attribute__((visibility("default")))
/* Static TLS: a global-dynamic access may allocate, and malloc reads it. */
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define PAGE 4096u
#define MAX_BIG 4096

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
extern int __libc_mallopt(int, int);
extern void *__sbrk(intptr_t);

static struct fm_pager_cfg cfg;
static atomic_int cfg_state;         /* 0 unread, 1 being read, 2 read */
static struct fm_pager *pager;
static atomic_int state;             /* 0 idle, 1 starting, 2 running, 4 disabled */
static _Atomic(const char *) raw_async_io; /* fm_shim_async_io's call, before the pager started */
static const char *async_io_user;          /* why this process's pager keeps pinned pages, or NULL */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
/* Signalled, under start_lock, when a forked child's pager has started. */
static pthread_cond_t child_started = PTHREAD_COND_INITIALIZER;
/* Set while farmem's own code runs on this thread, and always on the pager's threads. */
static TLS int in_farmem;

/*
 * A forked child's pager starts in a thread of its own (fork_child): the
 * ranges it got, and 1 while that thread has not finished with them.
 */
#define MAX_INHERIT 256
static struct fm_fork_range inherit[MAX_INHERIT];
static int ninherit;
static atomic_int child_starting;

static struct { uintptr_t addr; size_t len; } big[MAX_BIG];
static atomic_int nbig;
static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Reservations: private anonymous mappings of at least the threshold made
 * PROT_NONE through libc's mmap, whose parts the program makes writable
 * later with mprotect or a MAP_FIXED mapping (.NET's GC heap, V8's
 * WebAssembly memories; glibc's own heaps go by calls no hook sees, and are
 * found at malloc instead). A reservation is
 * registered as a sparse region when a part of it is first made writable,
 * and each part is committed as it is (fm_pager_commit). Kept as the
 * program changes the mappings: a part unmapped, remapped or replaced by a
 * mapping of something else is no longer reserved.
 */
#define MAX_RESV 128
static struct { uintptr_t base, end; } resv[MAX_RESV];
static atomic_int nresv;
static pthread_mutex_t resv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER; /* the pool of small reservations (below) */
/*
 * Parts of reservations the pager would not take (the region table full,
 * memd refusing the space): their commits stay local memory, not offered
 * again at every commit, each with its warning. Forgotten with the
 * reservation. Under resv_lock.
 */
#define MAX_REFUSED 256
static struct { uintptr_t lo, hi; } refused[MAX_REFUSED];
static int nrefused;
static pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER; /* glibc's heaps (below, at malloc) */
/*
 * Held across an mremap of paged memory and a big block's remap or move
 * (big_remapped, big_moved), an munmap of paged memory, an mmap the pager
 * may take (or a MAP_FIXED one, which may replace paged memory), and by a
 * fork from before its pagers prepare (fork_before) until they are done in
 * the parent (remap_let_go_by_fork): each of those changes a range's books
 * and registration in steps (uffd/remap.c), and a fork between them gives
 * the child books for a range not mapped there, or a paged range unpaged;
 * the fork's handlers mark the paged ranges DOFORK and then DONTFORK again,
 * and a range grown in between is split in two mappings (below). Nothing
 * else of the shim's is held when it is taken (big_alloc takes big_lock
 * under it).
 */
static pthread_mutex_t remap_lock = PTHREAD_MUTEX_INITIALIZER;
/* The thread whose fork holds remap_lock (0: none): its own fork handlers' calls do not wait for it. */
static _Atomic pid_t remap_fork_tid;

static int reserved_paged(void);
static void heaps_keep(void);
static int kernel_waits_open(struct fm_pager *pg);
static void atfork_once(void);

/* MAP_FAILED with errno set, as mmap(2) (glibc's syscall() sets errno). */
static void *sys_mmap(void *a, size_t l, int prot, int fl, int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, a, l, prot, fl, fd, off);
}

/*
 * A private anonymous NORESERVE range of at most `most` bytes, halved down
 * to `least` while the kernel refuses it; its size in *len. NORESERVE costs
 * nothing untouched, but counts against RLIMIT_AS (ulimit -v): an eighth of
 * it at most. MAP_FAILED when not even `least` could be had.
 */
static void *map_within_as_limit(size_t most, size_t least, int prot, size_t *len)
{
	struct rlimit as;
	size_t size = most;
	void *m;

	if (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY)
		while (size > least && size > as.rlim_cur / 8)
			size /= 2;
	while ((m = sys_mmap(NULL, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)) == MAP_FAILED &&
	       size > least)
		size /= 2;
	*len = size;
	return m;
}

static void die_config(const char *msg)
{
	/* No stdio: this may run inside the program's allocator, holding its locks. */
	char line[600];
	int n = snprintf(line, sizeof(line), "farmem: error: %s\n", msg);

	if (fm_sys_write(2, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
		n = 0;
	_exit(78);
}

/* --- farmem's own allocations ------------------------------------------------ */

/*
 * Power-of-two blocks carved from one reserved range, so that free() knows a
 * block of ours by its address alone. Blocks smaller than a page share pages
 * of one class (arena_cls of the page); larger blocks are runs of whole pages
 * (arena_cls of the first). A freed block waits on its class's list; pages
 * never change class. The range is reserved on first use, MAP_NORESERVE: only
 * what is touched costs memory.
 */
#define ARENA_SIZE (1ull << 30)
#define ARENA_PAGES ((size_t)(ARENA_SIZE / PAGE))
#define ARENA_MIN_CLS 4u
#define ARENA_MAX_CLS 29u
#define PAGE_CLS 12u

static _Atomic uintptr_t arena_base;
static size_t arena_len = ARENA_SIZE; /* less under a low RLIMIT_AS (ulimit -v): set before arena_base */
static uint8_t arena_cls[ARENA_PAGES];
static size_t arena_used; /* pages handed out, under arena_lock */
static void *arena_list[ARENA_MAX_CLS + 1];
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;

static int arena_owns(const void *p)
{
	uintptr_t b = atomic_load_explicit(&arena_base, memory_order_acquire);

	return b && (uintptr_t)p - b < arena_len;
}

static void *arena_alloc(size_t n, size_t align)
{
	size_t want = n > align ? n : align;
	unsigned k = ARENA_MIN_CLS;
	uintptr_t b;
	char *p = NULL;

	while (k <= ARENA_MAX_CLS && ((size_t)1 << k) < want)
		k++;
	if (k > ARENA_MAX_CLS) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&arena_lock);
	b = atomic_load_explicit(&arena_base, memory_order_relaxed);
	if (!b) {
		void *m = map_within_as_limit(ARENA_SIZE, ARENA_SIZE / 16, PROT_READ | PROT_WRITE, &arena_len);

		if (m == MAP_FAILED)
			goto out;
		b = (uintptr_t)m;
		atomic_store_explicit(&arena_base, b, memory_order_release);
	}
	if (arena_list[k]) {
		p = arena_list[k];
		arena_list[k] = *(void **)p;
	} else if (k < PAGE_CLS) {
		size_t bs = (size_t)1 << k;

		if (arena_used >= arena_len / PAGE)
			goto out;
		p = (char *)b + arena_used * PAGE;
		arena_cls[arena_used++] = (uint8_t)k;
		for (size_t off = PAGE - bs; off > 0; off -= bs) {
			*(void **)(p + off) = arena_list[k];
			arena_list[k] = p + off;
		}
	} else {
		size_t npg = (size_t)1 << (k - PAGE_CLS);
		size_t apg = align > PAGE ? align / PAGE : 1;
		size_t first = (arena_used + apg - 1) / apg * apg;

		if (first + npg > arena_len / PAGE)
			goto out;
		arena_cls[first] = (uint8_t)k;
		arena_used = first + npg;
		p = (char *)b + first * PAGE;
	}
out:
	pthread_mutex_unlock(&arena_lock);
	if (!p)
		errno = ENOMEM;
	return p;
}

static size_t arena_size(const void *p)
{
	return (size_t)1 << arena_cls[((uintptr_t)p - atomic_load(&arena_base)) / PAGE];
}

static void arena_free(void *p)
{
	unsigned k;

	pthread_mutex_lock(&arena_lock);
	k = arena_cls[((uintptr_t)p - atomic_load(&arena_base)) / PAGE];
	*(void **)p = arena_list[k];
	arena_list[k] = p;
	pthread_mutex_unlock(&arena_lock);
}

static void *arena_realloc(void *p, size_t n)
{
	size_t have = arena_size(p);
	void *q;

	if (n <= have)
		return p;
	q = arena_alloc(n, 16);
	if (q) {
		memcpy(q, p, have);
		arena_free(p);
	}
	return q;
}

/*
 * The pager's threads allocate from the arena too: a fault handler that
 * waited for a lock of the program's allocator, held by the thread whose
 * fault it serves, would never return. The linker sends the pager library's
 * pthread_create calls here (-Wl,--wrap=pthread_create); the program's own
 * threads are untouched.
 */
struct farmem_thread {
	void *(*fn)(void *);
	void *arg;
};

int __real_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

static void *farmem_thread_main(void *v)
{
	struct farmem_thread t = *(struct farmem_thread *)v;

	arena_free(v);
	in_farmem = 1;
	return t.fn(t.arg);
}

int __wrap_pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	struct farmem_thread *t = arena_alloc(sizeof(*t), 16);
	int rc;

	if (!t)
		return EAGAIN;
	t->fn = fn;
	t->arg = arg;
	in_farmem++; /* the new thread's TLS and stack bookkeeping are ours too */
	rc = __real_pthread_create(th, attr, farmem_thread_main, t);
	in_farmem--;
	if (rc)
		arena_free(t);
	return rc;
}

/*
 * The program's threads start through program_thread_main while a pager
 * takes faults by SIGBUS: a thread's stack of farmem's (monitor.c) is its
 * alternate signal stack from its start, not from its first fault. Code that
 * switches to a stack of its own making in paged memory by assembly (Erlang's
 * JIT, on each process's stack in its heap) could take its thread's first
 * fault there, and the kernel cannot write the signal's frame on a page that
 * is not resident. The pager's threads (in_farmem) and a program with no such
 * pager pass straight through.
 */
struct program_thread {
	void *(*fn)(void *);
	void *arg;
};

static void program_thread_ended(void *unused)
{
	(void)unused;
	fm_monitor_thread_end();
}

/* Its stack goes back to the pool however the thread ends: a return, pthread_exit, or cancellation. */
static void *program_thread_main(void *v)
{
	struct program_thread t = *(struct program_thread *)v;
	void *ret;

	arena_free(v);
	fm_monitor_thread_start();
	pthread_cleanup_push(program_thread_ended, NULL);
	ret = t.fn(t.arg);
	pthread_cleanup_pop(1);
	return ret;
}

FM_IO_NEXT(pthread_create_next, "pthread_create");

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	int (*next)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) =
		(int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))fm_io_next(&pthread_create_next);
	struct program_thread *t;
	int rc;

	if (!next)
		return EAGAIN;
	if (in_farmem || !fm_monitor_sigbus_ours())
		return next(th, attr, fn, arg);
	fm_thread_stack_stays_local(attr);
	fm_thread_start_data_stays_local();
	if (!(t = arena_alloc(sizeof(*t), 16)))
		return next(th, attr, fn, arg);
	t->fn = fn;
	t->arg = arg;
	rc = next(th, attr, program_thread_main, t);
	if (rc)
		arena_free(t);
	return rc;
}

/* --- the program's allocator --------------------------------------------------- */

/*
 * The malloc family as the program would have had it without us: the next
 * definition after this library. glibc maps big blocks where the shim cannot
 * see them, so with glibc's the shim maps those itself; any other allocator
 * (jemalloc, ...) maps through mmap(), which the shim sees, and serves every
 * call itself.
 */
struct app_alloc {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void (*free)(void *);
	void *(*memalign)(size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*valloc)(size_t);
	size_t (*usable)(void *);
	int glibc;
	/*
	 * The program's allocator is defined before us in the lookup order (in
	 * the executable: rustc's jemalloc): the program's calls never reach our
	 * malloc, and neither do glibc's own (the dynamic loader's, pthread's
	 * TLS), so a pager started inside that allocator (its mmap, under its
	 * locks) re-enters it and hangs. Its pager starts in our constructor.
	 */
	int foreign;
};

static struct fm_pager *get_pager(void);
static struct app_alloc app;
static atomic_int app_known;
static atomic_int ctor_ran;
static pthread_mutex_t app_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * f is an executable's stand-in for a function it only calls: a non-PIE
 * program that takes malloc's address (python3) gets a PLT entry as malloc's
 * address for everyone, which leads to the first real definition, ours.
 */
static int plt_stub(void *f)
{
	Dl_info info;
	const ElfW(Sym) *sym = NULL;

	return dladdr1(f, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx == SHN_UNDEF;
}

/*
 * f is glibc's own. Not "f == __libc_malloc": mimalloc and tcmalloc define
 * __libc_malloc too (so that glibc's internal calls reach them), and their
 * blocks taken for glibc's chunks sent the shim reading heap headers that are
 * not there (python3 with libmimalloc preloaded died of SIGSEGV at start).
 */
static int in_libc(void *f)
{
	Dl_info fi, li;

	return dladdr(f, &fi) && dladdr((void *)gnu_get_libc_version, &li) && fi.dli_fbase == li.dli_fbase;
}

/*
 * The program's definition of an allocator function: the one its calls reach
 * when that is not ours (an allocator in the executable), else the next one
 * after us. Our own code calls ours (-Bsymbolic-functions).
 */
static void *app_fn(const char *name, void *ours)
{
	void *f = dlsym(RTLD_DEFAULT, name);

	return f && f != ours && !plt_stub(f) ? f : dlsym(RTLD_NEXT, name);
}
#define APP_FN(name, type) ((type)app_fn(#name, (void *)name))

static const struct app_alloc *app_alloc(void)
{
	struct app_alloc a;

	if (atomic_load_explicit(&app_known, memory_order_acquire))
		return &app;
	in_farmem++; /* what dlsym allocates is ours */
	a.malloc = APP_FN(malloc, void *(*)(size_t));
	a.foreign = (void *)a.malloc != dlsym(RTLD_NEXT, "malloc");
	a.calloc = APP_FN(calloc, void *(*)(size_t, size_t));
	a.realloc = APP_FN(realloc, void *(*)(void *, size_t));
	a.free = APP_FN(free, void (*)(void *));
	a.memalign = APP_FN(memalign, void *(*)(size_t, size_t));
	a.aligned_alloc = APP_FN(aligned_alloc, void *(*)(size_t, size_t));
	a.posix_memalign = APP_FN(posix_memalign, int (*)(void **, size_t, size_t));
	a.valloc = APP_FN(valloc, void *(*)(size_t));
	a.usable = APP_FN(malloc_usable_size, size_t (*)(void *));
	in_farmem--;
	if (!a.malloc || !a.calloc || !a.realloc || !a.free) {
		/* No allocator after us (cannot happen with glibc): glibc's own entry points. */
		a.malloc = __libc_malloc;
		a.calloc = __libc_calloc;
		a.realloc = __libc_realloc;
		a.free = __libc_free;
		a.memalign = __libc_memalign;
		a.aligned_alloc = __libc_memalign;
		a.posix_memalign = NULL;
		a.valloc = NULL;
	}
	a.glibc = in_libc((void *)a.malloc);
	pthread_mutex_lock(&app_lock);
	if (!atomic_load_explicit(&app_known, memory_order_relaxed)) {
		app = a;
		atomic_store_explicit(&app_known, 1, memory_order_release);
	}
	pthread_mutex_unlock(&app_lock);
	return &app;
}

/* The program's allocator's aligned allocation, by whichever entry point it has. */
static void *app_aligned(const struct app_alloc *a, size_t align, size_t n)
{
	void *p = NULL;

	if (a->memalign)
		return a->memalign(align, n);
	if (a->aligned_alloc)
		return a->aligned_alloc(align, n);
	if (a->posix_memalign) {
		int rc = a->posix_memalign(&p, align, n);
		if (rc) {
			errno = rc;
			return NULL;
		}
	}
	return p;
}

/* --- configuration and the pager ----------------------------------------------- */

/*
 * Reads FARMEM_* once, on whichever hook or constructor comes first: another
 * library's constructor may map memory before ours runs.
 */
static void load_config(void)
{
	char err[512];
	int expect = 0;

	if (atomic_load_explicit(&cfg_state, memory_order_acquire) == 2)
		return;
	if (!atomic_compare_exchange_strong(&cfg_state, &expect, 1)) {
		/* Another thread is reading it: microseconds, no locks, no allocation. */
		while (atomic_load_explicit(&cfg_state, memory_order_acquire) != 2)
			sched_yield();
		return;
	}
	in_farmem++;
	fm_log_prefix = "farmem";
	if (fm_pager_cfg_from_env(&cfg, err, sizeof(err)))
		die_config(err);
	fm_log_level = cfg.log_level;
	if (!cfg.memd[0] || !cfg.secret_len)
		atomic_store(&state, 4); /* loaded without a launcher: stay out of the way */
	in_farmem--;
	atomic_store_explicit(&cfg_state, 2, memory_order_release);
}

/* 1 when a hook may act: not farmem's own call, the configuration read, a launcher present. */
static int hooks_on(void)
{
	if (in_farmem)
		return 0;
	load_config();
	return atomic_load(&state) != 4;
}

/*
 * 1 when a call of the program's may change what the running pager pages: it
 * takes remap_lock. Not in the forking thread while its fork holds the lock
 * (a fork handler of another library's that maps, unmaps or allocates big):
 * nothing else runs those steps meanwhile.
 */
static int remap_locks(void)
{
	pid_t f;

	if (!pager || atomic_load(&state) != 2 || in_farmem)
		return 0;
	f = atomic_load_explicit(&remap_fork_tid, memory_order_relaxed);
	return !f || f != gettid();
}

/*
 * Whatever would act on paged memory waits while a forked child's pager is
 * starting: the ranges it got are being registered, and the shim's books
 * (pager, state) say nothing of them until they are. The eviction that
 * follows (fm_pager_settle) is not waited for: it is the pager's own.
 * The wait is on child_starting, not on start_lock alone: the new thread
 * may not have run yet, and then the lock is free although nothing has
 * been registered.
 */
static void child_wait(void)
{
	if (!atomic_load_explicit(&child_starting, memory_order_acquire) || in_farmem)
		return;
	pthread_mutex_lock(&start_lock);
	while (atomic_load_explicit(&child_starting, memory_order_acquire))
		pthread_cond_wait(&child_started, &start_lock);
	pthread_mutex_unlock(&start_lock);
}

/*
 * From before the pagers' prepare handler (uffd/fork.c, which runs before
 * fork_prepare) until after their parent handler (after fork_parent), so that
 * a remap under way finishes before they look, and none starts until the
 * paged ranges are DONTFORK again: a range grown then would be registered
 * DONTFORK beside a part still DOFORK, and the kernel split the mapping in
 * two (the program's next growing mremap failed with EFAULT).
 */
static void fork_before(void)
{
	child_wait();
	pthread_mutex_lock(&remap_lock);
	atomic_store(&remap_fork_tid, gettid());
}

static void remap_let_go_by_fork(void)
{
	if (atomic_load(&remap_fork_tid)) {
		atomic_store(&remap_fork_tid, 0);
		pthread_mutex_unlock(&remap_lock);
	}
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&arena_lock);
	pthread_mutex_lock(&big_lock);
	pthread_mutex_lock(&pool_lock); /* before resv_lock: pool_open takes it under pool_lock */
	pthread_mutex_lock(&resv_lock);
	pthread_mutex_lock(&heap_lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&heap_lock);
	pthread_mutex_unlock(&resv_lock);
	pthread_mutex_unlock(&pool_lock);
	pthread_mutex_unlock(&big_lock);
	pthread_mutex_unlock(&arena_lock);
}

/*
 * The child's own pager: same configuration as the parent's (cfg is the
 * parent's copy), its own uffd, memd session and spaces, registering the
 * ranges the child got. Registration adopts their pages as resident; then
 * the hooks may go on (a BGSAVE child writes its snapshot at once) while
 * this thread evicts down to the budget. Here, not in the fork handler: a
 * child that calls exec() at once does not wait for any of it (exec ends
 * this thread). Settling in the handler cost a fork+exec of a 256 MiB
 * process at 32 MiB local 0.23 s more; this thread, about 2 ms.
 */
static void *child_pager_main(void *arg)
{
	char err[512];
	struct fm_pager *p = NULL;
	int rc;

	pthread_setname_np(pthread_self(), "farmem-child");
	pthread_mutex_lock(&start_lock);
	rc = fm_pager_start(&cfg, &p, err, sizeof(err));
	if (rc) {
		/* The ranges were never registered here: plain memory, every page as it was at the fork. */
		fm_warn("fork: the child %d cannot start a pager of its own (%s): it keeps the %d paged "
			"range(s) it got in local memory, unpaged", (int)getpid(), err, ninherit);
		atomic_store(&state, 4);
	} else {
		/* Its pages are shared with the parent copy-on-write: a capture would hold the shared one. */
		fm_pager_no_capture(p, "this child of a fork shares its pages with the parent");
		if (cfg.evict_move == 0 && (async_io_user || atomic_load(&raw_async_io)))
			fm_pager_move_out(p, async_io_user ? async_io_user : atomic_load(&raw_async_io));
		for (int k = 0, waits = 0; k < ninherit; k++)
			if ((inherit[k].kernel_waits && !waits++ && !kernel_waits_open(p)) ||
			    fm_pager_register(p, (void *)inherit[k].base, inherit[k].len,
					      FM_REG_NO_SETTLE | (inherit[k].kernel_waits ? FM_REG_KERNEL_WAITS : 0)))
				fm_warn("fork: the child %d keeps %#lx+%zu MiB in local memory, unpaged", (int)getpid(),
					(unsigned long)inherit[k].base, inherit[k].len >> 20);
		/* Now that the inherited ranges are regions: a move's refusal there is sharing, not a pin. */
		fm_pager_no_capture(p, "this child of a fork shares its pages with the parent");
		pager = p;
		atomic_store(&state, 2);
	}
	atomic_store_explicit(&child_starting, 0, memory_order_release);
	pthread_cond_broadcast(&child_started);
	pthread_mutex_unlock(&start_lock);
	if (!rc)
		fm_pager_settle(p);
	return NULL;
}

/*
 * A process that runs as root may give up root before its heaps grow
 * (memcached -u, a server's workers), and then could not open the
 * userfaultfd of the heaps: one is opened at start and handed to the pager
 * when it starts (fm_pager_kernel_waits_reserve). -1: none.
 */
static int waits_spare = -1;

/* The pager that just started takes the spare, if it is still ours. Caller is in farmem. */
static void waits_spare_give(struct fm_pager *pg)
{
	int fd = waits_spare;

	waits_spare = -1;
	/* Still ours: a program may close every fd it did not open itself, or put its own on the number. */
	if (fd >= 0 && fm_fd_owned(fd))
		fm_pager_kernel_waits_give(pg, fd);
}

static void fork_child(void)
{
	int was = atomic_load(&state);
	pthread_attr_t attr;
	pthread_t th;
	int rc;

	/* The parent's: it serves the parent's memory only. Unless the program put a file of its own there. */
	if (waits_spare >= 0)
		fm_fd_close(waits_spare);
	waits_spare = -1;

	pthread_mutex_unlock(&heap_lock);
	pthread_mutex_unlock(&resv_lock);
	pthread_mutex_unlock(&pool_lock);
	pthread_mutex_unlock(&big_lock);
	pthread_mutex_unlock(&arena_lock);
	remap_let_go_by_fork();
	/* Held by a thread of the parent (one starting a pager) that does not exist here. */
	pthread_mutex_init(&start_lock, NULL);
	pthread_cond_init(&child_started, NULL);
	atomic_store(&child_starting, 0);
	/*
	 * The parent's pager is not this process's: its threads do not exist
	 * here, its uffd and memd session are the parent's. The child got the
	 * paged ranges as plain memory, every page present (uffd/fork.c), or
	 * none of them.
	 */
	pager = NULL;
	in_farmem++;
	ninherit = was == 2 || was == 1 ? fm_fork_child(inherit, MAX_INHERIT) : 0;
	in_farmem--;
	if (was == 1)
		was = 0; /* a start under way in the parent: none here */
	if (was != 2) {
		atomic_store(&state, was);
		return;
	}
	if (!ninherit) {
		/* Nothing paged came along: a pager of its own starts with the child's first big mapping. */
		atomic_store(&state, 0);
		return;
	}
	atomic_store(&state, 1);
	atomic_store(&child_starting, 1);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = fm_thread_create(&th, &attr, child_pager_main, NULL);
	pthread_attr_destroy(&attr);
	if (rc) {
		atomic_store(&child_starting, 0);
		atomic_store(&state, 4);
		in_farmem++;
		fm_warn("fork: the child %d cannot start a pager of its own (a thread: %s): it keeps the "
			"paged memory it got in local memory, unpaged", (int)getpid(), strerror(rc));
		in_farmem--;
	}
}

static void atfork_register(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	fm_fork_before_prepare(fork_before);
	fm_fork_after_parent(remap_let_go_by_fork);
}

/*
 * The shim's fork handlers before the pager's (uffd/fork.c registers those
 * when a pager starts): a child's handlers run in the order they were
 * registered, and fork_child must take the paged ranges the child got
 * (fm_fork_child) before the pager's own handler forgets them. A library's
 * constructor that runs before ours may start the pager (tcmalloc's first
 * sbrk): the child of a fork then had no pager and kept its memory unpaged.
 */
static void atfork_once(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, atfork_register);
}

__attribute__((constructor)) static void preload_init(void)
{
	fm_io_bind();
	/* Before the program's threads: in a JVM, before the agent's first descriptor. */
	fm_fds_widen();
	/* The main thread; the pager may start later, in another thread (which unblocks it too). */
	fm_monitor_unblock_sigbus();
	load_config();
	app_alloc();
	/* Decided here, before the program's threads exist (heaps_keep). */
	if (reserved_paged() && geteuid() == 0 && cfg.fault_mode != FM_FAULT_THREAD)
		waits_spare = fm_pager_kernel_waits_reserve();
	atomic_store(&ctor_ran, 1);
	/*
	 * An allocator of the executable's maps its memory under its own locks,
	 * and a pager started there allocates through it (the dynamic loader's
	 * dlopen, a thread's TLS): it starts now, while nothing holds them.
	 */
	if (app.foreign && hooks_on()) {
		struct fm_pager *pg = get_pager();

		/* Its mappings are paged where the kernel waits (allocator_mapping): that handler starts now too. */
		if (pg) {
			in_farmem++;
			kernel_waits_open(pg);
			in_farmem--;
		}
	}
	atfork_once();
}

/* A library whose I/O the kernel does after the submitting call returned. */
static int async_io_seen(struct dl_phdr_info *info, size_t size, void *data)
{
	static const char *const libs[] = { "liburing", "libaio.so" };

	(void)size;
	for (size_t k = 0; info->dlpi_name && k < sizeof(libs) / sizeof(libs[0]); k++)
		if (strstr(info->dlpi_name, libs[k])) {
			*(const char **)data = libs[k];
			return 1;
		}
	return 0;
}

/*
 * The program, or a library it was linked with, uses liburing or libaio
 * (loaded by the time anything is paged), or set up io_uring or native AIO
 * through syscall() before: which one, or NULL.
 */
static const char *links_async_io(void)
{
	const char *lib = NULL;

	dl_iterate_phdr(async_io_seen, &lib);
	return lib ? lib : atomic_load(&raw_async_io);
}

void fm_shim_async_io(const char *what)
{
	struct fm_pager *pg;

	if (atomic_exchange(&raw_async_io, what))
		return;
	/* A pager started already serves faults as it does; what it can still do is keep pinned pages. */
	pg = atomic_load(&state) == 2 ? fm_preload_pager_nowait() : NULL;
	if (pg && cfg.evict_move == 0) {
		in_farmem++;
		fm_pager_move_out(pg, what);
		in_farmem--;
	}
}

/*
 * The launcher said who it ran as, and this process is someone else: 1.
 * 2 if the launcher was root and opened its sockets to the processes of
 * its run that give up root (it set control_key): this one may page.
 */
static int other_user(void)
{
	char *end;
	unsigned long uid;

	if (!cfg.launch_uid[0])
		return 0;
	uid = strtoul(cfg.launch_uid, &end, 10);
	if (*end || uid == (unsigned long)getuid())
		return 0;
	return uid == 0 && cfg.control_key[0] ? 2 : 1;
}

static struct fm_pager *get_pager(void)
{
	char err[512];
	int s;

	child_wait();
	s = atomic_load(&state);
	if (s == 2)
		return pager;
	if (s != 0)
		return NULL;
	/*
	 * Another library's constructor, before ours, inside an allocator of
	 * the executable's: a start here would re-enter it (app_alloc's
	 * `foreign`). What it maps now stays local; ours starts the pager.
	 */
	if (!atomic_load(&ctor_ran) && app_alloc()->foreign)
		return NULL;
	pthread_mutex_lock(&start_lock);
	if (atomic_load(&state) == 0) {
		int rc;
		atomic_store(&state, 1);
		in_farmem++;
		const char *aio = links_async_io();
		if (aio && cfg.fault_mode == FM_FAULT_AUTO) {
			/*
			 * io_uring's and native AIO's kernel side touches buffers
			 * after the submitting call returned (or fails the request
			 * with EFAULT at submission): no cover can make them resident
			 * in time, so the kernel must be able to wait for a page
			 * (docs/pager.md).
			 */
			cfg.fault_mode = FM_FAULT_THREAD;
			fm_info("the program uses %s: faults are served by handler threads", aio);
		} else if (aio && cfg.fault_mode == FM_FAULT_SIGNAL) {
			/* fio's libaio and io_uring engines under --fault signal: "Bad address" */
			fm_warn("the program uses %s, and fault=signal was asked for: a request whose buffer "
				"is not resident when the kernel gets to it fails with EFAULT (`--fault auto` "
				"serves this program's faults with handler threads; docs/compatibility.md)", aio);
		}
		int other = other_user();
		const char *why = other == 1 ? "it runs as another user than farmem run, whose memd it cannot reach"
				  : !fm_uffd_probe() ? "userfaultfd is not available to it" : NULL;
		/* A hook may start the pager before our constructor ran. */
		fm_io_bind();
		atfork_once();
		rc = why ? -1 : fm_pager_start(&cfg, &pager, err, sizeof(err));
		if (rc && (why || other)) {
			/*
			 * A process that gave up root on its way here (runuser, a
			 * server's workers) may reach neither the private memd nor
			 * userfaultfd, or not the full one fault=thread needs.
			 * `farmem run` checked its own; this one runs unpaged, said
			 * once, rather than dying in the middle of the program's work.
			 */
			fm_warn("process %d (uid %d) is not paged: %s; it keeps all of its memory local "
				"(docs/compatibility.md)", (int)getpid(), (int)getuid(), why ? why : err);
			atomic_store(&state, 4);
			in_farmem--;
			pthread_mutex_unlock(&start_lock);
			return NULL;
		}
		if (!rc)
			waits_spare_give(pager);
		/* The kernel pins the pages of its O_DIRECT I/O: eviction must see the pins. */
		if (!rc && aio && cfg.evict_move == 0) {
			async_io_user = aio; /* a fork's child pages as its parent does */
			fm_pager_move_out(pager, aio);
		}
		in_farmem--;
		if (rc) {
			pthread_mutex_unlock(&start_lock);
			die_config(err);
		}
		atomic_store(&state, 2);
	}
	pthread_mutex_unlock(&start_lock);
	return atomic_load(&state) == 2 ? pager : NULL;
}

struct fm_pager *fm_preload_pager(void)
{
	child_wait();
	return atomic_load(&state) == 2 ? pager : NULL;
}

struct fm_pager *fm_preload_pager_nowait(void)
{
	return atomic_load_explicit(&state, memory_order_acquire) == 2 ? pager : NULL;
}

EXPORT int farmem_preload_yield(void)
{
	int s;

	load_config();
	pthread_mutex_lock(&start_lock);
	s = atomic_load(&state);
	if (s == 0)
		atomic_store(&state, 4);
	pthread_mutex_unlock(&start_lock);
	if (s == 0)
		fm_info("process %d is a JVM: the JVMTI agent pages its heap, the shim stays out", (int)getpid());
	return s == 0 || s == 4 ? 0 : -EBUSY;
}

static int qualifies(size_t len, int prot, int flags, int fd)
{
	return hooks_on() && len >= cfg.threshold && fd == -1 && (flags & MAP_ANONYMOUS) &&
	       (flags & MAP_PRIVATE) && !(flags & (MAP_SHARED | MAP_HUGETLB | MAP_STACK | MAP_LOCKED)) &&
	       (prot & PROT_WRITE);
}

static int allocator_mapping(const void *caller);

/*
 * Page a mapping: as a region the kernel waits on when waits is set, or when
 * the code that mapped it (caller, or NULL) is the program's allocator
 * (allocator_mapping); where faults come by SIGBUS otherwise.
 */
static void maybe_register(void *p, size_t len, int waits, const void *caller)
{
	struct fm_pager *pg = get_pager();

	if (!pg)
		return;
	len = (len + PAGE - 1) & ~(size_t)(PAGE - 1);
	in_farmem++;
	if (!waits && !allocator_mapping(caller))
		fm_pager_register(pg, p, len, 0);
	else if (kernel_waits_open(pg))
		fm_pager_register(pg, p, len, FM_REG_KERNEL_WAITS);
	/* else it stays local, as glibc's heaps do then */
	in_farmem--;
}

/*
 * The mapping is made by the program's allocator, when that is not glibc's
 * (jemalloc, mimalloc, one in the executable; tcmalloc grows the break, sbrk): its small blocks
 * hold what the program hands the kernel (paths, struct stat, socket
 * addresses), as glibc's heaps do, and are paged where the kernel waits for a
 * page. With faults by SIGBUS a system call on an evicted one failed with
 * EFAULT: Redis (jemalloc) at --threshold 1M stopped at its start, "Fatal
 * error loading the DB: Bad address", its file name in a cold block. Known
 * by the code that called mmap: the object that defines the allocator.
 */
static int allocator_mapping(const void *caller)
{
	static _Atomic(const void *) alloc_base;
	const struct app_alloc *a = app_alloc();
	const void *base = atomic_load_explicit(&alloc_base, memory_order_relaxed);
	Dl_info info;

	if (!caller || a->glibc)
		return 0;
	if (!base) {
		if (!dladdr((void *)a->malloc, &info) || !info.dli_fbase)
			return 0;
		base = info.dli_fbase;
		atomic_store_explicit(&alloc_base, base, memory_order_relaxed);
	}
	return dladdr(caller, &info) && info.dli_fbase == base;
}

/*
 * Reserved memory holds a program's small blocks (glibc's heaps of its
 * threads, below, at malloc), and those hold what it hands the kernel:
 * paths, struct stat, pollfd and epoll arrays, socket addresses. With
 * faults served in the faulting thread a system call on an evicted page
 * would fail with EFAULT unless a cover made it resident, and most of those
 * calls have none. So reserved memory is paged where the kernel waits for
 * a page: with fault=signal, as regions of their own userfaultfd, served by
 * a handler thread (FM_REG_KERNEL_WAITS), which needs a userfaultfd for
 * kernel faults (root, /dev/userfaultfd, vm.unprivileged_userfaultfd).
 * Decided once, without starting a pager.
 */
static atomic_int reserved_mode; /* 0 not yet decided, 1 paged, 2 local */

/* The pager's userfaultfd for FM_REG_KERNEL_WAITS is open (or opens now). Caller is in farmem. */
static int kernel_waits_open(struct fm_pager *pg)
{
	static atomic_int told;
	char err[256];

	if (fm_pager_open_kernel_waits(pg, err, sizeof(err)) == 0)
		return 1;
	if (!atomic_exchange(&told, 1))
		fm_warn("the malloc heaps of this program's threads (or its allocator's mappings) stay local: %s", err);
	return 0;
}

static int reserved_paged(void)
{
	int m = atomic_load_explicit(&reserved_mode, memory_order_relaxed);
	const char *tunables;
	struct fm_pager *pg;

	if (m)
		return m == 1;
	if (!hooks_on())
		return 0; /* farmem's own code: not a decision */
	in_farmem++;
	pg = fm_preload_pager_nowait();
	/* glibc's huge-page heaps are not the 64 MiB heaps heap_block knows. */
	tunables = getenv("GLIBC_TUNABLES");
	if (!cfg.reservations || (tunables && strstr(tunables, "glibc.malloc.hugetlb=2"))) {
		m = 2;
	} else {
		m = pg ? (fm_pager_kernel_waits(pg) ? 1 : 2)
		       : cfg.fault_mode == FM_FAULT_THREAD ? 1
		       : cfg.fault_mode == FM_FAULT_AUTO && links_async_io() ? 1 : 2;
		if (m == 2 && fm_pager_kernel_waits_possible())
			m = 1;
		if (m == 2)
			fm_info("the malloc heaps of this program's threads, and memory reserved PROT_NONE, stay "
				"local: this process cannot open a userfaultfd for faults taken in system calls "
				"(root, /dev/userfaultfd or vm.unprivileged_userfaultfd=1; docs/compatibility.md)");
	}
	/* Before anything is paged, and before most threads could trim a heap that will be. */
	if (m == 1)
		heaps_keep();
	in_farmem--;
	atomic_store(&reserved_mode, m);
	return m == 1;
}

/* Leave [a, e) out of every reservation. Caller holds resv_lock. */
static void resv_cut_locked(uintptr_t a, uintptr_t e)
{
	int n = atomic_load(&nresv);

	for (int k = 0; k < nrefused; k++)
		if (a < refused[k].hi && e > refused[k].lo)
			refused[k--] = refused[--nrefused];

	for (int k = 0; k < n; k++) {
		uintptr_t b = resv[k].base, t = resv[k].end;
		if (e <= b || a >= t)
			continue;
		if (a > b && e < t && n < MAX_RESV) {
			/* A hole in the middle: two reservations. */
			resv[n].base = e;
			resv[n].end = t;
			n++;
		}
		if (a > b) {
			resv[k].end = a;
		} else if (e < t) {
			resv[k].base = e;
		} else {
			resv[k--] = resv[--n];
		}
	}
	atomic_store(&nresv, n);
}

static void resv_cut(const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PAGE - 1);

	if (!atomic_load_explicit(&nresv, memory_order_relaxed))
		return;
	pthread_mutex_lock(&resv_lock);
	resv_cut_locked(a, (uintptr_t)addr + len);
	pthread_mutex_unlock(&resv_lock);
}

static void resv_add(const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, e = a + ((len + PAGE - 1) & ~(size_t)(PAGE - 1));

	pthread_mutex_lock(&resv_lock);
	/* An earlier one there was unmapped behind our back (glibc frees a heap with its own munmap). */
	resv_cut_locked(a, e);
	if (atomic_load(&nresv) < MAX_RESV) {
		int n = atomic_load(&nresv);
		resv[n].base = a;
		resv[n].end = e;
		atomic_store(&nresv, n + 1);
	}
	pthread_mutex_unlock(&resv_lock);
}

/* The reservation that holds all of [a, e): 1 and its bounds, or 0. */
static int resv_holding(uintptr_t a, uintptr_t e, uintptr_t *base, uintptr_t *end)
{
	int found = 0;

	if (!atomic_load_explicit(&nresv, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&resv_lock);
	for (int k = 0; k < atomic_load(&nresv) && !found; k++)
		if (a >= resv[k].base && e <= resv[k].end) {
			*base = resv[k].base;
			*end = resv[k].end;
			found = 1;
		}
	pthread_mutex_unlock(&resv_lock);
	return found;
}

/* Private anonymous PROT_NONE memory whose place the kernel picks: address space reserved for later. */
static int reserving(int prot, int flags, int fd)
{
	return hooks_on() && cfg.reservations && fd == -1 && prot == PROT_NONE && (flags & MAP_ANONYMOUS) &&
	       (flags & MAP_PRIVATE) && !(flags & (MAP_SHARED | MAP_HUGETLB | MAP_STACK | MAP_LOCKED | MAP_FIXED));
}

static int reserves(size_t len, int prot, int flags, int fd)
{
	return len >= cfg.threshold && reserving(prot, flags, fd);
}

/*
 * The pool: small reservations placed together. V8 reserves Node's
 * JavaScript heap a 256 KiB page at a time, each page a PROT_NONE mapping of
 * its own (508 KiB, trimmed to its alignment): far below any threshold, and
 * more of them than the tables of reservations and regions hold, so none of
 * it was paged before session 40. A private anonymous PROT_NONE mapping from
 * POOL_LEAST up to the threshold, made without MAP_FIXED or MAP_32BIT (an
 * address given is a hint: V8's are random), is placed in one window the
 * shim reserved instead, which is a reservation like the others: its parts
 * are paged as they are made writable. What the program unmaps there is
 * reserved again, PROT_NONE, not unmapped, so that nothing else is placed
 * inside the window, and its pages are free for the next such mapping. A
 * full pool, or one that could not be reserved, leaves the mapping to the
 * kernel, local.
 */
#define POOL_MAX (8ull << 30)
#define POOL_LEAST (256u << 10)
static uint64_t pool_pages;         /* its size, set before pool_base: POOL_MAX, less under a low RLIMIT_AS */
static _Atomic uintptr_t pool_base; /* 0: not reserved */
static uint64_t *pool_used;         /* a bit per page of the pool, set while the program holds it */
static uint64_t pool_next;          /* the page the next search starts at */
static int pool_failed;
static int pool_full;               /* a lap found no room: none is looked for until something comes back */
static int pool_told;

static int pool_holds(const void *addr, size_t len)
{
	uintptr_t b = atomic_load_explicit(&pool_base, memory_order_acquire), a = (uintptr_t)addr;

	return b && a >= b && len <= pool_pages * PAGE && a - b <= pool_pages * PAGE - len;
}

/* [addr, addr+len) has a part in the pool (pool_holds: wholly inside). */
static int pool_overlaps(const void *addr, size_t len)
{
	uintptr_t b = atomic_load_explicit(&pool_base, memory_order_acquire), a = (uintptr_t)addr;

	return b && len && len <= UINTPTR_MAX - a && a < b + pool_pages * PAGE && a + len > b;
}

static void pool_mark(uint64_t first, uint64_t n, int used)
{
	for (uint64_t i = first; i < first + n; i++) {
		if (used)
			pool_used[i / 64] |= 1ull << (i % 64);
		else
			pool_used[i / 64] &= ~(1ull << (i % 64));
	}
}

/*
 * Under pool_lock. The first page stays unused: a reservation's first page
 * is never paged (resv_commit). Sized to RLIMIT_AS as the arena is.
 */
static void pool_open(void)
{
	size_t size;
	void *w = map_within_as_limit(POOL_MAX, POOL_MAX / 128, PROT_NONE, &size), *bits = MAP_FAILED;

	if (w != MAP_FAILED)
		bits = sys_mmap(NULL, size / PAGE / 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (bits == MAP_FAILED) {
		if (w != MAP_FAILED)
			syscall(SYS_munmap, w, (size_t)size);
		pool_failed = 1;
		fm_info("small reservations stay local: the pool's address space (%llu MiB at least) could not be reserved",
			(unsigned long long)(POOL_MAX / 128 >> 20));
		return;
	}
	pool_used = bits;
	pool_pages = size / PAGE;
	pool_mark(0, 1, 1);
	pool_next = 1;
	resv_add(w, size);
	atomic_store_explicit(&pool_base, (uintptr_t)w, memory_order_release);
}

/*
 * An address given is a hint only, which the kernel need not take either.
 * MAP_32BIT is not: a JIT that jumps with 32-bit offsets asks for the first
 * 2 GiB, and the pool lies higher up.
 */
static int pools(const void *addr, size_t len, int prot, int flags, int fd)
{
	(void)addr;
	return len >= POOL_LEAST && len < cfg.threshold && reserving(prot, flags, fd) &&
	       !(flags & (MAP_FIXED_NOREPLACE | MAP_32BIT | MAP_GROWSDOWN)) && reserved_paged();
}

/* len bytes of the pool, PROT_NONE and never touched since they were reserved; NULL when full. */
static void *pool_take(size_t len)
{
	uint64_t n = (len + PAGE - 1) / PAGE, run = 0, i;
	void *p = NULL;

	pthread_mutex_lock(&pool_lock);
	if (!pool_base && !pool_failed)
		pool_open();
	if (pool_base && !pool_full) {
		/* Next fit: one lap, a run never crossing the end. */
		i = pool_next;
		for (uint64_t seen = 0; seen <= pool_pages && !p; seen++, i++) {
			if (i == pool_pages) {
				i = 0;
				run = 0;
			}
			if (i % 64 == 0 && pool_used[i / 64] == ~0ull && i + 64 <= pool_pages) {
				i += 63;
				seen += 63;
				run = 0;
				continue;
			}
			if (pool_used[i / 64] & (1ull << (i % 64))) {
				run = 0;
			} else if (++run == n) {
				pool_mark(i + 1 - n, n, 1);
				pool_next = i + 1 == pool_pages ? 1 : i + 1;
				p = (void *)(pool_base + (i + 1 - n) * PAGE);
			}
		}
		/* A lap reads the whole bitmap (up to 2M bits): not again at every mapping while the pool stays full. */
		pool_full = !p;
		if (pool_full && !pool_told++)
			fm_info("the pool of small reservations (%llu MiB) is full: those made now stay local",
				(unsigned long long)(pool_pages * PAGE >> 20));
	}
	pthread_mutex_unlock(&pool_lock);
	return p;
}

/*
 * The program let go of [addr, addr+len) of the pool (munmap, or what an
 * mremap left behind): reserved again and free. The pager let go of its
 * pages before.
 *
 * A range given back that ends where the next search starts is where that
 * search starts instead: V8 reserves twice a page and trims what its
 * alignment leaves over, and the next page then begins where this one ends
 * (aligned, so nothing is trimmed from it). Searched from past the trimmed
 * tail, every page left a gap of almost its own size that no page fits, and
 * the pool held half as much.
 */
static int pool_give_back(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PAGE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
	uint64_t first = (a - pool_base) / PAGE, n = (e - a) / PAGE;

	if (sys_mmap((void *)a, e - a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) ==
	    MAP_FAILED)
		return -1;
	pthread_mutex_lock(&pool_lock);
	pool_mark(first, n, 0);
	pool_mark(0, 1, 1); /* never the program's, even when a range that spans the pool's edge gives it back */
	if (first + n == pool_next || (pool_next == 1 && first + n == pool_pages))
		pool_next = first;
	pool_full = 0;
	pthread_mutex_unlock(&pool_lock);
	return 0;
}

/*
 * A reservation up to RESV_WHOLE bytes becomes one region at its first
 * commit (a JVM's heap). A larger one becomes a region per RESV_WINDOW of
 * address space (aligned to it, within the reservation), each at the first
 * commit inside it: a region's books, a byte or two per page, and its space
 * in memd are as large as the region, and a runtime may reserve far more
 * than it will ever commit. GHC's runtime reserves 1 TiB for its heap:
 * memd refused a space that large (at every 1 MiB commit), and none of
 * a Haskell program's heap was paged before session 36.
 */
#define RESV_WHOLE (64ull << 30)
#define RESV_WINDOW (4ull << 30)

static int was_refused(uintptr_t lo, uintptr_t hi)
{
	int found = 0;

	pthread_mutex_lock(&resv_lock);
	for (int k = 0; k < nrefused && !found; k++)
		found = refused[k].lo <= lo && hi <= refused[k].hi;
	pthread_mutex_unlock(&resv_lock);
	return found;
}

/* Windows refused one after another are one entry. */
static void remember_refused(uintptr_t lo, uintptr_t hi)
{
	int k;

	pthread_mutex_lock(&resv_lock);
	for (k = 0; k < nrefused && refused[k].hi != lo && refused[k].lo != hi; k++)
		;
	if (k < nrefused) {
		refused[k].lo = lo < refused[k].lo ? lo : refused[k].lo;
		refused[k].hi = hi > refused[k].hi ? hi : refused[k].hi;
	} else if (nrefused < MAX_REFUSED) {
		refused[nrefused].lo = lo;
		refused[nrefused].hi = hi;
		nrefused++;
	}
	pthread_mutex_unlock(&resv_lock);
}

/* Page [a, e) of the reservation [base, end), registering the regions that hold it first where there are none. */
static void resv_page(struct fm_pager *pg, uintptr_t a, uintptr_t e, uintptr_t base, uintptr_t end)
{
	while (a < e) {
		uintptr_t lo = base, hi = end, part;

		if (end - base > RESV_WHOLE) {
			uintptr_t w = a & ~(uintptr_t)(RESV_WINDOW - 1);
			lo = w > base ? w : base;
			hi = w + RESV_WINDOW < end ? w + RESV_WINDOW : end;
		}
		part = hi < e ? hi : e;
		if (fm_pager_commit(pg, (void *)a, part - a) == -ENOENT && kernel_waits_open(pg) &&
		    !was_refused(lo, hi)) {
			/* The first part made writable: its window becomes a region, nothing of it paged yet. */
			int rc = fm_pager_register(pg, (void *)lo, hi - lo, FM_REG_SPARSE | FM_REG_KERNEL_WAITS);

			if (rc && rc != -EEXIST)
				remember_refused(lo, hi);
			else
				fm_pager_commit(pg, (void *)a, part - a);
		}
		a = part;
	}
}

/*
 * [addr, addr+len) was made writable. Inside a reservation it becomes paged
 * memory: 1, whether or not the pager took it. Else 0.
 *
 * The reservation's first page stays local: an allocator keeps its header
 * there, as glibc does in its heaps.
 */
static int resv_commit(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PAGE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PAGE - 1) & ~(uintptr_t)(PAGE - 1), base = 0, end = 0;
	struct fm_pager *pg;

	if (in_farmem || !resv_holding(a, e, &base, &end))
		return 0;
	if (a < base + PAGE)
		a = base + PAGE;
	if (a >= e || !reserved_paged() || !(pg = get_pager()))
		return 1;
	in_farmem++;
	resv_page(pg, a, e, base, end);
	in_farmem--;
	return 1;
}

/* caller: the code that called mmap (allocator_mapping), or NULL. */
static void *mmap_hooked(void *addr, size_t len, int prot, int flags, int fd, off_t off, const void *caller)
{
	void *p;

	if (pools(addr, len, prot, flags, fd) && (p = pool_take(len)))
		return p;

	/*
	 * MAP_FIXED over paged memory replaces it, like munmap then mmap: the
	 * pager lets go of the range first. Otherwise the evictor may drop pages
	 * of the new mapping it picked in the old one (allocators decommit and
	 * recommit this way). A failed MAP_FIXED leaves the old contents
	 * undefined anyway.
	 */
	if ((flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE) && pager && atomic_load(&state) == 2 &&
	    !in_farmem && fm_pager_owns(pager, addr, len))
		fm_pager_unregister(pager, addr, len);
	p = sys_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED)
		return MAP_FAILED;
	if (reserves(len, prot, flags, fd)) {
		resv_add(p, len);
		return p;
	}
	if ((flags & MAP_FIXED) && atomic_load_explicit(&nresv, memory_order_relaxed)) {
		/* Part of a reservation committed or decommitted in place (HotSpot's way), or given to something else. */
		int anon = fd == -1 && (flags & MAP_ANONYMOUS) && (flags & MAP_PRIVATE) &&
			   !(flags & (MAP_SHARED | MAP_HUGETLB | MAP_STACK | MAP_LOCKED));
		if (anon && (prot & PROT_WRITE) && resv_commit(p, len))
			return p;
		/* Fresh PROT_NONE memory stays reserved; anything else leaves the reservation. */
		if (!anon || (prot & PROT_WRITE))
			resv_cut(p, len);
	}
	if (qualifies(len, prot, flags, fd))
		maybe_register(p, len, 0, caller);
	return p;
}

/*
 * A mapping the pager takes or lets go of is mapped and registered (or let go
 * and mapped over) under remap_lock, as munmap lets go and unmaps: a fork
 * between the steps would give the child a paged range unpaged, or books for
 * a range no longer mapped.
 */
static void *mmap_cover(void *addr, size_t len, int prot, int flags, int fd, off_t off, const void *caller)
{
	void *p;
	int locked, e;

	child_wait();
	locked = remap_locks() && ((flags & MAP_FIXED) || qualifies(len, prot, flags, fd));
	if (locked)
		pthread_mutex_lock(&remap_lock);
	p = mmap_hooked(addr, len, prot, flags, fd, off, caller);
	e = errno;
	if (locked)
		pthread_mutex_unlock(&remap_lock);
	errno = e;
	return p;
}

/*
 * The program unmaps [addr, addr+len), some or all of it in the pool: the
 * pool's part is given back, reserved again, and the kernel unmaps the rest
 * (an unmap of two neighbouring mappings at once, one of them the pool's).
 * Unmapped whole, the pool's part would be a hole in which the kernel could
 * place another mapping at addresses the pool then hands out again.
 */
static long pool_let_go(void *addr, size_t len)
{
	uintptr_t b = atomic_load_explicit(&pool_base, memory_order_acquire), a = (uintptr_t)addr;
	uintptr_t e = a + ((len + PAGE - 1) & ~(size_t)(PAGE - 1)), t = b + pool_pages * PAGE;
	uintptr_t ia = a > b ? a : b, ie = e < t ? e : t;
	long r = 0;

	if (a < ia)
		r = syscall(SYS_munmap, addr, ia - a);
	if (!r && ie < e)
		r = syscall(SYS_munmap, (void *)ie, e - ie);
	if (!r) {
		if (a < ia)
			resv_cut(addr, ia - a);
		if (ie < e)
			resv_cut((void *)ie, e - ie);
		r = pool_give_back((void *)ia, ie - ia);
	}
	return r;
}

static int munmap_cover(void *addr, size_t len)
{
	long r;
	int locked;

	child_wait();
	locked = remap_locks() && fm_pager_owns(pager, addr, len);
	if (locked) {
		pthread_mutex_lock(&remap_lock);
		fm_pager_unregister(pager, addr, len);
	}
	if (((uintptr_t)addr & (PAGE - 1)) == 0 && pool_overlaps(addr, len)) {
		r = pool_let_go(addr, len);
		if (locked)
			pthread_mutex_unlock(&remap_lock);
		return (int)r;
	}
	r = syscall(SYS_munmap, addr, len);
	if (locked)
		pthread_mutex_unlock(&remap_lock);
	if (!r)
		resv_cut(addr, len);
	return r ? -1 : 0;
}

/*
 * Call fn with each line of /proc/self/maps, in address order, until it
 * returns nonzero: that value, 0 at the end, -1 when the maps cannot be read
 * (fn's values must be other than -1).
 * No allocation: the shim's hooks call it.
 */
static int maps_each(int (*fn)(const char *line, void *arg), void *arg)
{
	char buf[4096];
	size_t have = 0;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -1;
	while (!rc) {
		char *line, *nl;
		ssize_t n = fm_sys_read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n < 0)
			rc = -1;
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		for (line = buf; !rc && (nl = strchr(line, '\n')); line = nl + 1) {
			*nl = 0;
			rc = fn(line, arg);
		}
		have = (size_t)(buf + have - line);
		if (have == sizeof(buf) - 1) {
			rc = -1; /* a line longer than the buffer (a path of thousands of bytes): not read */
			break;
		}
		memmove(buf, line, have);
	}
	close(fd);
	return rc;
}

/* Private anonymous memory with no name: read-write, or read-only (mprotect made it so). */
#define ANON_RW 1
#define ANON_RO 2

/* The mapping that holds address a: its bounds, and what kind of anonymous memory it is (ANON_*), or 0. */
struct mapping {
	uintptr_t a, start, end;
	int anon;
};

/* 1: the line's mapping holds m->a (m filled in); 2: a lies in a gap below it. */
static int mapping_at(const char *line, void *arg)
{
	struct mapping *m = arg;
	unsigned long start, end, inode;
	char perms[5];
	int name = 0;

	if (sscanf(line, "%lx-%lx %4s %*x %*s %lu %n", &start, &end, perms, &inode, &name) != 4 || end <= m->a)
		return 0;
	if (start > m->a)
		return 2;
	m->start = start;
	m->end = end;
	m->anon = inode || !name || line[name] ? 0
		  : !strcmp(perms, "rw-p")          ? ANON_RW
		  : !strcmp(perms, "r--p")          ? ANON_RO
						    : 0;
	return 1;
}

/*
 * 1 when one mapping holds [a, e), with *anon its kind of anonymous memory
 * (ANON_*, 0 for any other); 0 when not, -1 when the maps cannot be read.
 */
static int one_mapping(uintptr_t a, uintptr_t e, int *anon)
{
	struct mapping m = { .a = a };
	int rc = maps_each(mapping_at, &m);

	*anon = rc == 1 ? m.anon : 0;
	if (rc < 0)
		return -1;
	return rc == 1 && e <= m.end;
}

/*
 * An mremap that moves [old, old+old_len), a paged range that is all of or
 * part of one private anonymous read-write mapping with no name (anon_rw,
 * one_mapping's ANON_RW): what the kernel would carry along is its bytes.
 * A new paged mapping of new_len (at
 * `at` with MREMAP_FIXED, else where the kernel puts it) takes its pages over
 * where they are (fm_pager_move: resident pages by UFFDIO_MOVE, remote ones
 * inside memd, untouched ones stay untouched), then the old range is let go
 * and unmapped. Nothing comes home, so the budget holds. Without
 * MREMAP_FIXED only a growth moves this way, and it moves even where the
 * kernel would have grown the range in place, which MREMAP_MAYMOVE allows.
 * NULL with the old range unchanged when it cannot (the range spans
 * mappings or regions, or has pages the pager does not manage): the caller
 * goes the general way, and the kernel says what is wrong.
 */
static void *move_by_pager(void *old, size_t old_len, size_t new_len, void *at, int anon_rw)
{
	size_t had = (old_len + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t want = (new_len + PAGE - 1) & ~(size_t)(PAGE - 1);
	void *q;
	int ok;

	if (!had || (!at && want <= had) || !anon_rw)
		return NULL;
	/* MAP_FIXED over paged memory: the pager lets go of it first, as mmap's hook does. */
	if (at && fm_pager_owns(pager, at, want))
		fm_pager_unregister(pager, at, want);
	q = sys_mmap(at, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
	if (q == MAP_FAILED)
		return NULL;
	in_farmem++;
	ok = fm_pager_register(pager, q, want, 0) == 0;
	if (ok && fm_pager_move(pager, q, old, had < want ? had : want) == 0) {
		fm_pager_unregister(pager, old, had);
		syscall(SYS_munmap, old, had);
	} else {
		if (ok)
			fm_pager_unregister(pager, q, want);
		syscall(SYS_munmap, q, want);
		q = NULL;
	}
	in_farmem--;
	return q;
}

/*
 * The kernel moves the range, or grows it where it is, and the pager's books
 * go with it (fm_pager_remap): a page in memd stays there, untouched. 1 when
 * done (*out the new place, or MAP_FAILED with the kernel's errno), 0 when
 * the call is not one for it (nothing changed). A move that may also stay
 * tries to grow in place first, as the kernel does.
 */
static int remap_by_pager(void *old, size_t old_len, size_t new_len, int flags, void *at, void **out)
{
	size_t had = (old_len + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t want = (new_len + PAGE - 1) & ~(size_t)(PAGE - 1);
	int rc = -EOPNOTSUPP;

	if (!had || want < had || ((flags & MREMAP_DONTUNMAP) && want != had))
		return 0;
	/* MAP_FIXED over paged memory: the pager lets go of it first, as mmap's hook does. */
	if (at && fm_pager_owns(pager, at, want))
		fm_pager_unregister(pager, at, want);
	in_farmem++;
	if ((flags & MREMAP_MAYMOVE) && !at && want > had) {
		rc = fm_pager_remap(pager, old, had, want, 0, NULL, out);
		if (rc && rc != -ENOSPC)
			rc = -EOPNOTSUPP; /* no room where it is: it moves */
	}
	if (rc == -EOPNOTSUPP)
		rc = fm_pager_remap(pager, old, had, want, flags & (MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP), at,
				    out);
	in_farmem--;
	if (rc == -EOPNOTSUPP || rc == -ENOSPC)
		return 0;
	if (rc) {
		errno = -rc;
		*out = MAP_FAILED;
	}
	return 1;
}

/*
 * An mremap that only shrinks [old, old+old_len) where it lies: the kernel
 * unmaps the tail before it looks at anything else, so the call cannot fail
 * after the tail was let go but for the munmap's own ENOMEM (a mapping too
 * many), as munmap can. Arguments it would refuse go the general way.
 */
static int shrinks_in_place(const void *old, size_t old_len, size_t new_len, int flags)
{
	size_t keep = (new_len + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t had = (old_len + PAGE - 1) & ~(size_t)(PAGE - 1);

	return !((uintptr_t)old & (PAGE - 1)) && new_len && keep < had && !(flags & ~MREMAP_MAYMOVE);
}

/*
 * Arguments the kernel refuses before it changes anything (mm/mremap.c): bad
 * flags or alignment, MREMAP_DONTUNMAP with a new size (EINVAL), and a
 * range that grows or stays in place but is not inside one mapping
 * (EFAULT; one: one_mapping's answer). A paged range need not come home
 * for them.
 */
static int refused_at_once(const void *old, size_t old_len, size_t new_len, int flags, const void *new_addr,
			   int one)
{
	const int known = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
	uintptr_t a = (uintptr_t)old, to = (uintptr_t)new_addr;

	if ((flags & ~known) || ((flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) && !(flags & MREMAP_MAYMOVE)) ||
	    (a & (PAGE - 1)) || !new_len || new_len > SIZE_MAX - PAGE || old_len > SIZE_MAX - PAGE)
		return 1;
	/* MREMAP_FIXED: a new place that is not aligned or overlaps the old range. */
	if ((flags & MREMAP_FIXED) && ((to & (PAGE - 1)) || (to < a + old_len && a < to + new_len)))
		return 1;
	/* MREMAP_DONTUNMAP moves, it does not resize. */
	if ((flags & MREMAP_DONTUNMAP) && old_len != new_len)
		return 1;
	return !(flags & MREMAP_FIXED) && new_len >= old_len && one == 0;
}

/*
 * An mremap in the pool: the range comes home and the kernel moves plain
 * memory; what it leaves behind in the window is reserved again. Rare (V8
 * does not mremap its pages), so done the simple way.
 */
static void *pool_remap(void *old, size_t old_len, size_t new_len, int flags, void *new_addr, int paged)
{
	uintptr_t o = (uintptr_t)old;
	size_t keep = (new_len + PAGE - 1) & ~(size_t)(PAGE - 1); /* what a shrink in place leaves */
	void *p;

	if (paged) {
		fm_pager_fetch_all(pager, old, old_len);
		fm_pager_unregister(pager, old, old_len);
	}
	p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	if (p == MAP_FAILED) {
		int e = errno;

		if (paged)
			resv_commit(old, old_len);
		errno = e;
		return MAP_FAILED;
	}
	if ((uintptr_t)p != o && !(flags & MREMAP_DONTUNMAP))
		pool_give_back(old, old_len);
	else if ((uintptr_t)p == o && keep < old_len)
		pool_give_back((char *)old + keep, old_len - keep);
	/* What stays the program's at the old address is paged again. */
	if (paged && ((uintptr_t)p == o || (flags & MREMAP_DONTUNMAP)))
		resv_commit(old, (uintptr_t)p == o && new_len < old_len ? new_len : old_len);
	if ((uintptr_t)p != o && !pool_holds(p, new_len) && hooks_on() && new_len >= cfg.threshold)
		maybe_register(p, new_len, 0, NULL);
	return p;
}

static void *mremap_hooked(void *old, size_t old_len, size_t new_len, int flags, void *new_addr)
{
	void *p;
	int paged, waits, one = -1, anon = 0;

	paged = pager && atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, old, old_len);
	if (old_len && ((uintptr_t)old & (PAGE - 1)) == 0 && pool_holds(old, old_len))
		return pool_remap(old, old_len, new_len, flags, new_addr, paged);
	/* Whether one mapping holds the range, and of what kind: the maps are read once. */
	if (paged && old_len <= SIZE_MAX - PAGE)
		one = one_mapping((uintptr_t)old, (uintptr_t)old + old_len, &anon);

	if (paged && refused_at_once(old, old_len, new_len, flags, new_addr, one))
		return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	if (paged && shrinks_in_place(old, old_len, new_len, flags)) {
		/*
		 * The kernel unmaps the tail and moves nothing: a munmap of the
		 * tail (let go first, as munmap does), and the head stays paged.
		 */
		uintptr_t keep = ((uintptr_t)new_len + PAGE - 1) & ~(uintptr_t)(PAGE - 1);

		fm_pager_unregister(pager, (char *)old + keep, old_len - keep);
		p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
		if (p != MAP_FAILED)
			resv_cut((char *)old + keep, old_len - keep);
		return p;
	}
	if (paged && one == 1 && anon && remap_by_pager(old, old_len, new_len, flags, new_addr, &p)) {
		if (p != MAP_FAILED) {
			resv_cut(old, old_len);
			resv_cut(p, new_len);
		}
		return p;
	}
	if (paged && !(flags & MREMAP_DONTUNMAP) && (flags & MREMAP_MAYMOVE) &&
	    (p = move_by_pager(old, old_len, new_len, flags & MREMAP_FIXED ? new_addr : NULL,
			       one == 1 && anon == ANON_RW))) {
		resv_cut(old, old_len);
		resv_cut(p, new_len);
		return p;
	}
	/* Paged where the kernel waits (an allocator's), or in thread mode, where it always does. */
	waits = paged && !fm_pager_kernel_waits(pager) && !fm_pager_io_needed(pager, old, old_len);
	if (paged) {
		/* Bring the range home, let the kernel move plain memory, then page it again, as it was. */
		fm_pager_fetch_all(pager, old, old_len);
		fm_pager_unregister(pager, old, old_len);
	}
	p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	if (p == MAP_FAILED) {
		int e = errno;  /* glibc's syscall() set it to the kernel's */

		if (paged)
			maybe_register(old, old_len, waits, NULL);
		errno = e;
		return MAP_FAILED;
	}
	/* Moved or resized: neither the old nor the new range is reserved any more. */
	resv_cut(old, old_len);
	resv_cut(p, new_len);
	if (paged || (hooks_on() && new_len >= cfg.threshold))
		maybe_register(p, new_len, waits, NULL);
	return p;
}

static void *mremap_cover(void *old, size_t old_len, size_t new_len, int flags, void *new_addr)
{
	void *p;
	int locked, e;

	child_wait();
	locked = remap_locks();
	if (locked)
		pthread_mutex_lock(&remap_lock);
	p = mremap_hooked(old, old_len, new_len, flags, new_addr);
	e = errno;
	if (locked)
		pthread_mutex_unlock(&remap_lock);
	errno = e;
	return p;
}

/*
 * The pager reads a page to evict it, and a page the program may not read
 * would fault in the evictor (a SIGSEGV that ended the program). A paged
 * range made unreadable comes home first and leaves paged memory. Inside a
 * reservation it is paged again when it is made writable again; elsewhere
 * it stays plain memory.
 */
static int mprotect_cover(void *addr, size_t len, int prot)
{
	child_wait();
	if (!(prot & PROT_READ) && pager && atomic_load(&state) == 2 && !in_farmem &&
	    fm_pager_owns(pager, addr, len)) {
		fm_pager_fetch_all(pager, addr, len);
		fm_pager_unregister(pager, addr, len);
	}
	if (syscall(SYS_mprotect, addr, len, prot))
		return -1;
	if ((prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE) &&
	    atomic_load_explicit(&nresv, memory_order_relaxed) && hooks_on())
		resv_commit(addr, len);
	return 0;
}

#ifndef MADV_POPULATE_READ /* 5.14 */
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

static int madvise_cover(void *addr, size_t len, int advice)
{
	long r;

	child_wait();
	if (pager && atomic_load(&state) == 2 && !in_farmem &&
	    (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE ||
	     advice == MADV_DONTNEED_LOCKED) &&
	    !((uintptr_t)addr & (PG_SIZE - 1)) && fm_pager_owns(pager, addr, len)) {
		/* The kernel's drop made while the pager holds the pages (ranges.c says why). */
		int rc = fm_pager_forget(pager, addr, len, advice);

		if (rc) {
			errno = -rc;
			return -1;
		}
		return 0;
	}
	if (pager && atomic_load(&state) == 2 && !in_farmem && advice == MADV_MERGEABLE)
		fm_pager_no_capture(pager, "the program asked KSM to merge paged memory (MADV_MERGEABLE)");
	/*
	 * Prefaulting paged memory is the pager's call, not the program's: the
	 * kernel would fail it with EFAULT where faults raise SIGBUS, and
	 * elsewhere fetch every remote page only to evict most of them again
	 * over a budget smaller than the range. A hint, so it succeeds; a range
	 * partly paged is not prefaulted at all.
	 */
	if ((advice == MADV_POPULATE_READ || advice == MADV_POPULATE_WRITE) && pager &&
	    atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, addr, len))
		return 0;
	/*
	 * Paged memory stays MADV_DONTFORK and MADV_NOHUGEPAGE, as the pager
	 * made it: a fork's child gets it through fork.c, and the pager moves
	 * 4 KiB pages. A part grown in place is made so by the pager, and one
	 * flipped back would split the range in two mappings: the program's
	 * next mremap of all of it failed with EFAULT (stress-ng's mremap
	 * stressor). Other advice leaves both parts alike.
	 */
	if ((advice == MADV_DOFORK || advice == MADV_HUGEPAGE) && pager && atomic_load(&state) == 2 && !in_farmem &&
	    fm_pager_owns(pager, addr, len))
		return 0;
	r = syscall(SYS_madvise, addr, len, advice);  /* -1 with the kernel's errno */
	return r ? -1 : 0;
}

/*
 * A program with a userfaultfd of its own (QEMU's postcopy, Firecracker's
 * snapshot restore, stress-ng) registers its memory with it. A range is
 * registered with one userfaultfd at a time, and the kernel refused the
 * program's with EBUSY where the pager had it: such a range comes home and
 * leaves paged memory first, as one made unreadable does. farmem's own
 * registrations go to the kernel directly (uffd_ops.c).
 */
FM_IO_NEXT(ioctl_next, "ioctl");

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	/* libc's own: the pager's UFFDIO_COPY on the fault path comes through here too. */
	int (*libc_ioctl)(int, unsigned long, ...) = (int (*)(int, unsigned long, ...))fm_io_next(&ioctl_next);
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (req == UFFDIO_REGISTER && arg && pager && atomic_load(&state) == 2 && !in_farmem) {
		const struct uffdio_register *r = arg;
		void *a = (void *)(uintptr_t)r->range.start;
		size_t len = r->range.len;
		child_wait();
		if (fm_pager_owns(pager, a, len)) {
			fm_info("the program registers %#lx+%zu with a userfaultfd of its own: that range comes "
				"home and stays local", (unsigned long)r->range.start, len);
			fm_pager_fetch_all(pager, a, len);
			fm_pager_unregister(pager, a, len);
		}
	}
	return libc_ioctl ? libc_ioctl(fd, req, arg) : (int)syscall(SYS_ioctl, fd, req, arg);
}

void *fm_shim_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off, const void *caller)
{
	return mmap_cover(addr, len, prot, flags, fd, off, caller);
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap_cover(addr, len, prot, flags, fd, off, __builtin_return_address(0));
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap_cover(addr, len, prot, flags, fd, off, __builtin_return_address(0));
}

EXPORT int munmap(void *addr, size_t len)
{
	return munmap_cover(addr, len);
}

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	return mremap_cover(old, old_len, new_len, flags, new_addr);
}

EXPORT int mprotect(void *addr, size_t len, int prot)
{
	return mprotect_cover(addr, len, prot);
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	return madvise_cover(addr, len, advice);
}

/*
 * Locked memory cannot be paged: the kernel refuses to drop a locked page, and
 * with MCL_FUTURE every later mapping, the pager's own included, is faulted in
 * whole at mmap. The program learns that its lock failed, as it would under a
 * low RLIMIT_MEMLOCK (mlockall(2) says EPERM, mlock(2) EAGAIN), and the user
 * learns why; its memory stays correct.
 */
static void lock_refused(const char *call, int which)
{
	static atomic_int told[3];
	char line[300];
	int n;

	/* Once a process for each call: stress-ng's mlock stressor asked 600 times in 4 s. */
	if (atomic_exchange(&told[which], 1))
		return;
	n = snprintf(line, sizeof(line),
			 "farmem: warning: %s refused: this program's memory is paged by farmem, and locked "
			 "memory cannot be paged (run it without memory locking, or without farmem)\n", call);

	if (fm_sys_write(2, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
		n = 0;
}

EXPORT int mlockall(int flags)
{
	long r;

	if (hooks_on()) {
		lock_refused("mlockall", 0);
		errno = EPERM;
		return -1;
	}
	r = syscall(SYS_mlockall, flags);
	return r ? -1 : 0;
}

static int lock_range(long nr, const void *addr, size_t len, unsigned flags)
{
	long r;

	child_wait();
	if (hooks_on() && pager && atomic_load(&state) == 2 && fm_pager_owns(pager, addr, len)) {
		lock_refused(nr == SYS_mlock ? "mlock of paged memory" : "mlock2 of paged memory", nr == SYS_mlock ? 1 : 2);
		errno = EAGAIN;
		return -1;
	}
	r = nr == SYS_mlock ? syscall(SYS_mlock, addr, len) : syscall(SYS_mlock2, addr, len, flags);
	return r ? -1 : 0;
}

EXPORT int mlock(const void *addr, size_t len)
{
	return lock_range(SYS_mlock, addr, len, 0);
}

EXPORT int mlock2(const void *addr, size_t len, unsigned int flags)
{
	return lock_range(SYS_mlock2, addr, len, flags);
}

/* --- io_uring registered buffers ------------------------------------------------ */

/*
 * A registered ("fixed") buffer is pinned by the kernel while it is
 * registered, and fixed I/O goes to the pinned pages, not through the
 * program's page table: after an eviction the program would read memd's old
 * copy, and what the I/O wrote would be lost. Registering paged memory fails
 * as the kernel fails memory it cannot register (-EOPNOTSUPP), with a warning.
 * Through liburing only: a program that makes the system call itself, or
 * links liburing statically, is not covered (docs/compatibility.md).
 */
struct io_uring;

static int iovecs_paged(const struct iovec *iov, unsigned n)
{
	child_wait();
	if (!iov || !pager || atomic_load(&state) != 2 || in_farmem)
		return 0;
	for (unsigned i = 0; i < n; i++)
		if (iov[i].iov_base && iov[i].iov_len && fm_pager_owns(pager, iov[i].iov_base, iov[i].iov_len))
			return 1;
	return 0;
}

static int uring_refused(void)
{
	static const char msg[] =
		"farmem: warning: io_uring buffer registration refused: the buffer is paged by farmem, and "
		"the kernel writes a registered buffer behind the pager's back (use plain reads, or run "
		"without farmem)\n";

	if (fm_sys_write(2, msg, sizeof(msg) - 1) < 0)
		return -EOPNOTSUPP;
	return -EOPNOTSUPP;
}

/*
 * liburing's own function after ours, looked up on its first call, not with
 * the covers' (FM_IO_NEXT): a program may dlopen liburing after the shim
 * bound those, and a miss is not kept. Only the program's threads call these.
 */
static void *uring_next(_Atomic(void *) *slot, const char *name)
{
	void *f = atomic_load(slot);

	if (!f) {
		f = dlsym(RTLD_NEXT, name);
		atomic_store(slot, f);
	}
	return f;
}

static _Atomic(void *) next_register_buffers, next_register_buffers_tags, next_update_tag, next_register;

EXPORT int io_uring_register_buffers(struct io_uring *ring, const struct iovec *iov, unsigned n)
{
	int (*next)(struct io_uring *, const struct iovec *, unsigned) =
		(int (*)(struct io_uring *, const struct iovec *, unsigned))uring_next(
			&next_register_buffers, "io_uring_register_buffers");

	if (iovecs_paged(iov, n))
		return uring_refused();
	return next ? next(ring, iov, n) : -ENOSYS;
}

EXPORT int io_uring_register_buffers_tags(struct io_uring *ring, const struct iovec *iov,
					  const uint64_t *tags, unsigned n)
{
	int (*next)(struct io_uring *, const struct iovec *, const uint64_t *, unsigned) =
		(int (*)(struct io_uring *, const struct iovec *, const uint64_t *, unsigned))uring_next(
			&next_register_buffers_tags, "io_uring_register_buffers_tags");

	if (iovecs_paged(iov, n))
		return uring_refused();
	return next ? next(ring, iov, tags, n) : -ENOSYS;
}

EXPORT int io_uring_register_buffers_update_tag(struct io_uring *ring, unsigned off, const struct iovec *iov,
						const uint64_t *tags, unsigned n)
{
	int (*next)(struct io_uring *, unsigned, const struct iovec *, const uint64_t *, unsigned) =
		(int (*)(struct io_uring *, unsigned, const struct iovec *, const uint64_t *, unsigned))uring_next(
			&next_update_tag, "io_uring_register_buffers_update_tag");

	if (iovecs_paged(iov, n))
		return uring_refused();
	return next ? next(ring, off, iov, tags, n) : -ENOSYS;
}

/*
 * liburing's raw io_uring_register(2), for the opcodes that register buffers:
 * IORING_REGISTER_BUFFERS (0: an iovec array), _BUFFERS2 (15: struct
 * io_uring_rsrc_register) and _BUFFERS_UPDATE (16: struct io_uring_rsrc_update2).
 */
EXPORT int io_uring_register(unsigned fd, unsigned opcode, const void *arg, unsigned nr)
{
	int (*next)(unsigned, unsigned, const void *, unsigned) =
		(int (*)(unsigned, unsigned, const void *, unsigned))uring_next(&next_register, "io_uring_register");
	const struct iovec *iov = NULL;
	unsigned n = 0;

	if (arg && opcode == 0) {
		iov = arg;
		n = nr;
	} else if (arg && opcode == 15) {
		const struct { uint32_t nr, flags; uint64_t resv2, data, tags; } *r = arg;
		iov = (const struct iovec *)(uintptr_t)r->data;
		n = r->nr;
	} else if (arg && opcode == 16) {
		const struct { uint32_t offset, resv; uint64_t data, tags; uint32_t nr, resv2; } *u = arg;
		iov = (const struct iovec *)(uintptr_t)u->data;
		n = u->nr;
	}
	if (iovecs_paged(iov, n))
		return uring_refused();
	return next ? next(fd, opcode, arg, nr) : -ENOSYS;
}

/* --- big malloc blocks ------------------------------------------------------ */

static int big_find(const void *p)
{
	for (int i = 0; i < atomic_load(&nbig); i++)
		if (big[i].addr == (uintptr_t)p)
			return i;
	return -1;
}

/* Larger alignments than this are left to the program's allocator. */
#define BIG_MAX_ALIGN (1ul << 30)

/*
 * A block of its own mapping, aligned to align (a power of two): an aligned
 * one is cut out of a larger mapping (memcached -L asks for its whole cache
 * at 2 MiB alignment for huge pages).
 */
static void *big_alloc(size_t n, size_t align)
{
	size_t len = (n + PAGE - 1) & ~(size_t)(PAGE - 1);
	size_t extra = align > PAGE ? align - PAGE : 0;
	uintptr_t a;
	void *p;
	/* Mapped and registered as one step to a fork, as the mmap hook does. */
	int locked = remap_locks();

	if (locked)
		pthread_mutex_lock(&remap_lock);
	pthread_mutex_lock(&big_lock);
	if (atomic_load(&nbig) >= MAX_BIG) {
		pthread_mutex_unlock(&big_lock);
		if (locked)
			pthread_mutex_unlock(&remap_lock);
		return NULL;
	}
	p = sys_mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		pthread_mutex_unlock(&big_lock);
		if (locked)
			pthread_mutex_unlock(&remap_lock);
		return NULL;
	}
	a = ((uintptr_t)p + extra) & ~(uintptr_t)(align > PAGE ? align - 1 : PAGE - 1);
	if (a > (uintptr_t)p)
		syscall(SYS_munmap, p, a - (uintptr_t)p);
	if ((uintptr_t)p + len + extra > a + len)
		syscall(SYS_munmap, a + len, (uintptr_t)p + len + extra - (a + len));
	p = (void *)a;
	big[atomic_load(&nbig)].addr = (uintptr_t)p;
	big[atomic_load(&nbig)].len = len;
	atomic_fetch_add(&nbig, 1);
	pthread_mutex_unlock(&big_lock);
	maybe_register(p, len, 0, NULL);
	if (locked)
		pthread_mutex_unlock(&remap_lock);
	return p;
}

/* Returns 1 if p was one of ours (and frees it). */
static int big_free(void *p)
{
	uintptr_t a;
	size_t len;
	int i;

	if (!p || atomic_load(&nbig) == 0)
		return 0;
	pthread_mutex_lock(&big_lock);
	i = big_find(p);
	if (i < 0) {
		pthread_mutex_unlock(&big_lock);
		return 0;
	}
	a = big[i].addr;
	len = big[i].len;
	big[i] = big[atomic_load(&nbig) - 1];
	atomic_fetch_sub(&nbig, 1);
	pthread_mutex_unlock(&big_lock);
	munmap((void *)a, len);
	return 1;
}

static size_t big_len(const void *p)
{
	size_t len = 0;
	int i;

	if (atomic_load(&nbig) == 0)
		return 0;
	pthread_mutex_lock(&big_lock);
	i = big_find(p);
	if (i >= 0)
		len = big[i].len;
	pthread_mutex_unlock(&big_lock);
	return len;
}

/*
 * A big block that grows: its pages go to the new big block q where they are
 * (fm_pager_move, as an mremap that grows), not through a copy that would
 * read every remote page back and write it out again. 0 when they cannot
 * (q is not a big block, or either is not all paged): the caller copies.
 */
static int big_moved(void *q, const void *p, size_t len)
{
	int rc;

	if (!remap_locks() || big_len(q) < len)
		return 0;
	in_farmem++;
	pthread_mutex_lock(&remap_lock);
	rc = fm_pager_move(pager, q, p, len);
	pthread_mutex_unlock(&remap_lock);
	in_farmem--;
	return rc == 0;
}

/*
 * A big block that grows to n bytes by the kernel's mremap, its books going
 * along (fm_pager_remap): in place where there is room, else moved; a page
 * in memd stays in its slot, nothing is copied. NULL when the pager cannot
 * (the block is not all paged, or already in many parts): the caller moves
 * the pages into a new block, or copies them.
 */
static void *big_remapped(void *p, size_t old, size_t n)
{
	size_t len = (n + PAGE - 1) & ~(size_t)(PAGE - 1);
	void *q = NULL;
	int done, i;

	if (!remap_locks() || len <= old)
		return NULL;
	pthread_mutex_lock(&remap_lock);
	done = remap_by_pager(p, old, len, MREMAP_MAYMOVE, NULL, &q);
	pthread_mutex_unlock(&remap_lock);
	if (!done || q == MAP_FAILED)
		return NULL;
	pthread_mutex_lock(&big_lock);
	i = big_find(p);
	if (i >= 0) {
		big[i].addr = (uintptr_t)q;
		big[i].len = len;
	}
	pthread_mutex_unlock(&big_lock);
	return q;
}

/* A block the shim maps itself: a big one, when the program's allocator is glibc's. */
static int use_big(size_t n)
{
	return hooks_on() && n >= cfg.threshold && app_alloc()->glibc;
}

/*
 * glibc's heaps: the small blocks of a program's threads live in heaps of
 * their arenas, 64 MiB reserved PROT_NONE and made writable as they grow.
 * glibc maps and grows them with its own internal mmap and mprotect, which
 * no hook sees; what the shim does see is each block glibc returns. Its
 * chunk header says whether it lies in such a heap (NON_MAIN_ARENA) and the
 * heap is the aligned 64 MiB around it (glibc's own heap_for_ptr). A heap is
 * registered as a sparse region the first time a block of it is seen, and
 * what the arena uses of it (the heap_info's size) is committed, again each
 * time a block lies past what was. The heap's first page stays local: it
 * holds the heap's header and the arena's, with the arena's lock, the
 * hottest page of the heap.
 */
#define GLIBC_HEAP_MAX (64ul << 20)     /* HEAP_MAX_SIZE: 2 * DEFAULT_MMAP_THRESHOLD_MAX */
#define GLIBC_CHUNK_MMAPPED 2ul
#define GLIBC_CHUNK_NON_MAIN_ARENA 4ul
#define MAX_HEAPS 512                   /* as many as the pager has region slots (FM_RESMAP_SLOTS) */
#define HEAP_STEP (1ul << 20)           /* committed ahead of the last block seen */
#define HEAP_SKIP UINTPTR_MAX           /* paged_to of a heap the pager would not take */

/* The head of glibc's heap_info (malloc/arena.c). */
struct glibc_heap_info {
	void *ar_ptr;
	void *prev;
	size_t size;
	size_t mprotect_size;
};

static struct { _Atomic uintptr_t base, paged_to; } heaps[MAX_HEAPS];
static atomic_int nheaps;
static TLS int heap_last;              /* 1 + the index of the heap this thread saw last */

static int heap_index(uintptr_t base)
{
	int n = atomic_load(&nheaps);

	for (int k = 0; k < n; k++)
		if (atomic_load_explicit(&heaps[k].base, memory_order_relaxed) == base)
			return k;
	if (n == MAX_HEAPS)
		return -1;
	atomic_store(&heaps[n].paged_to, base + PAGE);
	atomic_store(&heaps[n].base, base);
	atomic_store(&nheaps, n + 1);
	return n;
}

/*
 * glibc gives a heap's free pages back with its own madvise and unmaps a
 * free heap with its own munmap (heap_trim, malloc_trim), which no hook sees:
 * the pager would find pages gone that its books hold, in the evictor's
 * hands. Once a heap is paged glibc keeps them: a trim threshold larger
 * than any heap, and a top pad of a whole heap, which is also what glibc
 * asks before it lets a heap go. The program's own mallopt of either, and
 * its malloc_trim, are then left undone.
 */
static atomic_int heaps_kept;

static void heaps_keep(void)
{
	if (atomic_exchange(&heaps_kept, 1))
		return;
	__libc_mallopt(M_TRIM_THRESHOLD, INT_MAX);
	__libc_mallopt(M_TOP_PAD, (int)GLIBC_HEAP_MAX);
	/*
	 * Either turns off glibc's moving mmap threshold, which blocks up to
	 * 32 MiB would have reached after their first free: their place is a
	 * heap, where they are paged, not a mapping of glibc's own, where they
	 * are not (the shim maps those of at least --threshold itself).
	 */
	__libc_mallopt(M_MMAP_THRESHOLD, (int)(GLIBC_HEAP_MAX / 2));
}

EXPORT int mallopt(int param, int value)
{
	if (atomic_load(&heaps_kept) && (param == M_TRIM_THRESHOLD || param == M_TOP_PAD || param == M_MMAP_THRESHOLD))
		return 1;
	return __libc_mallopt(param, value);
}

EXPORT int malloc_trim(size_t pad)
{
	FM_IO_NEXT(next, "malloc_trim");
	int (*trim)(size_t);

	if (atomic_load(&heaps_kept))
		return 0;
	trim = (int (*)(size_t))fm_io_next(&next);
	return trim ? trim(pad) : 0;
}

/*
 * glibc's main heap: the small blocks of the main thread (and of any thread
 * while it has no arena of its own) come from the brk heap, which grows up
 * from the program's first break. Once the heaps have passed --threshold
 * (small_passed) it is paged like a thread's heap: one sparse region from the
 * first break up to the next mapping (at most BRK_SPAN), committed up to a
 * step past the last block seen and never past the break, as a region the
 * kernel waits for. Growth of the break past the region, and a main heap that
 * glibc had to continue in mappings of its own (the break could not grow),
 * stay local.
 */
#define BRK_SPAN (4ul << 30)

static _Atomic uintptr_t brk_seen_to;  /* before the heaps are paged: how far the main heap was looked at */
static _Atomic uintptr_t brk_paged_to; /* 0 not yet paged, HEAP_SKIP never */
static uintptr_t brk_base, brk_end;    /* the region, under brk_lock */
static pthread_mutex_t brk_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * glibc's heaps are paged once, together, they have grown past --threshold:
 * a program with a few MiB of small blocks pays nothing, not even a pager
 * (nor does a JVM that a script started, whose own threads' blocks come
 * before its agent asks the shim to stand aside). Until then each heap's
 * paged_to (and brk_seen_to) only marks how far it was looked at, a step at
 * a time, and small_seen adds the steps up.
 */
static atomic_size_t small_seen;
static atomic_int small_paging;

/* n more bytes of heap seen: 1 when the heaps are paged, 2 when this call passed the threshold. */
static int small_passed(size_t n)
{
	int no = 0;

	if (atomic_load(&small_paging))
		return 1;
	if (atomic_fetch_add(&small_seen, n) + n < cfg.threshold)
		return 0;
	return atomic_compare_exchange_strong(&small_paging, &no, 1) ? 2 : 1;
}

static void brk_grew(uintptr_t block, uintptr_t chunk_end);

/* Commit heap k's [PAGE, used): registered as a region the kernel waits for, at its first commit. Caller holds heap_lock. */
static void heap_commit(struct fm_pager *pg, int k, size_t used)
{
	uintptr_t base = atomic_load(&heaps[k].base);

	in_farmem++;
	/* The whole of what it uses: a look at the state bytes of what is paged already. */
	if (fm_pager_commit(pg, (void *)(base + PAGE), used - PAGE) == -ENOENT && kernel_waits_open(pg) &&
	    fm_pager_register(pg, (void *)base, GLIBC_HEAP_MAX, FM_REG_SPARSE | FM_REG_KERNEL_WAITS) == 0)
		fm_pager_commit(pg, (void *)(base + PAGE), used - PAGE);
	/* Taken, or never will be (the region table is full, or the range is paged as something else). */
	atomic_store(&heaps[k].paged_to, fm_pager_owns(pg, (void *)(base + PAGE), used - PAGE) ? base + used : HEAP_SKIP);
	in_farmem--;
}

/* Every heap seen so far, as far as it was looked at. Caller holds heap_lock. */
static void heaps_page_seen_locked(struct fm_pager *pg)
{
	for (int j = 0; j < atomic_load(&nheaps); j++) {
		uintptr_t to = atomic_load(&heaps[j].paged_to), base = atomic_load(&heaps[j].base);
		if (to != HEAP_SKIP && to > base + PAGE)
			heap_commit(pg, j, to - base);
	}
}

static void heap_grew(uintptr_t base, uintptr_t chunk_end)
{
	const struct glibc_heap_info *hi = (const void *)base;
	struct fm_pager *pg;
	uintptr_t to;
	size_t size, used;
	int k, passed = 0;

	if (!reserved_paged())
		return;
	pthread_mutex_lock(&heap_lock);
	k = heap_index(base);
	if (k < 0)
		goto out;
	heap_last = k + 1;
	to = atomic_load(&heaps[k].paged_to);
	size = __atomic_load_n(&hi->size, __ATOMIC_RELAXED);
	if (to == HEAP_SKIP || chunk_end <= to || size > GLIBC_HEAP_MAX || !hi->ar_ptr)
		goto out;
	/*
	 * Up to a step past the block: the arena's top runs on to the heap's
	 * end, untouched, and paged it would count in a budget given as a share
	 * of the paged memory. What glibc writes past it meanwhile (the top's
	 * header) is adopted by the next commit.
	 */
	used = ((chunk_end - base) + HEAP_STEP) & ~(HEAP_STEP - 1);
	if (used > size)
		used = (size + PAGE - 1) & ~(size_t)(PAGE - 1);
	if (used < chunk_end - base)
		used = (chunk_end - base + PAGE - 1) & ~(size_t)(PAGE - 1);
	if (!atomic_load(&small_paging)) {
		/* Looked at up to here; paged, with every heap seen, once they pass the threshold together. */
		atomic_store(&heaps[k].paged_to, base + used);
		passed = small_passed(base + used - to);
		if (passed && (pg = get_pager()))
			heaps_page_seen_locked(pg);
		goto out;
	}
	if ((pg = get_pager()))
		heap_commit(pg, k, used);
out:
	pthread_mutex_unlock(&heap_lock);
	/* The main heap too, as far as it was looked at (outside heap_lock: brk_grew takes brk_lock). */
	to = atomic_load(&brk_seen_to);
	if (passed == 2 && to)
		brk_grew(to - 1, to - 1);
}

struct above_break {
	uintptr_t base, cur, *next;
};

static int first_above_break(const char *line, void *arg)
{
	struct above_break *ab = arg;
	unsigned long start;

	/* The maps are in address order: the first mapping that starts past the break. */
	if (sscanf(line, "%lx-", &start) != 1 || start < ab->cur || start <= ab->base)
		return 0;
	if (start < *ab->next)
		*ab->next = start;
	return 1;
}

/* BRK_SPAN, or a quarter of the address space a limit (ulimit -v) leaves: the span is a space in memd, mapped here. */
static uintptr_t brk_span(void)
{
	struct rlimit as;

	if (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY && as.rlim_cur / 4 < BRK_SPAN)
		return (uintptr_t)(as.rlim_cur / 4) & ~(uintptr_t)(GLIBC_HEAP_MAX - 1);
	return BRK_SPAN;
}

/* The first break (/proc/self/stat's start_brk) and the start of the next mapping above the break. */
static int brk_bounds(uintptr_t *base, uintptr_t *next)
{
	char buf[4096], *f;
	uintptr_t cur = (uintptr_t)syscall(SYS_brk, 0);
	int field;

	if (fm_read_file("/proc/self/stat", buf, sizeof(buf)) < 0)
		return -1;
	/* After the command name, which may hold anything: field 3 is the first after its ')'. */
	f = strrchr(buf, ')');
	for (field = 2; f && field < 47; field++)
		f = strchr(f + 1, ' ');
	if (!f || sscanf(f + 1, "%lu", base) != 1 || !*base || *base > cur)
		return -1;
	*next = *base + brk_span();
	return maps_each(first_above_break, &(struct above_break){ .base = *base, .cur = cur, .next = next }) < 0
		       ? -1 : 0;
}

static void brk_grew(uintptr_t block, uintptr_t chunk_end)
{
	struct fm_pager *pg;
	uintptr_t to, top, used;

	if (!reserved_paged() || !(pg = get_pager()))
		return;
	pthread_mutex_lock(&brk_lock);
	to = atomic_load(&brk_paged_to);
	if (to == HEAP_SKIP || (to && chunk_end <= to))
		goto out;
	in_farmem++;
	if (!to) {
		uintptr_t base, next;
		if (!atomic_load(&small_paging))
			goto done; /* not yet */
		if (brk_bounds(&base, &next) || (base & (PAGE - 1)) || !kernel_waits_open(pg) ||
		    fm_pager_register(pg, (void *)base, (next - base) & ~(uintptr_t)(PAGE - 1),
				      FM_REG_SPARSE | FM_REG_KERNEL_WAITS)) {
			fm_info("the main thread's malloc heap stays local");
			atomic_store(&brk_paged_to, HEAP_SKIP);
			goto done;
		}
		brk_base = to = base;
		brk_end = base + ((next - base) & ~(uintptr_t)(PAGE - 1));
	}
	/* A block of a main heap that glibc continued in mappings of its own: not ours. */
	if (block < brk_base || chunk_end > brk_end)
		goto done;
	top = ((uintptr_t)syscall(SYS_brk, 0) + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
	used = brk_base + (((chunk_end - brk_base) + HEAP_STEP) & ~(HEAP_STEP - 1));
	if (used > top)
		used = top;
	if (used > brk_end)
		used = brk_end;
	if (used <= to)
		goto done;
	fm_pager_commit(pg, (void *)to, used - to);
	atomic_store(&brk_paged_to, fm_pager_owns(pg, (void *)(used - PAGE), PAGE) ? used : HEAP_SKIP);
done:
	in_farmem--;
out:
	pthread_mutex_unlock(&brk_lock);
}

/* A block of glibc's main heap (not mapped on its own, not in a thread's heap), past what is paged of it. */
static void brk_block(void *q, uintptr_t end)
{
	uintptr_t seen = atomic_load_explicit(&brk_seen_to, memory_order_relaxed), to;

	struct fm_pager *pg;
	int passed;

	if (!atomic_load(&small_paging)) {
		/* Counted a step at a time: a CAS per MiB of growth, not a lock per block. */
		if (end <= seen || !reserved_paged())
			return;
		to = (end + HEAP_STEP) & ~(HEAP_STEP - 1);
		if (!atomic_compare_exchange_strong(&brk_seen_to, &seen, to) ||
		    !(passed = small_passed(seen ? to - seen : HEAP_STEP)))
			return;
		brk_grew((uintptr_t)q, end);
		/* The threads' heaps too, as far as they were looked at. */
		if (passed == 2 && (pg = get_pager())) {
			pthread_mutex_lock(&heap_lock);
			heaps_page_seen_locked(pg);
			pthread_mutex_unlock(&heap_lock);
		}
		return;
	}
	brk_grew((uintptr_t)q, end);
}

/*
 * sbrk as the program calls it: glibc's malloc grows its main heap by its
 * internal __sbrk and never comes here, but tcmalloc takes its memory so
 * (gperftools' sbrk of its own, which the shim's comes before), and that
 * memory was never paged. What the break grows by is paged as glibc's main
 * heap is, the same region, once the heaps pass --threshold.
 */
EXPORT void *sbrk(intptr_t inc)
{
	FM_IO_NEXT(next, "sbrk");
	void *(*real)(intptr_t) = (void *(*)(intptr_t))fm_io_next(&next);
	void *old;

	if (!real)
		real = __sbrk;
	old = real(inc);
	/* hooks_on: not farmem's own call, a process the shim pages; brk_block asks reserved_paged. */
	if (old != (void *)-1 && inc > 0 && hooks_on()) {
		int e = errno;
		brk_block(old, (uintptr_t)old + (uintptr_t)inc);
		errno = e;
	}
	return old;
}

/* A block glibc's allocator returned: page what its heap has grown to, if it lies in one. */
static inline void *heap_block(void *q)
{
	size_t head;
	uintptr_t base, end;
	int k;

	/* Heaps kept local, or a process the shim does not page (a JVM's agent took it, a pager that could not start). */
	if (!q || !app.glibc || atomic_load_explicit(&reserved_mode, memory_order_relaxed) == 2 ||
	    atomic_load_explicit(&state, memory_order_relaxed) == 4)
		return q;
	head = ((const size_t *)q)[-1];
	end = (uintptr_t)q - 2 * sizeof(size_t) + (head & ~(size_t)7);
	if ((head & (GLIBC_CHUNK_MMAPPED | GLIBC_CHUNK_NON_MAIN_ARENA)) == 0) {
		if (end > atomic_load_explicit(&brk_paged_to, memory_order_relaxed))
			brk_block(q, end);
		return q;
	}
	if ((head & (GLIBC_CHUNK_MMAPPED | GLIBC_CHUNK_NON_MAIN_ARENA)) != GLIBC_CHUNK_NON_MAIN_ARENA)
		return q;
	base = (uintptr_t)q & ~(GLIBC_HEAP_MAX - 1);
	k = heap_last - 1;
	if (k >= 0 && atomic_load_explicit(&heaps[k].base, memory_order_relaxed) == base &&
	    end <= atomic_load_explicit(&heaps[k].paged_to, memory_order_relaxed))
		return q;
	heap_grew(base, end);
	return q;
}

EXPORT void *malloc(size_t n)
{
	if (in_farmem)
		return arena_alloc(n, 16);
	if (use_big(n)) {
		void *p = big_alloc(n, PAGE);
		if (p)
			return p;
	}
	return heap_block(app_alloc()->malloc(n));
}

EXPORT void *calloc(size_t a, size_t b)
{
	size_t n;
	if (__builtin_mul_overflow(a, b, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	if (in_farmem) {
		void *p = arena_alloc(n, 16);
		if (p)
			memset(p, 0, n); /* a block may come back from the free list */
		return p;
	}
	if (use_big(n)) {
		void *p = big_alloc(n, PAGE); /* fresh anonymous memory is zero */
		if (p)
			return p;
	}
	return heap_block(app_alloc()->calloc(a, b));
}

EXPORT void free(void *p)
{
	if (!p)
		return;
	if (arena_owns(p))
		arena_free(p);
	else if (!big_free(p))
		app_alloc()->free(p);
}

EXPORT void *realloc(void *p, size_t n)
{
	size_t old, room;
	void *q;

	if (arena_owns(p))
		return arena_realloc(p, n);
	if (!p)
		return malloc(n); /* a buffer grown from NULL: big at once, it is paged at once */
	old = big_len(p);
	if (old) {
		if (n <= old && n >= cfg.threshold)
			return p;
		/*
		 * Here n > old or n is small. A big block that grows is likely to
		 * grow again (a buffer appended to): half as much again leaves room
		 * for the next growths in place, in address space only (pages nobody
		 * touches cost no memory).
		 */
		room = old + old / 2;
		if (n > old && use_big(n) && (q = big_remapped(p, old, room > n ? room : n)))
			return q;
		q = use_big(n) ? big_alloc(room > n ? room : n, PAGE) : NULL;
		if (!q)
			q = malloc(n);
		if (!q)
			return NULL;
		if (!(n > old && big_moved(q, p, old)))
			memcpy(q, p, n < old ? n : old);
		big_free(p);
		return q;
	}
	if (p && use_big(n)) {
		size_t have = malloc_usable_size(p);
		q = big_alloc(n, PAGE);
		if (q) {
			memcpy(q, p, have < n ? have : n);
			app_alloc()->free(p);
			return q;
		}
	}
	return heap_block(app_alloc()->realloc(p, n));
}

EXPORT void *memalign(size_t align, size_t n)
{
	if (in_farmem)
		return arena_alloc(n, align);
	if (align <= BIG_MAX_ALIGN && use_big(n)) {
		void *p = big_alloc(n, align);
		if (p)
			return p;
	}
	return heap_block(app_aligned(app_alloc(), align, n));
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	const struct app_alloc *a;

	if (in_farmem || (align <= BIG_MAX_ALIGN && use_big(n)))
		return memalign(align, n);
	a = app_alloc();
	return heap_block(a->aligned_alloc ? a->aligned_alloc(align, n) : app_aligned(a, align, n));
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	const struct app_alloc *a;
	void *p;

	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	a = in_farmem ? NULL : app_alloc();
	if (a && a->posix_memalign && !(align <= BIG_MAX_ALIGN && use_big(n))) {
		int rc = a->posix_memalign(out, align, n);
		if (!rc)
			heap_block(*out);
		return rc;
	}
	p = memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

EXPORT void *valloc(size_t n)
{
	const struct app_alloc *a;

	if (in_farmem || use_big(n))
		return memalign(PAGE, n);
	a = app_alloc();
	return heap_block(a->valloc ? a->valloc(n) : app_aligned(a, PAGE, n));
}

EXPORT size_t malloc_usable_size(void *p)
{
	size_t len;

	if (!p)
		return 0;
	if (arena_owns(p))
		return arena_size(p);
	len = big_len(p);
	if (len)
		return len;
	return app_alloc()->usable ? app_alloc()->usable(p) : 0;
}
