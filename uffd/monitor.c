// SPDX-License-Identifier: Apache-2.0
/* Where faults arrive (monitor.h). */
#include "monitor.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "chanpool.h"
#include "fault.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "uffd_compat.h"
#include "uffd_ops.h"

#define MSGS_PER_READ 16
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
 * The stack the handler works on. A program may run its code on stacks of its
 * own making in paged memory, switched by its own assembly (Erlang's JIT runs
 * Erlang code on each process's stack, which lives in its heap; coroutine
 * libraries): the pager's work there pushed its frames onto pages it may
 * evict, or that wait for a handler thread while this thread holds the
 * pager's locks (Erlang under fault=signal hung so, session 34). And on such
 * a stack in a region that raises SIGBUS the kernel cannot even write the
 * signal's frame. So every thread that faults gets a stack of farmem's, off
 * paged memory: the signal arrives on it (SA_ONSTACK, ours as the thread's
 * alternate stack unless the program has one) and the fault is served on it
 * (switched to at once where the signal came on the program's alternate
 * stack, which may be small: the fault path takes several KiB). A dead
 * thread's stack goes to the next thread that needs one.
 */
#define HSTACK_SIZE (256u << 10)
#define HSTACK_GUARD 4096u
#define HSTACK_POOL 256

static struct {
	_Atomic pid_t owner;
	char *lo; /* above the guard page */
} hstacks[HSTACK_POOL];
static __thread char *my_hstack __attribute__((tls_model("initial-exec")));

static char *hstack_take(void)
{
	pid_t me = gettid(), pid = getpid();
	char *m;

	/* A stack its thread gave back at its end (fm_monitor_thread_end): no system call. */
	for (int k = 0; k < HSTACK_POOL; k++) {
		pid_t o = 0;
		if (__atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE) && atomic_load(&hstacks[k].owner) == 0 &&
		    atomic_compare_exchange_strong(&hstacks[k].owner, &o, me)) {
			char *lo = __atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE);
			if (lo)
				return lo;
			atomic_store(&hstacks[k].owner, 0);
		}
	}
	/* One whose thread ended without giving it back (pthread_exit, or it got it at a fault). */
	for (int k = 0; k < HSTACK_POOL; k++) {
		pid_t o = atomic_load(&hstacks[k].owner);
		char *lo = __atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE);
		if (o > 0 && lo && syscall(SYS_tgkill, pid, o, 0) != 0 && errno == ESRCH &&
		    atomic_compare_exchange_strong(&hstacks[k].owner, &o, me))
			return lo;
	}
	m = fm_sys_mmap(NULL, HSTACK_GUARD + HSTACK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
			-1, 0);
	if (m == MAP_FAILED)
		return NULL;
	syscall(SYS_mprotect, m, HSTACK_GUARD, PROT_NONE);
	for (int k = 0; k < HSTACK_POOL; k++) {
		pid_t free_slot = 0;
		if (!__atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE) &&
		    atomic_compare_exchange_strong(&hstacks[k].owner, &free_slot, me)) {
			if (!__atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE)) {
				__atomic_store_n(&hstacks[k].lo, m + HSTACK_GUARD, __ATOMIC_RELEASE);
				break;
			}
			atomic_store(&hstacks[k].owner, 0); /* filled meanwhile: someone else's to take */
		}
	}
	return m + HSTACK_GUARD;
}

/* This thread's stack of farmem's, made its alternate signal stack if it has none. NULL when none can be had. */
static char *hstack(void)
{
	stack_t cur;

	if (my_hstack)
		return my_hstack;
	if (!(my_hstack = hstack_take()))
		return NULL;
	if (syscall(SYS_sigaltstack, NULL, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
		stack_t ss = { .ss_sp = my_hstack, .ss_size = HSTACK_SIZE };
		syscall(SYS_sigaltstack, &ss, NULL);
	}
	return my_hstack;
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
		hstack();
}

/* Its start routine returned: the stack goes back to the pool, or away if the pool had no room for it. */
void fm_monitor_thread_end(void)
{
	char *mine = my_hstack;
	stack_t cur;

	if (!mine)
		return;
	if (syscall(SYS_sigaltstack, NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE) && cur.ss_sp == mine) {
		stack_t off = { .ss_flags = SS_DISABLE };
		if (cur.ss_flags & SS_ONSTACK || syscall(SYS_sigaltstack, &off, NULL) != 0)
			return; /* still in use: the pool's scan takes it back once the thread is gone */
	}
	my_hstack = NULL;
	for (int k = 0; k < HSTACK_POOL; k++)
		if (__atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE) == mine) {
			atomic_store(&hstacks[k].owner, 0);
			return;
		}
	fm_sys_munmap(mine - HSTACK_GUARD, HSTACK_GUARD + HSTACK_SIZE);
}

void fm_monitor_altstack_released(void)
{
	stack_t ss = { .ss_sp = my_hstack, .ss_size = HSTACK_SIZE };

	if (my_hstack && __atomic_load_n(&sig_installed, __ATOMIC_ACQUIRE))
		syscall(SYS_sigaltstack, &ss, NULL);
}

#if defined(__x86_64__)
/* fn(arg) on the stack whose top is top; the frame pointer chain runs on through the switch. */
void fm_call_on_stack(void (*fn)(void *), void *arg, void *top);
__asm__(".text\n"
	".globl fm_call_on_stack\n"
	".hidden fm_call_on_stack\n"
	".type fm_call_on_stack, @function\n"
	"fm_call_on_stack:\n"
	".cfi_startproc\n"
	"	push %rbp\n"
	".cfi_def_cfa_offset 16\n"
	".cfi_offset %rbp, -16\n"
	"	mov %rsp, %rbp\n"
	".cfi_def_cfa_register %rbp\n"
	"	mov %rdx, %rsp\n"
	"	mov %rdi, %rax\n"
	"	mov %rsi, %rdi\n"
	"	call *%rax\n"
	"	mov %rbp, %rsp\n"
	"	pop %rbp\n"
	".cfi_def_cfa %rsp, 8\n"
	"	ret\n"
	".cfi_endproc\n"
	".size fm_call_on_stack, .-fm_call_on_stack\n");
#else
static void fm_call_on_stack(void (*fn)(void *), void *arg, void *top)
{
	(void)top;
	fn(arg);
}
#endif

void fm_monitor_call_off_paged_stack(void (*fn)(void *), void *arg)
{
	char *lo = hstack(), *here = (char *)&lo;

	if (lo && !(here >= lo && here < lo + HSTACK_SIZE))
		fm_call_on_stack(fn, arg, lo + HSTACK_SIZE);
	else
		fn(arg); /* on farmem's stack already (a nested fault), or none to be had */
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
		fm_monitor_call_off_paged_stack(serve_sigbus, &c);
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
	hstack();
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
	/* The forking thread's stack is this child's thread's now; the other threads' stacks are free to take. */
	for (int k = 0; k < HSTACK_POOL; k++)
		if (my_hstack && __atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE) == my_hstack)
			atomic_store(&hstacks[k].owner, gettid());
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

static void *handler_main(void *arg)
{
	const struct fm_handler_arg *ha = arg;
	struct fm_pager *p = ha->p;
	unsigned idx = ha->idx;
	int fd = handler_fd(p, idx), events_only = p->in_thread && idx == 0;
	struct uffd_msg msgs[MSGS_PER_READ];
	struct pollfd pfd[2] = { { .fd = fd, .events = POLLIN }, { .fd = p->stop_fd, .events = POLLIN } };
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
	struct fm_follower fol = { .at = -1, .seen = -1 };

	/* One handler follows the threads it serves (follow.h): the first that serves faults. */
	if (idx == (p->in_thread ? 1u : 0u))
		fm_follower_init(p, &fol, fd);
	for (;;) {
		ssize_t n;

		fm_follow_turn(p, &fol, fm_now_ns());
		if (!spin_until || fm_now_ns() >= spin_until) {
			spin_until = 0;
			if (fm_sys_poll(pfd, 2, fm_follow_poll_ms(&fol)) < 0 && errno != EINTR)
				fm_fatal("polling userfaultfd failed: %s", fm_strerror(errno));
			if (pfd[1].revents)
				return NULL;
			if (!pfd[0].revents)
				continue;
		}
		n = fm_sys_read(fd, msgs, sizeof(msgs));
		if (n < 0) {
			if (errno == EAGAIN && spin_until)
				sched_yield();
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
				if (spin_ns)
					spin_until = fm_now_ns() + spin_ns;
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
	}
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
	p->handler_args[i] = (struct fm_handler_arg){ .p = p, .idx = i };
	rc = -pthread_create(&p->handlers[i], NULL, handler_main, &p->handler_args[i]);
	if (rc) {
		fm_chan_close(p->handler_chan[i]);
		p->handler_chan[i] = NULL;
		snprintf(err, errlen, "cannot start a fault handler: %s", fm_strerror(-rc));
	}
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
out:
	pthread_mutex_unlock(&p->waits_lock);
	return rc < 0 ? rc : p->uffd_waits;
}

int fm_monitor_start(struct fm_pager *p, char *err, size_t errlen)
{
	int rc;

	fm_follow_init(&p->follow);
	p->stop_fd = fm_fd_keep(eventfd(0, EFD_CLOEXEC));
	if (p->stop_fd < 0) {
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
	}
	p->nhandlers = 0;
	if (p->stop_fd >= 0)
		close(p->stop_fd);
	p->stop_fd = -1;
	pthread_mutex_unlock(&p->waits_lock);
}
