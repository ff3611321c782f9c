// SPDX-License-Identifier: Apache-2.0
/*
 * Lane test for the rdma transport (runs in the guest; loops stay in here).
 *
 *   rdma_peer check rdma://ADDR:PORT
 *       a good client writes and verifies pages over RDMA; a hostile peer
 *       (authenticated, its own session) posts a READ with a wrong rkey, one
 *       with the good client's own rkey and address (another session's
 *       protection domain), then one out of its region's range: each must cost
 *       it its QP (-EIO) and nothing else; the good client then verifies and
 *       rewrites everything. Then a closed space: a READ with its old rkey
 *       fails (memd deregistered it at SPACE_CLOSE) and memd goes on serving
 *       the good client and a third one. COPY between two of the good
 *       client's spaces (memd copies; the copies read back over RDMA).
 *       Chunked registration: memd pins what was written, counted against
 *       its capacity, and refuses chunks past it; a chunk emptied by discards
 *       goes back (RDMA_UNREG), also while other threads write into it.
 *   rdma_peer bench rdma://ADDR:PORT tcp:ADDR:PORT [PAGES]
 *       per-page write (batches of 16) and read (batches of 1: a fault) times
 *       for both transports, and their ratio.
 *
 * FARMEM_SECRET holds memd's secret. Exit 0 when every check passed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rdma.h"
#include "transport.h"

#define PG 4096

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("rdma_peer: FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static void fill(uint8_t *b, uint64_t page, unsigned gen)
{
	uint64_t v = page * 0x9e3779b97f4a7c15ull + gen;
	for (unsigned i = 0; i < PG / 8; i++) {
		v ^= v << 13; v ^= v >> 7; v ^= v << 17;
		memcpy(b + i * 8, &v, 8);
	}
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct fm_xport *conn(const char *addr)
{
	const char *sec = getenv("FARMEM_SECRET");
	struct fm_xport_cfg cfg = { .addr = addr, .secret = sec, .secret_len = sec ? strlen(sec) : 0,
				    .timeout_ms = 20000 };
	struct fm_xport *x = NULL;
	char err[256] = "";
	int rc = fm_xport_connect(&cfg, &x, err, sizeof(err));

	if (rc) {
		printf("rdma_peer: connect %s: %s (%s)\n", addr, err, strerror(-rc));
		exit(3);
	}
	return x;
}

/* Write pages [0, n) with generation gen in batches of b; 0 or -errno. */
static int write_all(struct fm_chan *c, uint32_t sp, uint64_t n, unsigned gen, unsigned b, uint8_t *buf)
{
	for (uint64_t p = 0; p < n; p += b) {
		uint64_t pages[64];
		const void *data[64];
		uint32_t st[64];
		unsigned m = (unsigned)(n - p < b ? n - p : b);
		for (unsigned i = 0; i < m; i++) {
			pages[i] = p + i;
			fill(buf + i * PG, p + i, gen);
			data[i] = buf + i * PG;
		}
		int rc = fm_chan_write(c, sp, pages, m, data, st);
		if (rc)
			return rc;
		for (unsigned i = 0; i < m; i++)
			if (st[i] != FM_OK)
				return -ENOSPC;
	}
	return 0;
}

/* Read and verify pages [first, n) in batches of b; number of bad pages or -errno. */
static long verify_from(struct fm_chan *c, uint32_t sp, uint64_t first, uint64_t n, unsigned gen,
			unsigned b, uint8_t *buf)
{
	long bad = 0;
	for (uint64_t p = first; p < n; p += b) {
		uint64_t pages[64];
		const void *src[64];
		unsigned m = (unsigned)(n - p < b ? n - p : b);
		for (unsigned i = 0; i < m; i++)
			pages[i] = p + i;
		int rc = fm_chan_read(c, sp, pages, m, src);
		if (rc)
			return rc;
		for (unsigned i = 0; i < m; i++) {
			fill(buf, p + i, gen);
			if (memcmp(buf, src[i], PG))
				bad++;
		}
	}
	return bad;
}

static long verify_all(struct fm_chan *c, uint32_t sp, uint64_t n, unsigned gen, unsigned b, uint8_t *buf)
{
	return verify_from(c, sp, 0, n, gen, b, buf);
}

/* pages[0..n) (generation gen), each one's status in st[]; how many memd took, or -errno. */
static long write_pages(struct fm_chan *c, uint32_t sp, const uint64_t *pages, unsigned n, unsigned gen,
			uint8_t *buf, uint32_t *st, long *full)
{
	const void *data[16] = { 0 };
	long ok = 0;

	if (n > 16)
		return -E2BIG;
	int rc;

	for (unsigned i = 0; i < n; i++) {
		fill(buf + i * PG, pages[i], gen);
		data[i] = buf + i * PG;
	}
	rc = fm_chan_write(c, sp, pages, n, data, st);
	if (rc)
		return rc;
	for (unsigned i = 0; i < n; i++) {
		ok += st[i] == FM_OK;
		*full += st[i] == FM_E_FULL;
	}
	return ok;
}

static uint64_t used_pages(struct fm_xport *x)
{
	struct fm_stats st;

	return fm_xport_stats(x, &st) ? ~0ull : st.used_pages;
}

/*
 * Registration pins memory, so memd registers a space chunk by chunk when
 * the client first writes into it, each chunk counted against its capacity:
 * a 1 GiB space with two pages written holds two chunks (STATS used_pages),
 * and a page in every chunk of a 4 GiB space runs into memd's capacity
 * (512 MiB in the lane): refused as full, the pages taken read back, and
 * closing the space gives every chunk back.
 */
static void chunked(struct fm_xport *x, struct fm_chan *c, uint8_t *buf)
{
	uint64_t before = used_pages(x), pages[16], addr, cp = 0, per_chunk;
	uint32_t sp, rkey, st[16];
	long ok, full = 0, bad = 0;

	CHECK(fm_xport_space_open(x, 1ull << 18, &sp) == 0, "chunked: open 1 GiB");
	CHECK(used_pages(x) == before, "chunked: RDMA_MAP pinned %llu pages",
	      (unsigned long long)(used_pages(x) - before));
	pages[0] = 0;
	pages[1] = 200000;
	ok = write_pages(c, sp, pages, 2, 5, buf, st, &full);
	CHECK(ok == 2, "chunked: two pages written: %ld", ok);
	CHECK(fm_rdma_test_region(x, sp, &addr, &cp, &rkey) == 0 && cp >= 512 && cp < (1ull << 18),
	      "chunked: chunk of %llu pages", (unsigned long long)cp);
	per_chunk = cp + (cp * 8 + PG - 1) / PG;
	CHECK(used_pages(x) - before == 2 * per_chunk, "chunked: two chunks hold %llu pages, want %llu",
	      (unsigned long long)(used_pages(x) - before), (unsigned long long)(2 * per_chunk));
	for (unsigned i = 0; i < 2; i++)
		CHECK(verify_from(c, sp, pages[i], pages[i] + 1, 5, 1, buf) == 0, "chunked: page %llu reads back",
		      (unsigned long long)pages[i]);
	{
		uint64_t pg = 100000;
		const void *src[1];
		CHECK(fm_chan_read(c, sp, &pg, 1, src) == -ENOENT, "chunked: a page of a chunk never written");
	}
	/*
	 * RDMA_UNREG: a chunk whose every page was discarded goes back to memd;
	 * one with a page left stays. Written again, it is registered again
	 * (new rkeys) and reads back.
	 */
	{
		struct fm_range one = { .first = 200000, .npages = 1 };
		struct fm_range part = { .first = 1, .npages = 1 };
		uint64_t pg = 1;
		const void *src[1];

		CHECK(write_pages(c, sp, &pg, 1, 5, buf, st, &full) == 1, "chunked: a second page in chunk 0");
		CHECK(fm_chan_discard(c, sp, &part, 1) == 0, "chunked: discard page 1");
		CHECK(used_pages(x) - before == 2 * per_chunk, "chunked: chunk 0 with a page left stays: %llu",
		      (unsigned long long)(used_pages(x) - before));
		CHECK(fm_chan_discard(c, sp, &one, 1) == 0, "chunked: discard page 200000");
		CHECK(used_pages(x) - before == per_chunk, "chunked: an emptied chunk went back: %llu pages "
		      "held, want %llu", (unsigned long long)(used_pages(x) - before), (unsigned long long)per_chunk);
		pg = 200000;
		CHECK(fm_chan_read(c, sp, &pg, 1, src) == -ENOENT, "chunked: a page of a chunk given back");
		CHECK(verify_from(c, sp, 0, 1, 5, 1, buf) == 0, "chunked: page 0 reads back after the release");
		pages[0] = 200000;
		pages[1] = 200001;
		CHECK(write_pages(c, sp, pages, 2, 7, buf, st, &full) == 2, "chunked: the chunk written again");
		CHECK(used_pages(x) - before == 2 * per_chunk, "chunked: registered again: %llu",
		      (unsigned long long)(used_pages(x) - before));
		CHECK(verify_from(c, sp, 200000, 2, 7, 1, buf) == 0, "chunked: it reads back");
		one.npages = 2;
		CHECK(fm_chan_discard(c, sp, &one, 1) == 0 && used_pages(x) - before == per_chunk,
		      "chunked: given back again");
		printf("rdma_peer: a chunk emptied by discards went back to memd and came again\n");
	}
	CHECK(fm_xport_space_close(x, sp) == 0, "chunked: close");
	CHECK(used_pages(x) == before, "chunked: close gave back all but %lld pages",
	      (long long)(used_pages(x) - before));

	/* 4 GiB: more chunks than memd's capacity holds. */
	CHECK(fm_xport_space_open(x, 1ull << 20, &sp) == 0, "chunked: open 4 GiB");
	pages[0] = 0;
	CHECK(write_pages(c, sp, pages, 1, 6, buf, st, &full) == 1, "chunked: first page of 4 GiB");
	CHECK(fm_rdma_test_region(x, sp, &addr, &cp, &rkey) == 0, "chunked: 4 GiB region");
	ok = 1;
	for (uint64_t ch = 1; cp && ch * cp < (1ull << 20); ch += 16) {
		unsigned m = 0;
		long r;

		for (; m < 16 && (ch + m) * cp < (1ull << 20); m++)
			pages[m] = (ch + m) * cp + m;
		r = write_pages(c, sp, pages, m, 6, buf, st, &full);
		if (r < 0) {
			CHECK(0, "chunked: write: %s", strerror((int)-r));
			break;
		}
		ok += r;
		/* Every page taken reads back; a refused one is absent. */
		for (unsigned i = 0; i < m; i++) {
			const void *src[1];
			int rr = fm_chan_read(c, sp, &pages[i], 1, src);

			fill(buf, pages[i], 6);
			if (st[i] == FM_OK ? rr || memcmp(buf, src[0], PG) : rr != -ENOENT)
				bad++;
		}
	}
	printf("rdma_peer: 4 GiB space, a page per %llu-page chunk: %ld taken, %ld refused as full, "
	       "memd used %llu pages\n", (unsigned long long)cp, ok, full, (unsigned long long)used_pages(x));
	CHECK(ok > 1 && full > 0, "chunked: memd's capacity took %ld chunks and refused %ld", ok, full);
	CHECK(bad == 0, "chunked: %ld pages wrong", bad);
	CHECK(used_pages(x) <= (512ull << 20) / PG, "chunked: memd uses %llu pages, over its capacity",
	      (unsigned long long)used_pages(x));
	CHECK(fm_xport_space_close(x, sp) == 0, "chunked: close 4 GiB");
	CHECK(used_pages(x) == before, "chunked: close gave back all but %lld pages",
	      (long long)(used_pages(x) - before));
	printf("rdma_peer: chunked registration: memd pins what was written, within its capacity\n");
}

/*
 * Chunks released while others write into them: each thread, on its own
 * channel, writes its own page of the same two chunks, reads it back and
 * discards it, so that the chunks empty (and go back to memd) again and
 * again while the other thread's work requests are about to use, or use,
 * their rkeys. A release under a work request in flight would fail it and
 * take its QP (-EIO); a page refused as full (a release it waited for too
 * long) is counted, not an error.
 */
#define RACE_THREADS 3
#define RACE_ROUNDS 150

static int racers_left;

struct racer {
	struct fm_xport *x;
	uint32_t sp;
	unsigned idx;
	long bad, full, done;
	uint8_t buf[PG];
};

static void *racer_main(void *arg)
{
	struct racer *t = arg;
	struct fm_chan *c = NULL;

	if (fm_chan_open(t->x, &c)) {
		t->bad = -1;
		return NULL;
	}
	for (unsigned r = 0; r < RACE_ROUNDS; r++) {
		/* Chunk 0 and chunk 1 (of 512 pages or more), a page each thread. */
		uint64_t pg = (r & 1) * 512 + t->idx;
		struct fm_range rg = { .first = pg, .npages = 1 };
		const void *src[1];
		uint32_t st;
		int rc;

		rc = (int)write_pages(c, t->sp, &pg, 1, r + 10, t->buf, &st, &t->full);
		if (rc < 0) {
			printf("rdma_peer: racer %u: write: %s\n", t->idx, strerror(-rc));
			t->bad++;
			break;
		}
		if (rc == 1) {
			rc = fm_chan_read(c, t->sp, &pg, 1, src);
			fill(t->buf, pg, r + 10);
			if (rc || memcmp(t->buf, src[0], PG)) {
				printf("rdma_peer: racer %u: page %llu read back: %s\n", t->idx,
				       (unsigned long long)pg, rc ? strerror(-rc) : "wrong bytes");
				t->bad++;
			}
		}
		rc = fm_chan_discard(c, t->sp, &rg, 1);
		if (rc) {
			printf("rdma_peer: racer %u: discard: %s\n", t->idx, strerror(-rc));
			t->bad++;
			break;
		}
		t->done++;
	}
	fm_chan_close(c);
	__atomic_add_fetch(&racers_left, -1, __ATOMIC_RELEASE);
	return NULL;
}

static void release_race(struct fm_xport *x)
{
	static struct racer t[RACE_THREADS];
	pthread_t th[RACE_THREADS];
	uint64_t before = used_pages(x);
	long bad = 0, full = 0, done = 0, moves = 0;
	uint64_t last = before, u;
	uint32_t sp;

	CHECK(fm_xport_space_open(x, 4096, &sp) == 0, "release race: open");
	racers_left = RACE_THREADS;
	for (unsigned i = 0; i < RACE_THREADS; i++) {
		t[i] = (struct racer){ .x = x, .sp = sp, .idx = i };
		CHECK(pthread_create(&th[i], NULL, racer_main, &t[i]) == 0, "release race: thread");
	}
	/* memd's holdings sampled meanwhile: they go down (a release) and up (a registration) during the race. */
	while (__atomic_load_n(&racers_left, __ATOMIC_ACQUIRE) > 0) {
		struct timespec ts = { 0, 2 * 1000 * 1000 };

		u = used_pages(x);
		moves += u < last;
		last = u;
		nanosleep(&ts, NULL);
	}
	for (unsigned i = 0; i < RACE_THREADS; i++) {
		pthread_join(th[i], NULL);
		bad += t[i].bad;
		full += t[i].full;
		done += t[i].done;
	}
	printf("rdma_peer: release race: %d threads, %ld rounds, %ld pages refused as full, %ld releases seen "
	       "during it, memd holds %llu pages more than before\n", RACE_THREADS, done, full, moves,
	       (unsigned long long)(used_pages(x) - before));
	CHECK(moves >= 2, "release race: memd's holdings went down %ld times while it ran", moves);
	CHECK(bad == 0 && done == RACE_THREADS * RACE_ROUNDS, "release race: %ld failures, %ld rounds", bad, done);
	CHECK(full < done / 10, "release race: %ld of %ld writes refused", full, done);
	/* Every page discarded: every chunk went back (the last discard of each released it). */
	CHECK(used_pages(x) == before, "release race: %lld pages still held",
	      (long long)(used_pages(x) - before));
	CHECK(fm_xport_space_close(x, sp) == 0, "release race: close");
}

static int check(const char *addr)
{
	static uint8_t buf[64 * PG];
	const uint64_t n = 2048; /* 8 MiB */
	struct fm_xport *good = conn(addr), *evil = conn(addr);
	struct fm_chan *gc = NULL, *gc2 = NULL, *ec = NULL, *ec2 = NULL;
	uint32_t gsp, esp, rkey, grkey;
	uint64_t daddr, gdaddr, np;
	long r;

	CHECK(fm_xport_kind(good) == 3, "transport kind %d, want rdma", fm_xport_kind(good));
	CHECK(fm_xport_space_open(good, n, &gsp) == 0, "good space_open");
	CHECK(fm_chan_open(good, &gc) == 0, "good chan_open");
	if (fails)
		return 1;
	printf("rdma_peer: connected, space %u open, QP up\n", gsp);
	CHECK(write_all(gc, gsp, n, 1, 32, buf) == 0, "good write");
	printf("rdma_peer: wrote %llu pages\n", (unsigned long long)n);
	r = verify_all(gc, gsp, n, 1, 32, buf);
	CHECK(r == 0, "good verify: %ld", r);
	{
		uint64_t pg = n + 5;
		const void *src[1];
		CHECK(fm_chan_read(gc, gsp, &pg, 1, src) == -ERANGE, "bounds check");
	}

	/*
	 * COPY (a collector's page moves): memd copies pages from one registered
	 * space to another itself, asked over the control connection; the copies
	 * read back over RDMA with their bytes and checksums. A page out of range
	 * and an absent source say so and change nothing.
	 */
	{
		uint64_t sp[66], dp[66];
		uint32_t st[66], csp;
		struct fm_range rg = { .first = 0, .npages = 1 };

		CHECK(fm_xport_space_open(good, 128, &csp) == 0, "copy: space_open");
		for (unsigned i = 0; i < 64; i++)
			sp[i] = dp[i] = i;
		sp[64] = n + 1;   /* out of range */
		dp[64] = 64;
		sp[65] = 100;     /* csp's page 100 was never written */
		dp[65] = 65;
		CHECK(fm_chan_copy(gc, gsp, sp, csp, dp, 64, st) == 0, "copy 64 pages");
		for (unsigned i = 0; i < 64; i++)
			CHECK(st[i] == FM_OK, "copy status %u: %u", i, st[i]);
		r = verify_all(gc, csp, 64, 1, 32, buf);
		CHECK(r == 0, "copied pages read back over RDMA: %ld", r);
		CHECK(fm_chan_copy(gc, gsp, sp + 64, csp, dp + 64, 1, st) == 0 && st[0] == FM_E_RANGE,
		      "copy out of range: %u", st[0]);
		CHECK(fm_chan_copy(gc, csp, sp + 65, csp, dp + 65, 1, st) == 0 && st[0] == FM_E_ABSENT,
		      "copy of an absent page: %u", st[0]);
		{
			uint64_t pg = 64;
			const void *src[1];
			CHECK(fm_chan_read(gc, csp, &pg, 1, src) == -ENOENT, "a refused copy wrote nothing");
		}
		/* A discarded source is absent again. */
		CHECK(fm_chan_discard(gc, csp, &rg, 1) == 0, "copy: discard");
		CHECK(fm_chan_copy(gc, csp, sp, csp, dp + 66 - 1, 1, st) == 0 && st[0] == FM_E_ABSENT,
		      "copy of a discarded page: %u", st[0]);
		CHECK(fm_xport_space_close(good, csp) == 0, "copy: space_close");
		printf("rdma_peer: COPY of 64 pages between registered spaces verified over RDMA\n");
	}

	chunked(good, gc, buf);
	release_race(good);

	/* The hostile peer: authenticated, its own session and space. */
	CHECK(fm_xport_space_open(evil, 16, &esp) == 0, "evil space_open");
	CHECK(fm_chan_open(evil, &ec) == 0, "evil chan_open");
	CHECK(fm_rdma_test_region(evil, esp, &daddr, &np, &rkey) == 0, "evil region");
	CHECK(fm_rdma_test_region(good, gsp, &gdaddr, &np, &grkey) == 0, "good region");
	/* a wrong rkey, aimed at the good client's pages */
	r = fm_rdma_test_raw_read(ec, gdaddr, rkey ^ 0x5a5a00u, PG);
	CHECK(r == -EIO, "wrong rkey: got %ld, want -EIO", r);
	printf("rdma_peer: wrong rkey -> %s (QP lost)\n", strerror((int)-r));
	/* the good client still works, on its existing QP */
	r = verify_all(gc, gsp, n, 1, 32, buf);
	CHECK(r == 0, "good verify after wrong rkey: %ld", r);
	/*
	 * The good client's real rkey and address, leaked to another session:
	 * useless there, since each session's QPs and regions have their own
	 * protection domain (with one domain for all, this read succeeds).
	 */
	{
		struct fm_chan *ec3 = NULL;
		CHECK(fm_chan_open(evil, &ec3) == 0, "evil chan_open 3");
		if (ec3) {
			r = fm_rdma_test_raw_read(ec3, gdaddr, grkey, PG);
			CHECK(r == -EIO, "another session's rkey and address: got %ld, want -EIO", r);
			printf("rdma_peer: the good client's rkey from another session -> %s\n",
			       r ? "refused (QP lost)" : "READ SUCCEEDED");
			fm_chan_close(ec3);
		}
	}
	r = verify_all(gc, gsp, n, 1, 32, buf);
	CHECK(r == 0, "good verify after a foreign rkey: %ld", r);
	/* out of range with a valid rkey of its own: past its 16-page region */
	CHECK(fm_chan_open(evil, &ec2) == 0, "evil chan_open 2");
	if (ec2) {
		r = fm_rdma_test_raw_read(ec2, daddr + (64ull << 20), rkey, PG);
		CHECK(r == -EIO, "out of range: got %ld, want -EIO", r);
		printf("rdma_peer: out-of-range read -> %s (QP lost)\n", strerror((int)-r));
		/* the dead QP stays dead */
		r = fm_rdma_test_raw_read(ec2, daddr, rkey, PG);
		CHECK(r != 0, "a dead QP still works");
	}
	fm_chan_close(ec);
	fm_chan_close(ec2);
	fm_xport_close(evil);

	/* good client: old QP, new QP, rewrite */
	r = verify_all(gc, gsp, n, 1, 32, buf);
	CHECK(r == 0, "good verify after hostile peer: %ld", r);
	CHECK(fm_chan_open(good, &gc2) == 0, "good second chan");
	if (gc2) {
		CHECK(write_all(gc2, gsp, n, 2, 16, buf) == 0, "good rewrite");
		r = verify_all(gc, gsp, n, 2, 1, buf);
		CHECK(r == 0, "good verify gen 2 on the other QP: %ld", r);
		struct fm_range rg = { .first = 0, .npages = 8 };
		CHECK(fm_chan_discard(gc2, gsp, &rg, 1) == 0, "discard");
		uint64_t pg = 3;
		const void *src[1];
		CHECK(fm_chan_read(gc, gsp, &pg, 1, src) == -ENOENT, "discarded page reads as absent");
	}
	fm_chan_close(gc2);

	/*
	 * SPACE_CLOSE deregisters (unpins) the region: the old rkey is dead,
	 * and the QP that still uses it is lost, nothing else.
	 */
	{
		struct fm_chan *gc3 = NULL;
		uint32_t csp, crkey;
		uint64_t cdaddr, cnp;
		CHECK(fm_xport_space_open(good, 64, &csp) == 0, "good space_open 2");
		CHECK(fm_chan_open(good, &gc3) == 0, "good chan_open 3");
		if (gc3) {
			CHECK(write_all(gc3, csp, 64, 3, 16, buf) == 0, "write to space 2");
			CHECK(fm_rdma_test_region(good, csp, &cdaddr, &cnp, &crkey) == 0, "space 2 region");
			r = fm_rdma_test_raw_read(gc3, cdaddr, crkey, PG);
			CHECK(r == 0, "raw read of an open space: %ld", r);
			CHECK(fm_xport_space_close(good, csp) == 0, "space_close 2");
			r = fm_rdma_test_raw_read(gc3, cdaddr, crkey, PG);
			CHECK(r == -EIO, "old rkey after SPACE_CLOSE: got %ld, want -EIO", r);
			printf("rdma_peer: old rkey after SPACE_CLOSE -> %s\n",
			       r ? "refused (QP lost)" : "READ SUCCEEDED");
			fm_chan_close(gc3);
		}
	}
	/* memd serves on: the good client's first QP, and a third client */
	r = verify_from(gc, gsp, 8, n, 2, 32, buf);
	CHECK(r == 0, "the good client's first space after the closed one: %ld", r);
	{
		struct fm_xport *third = conn(addr);
		struct fm_chan *tc = NULL;
		uint32_t tsp;
		CHECK(fm_xport_space_open(third, 256, &tsp) == 0, "third space_open");
		CHECK(fm_chan_open(third, &tc) == 0, "third chan_open");
		if (tc) {
			CHECK(write_all(tc, tsp, 256, 4, 16, buf) == 0, "third write");
			r = verify_all(tc, tsp, 256, 4, 8, buf);
			CHECK(r == 0, "third verify: %ld", r);
			fm_chan_close(tc);
		}
		fm_xport_space_close(third, tsp);
		fm_xport_close(third);
		printf("rdma_peer: memd serves a third client after all of the above\n");
	}
	fm_chan_close(gc);
	fm_xport_space_close(good, gsp);
	fm_xport_close(good);
	printf("rdma_peer: check %s\n", fails ? "FAILED" : "ok");
	return fails ? 1 : 0;
}

static int bench1(const char *addr, uint64_t n, double *w_us, double *r_us)
{
	static uint8_t buf[64 * PG];
	struct fm_xport *x = conn(addr);
	struct fm_chan *c = NULL;
	uint32_t sp;
	double t;
	long r;

	if (fm_xport_space_open(x, n, &sp) || fm_chan_open(x, &c))
		return 1;
	write_all(c, sp, n, 7, 16, buf); /* warm: grants, first touch */
	t = now();
	if (write_all(c, sp, n, 9, 16, buf))
		return 1;
	*w_us = (now() - t) * 1e6 / n;
	t = now();
	r = verify_all(c, sp, n, 9, 1, buf);
	*r_us = (now() - t) * 1e6 / n;
	fm_chan_close(c);
	fm_xport_space_close(x, sp);
	fm_xport_close(x);
	return r != 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "check"))
		return check(argv[2]);
	if (argc >= 4 && !strcmp(argv[1], "bench")) {
		uint64_t n = argc > 4 ? strtoull(argv[4], NULL, 0) : 2048;
		double rw, rr, tw, tr;
		if (bench1(argv[2], n, &rw, &rr) || bench1(argv[3], n, &tw, &tr)) {
			printf("rdma_peer: bench failed\n");
			return 1;
		}
		printf("| transport | write us/page (batch 16) | read us/page (batch 1) |\n");
		printf("| rdma      | %8.1f | %8.1f |\n", rw, rr);
		printf("| tcp       | %8.1f | %8.1f |\n", tw, tr);
		printf("| tcp/rdma  | %8.2f | %8.2f |  (TCG guest: ratios only, not hardware figures)\n",
		       tw / rw, tr / rr);
		return 0;
	}
	fprintf(stderr, "usage: rdma_peer check rdma://ADDR:PORT | bench rdma://A:P tcp:A:P [PAGES]\n");
	return 2;
}
