// SPDX-License-Identifier: Apache-2.0
/*
 * A program thread's fault on an object's page brings the object's other
 * remote pages with it, in one read (uffd/prefetch.c, fm_prefetch_object),
 * against a real memd, with ASan and UBSan.
 *
 * The heap here is a region registered as a Java heap whose "objects" the
 * test lays out itself (the pager asks object_end, which the JVM agent
 * answers from an array's header, jvmti-agent/gcmove.c): one in each block
 * of BLOCK pages, from OBJ_AT bytes into its first page to the end of its
 * OBJ_PAGES-th. Each object is read in order from its header on; in half the
 * blocks the first page comes in alone first (a read before the header), so
 * that the fault on the second page walked in from a resident page that
 * holds the header. object_end checks what the pager promises it: the
 * pages it may read ([from, addr]) are held, so that nobody can take them.
 * Every page read back is checked.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (64ul << 20)
#define BLOCK 8ul
#define OBJ_PAGES 6ul
#define OBJ_AT 200ul
#define BLOCKS 256ul /* 8 MiB read back: in memd by the time the region is written */
/* From LONG_OFF on, longer objects: LONG_PAGES in each block of LONG_BLOCK pages. */
#define LONG_OFF (16ul << 20)
#define LONG_BLOCK 32ul
#define LONG_PAGES 24ul
#define LONGS 32ul
#define AHEAD 8ul /* the pagers' prefetch: an object's pages read with a fault, at most */

static uint8_t *heap;
static struct fm_resmap_hdr *map;
static int calls, unheld;

/*
 * The pages read with an object so far. A handler thread wakes the program
 * before it counts them (uffd/prefetch.c): when the count is short of want,
 * wait up to a second for the handler to catch up. A count that overshoots,
 * or stays short, is what it is.
 */
static uint64_t object_reads(uint64_t want)
{
	uint64_t n;

	for (unsigned ms = 0; (n = __atomic_load_n(&map->stats.object_reads, __ATOMIC_RELAXED)) < want && ms < 1000; ms++)
		usleep(1000);
	return n;
}

static int held(uintptr_t a)
{
	unsigned s = fm_pg_state(*unit_state_byte(map, (a - (uintptr_t)heap) / PG));

	return s == FM_PG_FILLING || s == FM_PG_UPDATING;
}

/* The end of the object holding addr, if its header lies in [from, addr). */
static uintptr_t object_end(uintptr_t addr, uintptr_t from)
{
	uintptr_t off = addr - (uintptr_t)heap, size = off < LONG_OFF ? BLOCK * PG : LONG_BLOCK * PG;
	uintptr_t block = (uintptr_t)heap + (off < LONG_OFF ? off / size * size : LONG_OFF + (off - LONG_OFF) / size * size);
	uintptr_t obj = block + OBJ_AT, end = block + (off < LONG_OFF ? OBJ_PAGES : LONG_PAGES) * PG - 8;

	__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
	if (!held(addr) || !held(from))
		__atomic_fetch_add(&unheld, 1, __ATOMIC_RELAXED);
	if (obj < from || obj >= addr || addr >= end)
		return 0;
	return end;
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p;
	uint64_t f0, r0, faults, reads, bad = 0, want, resident0 = 0;
	int signal_mode = !strcmp(fault, "signal");
	volatile uint8_t sink = 0;
	/* Blocks in a shuffled order: in address order, or strided, the faults would make a run (prefetch.h). */
	static uint64_t order[BLOCKS];

	unit_object_end = object_end;
	p = unit_pager_at(sock, fault, "16M",
			  (const char *const[]){ "transport", "shm", "prefetch", "8", "fault", fault, "fill_follow", "0",
						 "evict_threads", "0", NULL });
	if (!p)
		return;
	map = (struct fm_resmap_hdr *)fm_pager_map(p);
	calls = unheld = 0;
	heap = unit_region(p, REGION, FM_REG_HEAP);
	if (!heap)
		goto out;
	for (uint64_t i = 0; i < REGION / PG; i++)
		write_page(heap, i, 7);
	for (uint64_t i = 0; i < BLOCKS * BLOCK; i++)
		resident0 += fm_pg_is_resident(*unit_state_byte(map, i));
	f0 = __atomic_load_n(&map->stats.faults, __ATOMIC_RELAXED);
	r0 = __atomic_load_n(&map->stats.object_reads, __ATOMIC_RELAXED);
	for (uint64_t k = 0; k < BLOCKS; k++)
		order[k] = k;
	for (uint64_t k = BLOCKS - 1, x = 88172645463325252ull; k > 0; k--) {
		uint64_t j, t;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		j = x % (k + 1), t = order[k], order[k] = order[j], order[j] = t;
	}
	for (uint64_t n = 0; n < BLOCKS; n++) {
		uint64_t b = order[n];
		uint8_t *obj = heap + b * BLOCK * PG + OBJ_AT;

		if (b & 1)
			sink += heap[b * BLOCK * PG]; /* the first page alone: before the object */
		sink += obj[12];                      /* its length, read first */
		for (uint64_t k = 1; k < OBJ_PAGES; k++)
			sink += obj[k * PG - OBJ_AT];   /* each page from its start on */
		for (uint64_t k = 0; k < OBJ_PAGES; k++)
			bad += !page_ok(heap, b * BLOCK + k, 7);
	}
	faults = __atomic_load_n(&map->stats.faults, __ATOMIC_RELAXED) - f0;
	want = signal_mode ? BLOCKS / 2 * 5 + BLOCKS / 2 * 4 : BLOCKS * 4;
	reads = object_reads(r0 + want) - r0;
	fprintf(stderr, "test_pager_object_read (fault=%s): %lu objects, %llu faults, %llu pages read with them, "
		"%d calls, %llu pages resident before\n", fault, BLOCKS, (unsigned long long)faults,
		(unsigned long long)reads, calls, (unsigned long long)resident0);
	/*
	 * With the exact address (fault=signal) an even block's object comes in
	 * at its header's fault, and an odd block's at the walk into its second
	 * page: 1 and 2 faults, 5 and 4 pages read with them. A handler thread
	 * sees only the page: the header's fault asks from the page's start, in
	 * no object, and every object comes in at the walk: 2 faults, 4 pages.
	 */
	CHECK(reads == want);
	CHECK(faults == (signal_mode ? BLOCKS / 2 * 3 : BLOCKS * 2));
	/*
	 * A long object whose length is read (a hash table's lookup reads one
	 * element more): nothing comes with that fault. Read on in order, its
	 * fault on the second page walks in and brings AHEAD pages, not all of
	 * them (so too with a handler thread, which sees no exact address).
	 */
	for (uint64_t i = LONG_OFF / PG; i < LONG_OFF / PG + LONGS * LONG_BLOCK; i++)
		resident0 += fm_pg_is_resident(*unit_state_byte(map, i));
	r0 = __atomic_load_n(&map->stats.object_reads, __ATOMIC_RELAXED);
	for (uint64_t n = 0; n < LONGS; n++) {
		uint64_t first = LONG_OFF / PG + n * 7 % LONGS * LONG_BLOCK;

		sink += heap[first * PG + OBJ_AT + 12];
		CHECK(object_reads(r0 + n * AHEAD) == r0 + n * AHEAD);
		for (uint64_t k = 0; k <= AHEAD + 1; k++)
			bad += !page_ok(heap, first + k, 7);
	}
	reads = object_reads(r0 + LONGS * AHEAD) - r0;
	fprintf(stderr, "test_pager_object_read (fault=%s): %lu long objects, %llu pages read with them\n", fault,
		LONGS, (unsigned long long)reads);
	CHECK(reads == LONGS * AHEAD);
	CHECK(resident0 == 0);
	CHECK(unheld == 0);
	unit_region_end(p, heap, REGION, bad);
out:
	fm_pager_stop(p);
	unit_object_end = NULL;
	(void)sink;
}

int main(void)
{
	return unit_main("test_pager_object_read", exercise);
}
