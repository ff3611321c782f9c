/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Types shared by farmem_trace.bpf.c (kernel side) and farmem_trace.c (the
 * farmem-trace loader). Only __u32/__u64 and fixed arrays: both sides see
 * the same layout.
 */
#ifndef FARMEM_TRACE_H
#define FARMEM_TRACE_H

#define FMT_COMM_LEN   16
#define FMT_LAT_SLOTS  32  /* log2 buckets of nanoseconds: slot s holds [2^s, 2^(s+1)) */
#define FMT_MAX_PIDS   64  /* -p may be given this many times */
#define FMT_PIDSET_MAX 4096 /* processes in map `pids` (system-wide mode: the farmem processes) */

/* Flags of a pid in map `pids`. */
#define FMT_PID_TRACE  0x1u /* trace this process */
#define FMT_PID_UFFD   0x2u /* it holds a userfaultfd: its in-fault waits are userfaultfd waits */
#define FMT_STACK_DEPTH 8 /* frames looked at for handle_userfault (it is the 3rd-5th); the walk stops here */

/* Which events go to the ring buffer (the -e list); aggregates are always kept. */
#define FMT_EV_FAULT   0x1u /* every user page fault: address, error code */
#define FMT_EV_MAJOR   0x2u /* major faults: address */
#define FMT_EV_GC      0x4u /* HotSpot gc__begin / gc__end */
#define FMT_EV_RECLAIM 0x8u /* memcg and direct reclaim of a traced process ended */

enum fmt_event_type {
	FMT_FAULT = 1,
	FMT_MAJOR = 2,
	FMT_GC_BEGIN = 3,
	FMT_GC_END = 4,
	FMT_RECLAIM = 5,
};

struct fmt_event {
	__u64 ts;     /* bpf_ktime_get_ns() */
	__u64 addr;   /* FAULT/MAJOR: faulting address */
	__u64 arg;    /* FAULT: error code; GC_BEGIN: full; RECLAIM: pages reclaimed */
	__u64 dur_ns; /* GC_END, RECLAIM: duration */
	__u32 pid;
	__u32 tid;
	__u32 type;   /* enum fmt_event_type */
	__u32 pad;
	char comm[FMT_COMM_LEN];
};

/* Per thread; only the thread itself (or the scheduler switching it in) writes it. */
struct fmt_tstat {
	__u32 pid;
	__u32 tid;
	__u64 pf_user;       /* exceptions:page_fault_user */
	__u64 pf_write;      /* error code bit 1 */
	__u64 pf_prot;       /* error code bit 0: protection (e.g. write-protect) faults */
	__u64 maj;           /* perf PERF_COUNT_SW_PAGE_FAULTS_MAJ */
	__u64 min;           /* perf PERF_COUNT_SW_PAGE_FAULTS_MIN (uffd-served faults are minor) */
	__u64 fault_ns;      /* page_fault_user to the perf event that accounts the fault */
	__u64 maj_ns;        /* the same, major faults only */
	__u64 uffd_waits;    /* userfaultfd faults: off-CPU with handle_userfault on the stack (fault=thread),
	                      * or served by the pager's SIGBUS handler, fault entry to its sigreturn (fault=signal) */
	__u64 uffd_wait_ns;
	__u64 fault_block_ns;/* off-CPU in a fault for any other reason (swap-in I/O, locks) */
	__u64 reclaims;      /* memcg + direct reclaim runs in this thread */
	__u64 reclaim_ns;
	__u64 reclaimed;     /* pages they reclaimed */
	__u64 sig_faults;    /* of uffd_waits, the faults served in the faulting thread (fault=signal): the
	                      * kernel counts them nowhere else, so the loader adds them to min */
	__u64 lat_hist[FMT_LAT_SLOTS]; /* fault latency, log2 ns */
	/* state, not figures */
	__u64 fault_start;   /* ts of the fault in progress, 0 when none */
	__u64 block_start;   /* ts the thread blocked inside a fault */
	__u64 reclaim_start;
	__u64 fault_ip;      /* user ip of the fault in progress (system-wide mode) */
	__u64 sig_start;     /* ts of the fault a SIGBUS handler is serving (fault=signal), 0 when none */
	__u32 block_uffd;    /* the current block is a userfaultfd wait */
	__u32 pad;
};

/* Per process: HotSpot GC phases from USDT. */
struct fmt_gcstat {
	__u64 begins;
	__u64 ends;
	__u64 gc_ns;
	__u64 begin_ts;  /* 0 when no GC is running */
	__u64 full;      /* the running (or last) GC is a full GC */
};

/* Global counters (array index). */
enum fmt_global {
	FMT_G_KSWAPD_WAKE = 0,
	FMT_G_SHRINK_RECLAIMED,  /* lru_shrink_inactive nr_reclaimed, every process and kswapd */
	FMT_G_MEMCG_RECLAIM,
	FMT_G_DIRECT_RECLAIM,
	FMT_G_EVENTS_LOST,       /* ring buffer full */
	FMT_G_MAX,
};

#endif /* FARMEM_TRACE_H */
