/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stacks of farmem's: one per thread that needs one, off paged memory. A
 * fault is served on it (it is the thread's alternate signal stack unless the
 * program has one), and so is the pager's work that holds a lock a fault
 * needs when the program calls it from a stack of its own in paged memory.
 */
#ifndef FM_STACKS_H
#define FM_STACKS_H

/* This thread's, made its alternate signal stack if it has none. NULL when none can be had. */
char *fm_stack_mine(void);
/* The thread's start routine returned: its stack goes back to the pool, or away. */
void fm_stack_thread_end(void);
/* The program disabled this thread's alternate stack: farmem's is its alternate stack again. */
void fm_stack_altstack_again(void);
/* In a fork's child: the forking thread's stack is the child's thread's; the others' are free. */
void fm_stack_child_reset(void);
/*
 * fn(arg) on this thread's stack of farmem's (directly when already on it):
 * 1. 0, with fn not run, when none can be had.
 */
int fm_stack_run(void (*fn)(void *), void *arg);

#endif
