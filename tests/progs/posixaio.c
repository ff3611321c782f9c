/* SPDX-License-Identifier: Apache-2.0 */
/*
 * posixaio: a file written and read back through POSIX AIO (glibc's
 * aio_write, aio_read, lio_listio), whose requests glibc does later in a
 * thread of its own, with every signal blocked and with system calls no
 * cover of the shim sees. The buffers are larger than the budget, and the
 * aiocbs lie in paged memory too. Every page read back is checked.
 *
 *   posixaio FILE MiB [direct] [heap] [sync]   (prints "posixaio: ok", or what went wrong)
 *
 * direct: O_DIRECT, the device writes a read's pages by DMA, past the page
 * table. heap: the buffers are glibc's heap, blocks of 64 KiB (below
 * malloc's mmap threshold). sync: the reads are readv calls of 16 MiB each
 * instead of requests (a read pins its first pages before the last come in),
 * and the aiocbs are not paged.
 */
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096ul
#define BLOCK (64ul << 10)
#define REQ (1ul << 20) /* a request's bytes */
#define DEPTH 16        /* requests in flight */

static uint8_t **blocks; /* heap: the blocks; else NULL, and the buffer is one block at base */
static uint8_t *base;

static uint8_t *at(size_t off)
{
	return blocks ? blocks[off / BLOCK] + off % BLOCK : base + off;
}

/* A request's pieces: one, or its heap blocks (lio_listio). */
static size_t pieces(size_t off, size_t len, size_t *piece)
{
	*piece = blocks ? BLOCK : len;
	(void)off;
	return len / *piece;
}

static uint64_t word(size_t page, unsigned round)
{
	return (page + 1) * 0x9e3779b97f4a7c15ull ^ round;
}

static void fill(size_t off, size_t len, unsigned round)
{
	for (size_t o = off; o < off + len; o += PAGE) {
		uint64_t *w = (uint64_t *)at(o);
		w[0] = word(o / PAGE, round);
		w[PAGE / 8 - 1] = ~w[0];
	}
}

static int check(size_t off, size_t len, unsigned round)
{
	for (size_t o = off; o < off + len; o += PAGE) {
		uint64_t *w = (uint64_t *)at(o);
		if (w[0] != word(o / PAGE, round) || w[PAGE / 8 - 1] != ~word(o / PAGE, round)) {
			printf("posixaio: page %zu reads %#llx, not %#llx\n", o / PAGE, (unsigned long long)w[0],
			       (unsigned long long)word(o / PAGE, round));
			return 1;
		}
	}
	return 0;
}

static struct aiocb *cbs; /* DEPTH * (REQ / BLOCK) of them, in paged memory */

static void wait_all(struct aiocb **list, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		const struct aiocb *one[1] = { list[k] };
		int e;
		while ((e = aio_error(list[k])) == EINPROGRESS)
			aio_suspend(one, 1, NULL);
		ssize_t r = aio_return(list[k]);
		if (e || r != (ssize_t)list[k]->aio_nbytes) {
			printf("posixaio: a request of %zu bytes at %lld: %zd (%s)\n", list[k]->aio_nbytes,
			       (long long)list[k]->aio_offset, r, strerror(e));
			exit(1);
		}
	}
}

/* DEPTH requests of REQ bytes from off: each one aiocb, or (heap) one lio_listio of its blocks. */
static void requests(int fd, size_t off, int read)
{
	struct aiocb *list[DEPTH * (REQ / BLOCK)];
	size_t n = 0;

	for (size_t q = 0; q < DEPTH; q++) {
		size_t o = off + q * REQ, piece, np = pieces(o, REQ, &piece);
		struct aiocb **mine = list + n;
		for (size_t k = 0; k < np; k++, n++) {
			struct aiocb *cb = &cbs[n];
			memset(cb, 0, sizeof(*cb));
			cb->aio_fildes = fd;
			cb->aio_buf = at(o + k * piece);
			cb->aio_nbytes = piece;
			cb->aio_offset = (off_t)(o + k * piece);
			cb->aio_lio_opcode = read ? LIO_READ : LIO_WRITE;
			list[n] = cb;
		}
		if (np > 1) {
			if (lio_listio(LIO_NOWAIT, mine, (int)np, NULL)) {
				printf("posixaio: lio_listio: %s\n", strerror(errno));
				exit(1);
			}
		} else if ((read ? aio_read(mine[0]) : aio_write(mine[0]))) {
			printf("posixaio: aio_%s: %s\n", read ? "read" : "write", strerror(errno));
			exit(1);
		}
	}
	wait_all(list, n);
}

static void sync_read(int fd, size_t off, size_t len)
{
	struct iovec v[256];
	size_t piece, n = pieces(off, len, &piece);

	for (size_t k = 0; k < n; k++)
		v[k] = (struct iovec){ at(off + k * piece), piece };
	if (preadv(fd, v, (int)n, (off_t)off) != (ssize_t)len) {
		printf("posixaio: preadv at %zu: %s\n", off, strerror(errno));
		exit(1);
	}
}

int main(int argc, char **argv)
{
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 0) : 64, len = mib << 20;
	int direct = 0, sync = 0, fd;

	for (int k = 3; k < argc; k++) {
		direct |= !strcmp(argv[k], "direct");
		sync |= !strcmp(argv[k], "sync");
		if (!strcmp(argv[k], "heap")) {
			blocks = malloc(len / BLOCK * sizeof(*blocks));
			for (size_t b = 0; b < len / BLOCK; b++)
				if (!blocks || posix_memalign((void **)&blocks[b], PAGE, BLOCK))
					return printf("posixaio: out of memory\n"), 1;
		}
	}
	if (argc < 2 || !mib || len % (DEPTH * REQ))
		return fprintf(stderr, "usage: posixaio FILE MiB(a multiple of 16) [direct] [heap] [sync]\n"), 2;
	if (!blocks && posix_memalign((void **)&base, PAGE, len))
		return printf("posixaio: out of memory\n"), 1;
	/*
	 * 4 MiB of aiocbs: a block of its own, paged (the threshold is 1 MiB in
	 * the tests). With sync, static ones: the reads go round them, and only
	 * the buffers' pins are tried.
	 */
	static struct aiocb unpaged[DEPTH * (REQ / BLOCK)];
	if (!(cbs = sync ? unpaged : calloc(4 << 20, 1)))
		return printf("posixaio: out of memory\n"), 1;
	fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0600);
	if (fd < 0)
		return printf("posixaio: %s: %s\n", argv[1], strerror(errno)), 1;
	fill(0, len, 1);
	for (size_t off = 0; off < len; off += DEPTH * REQ)
		requests(fd, off, 0);
	/* The buffer is rewritten before it is read back into: a page left unread keeps round 2. */
	fill(0, len, 2);
	for (size_t off = 0; off < len; off += DEPTH * REQ) {
		if (sync)
			sync_read(fd, off, DEPTH * REQ);
		else
			requests(fd, off, 1);
	}
	if (check(0, len, 1))
		return 1;
	close(fd);
	unlink(argv[1]);
	printf("posixaio: ok\n");
	return 0;
}
