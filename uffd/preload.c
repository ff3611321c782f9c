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
#include <malloc.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fm_util.h"
#include "fork.h"
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

static struct fm_pager_cfg cfg;
static atomic_int cfg_state;         /* 0 unread, 1 being read, 2 read */
static struct fm_pager *pager;
static atomic_int state;             /* 0 idle, 1 starting, 2 running, 4 disabled */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
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

static void *sys_mmap(void *a, size_t l, int prot, int fl, int fd, off_t off)
{
	long r = syscall(SYS_mmap, a, l, prot, fl, fd, off);
	return (void *)r;
}

static void die_config(const char *msg)
{
	/* No stdio: this may run inside the program's allocator, holding its locks. */
	char line[600];
	int n = snprintf(line, sizeof(line), "farmem: error: %s\n", msg);

	if (write(2, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
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
static uint8_t arena_cls[ARENA_PAGES];
static size_t arena_used; /* pages handed out, under arena_lock */
static void *arena_list[ARENA_MAX_CLS + 1];
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;

static int arena_owns(const void *p)
{
	uintptr_t b = atomic_load_explicit(&arena_base, memory_order_acquire);

	return b && (uintptr_t)p - b < ARENA_SIZE;
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
		void *m = sys_mmap(NULL, ARENA_SIZE, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if ((long)m < 0 && (long)m > -4096)
			goto out;
		b = (uintptr_t)m;
		atomic_store_explicit(&arena_base, b, memory_order_release);
	}
	if (arena_list[k]) {
		p = arena_list[k];
		arena_list[k] = *(void **)p;
	} else if (k < PAGE_CLS) {
		size_t bs = (size_t)1 << k;

		if (arena_used >= ARENA_PAGES)
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

		if (first + npg > ARENA_PAGES)
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
};

static struct app_alloc app;
static atomic_int app_known;
static pthread_mutex_t app_lock = PTHREAD_MUTEX_INITIALIZER;

#define NEXT(name, type) ((type)dlsym(RTLD_NEXT, name))

static const struct app_alloc *app_alloc(void)
{
	struct app_alloc a;

	if (atomic_load_explicit(&app_known, memory_order_acquire))
		return &app;
	in_farmem++; /* what dlsym allocates is ours */
	a.malloc = NEXT("malloc", void *(*)(size_t));
	a.calloc = NEXT("calloc", void *(*)(size_t, size_t));
	a.realloc = NEXT("realloc", void *(*)(void *, size_t));
	a.free = NEXT("free", void (*)(void *));
	a.memalign = NEXT("memalign", void *(*)(size_t, size_t));
	a.aligned_alloc = NEXT("aligned_alloc", void *(*)(size_t, size_t));
	a.posix_memalign = NEXT("posix_memalign", int (*)(void **, size_t, size_t));
	a.valloc = NEXT("valloc", void *(*)(size_t));
	a.usable = NEXT("malloc_usable_size", size_t (*)(void *));
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
	a.glibc = a.malloc == __libc_malloc;
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
 * Whatever would act on paged memory waits while a forked child's pager is
 * starting: the ranges it got are being registered, and the shim's books
 * (pager, state) say nothing of them until they are. The eviction that
 * follows (fm_pager_settle) is not waited for: it is the pager's own.
 */
static void child_wait(void)
{
	if (!atomic_load_explicit(&child_starting, memory_order_acquire) || in_farmem)
		return;
	pthread_mutex_lock(&start_lock);
	pthread_mutex_unlock(&start_lock);
}

static void fork_prepare(void)
{
	pthread_mutex_lock(&arena_lock);
	pthread_mutex_lock(&big_lock);
}

static void fork_parent(void)
{
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
		for (int k = 0; k < ninherit; k++)
			if (fm_pager_register(p, (void *)inherit[k].base, inherit[k].len, FM_REG_NO_SETTLE))
				fm_warn("fork: the child %d keeps %#lx+%zu MiB in local memory, unpaged", (int)getpid(),
					(unsigned long)inherit[k].base, inherit[k].len >> 20);
		pager = p;
		atomic_store(&state, 2);
	}
	atomic_store_explicit(&child_starting, 0, memory_order_release);
	pthread_mutex_unlock(&start_lock);
	if (!rc)
		fm_pager_settle(p);
	return NULL;
}

static void fork_child(void)
{
	int was = atomic_load(&state);
	pthread_attr_t attr;
	pthread_t th;
	int rc;

	pthread_mutex_unlock(&big_lock);
	pthread_mutex_unlock(&arena_lock);
	/* Held by a thread of the parent (one starting a pager) that does not exist here. */
	pthread_mutex_init(&start_lock, NULL);
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
	rc = __wrap_pthread_create(&th, &attr, child_pager_main, NULL);
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

__attribute__((constructor)) static void preload_init(void)
{
	load_config();
	app_alloc();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	fm_fork_before_prepare(child_wait);
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
 * (loaded by the time anything is paged): which one, or NULL.
 */
static const char *links_async_io(void)
{
	const char *lib = NULL;

	dl_iterate_phdr(async_io_seen, &lib);
	return lib;
}

/* The launcher said who it ran as, and this process is someone else. */
static int other_user(void)
{
	char *end;
	unsigned long uid;

	if (!cfg.launch_uid[0])
		return 0;
	uid = strtoul(cfg.launch_uid, &end, 10);
	return !*end && uid != (unsigned long)getuid();
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
	pthread_mutex_lock(&start_lock);
	if (atomic_load(&state) == 0) {
		int rc;
		atomic_store(&state, 1);
		in_farmem++;
		const char *aio = cfg.fault_mode == FM_FAULT_AUTO ? links_async_io() : NULL;
		if (aio) {
			/*
			 * io_uring's and native AIO's kernel side touches buffers
			 * after the submitting call returned (or fails the request
			 * with EFAULT at submission): no cover can make them resident
			 * in time, so the kernel must be able to wait for a page
			 * (docs/pager.md).
			 */
			cfg.fault_mode = FM_FAULT_THREAD;
			fm_info("%s is loaded: faults are served by handler threads", aio);
		}
		const char *why = other_user() ? "it runs as another user than farmem run, whose memd it cannot reach"
				  : !fm_uffd_probe() ? "userfaultfd is not available to it" : NULL;
		if (why) {
			/*
			 * A process that gave up root on its way here (runuser, a
			 * server's workers) can reach neither the private memd nor,
			 * often, userfaultfd. `farmem run` checked its own; this one
			 * runs unpaged, said once, rather than dying in the middle of
			 * the program's work.
			 */
			fm_warn("process %d (uid %d) is not paged: %s; it keeps all of its memory local "
				"(docs/compatibility.md)", (int)getpid(), (int)getuid(), why);
			atomic_store(&state, 4);
			in_farmem--;
			pthread_mutex_unlock(&start_lock);
			return NULL;
		}
		rc = fm_pager_start(&cfg, &pager, err, sizeof(err));
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

static int qualifies(size_t len, int prot, int flags, int fd)
{
	return hooks_on() && len >= cfg.threshold && fd == -1 && (flags & MAP_ANONYMOUS) &&
	       (flags & MAP_PRIVATE) && !(flags & (MAP_SHARED | MAP_HUGETLB | MAP_STACK | MAP_LOCKED)) &&
	       (prot & PROT_WRITE);
}

static void maybe_register(void *p, size_t len)
{
	struct fm_pager *pg = get_pager();

	if (!pg)
		return;
	len = (len + PAGE - 1) & ~(size_t)(PAGE - 1);
	in_farmem++;
	fm_pager_register(pg, p, len, 0);
	in_farmem--;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *p;

	child_wait();
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

	if ((long)p < 0 && (long)p > -4096) {
		errno = (int)-(long)p;
		return MAP_FAILED;
	}
	if (qualifies(len, prot, flags, fd))
		maybe_register(p, len);
	return p;
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

EXPORT int munmap(void *addr, size_t len)
{
	long r;

	child_wait();
	if (pager && atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, addr, len))
		fm_pager_unregister(pager, addr, len);
	r = syscall(SYS_munmap, addr, len);
	return r ? -1 : 0;
}

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL, *p;
	int paged;
	va_list ap;

	child_wait();
	paged = pager && atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, old, old_len);

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	if (paged) {
		/* Bring the range home, let the kernel move plain memory, then page it again. */
		fm_pager_fetch_all(pager, old, old_len);
		fm_pager_unregister(pager, old, old_len);
	}
	p = (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
	if ((long)p < 0 && (long)p > -4096) {
		errno = (int)-(long)p;
		if (paged)
			maybe_register(old, old_len);
		return MAP_FAILED;
	}
	if (paged || (hooks_on() && new_len >= cfg.threshold))
		maybe_register(p, new_len);
	return p;
}

/*
 * The pager reads a page to evict it, and a page the program may not read
 * would fault in the evictor (a SIGSEGV that ended the program). A paged
 * range made unreadable comes home first and leaves paged memory: plain
 * memory from then on, also when it is made readable again.
 */
EXPORT int mprotect(void *addr, size_t len, int prot)
{
	child_wait();
	if (!(prot & PROT_READ) && pager && atomic_load(&state) == 2 && !in_farmem &&
	    fm_pager_owns(pager, addr, len)) {
		fm_pager_fetch_all(pager, addr, len);
		fm_pager_unregister(pager, addr, len);
	}
	return syscall(SYS_mprotect, addr, len, prot) ? -1 : 0;
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	long r;

	child_wait();
	if (pager && atomic_load(&state) == 2 && !in_farmem &&
	    (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE ||
	     advice == MADV_DONTNEED_LOCKED) &&
	    fm_pager_owns(pager, addr, len))
		fm_pager_forget(pager, addr, len);
	if (pager && atomic_load(&state) == 2 && !in_farmem && advice == MADV_MERGEABLE)
		fm_pager_no_capture(pager, "the program asked KSM to merge paged memory (MADV_MERGEABLE)");
	r = syscall(SYS_madvise, addr, len, advice);
	if (r) {
		errno = (int)-r;
		return -1;
	}
	return 0;
}

/*
 * Locked memory cannot be paged: the kernel refuses to drop a locked page, and
 * with MCL_FUTURE every later mapping, the pager's own included, is faulted in
 * whole at mmap. The program learns that its lock failed, as it would under a
 * low RLIMIT_MEMLOCK (mlockall(2) says EPERM, mlock(2) EAGAIN), and the user
 * learns why; its memory stays correct.
 */
static void lock_refused(const char *call)
{
	char line[300];
	int n = snprintf(line, sizeof(line),
			 "farmem: warning: %s refused: this program's memory is paged by farmem, and locked "
			 "memory cannot be paged (run it without memory locking, or without farmem)\n", call);

	if (write(2, line, n < (int)sizeof(line) ? (size_t)n : sizeof(line) - 1) < 0)
		n = 0;
}

EXPORT int mlockall(int flags)
{
	long r;

	if (hooks_on()) {
		lock_refused("mlockall");
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
		lock_refused(nr == SYS_mlock ? "mlock of paged memory" : "mlock2 of paged memory");
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

	if (write(2, msg, sizeof(msg) - 1) < 0)
		return -EOPNOTSUPP;
	return -EOPNOTSUPP;
}

/* liburing's own function after ours, looked up once. */
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

	pthread_mutex_lock(&big_lock);
	if (atomic_load(&nbig) >= MAX_BIG) {
		pthread_mutex_unlock(&big_lock);
		return NULL;
	}
	p = sys_mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((long)p < 0 && (long)p > -4096) {
		pthread_mutex_unlock(&big_lock);
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
	maybe_register(p, len);
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

/* A block the shim maps itself: a big one, when the program's allocator is glibc's. */
static int use_big(size_t n)
{
	return hooks_on() && n >= cfg.threshold && app_alloc()->glibc;
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
	return app_alloc()->malloc(n);
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
	return app_alloc()->calloc(a, b);
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
	size_t old;
	void *q;

	if (arena_owns(p))
		return arena_realloc(p, n);
	if (!p && in_farmem)
		return arena_alloc(n, 16);
	old = p ? big_len(p) : 0;
	if (old) {
		if (n <= old && n >= cfg.threshold)
			return p;
		q = malloc(n);
		if (!q)
			return NULL;
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
	return app_alloc()->realloc(p, n);
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
	return app_aligned(app_alloc(), align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	const struct app_alloc *a;

	if (in_farmem || (align <= BIG_MAX_ALIGN && use_big(n)))
		return memalign(align, n);
	a = app_alloc();
	return a->aligned_alloc ? a->aligned_alloc(align, n) : app_aligned(a, align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	const struct app_alloc *a;
	void *p;

	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	a = in_farmem ? NULL : app_alloc();
	if (a && a->posix_memalign && !(align <= BIG_MAX_ALIGN && use_big(n)))
		return a->posix_memalign(out, align, n);
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
	return a->valloc ? a->valloc(n) : app_aligned(a, PAGE, n);
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
