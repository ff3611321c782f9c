// SPDX-License-Identifier: Apache-2.0
/*
 * The pager in-process, built with ASan and UBSan, against a real memd: its
 * state machine, evictor, prefetcher and both transports run under the
 * sanitizers while a region is written, rewritten at random, forgotten in
 * part and checked byte for byte. Run from the repository root (it starts
 * build/bin/farmem-memd).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fm_util.h"
#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "transport.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (48ul << 20)
#define NPAGES (REGION / PG)


static uint8_t page_byte(struct fm_resmap_hdr *h, uint64_t i)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;

	return __atomic_load_n(&map[i], __ATOMIC_ACQUIRE);
}

/*
 * Page i's byte once no one holds it. With fault=thread a handler installs
 * the page (which wakes the faulting thread) before it lets go of its hold:
 * on a busy machine the reader runs first and finds the page FILLING for as
 * long as the handler waits for a CPU. Bounded: a hold that never ends is a
 * leak, and the byte then says so.
 */
static uint8_t settled_byte(struct fm_resmap_hdr *h, uint64_t i)
{
	uint8_t b = page_byte(h, i);

	for (unsigned n = 0; n < 100000 && pg_is_hold(fm_pg_state(b)); n++) {
		sched_yield();
		b = page_byte(h, i);
	}
	return b;
}

/* Read other pages until pages i and j are remote (reads alone, and never i or j themselves). */
static int push_out(struct fm_resmap_hdr *h, const uint8_t *a, uint64_t i, uint64_t j, unsigned *seed)
{
	volatile uint8_t sink = 0;

	for (unsigned n = 0; n < 4 * NPAGES; n++) {
		uint64_t k = 1000 + (uint64_t)rand_r(seed) % (NPAGES - 1000);
		if (fm_pg_state(page_byte(h, i)) == FM_PG_REMOTE && fm_pg_state(page_byte(h, j)) == FM_PG_REMOTE)
			return 1;
		if (k != i && k != j)
			sink += a[k * PG];
	}
	(void)sink;
	return 0;
}

/*
 * The rewrite guess (evict.c, fault.c): a page written in its last stay is
 * installed writable by a read, so its next write costs no write-protect
 * fault. A guessed page that was not written ends the guess; one that was
 * keeps it where memd's copy can be looked at (shm), and ends it elsewhere.
 */
static void rewrite_guess(struct fm_resmap_hdr *h, uint8_t *a, uint32_t *ver, int shm, unsigned *seed)
{
	uint64_t g = NPAGES, w = NPAGES;
	unsigned tries, none = 0, gone = 0;

	/*
	 * A remote page written in its last stay, read: it must come in
	 * writable on the guess. Another page the same way, then written: no
	 * write-protect fault. Eviction (the evictor thread with fault=thread,
	 * or a batch at the limit) may take a page between two of our steps:
	 * then it is tried again with another page, looked for from a random
	 * place, so that our reads make no run (test_pager_open_installs has
	 * the guess in pages fetched ahead).
	 */
	for (tries = 0; tries < 400 && (g == NPAGES || w == NPAGES); tries++) {
		uint64_t i = 1000 + (uint64_t)rand_r(seed) % (NPAGES - 1000), wp;
		uint8_t b;
		while (i < NPAGES && (fm_pg_state(b = page_byte(h, i)) != FM_PG_REMOTE || !(b & FM_PGF_REWRITE)))
			i++;
		if (i >= NPAGES) {
			none++;
			continue;
		}
		CHECK(page_ok(a, i, ver[i]));
		b = settled_byte(h, i);
		if (fm_pg_state(b) != FM_PG_DIRTY) {
			gone++; /* gone again already, or fetched ahead */
			continue;
		}
		CHECK(b & FM_PGF_REWRITE);
		if (g == NPAGES) {
			g = i;
			continue;
		}
		wp = h->stats.wp_faults;
		write_page(a, i, ++ver[i]);
		b = settled_byte(h, i);
		if (fm_pg_state(b) == FM_PG_DIRTY && (b & FM_PGF_REWRITE)) {
			CHECK(h->stats.wp_faults == wp); /* installed writable: the write did not fault */
			w = i;
		}
	}
	if (g == NPAGES || w == NPAGES) {
		fprintf(stderr, "rewrite guess: after %u tries, read page %s, written page %s (%u found none, %u gone)\n",
			tries, g < NPAGES ? "found" : "not found", w < NPAGES ? "found" : "not found", none, gone);
		CHECK(g < NPAGES && w < NPAGES);
		return;
	}
	CHECK(push_out(h, a, g, w, seed));
	/* Not written: the guess ends. Written: it goes on where memd's copy can be compared (shm). */
	CHECK(!(page_byte(h, g) & FM_PGF_REWRITE));
	CHECK(!!(page_byte(h, w) & FM_PGF_REWRITE) == shm);
	CHECK(page_ok(a, g, ver[g]) && page_ok(a, w, ver[w]));
}

static void exercise(const char *sock, const char *transport, const char *fault)
{
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	char addr[128], what[64];
	uint32_t *ver;
	uint8_t *a;
	unsigned seed = 12345;
	uint64_t bad = 0;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "%s, fault=%s", transport, fault);
	p = unit_pager(what, addr, "8M",
		       (const char *const[]){ "transport", transport, "fill_threads", "2", "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	CHECK(h->magic == FM_RESMAP_MAGIC && h->version == FM_RESMAP_VERSION);
	CHECK(h->transport == (uint32_t)(strcmp(transport, "shm") ? FM_XPORT_STREAM : FM_XPORT_SHM));
	CHECK(h->stats.fault_mode == (strcmp(fault, "signal") ? 2u : 1u));

	a = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ver = calloc(NPAGES, sizeof(*ver));
	CHECK(a != MAP_FAILED && ver);
	if (a == MAP_FAILED || !ver)
		goto out;
	/* A page present before registration is adopted as dirty and must survive. */
	write_page(a, 0, 1);
	ver[0] = 1;
	CHECK(fm_pager_register(p, a, REGION, 0) == 0);
	CHECK(fm_pager_owns(p, a + PG, 1) && !fm_pager_owns(p, a + REGION, 1));
	CHECK(h->stats.resident_pages >= 1 && h->stats.registered_pages == NPAGES);

	for (uint64_t i = 1; i < NPAGES; i++) {
		write_page(a, i, 1);
		ver[i] = 1;
	}
	for (unsigned n = 0; n < 3 * NPAGES; n++) {
		uint64_t i = (uint64_t)rand_r(&seed) % NPAGES;
		write_page(a, i, ++ver[i]);
	}
	/*
	 * In SIGBUS mode dirty pages leave through a capture (capture.h) until
	 * pages may be shared copy-on-write; then eviction write-protects.
	 */
	{
		uint64_t captured = h->stats.evictions_captured, dirty = h->stats.evictions_dirty;
		uint64_t in_place = h->stats.evictions_in_place;
		CHECK(strcmp(fault, "signal") ? captured == 0 : captured > 0);
		/* Rewritten pages memd holds go from the pipe straight into their slot (shm only). */
		CHECK(in_place <= captured);
		CHECK(strcmp(transport, "shm") || strcmp(fault, "signal") ? in_place == 0 : in_place > 0);
		fm_pager_no_capture(p, "the unit test asks");
		for (unsigned n = 0; n < NPAGES; n++) {
			uint64_t i = (uint64_t)rand_r(&seed) % NPAGES;
			write_page(a, i, ++ver[i]);
		}
		CHECK(h->stats.evictions_captured == captured && h->stats.evictions_dirty > dirty);
	}
	/*
	 * Discard a range as a collector does with freed regions: its contents
	 * stop mattering, and what is written afterwards must survive eviction.
	 * Under this budget the discarded pages stay as garbage: the evictor
	 * takes them first with no write-back, and a write opens a page (and
	 * its run) again.
	 */
	{
		uint64_t discards = h->stats.discards;
		const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;
		uint64_t reused = h->stats.garbage_reused;
		CHECK(fm_pager_discard(p, a + 200 * PG, 400 * PG) > 0);
		CHECK(h->stats.discards > discards);
		CHECK(h->stats.garbage_marked > 0);
		/*
		 * A write to a page that is still garbage opens it again. From the
		 * end of the range: eviction takes garbage from its start, and
		 * every fault at the limit evicts a batch. The evictor thread may
		 * take every garbage page first (a loaded machine); then reads
		 * bring the range's end home clean, and it is discarded again.
		 */
		for (unsigned tries = 0; tries < 50 && h->stats.garbage_reused == reused; tries++) {
			volatile uint8_t sink = 0;
			if (tries) {
				for (uint64_t i = 560; i < 600; i++)
					sink += a[i * PG];
				fm_pager_discard(p, a + 560 * PG, 40 * PG);
			}
			for (uint64_t i = 599; i >= 200 && h->stats.garbage_reused == reused; i--) {
				uint8_t b = __atomic_load_n(&map[i], __ATOMIC_ACQUIRE);
				if (fm_pg_state(b) == FM_PG_CLEAN && (b & FM_PGF_GARBAGE))
					write_page(a, i, ver[i] = 5);
			}
			(void)sink;
		}
		CHECK(h->stats.garbage_reused > reused);
		for (uint64_t i = 200; i < 600; i += 2)
			write_page(a, i, ++ver[i]);
		for (uint64_t i = 201; i < 600; i += 2)
			ver[i] = UINT32_MAX; /* garbage: not checked until rewritten */
		for (unsigned n = 0; n < NPAGES; n++) {
			uint64_t i = 1000 + (uint64_t)rand_r(&seed) % (NPAGES - 1000);
			write_page(a, i, ++ver[i]); /* push the discarded range out */
		}
		for (uint64_t i = 201; i < 600; i += 2)
			write_page(a, i, ver[i] = 7); /* a write after a discard, page resident or not */
	}
	rewrite_guess(h, a, ver, strcmp(transport, "shm") == 0, &seed);
	/*
	 * Forget a range as MADV_DONTNEED would: it reads back as zeros afterwards,
	 * the page its length ends in too (the kernel rounds the length up).
	 */
	CHECK(fm_pager_forget(p, a + 100 * PG, 50 * PG - 100, MADV_DONTNEED) == 0);
	for (uint64_t i = 100; i < 150; i++)
		ver[i] = 0;
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	CHECK(bad == 0);
	CHECK(h->stats.remote_reads > 0 && h->stats.evictions_dirty > 0 && h->stats.zero_fills > 0);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);

	/* Bring everything home, then let the region go. */
	CHECK(fm_pager_fetch_all(p, a, REGION) == 0);
	bad = 0;
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	CHECK(bad == 0);
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	CHECK(!fm_pager_owns(p, a, REGION));
	munmap(a, REGION);
out:
	free(ver);
	fm_pager_stop(p);
	printf("test_pager_inproc: %s transport, fault=%s done\n", transport, fault);
}

static void both_transports(const char *sock, const char *fault)
{
	exercise(sock, "shm", fault);
	exercise(sock, "stream", fault);
}

int main(void)
{
	return unit_main("test_pager_inproc", both_transports);
}
