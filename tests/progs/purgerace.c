// SPDX-License-Identifier: Apache-2.0
/*
 * Threads that drop their memory with madvise while other threads fault
 * beside it and the evictor runs, as jemalloc purges its free extents.
 * jemalloc_prog hung under farmem once in session 83's clean-clone runs and
 * once in 92 runs beside two busy loops in session 84: the pager forgot a
 * dropped range before the program's madvise reached the kernel; in
 * between, a fault's run of zero fills ahead took a page of the range
 * again, an eviction chose it, and the madvise dropped it under the
 * eviction, whose capture then waited in the kernel for a fault that the
 * eviction's own hold kept anyone from serving. This program did not hang
 * the build before (20 runs): it checks what a drop leaves, in both modes.
 *
 *   purgerace --mib M --threads N --rounds R
 *
 * The threads work in pairs (N even), each pair on a block of 2M/N MiB
 * (mmap'd: paged from the first byte) cut into 64 KiB pieces; in each
 * piece the lower half is the low thread's, the upper half the high
 * thread's. A round, for each piece: the high thread writes its half,
 * checks it and drops it with MADV_DONTNEED; the low thread drops its half,
 * checks that it reads zeros while writing it again from its start, and
 * checks it. Prints "purgerace ok" and exits 0, or names the first wrong
 * word and exits 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mix.h"

#define PIECE (64u << 10)
#define HALF (PIECE / 2)

static size_t block_bytes;
static int rounds = 20;

struct worker {
	int id, high;
	uint8_t *block;
	long bad;
};

static int check(const struct worker *w, int r, size_t o, const uint64_t *p, uint64_t seed, size_t words)
{
	for (size_t k = 0; k < words; k++) {
		if (p[k] != mix(seed + k)) {
			fprintf(stderr, "purgerace: thread %d round %d at +%zu word %zu: %016llx, want %016llx\n", w->id, r,
				o, k, (unsigned long long)p[k], (unsigned long long)mix(seed + k));
			return 1;
		}
	}
	return 0;
}

static void *work(void *v)
{
	struct worker *w = v;

	for (int r = 0; r < rounds && !w->bad; r++) {
		for (size_t o = 0; o + PIECE <= block_bytes && !w->bad; o += PIECE) {
			uint8_t *half = w->block + o + (w->high ? HALF : 0);
			uint64_t *p = (uint64_t *)half, seed = ((uint64_t)w->id << 40) ^ ((uint64_t)r << 32) ^ o;

			if (!w->high && madvise(half, HALF, MADV_DONTNEED)) {
				perror("purgerace: madvise");
				exit(2);
			}
			for (size_t k = 0; k < HALF / 8; k++) {
				if (!w->high && p[k]) {
					fprintf(stderr, "purgerace: thread %d round %d at +%zu word %zu: %016llx after "
						"MADV_DONTNEED, want 0\n", w->id, r, o, k, (unsigned long long)p[k]);
					w->bad++;
					break;
				}
				p[k] = mix(seed + k);
			}
			w->bad += check(w, r, o, p, seed, HALF / 8);
			if (w->high && madvise(half, HALF, MADV_DONTNEED)) {
				perror("purgerace: madvise");
				exit(2);
			}
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	size_t mib = 64;
	int nthreads = 4;
	pthread_t t[64];
	struct worker w[64];
	long bad = 0;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--mib"))
			mib = strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--threads"))
			nthreads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "usage: purgerace --mib M --threads N --rounds R\n");
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 64 || !mib || rounds < 1) {
		fprintf(stderr, "purgerace: --threads 1..64, --mib and --rounds above 0\n");
		return 2;
	}
	if (nthreads % 2) {
		fprintf(stderr, "purgerace: --threads is even (the threads work in pairs)\n");
		return 2;
	}
	block_bytes = (mib << 20) / (size_t)(nthreads / 2) / PIECE * PIECE;
	for (int i = 0; i < nthreads; i += 2) {
		uint8_t *b = mmap(NULL, block_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (b == MAP_FAILED) {
			perror("purgerace: mmap");
			return 2;
		}
		w[i] = (struct worker){ .id = i, .block = b };
		w[i + 1] = (struct worker){ .id = i + 1, .high = 1, .block = b };
	}
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, work, &w[i]);
	for (int i = 0; i < nthreads; i++) {
		pthread_join(t[i], NULL);
		bad += w[i].bad;
	}
	if (bad)
		return 1;
	puts("purgerace ok");
	return 0;
}
