// SPDX-License-Identifier: Apache-2.0
/*
 * The eviction clock's hand steps over words of eight pages with nothing
 * resident in them (uffd/evict.c, next_resident_word), and still finds every
 * resident page, wherever it sits in its word, against a real memd, with
 * ASan and UBSan.
 *
 * Region A (a size that is not a multiple of eight pages) gets one page per
 * word of its state bytes, at each of the eight places in turn, read (a
 * clean zero fill) or written (dirty), and its last page, the one word the
 * hand reads a byte at a time. Then region B is written page after page:
 * every page of A must leave within a few budgets' worth of writes (a hand
 * that skipped a word with a page in it would keep that page for good), and
 * every byte of both comes back. Both fault modes. Run from the repository root.
 */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define BUDGET_PAGES 256ul /* "1M" */
#define A_PAGES (8 * BUDGET_PAGES + 5)
#define B_PAGES (16 * BUDGET_PAGES)

static int resident_at(struct fm_resmap_hdr *h, int slot, uint64_t i)
{
	unsigned s = fm_pg_state(__atomic_load_n((uint8_t *)h + h->regions[slot].map_offset + i, __ATOMIC_ACQUIRE));

	return s != FM_PG_UNTOUCHED && s != FM_PG_REMOTE;
}

/* The page of A in word w of its state bytes: place w % 8 in the word, the last page for the tail. */
static uint64_t a_page(uint64_t w)
{
	return w < A_PAGES / 8 ? w * 8 + w % 8 : A_PAGES - 1;
}

static uint64_t a_resident(struct fm_resmap_hdr *h)
{
	uint64_t n = 0;

	for (uint64_t w = 0; w <= A_PAGES / 8; w++)
		n += resident_at(h, 0, a_page(w));
	return n;
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint64_t written = 0, bad = 0, zeros = 0;
	uint8_t *a, *b = NULL;

	p = unit_pager_at(sock, fault, "1M", (const char *const[]){ "transport", "shm", "prefetch", "0", "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, A_PAGES * PG, 0);
	b = a ? unit_region(p, B_PAGES * PG, 0) : NULL;
	if (!a || !b)
		goto out;
	CHECK(h->regions[0].base == (uintptr_t)a);

	for (uint64_t w = 0; w <= A_PAGES / 8; w++) {
		if (w % 2)
			zeros += page_ok(a, a_page(w), 0);
		else
			write_page(a, a_page(w), 1);
	}
	CHECK(zeros == (A_PAGES / 8 + 1) / 2);
	while (a_resident(h) && written < B_PAGES)
		write_page(b, written++, 1);
	fprintf(stderr, "test_pager_clock (fault=%s): %llu pages of A resident after %llu writes to B\n", fault,
		(unsigned long long)a_resident(h), (unsigned long long)written);
	CHECK(a_resident(h) == 0);
	CHECK(written <= 4 * BUDGET_PAGES);

	for (uint64_t w = 0; w <= A_PAGES / 8; w++)
		bad += !page_ok(a, a_page(w), w % 2 ? 0 : 1);
	for (uint64_t i = 0; i < written; i++)
		bad += !page_ok(b, i, 1);
	CHECK(bad == 0);
	CHECK(h->stats.crc_errors == 0);
out:
	if (b) {
		CHECK(fm_pager_unregister(p, b, B_PAGES * PG) == 0);
		munmap(b, B_PAGES * PG);
	}
	if (a) {
		CHECK(fm_pager_unregister(p, a, A_PAGES * PG) == 0);
		munmap(a, A_PAGES * PG);
	}
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_clock", exercise);
}
