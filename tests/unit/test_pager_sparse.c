// SPDX-License-Identifier: Apache-2.0
/*
 * Registration with pages present, and sparse regions (issue 20), under ASan
 * and UBSan against a real memd:
 *
 *  - a range registered with more pages present than the budget holds is
 *    brought under the budget before fm_pager_register returns; the peak
 *    counts from there, adopt_peak_pages says what was found;
 *  - what it evicted there does not raise the first GC cycle's garbage quota;
 *  - a heap that fits its budget makes no garbage and has nothing evicted by
 *    an evictor thread; one that outgrows it does;
 *  - free space written again soon keeps its dirty pages writable under
 *    pressure (fm_pager_discard_reused), referenced so that the clock
 *    passes them once more; fm_pager_short_of_room says when
 *    evicted pages come back soon;
 *  - a reserved range (PROT_NONE, as HotSpot reserves its heap) registered
 *    FM_REG_SPARSE is paged as it is committed (mmap MAP_FIXED over it, then
 *    fm_pager_commit), grows, shrinks (fm_pager_unregister of a part, then
 *    mmap PROT_NONE over it, as HotSpot uncommits) and grows again, with
 *    every byte checked and the budget held throughout; a second region over
 *    any part of it is refused (-EEXIST).
 *
 * Run from the repository root (it starts build/bin/farmem-memd).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define MIB (1ul << 20)
#define BUDGET_PAGES (8 * MIB / PG)

static struct fm_pager *start_with(const char *sock, const char *fault, const char *local, const char *evict_threads)
{
	char addr[128], what[64];

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "fault=%s", fault);
	return unit_pager(what, addr, local,
			  (const char *const[]){ "fault", fault, "evict_threads", evict_threads, NULL });
}

static struct fm_pager *start(const char *sock, const char *fault)
{
	return start_with(sock, fault, "8M", "auto");
}

static uint64_t bad_pages(const uint8_t *a, uint64_t first, uint64_t n, const uint32_t *ver)
{
	uint64_t bad = 0;

	for (uint64_t i = first; i < first + n; i++)
		bad += !page_ok(a, i, ver[i]);
	return bad;
}

/* npages of a heap registered with p, or MAP_FAILED (counted) for done() to pass over. */
static uint8_t *heap_region(struct fm_pager *p, uint64_t npages)
{
	uint8_t *a = unit_region(p, npages * PG, FM_REG_HEAP);

	return a ? a : MAP_FAILED;
}

static void done(struct fm_pager *p, uint8_t *a, uint64_t npages, uint32_t *ver, const char *what, const char *fault)
{
	if (a != MAP_FAILED)
		munmap(a, npages * PG);
	free(ver);
	fm_pager_stop(p);
	printf("test_pager_sparse: %s, fault=%s done\n", what, fault);
}

/*
 * 40 MiB written before registration, 8 MiB of budget: the registering
 * thread evicts the rest. With memd_full, memd (its own, of 4 MiB) has room
 * for a few of the 32 MiB over the budget: what it refuses stays resident,
 * nothing is lost, and the pages left over the budget are counted as
 * adopted over it (a fill over it would be over_budget_fills: there is none
 * before the first fault).
 */
static void adopt_over_budget(const char *sock, const char *fault, int memd_full)
{
	const uint64_t npages = 48 * MIB / PG, written = 40 * MIB / PG;
	char small[80];
	pid_t md = -1;
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (memd_full) {
		snprintf(small, sizeof(small), "/tmp/farmem-unit-%d-small.sock", getpid());
		md = unit_start_memd(small, "4M");
		CHECK(md > 0);
		sock = small;
	}
	CHECK(a != MAP_FAILED && ver);
	if (!memd_full || md > 0)
		p = start(sock, fault);
	if (!p || a == MAP_FAILED || !ver)
		goto out;
	h = fm_pager_map(p);
	for (uint64_t i = 0; i < written; i++)
		write_page(a, i, ver[i] = 1);
	CHECK(fm_pager_register(p, a, npages * PG, 0) == 0);
	CHECK(h->stats.adopt_peak_pages >= written && h->stats.faults == 0);
	if (memd_full) {
		CHECK(h->stats.memd_full > 0);
		CHECK(h->stats.resident_pages > h->stats.local_limit_pages);
		CHECK(h->stats.over_budget_adopted >= h->stats.resident_pages - h->stats.local_limit_pages);
		CHECK(h->stats.over_budget_fills == 0);
	} else {
		/* Before any fault: the budget already holds. */
		CHECK(h->stats.resident_pages <= BUDGET_PAGES);
		CHECK(h->stats.peak_resident_pages <= BUDGET_PAGES);
		CHECK(h->stats.adopt_evictions >= written - BUDGET_PAGES);
		CHECK(h->stats.evictions_dirty >= written - BUDGET_PAGES);
		CHECK(h->stats.over_budget_adopted == 0);
	}
	CHECK(bad_pages(a, 0, npages, ver) == 0);
	if (!memd_full) {
		CHECK(h->stats.remote_reads > 0);
		CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	}
	CHECK(fm_pager_unregister(p, a, npages * PG) == 0);
out:
	done(p, a, npages, ver, memd_full ? "adoption with memd full" : "adoption over the budget", fault);
	if (md > 0) {
		kill(md, SIGTERM);
		waitpid(md, NULL, 0);
		unit_memd_files_remove(small);
	}
}

/*
 * A GC cycle may make about twice what the evictor took in the last one into
 * garbage (pager.c): what a registration evicted to bring a heap it found
 * under the budget (attach) is no cycle's pressure. 104 MiB written, 64 MiB of
 * budget: 40 MiB evicted at registration, which counted would have let the
 * first cycle protect half the budget (8192 pages), not the least (4096).
 * No evictor thread: resident pages stay at the budget, under pressure.
 */
static void quota_after_adoption(const char *sock, const char *fault)
{
	const uint64_t npages = 128 * MIB / PG, written = 104 * MIB / PG, budget = 64 * MIB / PG;
	struct fm_pager *p = start_with(sock, fault, "64M", "0");
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(a != MAP_FAILED && ver);
	if (!p || a == MAP_FAILED || !ver)
		goto out;
	h = fm_pager_map(p);
	for (uint64_t i = 0; i < written; i++)
		write_page(a, i, ver[i] = 1);
	CHECK(fm_pager_register(p, a, npages * PG, FM_REG_HEAP) == 0);
	CHECK(h->stats.adopt_evictions >= written - budget);
	CHECK(h->stats.resident_pages <= budget && h->stats.resident_pages >= budget * 9 / 10);
	CHECK(h->stats.faults == 0);
	fm_pager_gc_event(p, 1);
	CHECK(fm_pager_discard(p, a, npages * PG) > 0);
	fm_pager_gc_event(p, 0);
	CHECK(h->stats.garbage_marked == 4096);
	CHECK(fm_pager_unregister(p, a, npages * PG) == 0);
out:
	done(p, a, npages, ver, "the first GC cycle's garbage after adoption", fault);
}

/*
 * While every registered page fits the budget (64 MiB written in a 64 MiB
 * budget: resident pages sit above both watermarks) nothing can ever have to
 * leave (budget.h). Without an evictor thread, a GC cycle's discard leaves
 * the dirty pages as they are (no garbage: no write-protect, no fault when
 * they are written again); with one, that thread evicts nothing. Once a
 * second registration outgrows the budget, the next cycle makes garbage and
 * the evictor thread evicts again. Every byte written survives.
 */
static void all_fits(const char *sock, const char *fault, int evictor)
{
	const uint64_t npages = 64 * MIB / PG, more = 32 * MIB / PG;
	struct fm_pager *p = start_with(sock, fault, "64M", evictor ? "1" : "0");
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *b = mmap(NULL, more * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(a != MAP_FAILED && b != MAP_FAILED && ver);
	if (!p || a == MAP_FAILED || b == MAP_FAILED || !ver)
		goto out;
	h = fm_pager_map(p);
	for (uint64_t i = 0; i < npages; i++)
		write_page(a, i, ver[i] = 1);
	CHECK(fm_pager_register(p, a, npages * PG, FM_REG_HEAP) == 0);
	CHECK(h->stats.adopt_evictions == 0 && h->stats.local_limit_pages == npages);
	if (evictor) {
		/* Time for the evictor thread to have run, had it been woken (it evicts a batch in microseconds). */
		usleep(300 * 1000);
	} else {
		const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;
		uint64_t dirty = 0;
		fm_pager_gc_event(p, 1);
		/* Dirty pages memd holds nothing of: the discard changes none of them. */
		CHECK(fm_pager_discard(p, a, npages * PG) == 0);
		fm_pager_gc_event(p, 0);
		CHECK(h->stats.garbage_marked == 0);
		for (uint64_t i = 0; i < npages; i++)
			dirty += fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE)) == FM_PG_DIRTY;
		CHECK(dirty == npages);
	}
	CHECK(h->stats.evictions_clean + h->stats.evictions_dirty == 0 && h->stats.resident_pages == npages);
	for (uint64_t i = 0; i < npages; i++)
		write_page(a, i, ++ver[i]);
	CHECK(h->stats.wp_faults == 0 && h->stats.faults == 0);
	CHECK(bad_pages(a, 0, npages, ver) == 0);

	CHECK(fm_pager_register(p, b, more * PG, FM_REG_HEAP) == 0);
	if (evictor) {
		/* Faults at the limit evict a batch themselves; each page that comes in wakes the evictor thread too. */
		for (unsigned k = 0; k < 200 && h->stats.evictions_clean + h->stats.evictions_dirty <=
							h->stats.direct_evictions; k++) {
			b[(uint64_t)k * PG] = 1;
			usleep(10 * 1000);
		}
		CHECK(h->stats.evictions_clean + h->stats.evictions_dirty > h->stats.direct_evictions);
		CHECK(h->stats.resident_pages <= npages);
	} else {
		fm_pager_gc_event(p, 1);
		CHECK(fm_pager_discard(p, a, npages * PG) > 0);
		fm_pager_gc_event(p, 0);
		CHECK(h->stats.garbage_marked == 4096);
		for (uint64_t i = 0; i < npages; i++)
			write_page(a, i, ++ver[i]);
		CHECK(h->stats.wp_faults > 0);
	}
	CHECK(bad_pages(a, 0, npages, ver) == 0);
	CHECK(fm_pager_unregister(p, b, more * PG) == 0);
	CHECK(fm_pager_unregister(p, a, npages * PG) == 0);
out:
	if (b != MAP_FAILED)
		munmap(b, more * PG);
	done(p, a, npages, ver, evictor ? "no evictions while the heap fits its budget"
					: "no garbage while the heap fits its budget", fault);
}

/* mmap MAP_FIXED over part of the reservation, as HotSpot commits (rw) and uncommits (none). */
static int remap(uint8_t *a, uint64_t first, uint64_t n, int rw)
{
	void *m = mmap(a + first * PG, n * PG, rw ? PROT_READ | PROT_WRITE : PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | (rw ? 0 : MAP_NORESERVE), -1, 0);
	return m == (void *)(a + first * PG) ? 0 : -1;
}

static uint64_t region_unmanaged(struct fm_resmap_hdr *h, const uint8_t *a)
{
	for (uint32_t r = 0; r < h->nregions; r++) {
		const uint8_t *pg = (const uint8_t *)h + h->regions[r].map_offset;
		uint64_t n = 0;
		if (!(h->regions[r].flags & FM_REGION_F_LIVE) || h->regions[r].base != (uintptr_t)a)
			continue;
		for (uint64_t i = 0; i < h->regions[r].npages; i++)
			n += fm_pg_state(pg[i]) == FM_PG_UNMANAGED;
		return n;
	}
	return UINT64_MAX;
}

static void sparse(const char *sock, const char *fault)
{
	const uint64_t npages = 64 * MIB / PG;
	struct fm_pager *p = start(sock, fault);
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = mmap(NULL, npages * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint64_t evicted, remote_reads;
	unsigned seed = 7;
	char tmpl[] = "/tmp/farmem-sparse-XXXXXX";
	int fd;

	CHECK(a != MAP_FAILED && ver);
	if (!p || a == MAP_FAILED || !ver)
		goto out;
	h = fm_pager_map(p);
	/* A file mapped inside the reservation (HotSpot's CDS heap pieces): never the pager's. */
	fd = mkstemp(tmpl);
	CHECK(fd >= 0 && ftruncate(fd, 1 * MIB) == 0);
	unlink(tmpl);
	CHECK(mmap(a + 60 * MIB, 1 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0) == a + 60 * MIB);
	close(fd);

	CHECK(fm_pager_register(p, a, npages * PG, FM_REG_HEAP | FM_REG_SPARSE) == 0);
	CHECK(region_unmanaged(h, a) == npages);
	/* A second region over any of it is refused: one page, one set of books. */
	CHECK(fm_pager_register(p, a + 4 * MIB, 4 * MIB, 0) == -EEXIST);
	CHECK(fm_pager_register(p, a - 4 * MIB, 8 * MIB, FM_REG_SPARSE) == -EEXIST);
	CHECK(fm_pager_commit(p, a, npages * PG + PG) == -ENOENT);
	CHECK(fm_pager_commit(p, a + 60 * MIB + 8 * MIB, PG) == -ENOENT); /* past the region */

	/* Commit 8 MiB with 4 MiB written before the pager hears of it: those are adopted. */
	CHECK(remap(a, 0, 2048, 1) == 0);
	for (uint64_t i = 0; i < 1024; i++)
		write_page(a, i, ver[i] = 1);
	CHECK(fm_pager_commit(p, a, 2048 * PG) == 2048);
	CHECK(fm_pager_commit(p, a, 2048 * PG) == 0); /* again: nothing new */
	CHECK(h->stats.registered_pages == 2048 && h->stats.resident_pages == 1024);
	CHECK(region_unmanaged(h, a) == npages - 2048);

	/* Grow by 24 MiB (G1 expands upward from what is committed) and use all 32 MiB. */
	CHECK(remap(a, 2048, 6144, 1) == 0);
	CHECK(fm_pager_commit(p, a, 8192 * PG) == 6144);
	CHECK(h->stats.registered_pages == 8192);
	for (uint64_t i = 0; i < 8192; i++)
		write_page(a, i, ver[i] = 2);
	for (unsigned n = 0; n < 8192; n++) {
		uint64_t i = (uint64_t)rand_r(&seed) % 8192;
		write_page(a, i, ++ver[i]);
	}
	CHECK(bad_pages(a, 0, 8192, ver) == 0);
	CHECK(h->stats.evictions_dirty > 0 && h->stats.remote_reads > 0);

	/* Shrink: the top 16 MiB leave the pager, then become PROT_NONE again. */
	CHECK(fm_pager_unregister(p, a + 4096 * PG, 4096 * PG) == 0);
	CHECK(remap(a, 4096, 4096, 0) == 0);
	CHECK(h->stats.registered_pages == 4096);
	CHECK(region_unmanaged(h, a) == npages - 4096);
	CHECK(h->stats.resident_pages <= BUDGET_PAGES);
	CHECK(bad_pages(a, 0, 4096, ver) == 0);

	/* Grow again over what was let go: it reads as zeros, and is paged like the rest. */
	CHECK(remap(a, 4096, 8192, 1) == 0);
	CHECK(fm_pager_commit(p, a, 12288 * PG) == 8192);
	CHECK(h->stats.registered_pages == 12288);
	for (uint64_t i = 4096; i < 12288; i++)
		ver[i] = 0;
	CHECK(bad_pages(a, 4096, 8192, ver) == 0);
	evicted = h->stats.evictions_dirty;
	remote_reads = h->stats.remote_reads;
	for (uint64_t i = 4096; i < 12288; i++)
		write_page(a, i, ver[i] = 3);
	CHECK(bad_pages(a, 0, 12288, ver) == 0);
	CHECK(h->stats.evictions_dirty > evicted && h->stats.remote_reads > remote_reads);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);

	/* Everything home, then the whole reservation goes (around the file piece). */
	CHECK(fm_pager_fetch_all(p, a, npages * PG) == 0);
	CHECK(bad_pages(a, 0, 12288, ver) == 0);
	CHECK(fm_pager_unregister(p, a, npages * PG) == 0);
	CHECK(!fm_pager_owns(p, a, npages * PG));
	CHECK(bad_pages(a, 0, 12288, ver) == 0); /* plain memory now */
out:
	done(p, a, npages, ver, "a sparse region", fault);
}


static uint64_t count_state(const uint8_t *map, uint64_t first, uint64_t n, unsigned state)
{
	uint64_t k = 0;

	for (uint64_t i = first; i < first + n; i++)
		k += fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE)) == state;
	return k;
}

/*
 * Free space written again soon (fm_pager_discard_reused: G1's next eden)
 * keeps its dirty pages dirty and writable even under pressure: no garbage
 * made there, no write-protect fault when they are written again, while a
 * plain discard beside it makes garbage that a write opens with a fault. 128
 * MiB written in a 64 MiB budget, no evictor thread: most of the last 32 MiB
 * written are resident and dirty. Every byte written survives.
 */
static void reused_stays_writable(const char *sock, const char *fault)
{
	const uint64_t npages = 128 * MIB / PG, part = 16 * MIB / PG;
	const uint64_t reused = npages - part, plain = npages - 2 * part;
	struct fm_pager *p = start_with(sock, fault, "64M", "0");
	struct fm_resmap_hdr *h;
	const uint8_t *map;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = MAP_FAILED;
	uint64_t dirty = 0, marked, wp, faults;

	CHECK(ver != NULL);
	if (!p || !ver)
		goto out;
	h = fm_pager_map(p);
	a = heap_region(p, npages);
	if (a == MAP_FAILED)
		goto out;
	map = (const uint8_t *)h + h->regions[0].map_offset;
	for (uint64_t i = 0; i < npages; i++)
		write_page(a, i, ver[i] = 1);
	/*
	 * Most of the last pages written are resident (a clock, not an LRU: not
	 * all), dirty once the pager is done with them (the discard waits for that).
	 */
	dirty = part - count_state(map, reused, part, FM_PG_REMOTE) - count_state(map, reused, part, FM_PG_UNTOUCHED);
	CHECK(dirty >= part / 2 && count_state(map, plain, part, FM_PG_DIRTY) >= part / 2);
	fm_pager_gc_event(p, 1);
	/* Its remote pages' copies die (they read as garbage now); its dirty pages stay as they are. */
	CHECK(fm_pager_discard_reused(p, a + reused * PG, part * PG) == (long)count_state(map, reused, part, FM_PG_UNTOUCHED));
	CHECK(h->stats.garbage_marked == 0 && count_state(map, reused, part, FM_PG_DIRTY) == dirty);
	CHECK(fm_pager_discard(p, a + plain * PG, part * PG) > 0);
	fm_pager_gc_event(p, 0);
	marked = h->stats.garbage_marked;
	CHECK(marked > 0 && count_state(map, plain, part, FM_PG_DIRTY) == 0);
	for (uint64_t i = plain; i < npages; i++)
		if (fm_pg_state(__atomic_load_n(&map[i], __ATOMIC_ACQUIRE)) == FM_PG_UNTOUCHED)
			ver[i] = 0; /* its copy died: garbage, written below before it is read */
	wp = h->stats.wp_faults;
	faults = h->stats.faults;
	for (uint64_t i = reused; i < npages; i++)
		write_page(a, i, ++ver[i]);
	/* Only the pages whose copies died fault (zero fills); the dirty ones are written in place. */
	CHECK(h->stats.wp_faults == wp && h->stats.faults - faults <= part - dirty);
	for (uint64_t i = plain; i < reused; i++)
		write_page(a, i, ++ver[i]);
	CHECK(h->stats.wp_faults > wp);
	CHECK(bad_pages(a, 0, npages, ver) == 0);
	unit_region_end(p, a, npages * PG, 0);
	a = MAP_FAILED;
out:
	done(p, a, npages, ver, "free space reused soon stays writable", fault);
}

/* Dirty pages of [first, first+n) the clock would take at its next pass (no FM_PGF_REF). */
static uint64_t count_dirty_unreferenced(const uint8_t *map, uint64_t first, uint64_t n)
{
	uint64_t k = 0;

	for (uint64_t i = first; i < first + n; i++) {
		uint8_t b = __atomic_load_n(&map[i], __ATOMIC_ACQUIRE);
		k += fm_pg_state(b) == FM_PG_DIRTY && !(b & FM_PGF_REF);
	}
	return k;
}

/*
 * The reused free space's dirty pages come out of the discard referenced:
 * the clock passes them once more before they can leave. 128 MiB written in
 * a 64 MiB budget, then the first pages read back, so that the hand passes
 * the last ones written and unreferences them; the discard references them
 * again. Every byte is checked.
 */
static void reused_referenced(const char *sock, const char *fault)
{
	const uint64_t npages = 128 * MIB / PG, part = 16 * MIB / PG, reused = npages - part;
	struct fm_pager *p = start_with(sock, fault, "64M", "0");
	struct fm_resmap_hdr *h;
	const uint8_t *map;
	uint8_t *a = MAP_FAILED;
	uint64_t before = 0, bad = 0;

	if (!p)
		goto out;
	h = fm_pager_map(p);
	a = heap_region(p, npages);
	if (a == MAP_FAILED)
		goto out;
	map = (const uint8_t *)h + h->regions[0].map_offset;
	for (uint64_t i = 0; i < npages; i++)
		write_page(a, i, 1);
	for (uint64_t i = 0; i < part / 16; i++)
		bad += !page_ok(a, i, 1);
	before = count_dirty_unreferenced(map, reused, part);
	fm_pager_gc_event(p, 1);
	CHECK(fm_pager_discard_reused(p, a + reused * PG, part * PG) >= (long)before);
	fm_pager_gc_event(p, 0);
	fprintf(stderr, "test_pager_sparse (fault=%s): %llu dirty pages unreferenced before the discard, %llu after\n",
		fault, (unsigned long long)before, (unsigned long long)count_dirty_unreferenced(map, reused, part));
	CHECK(before > 0 && count_dirty_unreferenced(map, reused, part) == 0);
	for (uint64_t i = 0; i < reused; i++)
		bad += !page_ok(a, i, 1);
	unit_region_end(p, a, npages * PG, bad);
	a = MAP_FAILED;
out:
	done(p, a, npages, NULL, "reused free space referenced", fault);
}

/*
 * fm_pager_short_of_room: the program's faults on pages that left memory a
 * moment before say the budget holds less than it works on. 256 MiB written
 * in a 64 MiB budget: reading the first 32 MiB back (gone three budgets of
 * evictions before) says nothing of the kind; reading 80 MiB over and over
 * (each page gone a quarter of a budget before it comes back) does. A
 * cycle with too few such faults to tell keeps the last verdict.
 */
static void short_of_room(const char *sock, const char *fault)
{
	const uint64_t npages = 256 * MIB / PG;
	struct fm_pager *p = start_with(sock, fault, "64M", "0");
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = MAP_FAILED;
	uint64_t bad = 0;

	CHECK(ver != NULL);
	if (!p || !ver)
		goto out;
	a = heap_region(p, npages);
	if (a == MAP_FAILED)
		goto out;
	for (uint64_t i = 0; i < npages; i++)
		write_page(a, i, ver[i] = 1);
	fm_pager_gc_event(p, 1);
	fm_pager_gc_event(p, 0);
	CHECK(!fm_pager_short_of_room(p)); /* no fault on a remote page yet */
	bad += bad_pages(a, 0, 32 * MIB / PG, ver);
	fm_pager_gc_event(p, 1);
	fm_pager_gc_event(p, 0);
	CHECK(!fm_pager_short_of_room(p));
	for (int pass = 0; pass < 4; pass++)
		bad += bad_pages(a, 64 * MIB / PG, 80 * MIB / PG, ver);
	fm_pager_gc_event(p, 1);
	fm_pager_gc_event(p, 0);
	CHECK(fm_pager_short_of_room(p));
	bad += bad_pages(a, 64 * MIB / PG, 16, ver); /* too few faults to tell */
	fm_pager_gc_event(p, 1);
	fm_pager_gc_event(p, 0);
	CHECK(fm_pager_short_of_room(p));
	unit_region_end(p, a, npages * PG, bad);
	a = MAP_FAILED;
out:
	done(p, a, npages, ver, "short of room", fault);
}

/*
 * An evictor thread rests through a collector's pause: two GC workers on two
 * CPUs and an evictor beside them made the pause longer (pager.c,
 * fm_pager_gc_event). Faults at the budget evict for themselves meanwhile;
 * the pause's end wakes the evictor, which brings resident pages down to its
 * low mark. 8 MiB of budget, high 90%, low 50%: 8 MiB written in a pause
 * stays resident (a resting evictor takes nothing), half of it leaves after.
 */
static void evictor_rests_in_pause(const char *sock, const char *fault)
{
	const uint64_t npages = 32 * MIB / PG;
	char addr[128], what[64];
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(npages, sizeof(*ver));
	uint8_t *a = MAP_FAILED;
	uint64_t bad = 0, resident_in_pause;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "fault=%s", fault);
	p = unit_pager(what, addr, "8M",
		       (const char *const[]){ "fault", fault, "evict_threads", "1", "evict_high", "90", "evict_low",
					      "50", "prefetch", "0", NULL });
	CHECK(ver != NULL);
	if (!p || !ver)
		goto out;
	h = fm_pager_map(p);
	a = heap_region(p, npages);
	if (a == MAP_FAILED)
		goto out;
	/* Past the budget once: every page later written in the pause is a zero fill at or over the high mark. */
	for (uint64_t i = 0; i < 2 * BUDGET_PAGES; i++)
		write_page(a, i, ver[i] = 1);
	for (int t = 0; t < 200 && h->stats.resident_pages > BUDGET_PAGES / 2 + 64; t++)
		usleep(10000);
	fm_pager_gc_event(p, 1);
	for (uint64_t i = 2 * BUDGET_PAGES; i < 3 * BUDGET_PAGES; i++)
		write_page(a, i, ver[i] = 2);
	usleep(100000); /* an evictor that did not rest would have taken its half by now */
	resident_in_pause = h->stats.resident_pages;
	CHECK(resident_in_pause >= BUDGET_PAGES * 95 / 100 && resident_in_pause <= BUDGET_PAGES);
	fm_pager_gc_event(p, 0);
	for (int t = 0; t < 200 && h->stats.resident_pages > BUDGET_PAGES / 2 + 64; t++)
		usleep(10000);
	CHECK(h->stats.resident_pages <= BUDGET_PAGES / 2 + 64);
	CHECK(h->stats.peak_resident_pages <= BUDGET_PAGES);
	bad += bad_pages(a, 0, 3 * BUDGET_PAGES, ver);
	if (resident_in_pause < BUDGET_PAGES * 95 / 100)
		fprintf(stderr, "evictor_rests_in_pause: %lu of %lu pages resident in the pause\n",
			(unsigned long)resident_in_pause, (unsigned long)BUDGET_PAGES);
	unit_region_end(p, a, npages * PG, bad);
	a = MAP_FAILED;
out:
	done(p, a, npages, ver, "an evictor rests in a pause", fault);
}

static void both(const char *sock, const char *fault)
{
	adopt_over_budget(sock, fault, 0);
	adopt_over_budget(sock, fault, 1);
	quota_after_adoption(sock, fault);
	all_fits(sock, fault, 0);
	all_fits(sock, fault, 1);
	reused_stays_writable(sock, fault);
	reused_referenced(sock, fault);
	short_of_room(sock, fault);
	evictor_rests_in_pause(sock, fault);
	sparse(sock, fault);
}

int main(void)
{
	return unit_main("test_pager_sparse", both);
}
