/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fork(): a child sees the parent's paged memory as it was at the fork
 * (fork.c says how, and what it costs). Between forks every paged range is
 * MADV_DONTFORK.
 */
#ifndef FARMEM_FORK_H
#define FARMEM_FORK_H

#include <stddef.h>
#include <stdint.h>

struct fm_pager;

/* The pager takes part in every fork() of the process from now on, or no longer. */
void fm_fork_add(struct fm_pager *p);
void fm_fork_remove(struct fm_pager *p);

/* A paged range that a forked child got, every page present or zero (fork.c). */
struct fm_fork_range {
	uintptr_t base;
	size_t len;
	int kernel_waits; /* FM_REG_KERNEL_WAITS in a fault=signal pager: a malloc heap's part */
};

/*
 * In a forked child, before any of farmem's code runs there (an atfork child
 * handler): forget the parent's pagers and return the ranges the child got
 * as plain memory (at most max, in out). Their pages are all present, or
 * read zero in the parent too; nothing pages them until the caller registers
 * them with a pager of the child's own. 0 when the fork shared nothing.
 */
int fm_fork_child(struct fm_fork_range *out, int max);
/* fn runs first at every fork(), before any pager is prepared (the shim waits there for a child's pager to start). */
void fm_fork_before_prepare(void (*fn)(void));
/* fn runs last in the parent at every fork(), once every pager has gone back to its paged ranges' DONTFORK. */
void fm_fork_after_parent(void (*fn)(void));

#endif
