// SPDX-License-Identifier: Apache-2.0
/* Where a fault-handler thread runs: follow.h says why. */
#include "follow.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager_internal.h"
#include "uffd_ops.h"

#define FOLLOW_STREAK 4
#define FOLLOW_QUIET_MS 50
#define FOLLOW_WATCH_MS 4
#define FOLLOW_HOLDOFF_MS 100
#define FOLLOW_RECHECK_NS (10ull * 1000 * 1000)
/*
 * At most one round of /proc reads per FOLLOW_READ_NS on the handler's path:
 * with many faulting threads (arenatest: 120) each new or stale thread
 * would otherwise cost a read per fault. A fault of a thread it cannot look
 * up now is left out of the streaks.
 */
#define FOLLOW_READ_NS (1000ull * 1000)
/* While it follows: of FOLLOW_WINDOW faults, more than FOLLOW_FOREIGN from other CPUs end it. */
#define FOLLOW_WINDOW 64
#define FOLLOW_FOREIGN 16

#define MS_NS (1000ull * 1000)

void fm_follow_init(struct fm_follow *fw)
{
	memset(fw, 0, sizeof(*fw));
	fw->fd = -1;
	pthread_mutex_init(&fw->lock, NULL);
	pthread_cond_init(&fw->cond, NULL);
}

/*
 * May this thread leave SCHED_IDLE again? The kernel takes SCHED_IDLE for
 * nice 20 and lets it back to SCHED_OTHER only within RLIMIT_NICE, or with
 * CAP_SYS_NICE (root has it; a program run as another user mostly not).
 */
static int may_come_back(void)
{
	struct rlimit rl;
	char buf[2048], *s;
	unsigned long long eff;

	if (!getrlimit(RLIMIT_NICE, &rl) && rl.rlim_cur >= 20)
		return 1;
	if (fm_read_file("/proc/thread-self/status", buf, sizeof(buf)) <= 0 || !(s = strstr(buf, "CapEff:")))
		return 0;
	eff = strtoull(s + 7, NULL, 16);
	return !!(eff & (1ull << 23)); /* CAP_SYS_NICE */
}

void fm_follower_init(struct fm_pager *p, struct fm_follower *f, int fd)
{
	struct fm_follow *fw = &p->follow;

	memset(f, 0, sizeof(*f));
	f->at = f->seen = -1;
	/* The watch was made only where following can happen; without it nothing would catch it starved. */
	f->enabled = fw->watch_started && !sched_getaffinity(0, sizeof(fw->cpus), &fw->cpus);
	/* A thread it wakes takes its CPU at once: it is not at work for the watch then (follow.h). */
	fm_uffd_mark_wakes(f->enabled ? &fw->serving : NULL);
	atomic_store(&fw->tid, gettid());
	fw->fd = fd;
}

/*
 * The CPU thread tid last ran on: /proc's stat, field 39. -1 when it cannot be
 * read. No printf or scanf here, on a handler's path (fm_fmt): they look up
 * the program's registered printf handlers (register_printf_specifier, which
 * R's libraries call), kept in its heap, which may be paged; a handler that
 * faulted there waited for itself.
 */
static int proc_cpu(pid_t tid)
{
	char path[64], buf[1024], *s;
	int field = 2, cpu = 0;

	fm_fmt(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	if (fm_read_file(path, buf, sizeof(buf)) <= 0)
		return -1;
	/* Field 2, the name, is in parentheses and may hold spaces: count from its end. */
	s = strrchr(buf, ')');
	while (s && *s && field < 39)
		if (*s++ == ' ')
			field++;
	if (!s || *s < '0' || *s > '9')
		return -1;
	while (*s >= '0' && *s <= '9')
		cpu = cpu * 10 + (*s++ - '0');
	return cpu;
}

/*
 * More tasks want to run than the handler's CPUs: then a faulting thread's
 * CPU does not go idle while it waits (another takes it), following gains
 * nothing, and a handler at idle priority would wait behind them all.
 * /proc/loadavg's fourth field: runnable tasks now, the reader included.
 */
static int crowded(const struct fm_follow *fw)
{
	char buf[128], *s;
	long running;

	if (fm_read_file("/proc/loadavg", buf, sizeof(buf)) <= 0 || !(s = strchr(buf, '/')))
		return 1;
	while (s > buf && s[-1] != ' ')
		s--;
	running = strtol(s, NULL, 10);
	return running > CPU_COUNT(&fw->cpus);
}

static int may_read(struct fm_follower *f, uint64_t now)
{
	if (now < f->next_read_ns)
		return 0;
	f->next_read_ns = now + FOLLOW_READ_NS;
	return 1;
}

/*
 * A faulting thread's CPU, looked up again after FOLLOW_RECHECK_NS (it may
 * have moved) when the read budget allows; -1 for a thread not known yet
 * when it does not.
 */
static int cpu_of(struct fm_follower *f, pid_t tid, uint64_t now)
{
	unsigned k;

	for (k = 0; k < FOLLOW_CPUS_SEEN; k++)
		if (f->cpus[k].tid == tid)
			break;
	if (k == FOLLOW_CPUS_SEEN) {
		if (!may_read(f, now))
			return -1;
		k = f->next_slot++ % FOLLOW_CPUS_SEEN;
		f->cpus[k].tid = tid;
		f->cpus[k].checked_ns = 0;
	} else if (now - f->cpus[k].checked_ns <= FOLLOW_RECHECK_NS || !may_read(f, now)) {
		return f->cpus[k].cpu;
	}
	f->cpus[k].cpu = proc_cpu(tid);
	f->cpus[k].checked_ns = now;
	f->recheck = 1; /* the crowded check after it rides on this read's budget */
	return f->cpus[k].cpu;
}

/* Back on the handler's own CPUs at normal priority (from the handler, or from the watch with its tid). */
static void restore(struct fm_follow *fw, pid_t tid)
{
	struct sched_param sp = { 0 };

	if (sched_setscheduler(tid, SCHED_OTHER, &sp) || sched_setaffinity(tid, sizeof(fw->cpus), &fw->cpus))
		fm_debug("follow: cannot put handler %d back: %s", (int)tid, fm_strerror(errno));
}

static void *watch_main(void *arg)
{
	struct fm_pager *p = arg;
	struct fm_follow *fw = &p->follow;

	pthread_setname_np(pthread_self(), "farmem-watch");
	pthread_mutex_lock(&fw->lock);
	while (!fw->stop) {
		uint64_t beat;
		struct pollfd pf = { .fd = fw->fd, .events = POLLIN };
		struct timespec ts = { 0, FOLLOW_WATCH_MS * MS_NS };
		int on = FM_FOLLOW_ON;

		if (atomic_load(&fw->state) != FM_FOLLOW_ON) {
			pthread_cond_wait(&fw->cond, &fw->lock);
			continue;
		}
		pthread_mutex_unlock(&fw->lock);
		beat = atomic_load(&fw->beat);
		nanosleep(&ts, NULL);
		/*
		 * No turn of its loop in a whole tick while it served a fault
		 * (maybe holding a page others wait for), or while a fault, a
		 * page or the region lock waited: it is starved where it is
		 * pinned, or slow, and better off unpinned. Spinning with
		 * nothing to do, or just after it woke the thread it served, it
		 * may well not run: the program has its CPU, as it should.
		 */
		if (atomic_load(&fw->beat) == beat &&
		    (atomic_load(&fw->serving) || atomic_load(&p->settle_waiters) ||
		     atomic_load(&p->rlock_writers) || fm_sys_poll(&pf, 1, 0) > 0) &&
		    atomic_compare_exchange_strong(&fw->state, &on, FM_FOLLOW_STALLED)) {
			restore(fw, (pid_t)atomic_load(&fw->tid));
			STAT_ADD(p, follow_stalls, 1);
		}
		pthread_mutex_lock(&fw->lock);
	}
	pthread_mutex_unlock(&fw->lock);
	return NULL;
}

/*
 * The watch, at normal priority (a thread made by one at SCHED_IDLE would be
 * SCHED_IDLE too), made beside the handler that may follow, never by it: a
 * handler in pthread_create waits for glibc's locks, which a thread that
 * faults on paged memory may hold (a child after fork: glibc's stack cache,
 * then its main arena, then a fault in that arena).
 */
void fm_follow_prepare(struct fm_pager *p)
{
	struct fm_follow *fw = &p->follow;
	struct sched_param sp = { 0 };
	pthread_attr_t a;
	cpu_set_t cpus;
	int rc;

	if (!p->cfg.fill_follow || sched_getaffinity(0, sizeof(cpus), &cpus) || CPU_COUNT(&cpus) < 2 ||
	    !may_come_back())
		return;
	pthread_mutex_lock(&fw->lock);
	if (fw->watch_started || fw->stop || pthread_attr_init(&a)) {
		pthread_mutex_unlock(&fw->lock);
		return;
	}
	rc = pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED) ||
	     pthread_attr_setschedpolicy(&a, SCHED_OTHER) || pthread_attr_setschedparam(&a, &sp) ||
	     fm_thread_create(&fw->watch, &a, watch_main, p);
	pthread_attr_destroy(&a);
	fw->watch_started = !rc;
	pthread_mutex_unlock(&fw->lock);
}

static void leave(struct fm_pager *p, struct fm_follower *f, uint64_t holdoff_until)
{
	struct fm_follow *fw = &p->follow;
	int on = FM_FOLLOW_ON;

	/* The watch may have put it back already (STALLED), and it may have pinned itself again since. */
	atomic_compare_exchange_strong(&fw->state, &on, FM_FOLLOW_OFF);
	if (f->at >= 0)
		restore(fw, 0);
	atomic_store(&fw->state, FM_FOLLOW_OFF);
	f->at = -1;
	f->streak = 0;
	f->holdoff_until_ns = holdoff_until;
}

static void follow_to(struct fm_pager *p, struct fm_follower *f, int cpu)
{
	struct fm_follow *fw = &p->follow;
	struct sched_param sp = { 0 };
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (sched_setaffinity(0, sizeof(one), &one))
		return; /* not one of ours (a cpuset): stay */
	if (f->at < 0 && sched_setscheduler(0, SCHED_IDLE, &sp)) {
		sched_setaffinity(0, sizeof(fw->cpus), &fw->cpus);
		return;
	}
	f->window = f->foreign = 0;
	if (f->at >= 0) {
		f->at = cpu;
		pthread_mutex_lock(&fw->lock);
		if (fw->watch_started)
			pthread_setaffinity_np(fw->watch, sizeof(one), &one);
		pthread_mutex_unlock(&fw->lock);
		return;
	}
	f->at = cpu;
	STAT_ADD(p, follows, 1);
	pthread_mutex_lock(&fw->lock);
	atomic_store(&fw->state, FM_FOLLOW_ON);
	/*
	 * The watch runs where the handler does: a thread of ours that ran on
	 * another CPU would make that CPU take every eviction's TLB shootdown,
	 * woken from idle for it.
	 */
	if (fw->watch_started)
		pthread_setaffinity_np(fw->watch, sizeof(one), &one);
	pthread_cond_signal(&fw->cond);
	pthread_mutex_unlock(&fw->lock);
}

void fm_follow_fault(struct fm_pager *p, struct fm_follower *f, pid_t tid, uint64_t now)
{
	int cpu;

	if (!f->enabled || tid <= 0)
		return;
	f->last_fault_ns = now;
	cpu = cpu_of(f, tid, now);
	if (cpu < 0)
		return;
	if (f->recheck) {
		f->recheck = 0;
		if (f->at >= 0 && crowded(&p->follow)) {
			leave(p, f, now + FOLLOW_HOLDOFF_MS * MS_NS);
			return;
		}
	}
	if (f->at >= 0) {
		f->window++;
		f->foreign += cpu != f->at;
		if (f->window == FOLLOW_WINDOW) {
			if (f->foreign > FOLLOW_FOREIGN) {
				/* Faulting threads on several CPUs: one handler cannot be beside them all. */
				leave(p, f, now + FOLLOW_HOLDOFF_MS * MS_NS);
				return;
			}
			f->window = f->foreign = 0;
		}
	}
	if (cpu == f->at) {
		f->streak = 0;
		return;
	}
	if (cpu != f->seen) {
		f->seen = cpu;
		f->streak = 0;
	}
	if (++f->streak < FOLLOW_STREAK || now < f->holdoff_until_ns)
		return;
	/* Already following, it moves along at once: its rechecks look at the load. */
	if (f->at < 0) {
		if (!may_read(f, now)) {
			f->streak--; /* the next fault of the streak looks at the load */
			return;
		}
		if (crowded(&p->follow)) {
			f->streak = 0;
			f->holdoff_until_ns = now + FOLLOW_HOLDOFF_MS * MS_NS;
			return;
		}
	}
	f->streak = 0;
	follow_to(p, f, cpu);
}

void fm_follow_turn(struct fm_pager *p, struct fm_follower *f, uint64_t now)
{
	struct fm_follow *fw = &p->follow;

	if (!f->enabled)
		return;
	atomic_fetch_add_explicit(&fw->beat, 1, memory_order_relaxed);
	if (f->at < 0)
		return;
	if (atomic_load(&fw->state) == FM_FOLLOW_STALLED) {
		/* Starved where it followed to: each time again, it waits twice as long before it follows. */
		if (f->stalls < 7)
			f->stalls++;
		leave(p, f, now + (FOLLOW_HOLDOFF_MS * MS_NS << f->stalls));
	}
	else if (now - f->last_fault_ns > FOLLOW_QUIET_MS * MS_NS)
		leave(p, f, 0);
}

int fm_follow_poll_ms(const struct fm_follower *f)
{
	return f->at >= 0 ? FOLLOW_QUIET_MS : -1;
}

void fm_follow_serving(struct fm_pager *p, const struct fm_follower *f, int serving)
{
	if (f->enabled)
		atomic_store_explicit(&p->follow.serving, serving, memory_order_relaxed);
}

void fm_follow_stop(struct fm_pager *p)
{
	struct fm_follow *fw = &p->follow;
	int started;

	pthread_mutex_lock(&fw->lock);
	fw->stop = 1;
	started = fw->watch_started;
	/* The handlers are about to stop: none may be left waiting, starved, to read that. */
	if (atomic_load(&fw->state) == FM_FOLLOW_ON) {
		int on = FM_FOLLOW_ON;

		if (atomic_compare_exchange_strong(&fw->state, &on, FM_FOLLOW_STALLED))
			restore(fw, (pid_t)atomic_load(&fw->tid));
	}
	pthread_cond_broadcast(&fw->cond);
	pthread_mutex_unlock(&fw->lock);
	if (started)
		pthread_join(fw->watch, NULL);
}
