/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vecio: a file written and read back with vectors of buffers larger in all
 * than the budget (writev, pwritev, pwritev2; readv, preadv, preadv2), each
 * call over all of a MiB-long mapping, as N buffers of MiB/N each, every
 * second one of the mapping's 2N slots (so that the buffers are scattered).
 * A regular file's call moves all it is asked for: a short count is a
 * failure (a reader takes it for the end of the file). Every page read back
 * is checked.
 *
 *   vecio FILE MiB N [direct]   (prints "vecio: ok", or what went wrong)
 *
 * direct: the file is opened O_DIRECT (the buffers are page-aligned).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096ul

static uint64_t word(size_t page, unsigned round)
{
	return (page + 1) * 0x9e3779b97f4a7c15ull ^ round;
}

static void fill(struct iovec *iov, int n, unsigned round)
{
	size_t p = 0;

	for (int k = 0; k < n; k++)
		for (size_t o = 0; o < iov[k].iov_len; o += PAGE, p++) {
			uint64_t *w = (uint64_t *)((char *)iov[k].iov_base + o);
			w[0] = word(p, round);
			w[PAGE / 8 - 1] = ~w[0];
		}
}

static int check(struct iovec *iov, int n, unsigned round, const char *how)
{
	size_t p = 0;

	for (int k = 0; k < n; k++)
		for (size_t o = 0; o < iov[k].iov_len; o += PAGE, p++) {
			uint64_t *w = (uint64_t *)((char *)iov[k].iov_base + o);
			if (w[0] != word(p, round) || w[PAGE / 8 - 1] != ~w[0])
				return fprintf(stderr, "vecio: %s: page %zu reads %#lx\n", how, p, (unsigned long)w[0]), 1;
		}
	return 0;
}

static int whole(ssize_t r, size_t len, const char *how)
{
	if (r == (ssize_t)len)
		return 0;
	return fprintf(stderr, "vecio: %s returned %zd of %zu (%s)\n", how, r, len, r < 0 ? strerror(errno) : "short"), 1;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 3 ? strtoul(argv[2], NULL, 10) : 0, len = mib << 20, each;
	int n = argc > 3 ? atoi(argv[3]) : 0, direct = argc > 4 && !strcmp(argv[4], "direct"), fd;
	struct iovec *iov;
	uint8_t *m;

	if (!mib || n <= 0 || n > 1024 || len % ((size_t)n * PAGE))
		return fprintf(stderr, "usage: vecio FILE MiB N(up to 1024, MiB/N pages) [direct]\n"), 2;
	each = len / (size_t)n;
	m = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	iov = calloc((size_t)n, sizeof(*iov));
	fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0600);
	if (m == MAP_FAILED || !iov || fd < 0)
		return perror("vecio: mmap, calloc or open"), 1;
	for (int k = 0; k < n; k++)
		iov[k] = (struct iovec){ m + 2 * (size_t)k * each, each };

	/* Three rounds, each written one way and read back another. */
	fill(iov, n, 1);
	if (whole(writev(fd, iov, n), len, "writev"))
		return 1;
	memset(m, 0, 2 * len);
	if (whole(preadv(fd, iov, n, 0), len, "preadv") || check(iov, n, 1, "preadv after writev"))
		return 1;
	fill(iov, n, 2);
	if (whole(pwritev(fd, iov, n, 0), len, "pwritev"))
		return 1;
	memset(m, 0, 2 * len);
	if (lseek(fd, 0, SEEK_SET) || whole(readv(fd, iov, n), len, "readv") || check(iov, n, 2, "readv after pwritev"))
		return 1;
	fill(iov, n, 3);
	if (whole(pwritev2(fd, iov, n, 0, 0), len, "pwritev2"))
		return 1;
	memset(m, 0, 2 * len);
	if (whole(preadv2(fd, iov, n, 0, 0), len, "preadv2") || check(iov, n, 3, "preadv2 after pwritev2"))
		return 1;
	/* The file's own offset (-1) goes on from piece to piece. */
	if (lseek(fd, 0, SEEK_SET) || whole(preadv2(fd, iov, n, -1, 0), len, "preadv2 at the file's offset") ||
	    lseek(fd, 0, SEEK_CUR) != (off_t)len || check(iov, n, 3, "preadv2 at the file's offset"))
		return 1;
	close(fd);
	unlink(argv[1]);
	printf("vecio: ok\n");
	return 0;
}
