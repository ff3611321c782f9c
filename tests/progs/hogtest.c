// SPDX-License-Identifier: Apache-2.0
/*
 * A thread that rewrites random pages of a region while other threads keep
 * every CPU busy: how long can one access wait for its fault? With
 * fault=thread every fault goes through the handler thread, which may have
 * followed the faulting thread to its CPU at idle priority (uffd/follow.h),
 * where CPU-bound threads could starve it.
 *
 *   hogtest --size SIZE --hogs N --seconds S [--hogs-after MS] [--max-ms M]
 *
 * --hogs-after: the hogs start MS milliseconds into the rewrites, when the
 * handler may have followed the rewriting thread already (a CPU to itself).
 * Prints the rewrites done, the slowest access and the 99.9th percentile;
 * every page is checked at the end (each word holds mix(page, its
 * generation)). Exit 0 when the pages are right and no access took longer
 * than M ms (0: no limit), 1 on wrong data, 4 on a slow access, 2 on usage.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "mix.h"

#define PG 4096
#define LAT_SLOTS 4096

static atomic_int stop;
static unsigned hogs_after_ms;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *hog(void *arg)
{
	volatile uint64_t x = (uintptr_t)arg;
	struct timespec ts = { hogs_after_ms / 1000, (long)(hogs_after_ms % 1000) * 1000000L };

	if (hogs_after_ms)
		nanosleep(&ts, NULL);
	while (!atomic_load_explicit(&stop, memory_order_relaxed))
		x = mix(x);
	return NULL;
}

static void fill(uint64_t *w, uint64_t page, uint32_t gen)
{
	for (unsigned i = 0; i < PG / 8; i++)
		w[i] = mix(page << 20 ^ (uint64_t)gen << 12 ^ i);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	uint64_t size = 0, npages, rewrites = 0, worst = 0, *lat, seed = 88172645463325252ull, t_end;
	unsigned hogs = 2, seconds = 3, max_ms = 0, bad = 0;
	pthread_t th[64];
	uint32_t *gen;
	uint8_t *m;

	for (int i = 1; i + 1 < argc; i += 2) {
		char *end;
		unsigned long long v = strtoull(argv[i + 1], &end, 10);

		if (*end == 'M' || *end == 'm')
			v <<= 20;
		else if (*end == 'G' || *end == 'g')
			v <<= 30;
		if (!strcmp(argv[i], "--size"))
			size = v;
		else if (!strcmp(argv[i], "--hogs"))
			hogs = (unsigned)v;
		else if (!strcmp(argv[i], "--seconds"))
			seconds = (unsigned)v;
		else if (!strcmp(argv[i], "--hogs-after"))
			hogs_after_ms = (unsigned)v;
		else if (!strcmp(argv[i], "--max-ms"))
			max_ms = (unsigned)v;
		else
			size = 0;
	}
	if (!size || size % PG || hogs > 64 || !seconds) {
		fprintf(stderr, "usage: hogtest --size SIZE --hogs N --seconds S [--hogs-after MS] [--max-ms M]\n");
		return 2;
	}
	npages = size / PG;
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gen = calloc(npages, sizeof(*gen));
	lat = calloc(LAT_SLOTS, sizeof(*lat));
	if (m == MAP_FAILED || !gen || !lat) {
		perror("hogtest");
		return 3;
	}
	for (uint64_t p = 0; p < npages; p++)
		fill((uint64_t *)(m + p * PG), p, 0);
	for (unsigned h = 0; h < hogs; h++)
		if (pthread_create(&th[h], NULL, hog, (void *)(uintptr_t)(h + 1))) {
			perror("hogtest: pthread_create");
			return 3;
		}
	t_end = now_ns() + (uint64_t)seconds * 1000000000ull;
	while (now_ns() < t_end) {
		uint64_t p, t0, dt;

		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		p = seed % npages;
		t0 = now_ns();
		/* One access: the first word, which faults the page in when it is away. */
		if (((volatile uint64_t *)(m + p * PG))[0] != mix(p << 20 ^ (uint64_t)gen[p] << 12))
			bad++;
		dt = now_ns() - t0;
		fill((uint64_t *)(m + p * PG), p, ++gen[p]);
		lat[rewrites % LAT_SLOTS] = dt;
		if (dt > worst)
			worst = dt;
		rewrites++;
	}
	atomic_store(&stop, 1);
	for (unsigned h = 0; h < hogs; h++)
		pthread_join(th[h], NULL);
	for (uint64_t p = 0; p < npages; p++)
		for (unsigned i = 0; i < PG / 8; i++)
			if (((uint64_t *)(m + p * PG))[i] != mix(p << 20 ^ (uint64_t)gen[p] << 12 ^ i)) {
				bad++;
				break;
			}
	qsort(lat, rewrites < LAT_SLOTS ? rewrites : LAT_SLOTS, sizeof(*lat), cmp_u64);
	printf("hogtest: %s rewrites=%llu hogs=%u worst_ms=%.3f p999_ms=%.3f (of the last %u) bad=%u\n",
	       bad ? "BAD" : "OK", (unsigned long long)rewrites, hogs, worst / 1e6,
	       lat[(rewrites < LAT_SLOTS ? rewrites : LAT_SLOTS) * 999 / 1000] / 1e6, LAT_SLOTS, bad);
	if (bad)
		return 1;
	return max_ms && worst > (uint64_t)max_ms * 1000000ull ? 4 : 0;
}
