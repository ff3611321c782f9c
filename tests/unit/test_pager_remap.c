// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_remap (uffd/remap.c) against a real memd, with ASan and UBSan:
 * a range mostly in memd moves and grows by the kernel's mremap, and its
 * pages in memd stay in their slots (nothing read back, nothing copied);
 * a range grows in place, then cannot (a paged mapping in the way: ENOMEM,
 * nothing changed); a range of two regions moves to a fixed place; and
 * fm_pager_move takes a source of two regions; a region whose tail was let
 * go grows back in place; MREMAP_DONTUNMAP leaves the old range paged and
 * empty; a hundred one-page growths in place take up room their first one
 * booked. Every byte checked after
 * each step and after everything was pushed out and read back. Calls that
 * are not for it change nothing. Run from the repository root.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define N 2048ul            /* pages of the first range: 8 MiB, at a 1 MiB budget */
#define LEN (N * PG)
#define TAIL (64 * PG)

static int all_ok(const uint8_t *base, uint64_t n, uint32_t v)
{
	for (uint64_t i = 0; i < n; i++)
		if (!page_ok(base, i, v))
			return 0;
	return 1;
}

static int zeros(const uint8_t *base, uint64_t n)
{
	for (uint64_t i = 0; i < n * PG; i++)
		if (base[i])
			return 0;
	return 1;
}

static int unmapped(const void *a)
{
	unsigned char v;

	return mincore((void *)a, PG, &v) < 0 && errno == ENOMEM;
}

/* A free place of len bytes (mapped, then unmapped). */
static uint8_t *free_place(size_t len)
{
	uint8_t *a = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(a != MAP_FAILED);
	munmap(a, len);
	return a;
}

/* Live regions in the residency map. */
static unsigned live_regions(const struct fm_resmap_hdr *h)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < h->nregions; i++)
		n += !!(fm_resmap_slot_ro(h, i)->flags & FM_REGION_F_LIVE);
	return n;
}

static void exercise(const char *addr, const char *label, const char *transport)
{
	struct fm_pager *p = unit_pager(label, addr, "1M", (const char *const[]){ "transport", transport, NULL });
	struct fm_resmap_hdr *h;
	uint8_t *a, *q = NULL, *b, *c, *d, *e;
	uint64_t reads, copies;
	void *r = NULL;
	int rc;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, LEN, 0);
	if (!a)
		goto out;
	for (uint64_t i = 0; i < N; i++)
		write_page(a, i, 1);

	/* Not for it: nothing changes. A shrink, a range that is not whole regions, a misaligned place. */
	CHECK(fm_pager_remap(p, a, LEN, LEN - PG, MREMAP_MAYMOVE, NULL, &r) == -EOPNOTSUPP);
	CHECK(fm_pager_remap(p, a + PG, LEN - PG, LEN, MREMAP_MAYMOVE, NULL, &r) == -EOPNOTSUPP);
	CHECK(fm_pager_remap(p, a, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)1, &r) == -EOPNOTSUPP);
	CHECK(h->stats.remaps == 0);

	/* 1. Moved and grown, mostly remote: nothing read from memd, nothing copied inside it. */
	reads = h->stats.remote_reads;
	copies = h->stats.swapva_copy_calls;
	CHECK(fm_pager_remap(p, a, LEN, LEN + TAIL, MREMAP_MAYMOVE, NULL, &r) == 0);
	q = r;
	CHECK(q != a && unmapped(a) && !fm_pager_owns(p, a, LEN) && fm_pager_owns(p, q, LEN + TAIL));
	CHECK(h->stats.remaps == 1 && h->stats.remap_pages_kept > N / 2 &&
	      h->stats.remap_pages_kept + h->stats.remap_pages_resident <= N);
	CHECK(h->stats.remote_reads == reads && h->stats.swapva_copy_calls == copies);
	CHECK(all_ok(q, N, 1) && zeros(q + LEN, TAIL / PG));
	for (uint64_t i = 0; i < N; i++)
		write_page(q, i, 2);
	CHECK(all_ok(q, N, 2));
	CHECK(fm_pager_unregister(p, q, LEN + TAIL) == 0);
	munmap(q, LEN + TAIL);

	/* 2. Grown where it lies, then not (a paged mapping in the way): ENOMEM, nothing changed. */
	b = free_place(2 * LEN);
	CHECK(mmap(b, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == b);
	CHECK(fm_pager_register(p, b, LEN, 0) == 0);
	for (uint64_t i = 0; i < N; i++)
		write_page(b, i, 3);
	CHECK(fm_pager_remap(p, b, LEN, LEN + TAIL, 0, NULL, &r) == 0 && r == b);
	CHECK(h->stats.remaps == 2 && fm_pager_owns(p, b + LEN, TAIL));
	c = b + LEN + TAIL;
	CHECK(mmap(c, TAIL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == c);
	CHECK(fm_pager_register(p, c, TAIL, 0) == 0);
	CHECK(fm_pager_remap(p, b, LEN + TAIL, LEN + 2 * TAIL, 0, NULL, &r) == -ENOMEM);
	CHECK(h->stats.remaps == 2);
	CHECK(all_ok(b, N, 3) && zeros(b + LEN, TAIL / PG));
	for (uint64_t i = N; i < N + TAIL / PG; i++)
		write_page(b, i, 4);

	/* 3. The two regions move together to a fixed place, the same size. */
	d = free_place(LEN + TAIL);
	CHECK(fm_pager_remap(p, b, LEN + TAIL, LEN + TAIL, MREMAP_MAYMOVE | MREMAP_FIXED, d, &r) == 0 && r == d);
	CHECK(unmapped(b) && h->stats.remaps == 3);
	CHECK(all_ok(d, N, 3));
	for (uint64_t i = N; i < N + TAIL / PG; i++)
		CHECK(page_ok(d, i, 4));

	/* 4. fm_pager_move from those two regions into one. */
	e = unit_region(p, LEN + TAIL, 0);
	if (e) {
		CHECK(fm_pager_move(p, e, d, LEN + TAIL) == 0);
		CHECK(all_ok(e, N, 3) && zeros(d, N + TAIL / PG));
		for (uint64_t i = N; i < N + TAIL / PG; i++)
			CHECK(page_ok(e, i, 4));
		CHECK(fm_pager_unregister(p, e, LEN + TAIL) == 0);
		munmap(e, LEN + TAIL);
	}
	CHECK(fm_pager_unregister(p, d, LEN + TAIL) == 0 && fm_pager_unregister(p, c, TAIL) == 0);
	munmap(d, LEN + TAIL);
	munmap(c, TAIL);

	/* 5. A region whose tail was let go ends where its mapping does: it grows back in place. */
	e = unit_region(p, LEN, 0);
	if (e) {
		for (uint64_t i = 0; i < N; i++)
			write_page(e, i, 5);
		CHECK(fm_pager_unregister(p, e + LEN / 2, LEN / 2) == 0);
		munmap(e + LEN / 2, LEN / 2);
		CHECK(fm_pager_owns(p, e, LEN / 2) && !fm_pager_owns(p, e + LEN / 2, LEN / 2));
		rc = fm_pager_remap(p, e, LEN / 2, LEN, 0, NULL, &r);
		CHECK(rc == 0 && r == e);
		if (rc)
			fprintf(stderr, "test_pager_remap: growing back in place: %s\n", strerror(-rc));
		CHECK(all_ok(e, N / 2, 5) && (rc || zeros(e + LEN / 2, N / 2)));
		CHECK(fm_pager_unregister(p, e, LEN) == 0);
		munmap(e, LEN);
	}

	/* 6. MREMAP_DONTUNMAP: the pages move, the old range stays paged and empty, with a space of its own. */
	e = unit_region(p, LEN, 0);
	if (e) {
		reads = h->stats.remote_reads;
		for (uint64_t i = 0; i < N; i++)
			write_page(e, i, 6);
		CHECK(fm_pager_remap(p, e, LEN, LEN, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL, &r) == 0 && r != e);
		CHECK(fm_pager_owns(p, e, LEN) && fm_pager_owns(p, r, LEN));
		CHECK(zeros(e, N));
		for (uint64_t i = 0; i < N; i++)
			write_page(e, i, 7);
		CHECK(all_ok(r, N, 6) && all_ok(e, N, 7));
		CHECK(h->stats.remote_reads > reads); /* both were paged out and read back */
		CHECK(fm_pager_remap(p, r, LEN, LEN + PG, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL, &r) == -EOPNOTSUPP);
		CHECK(fm_pager_unregister(p, e, LEN) == 0 && fm_pager_unregister(p, r, LEN) == 0);
		munmap(e, LEN);
		munmap(r, LEN);
	}

	/*
	 * 7. A hundred growths of a page where the range lies: the first books
	 * room for more (a quarter of the range), the others take it up. One
	 * region more, not a hundred.
	 */
	e = free_place(2 * LEN);
	CHECK(mmap(e, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == e);
	CHECK(fm_pager_register(p, e, LEN, 0) == 0);
	{
		unsigned before = live_regions(h);

		for (uint64_t i = 0; i < N; i++)
			write_page(e, i, 8);
		for (uint64_t k = 0; k < 100; k++) {
			CHECK(fm_pager_remap(p, e, LEN + k * PG, LEN + (k + 1) * PG, 0, NULL, &r) == 0 && r == e);
			write_page(e, N + k, 9);
		}
		CHECK(live_regions(h) == before + 1);
		CHECK(all_ok(e, N, 8));
		for (uint64_t k = 0; k < 100; k++)
			CHECK(page_ok(e, N + k, 9));
	}
	CHECK(fm_pager_unregister(p, e, LEN + 100 * PG) == 0);
	munmap(e, LEN + 100 * PG);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
out:
	fm_pager_stop(p);
	printf("test_pager_remap: %s done\n", label);
}

int main(void)
{
	char sock[64], unix_addr[80];
	pid_t memd;
	int st;

	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-remap-%d.sock", getpid());
	snprintf(unix_addr, sizeof(unix_addr), "unix:%s", sock);
	memd = unit_start_memd(sock, "256M");
	if (memd < 0)
		return 1;
	exercise(unix_addr, "shm", "shm");
	exercise(unix_addr, "stream", "stream");
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	unit_memd_files_remove(sock);
	if (failures) {
		fprintf(stderr, "test_pager_remap: %d checks failed\n", failures);
		return 1;
	}
	printf("test_pager_remap: ok\n");
	return 0;
}
