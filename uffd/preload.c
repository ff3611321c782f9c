// SPDX-License-Identifier: Apache-2.0
/*
 * libfarmem_preload.so: puts a program that knows nothing of farmem under
 * the pager. Private anonymous mappings of at least FARMEM_THRESHOLD bytes
 * are registered, whether they come from mmap or from malloc (glibc maps big
 * blocks with an internal mmap that LD_PRELOAD cannot see, so big blocks are
 * mapped here instead). munmap, mremap and MADV_DONTNEED-like advice on a
 * paged range go through the pager first, so no stale page ever comes back.
 *
 * The interposers call the kernel directly (syscall(2)), never dlsym: this
 * file runs inside malloc and inside the dynamic loader's own allocations.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))
#define PAGE 4096u
#define MAX_BIG 4096

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static struct fm_pager_cfg cfg;
static struct fm_pager *pager;
static atomic_int state;             /* 0 idle, 1 starting, 2 running, 4 disabled */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int in_farmem;       /* our own mappings are never paged */

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
	fprintf(stderr, "farmem: error: %s\n", msg);
	_exit(78);
}

static void on_fork_child(void)
{
	/*
	 * The pager's threads do not exist in a forked child, and the paged
	 * ranges were not inherited (MADV_DONTFORK): a child that touches one
	 * faults instead of silently reading zeros. exec() gets a fresh shim.
	 */
	pager = NULL;
	atomic_store(&state, 4);
}

__attribute__((constructor)) static void preload_init(void)
{
	char err[512];

	fm_log_prefix = "farmem";
	if (fm_pager_cfg_from_env(&cfg, err, sizeof(err)))
		die_config(err);
	fm_log_level = cfg.log_level;
	if (!cfg.memd[0] || !cfg.secret_len) {
		/* Loaded without a launcher: stay out of the way. */
		atomic_store(&state, 4);
		return;
	}
	pthread_atfork(NULL, NULL, on_fork_child);
}

static struct fm_pager *get_pager(void)
{
	char err[512];
	int s = atomic_load(&state);

	if (s == 2)
		return pager;
	if (s != 0)
		return NULL;
	pthread_mutex_lock(&start_lock);
	if (atomic_load(&state) == 0) {
		int rc;
		atomic_store(&state, 1);
		in_farmem++;
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
	return atomic_load(&state) == 2 ? pager : NULL;
}

static int qualifies(size_t len, int prot, int flags, int fd)
{
	return !in_farmem && len >= cfg.threshold && fd == -1 && (flags & MAP_ANONYMOUS) &&
	       (flags & MAP_PRIVATE) && !(flags & (MAP_SHARED | MAP_HUGETLB | MAP_STACK)) &&
	       (prot & PROT_WRITE) && atomic_load(&state) != 4;
}

static void maybe_register(void *p, size_t len)
{
	struct fm_pager *pg = get_pager();

	if (!pg)
		return;
	len = (len + PAGE - 1) & ~(size_t)(PAGE - 1);
	in_farmem++;
	if (fm_pager_register(pg, p, len, 0) == 0)
		madvise(p, len, MADV_DONTFORK);
	in_farmem--;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *p;

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

	if (pager && atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, addr, len))
		fm_pager_unregister(pager, addr, len);
	r = syscall(SYS_munmap, addr, len);
	return r ? -1 : 0;
}

EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL, *p;
	int paged = pager && atomic_load(&state) == 2 && !in_farmem && fm_pager_owns(pager, old, old_len);
	va_list ap;

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
	if (paged || new_len >= cfg.threshold)
		maybe_register(p, new_len);
	return p;
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	long r;

	if (pager && atomic_load(&state) == 2 && !in_farmem &&
	    (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE ||
	     advice == MADV_DONTNEED_LOCKED) &&
	    fm_pager_owns(pager, addr, len))
		fm_pager_forget(pager, addr, len);
	r = syscall(SYS_madvise, addr, len, advice);
	if (r) {
		errno = (int)-r;
		return -1;
	}
	return 0;
}

/* --- big malloc blocks ------------------------------------------------------ */

static int big_find(const void *p)
{
	for (int i = 0; i < atomic_load(&nbig); i++)
		if (big[i].addr == (uintptr_t)p)
			return i;
	return -1;
}

static void *big_alloc(size_t n)
{
	size_t len = (n + PAGE - 1) & ~(size_t)(PAGE - 1);
	void *p;

	pthread_mutex_lock(&big_lock);
	if (atomic_load(&nbig) >= MAX_BIG) {
		pthread_mutex_unlock(&big_lock);
		return NULL;
	}
	p = sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((long)p < 0 && (long)p > -4096) {
		pthread_mutex_unlock(&big_lock);
		return NULL;
	}
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

static int use_big(size_t n)
{
	return !in_farmem && n >= cfg.threshold && atomic_load(&state) != 4 &&
	       cfg.threshold;
}

EXPORT void *malloc(size_t n)
{
	if (use_big(n)) {
		void *p = big_alloc(n);
		if (p)
			return p;
	}
	return __libc_malloc(n);
}

EXPORT void *calloc(size_t a, size_t b)
{
	size_t n;
	if (__builtin_mul_overflow(a, b, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	if (use_big(n)) {
		void *p = big_alloc(n); /* fresh anonymous memory is zero */
		if (p)
			return p;
	}
	return __libc_calloc(a, b);
}

EXPORT void free(void *p)
{
	if (!big_free(p))
		__libc_free(p);
}

EXPORT void *realloc(void *p, size_t n)
{
	size_t old = p ? big_len(p) : 0;
	void *q;

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
		q = big_alloc(n);
		if (q) {
			memcpy(q, p, have < n ? have : n);
			__libc_free(p);
			return q;
		}
	}
	return __libc_realloc(p, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
	if (align <= PAGE && use_big(n)) {
		void *p = big_alloc(n);
		if (p)
			return p;
	}
	return __libc_memalign(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
	return memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;
	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	p = memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

EXPORT void *valloc(size_t n)
{
	return memalign(PAGE, n);
}

EXPORT size_t malloc_usable_size(void *p)
{
	static size_t (*next)(void *);
	size_t len = p ? big_len(p) : 0;

	if (len)
		return len;
	/* glibc has no __libc_ alias for this one; dlsym's own allocations are small. */
	if (!next)
		next = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
	return next ? next(p) : 0;
}
