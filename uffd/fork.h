/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fork(): a child sees the parent's paged memory as it was at the fork
 * (fork.c says how, and what it costs). Between forks every paged range is
 * MADV_DONTFORK.
 */
#ifndef FARMEM_FORK_H
#define FARMEM_FORK_H

struct fm_pager;

/* The pager takes part in every fork() of the process from now on, or no longer. */
void fm_fork_add(struct fm_pager *p);
void fm_fork_remove(struct fm_pager *p);

#endif
