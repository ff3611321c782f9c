// SPDX-License-Identifier: Apache-2.0
/* Stacks of farmem's (stacks.h). */
#include "stacks.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fm_util.h"

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

char *fm_stack_mine(void)
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

/* Its start routine returned: the stack goes back to the pool, or away if the pool had no room for it. */
void fm_stack_thread_end(void)
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

void fm_stack_altstack_again(void)
{
	stack_t ss = { .ss_sp = my_hstack, .ss_size = HSTACK_SIZE };

	if (my_hstack)
		syscall(SYS_sigaltstack, &ss, NULL);
}

/* In a fork's child: the forking thread's stack is this child's thread's now; the others' are free to take. */
void fm_stack_child_reset(void)
{
	for (int k = 0; k < HSTACK_POOL; k++)
		if (my_hstack && __atomic_load_n(&hstacks[k].lo, __ATOMIC_ACQUIRE) == my_hstack)
			atomic_store(&hstacks[k].owner, gettid());
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

int fm_stack_run(void (*fn)(void *), void *arg)
{
	char *lo = fm_stack_mine(), *here = (char *)&lo;

	if (!lo)
		return 0;
	if (here >= lo && here < lo + HSTACK_SIZE)
		fn(arg); /* on it already (a nested fault) */
	else
		fm_call_on_stack(fn, arg, lo + HSTACK_SIZE);
	return 1;
}
