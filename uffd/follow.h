/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where a fault-handler thread runs (fill_follow).
 *
 * A fault the faulting thread sleeps for (glibc's heaps with fault=signal,
 * every fault with fault=thread) passes from that thread to a handler and
 * back. On two CPUs the faulting thread's CPU goes idle while it waits, and
 * waking it there again (an IPI; on a VM an exit to the host when the idle
 * vCPU halted) cost more than the rest of the fault: a random rewrite took
 * 2.6x as long as with both threads on one CPU (bench/RESULTS.md).
 *
 * So the handler follows: once it served FOLLOW_STREAK faults in a row from
 * threads on one CPU, it pins itself there at SCHED_IDLE. A thread that
 * faults there leaves the CPU to the handler (the only other task on it,
 * woken there), and the handler's wakeup of it finds a CPU the scheduler
 * counts as idle (only SCHED_IDLE work), so it comes back to that CPU and
 * takes it from the handler at once: no IPI, no halt, and the handler takes
 * no time from the program. It stops following after FOLLOW_QUIET_MS
 * without a fault, or when faults come from other CPUs too.
 *
 * A SCHED_IDLE thread gets almost no time on a CPU that has other work, so a
 * fault from another CPU could wait behind that work, and so could every
 * thread waiting for a page the handler holds. A watch thread (normal
 * priority, awake only while a handler follows) checks every FOLLOW_WATCH_MS
 * that the handler turned its loop while it served a fault, while one waited
 * on its uffd, or while a thread waited for a page to settle or for the
 * region lock (not while it spins or sleeps with nothing to do), and
 * otherwise puts it back (its CPUs, SCHED_OTHER) for FOLLOW_HOLDOFF_MS,
 * doubled each time. Waking the thread it served (an install, an unprotect)
 * does not count as serving (fm_uffd_mark_wakes): that thread takes the CPU
 * at once, and often runs on for longer than a tick without a fault, while
 * the handler holds only pages and the region lock for reading, which the
 * waits above cover. Counted as starved then, it was put back at every
 * stretch of the program's own work (Perl's hash: 4-6 times a run, each time
 * for a holdoff of cross-CPU faults).
 */
#ifndef FARMEM_FOLLOW_H
#define FARMEM_FOLLOW_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

struct fm_pager;

#define FOLLOW_CPUS_SEEN 16

/* The following handler's own books (its stack). */
struct fm_follower {
	int enabled;
	int at;                   /* the CPU it is pinned to, -1 when it does not follow */
	int seen;                 /* the CPU of the faults of its current streak */
	unsigned streak;
	unsigned window, foreign; /* while following: faults, and those from other CPUs */
	uint64_t last_fault_ns;
	uint64_t holdoff_until_ns;
	struct { pid_t tid; int cpu; uint64_t checked_ns; } cpus[FOLLOW_CPUS_SEEN];
	unsigned next_slot;
	int recheck;              /* a CPU was looked up again: see whether the machine is crowded too */
	uint64_t next_read_ns;    /* the next /proc read on the handler's path, no sooner */
	unsigned stalls;          /* times the watch put it back: the holdoff doubles with each */
};

/* The pager's part, shared with the watch thread (struct fm_pager.follow). */
struct fm_follow {
	atomic_int state;             /* FM_FOLLOW_* */
	atomic_int tid;               /* the handler that follows */
	atomic_uint_fast64_t beat;    /* that handler's loop turns */
	atomic_int serving;           /* it is serving a fault (it may hold pages others wait for) */
	int fd;                       /* the uffd it reads: a fault waiting there shows as POLLIN */
	cpu_set_t cpus;               /* its CPUs before it followed */
	pthread_mutex_t lock;
	pthread_cond_t cond;          /* the watch sleeps on it while nobody follows */
	pthread_t watch;
	int watch_started, stop;
};

enum { FM_FOLLOW_OFF, FM_FOLLOW_ON, FM_FOLLOW_STALLED };

void fm_follow_init(struct fm_follow *fw);
/*
 * Before the handler that may follow starts, in the thread that starts it:
 * the watch thread, when following can happen here (fill_follow, more than
 * one CPU, a way back from SCHED_IDLE). A handler never creates a thread.
 */
void fm_follow_prepare(struct fm_pager *p);
/* In the handler thread that is to follow (fd: the uffd it reads). */
void fm_follower_init(struct fm_pager *p, struct fm_follower *f, int fd);
/* After each fault it served (tid: the faulting thread's, from the uffd message). */
void fm_follow_fault(struct fm_pager *p, struct fm_follower *f, pid_t tid, uint64_t now);
/* Each turn of its loop: its heartbeat for the watch, and where it stops following. */
void fm_follow_turn(struct fm_pager *p, struct fm_follower *f, uint64_t now);
/* The poll timeout: FOLLOW_QUIET_MS while it follows (to stop when faults stop), else -1. */
int fm_follow_poll_ms(const struct fm_follower *f);
/* Around what it read off the uffd: the watch looks for progress then even with no fault waiting. */
void fm_follow_serving(struct fm_pager *p, const struct fm_follower *f, int serving);
/* Stop the watch thread: before the handlers stop (it acts on a handler's thread id). */
void fm_follow_stop(struct fm_pager *p);

#endif
