// SPDX-License-Identifier: Apache-2.0
#include "pins.h"

#include "pager_internal.h"

int fm_pin(struct fm_pager *p, uintptr_t start, uintptr_t end)
{
	for (int i = 0; i < MAX_PINS; i++) {
		uintptr_t zero = 0;
		if (atomic_compare_exchange_strong(&p->pins[i].start, &zero, start)) {
			int top = atomic_load(&p->pin_top);
			atomic_store(&p->pins[i].end, end);
			/* Before the caller looks at its pages: an evictor that missed the slot claimed first. */
			while (top <= i && !atomic_compare_exchange_weak(&p->pin_top, &top, i + 1))
				;
			fm_raise_peak(&p->st->peak_pins, (uint64_t)atomic_fetch_add(&p->npins, 1) + 1);
			return i;
		}
	}
	STAT_ADD(p, pins_refused, 1);
	return -1;
}

void fm_unpin(struct fm_pager *p, int slot)
{
	if (slot < 0)
		return;
	atomic_fetch_sub(&p->npins, 1);
	atomic_store(&p->pins[slot].end, 0);
	atomic_store(&p->pins[slot].start, 0);
}

int fm_pinned(struct fm_pager *p, uintptr_t addr)
{
	int top;

	if (!atomic_load(&p->npins))
		return 0;
	top = atomic_load(&p->pin_top);
	for (int i = 0; i < top; i++) {
		uintptr_t s = atomic_load(&p->pins[i].start);
		/* A slot being filled has its start before its end: count it as covering everything. */
		if (s && addr >= s) {
			uintptr_t e = atomic_load(&p->pins[i].end);
			if (!e || addr < e)
				return 1;
		}
	}
	return 0;
}
