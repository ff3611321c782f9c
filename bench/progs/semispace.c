// SPDX-License-Identifier: Apache-2.0
/*
 * A copying collector's pattern, as BEAM's heaps and V8's young generation
 * have it: two spaces of --size each; the program works at random in one
 * (--touches pages read and rewritten), then copies it in order into the
 * other and works there next; --copies times. With --touches 0 it is a
 * stencil's two buffers instead (each pass reads one in order and writes the
 * other), a loop over both. Every page is checked at every touch and copy,
 * and all at the end: exit 2 if one is wrong.
 *
 *   semispace [--size 64M] [--copies 8] [--touches 100000]
 *
 * Prints the seconds from the first write to the last check. Run under
 * `farmem run --local L` with 2 * size > L to see what the pager's loop rule
 * does with it (bench/RESULTS.md, session 62).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "size_arg.h"

#define PAGE 4096ul
#define WORDS (PAGE / 8)

static uint64_t word(uint64_t pg, uint32_t v, unsigned k)
{
	uint64_t x = pg * 0x9e3779b97f4a7c15ull ^ ((uint64_t)v << 32) ^ k;

	x ^= x >> 31;
	return x * 0xbf58476d1ce4e5b9ull;
}

static void put(uint64_t *space, uint64_t pg, uint32_t v)
{
	for (unsigned k = 0; k < WORDS; k++)
		space[pg * WORDS + k] = word(pg, v, k);
}

static int ok(const uint64_t *space, uint64_t pg, uint32_t v)
{
	for (unsigned k = 0; k < WORDS; k++)
		if (space[pg * WORDS + k] != word(pg, v, k))
			return 0;
	return 1;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "copies", required_argument, NULL, 'c' },
		{ "touches", required_argument, NULL, 't' },
		{ 0 },
	};
	uint64_t size = 64ull << 20, touches = 100000, rng = 0x9e3779b97f4a7c15ull, npages;
	unsigned copies = 8, cur = 0;
	uint64_t *sp[2];
	uint32_t *ver;
	double t0;
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's': if (parse_size(optarg, &size) || size < PAGE) goto usage; break;
		case 'c': copies = (unsigned)strtoul(optarg, NULL, 10); break;
		case 't': touches = strtoull(optarg, NULL, 10); break;
		default: goto usage;
		}
	}
	if (optind != argc)
		goto usage;
	npages = size / PAGE;
	ver = calloc(npages, sizeof(*ver));
	for (int k = 0; k < 2; k++) {
		sp[k] = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (sp[k] == MAP_FAILED || !ver) {
			perror("semispace: mmap");
			return 1;
		}
	}
	t0 = now_s();
	for (uint64_t i = 0; i < npages; i++)
		put(sp[0], i, ver[i] = 1);
	for (unsigned g = 0; g < copies; g++) {
		for (uint64_t t = 0; t < touches; t++) {
			uint64_t i;

			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			i = rng % npages;
			if (!ok(sp[cur], i, ver[i]))
				goto wrong;
			put(sp[cur], i, ++ver[i]);
		}
		for (uint64_t i = 0; i < npages; i++) {
			if (!ok(sp[cur], i, ver[i]))
				goto wrong;
			put(sp[!cur], i, ver[i]);
		}
		cur = !cur;
	}
	for (uint64_t i = 0; i < npages; i++)
		if (!ok(sp[cur], i, ver[i]))
			goto wrong;
	printf("semispace: %.2f s, %u copies of %llu pages, %llu touches between, all pages checked\n", now_s() - t0,
	       copies, (unsigned long long)npages, (unsigned long long)touches);
	return 0;
wrong:
	fprintf(stderr, "semispace: a page read back wrong\n");
	return 2;
usage:
	fprintf(stderr, "usage: semispace [--size 64M] [--copies 8] [--touches 100000]\n");
	return 1;
}
