/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How the functions a farmem JDK calls (swapva_move.h, gc_calls.h) reach the
 * agent's pager: agent.c passes these, so that those files never call back
 * into it.
 */
#ifndef FARMEM_AGENT_PAGER_REF_H
#define FARMEM_AGENT_PAGER_REF_H

struct fm_pager;

struct fm_pager_ref {
	/* The running pager, held against a detach until leave. May be NULL; leave all the same. */
	struct fm_pager *(*enter)(void);
	void (*leave)(void);
	/* 1 if a pager runs, or is started and waits for VMInit to register the heap. */
	int (*expected)(void);
};

#endif
