// SPDX-License-Identifier: Apache-2.0
/*
 * alignedread: the cost of a page-aligned 4 KiB pread into a block of
 * glibc's heap, the shape of an O_DIRECT read. Under farmem's --fault signal
 * the shim asks such a read's descriptor whether it is O_DIRECT (fcntl) once
 * the alignment test passed (uffd/fault.c, dma_target): this measures what
 * that costs a program whose reads only look like O_DIRECT ones.
 *
 *   alignedread FILE CALLS [mapped]   (FILE of 1 MiB or more, in the page cache)
 *
 * mapped: the buffers are pages of a 2 MiB mapping instead, which farmem
 * pages by SIGBUS under --fault signal at --threshold 1M: each pread then
 * makes its buffer resident and pins it for the call (uffd/pins.h), and this
 * measures what a pin costs a call whose buffer is resident already.
 *
 * Prints the time per call. 32 MiB of heap blocks are written first so that
 * the heap passes farmem's threshold at --threshold 1M and is paged.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

int main(int argc, char **argv)
{
	int mapped = argc == 4 && !strcmp(argv[3], "mapped");
	long calls = argc == 3 + mapped ? atol(argv[2]) : 0, sum = 0;
	int fd = calls > 0 ? open(argv[1], O_RDONLY) : -1;
	char *map = mapped ? mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
	char *bufs[64];
	struct timespec a, b;

	if (fd < 0 || calls <= 0 || map == MAP_FAILED)
		return fprintf(stderr, "usage: alignedread FILE CALLS [mapped]\n"), 2;
	for (int k = 0; k < 512; k++) {
		char *block = malloc(64 << 10);
		if (!block)
			return perror("alignedread: malloc"), 1;
		memset(block, k, 64 << 10);
	}
	for (int k = 0; k < 64; k++)
		if (map)
			bufs[k] = map + k * PAGE;
		else if (posix_memalign((void **)&bufs[k], PAGE, PAGE))
			return perror("alignedread: posix_memalign"), 1;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < calls; i++) {
		if (pread(fd, bufs[i & 63], PAGE, (off_t)(i & 255) * PAGE) != PAGE)
			return perror("alignedread: pread"), 1;
		sum += bufs[i & 63][7];
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.3f us per pread (checksum %ld)\n",
	       ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)calls / 1e3, sum);
	return 0;
}
