/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where faults arrive (UMap's fault monitor).
 *
 * fault=signal (the default): the uffd has UFFD_FEATURE_SIGBUS, so the
 * kernel does not queue a fault: it sends the faulting thread SIGBUS, and the
 * pager serves the fault in that thread's signal handler, on its own CPU: no
 * other thread wakes, no IPI, no context switch. A SIGBUS that is not ours
 * goes to the disposition the program had (chained). One thread still reads
 * the uffd, for its events (an unmap behind the shim). Regions where the
 * kernel must wait for a page (malloc heaps: the shim) are registered with a
 * second uffd without SIGBUS, read by a second thread as with fault=thread.
 *
 * A uffd whose faults threads sleep for has fill_threads handlers: the
 * first serves alone, the others only while faults queue behind it (one read
 * brings several), each waiting in its own epoll set (EPOLLEXCLUSIVE: one
 * fault wakes one sleeping handler).
 *
 * fault=thread: handler threads read faults off the uffd and serve them
 * while the faulting thread sleeps in the kernel. Every system call on paged
 * memory then just waits; each fault costs two cross-CPU wakeups when the
 * scheduler puts the two threads on different CPUs, which is why the
 * handler that serves them moves beside the faulting thread (follow.h).
 */
#ifndef FARMEM_MONITOR_H
#define FARMEM_MONITOR_H

#include <signal.h>
#include <stddef.h>

struct fm_pager;

int fm_monitor_start(struct fm_pager *p, char *err, size_t errlen);
void fm_monitor_stop(struct fm_pager *p);
/*
 * The userfaultfd of regions whose faults the kernel waits for
 * (FM_REG_KERNEL_WAITS): with fault=thread the pager's own; with
 * fault=signal a second one, opened with its handler thread at the first
 * call. A negative errno (and err) when it cannot be opened: a process
 * without a full userfaultfd (root, /dev/userfaultfd, or
 * vm.unprivileged_userfaultfd) has only the user-mode-only kind.
 */
int fm_monitor_waits_fd(struct fm_pager *p, char *err, size_t errlen);

/*
 * The program's own SIGBUS disposition, for the shim's sigaction and signal
 * interposers: act (if set) becomes what a SIGBUS that is not ours runs, old
 * (if set) gets the previous one. Returns 1 when the pager's handler is in
 * place (the caller must not install act itself), 0 when it is not.
 */
/*
 * In a forked child: the pagers the SIGBUS handler knew are the parent's
 * (their uffds and memd sessions are not the child's): forget them. The
 * handler stays installed, chaining to the program's disposition.
 */
void fm_monitor_child_reset(void);

int fm_monitor_sigbus_action(const struct sigaction *act, struct sigaction *old);
/*
 * SIGBUS unblocked in the calling thread: a mask inherited across exec may
 * block it (a parent that blocked it), and the first paging fault would kill
 * the process. The threads this one starts inherit its mask.
 */
void fm_monitor_unblock_sigbus(void);
/* The program disabled this thread's alternate stack: farmem's is its alternate stack again. */
void fm_monitor_altstack_released(void);
/* A program thread's start and the return of its start routine (the shim's pthread_create cover). */
void fm_monitor_thread_start(void);
void fm_monitor_thread_end(void);
/* Whether the pager's SIGBUS handler is installed: then nothing may block SIGBUS. */
int fm_monitor_sigbus_ours(void);

#endif
