/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rewrite: random read-then-rewrite over a big buffer, every byte checked.
 * The workload of issue 16: a program that rewrites its pages, which is what
 * a read-only fault benchmark hides (a write makes an evicted page dirty, so
 * it must be written back before it can leave again).
 *
 *   rewrite [--size 512M] [--rounds 100000] [--threads 1] [--write-pct 50]
 *           [--seed 1] [--json] [--mode rewrite|fit] [--heap] [--sleepers 0]
 *
 * Every page holds incompressible bytes derived from (page, version). Fill
 * writes version 0 everywhere; then --rounds rounds (split over the threads)
 * each pick a random page of their thread's share, check it, and rewrite
 * --write-pct of them with the next version; then a full pass checks every
 * page. Page i belongs to thread i % threads, so no two threads race on a
 * page and the expected version is always known.
 *
 * --mode fit: the same buffer, but it is meant to fit the budget: fill, then
 * rounds over every page in order, a read and a rewrite each (a program whose
 * memory fits pays nothing: that is what this measures).
 *
 * --heap: the buffer is 1 MiB blocks from malloc, not one mapping: they
 * land in glibc's main heap, which farmem pages as a region whose faults
 * the kernel waits for (a handler thread serves them, docs/pager.md), so
 * this measures that path where the default measures the faulting thread's.
 *
 * --sleepers N: besides, N threads sleep through the run in read() on one pipe,
 * each into a page of a mapping of their own (a thread pool waiting for
 * work). Under fault=signal each holds a pin on its page for as long as it
 * sleeps, so this measures what held pins cost the evictor's check of its
 * victims (pins.h). Each gets its message at the end and checks it.
 *
 * Exit status: 0 every byte as expected, 1 a page had wrong bytes, 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "size_arg.h"

#define PAGE 4096u
#define WORDS (PAGE / 8u)

#define HEAP_BLOCK (1u << 20)
#define PAGES_PER_BLOCK (HEAP_BLOCK / PAGE)

static uint8_t *buf;
static uint8_t **blocks; /* --heap */
static uint64_t npages, rounds, seed = 1;
static unsigned nthreads = 1, write_pct = 50;
static uint32_t *version;
static int fit_mode;
static int sleep_pipe[2];
static uint8_t *sleeper_pages;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static uint8_t *page_at(uint64_t pg)
{
	return blocks ? blocks[pg / PAGES_PER_BLOCK] + (pg % PAGES_PER_BLOCK) * PAGE : buf + pg * PAGE;
}

static void fill_page(uint64_t pg, uint32_t ver)
{
	uint64_t *w = (uint64_t *)page_at(pg);
	uint64_t x = mix(pg * 0x9e3779b97f4a7c15ull ^ ((uint64_t)ver << 40) ^ seed);

	for (unsigned k = 0; k < WORDS; k++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[k] = x;
	}
}

/* Returns 0 when page pg holds version ver's bytes. */
static int check_page(uint64_t pg, uint32_t ver)
{
	const volatile uint64_t *w = (const volatile uint64_t *)page_at(pg);
	uint64_t x = mix(pg * 0x9e3779b97f4a7c15ull ^ ((uint64_t)ver << 40) ^ seed);

	for (unsigned k = 0; k < WORDS; k++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (w[k] != x) {
			fprintf(stderr, "rewrite: page %" PRIu64 " word %u: expected version %u's %#" PRIx64
				", found %#" PRIx64 "\n", pg, k, ver, x, w[k]);
			return -1;
		}
	}
	return 0;
}

struct worker {
	pthread_t th;
	unsigned idx;
	uint64_t checked, rewritten;
	int bad;
};

static void *fill_worker(void *arg)
{
	struct worker *w = arg;

	for (uint64_t pg = w->idx; pg < npages; pg += nthreads)
		fill_page(pg, 0);
	return NULL;
}

static void *round_worker(void *arg)
{
	struct worker *w = arg;
	uint64_t share = (npages - w->idx + nthreads - 1) / nthreads;
	uint64_t my_rounds = rounds / nthreads + (w->idx < rounds % nthreads);
	uint64_t rng = mix(seed ^ (0x1234567ull + w->idx));

	for (uint64_t r = 0; r < my_rounds && share; r++) {
		uint64_t pg;
		rng = mix(rng + r);
		pg = fit_mode ? w->idx + (r % share) * nthreads : w->idx + (rng % share) * nthreads;
		if (check_page(pg, version[pg])) {
			w->bad = 1;
			return NULL;
		}
		w->checked++;
		if (fit_mode || (rng >> 40) % 100 < write_pct) {
			version[pg]++;
			fill_page(pg, version[pg]);
			w->rewritten++;
		}
	}
	return NULL;
}

static void *check_worker(void *arg)
{
	struct worker *w = arg;

	for (uint64_t pg = w->idx; pg < npages; pg += nthreads)
		if (check_page(pg, version[pg])) {
			w->bad = 1;
			return NULL;
		}
	return NULL;
}

static void *sleeper(void *arg)
{
	uint64_t k = (uint64_t)(uintptr_t)arg;
	uint64_t *page = (uint64_t *)(sleeper_pages + k * PAGE);
	ssize_t n = read(sleep_pipe[0], page, PAGE);

	/* Pipe reads of PAGE_SIZE each take one whole message: any sleeper may get any message. */
	if (n != PAGE || page[WORDS - 1] != mix(page[0])) {
		fprintf(stderr, "rewrite: sleeper %" PRIu64 " read %zd bytes, message %#" PRIx64 " malformed\n", k, n,
			page[0]);
		return (void *)1;
	}
	return NULL;
}

static int start_sleepers(unsigned n, pthread_t *t)
{
	pthread_attr_t attr;

	sleeper_pages = mmap(NULL, (size_t)n * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sleeper_pages == MAP_FAILED || pipe(sleep_pipe))
		return perror("rewrite: sleepers"), -1;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64u << 10);
	for (unsigned k = 0; k < n; k++)
		if (pthread_create(&t[k], &attr, sleeper, (void *)(uintptr_t)k))
			return perror("rewrite: sleeper pthread_create"), -1;
	pthread_attr_destroy(&attr);
	usleep(200000); /* in their reads by now */
	return 0;
}

static int wake_sleepers(unsigned n, pthread_t *t)
{
	static uint64_t msg[WORDS];
	int bad = 0;

	for (unsigned k = 0; k < n; k++) {
		msg[0] = k;
		msg[WORDS - 1] = mix(k);
		if (write(sleep_pipe[1], msg, PAGE) != PAGE)
			return perror("rewrite: wake"), -1;
	}
	for (unsigned k = 0; k < n; k++) {
		void *r;
		pthread_join(t[k], &r);
		bad |= r != NULL;
	}
	return bad ? -1 : 0;
}

static int run_phase(struct worker *w, void *(*fn)(void *))
{
	int bad = 0;

	for (unsigned t = 0; t < nthreads; t++) {
		w[t].idx = t;
		if (pthread_create(&w[t].th, NULL, fn, &w[t])) {
			perror("rewrite: pthread_create");
			exit(2);
		}
	}
	for (unsigned t = 0; t < nthreads; t++) {
		pthread_join(w[t].th, NULL);
		bad |= w[t].bad;
	}
	return bad;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "threads", required_argument, NULL, 't' },
		{ "write-pct", required_argument, NULL, 'w' },
		{ "seed", required_argument, NULL, 'S' },
		{ "mode", required_argument, NULL, 'm' },
		{ "json", no_argument, NULL, 'j' },
		{ "heap", no_argument, NULL, 'h' },
		{ "sleepers", required_argument, NULL, 'z' },
		{ 0 },
	};
	uint64_t size = 512ull << 20, checked = 0, rewritten = 0;
	int json = 0, heap = 0, c;
	unsigned sleepers = 0;
	pthread_t *sleeper_threads;
	double t0, t1, t2, t3;
	struct worker *w;

	rounds = 100000;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's': if (parse_size(optarg, &size) || size < PAGE) goto usage; break;
		case 'r': rounds = strtoull(optarg, NULL, 10); break;
		case 't': nthreads = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'w': write_pct = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'S': seed = strtoull(optarg, NULL, 10); break;
		case 'm':
			if (!strcmp(optarg, "fit"))
				fit_mode = 1;
			else if (strcmp(optarg, "rewrite"))
				goto usage;
			break;
		case 'j': json = 1; break;
		case 'h': heap = 1; break;
		case 'z': sleepers = (unsigned)strtoul(optarg, NULL, 10); break;
		default: goto usage;
		}
	}
	if (nthreads < 1 || nthreads > 256 || write_pct > 100 || sleepers > 100000)
		goto usage;
	npages = size / PAGE;
	/* The versions and thread records are small, allocated before the data so they sit below it. */
	version = calloc(npages, sizeof(*version));
	w = calloc(nthreads, sizeof(*w));
	sleeper_threads = calloc(sleepers + 1, sizeof(*sleeper_threads));
	if (heap) {
		uint64_t nblocks = (npages + PAGES_PER_BLOCK - 1) / PAGES_PER_BLOCK;
		blocks = calloc(nblocks, sizeof(*blocks));
		for (uint64_t b = 0; blocks && b < nblocks; b++)
			if (posix_memalign((void **)&blocks[b], PAGE, HEAP_BLOCK)) {
				free(blocks);
				blocks = NULL;
			}
		buf = blocks ? NULL : MAP_FAILED;
	} else {
		buf = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (buf == MAP_FAILED || !version || !w || !sleeper_threads) {
		perror("rewrite: allocation");
		return 2;
	}
	if (sleepers && start_sleepers(sleepers, sleeper_threads))
		return 2;
	t0 = now();
	run_phase(w, fill_worker);
	t1 = now();
	if (run_phase(w, round_worker))
		return 1;
	t2 = now();
	if (run_phase(w, check_worker))
		return 1;
	t3 = now();
	if (sleepers && wake_sleepers(sleepers, sleeper_threads))
		return 1;
	for (unsigned t = 0; t < nthreads; t++) {
		checked += w[t].checked;
		rewritten += w[t].rewritten;
	}
	if (json)
		printf("{\"size\": %" PRIu64 ", \"threads\": %u, \"rounds\": %" PRIu64 ", \"checked\": %" PRIu64
		       ", \"rewritten\": %" PRIu64 ", \"fill_s\": %.4f, \"rounds_s\": %.4f, \"check_s\": %.4f, "
		       "\"total_s\": %.4f, \"ok\": true}\n",
		       size, nthreads, rounds, checked, rewritten, t1 - t0, t2 - t1, t3 - t2, t3 - t0);
	else
		printf("rewrite: %" PRIu64 " MiB, %u threads: fill %.3f s, %" PRIu64 " rounds (%" PRIu64
		       " rewritten) %.3f s, full check %.3f s, total %.3f s: every byte as expected\n",
		       size >> 20, nthreads, t1 - t0, checked, rewritten, t2 - t1, t3 - t2, t3 - t0);
	return 0;
usage:
	fprintf(stderr, "usage: rewrite [--size 512M] [--rounds N] [--threads T] [--write-pct P] [--seed S] "
		"[--mode rewrite|fit] [--heap] [--sleepers N] [--json]\n");
	return 2;
}
