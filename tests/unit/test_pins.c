// SPDX-License-Identifier: Apache-2.0
/*
 * The pin table (uffd/pins.h), with ASan and UBSan: what the evictor's one
 * walk of the held slots says about a batch of victims must be what a check
 * of each victim against each pinned range says, with the table empty, part
 * full, full (the next pin refused) and emptied again; and a range pinned for
 * the whole run is seen by every walk while other threads take and give back
 * slots beside it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "pager_internal.h"
#include "pins.h"
#include "resmap.h"
#include "unit.h"

#define PG 4096ul
#define BASE 0x7f0000000000ul

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static struct { uintptr_t s, e; int slot; } held[MAX_PINS];
static int nheld;

static int by_addr(const void *a, const void *b)
{
	uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;

	return (x > y) - (x < y);
}

/* A batch of victims at random pages, checked against the held ranges one by one. */
static void check_batch(struct fm_pager *p)
{
	uintptr_t v[64];
	uint8_t got[64];
	unsigned n = 1 + next() % 64, want = 0;

	for (unsigned k = 0; k < n; k++)
		v[k] = BASE + (next() % 20000) * PG;
	qsort(v, n, sizeof(v[0]), by_addr);
	unsigned count = fm_pins_holding(p, v, n, got);
	for (unsigned k = 0; k < n; k++) {
		int in = 0;
		for (int h = 0; h < nheld && !in; h++)
			in = v[k] >= held[h].s && v[k] < held[h].e;
		CHECK(got[k] == in);
		want += in;
	}
	CHECK(count == want);
}

static void pin_some(struct fm_pager *p, int n)
{
	for (int k = 0; k < n; k++) {
		uintptr_t s = BASE + (next() % 20000) * PG, e = s + (1 + next() % 16) * PG;
		int slot = fm_pin(p, s, e);
		if (nheld == MAX_PINS) {
			CHECK(slot < 0);
			continue;
		}
		CHECK(slot >= 0 && slot < MAX_PINS);
		held[nheld].s = s;
		held[nheld].e = e;
		held[nheld++].slot = slot;
	}
}

static void unpin_some(struct fm_pager *p, int n)
{
	for (int k = 0; k < n && nheld; k++) {
		int h = (int)(next() % (uint64_t)nheld);
		fm_unpin(p, held[h].slot);
		held[h] = held[--nheld];
	}
}

static struct fm_pager *pager(void)
{
	struct fm_pager *p = calloc(1, sizeof(*p));

	if (p)
		p->st = calloc(1, sizeof(*p->st));
	if (!p || !p->st)
		exit(2);
	return p;
}

static struct fm_pager *shared;
static atomic_int stop;

static void *churn(void *arg)
{
	uintptr_t base = BASE + (uintptr_t)arg * (1ul << 30);

	while (!atomic_load(&stop)) {
		int slot[8];
		for (int k = 0; k < 8; k++)
			slot[k] = fm_pin(shared, base + (uintptr_t)k * PG, base + (uintptr_t)(k + 1) * PG);
		for (int k = 0; k < 8; k++)
			fm_unpin(shared, slot[k]);
	}
	return NULL;
}

int main(void)
{
	struct fm_pager *p = pager();
	uint8_t got[64];
	pthread_t t[2];

	check_batch(p); /* empty */
	for (int round = 0; round < 40; round++) {
		pin_some(p, 1 + (int)(next() % 600));
		for (int b = 0; b < 20; b++)
			check_batch(p);
		unpin_some(p, (int)(next() % 500));
		for (int b = 0; b < 20; b++)
			check_batch(p);
	}
	pin_some(p, MAX_PINS + 10); /* full, then ten refused */
	CHECK(nheld == MAX_PINS && p->st->pins_refused >= 10 && p->st->peak_pins == MAX_PINS);
	for (int b = 0; b < 50; b++)
		check_batch(p);
	unpin_some(p, MAX_PINS);
	CHECK(nheld == 0 && atomic_load(&p->npins) == 0);
	check_batch(p);
	pin_some(p, 3);
	check_batch(p);
	unpin_some(p, 3);

	/* One range held throughout, the others coming and going in two threads. */
	shared = pager();
	uintptr_t s = BASE + 5000 * PG, probe[3] = { s - PG, s, s + 3 * PG };
	int slot = fm_pin(shared, s, s + 4 * PG);
	for (uintptr_t k = 0; k < 2; k++)
		pthread_create(&t[k], NULL, churn, (void *)(k + 1));
	for (int k = 0; k < 200000; k++) {
		unsigned n = fm_pins_holding(shared, probe, 3, got);
		CHECK(n == 2 && !got[0] && got[1] && got[2]);
		if (failures)
			break;
	}
	atomic_store(&stop, 1);
	for (int k = 0; k < 2; k++)
		pthread_join(t[k], NULL);
	fm_unpin(shared, slot);
	CHECK(atomic_load(&shared->npins) == 0);
	for (int k = 0; k < 2; k++) {
		struct fm_pager *q = k ? shared : p;
		free(q->st);
		free(q);
	}
	if (failures)
		return fprintf(stderr, "test_pins: %d checks failed\n", failures), 1;
	printf("test_pins: ok\n");
	return 0;
}
