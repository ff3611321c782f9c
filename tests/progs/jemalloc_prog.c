// SPDX-License-Identifier: Apache-2.0
/*
 * A program linked with Debian's libjemalloc, whose constructor runs before
 * the preload shim's and maps memory through mmap (issue 19: under farmem it
 * did not start). It checks that jemalloc, not another allocator, serves its
 * blocks; that farmem allocates nothing through jemalloc (the thread's
 * jemalloc byte count grows by exactly the block that started the pager);
 * and that every byte it wrote comes back, while THREADS threads allocate and
 * free blocks of every size class against the evictor.
 *
 *   jemalloc_prog --size MiB --threads N --rounds R
 *
 * Prints "jemalloc ok" and exits 0, or names what was wrong and exits 1.
 */
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mix.h"

static size_t big_mib = 256;
static int nthreads = 4, rounds = 3;


static void fill(uint64_t *p, size_t words, uint64_t seed)
{
	for (size_t i = 0; i < words; i++)
		p[i] = mix(seed + i);
}

static size_t check(const uint64_t *p, size_t words, uint64_t seed)
{
	size_t bad = 0;
	for (size_t i = 0; i < words; i++)
		bad += p[i] != mix(seed + i);
	return bad;
}

static uint64_t thread_allocated(void)
{
	uint64_t v = 0;
	size_t sz = sizeof(v);
	if (mallctl("thread.allocated", &v, &sz, NULL, 0))
		return 0;
	return v;
}

struct churn {
	int id;
	size_t bad;
};

/* Blocks from 8 bytes to 4 MiB, a few of each live at once, rewritten and checked. */
static void *churn_main(void *v)
{
	struct churn *c = v;
	enum { SLOTS = 64 };
	uint64_t *slot[SLOTS] = {0};
	size_t words[SLOTS] = {0};
	uint64_t seed[SLOTS] = {0};
	uint64_t r = (uint64_t)c->id * 7919 + 1;

	for (int k = 0; k < rounds * 500; k++) {
		int s = (int)(mix(r++) % SLOTS);
		if (slot[s]) {
			c->bad += check(slot[s], words[s], seed[s]);
			free(slot[s]);
		}
		words[s] = (size_t)1 << (mix(r++) % 20); /* 8 B .. 4 MiB */
		seed[s] = mix(r++);
		slot[s] = malloc(words[s] * sizeof(uint64_t));
		if (!slot[s]) {
			fprintf(stderr, "jemalloc_prog: malloc(%zu) failed\n", words[s] * 8);
			exit(1);
		}
		fill(slot[s], words[s], seed[s]);
	}
	for (int s = 0; s < SLOTS; s++)
		if (slot[s]) {
			c->bad += check(slot[s], words[s], seed[s]);
			free(slot[s]);
		}
	return NULL;
}

int main(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--size"))
			big_mib = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--threads"))
			nthreads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = atoi(argv[i + 1]);
	}
	size_t n = big_mib << 20, words = n / 8, bad = 0;
	uint64_t before = thread_allocated();
	uint64_t *big = malloc(n);
	uint64_t grew = thread_allocated() - before;

	if (!big) {
		fprintf(stderr, "jemalloc_prog: malloc(%zu MiB) failed\n", big_mib);
		return 1;
	}
	/* sallocx is jemalloc's own: it would crash on a block from any other allocator. */
	if (sallocx(big, 0) < n || malloc_usable_size(big) != sallocx(big, 0)) {
		fprintf(stderr, "jemalloc_prog: the block is not jemalloc's (sallocx %zu, usable %zu)\n",
			sallocx(big, 0), malloc_usable_size(big));
		return 1;
	}
	if (grew != sallocx(big, 0)) {
		fprintf(stderr, "jemalloc_prog: jemalloc handed out %llu bytes on this thread for one block of %zu: "
			"someone else allocated through it\n", (unsigned long long)grew, sallocx(big, 0));
		return 1;
	}
	for (int r = 0; r < rounds; r++) {
		fill(big, words, (uint64_t)r << 40);
		bad += check(big, words, (uint64_t)r << 40);
	}

	pthread_t th[64];
	struct churn c[64];
	if (nthreads > 64)
		nthreads = 64;
	for (int t = 0; t < nthreads; t++) {
		c[t] = (struct churn){.id = t};
		if (pthread_create(&th[t], NULL, churn_main, &c[t])) {
			fprintf(stderr, "jemalloc_prog: pthread_create failed\n");
			return 1;
		}
	}
	for (int t = 0; t < nthreads; t++) {
		pthread_join(th[t], NULL);
		bad += c[t].bad;
	}
	bad += check(big, words, (uint64_t)(rounds - 1) << 40);
	free(big);
	if (bad) {
		fprintf(stderr, "jemalloc_prog: %zu words wrong\n", bad);
		return 1;
	}
	printf("jemalloc ok\n");
	return 0;
}
