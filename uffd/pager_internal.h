/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pager's shared state, internal to uffd/. Each room has a header of its
 * own for what it does; this one only holds the structures they share:
 *
 *   pager.c     start and stop, the residency map, the launcher report
 *   monitor.c   where faults arrive: the SIGBUS handler (in the faulting
 *               thread) or handler threads reading the uffd, and the events
 *   fault.c     the fault handlers: missing, write-protect, minor, unmap
 *   uffd_ops.c  every UFFDIO_* ioctl
 *   page.h      page states and their transitions; wait.c: waiting for a
 *               page to settle
 *   region.c    regions: registration, lookup, the overlap iterator
 *   budget.c    the local budget and its watermarks
 *   prefetch.c  runs of one thread's faults, fetched ahead
 *   evict.c     eviction (pins.c: ranges a system call is using)
 *   ranges.c    what the program says of its memory: forget, discard, fetch
 *   chanpool.c  memd channels for faulting threads
 *   shmem.c     MAP_SHARED regions of shmem files; move.c: fm_pager_move
 *   fork.c      fork(): the child gets the paged memory as it was
 */
#ifndef FARMEM_PAGER_INTERNAL_H
#define FARMEM_PAGER_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "capture.h"
#include "fatal.h"
#include "follow.h"
#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "transport.h"

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
/*
 * Tools mirror the layout (cli/src/farmem/resmap.py): a new counter takes a
 * reserved3[] word. A new block changes where more_regions lies: a new
 * FM_RESMAP_VERSION.
 */
_Static_assert(sizeof(struct fm_pager_stats) == (24 + FM_LAT_BUCKETS + 64 + 8) * sizeof(uint64_t),
	       "the counters after lat_hist are two 32-word blocks and one of 8: take reserved3[] words, keep the size");

_Static_assert(FM_RESMAP_SLOTS <= FM_XPORT_MAX_SPACES, "a memd space for every region slot");

struct region {
	uintptr_t base;
	uintptr_t end;
	uint64_t npages;
	/*
	 * Pages its memd space and its place in the map hold (>= npages): a
	 * range the program grows where it lies grows its last region up to
	 * this before it needs a region of its own (remap.c).
	 */
	uint64_t cap;
	uint8_t *pg;           /* its state bytes in the residency map */
	uint8_t *heat;         /* beside them, the evictor's own (evict.h: fm_heat_*), or NULL */
	uint32_t space;        /* memd space of its remote pages */
	int uffd;              /* the userfaultfd it is registered with: the pager's, or uffd_waits */
	int kernel_waits;      /* a thread that faults there sleeps until a handler installs the page */
	int slot;              /* its slot in the residency map's table (fm_resmap_slot) */
	int live;
	/*
	 * FM_REG_SPARSE: a reserved range whose parts become memory and stop
	 * being memory while it lives (fm_pager_commit); the rest is UNMANAGED.
	 */
	int sparse;
	atomic_uint_fast64_t managed; /* its pages that are not UNMANAGED */
	atomic_int pinned;     /* being brought home for an mremap: the evictor skips it */
	atomic_int shared;     /* its pages may be shared copy-on-write (a fork, KSM): fm_pager_no_capture */
	/*
	 * FM_REG_SHMEM only: a second mapping of the same file pages that the
	 * uffd does not cover. Write-back reads through it, so a page that is in
	 * the file but not mapped at base never faults on a pager thread.
	 */
	uint8_t *alias;
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
	int looped;            /* its last fault was a page back within three budgets (a loop over more than the budget): LOOPED_READ or LOOPED_WRITE (prefetch.c), else 0 */
};

/* A range a system call is using: the evictor leaves its pages alone (pins.c). */
struct pin {
	_Atomic uintptr_t start, end; /* 0, 0: free */
};

/* Free ranges the program discarded: the evictor looks there first (evict.c). */
struct garbage_hint {
	int region;
	uint64_t first, n;
};

/* Pages a thread's run went through: last, last - stride, ... n of them (evict.c). */
struct passed_run {
	int region;
	int loop; /* the loop rule's (its pages are marked FM_PGF_LOOPED), not a collector's */
	uint64_t last, n;
	int64_t stride;
};

/*
 * A memd channel that any faulting thread may borrow (chanpool.c), a cache
 * line each: two CPUs faulting at once take and give back slots next to each
 * other, and four to a line every take and give moved it between them
 * (fm_give_back's store was 0.9% of a GcChurn run's samples).
 */
struct chan_slot {
	struct fm_chan *chan;
	atomic_int busy;
} __attribute__((aligned(64)));

#define MAX_HANDLERS 16
#define NSTREAMS 64
#define LEND_CONNS 16 /* other processes' calls served at once (lend.c) */
#define MAX_PINS 8192 /* system calls and futex waits at once (a thread pool's sleepers); a multiple of 64 */
#define MAX_HINTS 256
#define MAX_PASSED 64
#define MAX_POOL 64
#define ZERO_RUN_PAGES 64
#define MAX_CAPTURES 16
#define MAX_KEPT 512

struct fm_pager {
	struct fm_pager_cfg cfg;
	int uffd;
	uint64_t features;              /* what fm_uffd_open got */
	/*
	 * fault=signal only: the second userfaultfd, without SIGBUS, of the
	 * regions registered FM_REG_KERNEL_WAITS (-1 until the first), read by
	 * handler thread 1 (monitor.c).
	 */
	int uffd_waits;
	int uffd_waits_spare;           /* a uffd for it opened before the process gave up root, or -1 */
	int in_thread;                  /* faults are served in the faulting thread (SIGBUS) */
	int shmem_ok;                   /* the uffd has minor faults and write-protect for shmem */
	int can_move;                   /* the uffd has UFFD_FEATURE_MOVE (fm_pager_move) */
	int pidfd;                      /* our own, for process_madvise */
	struct fm_xport *x;

	int map_fd;
	struct fm_resmap_hdr *hdr;
	uint8_t *map;
	uint8_t *heat;                  /* a byte per state byte, at the same offset (evict.h) */
	size_t map_len;
	size_t map_cap;                 /* bytes of state (and of heat): pager.c's map_capacity */
	struct fm_pager_stats *st;

	pthread_rwlock_t rlock;         /* region table: read for faults, write to change it */
	atomic_uint rlock_writers;      /* threads waiting to take it for writing (the follow watch looks) */
	struct region regions[FM_RESMAP_SLOTS];
	int nregions;                   /* high-water mark of used slots */
	/* Region bounds for a lock-free "is this address ours" (the SIGBUS handler, the shim). */
	_Atomic uintptr_t lo, hi;

	atomic_uint_fast64_t resident;  /* resident pages in all regions */
	atomic_uint_fast64_t registered;
	atomic_uint_fast64_t limit, high, low; /* pages */

	/* Waiting for a page to settle (wait.c): a futex word and its waiters. */
	atomic_uint settle_seq;
	atomic_uint settle_waiters;

	/* Handler threads (fault=thread), or the one thread that reads events (fault=signal). */
	pthread_t handlers[MAX_HANDLERS];
	struct fm_chan *handler_chan[MAX_HANDLERS];
	unsigned nhandlers;
	struct fm_handler_arg { struct fm_pager *p; unsigned idx; } handler_args[MAX_HANDLERS];
	pthread_mutex_t waits_lock;     /* the start of uffd_waits and its handler */
	struct fm_follow follow;        /* the handler that follows faulting threads to their CPUs */
	int stop_fd;                    /* eventfd: the handler threads stop when it is readable */
	int handler_epfd[MAX_HANDLERS]; /* each handler's epoll set: its uffd (EPOLLEXCLUSIVE) and stop_fd */
	/*
	 * Handlers past the first on one uffd (fill_threads) help only while
	 * faults queue behind the first: until helpers_until, asleep on
	 * helpers_fd (an eventfd) after it (monitor.c).
	 */
	int helpers_fd;
	_Atomic uint64_t helpers_until;

	struct chan_slot pool[MAX_POOL];
	unsigned npool;
	atomic_uint pool_seq;           /* futex word: a slot was given back */
	atomic_uint pool_waiters;

	struct fm_capture captures[MAX_CAPTURES]; /* SIGBUS mode: eviction without write-protect (capture.h) */
	unsigned ncaptures;
	/*
	 * Set once pages may be shared copy-on-write (a fork that shared the
	 * paged ranges, KSM): a write then goes to a new page, not to the one a
	 * capture holds, so eviction write-protects again.
	 */
	atomic_int capture_off;
	/* evict_move: dirty victims leave by UFFDIO_MOVE into a stage (capture.h), pinned pages stay. */
	struct fm_stage stages[MAX_CAPTURES];
	uint8_t *stage_map;             /* all of them, registered with uffd; NULL: no moves */
	atomic_int move_out;

	pthread_t evictor;
	int evictor_started;

	/* The lender of pages to other processes' process_vm_readv/writev (lend.h): fault=signal only. */
	pthread_t lender;
	int lender_started;
	int lend_listen, lend_stop;     /* -1: none */
	int lend_conn[LEND_CONNS];      /* -1: free; set to -1 before the close (a fork's child closes the rest) */
	struct fm_chan *ev_chan;
	atomic_uint ev_kick;            /* futex word: the evictor has work */

	pthread_mutex_t clock_lock;     /* the evictor's hand, shared with direct eviction */
	int hand_region;
	uint64_t hand_idx;
	uint64_t hot_seen;              /* resident pages with passes left, met since the hand's last wrap */
	atomic_uint_fast64_t hot;       /* the same, at its last wrap, plus pages marked since (evict.c) */
	struct garbage_hint hints[MAX_HINTS]; /* under clock_lock: a ring, the oldest at hint_head */
	unsigned hint_head, nhints;
	struct passed_run passed[MAX_PASSED]; /* under clock_lock: a ring, the newest at passed_top - 1 */
	unsigned passed_top, npassed;
	/*
	 * How the loop rule's pages came back: + a fault in a run (or a page a
	 * run fetched ahead), - one at random; halved at each budget of
	 * evictions. A run of reads gets the rule while it is not below zero,
	 * a run of writes while it is above, or is zero and fewer pages than a
	 * 1024th of the budget went so since the last halving: loop_probe
	 * (prefetch.c, loop_trusted).
	 */
	atomic_int loop_score;
	atomic_uint loop_probe;
	atomic_uint_fast64_t loop_epoch; /* budgets of evictions at the score's last halving */
	/*
	 * Resident pages a discard may still make garbage (write-protect) this
	 * GC cycle: about what the evictor took last cycle, so that a heap that
	 * barely presses its budget does not pay to protect free space it will
	 * mostly reuse (ranges.c).
	 */
	atomic_int_fast64_t garbage_quota;
	uint64_t evictions_at_gc;
	/*
	 * The program's threads' faults on pages memd held, and those of them
	 * on pages that left at most three budgets of evictions before
	 * (FM_BACK_SOON): counted by fill, read at each GC cycle's start into
	 * short_of_room (fm_pager_short_of_room).
	 */
	atomic_uint_fast64_t app_remote_faults, app_back_soon;
	uint64_t app_remote_at_gc, app_soon_at_gc;
	atomic_int short_of_room;

	/*
	 * Ranges unregistered in the last moments: a SIGBUS raised there before
	 * the unregister is ours, and the thread retries (region.c records,
	 * monitor.c asks).
	 */
	struct { _Atomic uintptr_t start, end; _Atomic uint64_t until_ns; } gone[16];
	atomic_uint ngone;

	struct pin pins[MAX_PINS];
	_Atomic uint64_t pin_held[MAX_PINS / 64]; /* a bit per slot in use: the evictor reads these, not every slot */
	atomic_int npins;
	atomic_int pin_hint;            /* a word of pin_held where a slot was last given back or taken */

	/*
	 * Free space whose memory memd keeps for a while (struct fm_dead's
	 * keep, region.c): the ranges in the order they were kept, under
	 * misc_lock, the oldest given back first once the transport's count
	 * (fm_xport_kept_pages) passes a bound.
	 */
	struct fm_range kept[MAX_KEPT];
	uint32_t kept_space[MAX_KEPT];
	unsigned kept_head, nkept;
	atomic_int kept_give_back;      /* memd refused a page: give all of it back at the next discard */
	atomic_int edit_off;            /* memd (or the transport) cannot EDIT: a collector's moves are its own */

	pthread_mutex_t misc_lock;      /* misc_chan, for calls from program threads */
	struct fm_chan *misc_chan;
	/*
	 * The channel of fm_evict_to_budget (evict.h): a registration that
	 * finds more pages present than the budget holds, or a fork that
	 * brought everything home, evicts in the calling thread. Opened at
	 * start: opened at first use, it was allocated in a fork's parent
	 * handler, where another library's allocator may still hold its locks
	 * (jemalloc's, in Redis's BGSAVE, once the channel grew past its
	 * thread cache's sizes).
	 */
	pthread_mutex_t reg_lock;
	struct fm_chan *reg_chan;

	pthread_mutex_t stream_lock;
	struct stream streams[NSTREAMS];

	atomic_int stopping;
	uint8_t *bounce;                /* FM_MAX_BATCH pages for fm_pager_move, under misc_lock */
	atomic_int memd_copy;           /* fm_pager_move asks memd to copy remote pages (COPY) */
	atomic_int evict_broken;        /* memd cannot take writes: keep pages local */
	/*
	 * Set (never cleared) before the first page has a copy in memd: an
	 * eviction's write-back, a move whose bytes land there. Until then no
	 * page is REMOTE or HAS_REMOTE, and a discard has no copy to kill.
	 */
	atomic_int memd_holds;
	atomic_uint_fast64_t full_until_ns; /* memd refused a whole batch: no eviction until then */
	uint8_t *zero_run;              /* ZERO_RUN_PAGES of zeros */
	atomic_int forking;             /* a fork() is under way: nothing is evicted (fork.c) */
	int fork_shared;                /* this fork's child gets the paged ranges; under fork.c's lock */
};

/* The region table's lock. A failure here is a bug in the pager, never the program's. */
#define rlock_rd(p) do { int e_ = pthread_rwlock_rdlock(&(p)->rlock); if (e_) fm_fatal("region lock (read): %s at %s:%d", strerror(e_), __FILE__, __LINE__); } while (0)
#define rlock_wr(p) do { \
	int e_ = pthread_rwlock_trywrlock(&(p)->rlock); \
	if (e_ == EBUSY) { \
		atomic_fetch_add(&(p)->rlock_writers, 1); \
		e_ = pthread_rwlock_wrlock(&(p)->rlock); \
		atomic_fetch_sub(&(p)->rlock_writers, 1); \
	} \
	if (e_) fm_fatal("region lock (write): %s at %s:%d", strerror(e_), __FILE__, __LINE__); \
} while (0)
#define rlock_un(p) do { int e_ = pthread_rwlock_unlock(&(p)->rlock); if (e_) fm_fatal("region unlock: %s at %s:%d", strerror(e_), __FILE__, __LINE__); } while (0)

#define STAT_ADD(p, field, n) __atomic_fetch_add(&(p)->st->field, (uint64_t)(n), __ATOMIC_RELAXED)

/* A gauge of the most there ever was: *word becomes now if now is more. */
static inline void fm_raise_peak(uint64_t *word, uint64_t now)
{
	uint64_t seen = __atomic_load_n(word, __ATOMIC_RELAXED);

	while (now > seen && !__atomic_compare_exchange_n(word, &seen, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/*
 * A page a handler thread installs in r goes in writable whatever the
 * access: there a write-protect fault is one more handoff between two
 * threads (two CPUs, an IPI to wake the faulting one), and the heaps these
 * regions mostly are hold pages that are written. An unwritten page leaves
 * clean on shm, where eviction compares it with memd's copy (evict.c's
 * guess_held); elsewhere it is written back, which costs less than the
 * faults (bench/RESULTS.md, session 19).
 */
static inline int fm_region_installs_open(const struct region *r)
{
	return r->kernel_waits && !r->alias;
}

/*
 * A full GC whose moves memd does is under way (pager.h's full_gc_in_memd):
 * its GC threads fetch nothing ahead (prefetch.c) and what they read is kept
 * a pass of the clock (fault.c).
 */
static inline int fm_in_full_gc(const struct fm_pager *p)
{
	return p->cfg.full_gc_in_memd && p->cfg.full_gc_in_memd();
}

/*
 * A GC thread of kind gc (pager.h's is_gc_thread) reading a remote page gets
 * it writable (gc_writable), on the guess that it writes there soon: not
 * one that writes no heap. G1's marking read 220k pages a run of GcChurn at
 * 25% local; each went out DIRTY, through a capture and a compare with
 * memd's copy, to leave clean.
 */
static inline int fm_gc_read_opens(const struct fm_pager *p, int gc)
{
	return p->cfg.gc_writable && (gc == FM_GC_PAUSE || gc == FM_GC_CONC);
}

/* A collector's pause is under way (a JVM's agent says so: fm_pager_gc_event). */
static inline int fm_in_gc_pause(const struct fm_pager *p)
{
	return __atomic_load_n(&p->hdr->gc_active, __ATOMIC_ACQUIRE) != 0;
}

/* Called before a page's copy goes to memd (memd_holds). */
static inline void fm_memd_holds(struct fm_pager *p)
{
	if (!atomic_load_explicit(&p->memd_holds, memory_order_relaxed))
		atomic_store_explicit(&p->memd_holds, 1, memory_order_relaxed);
}

/* Pages evicted so far: every page an eviction batch drops is counted clean or dirty. */
static inline uint64_t fm_evicted(const struct fm_pager *p)
{
	return __atomic_load_n(&p->st->evictions_clean, __ATOMIC_RELAXED) +
	       __atomic_load_n(&p->st->evictions_dirty, __ATOMIC_RELAXED);
}

#endif
