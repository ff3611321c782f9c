// SPDX-License-Identifier: Apache-2.0
/*
 * Stress: N threads make checked accesses to the pages of one big mapping
 * while the pager's evictor takes pages away under them (run it under
 * `farmem run --local 25%`). Issue 8's hardening run: 10^7 checked page
 * accesses on 8 threads racing the evictor, 0 bytes wrong.
 *
 *   stress_access [--size 128M] [--threads 8] [--accesses 10000000] [--seconds 150] [--seed S]
 *
 * Thread t owns pages p with p % T == t. Every page's 512 words are a function
 * of (page, version); the owner keeps each page's version. An access picks a
 * page (90% of them from a hot tenth of the thread's pages, the rest anywhere,
 * so that both resident and evicted pages are hit), checks 8 words of it at
 * random offsets, and one access in 8 writes the whole page at version+1
 * (after checking all of it). At the end every page is checked in full.
 * Prints "stress: OK accesses=N ..." and exits 0, or reports the first wrong
 * word and exits 1. --seconds bounds the run: fewer accesses are then reported.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../../bench/progs/size_arg.h"

#define PAGE 4096u
#define WORDS (PAGE / 8)

static uint8_t *base;
static uint64_t npages, seed = 1, target = 10000000;
static unsigned nthreads = 8;
static double seconds = 150;
static uint32_t *version;
static atomic_uint_fast64_t done_accesses, wrong_words;
static atomic_int stop;
static double t0;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t word(uint64_t page, uint32_t v, unsigned k)
{
	return mix(seed ^ (page << 20) ^ ((uint64_t)v << 10) ^ k);
}

static void fill(uint64_t p, uint32_t v)
{
	uint64_t *w = (uint64_t *)(base + p * PAGE);
	for (unsigned k = 0; k < WORDS; k++)
		w[k] = word(p, v, k);
}

static int check_word(uint64_t p, unsigned k)
{
	uint64_t got = ((volatile uint64_t *)(base + p * PAGE))[k], want = word(p, version[p], k);
	if (got != want) {
		if (atomic_fetch_add(&wrong_words, 1) < 5)
			fprintf(stderr, "stress: WRONG page %llu word %u version %u: %#llx, want %#llx\n",
				(unsigned long long)p, k, version[p], (unsigned long long)got,
				(unsigned long long)want);
		return 1;
	}
	return 0;
}

static void *worker(void *arg)
{
	unsigned t = (unsigned)(uintptr_t)arg;
	uint64_t mine = (npages - t + nthreads - 1) / nthreads, hot = mine / 10 ? mine / 10 : 1;
	uint64_t r = mix(seed * 977 + t), n = 0, quota = target / nthreads + (t < target % nthreads);

	while (n < quota && !atomic_load_explicit(&stop, memory_order_relaxed)) {
		uint64_t i, p;
		r = mix(r);
		i = (r & 15) < 14 ? (r >> 8) % hot : (r >> 8) % mine; /* ~90% hot */
		p = i * nthreads + t;
		if (((r >> 4) & 7) == 0) {
			for (unsigned k = 0; k < WORDS; k++)
				check_word(p, k);
			version[p]++;
			fill(p, version[p]);
		} else {
			for (unsigned j = 0; j < 8; j++)
				check_word(p, (unsigned)((r >> (12 + 6 * j)) & (WORDS - 1)) ^ j);
		}
		n++;
		if ((n & 4095) == 0) {
			atomic_fetch_add(&done_accesses, 4096);
			if (now() - t0 > seconds)
				atomic_store(&stop, 1);
		}
	}
	atomic_fetch_add(&done_accesses, n & 4095);
	return NULL;
}

int main(int argc, char **argv)
{
	uint64_t size = 128ull << 20;
	pthread_t th[64];
	double t1;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--size") && !parse_size(argv[i + 1], &size)) continue;
		else if (!strcmp(argv[i], "--threads")) nthreads = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--accesses")) target = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
		else {
			fprintf(stderr, "usage: stress_access [--size S] [--threads T] [--accesses N] [--seconds S] [--seed S]\n");
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 64 || size < PAGE * (uint64_t)nthreads) {
		fprintf(stderr, "stress: bad --threads or --size\n");
		return 2;
	}
	npages = size / PAGE;
	base = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	version = calloc(npages, sizeof(*version));
	if (base == MAP_FAILED || !version) {
		perror("stress: mmap");
		return 2;
	}
	for (uint64_t p = 0; p < npages; p++)
		fill(p, 0);
	t0 = now();
	for (unsigned t = 0; t < nthreads; t++)
		pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t);
	for (unsigned t = 0; t < nthreads; t++)
		pthread_join(th[t], NULL);
	t1 = now();
	for (uint64_t p = 0; p < npages; p++)
		for (unsigned k = 0; k < WORDS; k++)
			check_word(p, k);
	printf("stress: %s accesses=%llu threads=%u pages=%llu wrong_words=%llu seconds=%.2f rate=%.0f/s%s\n",
	       atomic_load(&wrong_words) ? "FAIL" : "OK", (unsigned long long)atomic_load(&done_accesses),
	       nthreads, (unsigned long long)npages, (unsigned long long)atomic_load(&wrong_words), t1 - t0,
	       (double)atomic_load(&done_accesses) / (t1 - t0), atomic_load(&stop) ? " (time bound hit)" : "");
	return atomic_load(&wrong_words) ? 1 : 0;
}
