/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where faults arrive (UMap's fault monitor).
 *
 * fault=signal (the default): the uffd has UFFD_FEATURE_SIGBUS, so the
 * kernel does not queue a fault: it sends the faulting thread SIGBUS, and the
 * pager serves the fault in that thread's signal handler, on its own CPU: no
 * other thread wakes, no IPI, no context switch. A SIGBUS that is not ours
 * goes to the disposition the program had (chained). One thread still reads
 * the uffd, for its events (an unmap behind the shim).
 *
 * fault=thread: handler threads read faults off the uffd and serve them
 * while the faulting thread sleeps in the kernel. Every system call on paged
 * memory then just waits; each fault costs two cross-CPU wakeups when the
 * scheduler puts the two threads on different CPUs.
 */
#ifndef FARMEM_MONITOR_H
#define FARMEM_MONITOR_H

#include <signal.h>
#include <stddef.h>

struct fm_pager;

int fm_monitor_start(struct fm_pager *p, char *err, size_t errlen);
void fm_monitor_stop(struct fm_pager *p);

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

#endif
