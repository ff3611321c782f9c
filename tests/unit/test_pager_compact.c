// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_move_bytes and fm_pager_read_words (uffd/compact.c) against a
 * real memd, with ASan and UBSan: a full GC's compaction done where the pages
 * lie. A 16 MiB region holds "objects" of 16 bytes to 40 KiB on pages that
 * are resident (dirty and clean), remote and untouched; they slide down the
 * region in address order as G1's phase 4 slides them, in batches, while a
 * second thread writes other memory at the budget so that eviction runs all
 * the time. Every move the pager declines is done here, as the collector
 * does. The same moves done with memmove on a shadow copy must give the same
 * bytes, read back through the pager page by page (remote pages come back
 * from memd with their checksums checked), and the counters must show that
 * most moves were done in memd's store without bringing their pages here.
 * A header read from (or a word written to) a remote page must leave the page
 * remote. Discarded free space keeps its memory in memd's store for the next
 * writes, up to a bound, and reads back right. Bad input is
 * refused with nothing changed, and a stream transport says -EOPNOTSUPP.
 * Both fault modes; memd's store mapped here (shm) and over the wire (memd's
 * EDIT, on a Unix socket and over TCP); several memds, which cannot EDIT.
 * A move memd stops (full) after a page it opened to overwrite leaves that
 * page as it was. A pause worker's write to a clean page opens the clean
 * pages after it (uffd/fault.c). A collector thread's read of a remote page
 * goes in writable, except a thread that writes no heap (G1's marking).
 * Run from the repository root.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (40ul << 20)   /* past 32 MiB: half of it is over keep's 16 MiB floor */
#define HEAP (12ul << 20)      /* the compacted part; [HEAP, REGION) is written to press the budget */
#define MAXOBJ 4000

struct obj {
	uintptr_t src, dst;
	size_t len;
};

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static unsigned byte_at(struct fm_resmap_hdr *h, uint64_t page)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;
	return map[page];
}

static unsigned state_at(struct fm_resmap_hdr *h, uint64_t page)
{
	return byte_at(h, page) & FM_PG_STATE_MASK;
}

struct presser {
	uint8_t *a;
	atomic_int stop;
	atomic_ulong rounds;
};

/* Writes [HEAP, REGION) round after round: each fault at the budget evicts a batch. */
static void *press(void *arg)
{
	struct presser *ps = arg;
	unsigned round = 0;

	while (!atomic_load(&ps->stop)) {
		for (uint64_t i = HEAP; i < REGION && !atomic_load(&ps->stop); i += PG)
			ps->a[i + (round * 64) % PG] = (uint8_t)round;
		round++;
		atomic_fetch_add(&ps->rounds, 1);
	}
	return NULL;
}

static void scenario(const char *addr, const char *transport, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	struct obj *o = calloc(MAXOBJ, sizeof(*o));
	uint8_t *a, *shadow = malloc(REGION);
	char label[96];
	unsigned nobj = 0, nrem = 0, nres = 0, nunt = 0;
	uint64_t bad = 0, declined_here = 0;
	struct presser ps = { 0 };
	pthread_t th;
	int shm = !strcmp(transport, "shm");

	snprintf(label, sizeof(label), "%s %s, %s", transport, addr, fault);
	fault = label; /* the messages below name the whole case */
	p = unit_pager(fault, addr, "2M",
			(const char *const[]){ "transport", transport, "fault", strrchr(label, ' ') + 1, NULL });
	if (!p) {
		free(o);
		free(shadow);
		return;
	}
	h = fm_pager_map(p);
	a = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(a != MAP_FAILED && o && shadow);
	if (a == MAP_FAILED || !o || !shadow)
		goto out;
	CHECK(fm_pager_register(p, a, REGION, FM_REG_HEAP) == 0);
	memset(shadow, 0, REGION);

	/*
	 * Objects: random lengths (8-byte words), gaps between them (the dead),
	 * every tenth page left untouched. Written in address order, so with a
	 * 2 MiB budget most of the heap is remote by the end, the last part
	 * resident.
	 */
	for (uintptr_t at = 0; nobj < MAXOBJ;) {
		size_t len = 16 + 8 * (rnd() % (rnd() % 4 ? 512 : 5120));
		at += 8 * (rnd() % 512);
		if (((at + len) / PG) % 10 == 9)
			at = ((at + len) / PG + 1) * PG; /* leave that page untouched */
		if (at + len > HEAP)
			break;
		o[nobj].src = at;
		o[nobj].len = len;
		for (size_t k = 0; k < len; k += 8) {
			uint64_t w = ((uint64_t)nobj << 32) ^ k ^ 0xa5a5a5a5ull;
			memcpy(a + at + k, &w, 8);
			memcpy(shadow + at + k, &w, 8);
		}
		at += len;
		nobj++;
	}
	for (uint64_t i = 0; i < HEAP / PG; i++) {
		unsigned s = state_at(h, i);
		nrem += s == FM_PG_REMOTE;
		nunt += s == FM_PG_UNTOUCHED;
		nres += s == FM_PG_CLEAN || s == FM_PG_DIRTY;
	}
	fprintf(stderr, "test_pager_compact (%s): %u objects; heap pages resident %u, remote %u, untouched %u\n",
		fault, nobj, nres, nrem, nunt);
	CHECK(nrem > 1000 && nres > 100 && nunt > 50);

	/* Bad input: refused, nothing changed. */
	{
		struct fm_byte_move m[2] = {
			{ .src = (uintptr_t)a + o[0].src, .dst = (uintptr_t)a, .len = 0 },
			{ .src = (uintptr_t)a + o[0].src, .dst = (uintptr_t)a, .len = 4, .set_first_word = 1 },
		};
		uint64_t w;
		CHECK(fm_pager_move_bytes(p, &m[0], 1) == -EINVAL);
		CHECK(fm_pager_move_bytes(p, &m[1], 1) == -EINVAL);
		CHECK(fm_pager_read_words(p, a + PG - 8, &w, 16) == -EINVAL);
		CHECK(fm_pager_read_words(p, a, &w, 0) == -EINVAL);
		CHECK(fm_pager_move_bytes(p, m, 0) == 0);
	}

	/* A header read where it lies: the page stays remote. */
	{
		unsigned done = 0;
		for (unsigned k = 0; k < nobj && done < 20; k++) {
			uint64_t pg = o[k].src / PG, w[3];
			if (state_at(h, pg) != FM_PG_REMOTE || (o[k].src % PG) > PG - sizeof(w) || o[k].len < sizeof(w))
				continue;
			CHECK(fm_pager_read_words(p, a + o[k].src, w, sizeof(w)) == 0);
			CHECK(memcmp(w, shadow + o[k].src, sizeof(w)) == 0);
			CHECK(state_at(h, pg) == FM_PG_REMOTE);
			done++;
		}
		CHECK(done == 20);
	}

	/* A header word written where it lies: the page stays remote, the shadow agrees. */
	{
		unsigned done = 0;
		for (unsigned k = nobj; k-- > 0 && done < 20;) {
			uint64_t pg = o[k].src / PG, w = 0x7700000000000001ull | ((uint64_t)k << 8);
			if (state_at(h, pg) != FM_PG_REMOTE || (o[k].src % PG) > PG - 8)
				continue;
			CHECK(fm_pager_write_words(p, a + o[k].src, &w, 8) == 0);
			memcpy(shadow + o[k].src, &w, 8);
			CHECK(state_at(h, pg) == FM_PG_REMOTE);
			done++;
		}
		CHECK(done == 20);
	}

	/* Compaction: each object slides down to the running top, in order. */
	{
		uintptr_t top = 0;
		for (unsigned k = 0; k < nobj; k++) {
			o[k].dst = top;
			top += o[k].len;
		}
	}
	ps.a = a;
	CHECK(pthread_create(&th, NULL, press, &ps) == 0);
	uint64_t moves0 = h->stats.compact_moves, pages0 = h->stats.compact_pages;
	for (unsigned k = 0; k < nobj;) {
		struct fm_byte_move m[64];
		unsigned n = 1 + (unsigned)(rnd() % 64), sent = 0;
		long done;
		if (n > nobj - k)
			n = nobj - k;
		for (unsigned j = 0; j < n; j++) {
			uint64_t first = ((uint64_t)(k + j) << 40) | 0x1;
			m[j] = (struct fm_byte_move){ .src = (uintptr_t)a + o[k + j].src, .dst = (uintptr_t)a + o[k + j].dst,
						      .len = o[k + j].len, .first_word = first, .set_first_word = 1 };
			memmove(shadow + o[k + j].dst, shadow + o[k + j].src, o[k + j].len);
			memcpy(shadow + o[k + j].dst, &first, 8);
		}
		while (sent < n) {
			done = fm_pager_move_bytes(p, m + sent, n - sent);
			CHECK(done >= 0);
			if (done < 0)
				break;
			sent += (unsigned)done;
			if (sent < n) {
				/* Declined: the collector copies it, with faults as usual. */
				memmove((void *)m[sent].dst, (const void *)m[sent].src, m[sent].len);
				memcpy((void *)m[sent].dst, &m[sent].first_word, 8);
				declined_here++;
				sent++;
			}
		}
		k += n;
	}
	atomic_store(&ps.stop, 1);
	pthread_join(th, NULL);
	fprintf(stderr, "test_pager_compact (%s): moved in place %llu (store pages %llu), declined %llu; "
		"%lu press rounds\n", fault, (unsigned long long)(h->stats.compact_moves - moves0),
		(unsigned long long)(h->stats.compact_pages - pages0), (unsigned long long)declined_here,
		atomic_load(&ps.rounds));
	CHECK(h->stats.compact_moves - moves0 > nobj / 2);
	CHECK(h->stats.compact_pages - pages0 > 500);
	CHECK(h->stats.compact_moves - moves0 + declined_here == nobj);

	/* Every byte of the heap as the shadow says, read through the pager. */
	bad = 0;
	for (uint64_t i = 0; i < HEAP; i += PG)
		bad += memcmp(a + i, shadow + i, PG) != 0;
	CHECK(bad == 0);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);

	/*
	 * The compacted heap's free space, discarded: memd keeps the memory of
	 * its slots (shm) for their next writes, which find the right bytes on
	 * the way back; past half the region the oldest goes back.
	 */
	{
		uintptr_t top = o[nobj - 1].dst + o[nobj - 1].len, from = (top + PG - 1) & ~(PG - 1);
		uint64_t released0 = h->stats.discard_released;
		CHECK(fm_pager_discard(p, a + from, HEAP - from) > 0);
		CHECK(shm ? h->stats.discard_kept > 0 : h->stats.discard_kept == 0); /* only shm keeps memory */
		for (uint64_t i = from; i < HEAP; i += PG)
			write_page(a, i / PG, 7);
		for (uint64_t i = HEAP; i < REGION; i += PG)
			a[i] = 9; /* pushes the free space's new bytes out to memd */
		bad = 0;
		for (uint64_t i = from; i < HEAP; i += PG)
			bad += !page_ok(a, i / PG, 7);
		CHECK(bad == 0);
		for (int round = 0; round < 3; round++) {
			for (uint64_t i = 0; i < REGION; i += PG)
				a[i] = (uint8_t)round; /* every page remote or resident, written */
			CHECK(fm_pager_discard(p, a, REGION) > 0);
		}
		/*
		 * The bound: half the region (at least 16 MiB), counted exactly: the
		 * same slot kept in each round is one slot, so only a region whose
		 * free space passes it gives memory back.
		 */
		CHECK(h->stats.discard_kept <= REGION / PG / 2);
		CHECK(!shm || h->stats.discard_released > released0);
		fprintf(stderr, "test_pager_compact (%s): free space kept in memd %llu pages, given back %llu\n", fault,
			(unsigned long long)h->stats.discard_kept,
			(unsigned long long)(h->stats.discard_released - released0));
	}
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	munmap(a, REGION);
out:
	fm_pager_stop(p);
	free(o);
	free(shadow);
}

/*
 * A clean page (read, never written: write-protected) as a destination is
 * unprotected by the move and let go dirty, with no write-protect fault: the
 * write after it takes none either. A header on a resident page is read from
 * the heap; a word written to a clean page opens it the same way.
 */
static void small(const char *addr, const char *transport)
{
	struct fm_pager *p = unit_pager("small", addr, "1M",
					 (const char *const[]){ "transport", transport, "prefetch", "0", NULL });
	struct fm_resmap_hdr *h;
	uint8_t *a;
	uint64_t w = 0, first = 0x1234567800000001ull;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, 4 * PG, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	memset(a + 2 * PG, 0x5a, 128);
	CHECK(a[0] == 0 && state_at(h, 0) == FM_PG_CLEAN && state_at(h, 2) == FM_PG_DIRTY);
	{
		struct fm_byte_move m = { .src = (uintptr_t)a + 2 * PG, .dst = (uintptr_t)a, .len = 128,
					  .first_word = first, .set_first_word = 1 };
		uint64_t declined = h->stats.compact_declined, opened = h->stats.compact_opened;
		uint64_t wp = h->stats.wp_faults;
		CHECK(fm_pager_move_bytes(p, &m, 1) == 1);
		CHECK(h->stats.compact_declined == declined && h->stats.compact_opened == opened + 1);
		CHECK(memcmp(a, &first, 8) == 0 && a[8] == 0x5a && a[127] == 0x5a && a[128] == 0);
		CHECK(state_at(h, 0) == FM_PG_DIRTY);
		a[PG - 1] = 1; /* open already: no fault */
		CHECK(h->stats.wp_faults == wp);
		CHECK(fm_pager_move_bytes(p, &m, 1) == 1 && h->stats.compact_opened == opened + 1);
		CHECK(memcmp(a, &first, 8) == 0 && a[8] == 0x5a && a[127] == 0x5a && a[128] == 0);
		CHECK(fm_pager_read_words(p, a + 2 * PG + 8, &w, 8) == 0 && w == 0x5a5a5a5a5a5a5a5aull);
		CHECK(state_at(h, 0) == FM_PG_DIRTY && state_at(h, 2) == FM_PG_DIRTY);
		/* A word written through the heap on a dirty page, and on a clean one, which it opens. */
		w = 0x1111111111111111ull;
		CHECK(fm_pager_write_words(p, a + 16, &w, 8) == 0 && a[16] == 0x11 && a[23] == 0x11);
		CHECK(((volatile uint8_t *)a)[3 * PG] == 0); /* read: clean */
		CHECK(state_at(h, 3) == FM_PG_CLEAN && fm_pager_write_words(p, a + 3 * PG, &w, 8) == 0);
		CHECK(state_at(h, 3) == FM_PG_DIRTY && a[3 * PG] == 0x11 && h->stats.compact_opened == opened + 2);
		a[3 * PG + 100] = 2;
		CHECK(h->stats.wp_faults == wp);
		CHECK(fm_pager_write_words(p, a + PG - 4, &w, 8) == -EINVAL);
	}
	CHECK(fm_pager_unregister(p, a, 4 * PG) == 0);
	munmap(a, 4 * PG);
	fm_pager_stop(p);
}

/* The collector's pause worker while one is named (0: none), as the agent's is_gc_thread says. */
static atomic_long pause_worker;

static int pause_worker_is(pid_t tid)
{
	return tid == atomic_load(&pause_worker) ? FM_GC_PAUSE : 0;
}

/*
 * A pause worker's write to a clean page opens the clean pages after it with
 * it, in one unprotect (uffd/fault.c's open_clean): they are DIRTY on the
 * rewrite guess, and writing them then costs no fault. The run stops at the
 * first page that is not clean, and at OPEN_AHEAD_PAGES. A write of one of
 * the program's threads opens only its own page. Every byte reads back right.
 * In the faulting thread: a region a handler thread serves installs every
 * page writable (fm_region_installs_open), so none is clean. Over the wire
 * (stream) the pause worker opens only its page too: there a page opened and
 * not written would be a write-back.
 */
static void open_ahead(const char *addr, const char *transport)
{
	struct fm_pager *p = unit_pager_gc("open ahead", addr, "1M",
					   (const char *const[]){ "prefetch", "0", "fault", "signal", "transport",
								   transport, NULL },
					   pause_worker_is);
	unsigned run = strcmp(transport, "shm") ? 0 : 32, tail = strcmp(transport, "shm") ? 0 : 3;
	struct fm_resmap_hdr *h;
	uint8_t *a;
	uint64_t wp, ahead;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, 64 * PG, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	/* Read, so clean (write-protected zeros): pages 0-39 and 41-63; 40 stays untouched. */
	for (uint64_t i = 0; i < 64; i++)
		if (i != 40)
			CHECK(((volatile uint8_t *)a)[i * PG] == 0);
	CHECK(state_at(h, 1) == FM_PG_CLEAN && state_at(h, 40) == FM_PG_UNTOUCHED);

	wp = h->stats.wp_faults;
	ahead = h->stats.wp_opened_ahead;
	a[0] = 1; /* the program's write: its page alone */
	CHECK(h->stats.wp_faults == wp + 1 && h->stats.wp_opened_ahead == ahead);
	CHECK(state_at(h, 0) == FM_PG_DIRTY && state_at(h, 1) == FM_PG_CLEAN);

	atomic_store(&pause_worker, (long)syscall(SYS_gettid));
	a[2 * PG] = 2; /* on shm opens 3-34 with it */
	CHECK(h->stats.wp_faults == wp + 2 && h->stats.wp_opened_ahead == ahead + run);
	for (uint64_t i = 2; i <= 2 + run; i++)
		CHECK(state_at(h, i) == FM_PG_DIRTY && (i == 2 || (byte_at(h, i) & FM_PGF_REWRITE)));
	CHECK(state_at(h, 3 + run) == FM_PG_CLEAN);
	for (uint64_t i = 3; i <= 34; i++)
		a[i * PG + 7] = (uint8_t)i;
	CHECK(h->stats.wp_faults == wp + 2 + (run ? 0 : 32));
	wp = h->stats.wp_faults;
	a[36 * PG] = 36; /* on shm opens 37-39: 40 is not clean */
	CHECK(h->stats.wp_faults == wp + 1 && h->stats.wp_opened_ahead == ahead + run + tail);
	CHECK(state_at(h, 37) == (run ? FM_PG_DIRTY : FM_PG_CLEAN) && state_at(h, 41) == FM_PG_CLEAN);
	atomic_store(&pause_worker, 0);

	for (uint64_t i = 0; i < 64; i++) {
		uint8_t want0 = i == 0 ? 1 : i == 2 ? 2 : i == 36 ? 36 : 0;
		uint8_t want7 = i >= 3 && i <= 34 ? (uint8_t)i : 0;
		CHECK(a[i * PG] == want0 && a[i * PG + 7] == want7);
	}
	CHECK(fm_pager_unregister(p, a, 64 * PG) == 0);
	munmap(a, 64 * PG);
	fm_pager_stop(p);
}

/* Whether a full GC whose moves memd does is under way, as the agent's full_gc_in_memd says. */
static atomic_int full_gc;

static int full_gc_now(void)
{
	return atomic_load(&full_gc);
}

/*
 * What a pause worker reads from memd leaves first (FM_PGF_GC, no second
 * pass of the clock), but not in a full GC that memd moves for: its next
 * phase reads every live object's header again, so the page is kept a pass
 * like the program's (FM_PGF_REF). Under JDK 21 at 25% local the clock took
 * the marking's pages before phase 2 came back: it read 258k pages, 66k so.
 */
static void full_gc_reads_kept(const char *addr)
{
	struct fm_pager *p = unit_pager_gc_ex("full GC reads kept", addr, "1M",
					      (const char *const[]){ "prefetch", "0", "fault", "signal", NULL },
					      pause_worker_is, full_gc_now);
	struct fm_resmap_hdr *h;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	/* 512 pages written through a budget of 256: the first ones are in memd. */
	a = unit_region_written(p, 512 * PG, 7);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	CHECK(state_at(h, 10) == FM_PG_REMOTE && state_at(h, 20) == FM_PG_REMOTE && state_at(h, 30) == FM_PG_REMOTE);
	atomic_store(&pause_worker, (long)syscall(SYS_gettid));
	CHECK(page_ok(a, 10, 7)); /* a young pause's read */
	atomic_store(&full_gc, 1);
	CHECK(page_ok(a, 20, 7)); /* a full GC's */
	atomic_store(&full_gc, 0);
	atomic_store(&pause_worker, 0);
	CHECK(page_ok(a, 30, 7)); /* the program's */
	CHECK(fm_pg_is_resident(byte_at(h, 10)) && (byte_at(h, 10) & FM_PGF_GC) && !(byte_at(h, 10) & FM_PGF_REF));
	CHECK(fm_pg_is_resident(byte_at(h, 20)) && !(byte_at(h, 20) & FM_PGF_GC) && (byte_at(h, 20) & FM_PGF_REF));
	CHECK(fm_pg_is_resident(byte_at(h, 30)) && !(byte_at(h, 30) & FM_PGF_GC) && (byte_at(h, 30) & FM_PGF_REF));
	unit_region_end(p, a, 512 * PG, 0);
	fm_pager_stop(p);
}

/* The kind of collector thread the pause worker's tid stands for (is_gc_thread's answer). */
static atomic_int worker_kind;

static int worker_kind_is(pid_t tid)
{
	return tid == atomic_load(&pause_worker) ? atomic_load(&worker_kind) : 0;
}

/*
 * A collector's read of a page memd holds goes in writable (gc_writable: a
 * pause worker, or Shenandoah's concurrent workers, mostly write soon what
 * they read), but write-protected for G1's marking, refinement and service
 * threads (FM_GC_SCAN), which write no heap: booked DIRTY, each such page
 * went out through a capture and a compare with memd's copy. Their faults
 * count as concurrent ones.
 */
static void gc_reads_by_kind(const char *addr)
{
	static const int kinds[] = { FM_GC_PAUSE, FM_GC_CONC, FM_GC_SCAN, 0 };
	struct fm_pager *p = unit_pager_gc("GC reads by kind", addr, "1M",
					   (const char *const[]){ "prefetch", "0", "fault", "signal", "transport", "shm",
								   NULL },
					   worker_kind_is);
	struct fm_resmap_hdr *h;
	uint64_t wp, conc, bad = 0;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region_written(p, 1024 * PG, 9);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	/* Written in their last stay, pages go in writable for any reader: one stay read only, then out again. */
	for (unsigned k = 0; k < 4; k++)
		CHECK(page_ok(a, 10 + 10 * k, 9));
	for (uint64_t i = 0; i < 1024; i++)
		if (i % 10 || i > 40)
			write_page(a, i, 9);
	atomic_store(&pause_worker, (long)syscall(SYS_gettid));
	conc = h->stats.gc_conc_faults;
	for (unsigned k = 0; k < 4; k++) {
		uint64_t i = 10 + 10 * k;
		int opens = kinds[k] == FM_GC_PAUSE || kinds[k] == FM_GC_CONC;
		CHECK(state_at(h, i) == FM_PG_REMOTE && !(byte_at(h, i) & FM_PGF_REWRITE));
		atomic_store(&worker_kind, kinds[k]);
		CHECK(page_ok(a, i, 9));
		/* Looked at at once: what a collector read leaves first, and the next read needs room. */
		CHECK(state_at(h, i) == (opens ? FM_PG_DIRTY : FM_PG_CLEAN));
		CHECK(!(byte_at(h, i) & FM_PGF_REWRITE) == !opens);
		/* The page written next: a write-protect fault only where it went in protected. */
		wp = h->stats.wp_faults;
		a[i * PG + 1] = (uint8_t)k;
		CHECK(h->stats.wp_faults == wp + !opens && state_at(h, i) == FM_PG_DIRTY);
		CHECK(a[i * PG + 1] == k);
		write_page(a, i, 9);
	}
	atomic_store(&pause_worker, 0);
	CHECK(h->stats.gc_conc_faults == conc + 2);
	for (uint64_t i = 0; i < 1024; i++)
		bad += !page_ok(a, i, 9);
	unit_region_end(p, a, 1024 * PG, bad);
	fm_pager_stop(p);
}

/*
 * A page is let go as soon as the next move does not use it, sealed first:
 * a page a later move of the same call writes again is held, checked and
 * sealed again, and both moves' bytes are there. (Held to the end of the
 * call, a promotion's last page kept the worker that allocated next to it
 * waiting for the whole call.)
 */
static void let_go_between_moves(const char *addr)
{
	struct fm_pager *p = unit_pager("let go", addr, "1M",
					 (const char *const[]){ "transport", "shm", "prefetch", "0", NULL });
	struct fm_resmap_hdr *h;
	uint8_t *a;
	uint64_t sealed0;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, 8 * PG, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	for (unsigned k = 0; k < 192; k++)
		a[5 * PG + k] = (uint8_t)(k + 1);
	{
		/* Pages 1 and 2 untouched: made in memd's store. Page 1 is used by moves 0 and 2, not 1. */
		struct fm_byte_move m[3] = {
			{ .src = (uintptr_t)a + 5 * PG, .dst = (uintptr_t)a + PG, .len = 64 },
			{ .src = (uintptr_t)a + 5 * PG + 64, .dst = (uintptr_t)a + 2 * PG, .len = 64 },
			{ .src = (uintptr_t)a + 5 * PG + 128, .dst = (uintptr_t)a + PG + 2048, .len = 64 },
		};
		sealed0 = h->stats.compact_pages;
		CHECK(fm_pager_move_bytes(p, m, 3) == 3);
		CHECK(h->stats.compact_pages == sealed0 + 3); /* page 1 sealed after move 0, and again after move 2 */
		CHECK(state_at(h, 1) == FM_PG_REMOTE && state_at(h, 2) == FM_PG_REMOTE);
		CHECK(state_at(h, 5) == FM_PG_DIRTY);
	}
	for (unsigned k = 0; k < 64; k++) {
		CHECK(a[PG + k] == k + 1);
		CHECK(a[2 * PG + k] == k + 65);
		CHECK(a[PG + 2048 + k] == k + 129);
	}
	CHECK(a[PG + 64] == 0 && a[PG + 2047] == 0 && a[PG + 2112] == 0 && a[2 * PG + 64] == 0);
	CHECK(fm_pager_unregister(p, a, 8 * PG) == 0);
	munmap(a, 8 * PG);
	fm_pager_stop(p);
}

/*
 * memd refuses a page (full): the free space it keeps goes back, all of it,
 * at the next discard, also the ranges that fell off the pager's list; and
 * nothing is lost on the way.
 */
static void give_back(const char *addr)
{
	const size_t region = 16ul << 20, first = 6ul << 20;
	struct fm_pager *p = unit_pager("give back", addr, "1M", (const char *const[]){ "transport", "shm", NULL });
	struct fm_resmap_hdr *h;
	uint64_t bad = 0, released0;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, region, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	for (uint64_t i = 0; i < first / PG; i++)
		write_page(a, i, 3);
	/* Every other page alone: more ranges than the pager lists, so the oldest fall off, their memory kept. */
	for (uint64_t i = 0; i < first / PG; i += 2)
		CHECK(fm_pager_discard(p, a + i * PG, PG) == 1);
	CHECK(h->stats.discard_kept > 500 && h->stats.memd_full == 0 && h->stats.discard_released == 0);
	/* memd (8 MiB) fills: it refuses pages, which stay here over the budget. */
	for (uint64_t i = first / PG; i < region / PG; i++)
		write_page(a, i, 4);
	CHECK(h->stats.memd_full > 0);
	released0 = h->stats.discard_released;
	CHECK(fm_pager_discard(p, a + first, 1ul << 20) > 0);
	CHECK(h->stats.discard_kept == 0 && h->stats.discard_released > released0);
	for (uint64_t i = (first + (1ul << 20)) / PG; i < region / PG; i++)
		bad += !page_ok(a, i, 4);
	for (uint64_t i = 0; i < (first + (1ul << 20)) / PG; i++)
		bad += i < first / PG && i % 2 ? !page_ok(a, i, 3) : a[i * PG] != 0 || a[i * PG + PG - 1] != 0;
	CHECK(bad == 0);
	fprintf(stderr, "test_pager_compact (give back): %llu pages refused, %llu given back\n",
		(unsigned long long)h->stats.memd_full,
		(unsigned long long)(h->stats.discard_released - released0));
	CHECK(fm_pager_unregister(p, a, region) == 0);
	munmap(a, region);
	fm_pager_stop(p);
}

/*
 * A move stopped at its second destination page (memd full) after its first,
 * a page of free space memd kept, was opened to be overwritten whole: that
 * page was not cleared on opening, and still holds the bytes it had before the
 * discard. Not moved after all, it must read as the zeros a discard left.
 */
static void stopped_after_whole(const char *addr)
{
	const size_t region = 16ul << 20;
	const uint64_t P = 0, Q = 1, X0 = 8, X1 = 64, S = region / PG - 2;
	struct fm_pager *p = unit_pager("stopped after whole", addr, "1M",
					 (const char *const[]){ "transport", "shm", "prefetch", "0", NULL });
	struct fm_resmap_hdr *h;
	uint64_t x, filled, bad = 0;
	uint8_t *a;

	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, region, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	/* P in memd; then memd (8 MiB) fills and refuses pages. [X0, X1) and Q stay untouched. */
	write_page(a, P, 5);
	for (filled = X1; filled < S && !h->stats.memd_full; filled++)
		write_page(a, filled, 6);
	CHECK(h->stats.memd_full > 0 && state_at(h, P) == FM_PG_REMOTE);
	write_page(a, S, 7);
	write_page(a, S + 1, 7);
	CHECK(state_at(h, S) == FM_PG_DIRTY && state_at(h, S + 1) == FM_PG_DIRTY);
	/*
	 * The refusals asked for the free space memd keeps: a discard gives it
	 * back, this one, so that P's below keeps its slot's bytes.
	 */
	CHECK(state_at(h, X1) == FM_PG_REMOTE && fm_pager_discard(p, a + X1 * PG, PG) == 1);
	/* Use up what memd gave and the pager has not spent: one-page moves into new pages until refused. */
	for (x = X0; x < X1; x++) {
		struct fm_byte_move m = { .src = (uintptr_t)a + S * PG, .dst = (uintptr_t)a + x * PG, .len = PG };
		if (fm_pager_move_bytes(p, &m, 1) == 0)
			break;
	}
	CHECK(x < X1 && state_at(h, x) == FM_PG_UNTOUCHED);
	/* P's copy dies; its slot keeps its bytes, and its page of quota is the only one there is. */
	CHECK(fm_pager_discard(p, a + P * PG, PG) == 1 && state_at(h, P) == FM_PG_UNTOUCHED);
	{
		struct fm_byte_move m = { .src = (uintptr_t)a + S * PG, .dst = (uintptr_t)a + P * PG, .len = 2 * PG };
		CHECK(fm_pager_move_bytes(p, &m, 1) == 0);
	}
	CHECK(state_at(h, Q) == FM_PG_UNTOUCHED);
	CHECK(page_ok(a, P, 0) && page_ok(a, Q, 0) && page_ok(a, S, 7) && page_ok(a, S + 1, 7));
	for (uint64_t i = X0; i < x; i++)
		bad += memcmp(a + i * PG, a + S * PG, PG) != 0;
	for (uint64_t i = X1 + 1; i < S; i++)
		bad += !page_ok(a, i, i < filled ? 6 : 0);
	unit_region_end(p, a, region, bad);
	fm_pager_stop(p);
}

/* Several memds (replicated): no EDIT through them, nothing is done, and it says so. */
static void no_edit(const char *sock, const char *sock2)
{
	struct fm_pager *p;
	char addr[200];
	uint8_t *a;

	snprintf(addr, sizeof(addr), "unix:%s,unix:%s", sock, sock2);
	p = unit_pager("two memds", addr, "1M", NULL);
	if (!p)
		return;
	a = unit_region(p, 4 * PG, FM_REG_HEAP);
	if (!a) {
		fm_pager_stop(p);
		return;
	}
	a[2 * PG] = 7;
	{
		struct fm_byte_move m = { .src = (uintptr_t)a + 2 * PG, .dst = (uintptr_t)a, .len = 64 };
		uint64_t w;
		/* Both pages resident: done here. One of them not resident: refused, and from then on at once. */
		a[0] = 1;
		CHECK(fm_pager_move_bytes(p, &m, 1) == 1 && a[0] == 7);
		m.dst = (uintptr_t)a + 3 * PG; /* untouched: memd's to make */
		CHECK(fm_pager_move_bytes(p, &m, 1) == -EOPNOTSUPP);
		CHECK(fm_pager_move_bytes(p, &m, 1) == -EOPNOTSUPP);
		CHECK(fm_pager_read_words(p, a + 3 * PG, &w, 8) == -EOPNOTSUPP);
		CHECK(a[3 * PG] == 0 && a[2 * PG] == 7);
	}
	CHECK(fm_pager_unregister(p, a, 4 * PG) == 0);
	munmap(a, 4 * PG);
	fm_pager_stop(p);
}

/* fn on a memd of its own that holds 8 MiB, at sock, stopped after. */
static void on_small_memd(const char *sock, void (*fn)(const char *addr))
{
	char addr[80];
	pid_t memd = unit_start_memd(sock, "8M");
	int st;

	if (memd <= 0) {
		failures++;
		return;
	}
	snprintf(addr, sizeof(addr), "unix:%s", sock);
	fn(addr);
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
}

int main(void)
{
	char sock[64], sock2[64], unix_addr[80], tcp[64];
	pid_t memd, memd2;
	int st;

	signal(SIGALRM, unit_timed_out);
	unit_name = "test_pager_compact";
	alarm(600);
	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-compact-%d.sock", getpid());
	snprintf(unix_addr, sizeof(unix_addr), "unix:%s", sock);
	memd = unit_start_memd_ex(sock, "256M", tcp, sizeof(tcp));
	if (memd < 0)
		return 1;
	scenario(unix_addr, "shm", "signal");
	scenario(unix_addr, "shm", "thread");
	/* Over the wire: memd's EDIT, on a Unix socket and over TCP. */
	scenario(unix_addr, "stream", "signal");
	scenario(tcp, "stream", "thread");
	small(unix_addr, "shm");
	small(tcp, "stream");
	open_ahead(unix_addr, "shm");
	open_ahead(tcp, "stream");
	let_go_between_moves(unix_addr);
	full_gc_reads_kept(unix_addr);
	gc_reads_by_kind(unix_addr);
	snprintf(sock2, sizeof(sock2), "/tmp/farmem-unit-compact2-%d.sock", getpid());
	memd2 = unit_start_memd(sock2, "64M");
	if (memd2 > 0) {
		no_edit(sock, sock2);
		kill(memd2, SIGTERM);
		waitpid(memd2, &st, 0);
	} else {
		failures++;
	}
	on_small_memd(sock2, give_back);
	on_small_memd(sock2, stopped_after_whole);
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	unit_memd_files_remove(sock);
	if (failures) {
		fprintf(stderr, "test_pager_compact: %d checks failed\n", failures);
		return 1;
	}
	printf("test_pager_compact: ok\n");
	return 0;
}
