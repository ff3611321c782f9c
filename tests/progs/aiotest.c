/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aiotest: Linux native AIO (libaio) reads into paged memory that was just
 * evicted. The kernel does an O_DIRECT read when the request is submitted or
 * later, never inside a call the shim can cover; with faults served in the
 * faulting thread every such read fails with EFAULT. So fault=auto serves
 * faults with handler threads in a process that has libaio loaded
 * (uffd/preload.c). Each 1 MiB read lands in a different 4 MiB part of a
 * paged buffer, after a second paged region larger than the budget has been
 * written over; every byte is checked against the file.
 *
 *   aiotest FILE   (FILE: at least 16 MiB; prints "aiotest: N of 16 reads right")
 */
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1ul << 20)
#define READS 16

int main(int argc, char **argv)
{
	size_t n = 128 * MIB;
	uint8_t *buf, *pressure, *want = malloc(MIB);
	io_context_t ctx = 0;
	int fd, plain, right = 0, rc;

	if (argc != 2) {
		fprintf(stderr, "usage: aiotest FILE\n");
		return 2;
	}
	fd = open(argv[1], O_RDONLY | O_DIRECT);
	plain = open(argv[1], O_RDONLY);
	buf = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pressure = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fd < 0 || plain < 0 || buf == MAP_FAILED || pressure == MAP_FAILED || !want) {
		perror("aiotest: setup");
		return 1;
	}
	memset(buf, 1, n);
	memset(pressure, 2, n); /* under a budget smaller than it, buf's pages leave */
	rc = io_setup(8, &ctx);
	if (rc) {
		fprintf(stderr, "aiotest: io_setup: %s\n", strerror(-rc));
		return 1;
	}
	for (int k = 0; k < READS; k++) {
		uint8_t *at = buf + (size_t)k * 4 * MIB;
		struct iocb cb, *cbs[1] = { &cb };
		struct io_event ev;

		io_prep_pread(&cb, fd, at, MIB, (long long)k * MIB);
		rc = io_submit(ctx, 1, cbs);
		if (rc != 1) {
			fprintf(stderr, "aiotest: io_submit: %s\n", strerror(rc < 0 ? -rc : EIO));
			continue;
		}
		rc = io_getevents(ctx, 1, 1, &ev, NULL);
		if (rc != 1 || (long)ev.res != (long)MIB) {
			fprintf(stderr, "aiotest: read %d: %s\n", k,
				rc != 1 ? "no event" : (long)ev.res < 0 ? strerror(-(int)(long)ev.res) : "short");
			continue;
		}
		if (pread(plain, want, MIB, (off_t)k * MIB) != (ssize_t)MIB) {
			perror("aiotest: pread");
			return 1;
		}
		if (memcmp(at, want, MIB))
			fprintf(stderr, "aiotest: read %d: wrong bytes\n", k);
		else
			right++;
	}
	io_destroy(ctx);
	printf("aiotest: %d of %d reads right\n", right, READS);
	return right != READS;
}
