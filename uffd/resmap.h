/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The residency map and pager statistics (DESIGN.md interface 2).
 *
 * One shared-memory object per paged process, a memfd named "farmem-map",
 * so that nothing is left behind when the process dies. Readers outside the
 * process open /proc/PID/fd/N (the link reads "/memfd:farmem-map (deleted)")
 * and map it read-only. The layout is:
 *
 *   [0, FM_RESMAP_MAP_OFFSET)  struct fm_resmap_hdr (regions, epoch, stats)
 *   [FM_RESMAP_MAP_OFFSET, ..) one state byte per page of every region,
 *                              region r at regions[r].map_offset
 *
 * The collector and outside readers use plain loads; every writer is the
 * pager, with atomic byte operations. A byte may be stale by the time it
 * is read: it is advice for the GC and a figure for tools, never a lock.
 * docs/residency-map.md describes it for readers in other languages.
 */
#ifndef FARMEM_RESMAP_H
#define FARMEM_RESMAP_H

#include <stdint.h>

#define FM_RESMAP_MAGIC        0x50414d52u /* "RMAP" */
#define FM_RESMAP_VERSION      3
/*
 * Region slots: the first 64 in regions[], where readers that predate
 * more_regions[] look (the farmem JDK's collector among them), the rest in
 * more_regions[] after the counters. nregions counts both.
 */
#define FM_RESMAP_MAX_REGIONS  64
#define FM_RESMAP_MORE_REGIONS 448
#define FM_RESMAP_SLOTS        (FM_RESMAP_MAX_REGIONS + FM_RESMAP_MORE_REGIONS)
#define FM_RESMAP_MAP_OFFSET   (64u * 1024u)
#define FM_LAT_BUCKETS         256 /* 8 per power of two of nanoseconds */

/* The low three bits of a page byte. */
enum fm_page_state {
	FM_PG_UNTOUCHED = 0, /* neither local nor remote: a touch is a local zero-fill */
	FM_PG_FILLING   = 1, /* in flight: a handler is installing it (or holds it, not resident) */
	FM_PG_CLEAN     = 2, /* resident, write-protected, memd (or zero) has these bytes */
	FM_PG_UPDATING  = 3, /* resident, a handler holds it (making it writable, or a stale fault) */
	FM_PG_DIRTY     = 4, /* resident and writable: must be written back before a drop */
	FM_PG_LEAVING   = 5, /* resident, being evicted */
	FM_PG_REMOTE    = 6, /* not resident: memd holds the latest bytes */
	FM_PG_UNMANAGED = 7, /* inside a region but not paged (e.g. a file-backed hole) */
};
#define FM_PG_STATE_MASK   0x07u

/* Flags in the high bits of a page byte. */
#define FM_PGF_HAS_REMOTE  0x08u /* memd holds a copy (current if CLEAN/REMOTE) */
#define FM_PGF_REF         0x10u /* filled or written since the evictor's hand passed */
#define FM_PGF_GC          0x20u /* faulted in by a GC thread, untouched by the app since */
#define FM_PGF_PREFETCH    0x40u /* installed by prefetch, use not yet seen */
#define FM_PGF_GARBAGE     0x80u /* CLEAN only: the program discarded it (its bytes are dead) and has not
                                   * written it since (it is write-protected): it leaves first, unwritten */
/*
 * GARBAGE's bit, in states where GARBAGE cannot be. REMOTE: the page was
 * written in its last stay, so a read installs it writable (DIRTY) and its
 * write costs no write-protect fault (whose unprotect is a TLB shootdown
 * when another CPU runs the program). DIRTY: installed writable on that
 * guess, no write seen; its eviction does not carry the guess on, so a page
 * that stops being written is installed write-protected again.
 */
#define FM_PGF_REWRITE     0x80u
/*
 * REF's bit, in REMOTE: the page left because the loop rule chose it
 * (uffd/evict.c, pick_passed); how it comes back is the rule's record
 * (uffd/prefetch.c, loop_trusted). Advice only.
 */
#define FM_PGF_LOOPED      0x10u

static inline unsigned fm_pg_state(uint8_t b) { return b & FM_PG_STATE_MASK; }

/* What the collector asks: will touching this page cost a remote fetch? */
static inline int fm_pg_is_remote(uint8_t b)
{
	unsigned s = fm_pg_state(b);
	return s == FM_PG_REMOTE || s == FM_PG_FILLING;
}

static inline int fm_pg_is_resident(uint8_t b)
{
	unsigned s = fm_pg_state(b);
	return s == FM_PG_CLEAN || s == FM_PG_UPDATING || s == FM_PG_DIRTY ||
	       s == FM_PG_LEAVING;
}

#define FM_REGION_F_LIVE   1u /* slot in use */
#define FM_REGION_F_HEAP   2u /* the Java heap */
#define FM_REGION_F_SHMEM  4u /* shared-memory backed (minor-fault mode) */
#define FM_REGION_F_SPARSE 8u /* a reserved range: only its committed parts are paged, the rest is UNMANAGED */

struct fm_resmap_region {
	uint64_t base;        /* first byte of the region */
	uint64_t npages;
	uint64_t map_offset;  /* offset of its first state byte in the memfd */
	uint32_t flags;       /* FM_REGION_F_* */
	uint32_t space_id;    /* memd space that holds its remote pages */
};

/* Counters: monotonically increasing unless noted. Updated with relaxed atomics. */
struct fm_pager_stats {
	uint64_t faults;             /* missing faults served (zero-fill + remote) */
	uint64_t wp_faults;          /* write-protect faults (clean page written) */
	uint64_t zero_fills;         /* pages filled with zeros: demand faults and prefetched zero runs */
	uint64_t remote_reads;       /* pages read from memd, demand + prefetch */
	uint64_t remote_read_bytes;
	uint64_t remote_writes;      /* pages written to memd */
	uint64_t remote_write_bytes;
	uint64_t evictions_clean;    /* dropped with no write-back */
	uint64_t evictions_dirty;    /* written back, then dropped */
	uint64_t discards;           /* dropped because the program freed them */
	uint64_t prefetch_issued;
	uint64_t prefetch_used;      /* seen used: written, or run through (a lower bound) */
	uint64_t gc_faults;          /* faults taken by GC threads */
	uint64_t app_faults;         /* faults taken by every other thread */
	uint64_t resident_pages;     /* gauge */
	uint64_t peak_resident_pages;/* gauge */
	uint64_t local_limit_pages;  /* gauge: the budget */
	uint64_t registered_pages;   /* gauge */
	uint64_t memd_full;          /* writes memd refused: page kept local */
	uint64_t crc_errors;
	uint64_t transport_errors;
	uint64_t evict_batches;
	uint64_t evict_syscalls;     /* write-protect + drop calls made by the evictor */
	uint64_t direct_evictions;   /* evictions done by a fault handler at the limit */
	uint64_t lat_hist[FM_LAT_BUCKETS]; /* fault service time, see fm_lat_bucket() */
	/* Many memd servers (memd/client/multi.c; struct fm_xport_counters); zero with a single memd. */
	uint64_t memd_failovers;     /* page reads/writes that went to another replica after a failure */
	uint64_t memd_timeouts;      /* requests to a memd that did not answer within the timeout */
	uint64_t memd_servers_lost;  /* memd servers given up on (connection lost, or silent too long) */
	uint64_t memd_servers_live;  /* gauge: memd servers in use */
	uint64_t memd_rereplicated;  /* pages copied to another memd to restore R replicas */
	uint64_t memd_degraded_writes; /* pages acknowledged by fewer than R replicas */
	/* fm_pager_move (a collector's SwapVA compaction, uffd/move.c). */
	uint64_t swapva_calls;       /* fm_pager_move calls */
	uint64_t swapva_pages_moved; /* resident pages moved by UFFDIO_MOVE: no bytes copied */
	uint64_t swapva_pages_fetched; /* remote pages read from memd straight to their destination (memd full) */
	uint64_t swapva_pages_untouched; /* never-written pages: nothing to move */
	uint64_t swapva_pages_copied; /* resident pages UFFDIO_MOVE refused, copied instead */
	uint64_t swapva_pages_remote; /* remote pages moved from slot to slot in memd, never local
	                               * (by COPY: swapva_remote_copied, below) */
	/* Shared-memory regions (uffd/shmem.c).  */
	uint64_t minor_faults;       /* pages still in the file mapped again with UFFDIO_CONTINUE */
	/*
	 * Where a remote demand fault's time goes (issue 5), summed over the
	 * faults served from memd (not zero fills, not prefetch): the handler's
	 * time from taking the event off the uffd to UFFDIO_COPY's return (the
	 * faulting thread is woken by then), and within it the memd round trip
	 * and the UFFDIO_COPY. The rest of what the program waits (fault entry,
	 * event delivery, being scheduled again) is the program's measured wait
	 * minus split_handler_ns: bench/progs/faultlat.c --split.
	 */
	uint64_t split_faults;
	uint64_t split_handler_ns;
	uint64_t split_transport_ns;
	uint64_t split_copy_ns;
	/*
	 * fm_pager_move's remote pages that memd copied slot to slot itself
	 * (COPY, or inside the shared store): of swapva_pages_remote, those
	 * whose bytes never came to the pager. The rest were read and written.
	 */
	uint64_t swapva_remote_copied;
	uint64_t swapva_copy_calls;  /* fm_chan_copy calls (one per batch of up to 256 pages) */
	/* Zero fills taken by GC threads (of gc_faults; the rest are remote reads). */
	uint64_t gc_zero_fills;
	/* The fault path (issue 16). */
	uint64_t fault_mode;         /* gauge: 1 faults served in the faulting thread (SIGBUS), 2 by handler threads */
	uint64_t io_prefaults;       /* pages made resident (or writable) for a system call (the shim, fault=signal) */
	uint64_t io_retries;         /* system calls the shim retried after EFAULT on paged memory */
	/* Discard (issue 18). */
	uint64_t garbage_marked;     /* discarded resident pages kept, write-protected, until room is needed */
	uint64_t garbage_evicted;    /* garbage pages dropped with no write-back */
	uint64_t garbage_reused;     /* garbage pages the program wrote again (opened in runs) */
	/*
	 * Registration (issue 20): a range registered (or a heap part committed)
	 * with pages already present adopts them as resident, which can be more
	 * than the budget (a running JVM at attach). The pager evicts down to the
	 * budget right then, in the registering thread; peak_resident_pages
	 * counts from there, and these say what it found.
	 */
	uint64_t adopt_peak_pages;   /* gauge: the most resident pages right after an adoption, before that eviction */
	uint64_t adopt_evictions;    /* pages evicted at registration to bring adopted pages under the budget */
	uint64_t forks;              /* fork()s whose child got the paged ranges (uffd/fork.c) */
	uint64_t fork_pages_fetched; /* pages brought home from memd for them */
	uint64_t forks_without_paged;/* fork()s whose child did not: too little free memory */
	/* The block after lat_hist is 32 words, and this is its last. */
	uint64_t evictions_captured; /* dirty pages evicted through a capture (capture.h), not write-protected */
	/*
	 * Version 2: a second block of 32 words. The JVM at far memory (issue 18).
	 * gc_conc_faults: of gc_faults, those of the collector's concurrent threads
	 * (marking, refinement); the rest were taken by the pause workers.
	 */
	uint64_t gc_conc_faults;
	/* A collector's object moves done where the pages lie (uffd/compact.c, a full GC's compaction). */
	uint64_t compact_moves;      /* moves done in place: some of their pages only in memd's store */
	uint64_t compact_bytes;      /* bytes those moves carried */
	uint64_t compact_pages;      /* memd pages changed in its store, never brought here */
	uint64_t compact_declined;   /* moves handed back to the collector (a page busy, memd full, no store here) */
	/*
	 * Discarded free space whose memory memd keeps for the slots' next
	 * writes (transport.h, fm_chan_forget; shm): a gauge, and the pages given
	 * back since (the oldest, past a quarter of the registered pages).
	 */
	uint64_t discard_kept;
	uint64_t discard_released;
	/* Of evictions_captured, pages read from the pipe straight into their slot in memd's store (shm). */
	uint64_t evictions_in_place;
	/* Remote pages faulted back within one budget of evictions after they left: the clock keeps them longer. */
	uint64_t refaults_soon;
	/*
	 * Of faults, those in regions the kernel waits for (malloc heaps) of a
	 * pager that serves the others in the faulting thread: a handler
	 * thread served these (pager.h, FM_REG_KERNEL_WAITS).
	 */
	uint64_t heap_faults;
	/*
	 * The program's mremaps of paged memory done by the kernel's own mremap
	 * (uffd/remap.c), each region's books and memd space going with it: its
	 * resident pages (moved in the page tables) and its pages in memd, which
	 * stayed in their slots (nothing read, written or copied).
	 */
	uint64_t remaps;
	uint64_t remap_pages_resident;
	uint64_t remap_pages_kept;
	/* Clean pages a collector's move wrote, unprotected by the move (in runs) rather than by a fault each. */
	uint64_t compact_opened;
	/* Clean pages after one a pause worker's write faulted on, opened with it (a guess: uffd/fault.c). */
	uint64_t wp_opened_ahead;
	/*
	 * The handler that serves faults the faulting thread sleeps for, moved
	 * to a faulting thread's CPU at idle priority (uffd/follow.h), and put
	 * back by its watch because it was starved there.
	 */
	uint64_t follows;
	uint64_t follow_stalls;
	/*
	 * A gauge: the highest budget in force. A percentage budget follows the
	 * registered pages, and falls when the program unmaps: local_limit_pages
	 * is then below a peak_resident_pages that was within the budget of its day.
	 */
	uint64_t peak_limit_pages;
	/*
	 * Ranges the program made that the pager could not take (its region
	 * table full, memd refusing the space): they stay local memory.
	 */
	uint64_t refused_ranges;
	uint64_t refused_bytes;
	/*
	 * Remote pages faulted back within three budgets of evictions after
	 * they left (refaults_soon is within one): with refaults_soon, how many
	 * faults a budget twice or four times as large would have saved, about.
	 */
	uint64_t refaults_3budgets;
	/*
	 * A gauge: the most memory ever registered at once (registered_pages
	 * falls as the program unmaps, to next to nothing at its exit).
	 */
	uint64_t peak_registered_pages;
	/*
	 * evict_move (uffd/capture.h, stages): dirty pages evicted by moving
	 * them out (UFFDIO_MOVE), and victims the kernel would not move because
	 * they were pinned for I/O in flight, kept resident.
	 */
	uint64_t evictions_moved;
	uint64_t evict_pinned;
	/*
	 * Ranges a system call or futex wait is using, kept from eviction
	 * (uffd/pins.h): a gauge of the most held at once, and pins the table
	 * had no room for (MAX_PINS: such a call's buffer is made resident but
	 * may leave again, and the call is made again after EFAULT).
	 */
	uint64_t peak_pins;
	uint64_t pins_refused;
	/* Requests of other processes' process_vm_readv/writev this process lent its pages to (lend.h). */
	uint64_t lend_requests;
	/*
	 * Handler threads' read-on after a fault (fill_spin_us) cut short
	 * because a yield gave the CPU to another thread for a slice (monitor.c).
	 */
	uint64_t spin_crowded;
	/* Faults served by a handler past the first on its uffd: a helper, called when faults queued (monitor.c). */
	uint64_t helped_faults;
	/*
	 * Pages chosen to leave because a thread's run, going round more than
	 * the budget, had passed them (loop_evict, uffd/evict.c): 0 when the
	 * rule never acted.
	 */
	uint64_t loop_evictions;
	/*
	 * Faults on pages the rule had chosen: in a run (a loop coming back
	 * round, the rule's case) or not (memory used at random, the clock's);
	 * the rule stands down while the second outweighs the first, and takes
	 * runs of writes only while the first outweighs the second (prefetch.c).
	 */
	uint64_t loop_back_run;
	uint64_t loop_back_random;
	/*
	 * Pages booked over the budget: a fill at the limit whose evictions
	 * found nothing to take, a few times over (every page held or pinned,
	 * memd full or lost: uffd/fault.c, reserve_room), and pages adopted at
	 * a registration (or settled later, fm_pager_settle) that its eviction
	 * could not bring under the budget (uffd/region.c, settle).
	 */
	uint64_t over_budget_fills;
	uint64_t over_budget_adopted;
	/*
	 * Pages of an object that a program thread's fault on its first page
	 * touched, read with that page (the JVM agent read the object's
	 * header: pager.h, object_end; prefetch.c).
	 */
	uint64_t object_reads;
	/*
	 * A JVM's pauses, as its agent read the JVM's collection counts: full
	 * collections, and pauses that counted no collection (G1's remarks: a
	 * concurrent marking that ran to its end, not cut short by a full GC;
	 * JDK 17's cleanup pause counts itself a collection, unless a full GC
	 * aborted its marking after the remark).
	 */
	uint64_t full_gcs;
	uint64_t remark_pauses;
	/*
	 * Pages of objects read with a collector's fault on another object's
	 * header, found by the references after the one it followed (pager.h,
	 * referents; prefetch.c).
	 */
	uint64_t referent_reads;
	uint64_t reserved3[2];
};

struct fm_resmap_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t page_shift;
	uint32_t hdr_size;           /* FM_RESMAP_MAP_OFFSET */
	uint64_t pid;
	uint64_t start_time_ns;      /* CLOCK_REALTIME at pager start */
	uint64_t swap_epoch;         /* advances when churn exceeds epoch_churn_pct */
	uint64_t churn_pages;        /* pages filled + evicted since the last advance */
	uint64_t gc_cycles;          /* GarbageCollectionFinish events seen */
	uint32_t gc_active;          /* 1 between GarbageCollectionStart and Finish */
	uint32_t epoch_churn_pct;
	uint32_t nregions;           /* slots in use are flagged FM_REGION_F_LIVE */
	uint32_t transport;          /* enum fm_xport_kind (memd/client/include/transport.h) */
	uint64_t map_capacity;       /* bytes of page-state area */
	uint64_t map_used;
	char     memd[128];          /* address of the memory server, for tools */
	struct fm_resmap_region regions[FM_RESMAP_MAX_REGIONS];
	struct fm_pager_stats stats;
	struct fm_resmap_region more_regions[FM_RESMAP_MORE_REGIONS];
};

_Static_assert(sizeof(struct fm_resmap_hdr) <= FM_RESMAP_MAP_OFFSET, "header fits");

/* Slot i of the region table, i < FM_RESMAP_SLOTS. */
static inline const struct fm_resmap_region *fm_resmap_slot_ro(const struct fm_resmap_hdr *h, unsigned i)
{
	return i < FM_RESMAP_MAX_REGIONS ? &h->regions[i] : &h->more_regions[i - FM_RESMAP_MAX_REGIONS];
}

/* The same, for the pager, its only writer. */
static inline struct fm_resmap_region *fm_resmap_slot(struct fm_resmap_hdr *h, unsigned i)
{
	return (struct fm_resmap_region *)fm_resmap_slot_ro(h, i);
}

/* The Java heap's region (a private mapping, not a shared-memory heap), or NULL. */
static inline const struct fm_resmap_region *fm_resmap_heap(const struct fm_resmap_hdr *h)
{
	for (unsigned i = 0; i < FM_RESMAP_SLOTS; i++) {
		const struct fm_resmap_region *r = fm_resmap_slot_ro(h, i);
		if ((r->flags & (FM_REGION_F_LIVE | FM_REGION_F_HEAP | FM_REGION_F_SHMEM)) ==
		    (FM_REGION_F_LIVE | FM_REGION_F_HEAP))
			return r;
	}
	return NULL;
}

/* Histogram bucket of a duration: 8 buckets per power of two of ns. */
static inline unsigned fm_lat_bucket(uint64_t ns)
{
	if (ns < 8)
		return (unsigned)ns;
	unsigned lg = 63u - (unsigned)__builtin_clzll(ns);
	unsigned sub = (unsigned)(ns >> (lg - 3)) & 7u;
	unsigned b = (lg - 2) * 8u + sub;
	return b < FM_LAT_BUCKETS ? b : FM_LAT_BUCKETS - 1;
}

/* Lower bound in ns of bucket b; the inverse of fm_lat_bucket. */
static inline uint64_t fm_lat_bucket_floor(unsigned b)
{
	if (b < 8)
		return b;
	unsigned lg = b / 8u + 2u, sub = b % 8u;
	return (8ull + sub) << (lg - 3);
}

#endif /* FARMEM_RESMAP_H */
