// SPDX-License-Identifier: Apache-2.0
/*
 * Which pages go in writable, against a real memd on shm, with ASan and
 * UBSan. A write-protect fault on a page read in a moment earlier is one more
 * fault; where a handler thread serves it, one more handoff between two CPUs.
 *
 * - Fetched ahead: a remote page written in its last stay goes in writable
 *   when the prefetcher brings it, as its own fault would put it (the
 *   rewrite guess), so reading a run of such pages and writing them costs
 *   no write-protect fault.
 * - A region a handler thread serves (FM_REG_KERNEL_WAITS, every region
 *   with fault=thread): every page goes in writable, and one read but not
 *   written leaves clean all the same (eviction compares it with memd's
 *   copy).
 *
 * Every page is checked byte for byte at the end. Run from the repository
 * root.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define RUN (16ul << 20)
#define NRUN (RUN / PG)
#define HEAP (8ul << 20)
#define NHEAP (HEAP / PG)

static unsigned state(struct fm_resmap_hdr *h, int slot, uint64_t i)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[slot].map_offset;

	return fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE));
}

/* Rewrite the run region at random until page i of the heap (slot 1) is remote; the run's versions in ver. */
static int push_heap_out(struct fm_resmap_hdr *h, uint8_t *run, uint32_t *ver, uint64_t i, unsigned *seed)
{
	for (unsigned n = 0; n < 8 * NRUN; n++) {
		uint64_t k;
		if (state(h, 1, i) == FM_PG_REMOTE)
			return 1;
		k = (uint64_t)rand_r(seed) % NRUN;
		write_page(run, k, ++ver[k]);
	}
	return 0;
}

static void run_case(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	char addr[128], err[256];
	uint32_t *ver, *hver;
	uint8_t *run, *heap = NULL;
	unsigned seed = 99;
	uint64_t wp, issued, clean, bad = 0, n, read_only = 0;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	p = unit_pager(fault, addr, "4M", (const char *const[]){ "fault", fault, "transport", "shm", NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	ver = calloc(NRUN, sizeof(*ver));
	hver = calloc(NHEAP, sizeof(*hver));
	CHECK(ver && hver);
	run = unit_region(p, RUN, 0);
	if (!run || !ver || !hver)
		goto out;

	/* Written in order, four times the budget: the first three quarters leave dirty, written in their stay. */
	for (uint64_t i = 0; i < NRUN; i++)
		write_page(run, i, ver[i] = 1);
	CHECK(state(h, 0, 0) == FM_PG_REMOTE && state(h, 0, NRUN / 2) == FM_PG_REMOTE);

	/*
	 * Read in order and each page written after its read: the reads make
	 * a run and the prefetcher brings the pages ahead. With fault=thread
	 * every page goes in writable anyway; with fault=signal only the
	 * guess does it.
	 */
	wp = h->stats.wp_faults;
	issued = h->stats.prefetch_issued;
	n = NRUN / 2;
	for (uint64_t i = 0; i < n; i++) {
		bad += !page_ok(run, i, ver[i]);
		write_page(run, i, ++ver[i]);
	}
	CHECK(bad == 0);
	/*
	 * Most pages come ahead of their reads (about 70% on an idle machine);
	 * on a loaded one the reader outruns the prefetcher, which then brings
	 * half as many. An eighth is still the prefetcher's path well exercised.
	 */
	CHECK(h->stats.prefetch_issued - issued > n / 8);
	/* A page evicted between its read and its write faults there again; before, 7 in 8 did. */
	if (h->stats.wp_faults - wp > n / 32)
		fprintf(stderr, "test_pager_open_installs (%s): %llu write-protect faults in %llu pages read, then written\n",
			fault, (unsigned long long)(h->stats.wp_faults - wp), (unsigned long long)n);
	CHECK(h->stats.wp_faults - wp <= n / 32);

	/* A heap: the kernel waits for its pages, a handler thread installs them. */
	CHECK(fm_pager_open_kernel_waits(p, err, sizeof(err)) == 0);
	heap = mmap(NULL, HEAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(heap != MAP_FAILED);
	if (heap == MAP_FAILED) {
		heap = NULL;
		goto out;
	}
	CHECK(fm_pager_register(p, heap, HEAP, FM_REG_KERNEL_WAITS) == 0);
	for (uint64_t i = 0; i < NHEAP; i++)
		write_page(heap, i, hver[i] = 1);
	/*
	 * Each page pushed out and read (a fault the handler serves): it goes
	 * in writable, on the guess since it was written. Pushed out again
	 * unwritten, it leaves clean (memd has its bytes) and the guess ends;
	 * read once more, it still goes in writable, and its write costs no
	 * write-protect fault.
	 */
	wp = h->stats.wp_faults;
	for (uint64_t i = 0; i < NHEAP; i += 16) {
		if (!push_heap_out(h, run, ver, i, &seed))
			continue;
		bad += !page_ok(heap, i, hver[i]);
		/* Writable, or gone again already: never installed write-protected. */
		CHECK(state(h, 1, i) != FM_PG_CLEAN);
		clean = h->stats.evictions_clean;
		if (!push_heap_out(h, run, ver, i, &seed) || h->stats.evictions_clean == clean)
			continue;
		read_only++;
		bad += !page_ok(heap, i, hver[i]);
		CHECK(state(h, 1, i) != FM_PG_CLEAN);
		write_page(heap, i, ++hver[i]);
	}
	CHECK(bad == 0);
	CHECK(h->stats.wp_faults == wp);
	CHECK(read_only > NHEAP / 16 / 4);

	for (uint64_t i = 0; i < NRUN; i++)
		bad += !page_ok(run, i, ver[i]);
	for (uint64_t i = 0; i < NHEAP; i++)
		bad += !page_ok(heap, i, hver[i]);
	CHECK(bad == 0);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	printf("test_pager_open_installs: fault=%s done (%llu heap pages read only left clean)\n", fault,
	       (unsigned long long)read_only);
out:
	if (heap) {
		CHECK(fm_pager_unregister(p, heap, HEAP) == 0);
		munmap(heap, HEAP);
	}
	if (run) {
		CHECK(fm_pager_unregister(p, run, RUN) == 0);
		munmap(run, RUN);
	}
	free(ver);
	free(hver);
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_open_installs", run_case);
}
