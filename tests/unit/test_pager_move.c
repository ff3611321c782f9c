// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_move (uffd/move.c) against a real memd, with ASan and UBSan: a
 * source range whose pages are resident (clean and dirty), remote (evicted
 * to memd: they move inside memd and stay remote) and untouched (never written) moves onto a destination whose old pages are
 * resident, remote and untouched. Checked byte for byte at the destination,
 * zeros at the source, the pager's counters (pages moved without a copy,
 * fetched, untouched), and that nothing is lost afterwards when everything
 * is pushed out to memd and read back. Remote pages move inside memd (COPY
 * over a Unix socket and over TCP, in the shared store with shm): the pager
 * reads none of their bytes; with memd_copy=0 it reads and writes each one;
 * over two memds, COPY goes to each server holding a source page, also when
 * one of them was killed just before the move. Run from the repository root.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager.h"
#include "resmap.h"
#include "transport.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (16ul << 20)
#define NPAGES (REGION / PG)
#define SRC 1000ul  /* first source page */
#define DST 3000ul  /* first destination page */
#define N 600ul     /* pages moved */
#define FULL_CAPACITY "2M" /* memd is full once the source's early pages and some others are out */
#define SPARE 3650ul /* pages [SPARE, NPAGES) are written to push others out */


static uint64_t word(uint64_t tag, unsigned k)
{
	uint64_t x = (tag << 20) ^ k ^ 0x5bd1e995ull;
	x ^= x >> 31;
	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

static void fill(uint8_t *pg, uint64_t tag)
{
	uint64_t *w = (uint64_t *)pg;
	for (unsigned k = 0; k < PG / 8; k++)
		w[k] = word(tag, k);
}

/* tag 0 means zeros. */
static int same(const uint8_t *pg, uint64_t tag)
{
	const uint64_t *w = (const uint64_t *)pg;
	for (unsigned k = 0; k < PG / 8; k++)
		if (w[k] != (tag ? word(tag, k) : 0))
			return 0;
	return 1;
}

static unsigned state_of(struct fm_resmap_hdr *h, const uint8_t *a, uint64_t page)
{
	const uint8_t *map = (const uint8_t *)h + h->regions[0].map_offset;
	(void)a;
	return map[page] & FM_PG_STATE_MASK;
}

/* Evict until page `page` is remote (the clock hand passes twice). */
static void push_out(struct fm_pager *p, struct fm_resmap_hdr *h, uint8_t *a, uint64_t from, uint64_t n)
{
	/* Touch a lot of other memory: the evictor keeps us at 1 MiB resident. */
	for (int round = 0; round < 40; round++) {
		int all = 1;
		for (uint64_t i = from; i < from + n; i++)
			all &= state_of(h, a, i) == FM_PG_REMOTE;
		if (all)
			return;
		for (uint64_t i = SPARE; i < NPAGES; i++)
			a[i * PG + (unsigned)round % PG] = (uint8_t)round;
	}
	(void)p;
}

/*
 * Two more regions, one mapping split in two, the higher one registered
 * last: a move inside the higher one, and one into it from the first
 * region, use its own books (once the books of any region registered before
 * it with a base below were taken). src_tag is the first region's page SRC.
 */
static void more_regions(struct fm_pager *p, uint8_t *a, uint64_t src_tag)
{
	uint8_t *lo = mmap(NULL, 128 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *c;

	CHECK(lo != MAP_FAILED);
	if (lo == MAP_FAILED)
		return;
	c = lo + 64 * PG;
	CHECK(fm_pager_register(p, lo, 64 * PG, 0) == 0);
	CHECK(fm_pager_register(p, c, 64 * PG, 0) == 0);
	fill(c, 424242);
	CHECK(fm_pager_move(p, c + 8 * PG, c, PG) == 0);
	CHECK(same(c + 8 * PG, 424242) && same(c, 0));
	CHECK(fm_pager_move(p, c + 16 * PG, a + SRC * PG, PG) == 0);
	CHECK(same(c + 16 * PG, src_tag) && same(a + SRC * PG, 0));
	CHECK(fm_pager_move(p, c + 56 * PG, c + 16 * PG, 8 * PG) == 0);  /* ends at the region's end */
	CHECK(same(c + 56 * PG, src_tag) && same(c + 16 * PG, 0));
	CHECK(fm_pager_move(p, c + 55 * PG, c + 16 * PG, 9 * PG) == 0);
	CHECK(fm_pager_move(p, c + 56 * PG, c + 16 * PG, 9 * PG) == -ENOENT);  /* one page past it */
	CHECK(fm_pager_move(p, lo + 56 * PG, lo, 9 * PG) == -ENOENT);         /* into the next region */
	CHECK(fm_pager_unregister(p, lo, 128 * PG) == 0);
	munmap(lo, 128 * PG);
}

/*
 * full: memd has room for the source's remote pages and little more, so they
 * come local. copy: the memd_copy knob (remote pages copied by memd, or read
 * and written back by the pager).
 */
static void exercise(const char *addr, const char *label, const char *transport, int copy, int full,
		     const char *replicas, pid_t lose)
{
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	uint64_t tag[N];
	uint8_t *a;
	unsigned nres = 0, nrem = 0, nunt = 0;
	uint64_t bad = 0;

	p = unit_pager(label, addr, "1M",
		       (const char *const[]){ "memd_copy", copy ? "1" : "0", "transport", transport, "prefetch", "0",
					      replicas ? "replicas" : NULL, replicas, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, FM_REG_HEAP);
	if (!a)
		goto out;

	/* Bad input first: nothing may change. */
	CHECK(fm_pager_move(p, a + DST * PG + 8, a + SRC * PG, PG) == -EINVAL);
	CHECK(fm_pager_move(p, a + DST * PG, a + SRC * PG, 0) == -EINVAL);
	CHECK(fm_pager_move(p, a + SRC * PG + PG, a + SRC * PG, 2 * PG) == -EINVAL);
	CHECK(fm_pager_move(p, a + REGION, a + SRC * PG, PG) == -ENOENT);
	CHECK(fm_pager_move(p, a + (NPAGES - 1) * PG, a + SRC * PG, 2 * PG) == -ENOENT);

	/*
	 * Source: pages [0, 200) written early (pushed out: remote), [200, 250)
	 * never touched, [250, 600) written last (resident, dirty; every third
	 * one pushed out and read back: resident, clean). Destination: old
	 * contents of every kind (garbage the move must drop).
	 */
	for (uint64_t i = 0; i < 200; i++) {
		tag[i] = 1000 + i;
		fill(a + (SRC + i) * PG, tag[i]);
	}
	for (uint64_t i = 0; i < N && !full; i += 2)
		fill(a + (DST + i) * PG, 99999 + i); /* when full, no old remote copies at dst to free room */
	push_out(p, h, a, SRC, 200);
	for (uint64_t i = 200; i < 250; i++)
		tag[i] = 0;
	for (uint64_t i = 250; i < N; i++) {
		tag[i] = 5000 + i;
		fill(a + (SRC + i) * PG, tag[i]);
	}
	/* More than the budget was just written: reading some back makes clean resident pages. */
	for (uint64_t i = 250; i < N; i += 3)
		bad += !same(a + (SRC + i) * PG, tag[i]);
	CHECK(bad == 0);
	for (uint64_t i = 0; i < N; i++) {
		unsigned s = state_of(h, a, SRC + i);
		nrem += s == FM_PG_REMOTE;
		nunt += s == FM_PG_UNTOUCHED;
		nres += s == FM_PG_CLEAN || s == FM_PG_DIRTY;
	}
	fprintf(stderr, "test_pager_move (%s): source pages resident %u, remote %u, untouched %u\n",
		label, nres, nrem, nunt);
	CHECK(nrem > 0 && nunt >= 50 && nres > 0);
	if (lose > 0) {
		/* One of two memds holding every page dies before the move: COPY goes on with the other. */
		int st;
		kill(lose, SIGKILL);
		waitpid(lose, &st, 0);
	}

	uint64_t moved0 = h->stats.swapva_pages_moved, fetched0 = h->stats.swapva_pages_fetched;
	uint64_t untouched0 = h->stats.swapva_pages_untouched, calls0 = h->stats.swapva_calls;
	uint64_t remote0 = h->stats.swapva_pages_remote, res0 = h->stats.resident_pages;
	uint64_t reads0 = h->stats.remote_reads, incopy0 = h->stats.swapva_remote_copied;
	uint64_t ccalls0 = h->stats.swapva_copy_calls;
	CHECK(fm_pager_move(p, a + DST * PG, a + SRC * PG, N * PG) == 0);
	CHECK(h->stats.swapva_calls == calls0 + 1);
	fprintf(stderr, "test_pager_move (%s): moved %llu, remote %llu, fetched %llu, untouched %llu, copied %llu, "
		"copied in memd %llu, remote reads %llu\n",
		label, (unsigned long long)(h->stats.swapva_pages_moved - moved0),
		(unsigned long long)(h->stats.swapva_pages_remote - remote0),
		(unsigned long long)(h->stats.swapva_pages_fetched - fetched0),
		(unsigned long long)(h->stats.swapva_pages_untouched - untouched0),
		(unsigned long long)h->stats.swapva_pages_copied,
		(unsigned long long)(h->stats.swapva_remote_copied - incopy0),
		(unsigned long long)(h->stats.remote_reads - reads0));
	/* The evictor runs on meanwhile: resident and remote counts may trade places, not the sum. */
	CHECK(h->stats.swapva_pages_moved - moved0 + h->stats.swapva_pages_copied +
	      h->stats.swapva_pages_fetched - fetched0 + h->stats.swapva_pages_remote - remote0 == N - nunt);
	/* Remote pages stay remote (memd has room): none came local, none took a fault. */
	CHECK(h->stats.swapva_pages_moved - moved0 > 0);
	if (!full) {
		CHECK(h->stats.swapva_pages_remote - remote0 > 0 && h->stats.swapva_pages_fetched == fetched0);
		CHECK(h->stats.resident_pages <= res0 + 8);
		if (copy) {
			/* memd copied every one slot to slot: not a byte of them came here. */
			CHECK(h->stats.remote_reads == reads0);
			CHECK(h->stats.swapva_remote_copied - incopy0 == h->stats.swapva_pages_remote - remote0);
			CHECK(h->stats.swapva_copy_calls - ccalls0 >= 1 &&
			      h->stats.swapva_copy_calls - ccalls0 <= (h->stats.swapva_pages_remote - remote0 + 255) / 256 + 2);
		} else {
			/* Read and written back through the pager, each one. */
			CHECK(h->stats.remote_reads - reads0 == h->stats.swapva_pages_remote - remote0);
			CHECK(h->stats.swapva_remote_copied == incopy0 && h->stats.swapva_copy_calls == ccalls0);
		}
		CHECK(h->stats.resident_pages <= h->stats.local_limit_pages + 8);
	} else {
		/* memd full: what it refused came local, dirty (over the budget), and nothing was lost (below) */
		CHECK(h->stats.swapva_pages_fetched - fetched0 > 0);
		CHECK(h->stats.remote_reads - reads0 >= h->stats.swapva_pages_fetched - fetched0);
	}
	CHECK(h->stats.swapva_pages_untouched - untouched0 == nunt);
	/* Every page the kernel could move moved without a copy. */
	CHECK(h->stats.swapva_pages_copied == 0);
	/* The source reads as never written; the destination has data exactly where the source had. */
	for (uint64_t i = 0; i < N; i++) {
		unsigned sd = state_of(h, a, DST + i), ss = state_of(h, a, SRC + i);
		bad += ss != FM_PG_UNTOUCHED;
		bad += tag[i] ? sd == FM_PG_UNTOUCHED : sd != FM_PG_UNTOUCHED;
	}
	CHECK(bad == 0);

	for (uint64_t i = 0; i < N; i++) {
		bad += !same(a + (DST + i) * PG, tag[i]);
		bad += !same(a + (SRC + i) * PG, 0);
	}
	CHECK(bad == 0);

	/* Nothing lost later: push the destination out to memd and read it back; write the source. */
	for (uint64_t i = 0; i < N; i++)
		fill(a + (SRC + i) * PG, 77777 + i);
	push_out(p, h, a, DST, 250);
	bad = 0;
	for (uint64_t i = 0; i < N; i++) {
		bad += !same(a + (DST + i) * PG, tag[i]);
		bad += !same(a + (SRC + i) * PG, 77777 + i);
	}
	CHECK(bad == 0);
	/* And back: the moved pages move again, this time from memd. */
	push_out(p, h, a, DST, 200);
	CHECK(fm_pager_move(p, a + SRC * PG, a + DST * PG, N * PG) == 0);
	bad = 0;
	for (uint64_t i = 0; i < N; i++) {
		bad += !same(a + (SRC + i) * PG, tag[i]);
		bad += !same(a + (DST + i) * PG, 0);
	}
	CHECK(bad == 0);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	more_regions(p, a, tag[0]);
	/* Several memds: every copy reached every holder of its source (R of them), unless one died. */
	if (lose > 0)
		CHECK(h->stats.memd_servers_lost == 1 && h->stats.memd_servers_live == 1);
	else
		CHECK(h->stats.memd_degraded_writes == 0 && h->stats.memd_failovers == 0);
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	munmap(a, REGION);
out:
	fm_pager_stop(p);
	printf("test_pager_move: %s%s done\n", label, full ? " (memd full)" : "");
}

int main(void)
{
	char sock[64], unix_addr[80], tcp[64];
	pid_t memd;
	int st;

	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-move-%d.sock", getpid());
	snprintf(unix_addr, sizeof(unix_addr), "unix:%s", sock);
	memd = unit_start_memd_ex(sock, "256M", tcp, sizeof(tcp));
	if (memd < 0)
		return 1;
	exercise(unix_addr, "shm", "shm", 1, 0, NULL, 0);
	exercise(unix_addr, "stream", "stream", 1, 0, NULL, 0);
	exercise(tcp, "stream tcp", "stream", 1, 0, NULL, 0);
	exercise(tcp, "stream tcp memd_copy=0", "stream", 0, 0, NULL, 0);
	/*
	 * Two memds (memd/client/multi.c): a page's copies are where its source's
	 * were, not where the hash would put a write (reads follow the record).
	 */
	{
		char sock2[80], tcp2[64], both[160];
		pid_t memd2;

		snprintf(sock2, sizeof(sock2), "%s.2", sock);
		memd2 = unit_start_memd_ex(sock2, "256M", tcp2, sizeof(tcp2));
		CHECK(memd2 > 0);
		if (memd2 > 0) {
			snprintf(both, sizeof(both), "%s,%s", tcp, tcp2);
			exercise(both, "two memds R=1", "stream", 1, 0, "1", 0);
			exercise(both, "two memds R=2", "stream", 1, 0, "2", 0);
			/* Last: it loses memd2 (SIGKILL) just before the move. */
			exercise(both, "two memds R=2 one lost", "stream", 1, 0, "2", memd2);
			unit_memd_files_remove(sock2);
		}
	}
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	memd = unit_start_memd_ex(sock, FULL_CAPACITY, tcp, sizeof(tcp));
	if (memd < 0)
		return 1;
	exercise(unix_addr, "shm", "shm", 1, 1, NULL, 0);
	exercise(tcp, "stream tcp", "stream", 1, 1, NULL, 0);
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	unit_memd_files_remove(sock);
	if (failures) {
		fprintf(stderr, "test_pager_move: %d checks failed\n", failures);
		return 1;
	}
	printf("test_pager_move: ok\n");
	return 0;
}
