// SPDX-License-Identifier: Apache-2.0
/* Where faults arrive (monitor.h). */
#include "monitor.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "chanpool.h"
#include "evict.h"
#include "fault.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "stacks.h"
#include "uffd_compat.h"
#include "uffd_ops.h"

#define MSGS_PER_READ 16
/* Longer than a fault's round trip and far shorter than a scheduler slice (3 ms). */
#define CROWDED_YIELD_NS (500ull * 1000)
#define CROWDED_HOLDOFF_NS (100ull * 1000 * 1000)
/* How long helpers stay after faults last queued behind a handler: many faults' time, a small part of a slice. */
#define HELPERS_HOLD_NS (10ull * 1000 * 1000)
#define MAX_SIG_PAGERS 4

/* glibc's own, under the shim's sigaction interposer. */
extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *old);

static _Atomic(struct fm_pager *) sig_pagers[MAX_SIG_PAGERS];
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;
static int sig_installed;
static atomic_int sig_inside;          /* threads inside on_sigbus: a pager is freed only when none is */
static struct sigaction chained;       /* what ran for SIGBUS before us, or the program's since */

/* A SIGBUS that is not ours: what the program (or the default) would have done. */
static void chain(int sig, siginfo_t *si, void *uc)
{
	struct sigaction c = chained;

	if ((c.sa_flags & SA_SIGINFO) && c.sa_sigaction) {
		c.sa_sigaction(sig, si, uc);
		return;
	}
	if (c.sa_handler != SIG_DFL && c.sa_handler != SIG_IGN) {
		c.sa_handler(sig);
		return;
	}
	/* An ignored SIGBUS that was sent stays ignored; one of a fault kills, as the kernel would. */
	if (c.sa_handler == SIG_IGN && si->si_code <= 0)
		return;
	/*
	 * The default: die of it. A fault re-runs the access when we return, and
	 * it is delivered again, now with nobody in the way; a SIGBUS that was
	 * sent is sent again, and arrives once this handler has returned.
	 */
	c = (struct sigaction){ .sa_handler = SIG_DFL };
	__sigaction(SIGBUS, &c, NULL);
	if (si->si_code <= 0)
		kill(getpid(), SIGBUS);
}

/*
 * A thread of the program, at its start (the shim's pthread_create cover):
 * its stack of farmem's is its alternate stack before its first fault, which
 * may come while its code runs on a stack of the program's making in paged
 * memory, where the kernel could not write the signal's frame.
 */
void fm_monitor_thread_start(void)
{
	if (__atomic_load_n(&sig_installed, __ATOMIC_ACQUIRE))
		fm_stack_mine();
}

void fm_monitor_thread_end(void)
{
	fm_stack_thread_end();
}

void fm_monitor_altstack_released(void)
{
	if (__atomic_load_n(&sig_installed, __ATOMIC_ACQUIRE))
		fm_stack_altstack_again();
}

struct sigbus_call {
	siginfo_t *si;
	void *uc;
	int served;
};

static void serve_sigbus(void *v)
{
	struct sigbus_call *c = v;
	uintptr_t a = (uintptr_t)c->si->si_addr;

	for (int k = 0; k < MAX_SIG_PAGERS; k++) {
		struct fm_pager *p = atomic_load(&sig_pagers[k]);
		struct fm_fault f = { .addr = a, .in_thread = 1 };
		if (!p || !fm_region_maybe(p, a, a + 1))
			continue;
		f.t0 = fm_now_ns();
		f.fc.tid = fm_thread_id();
#if defined(__x86_64__)
		{
			/* The page-fault error code: bit 0, the page was present (so a write to a protected one); bit 1, a write. */
			unsigned long ec = (unsigned long)((ucontext_t *)c->uc)->uc_mcontext.gregs[REG_ERR];
			f.kind = (ec & 1) ? FM_FAULT_WP : FM_FAULT_MISSING;
			f.write = !!(ec & 2);
			/* REG_R8 to REG_RCX: the general registers but the stack pointer. */
			f.regs = (const uintptr_t *)(const void *)((ucontext_t *)c->uc)->uc_mcontext.gregs;
			f.nregs = REG_RSP;
			f.sp = (uintptr_t)((ucontext_t *)c->uc)->uc_mcontext.gregs[REG_RSP];
		}
#else
		f.kind = FM_FAULT_GUESS;
#endif
		if (fm_fault(p, &f) == 0 || fm_region_gone_recently(p, a)) {
			c->served = 1;
			return;
		}
	}
}

static void on_sigbus(int sig, siginfo_t *si, void *ucv)
{
	int saved = errno;
	struct sigbus_call c = { .si = si, .uc = ucv };

	atomic_fetch_add(&sig_inside, 1);
	if (si->si_code == BUS_ADRERR)
		if (!fm_stack_run(serve_sigbus, &c))
			serve_sigbus(&c); /* no stack of farmem's to be had: on the one it came on */
	atomic_fetch_sub(&sig_inside, 1);
	errno = saved;
	if (!c.served)
		chain(sig, si, ucv);
}

static int sigbus_install(struct fm_pager *p, char *err, size_t errlen)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK };
	int slot = -1;

	/* Nothing interrupts a fault being served: the handler holds pager locks for a moment. */
	sigfillset(&sa.sa_mask);
	pthread_mutex_lock(&sig_lock);
	for (int k = 0; k < MAX_SIG_PAGERS && slot < 0; k++)
		if (!atomic_load(&sig_pagers[k]))
			slot = k;
	if (slot < 0) {
		pthread_mutex_unlock(&sig_lock);
		snprintf(err, errlen, "more than %d pagers in one process", MAX_SIG_PAGERS);
		return -EBUSY;
	}
	if (!sig_installed) {
		struct sigaction old;
		if (__sigaction(SIGBUS, &sa, &old)) {
			pthread_mutex_unlock(&sig_lock);
			snprintf(err, errlen, "cannot install the SIGBUS handler: %s", fm_strerror(errno));
			return -errno;
		}
		chained = old;
		__atomic_store_n(&sig_installed, 1, __ATOMIC_RELEASE);
	}
	fm_monitor_unblock_sigbus();
	fm_stack_mine();
	atomic_store(&sig_pagers[slot], p);
	pthread_mutex_unlock(&sig_lock);
	return 0;
}

static void sigbus_remove(struct fm_pager *p)
{
	pthread_mutex_lock(&sig_lock);
	for (int k = 0; k < MAX_SIG_PAGERS; k++)
		if (atomic_load(&sig_pagers[k]) == p)
			atomic_store(&sig_pagers[k], NULL);
	/* The handler stays: it only chains now. A thread that took p before it left lets go first. */
	pthread_mutex_unlock(&sig_lock);
	while (atomic_load(&sig_inside))
		sched_yield();
}

void fm_monitor_child_reset(void)
{
	for (int k = 0; k < MAX_SIG_PAGERS; k++)
		atomic_store(&sig_pagers[k], NULL);
	fm_stack_child_reset();
	atomic_store(&sig_inside, 0);
	pthread_mutex_init(&sig_lock, NULL);
}

void fm_monitor_unblock_sigbus(void)
{
	sigset_t bus;

	sigemptyset(&bus);
	sigaddset(&bus, SIGBUS);
	pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
}

/* No lock: sigaction and sigsuspend, which ask, may be called from a signal handler. */
int fm_monitor_sigbus_ours(void)
{
	return __atomic_load_n(&sig_installed, __ATOMIC_ACQUIRE);
}

int fm_monitor_sigbus_action(const struct sigaction *act, struct sigaction *old)
{
	int ours;

	pthread_mutex_lock(&sig_lock);
	ours = sig_installed;
	if (ours) {
		if (old)
			*old = chained;
		if (act)
			chained = *act;
	}
	pthread_mutex_unlock(&sig_lock);
	return ours;
}

/*
 * Handler 0 of a fault=signal pager reads only events; handler 1 there
 * reads uffd_waits, whose faults the kernel waits for.
 */
static int handler_fd(const struct fm_pager *p, unsigned idx)
{
	return p->in_thread && idx > 0 ? p->uffd_waits : p->uffd;
}

/* The first handler of the faults on its uffd: the others help it (helpers_call). */
static unsigned first_server(const struct fm_pager *p)
{
	return p->in_thread ? 1u : 0u;
}

/*
 * Faults queued behind a handler (one read brought several): the helpers
 * serve beside it for HELPERS_HOLD_NS. The eventfd is written at every
 * extension, not only at the first, so that a helper that saw the hold
 * expire just before it was extended does not sleep through it; at most
 * one write per half hold.
 */
static void helpers_call(struct fm_pager *p)
{
	uint64_t now = fm_now_ns(), one = 1;

	if (atomic_load(&p->helpers_until) > now + HELPERS_HOLD_NS / 2)
		return;
	atomic_store(&p->helpers_until, now + HELPERS_HOLD_NS);
	if (fm_sys_write(p->helpers_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		fm_fatal("waking the fault handlers' helpers failed: %s", fm_strerror(errno));
}

/*
 * A helper with no call: asleep until one comes. Returns 1 when the pager
 * stops. The eventfd is drained before the hold is looked at, so a call
 * that comes in between leaves it readable.
 */
static int helper_sleep(struct fm_pager *p)
{
	struct pollfd pfd[2] = { { .fd = p->helpers_fd, .events = POLLIN }, { .fd = p->stop_fd, .events = POLLIN } };
	uint64_t v;

	(void)!fm_sys_read(p->helpers_fd, &v, sizeof(v));
	if (atomic_load(&p->helpers_until) > fm_now_ns())
		return 0;
	if (fm_sys_poll(pfd, 2, -1) < 0 && errno != EINTR)
		fm_fatal("waiting for a call to help failed: %s", fm_strerror(errno));
	return pfd[1].revents != 0;
}

static void *handler_main(void *arg)
{
	const struct fm_handler_arg *ha = arg;
	struct fm_pager *p = ha->p;
	unsigned idx = ha->idx;
	int fd = handler_fd(p, idx), events_only = p->in_thread && idx == 0, helper = idx > first_server(p);
	struct uffd_msg msgs[MSGS_PER_READ];
	char name[16];

	fm_fmt(name, sizeof(name), events_only ? "farmem-events" : "farmem-fault%u", idx);
	pthread_setname_np(pthread_self(), name);
	/*
	 * A handler asleep between faults is woken for the next one, and the
	 * wakeup of an idle CPU costs more than the rest of the fault (a VM
	 * exit here). So after a fault it reads on for fill_spin_us before it
	 * sleeps, yielding its CPU to any thread that wants it meanwhile.
	 */
	uint64_t spin_ns = events_only ? 0 : (uint64_t)p->cfg.fill_spin_us * 1000, spin_until = 0;
	/*
	 * A yield that gave the CPU away for longer than CROWDED_YIELD_NS found
	 * a thread there that does not fault (a busy loop, an MPI rank polling):
	 * spinning beside it, the handler is runnable but not running when the
	 * next fault comes, and that fault waits out the other thread's slice
	 * (milliseconds), where asleep in poll its wakeup would have taken the
	 * CPU or an idle one. No spin for CROWDED_HOLDOFF_NS after two such
	 * yields within CROWDED_HOLDOFF_NS: beside a busy thread one comes every
	 * few faults, while one slow yield alone is as often the VM's vCPU taken
	 * away for a moment (a clean-clone CI on a shared host cut the spin so
	 * once in a run of 2048 faults that had no other thread beside it).
	 */
	uint64_t spin_off_until = 0, slow_yield_at = 0;
	struct fm_follower fol = { .at = -1, .seen = -1 };
	struct fm_budget_watch watch = { 0 };
	struct fm_borrowed watch_chan = { .chan = p->handler_chan[idx], .tid = fm_thread_id() };

	/* One handler follows the threads it serves (follow.h): the first that serves faults. */
	if (idx == first_server(p))
		fm_follower_init(p, &fol, fd);
	for (;;) {
		struct epoll_event ready[2];
		int timeout_ms, nready, faults = 0;
		ssize_t n;

		fm_follow_turn(p, &fol, fm_now_ns());
		if (!spin_until || fm_now_ns() >= spin_until) {
			spin_until = 0;
			timeout_ms = fm_follow_poll_ms(&fol);
			if (!idx) {
				int w = fm_budget_watch_ms(p, &watch);
				timeout_ms = w >= 0 && (timeout_ms < 0 || w < timeout_ms) ? w : timeout_ms;
			}
			if (helper) {
				uint64_t now = fm_now_ns(), until = atomic_load(&p->helpers_until);
				if (now >= until) {
					if (helper_sleep(p))
						return NULL;
					continue;
				}
				timeout_ms = (int)((until - now + 999999) / 1000000);
			}
			/* The uffd is in each handler's set with EPOLLEXCLUSIVE: a fault wakes one that sleeps, not all. */
			nready = fm_sys_epoll_wait(p->handler_epfd[idx], ready, 2, timeout_ms);
			if (nready < 0 && errno != EINTR)
				fm_fatal("polling userfaultfd failed: %s", fm_strerror(errno));
			for (int k = 0; k < nready; k++)
				if (ready[k].data.fd == p->stop_fd)
					return NULL;
			if (!idx)
				fm_budget_watch_look(p, &watch, &watch_chan);
			if (nready <= 0)
				continue;
		}
		n = fm_sys_read(fd, msgs, sizeof(msgs));
		if (n < 0) {
			if (errno == EAGAIN && spin_until) {
				uint64_t t = fm_now_ns(), back;
				sched_yield();
				back = fm_now_ns();
				if (back - t > CROWDED_YIELD_NS) {
					if (slow_yield_at && back - slow_yield_at < CROWDED_HOLDOFF_NS) {
						slow_yield_at = 0;
						spin_off_until = back + CROWDED_HOLDOFF_NS;
						spin_until = 0;
						STAT_ADD(p, spin_crowded, 1);
					} else {
						slow_yield_at = back;
					}
				}
			}
			if (errno == EINTR || errno == EAGAIN)
				continue;
			fm_fatal("reading userfaultfd failed: %s", fm_strerror(errno));
		}
		/* What it read may hold pages and locks others wait for: the watch watches it now. */
		fm_follow_serving(p, &fol, 1);
		for (ssize_t k = 0; k < n / (ssize_t)sizeof(msgs[0]); k++) {
			struct uffd_msg *m = &msgs[k];
			switch (m->event) {
			case UFFD_EVENT_PAGEFAULT: {
				uint64_t fl = m->arg.pagefault.flags;
				struct fm_fault f = {
					.addr = (uintptr_t)m->arg.pagefault.address,
					.kind = (fl & UFFD_PAGEFAULT_FLAG_WP) ? FM_FAULT_WP
					      : (fl & UFFD_PAGEFAULT_FLAG_MINOR) ? FM_FAULT_MINOR : FM_FAULT_MISSING,
					.write = !!(fl & UFFD_PAGEFAULT_FLAG_WRITE),
					.fc = { .chan = p->handler_chan[idx], .tid = (pid_t)m->arg.pagefault.feat.ptid },
					/* An event queued behind others in this read waited for them: that is delivery, not handling. */
					.t0 = fm_now_ns(),
				};
				fm_fault(p, &f);
				fm_follow_fault(p, &fol, f.fc.tid, fm_now_ns());
				faults++;
				if (helper)
					STAT_ADD(p, helped_faults, 1);
				if (spin_ns) {
					uint64_t now = fm_now_ns();
					spin_until = now >= spin_off_until ? now + spin_ns : 0;
				}
				break;
			}
			case UFFD_EVENT_UNMAP:
				fm_fault_unmap(p, (uintptr_t)m->arg.remove.start, (uintptr_t)m->arg.remove.end);
				break;
			case UFFD_EVENT_REMAP:
				/*
				 * mremap of a paged range behind the shim's back: the pages
				 * now live at an address we do not track, so remote pages
				 * there could never come back right.
				 */
				fm_fatal("a paged range at %#llx was moved with mremap outside farmem's control",
					 (unsigned long long)m->arg.remap.from);
			default:
				fm_warn("ignoring userfaultfd event %u", m->event);
			}
		}
		fm_follow_serving(p, &fol, 0);
		if (faults > 1 && p->cfg.fill_threads > 1)
			helpers_call(p);
	}
}

static void handler_epfd_close(struct fm_pager *p, unsigned i)
{
	if (p->handler_epfd[i] >= 0)
		fm_fd_close(p->handler_epfd[i]);
	p->handler_epfd[i] = -1;
}

static int handler_start(struct fm_pager *p, unsigned i, int with_chan, char *err, size_t errlen)
{
	int rc;

	if (with_chan) {
		rc = fm_chan_open(p->x, &p->handler_chan[i]);
		if (rc) {
			snprintf(err, errlen, "cannot open a channel to memd: %s", fm_strerror(-rc));
			return rc;
		}
	}
	p->handler_epfd[i] = fm_fd_keep(epoll_create1(EPOLL_CLOEXEC));
	struct epoll_event on_fault = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = handler_fd(p, i) },
			   on_stop = { .events = EPOLLIN, .data.fd = p->stop_fd };
	if (p->handler_epfd[i] < 0 || epoll_ctl(p->handler_epfd[i], EPOLL_CTL_ADD, on_fault.data.fd, &on_fault) ||
	    epoll_ctl(p->handler_epfd[i], EPOLL_CTL_ADD, p->stop_fd, &on_stop)) {
		rc = -errno;
		snprintf(err, errlen, "cannot start a fault handler: epoll: %s", fm_strerror(errno));
		goto fail;
	}
	p->handler_args[i] = (struct fm_handler_arg){ .p = p, .idx = i };
	rc = -fm_thread_create(&p->handlers[i], NULL, handler_main, &p->handler_args[i]);
	if (rc) {
		snprintf(err, errlen, "cannot start a fault handler: %s", fm_strerror(-rc));
		goto fail;
	}
	return 0;
fail:
	fm_chan_close(p->handler_chan[i]);
	p->handler_chan[i] = NULL;
	handler_epfd_close(p, i);
	return rc;
}

int fm_monitor_waits_fd(struct fm_pager *p, char *err, size_t errlen)
{
	uint64_t got;
	int rc = 0;

	if (!p->in_thread)
		return p->uffd;
	pthread_mutex_lock(&p->waits_lock);
	if (p->uffd_waits >= 0)
		goto out;
	if (atomic_load(&p->stopping)) {
		snprintf(err, errlen, "the pager is stopping");
		rc = -ESHUTDOWN;
		goto out;
	}
	rc = fm_uffd_open_on(p->uffd_waits_spare, p->features & ~(uint64_t)UFFD_FEATURE_SIGBUS, &got, err, errlen);
	p->uffd_waits_spare = -1;
	if (rc < 0)
		goto out;
	p->uffd_waits = rc;
	/* Handler 1, which may follow (follow.h); the stop joins handlers [0, nhandlers). */
	fm_follow_prepare(p);
	rc = handler_start(p, 1, 1, err, errlen);
	if (rc) {
		close(p->uffd_waits);
		p->uffd_waits = -1;
		goto out;
	}
	p->nhandlers = 2;
	/* Its helpers (fill_threads): without them the program runs on, with one handler. */
	for (unsigned i = 2; i <= p->cfg.fill_threads && i < MAX_HANDLERS; i++) {
		if (handler_start(p, i, 1, err, errlen)) {
			fm_warn("%s: glibc's heaps have %u fault handlers", err, i - 1);
			break;
		}
		p->nhandlers = i + 1;
	}
	rc = 0;
out:
	pthread_mutex_unlock(&p->waits_lock);
	return rc < 0 ? rc : p->uffd_waits;
}

int fm_monitor_start(struct fm_pager *p, char *err, size_t errlen)
{
	int rc;

	fm_follow_init(&p->follow);
	p->stop_fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC));
	p->helpers_fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (p->stop_fd < 0 || p->helpers_fd < 0) {
		snprintf(err, errlen, "eventfd: %s", fm_strerror(errno));
		return -errno;
	}
	if (p->in_thread) {
		rc = sigbus_install(p, err, errlen);
		if (rc)
			return rc;
		/* Events only: one thread, which faults never wake. */
		p->nhandlers = 1;
		p->handler_chan[0] = NULL;
	} else {
		p->nhandlers = p->cfg.fill_threads < 1 ? 1 : p->cfg.fill_threads > MAX_HANDLERS ? MAX_HANDLERS
											  : p->cfg.fill_threads;
		fm_follow_prepare(p); /* handler 0 may follow */
	}
	for (unsigned i = 0; i < p->nhandlers; i++) {
		rc = handler_start(p, i, !p->in_thread, err, errlen);
		if (rc) {
			p->nhandlers = i;
			return rc;
		}
	}
	return 0;
}

void fm_monitor_stop(struct fm_pager *p)
{
	uint64_t one = 1;

	if (p->in_thread)
		sigbus_remove(p);
	/* The watch acts on a handler by its thread id: it stops before they do. */
	fm_follow_stop(p);
	pthread_mutex_lock(&p->waits_lock); /* no handler 1 starts now */
	if (p->stop_fd >= 0 && fm_sys_write(p->stop_fd, &one, sizeof(one)) < 0)
		fm_warn("cannot stop the fault handlers: %s", fm_strerror(errno));
	for (unsigned i = 0; i < p->nhandlers; i++) {
		pthread_join(p->handlers[i], NULL);
		if (p->handler_chan[i])
			fm_chan_close(p->handler_chan[i]);
		p->handler_chan[i] = NULL;
		handler_epfd_close(p, i);
	}
	p->nhandlers = 0;
	if (p->stop_fd >= 0)
		close(p->stop_fd);
	p->stop_fd = -1;
	if (p->helpers_fd >= 0)
		fm_fd_close(p->helpers_fd);
	p->helpers_fd = -1;
	pthread_mutex_unlock(&p->waits_lock);
}
