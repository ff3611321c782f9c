/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pagetest: the integrity workload.
 *
 *   pagetest --size 512M [--rounds R] [--rewrites N] [--threads T] [--seed S]
 *            [--exit-code K] [--verbose]
 *
 * Maps one anonymous private region of SIZE (a single mapping, so the preload
 * shim's size threshold registers it), fills every 4 KiB page with a pattern
 * derived from (page index, version, seed) that covers all 4096 bytes, then
 * for each round rewrites N random pages with bumped versions and verifies
 * every byte of every page.  The versions live in a small malloc'd array
 * (4 bytes a page: 512 KiB for 512 MiB), far below the shim's threshold.
 *
 * With --threads T, thread t owns pages p with p % T == t: each thread fills,
 * rewrites and re-verifies its own pages concurrently with the others (and
 * with whatever evicts pages underneath), then the main thread runs a final
 * full verify.
 *
 * Exit status: 0 on success (or K with --exit-code K), 1 on a data mismatch
 * (the first bad page, offset, expected and actual bytes are printed), 2 on a
 * usage error, 3 on a system error (mmap, threads).
 *
 * Testing only: --self-test-corrupt flips one byte of one page just before the
 * final verify, which must then fail with exit status 1.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../bench/progs/size_arg.h"

#define PAGE_SIZE_ 4096u
#define WORDS (PAGE_SIZE_ / 8u)

struct cfg {
	uint64_t size;
	uint64_t npages;
	unsigned rounds;
	uint64_t rewrites;   /* per round, over all threads */
	unsigned threads;
	uint64_t seed;
	int exit_code;
	int verbose;
	int corrupt;
};

static struct cfg C;
static uint8_t *region;
static uint32_t *versions;
static atomic_int failed;            /* first mismatch wins the report */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t page_seed(uint64_t page, uint32_t version)
{
	uint64_t h = splitmix64(C.seed ^ 0x7061676574657374ULL);
	h = splitmix64(h ^ page);
	h = splitmix64(h ^ ((uint64_t)version << 1 | 1));
	return h ? h : 0x2545f4914f6cdd1dULL;    /* xorshift state must be non-zero */
}

/* xorshift64* stream: word i of (page, version). */
static inline uint64_t xs_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static void fill_page(uint64_t page, uint32_t version)
{
	uint64_t *w = (uint64_t *)(region + page * PAGE_SIZE_);
	uint64_t s = page_seed(page, version);
	for (unsigned i = 0; i < WORDS; i++)
		w[i] = xs_next(&s);
}

/* Returns the index of the first differing word, or -1 when the page matches. */
static int check_page_version(const uint8_t *p, uint64_t page, uint32_t version)
{
	const volatile uint64_t *w = (const volatile uint64_t *)p;
	uint64_t s = page_seed(page, version);
	for (unsigned i = 0; i < WORDS; i++)
		if (w[i] != xs_next(&s))
			return (int)i;
	return -1;
}

/* Say what the bad page looks like: zeros, an older version, another page. */
static void diagnose(const uint8_t *p, uint64_t page, uint32_t version)
{
	int zero = 1;
	for (unsigned i = 0; i < PAGE_SIZE_; i++)
		if (p[i]) { zero = 0; break; }
	if (zero) {
		fprintf(stderr, "pagetest:   the page is all zeros (lost page?)\n");
		return;
	}
	for (uint32_t v = version; v-- > 0;) {
		if (check_page_version(p, page, v) < 0) {
			fprintf(stderr, "pagetest:   the page holds version %u of itself "
				"(stale: expected version %u)\n", v, version);
			return;
		}
		if (version - v > 64)
			break;
	}
	uint64_t lo = page > 64 ? page - 64 : 0;
	uint64_t hi = page + 64 < C.npages ? page + 64 : C.npages - 1;
	for (uint64_t q = lo; q <= hi; q++) {
		if (q == page)
			continue;
		uint32_t vq = __atomic_load_n(&versions[q], __ATOMIC_RELAXED);
		for (uint32_t v = vq + 1; v-- > 0 && vq - v < 4;)
			if (check_page_version(p, q, v) == -1) {
				fprintf(stderr, "pagetest:   the page holds page %" PRIu64
					" version %u (misplaced)\n", q, v);
				return;
			}
	}
	fprintf(stderr, "pagetest:   the content matches no nearby page or older version\n");
}

/* Verify one page; on mismatch report (once) and return -1. */
static int verify_page(uint64_t page)
{
	uint32_t version = versions[page];
	const uint8_t *p = region + page * PAGE_SIZE_;
	int wi = check_page_version(p, page, version);
	if (wi < 0)
		return 0;
	int expected = 0;
	if (!atomic_compare_exchange_strong(&failed, &expected, 1))
		return -1;
	pthread_mutex_lock(&report_lock);
	uint64_t s = page_seed(page, version);
	uint64_t want = 0;
	for (int i = 0; i <= wi; i++)
		want = xs_next(&s);
	uint64_t got;
	memcpy(&got, p + (size_t)wi * 8, 8);
	unsigned off = (unsigned)wi * 8;
	for (unsigned b = 0; b < 8; b++) {
		uint8_t wb = (uint8_t)(want >> (8 * b)), gb = (uint8_t)(got >> (8 * b));
		if (wb != gb) {
			off += b;
			break;
		}
	}
	unsigned nbad = 0;
	s = page_seed(page, version);
	for (unsigned i = 0; i < WORDS; i++) {
		uint64_t x = xs_next(&s);
		uint64_t g;
		memcpy(&g, p + (size_t)i * 8, 8);
		nbad += (g != x);
	}
	fprintf(stderr, "pagetest: MISMATCH page %" PRIu64 " (address %p) offset %u: "
		"expected byte 0x%02x got 0x%02x (word %d: expected 0x%016" PRIx64
		" got 0x%016" PRIx64 "), version %u, %u of %u words differ\n",
		page, (const void *)p, off, (uint8_t)(want >> (8 * (off % 8))),
		(uint8_t)(got >> (8 * (off % 8))), wi, want, got, version, nbad, WORDS);
	diagnose(p, page, version);
	pthread_mutex_unlock(&report_lock);
	return -1;
}

/* Pages owned by thread t of T: t, t+T, t+2T, ... */
struct worker {
	pthread_t tid;
	unsigned idx;
	uint64_t rng;
	uint64_t rewritten;
	double t_fill, t_rewrite, t_verify;
	int rc;
};

static uint64_t owned_count(unsigned t)
{
	return C.npages / C.threads + (t < C.npages % C.threads ? 1 : 0);
}

static int verify_owned(unsigned t)
{
	for (uint64_t p = t; p < C.npages; p += C.threads) {
		if (verify_page(p))
			return -1;
		if (atomic_load_explicit(&failed, memory_order_relaxed))
			return -1;
	}
	return 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	unsigned t = w->idx;
	uint64_t n_own = owned_count(t);
	uint64_t per_round = C.rewrites / C.threads + (t < C.rewrites % C.threads ? 1 : 0);
	double t0 = now_s();

	for (uint64_t p = t; p < C.npages; p += C.threads) {
		versions[p] = 1;
		fill_page(p, 1);
	}
	w->t_fill = now_s() - t0;
	for (unsigned r = 0; r < C.rounds && n_own; r++) {
		double t1 = now_s();
		for (uint64_t i = 0; i < per_round; i++) {
			uint64_t p = t + (xs_next(&w->rng) % n_own) * C.threads;
			uint32_t v = versions[p] + 1;
			fill_page(p, v);
			versions[p] = v;
		}
		w->rewritten += per_round;
		double t2 = now_s();
		w->t_rewrite += t2 - t1;
		if (verify_owned(t)) {
			w->rc = 1;
			return NULL;
		}
		w->t_verify += now_s() - t2;
		if (C.verbose)
			fprintf(stderr, "pagetest: thread %u round %u: rewrote %" PRIu64
				" pages in %.3f s, verified %" PRIu64 " pages in %.3f s\n",
				t, r + 1, per_round, t2 - t1, n_own, now_s() - t2);
	}
	return NULL;
}

static int verify_all(void)
{
	for (uint64_t p = 0; p < C.npages; p++)
		if (verify_page(p))
			return -1;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-')
		return -1;
	*out = v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: pagetest --size SIZE [--rounds R] [--rewrites N] [--threads T]\n"
		"                [--seed S] [--exit-code K] [--verbose]\n"
		"  --size SIZE     region size (K/M/G suffixes, multiple of 4 KiB; required)\n"
		"  --rounds R      rewrite+verify rounds (default 1)\n"
		"  --rewrites N    random pages rewritten per round (default: all pages' count)\n"
		"  --threads T     threads, each owning pages p %% T == t (default 1)\n"
		"  --seed S        pattern and choice seed (default 1)\n"
		"  --exit-code K   exit with K after a successful run (default 0)\n"
		"  --verbose       per-round timings on stderr\n"
		"exit: 0 (or K) ok, 1 data mismatch, 2 usage, 3 system error\n");
}

int main(int argc, char **argv)
{
	enum { O_SIZE = 1, O_ROUNDS, O_REWRITES, O_THREADS, O_SEED, O_EXIT, O_VERBOSE,
	       O_CORRUPT, O_HELP };
	static const struct option opts[] = {
		{"size", required_argument, 0, O_SIZE},
		{"rounds", required_argument, 0, O_ROUNDS},
		{"rewrites", required_argument, 0, O_REWRITES},
		{"threads", required_argument, 0, O_THREADS},
		{"seed", required_argument, 0, O_SEED},
		{"exit-code", required_argument, 0, O_EXIT},
		{"verbose", no_argument, 0, O_VERBOSE},
		{"self-test-corrupt", no_argument, 0, O_CORRUPT},
		{"help", no_argument, 0, O_HELP},
		{0, 0, 0, 0},
	};
	uint64_t v;
	int have_rewrites = 0;

	C.rounds = 1;
	C.threads = 1;
	C.seed = 1;
	for (;;) {
		int o = getopt_long(argc, argv, "", opts, NULL);
		if (o == -1)
			break;
		switch (o) {
		case O_SIZE:
			if (parse_size(optarg, &C.size) || C.size == 0 || C.size % PAGE_SIZE_) {
				fprintf(stderr, "pagetest: bad --size '%s' (a positive multiple of 4 KiB)\n", optarg);
				return 2;
			}
			break;
		case O_ROUNDS:
			if (parse_u64(optarg, &v) || v > 1000000) {
				fprintf(stderr, "pagetest: bad --rounds '%s'\n", optarg);
				return 2;
			}
			C.rounds = (unsigned)v;
			break;
		case O_REWRITES:
			if (parse_u64(optarg, &C.rewrites)) {
				fprintf(stderr, "pagetest: bad --rewrites '%s'\n", optarg);
				return 2;
			}
			have_rewrites = 1;
			break;
		case O_THREADS:
			if (parse_u64(optarg, &v) || v < 1 || v > 1024) {
				fprintf(stderr, "pagetest: bad --threads '%s' (1..1024)\n", optarg);
				return 2;
			}
			C.threads = (unsigned)v;
			break;
		case O_SEED:
			if (parse_u64(optarg, &C.seed)) {
				fprintf(stderr, "pagetest: bad --seed '%s'\n", optarg);
				return 2;
			}
			break;
		case O_EXIT:
			if (parse_u64(optarg, &v) || v > 255) {
				fprintf(stderr, "pagetest: bad --exit-code '%s' (0..255)\n", optarg);
				return 2;
			}
			C.exit_code = (int)v;
			break;
		case O_VERBOSE:
			C.verbose = 1;
			break;
		case O_CORRUPT:
			C.corrupt = 1;
			break;
		case O_HELP:
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "pagetest: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!C.size) {
		fprintf(stderr, "pagetest: --size is required\n");
		usage(stderr);
		return 2;
	}
	C.npages = C.size / PAGE_SIZE_;
	if (C.npages > UINT32_MAX) {
		fprintf(stderr, "pagetest: --size too large\n");
		return 2;
	}
	if (!have_rewrites)
		C.rewrites = C.npages;
	if (C.threads > C.npages)
		C.threads = (unsigned)C.npages;

	double t_start = now_s();
	region = mmap(NULL, C.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED) {
		fprintf(stderr, "pagetest: mmap %" PRIu64 " bytes: %s\n", C.size, strerror(errno));
		return 3;
	}
	versions = calloc(C.npages, sizeof *versions);
	struct worker *ws = calloc(C.threads, sizeof *ws);
	if (!versions || !ws) {
		fprintf(stderr, "pagetest: out of memory\n");
		return 3;
	}
	for (unsigned t = 0; t < C.threads; t++) {
		ws[t].idx = t;
		ws[t].rng = splitmix64(C.seed * 0x9e3779b97f4a7c15ULL + t + 1) | 1;
	}
	if (C.threads == 1) {
		worker_main(&ws[0]);
	} else {
		for (unsigned t = 0; t < C.threads; t++) {
			int e = pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]);
			if (e) {
				fprintf(stderr, "pagetest: pthread_create: %s\n", strerror(e));
				return 3;
			}
		}
		for (unsigned t = 0; t < C.threads; t++)
			pthread_join(ws[t].tid, NULL);
	}
	int bad = atomic_load(&failed);
	double t_final = 0, t_fill = 0, t_rewrite = 0, t_verify = 0;
	uint64_t rewritten = 0;
	for (unsigned t = 0; t < C.threads; t++) {
		rewritten += ws[t].rewritten;
		if (ws[t].t_fill > t_fill) t_fill = ws[t].t_fill;
		if (ws[t].t_rewrite > t_rewrite) t_rewrite = ws[t].t_rewrite;
		if (ws[t].t_verify > t_verify) t_verify = ws[t].t_verify;
	}
	if (!bad) {
		if (C.corrupt) {
			uint64_t s = splitmix64(C.seed ^ 0xc0ffee);
			uint64_t p = s % C.npages;
			unsigned off = (unsigned)((s >> 32) % PAGE_SIZE_);
			region[p * PAGE_SIZE_ + off] ^= 0x5a;
			fprintf(stderr, "pagetest: self-test: corrupted page %" PRIu64 " offset %u\n", p, off);
		}
		double t0 = now_s();
		bad = verify_all() != 0;
		t_final = now_s() - t0;
	}
	double total = now_s() - t_start;
	printf("pagetest: %s size=%" PRIu64 "M pages=%" PRIu64 " rounds=%u rewrites=%" PRIu64
	       " threads=%u seed=%" PRIu64 " fill=%.2fs rewrite=%.2fs verify=%.2fs final_verify=%.2fs total=%.2fs\n",
	       bad ? "FAILED" : "OK", C.size >> 20, C.npages, C.rounds, rewritten, C.threads,
	       C.seed, t_fill, t_rewrite, t_verify, t_final, total);
	fflush(stdout);
	free(ws);
	free(versions);
	munmap(region, C.size);
	if (bad)
		return 1;
	return C.exit_code;
}
