// SPDX-License-Identifier: Apache-2.0
/*
 * fork(): the child gets the parent's paged memory as it was at the fork.
 *
 * The kernel does not carry a userfaultfd registration into a child (without
 * UFFD_FEATURE_EVENT_FORK): the child's copy of a paged range is plain
 * memory, where a page that lives in memd would read as zeros. So every
 * paged range is MADV_DONTFORK between forks (a child made by a raw clone(),
 * which runs no fork handlers, has no mapping there and dies of SIGSEGV if
 * it touches one, never reading a wrong byte), and at a fork():
 *
 *   prepare  eviction stops, the pages that are leaving settle, and every
 *            page in memd comes home (over the budget); then the ranges are
 *            MADV_DOFORK. Only the program's own frees can make a hole now,
 *            and a freed page reads as zeros in the child too.
 *   parent   MADV_DONTFORK again, and eviction goes on: the evictor (or,
 *            without one, the forking thread) brings the parent back under
 *            its budget.
 *   child    the parent's pagers are forgotten (their uffd and memd sessions
 *            are the parent's) and fm_fork_child hands the ranges the child
 *            got to its caller: the preload shim starts a pager of the
 *            child's own on them (preload.c), which adopts the pages as
 *            resident and evicts down to the child's budget. Until it has,
 *            the child's copy shares every page with the parent,
 *            copy-on-write, as with any fork.
 *
 * What it costs: a fork brings everything in memd home first (one read of
 * each, in batches), and the pages stay in memory until the parent evicts
 * them or the child lets go. When this machine does not have the room
 * (MemAvailable), nothing is brought home and the ranges stay DONTFORK: the
 * child runs without them, as with a raw clone(). vfork() and posix_spawn()
 * (what the JVM, shells and Python's subprocess use to start programs)
 * share the parent's memory and cost nothing. docs/compatibility.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "budget.h"
#include "chanpool.h"
#include "evict.h"
#include "fm_util.h"
#include "fork.h"
#include "lend.h"
#include "monitor.h"
#include "pager_internal.h"
#include "region.h"

#define MAX_FORK_PAGERS 8

static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fm_pager *fork_pagers[MAX_FORK_PAGERS];
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void (*before_prepare)(void);
static void (*after_parent)(void);
static pid_t reset_in; /* the process whose copy of the list fm_fork_child has cleared */

/* Pages the kernel says it can still give, with a margin for everything else. */
static uint64_t available_pages(void)
{
	char buf[4096];
	const char *s;

	if (fm_read_file("/proc/meminfo", buf, sizeof(buf)) < 0)
		return UINT64_MAX;
	s = strstr(buf, "MemAvailable:");
	if (!s)
		return UINT64_MAX;
	return strtoull(s + 13, NULL, 10) / 4 * 7 / 8; /* kB to pages, keep an eighth */
}

static uint64_t count_remote(struct fm_pager *p)
{
	uint64_t n = 0;

	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		if (!r->live || r->alias)
			continue;
		for (uint64_t i = 0; i < r->npages; i++) {
			unsigned s = fm_pg_state(pg_load(&r->pg[i]));
			n += s == FM_PG_REMOTE || s == FM_PG_LEAVING;
		}
	}
	return n;
}

/*
 * Every page of p that is in memd comes home. Eviction is off, so once a
 * page is resident it stays.
 */
static uint64_t all_home(struct fm_pager *p)
{
	uint64_t total = 0;

	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		if (r->live && !r->alias)
			total += fm_region_home(p, r, 0, r->npages);
	}
	return total;
}

/* The next run of pages of r from *i on that are paged (not UNMANAGED): 1 and [*i, *j), or 0. */
static int next_run(const struct region *r, uint64_t *i, uint64_t *j)
{
	while (*i < r->npages && fm_pg_state(pg_load(&r->pg[*i])) == FM_PG_UNMANAGED)
		(*i)++;
	for (*j = *i; *j < r->npages && fm_pg_state(pg_load(&r->pg[*j])) != FM_PG_UNMANAGED;)
		(*j)++;
	return *j > *i;
}

/*
 * Only the paged runs: the rest of a sparse region is whatever the program
 * keeps there (a reservation's header page, parts it unmapped), which the
 * child gets, or not, as the program decided.
 */
static void set_fork(struct fm_pager *p, int advice)
{
	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		if (!r->live || r->alias)
			continue;
		for (uint64_t i = 0, j; next_run(r, &i, &j); i = j)
			fm_sys_madvise((void *)(r->base + (i << PG_SHIFT)), (size_t)(j - i) << PG_SHIFT, advice);
	}
}

static void prepare_one(struct fm_pager *p)
{
	uint64_t remote, brought;

	atomic_fetch_add(&p->forking, 1);
	/* A pick that began before it saw the flag has taken its victims by now; they settle below. */
	pthread_mutex_lock(&p->clock_lock);
	pthread_mutex_unlock(&p->clock_lock);
	rlock_rd(p);
	remote = count_remote(p);
	if (remote > available_pages()) {
		p->fork_shared = 0;
		rlock_un(p);
		STAT_ADD(p, forks_without_paged, 1);
		fm_warn("fork: %llu MiB of paged memory is in memd and this machine has too little free memory to "
			"bring it home first: the child gets none of the paged ranges (touching one kills it)",
			(unsigned long long)(remote >> 8));
		return;
	}
	brought = all_home(p);
	set_fork(p, MADV_DOFORK);
	p->fork_shared = 1;
	fm_pager_no_capture(p, "a fork shares the paged pages with a child");
	rlock_un(p);
	STAT_ADD(p, forks, 1);
	STAT_ADD(p, fork_pages_fetched, brought);
}

static void evict_down(void *p)
{
	fm_evict_to_budget(p, 0);
}

static void parent_one(struct fm_pager *p)
{
	if (p->fork_shared) {
		rlock_rd(p);
		set_fork(p, MADV_DONTFORK);
		rlock_un(p);
	}
	atomic_fetch_sub(&p->forking, 1);
	if (p->evictor_started) {
		fm_evictor_kick(p);
		return;
	}
	/*
	 * Faulting threads evict only for a page they bring in; a program that
	 * now only rewrites what is resident would stay over its budget. The
	 * pages came home clean: most leave without a write. On farmem's stack
	 * if this one is paged: the batches drop pages its frames may run onto.
	 */
	if (!fm_region_off_paged_stack(p, evict_down, p))
		fm_evict_to_budget(p, 0);
}

/*
 * fork_lock is held from prepare to parent (or child): one fork at a time,
 * and no pager starts or stops halfway through one.
 */
static void on_prepare(void)
{
	void (*before)(void) = before_prepare;

	/* Before fork_lock: what it waits for may need the lock (a pager starting, fm_fork_add). */
	if (before)
		before();
	pthread_mutex_lock(&fork_lock);
	for (int k = 0; k < MAX_FORK_PAGERS; k++)
		if (fork_pagers[k])
			prepare_one(fork_pagers[k]);
}

static void on_parent(void)
{
	void (*after)(void) = after_parent;

	for (int k = 0; k < MAX_FORK_PAGERS; k++)
		if (fork_pagers[k])
			parent_one(fork_pagers[k]);
	pthread_mutex_unlock(&fork_lock);
	if (after)
		after();
}

/* The runs of pages of p that the child got (none are UNMANAGED), appended to out. */
static int child_runs(struct fm_pager *p, struct fm_fork_range *out, int n, int max)
{
	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		if (!r->live || r->alias)
			continue;
		for (uint64_t i = 0, j; next_run(r, &i, &j); i = j) {
			if (n == max) {
				fm_warn("fork: more than %d paged ranges: the child pages only the first ones", max);
				return n;
			}
			out[n].base = r->base + (i << PG_SHIFT);
			out[n].len = (size_t)(j - i) << PG_SHIFT;
			out[n].kernel_waits = r->kernel_waits && p->in_thread;
			n++;
		}
	}
	return n;
}

static void child_reset(struct fm_fork_range *out, int *n, int max)
{
	/*
	 * The child's copies of the pagers must never act: their uffd and memd
	 * sessions are the parent's (an ioctl on the parent's uffd would write
	 * the parent's memory). Only their books are read, here, with no other
	 * thread left to change them. The SIGBUS handler forgets them too.
	 */
	for (int k = 0; k < MAX_FORK_PAGERS; k++) {
		struct fm_pager *p = fork_pagers[k];
		if (!p)
			continue;
		if (p->fork_shared && out)
			*n = child_runs(p, out, *n, max);
		/* Only the parent's pager may hold its uffd: its munmaps wait for a reader of that uffd's events. */
		if (p->uffd >= 0)
			close(p->uffd);
		if (p->uffd_waits >= 0)
			close(p->uffd_waits);
		if (p->uffd_waits_spare >= 0)
			close(p->uffd_waits_spare);
		fm_lend_forget(p);
	}
	memset(fork_pagers, 0, sizeof(fork_pagers));
	pthread_mutex_init(&fork_lock, NULL);
	fm_monitor_child_reset();
	fm_thread_id_forked();
	reset_in = getpid();
}

int fm_fork_child(struct fm_fork_range *out, int max)
{
	int n = 0;

	if (reset_in != getpid())
		child_reset(out, &n, max);
	return n;
}

static void on_child(void)
{
	/* The preload shim has done it from its own child handler, which runs first; a program that embeds the pager has not. */
	if (reset_in != getpid())
		child_reset(NULL, NULL, 0);
}

void fm_fork_before_prepare(void (*fn)(void))
{
	before_prepare = fn;
}

void fm_fork_after_parent(void (*fn)(void))
{
	after_parent = fn;
}

static void install_handlers(void)
{
	pthread_atfork(on_prepare, on_parent, on_child);
}

void fm_fork_add(struct fm_pager *p)
{
	pthread_once(&fork_once, install_handlers);
	pthread_mutex_lock(&fork_lock);
	for (int k = 0; k < MAX_FORK_PAGERS; k++)
		if (!fork_pagers[k]) {
			fork_pagers[k] = p;
			break;
		}
	pthread_mutex_unlock(&fork_lock);
}

void fm_fork_remove(struct fm_pager *p)
{
	pthread_mutex_lock(&fork_lock);
	for (int k = 0; k < MAX_FORK_PAGERS; k++)
		if (fork_pagers[k] == p)
			fork_pagers[k] = NULL;
	pthread_mutex_unlock(&fork_lock);
}
