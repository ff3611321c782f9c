// SPDX-License-Identifier: Apache-2.0
/* farmem_swapva_move and friends for the farmem JDK; see swapva_move.h. */
#include "swapva_move.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fm_util.h"
#include "libswapva.h"
#include "pager.h"

#define EXPORT __attribute__((visibility("default")))
#define PAGE 4096u
#define MIN_PAGES 10u /* SVAGC's threshold when the backend gives none */

static struct fm_pager *no_pager(void)
{
	return NULL;
}

static void no_leave(void)
{
}

static int not_expected(void)
{
	return 0;
}

/* No pager until fm_swapva_export, which Agent_OnLoad calls before the JVM can call us. */
static struct fm_pager_ref hooks = { no_pager, no_leave, not_expected };
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static struct swapva_ctx *lib;    /* libswapva, when no pager runs: describe and break-even */
static int lib_failed;
/* What libswapva did for the JVM, per backend: the JVM's log counts pages, not who moved them. */
static uint64_t lib_calls, lib_bytes_by[SWAPVA_NBACKENDS];
/*
 * The moves themselves go through one context per GC worker (a context
 * serves one call at a time), so that G1's workers move pages in parallel
 * as they copy in parallel. Closed when the worker thread ends.
 */
static pthread_key_t worker_key;
static pthread_once_t worker_once = PTHREAD_ONCE_INIT;

static void worker_ctx_close(void *ctx)
{
	swapva_close(ctx);
}

static void worker_key_make(void)
{
	pthread_key_create(&worker_key, worker_ctx_close);
}

static struct swapva_ctx *worker_ctx(void)
{
	struct swapva_ctx *c;

	pthread_once(&worker_once, worker_key_make);
	c = pthread_getspecific(worker_key);
	if (!c && swapva_open(&c, SWAPVA_BACKEND_AUTO) == 0 && pthread_setspecific(worker_key, c)) {
		swapva_close(c);
		c = NULL;
	}
	return c;
}

static struct swapva_ctx *lib_ctx(void)
{
	if (!lib && !lib_failed) {
		int e = swapva_open(&lib, SWAPVA_BACKEND_AUTO);
		if (e) {
			lib_failed = 1;
			fm_warn("SwapVA: libswapva cannot open (%s): the JVM copies large objects", strerror(e));
		}
	}
	return lib;
}

EXPORT int farmem_swapva_move(void *dst, const void *src, size_t len)
{
	struct fm_pager *p = hooks.enter();
	struct swapva_ctx *c;
	int rc;

	if (p) {
		rc = fm_pager_move(p, dst, src, len);
		hooks.leave();
		return rc;
	}
	hooks.leave();
	pthread_mutex_lock(&lib_lock);
	c = lib_ctx() ? worker_ctx() : NULL;
	pthread_mutex_unlock(&lib_lock);
	if (!c)
		return -ENOTSUP;
	{
		struct swapva_seg s = { (uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, len };
		struct swapva_result res;

		memset(&res, 0, sizeof(res));
		rc = swapva_batch(c, SWAPVA_OP_MOVE, &s, 1, &res);
		rc = rc ? -rc : 0;
		__atomic_fetch_add(&lib_calls, 1, __ATOMIC_RELAXED);
		for (int b = 0; b < SWAPVA_NBACKENDS; b++)
			__atomic_fetch_add(&lib_bytes_by[b], res.bytes_by[b], __ATOMIC_RELAXED);
	}
	return rc;
}

EXPORT size_t farmem_swapva_min_bytes(void)
{
	unsigned pages = MIN_PAGES;

	if (!hooks.expected()) {
		pthread_mutex_lock(&lib_lock);
		if (lib_ctx()) {
			unsigned b = swapva_breakeven_pages(lib);
			pages = b > pages ? b : pages;
		}
		pthread_mutex_unlock(&lib_lock);
	}
	/*
	 * With a pager the break-even is not the bare UFFDIO_MOVE's: a remote
	 * page moved costs one read from memd instead of a fetch, a copy and a
	 * dirty page to write back, so SVAGC's ten pages stand.
	 */
	return (size_t)(pages == ~0u ? ~0u : pages) * PAGE;
}

EXPORT const char *farmem_swapva_describe(void)
{
	static char d[96];

	if (hooks.expected())
		return "farmem pager: UFFDIO_MOVE, remote pages moved inside memd";
	pthread_mutex_lock(&lib_lock);
	snprintf(d, sizeof(d), "libswapva %s", lib_ctx() ? swapva_describe(lib) : "unavailable");
	pthread_mutex_unlock(&lib_lock);
	return d;
}

void fm_swapva_report(void)
{
	pthread_mutex_lock(&lib_lock);
	if (lib && lib_calls)
		fprintf(stderr, "farmem: SwapVA via libswapva (%s): %llu calls; pages moved by kmod %llu, "
			"uffd %llu, memmove %llu\n", swapva_describe(lib), (unsigned long long)lib_calls,
			(unsigned long long)(lib_bytes_by[SWAPVA_BACKEND_KMOD] / PAGE),
			(unsigned long long)(lib_bytes_by[SWAPVA_BACKEND_UFFD] / PAGE),
			(unsigned long long)(lib_bytes_by[SWAPVA_BACKEND_MEMMOVE] / PAGE));
	pthread_mutex_unlock(&lib_lock);
}

void fm_swapva_export(const struct fm_pager_ref *h)
{
	Dl_info info;

	hooks = *h;
	/* Loading ourselves again RTLD_GLOBAL puts our symbols in the global scope. */
	if (!dladdr((void *)farmem_swapva_move, &info) || !info.dli_fname ||
	    !dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
		fm_warn("SwapVA: cannot export farmem_swapva_move (%s): a farmem JDK copies large objects",
			dlerror());
}
