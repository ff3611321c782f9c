/* SPDX-License-Identifier: Apache-2.0 */
/* Internal to the pager: shared by pager.c (faults, regions) and evict.c. */
#ifndef FARMEM_PAGER_INTERNAL_H
#define FARMEM_PAGER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "pager.h"
#include "resmap.h"
#include "transport.h"

#define PG_SIZE 4096u
#define PG_SHIFT 12

/* The transport counts several memds' failovers straight into the residency map's memd_* words. */
#define FM_MEMD_COUNTERS(st) ((struct fm_xport_counters *)&(st)->memd_failovers)
#define FM_COUNTER_AT(field, word) \
	_Static_assert(offsetof(struct fm_pager_stats, memd_##field) == \
		       offsetof(struct fm_pager_stats, memd_failovers) + offsetof(struct fm_xport_counters, field), \
		       "memd_" #field " is the transport's " #word " counter")
FM_COUNTER_AT(failovers, first);
FM_COUNTER_AT(timeouts, second);
FM_COUNTER_AT(servers_lost, third);
FM_COUNTER_AT(servers_live, fourth);
FM_COUNTER_AT(rereplicated, fifth);
FM_COUNTER_AT(degraded_writes, sixth);
_Static_assert(sizeof(struct fm_xport_counters) == 6 * sizeof(uint64_t), "six counters, no more");
/* Tools mirror the layout (cli/src/farmem/resmap.py): a new counter takes a reserved[] word. */
_Static_assert(sizeof(struct fm_pager_stats) == (24 + FM_LAT_BUCKETS + 32) * sizeof(uint64_t),
	       "the counters after lat_hist are a 32-word block: take reserved[] words, keep the size");

struct region {
	uintptr_t base;
	uintptr_t end;
	uint64_t npages;
	uint8_t *pg;           /* its state bytes in the residency map */
	uint32_t space;        /* memd space of its remote pages */
	int slot;              /* index in hdr->regions */
	int live;
	atomic_int pinned;     /* being brought home for an mremap: the evictor skips it */
	/*
	 * FM_REG_SHMEM only: a second mapping of the same file pages that the
	 * uffd does not cover. Write-back reads through it, so a page that is in
	 * the file but not mapped at base never faults on a pager thread.
	 */
	uint8_t *alias;
};

struct handler {
	pthread_t th;
	struct fm_pager *p;
	struct fm_chan *chan;
	int idx;
};

/* A faulting thread's recent faults, for the prefetcher. */
struct stream {
	pid_t tid;
	int region;
	uint64_t last;
	int64_t stride;
	unsigned hits;
	uint64_t pf_next;      /* first page past what we prefetched for it */
	unsigned pf_count;
};

#define MAX_HANDLERS 16
#define NSTREAMS 64

struct fm_pager {
	struct fm_pager_cfg cfg;
	int uffd;
	int shmem_ok;                   /* the uffd has minor faults and write-protect for shmem */
	int pidfd;                      /* our own, for process_madvise */
	struct fm_xport *x;

	int map_fd;
	struct fm_resmap_hdr *hdr;
	uint8_t *map;
	size_t map_len;
	struct fm_pager_stats *st;

	pthread_rwlock_t rlock;         /* region table: read for faults, write to change it */
	struct region regions[FM_RESMAP_MAX_REGIONS];
	int nregions;                   /* high-water mark of used slots */

	atomic_uint_fast64_t resident;  /* resident pages in all regions */
	atomic_uint_fast64_t registered;
	atomic_uint_fast64_t limit, high, low; /* pages */

	struct handler handlers[MAX_HANDLERS];
	unsigned nhandlers;

	pthread_t evictor;
	int evictor_started;
	struct fm_chan *ev_chan;
	pthread_mutex_t ev_lock;
	pthread_cond_t ev_cond;
	int ev_kick;

	pthread_mutex_t clock_lock;     /* the evictor's hand, shared with direct eviction */
	int hand_region;
	uint64_t hand_idx;

	pthread_mutex_t wait_lock;      /* faults waiting for an eviction to finish */
	uintptr_t *waiters;
	size_t nwaiters, waiters_cap;

	pthread_mutex_t misc_lock;      /* misc_chan, for calls from program threads */
	struct fm_chan *misc_chan;

	pthread_mutex_t stream_lock;
	struct stream streams[NSTREAMS];

	atomic_int stopping;
	int can_move;                   /* the uffd has UFFD_FEATURE_MOVE (fm_pager_move) */
	uint8_t *bounce;                /* FM_MAX_BATCH pages for fm_pager_move, under misc_lock */
	atomic_int memd_copy;           /* fm_pager_move asks memd to copy remote pages (COPY) */
	atomic_int evict_broken;        /* memd cannot take writes: keep pages local */
	atomic_uint_fast64_t full_until_ns; /* memd refused a whole batch: no eviction until then */
	uint8_t *doorbell;              /* one page per handler, touched to stop them */
	uint8_t *zero;
	uint8_t *zero_run;              /* ZERO_RUN_PAGES of zeros, for runs of fresh pages */
};

#define ZERO_RUN_PAGES 64

static inline uint8_t pg_load(const uint8_t *b)
{
	return __atomic_load_n(b, __ATOMIC_ACQUIRE);
}

static inline int pg_cas(uint8_t *b, uint8_t *old, uint8_t nv)
{
	return __atomic_compare_exchange_n(b, old, nv, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static inline void pg_store(uint8_t *b, uint8_t v)
{
	__atomic_store_n(b, v, __ATOMIC_RELEASE);
}

static inline uint8_t pg_make(unsigned state, uint8_t flags)
{
	return (uint8_t)((flags & ~FM_PG_STATE_MASK) | state);
}

/* The region table's lock. A failure here is a bug in the pager, never the program's. */
#define rlock_rd(p) do { int e_ = pthread_rwlock_rdlock(&(p)->rlock); if (e_) fm_fatal("region lock (read): %s at %s:%d", strerror(e_), __FILE__, __LINE__); } while (0)
#define rlock_wr(p) do { int e_ = pthread_rwlock_wrlock(&(p)->rlock); if (e_) fm_fatal("region lock (write): %s at %s:%d", strerror(e_), __FILE__, __LINE__); } while (0)
#define rlock_un(p) do { int e_ = pthread_rwlock_unlock(&(p)->rlock); if (e_) fm_fatal("region unlock: %s at %s:%d", strerror(e_), __FILE__, __LINE__); } while (0)

#define STAT_ADD(p, field, n) __atomic_fetch_add(&(p)->st->field, (uint64_t)(n), __ATOMIC_RELAXED)

/* evict.c */
void *fm_evictor_main(void *arg);
/* Evict up to want pages now; returns pages dropped. */
unsigned fm_evict_batch(struct fm_pager *p, struct fm_chan *chan, unsigned want);
void fm_evict_kick(struct fm_pager *p);
void fm_wake_waiters(struct fm_pager *p);

/* shmem.c: shared-memory regions (FM_REG_SHMEM, minor-fault mode) */
#define FM_UFFD_SHMEM_FEATURES (UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM)
int fm_shmem_alias(struct region *r);
uint64_t fm_shmem_adopt(struct fm_pager *p, struct region *r);
void fm_shmem_minor(struct fm_pager *p, uintptr_t addr, int write, pid_t tid);
void fm_shmem_drop(struct region *r, uintptr_t addr, size_t len);
void fm_shmem_release(struct region *r);

/* pager.c */
struct region *fm_find_region(struct fm_pager *p, uintptr_t addr, int *idx);
int fm_queue_waiter(struct fm_pager *p, struct region *r, uint64_t i, uintptr_t addr);
int fm_is_gc(struct fm_pager *p, pid_t tid);
void fm_resident_add(struct fm_pager *p, int64_t delta);
void fm_churn(struct fm_pager *p, uint64_t pages);
int fm_wake_range(struct fm_pager *p, uintptr_t addr, size_t len);
int fm_wp_range(struct fm_pager *p, uintptr_t addr, size_t len, int protect);
void fm_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
