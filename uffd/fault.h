/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fault handlers: missing (a page not mapped), write-protect (a write to
 * a clean page), minor (a shmem page in the file, not mapped) and unmap (a
 * paged range unmapped behind the shim). monitor.c brings them faults, from
 * the faulting thread's SIGBUS handler (fault=signal: served on the thread's
 * own CPU, nothing to wake) or from a handler thread (fault=thread: the
 * faulting thread sleeps in the kernel until an install or a wake).
 */
#ifndef FARMEM_FAULT_H
#define FARMEM_FAULT_H

#include <stdint.h>
#include <sys/types.h>

#include "chanpool.h"

struct fm_pager;

/* GUESS: a SIGBUS without the page-fault error code: the page's state tells. */
enum fm_fault_kind { FM_FAULT_MISSING = 0, FM_FAULT_WP = 1, FM_FAULT_MINOR = 2, FM_FAULT_GUESS = 3 };

struct fm_fault {
	uintptr_t addr;
	unsigned kind;          /* enum fm_fault_kind; in SIGBUS mode a not-present fault is MISSING */
	int write;              /* the access writes */
	int in_thread;          /* served in the faulting thread: nobody sleeps in the kernel */
	uint64_t t0;            /* when the fault was taken off the uffd or the signal arrived */
	struct fm_borrowed fc;  /* the memd channel it uses; fc.tid is the faulting thread */
	const uintptr_t *regs;  /* fault=signal: the thread's general registers at the fault (NULL: unknown) */
	unsigned nregs;
	uintptr_t sp;           /* and its stack pointer: the words above it hold its callers' registers */
};

/* Serve one fault. Returns 0, or -ENOENT when addr is in no region (not ours). */
int fm_fault(struct fm_pager *p, struct fm_fault *f);
/* The program unmapped [start, end) behind the shim: those pages are not paged any more. */
void fm_fault_unmap(struct fm_pager *p, uintptr_t start, uintptr_t end);

#endif
