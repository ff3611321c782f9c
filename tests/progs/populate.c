/* SPDX-License-Identifier: Apache-2.0 */
/*
 * populate: madvise(MADV_POPULATE_READ) and (MADV_POPULATE_WRITE) of a
 * written anonymous mapping, as QEMU's -mem-prealloc and newer JVMs'
 * pretouch do. Paged by SIGBUS, the kernel failed both with EFAULT before
 * the shim took them as the hints they are (uffd/preload.c, madvise_cover).
 *
 *   populate [MiB]   (prints "populate: read 0, write 0, N of N pages right")
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ /* 5.14 */
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

int main(int argc, char **argv)
{
	size_t n = (argc > 1 ? strtoul(argv[1], NULL, 10) : 128) << 20, right = 0;
	char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int rr, rw, er = 0, ew = 0;

	if (a == MAP_FAILED) {
		perror("populate: mmap");
		return 2;
	}
	for (size_t i = 0; i < n; i += 4096)
		a[i] = (char)(i >> 12);
	rr = madvise(a, n, MADV_POPULATE_READ);
	if (rr)
		er = errno;
	rw = madvise(a, n, MADV_POPULATE_WRITE);
	if (rw)
		ew = errno;
	for (size_t i = 0; i < n; i += 4096)
		right += a[i] == (char)(i >> 12);
	printf("populate: read %s, write %s, %zu of %zu pages right\n", rr ? strerror(er) : "0",
	       rw ? strerror(ew) : "0", right, n >> 12);
	return rr || rw || right != n >> 12;
}
