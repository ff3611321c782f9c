// SPDX-License-Identifier: Apache-2.0
/*
 * move_raw: the kernel's own cost of UFFDIO_MOVE, with nothing around it.
 * Moves one run of N pages back and forth between two registered regions
 * and reports µs per call next to memmove of the same run (warm caches).
 * libswapva's per-call cost is measured against this (bench/RESULTS.md).
 *   move_raw [PAGES [ITERATIONS]]
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "uffd_compat.h"

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
	int pages = argc > 1 ? atoi(argv[1]) : 64, iters = argc > 2 ? atoi(argv[2]) : 2000;
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MOVE };
	size_t len = (size_t)pages * 4096;
	char *a, *b, *src, *dst;
	int dev, fd;
	double t0, t1, t2;

	if (pages < 1 || iters < 2) {
		fprintf(stderr, "usage: move_raw [PAGES [ITERATIONS]]\n");
		return 2;
	}
	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	fd = dev >= 0 ? ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC) : -1;
	if (fd < 0 || ioctl(fd, UFFDIO_API, &api) || !(api.features & UFFD_FEATURE_MOVE)) {
		fprintf(stderr, "move_raw: no userfaultfd with UFFDIO_MOVE here\n");
		return 1;
	}
	a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED || b == MAP_FAILED)
		return 1;
	madvise(a, len, MADV_NOHUGEPAGE);
	madvise(b, len, MADV_NOHUGEPAGE);
	memset(a, 1, len); /* before registering: nothing serves faults here */
	for (char *r = a; r; r = r == a ? b : NULL) {
		struct uffdio_register reg = { .range = { (uintptr_t)r, len }, .mode = UFFDIO_REGISTER_MODE_MISSING };
		if (ioctl(fd, UFFDIO_REGISTER, &reg))
			return 1;
	}
	src = a;
	dst = b;
	t0 = now_us();
	for (int i = 0; i < iters; i++) {
		struct uffdio_move m = { .dst = (uintptr_t)dst, .src = (uintptr_t)src, .len = len };
		char *x = src;
		if (ioctl(fd, UFFDIO_MOVE, &m)) {
			perror("UFFDIO_MOVE");
			return 1;
		}
		src = dst;
		dst = x;
	}
	t1 = now_us();
	for (char *r = a; r; r = r == a ? b : NULL) {
		struct uffdio_range ur = { (uintptr_t)r, len };
		ioctl(fd, UFFDIO_UNREGISTER, &ur);
	}
	memset(b, 2, len);
	t2 = now_us();
	for (int i = 0; i < iters; i++)
		memmove(i & 1 ? a : b, i & 1 ? b : a, len);
	printf("{\"pages\": %d, \"uffdio_move_us\": %.2f, \"memmove_us\": %.2f}\n", pages,
	       (t1 - t0) / iters, (now_us() - t2) / iters);
	return 0;
}
