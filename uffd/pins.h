/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ranges a system call is using. In fault=signal mode the kernel cannot wait
 * for a page: a system call that touches a non-resident paged page fails with
 * EFAULT. The shim makes a call's buffer resident first (fm_pager_io_begin)
 * and pins it for the call; the evictor leaves pinned pages alone. Checked
 * with sequentially consistent atomics on both sides: a pin added after the
 * evictor claimed a page sees the claim and waits for it to settle, and an
 * evictor that claims after the pin sees the pin and lets the page go.
 */
#ifndef FARMEM_PINS_H
#define FARMEM_PINS_H

#include <stdint.h>

struct fm_pager;

/* A slot for [start, end), or -1 when the table is full (the caller retries on EFAULT). */
int fm_pin(struct fm_pager *p, uintptr_t start, uintptr_t end);
void fm_unpin(struct fm_pager *p, int slot);
/*
 * held[k] = 1 for each of the n addresses (ascending) that a pinned range
 * holds; returns how many. One pass over the held slots for a whole batch of
 * an evictor's victims, after it claimed them.
 */
unsigned fm_pins_holding(struct fm_pager *p, const uintptr_t *sorted, unsigned n, uint8_t *held);

#endif
