// SPDX-License-Identifier: Apache-2.0
#include "pins.h"

#include "pager_internal.h"

#define PIN_WORDS (MAX_PINS / 64)

static int pin_in_word(struct fm_pager *p, int w, uintptr_t start, uintptr_t end)
{
	uint64_t free_bits = ~atomic_load(&p->pin_held[w]);

	while (free_bits) {
		int i = w * 64 + __builtin_ctzll(free_bits);
		uintptr_t zero = 0;

		free_bits &= free_bits - 1;
		/* The start is the claim: a slot whose bit is clear may still be on its way out (fm_unpin). */
		if (!atomic_compare_exchange_strong(&p->pins[i].start, &zero, start))
			continue;
		/* Published by the bit: an evictor reads the end only after it saw the bit set. */
		atomic_store_explicit(&p->pins[i].end, end, memory_order_relaxed);
		/* Set before the caller looks at its pages: an evictor that read the word first claimed first. */
		atomic_fetch_or(&p->pin_held[w], 1ull << (i % 64));
		fm_raise_peak(&p->st->peak_pins, (uint64_t)atomic_fetch_add(&p->npins, 1) + 1);
		return i;
	}
	return -1;
}

/* Only a hint: relaxed, and written only when it changes (every call on every thread passes here). */
static void set_hint(struct fm_pager *p, int w)
{
	if (atomic_load_explicit(&p->pin_hint, memory_order_relaxed) != w)
		atomic_store_explicit(&p->pin_hint, w, memory_order_relaxed);
}

int fm_pin(struct fm_pager *p, uintptr_t start, uintptr_t end)
{
	/* Start where the last slot was given back or taken, so a busy table is not walked from 0 each time. */
	int from = atomic_load_explicit(&p->pin_hint, memory_order_relaxed) % PIN_WORDS;

	for (int k = 0; k < PIN_WORDS; k++) {
		int w = (from + k) % PIN_WORDS, i = pin_in_word(p, w, start, end);
		if (i >= 0) {
			set_hint(p, w);
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
	atomic_fetch_and(&p->pin_held[slot / 64], ~(1ull << (slot % 64)));
	/* The call is over: an evictor that still saw the bit may see either. The start frees the slot. */
	atomic_store_explicit(&p->pins[slot].end, 0, memory_order_release);
	atomic_store_explicit(&p->pins[slot].start, 0, memory_order_release);
	set_hint(p, slot / 64);
}

/* The first of sorted[0..n) at or above addr. */
static unsigned lower_bound(const uintptr_t *sorted, unsigned n, uintptr_t addr)
{
	unsigned lo = 0, hi = n;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		if (sorted[mid] < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

unsigned fm_pins_holding(struct fm_pager *p, const uintptr_t *sorted, unsigned n, uint8_t *held)
{
	unsigned count = 0;

	memset(held, 0, n);
	if (!n || !atomic_load(&p->npins))
		return 0;
	for (int w = 0; w < PIN_WORDS; w++) {
		uint64_t bits = atomic_load(&p->pin_held[w]);

		while (bits) {
			int i = w * 64 + __builtin_ctzll(bits);
			uintptr_t s = atomic_load(&p->pins[i].start), e;

			bits &= bits - 1;
			if (!s)
				continue; /* given back since the word was read */
			/* A slot given back and taken again since then may not have its end yet: everything above its start. */
			e = atomic_load(&p->pins[i].end);
			if (!e)
				e = UINTPTR_MAX;
			for (unsigned k = lower_bound(sorted, n, s); k < n && sorted[k] < e; k++)
				if (!held[k]) {
					held[k] = 1;
					count++;
				}
		}
	}
	return count;
}
