// SPDX-License-Identifier: Apache-2.0
/*
 * crc_cold: what a page's crc32c costs when the page is cold, as most pages
 * the pager checks are (memd's store on a read, a page on its way out):
 * ISA-L's crc32_iscsi straight, against fm_crc32c (memd/common/fm_util.h),
 * which asks for a page's cache lines first. Pages of a 1 GiB memfd mapping
 * (memd's store is one), in order and in a random order; GB/s and us a page.
 *
 *   build/bench/crc_cold [MiB]
 */
#include <isa-l/crc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 0) : 1024, len = mib << 20, np = len >> 12;
	int fd = memfd_create("crc_cold", 0);
	uint8_t *m;
	size_t *order = malloc(np * sizeof(*order));
	uint32_t sink = 0;

	if (fd < 0 || ftruncate(fd, (off_t)len) || !order)
		return 1;
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < len; i += 8)
		*(uint64_t *)(m + i) = i * 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < np; i++)
		order[i] = i;
	srand(1);
	for (size_t i = np - 1; i > 0; i--) {
		size_t j = (size_t)rand() % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (int random = 0; random < 2; random++) {
		for (int with = 0; with < 2; with++) {
			double t0;
			/* Evict the mapping from the caches between passes: touch 2x the LLC elsewhere. */
			static uint8_t flush[64 << 20];
			memset(flush, with + random, sizeof(flush));
			t0 = now();
			for (size_t i = 0; i < np; i++) {
				const uint8_t *pg = m + ((random ? order[i] : i) << 12);
				sink += with ? fm_crc32c(pg, 4096) : ~crc32_iscsi((unsigned char *)pg, 4096, 0xffffffffu);
			}
			t0 = now() - t0;
			printf("%-8s pages, %-30s %6.2f GB/s  %5.2f us a page\n", random ? "random" : "in-order",
			       with ? "fm_crc32c (lines asked first)" : "crc32_iscsi", (double)len / t0 / 1e9,
			       t0 / (double)np * 1e6);
		}
	}
	fprintf(stderr, "(%u)\n", sink);
	return 0;
}
