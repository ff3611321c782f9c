/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vecio: a file written and read back with vectors of buffers larger in all
 * than the budget (writev, pwritev, pwritev2; readv, preadv, preadv2; and
 * their *64 names), each
 * call over all of a MiB-long mapping, as N buffers of MiB/N each, every
 * second one of the mapping's 2N slots (so that the buffers are scattered).
 * A regular file's call moves all it is asked for: a short count is a
 * failure (a reader takes it for the end of the file). Every page read back
 * is checked.
 *
 *   vecio FILE MiB N [direct|stream]   (prints "vecio: ok", or what went wrong)
 *
 * direct: the file is opened O_DIRECT (the buffers are page-aligned).
 * stream: besides, the vector goes to a pipe by writev and to a stream
 * socket by sendmsg, whose reader (a thread, into memory farmem does not
 * page) checks every page and the count.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
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

/* The calls, the *64 names among them: what a program built with _FILE_OFFSET_BITS=64 calls (stress-ng's hdd stressor). */
enum way { WRITEV, PWRITEV, PWRITEV2, PWRITEV64, PWRITEV64V2, READV, PREADV, PREADV2, PREADV64, PREADV64V2 };
static const char *const way_name[] = { "writev", "pwritev", "pwritev2", "pwritev64", "pwritev64v2",
					"readv", "preadv", "preadv2", "preadv64", "preadv64v2" };
#define ROUNDS 5
static const enum way rounds[ROUNDS][2] = {
	{ WRITEV, PREADV }, { PWRITEV, READV }, { PWRITEV2, PREADV2 }, { PWRITEV64V2, PREADV64 }, { PWRITEV64, PREADV64V2 },
};

/* The whole file, from offset 0, one call. */
static ssize_t vec_call(enum way w, int fd, struct iovec *iov, int n)
{
	if ((w == WRITEV || w == READV) && lseek(fd, 0, SEEK_SET))
		return -1;
	switch (w) {
	case WRITEV:
		return writev(fd, iov, n);
	case PWRITEV:
		return pwritev(fd, iov, n, 0);
	case PWRITEV2:
		return pwritev2(fd, iov, n, 0, 0);
	case PWRITEV64:
		return pwritev64(fd, iov, n, 0);
	case PWRITEV64V2:
		return pwritev64v2(fd, iov, n, 0, 0);
	case READV:
		return readv(fd, iov, n);
	case PREADV:
		return preadv(fd, iov, n, 0);
	case PREADV2:
		return preadv2(fd, iov, n, 0, 0);
	case PREADV64:
		return preadv64(fd, iov, n, 0);
	case PREADV64V2:
		return preadv64v2(fd, iov, n, 0, 0);
	}
	return -1;
}

struct reader {
	int fd;
	size_t len;
	unsigned round;
	int bad;
};

/* Reads a stream of len bytes a page at a time and checks each page. */
static void *read_stream(void *arg)
{
	struct reader *rd = arg;
	static uint64_t page[PAGE / 8];
	size_t got = 0;

	for (size_t p = 0; !rd->bad && got < rd->len; p++) {
		size_t have = 0;
		while (have < PAGE) {
			ssize_t r = read(rd->fd, (char *)page + have, PAGE - have);
			if (r <= 0) {
				fprintf(stderr, "vecio: the stream ended at %zu of %zu\n", got + have, rd->len);
				rd->bad = 1;
				return NULL;
			}
			have += (size_t)r;
		}
		got += PAGE;
		if (page[0] != word(p, rd->round) || page[PAGE / 8 - 1] != ~page[0]) {
			fprintf(stderr, "vecio: the stream's page %zu reads %#lx\n", p, (unsigned long)page[0]);
			rd->bad = 1;
		}
	}
	return NULL;
}

/* The vector through a pipe (writev) and a stream socket (sendmsg), each call one whole count. */
static int streams(struct iovec *iov, int n, size_t len)
{
	for (int way = 0; way < 2; way++) {
		int fd[2];
		struct reader rd = { .len = len, .round = ROUNDS + 1 + (unsigned)way };
		struct msghdr h = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		pthread_t t;
		ssize_t r;

		if (way ? socketpair(AF_UNIX, SOCK_STREAM, 0, fd) : pipe(fd))
			return perror("vecio: pipe or socketpair"), 1;
		rd.fd = fd[0];
		fill(iov, n, rd.round);
		if (pthread_create(&t, NULL, read_stream, &rd))
			return fprintf(stderr, "vecio: no reader\n"), 1;
		r = way ? sendmsg(fd[1], &h, 0) : writev(fd[1], iov, n);
		close(fd[1]);
		pthread_join(t, NULL);
		close(fd[0]);
		if (whole(r, len, way ? "sendmsg to a stream socket" : "writev to a pipe") || rd.bad)
			return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 3 ? strtoul(argv[2], NULL, 10) : 0, len = mib << 20, each;
	int n = argc > 3 ? atoi(argv[3]) : 0, direct = argc > 4 && !strcmp(argv[4], "direct"), fd;
	int stream = argc > 4 && !strcmp(argv[4], "stream");
	struct iovec *iov;
	uint8_t *m;

	if (!mib || n <= 0 || n > 1024 || len % ((size_t)n * PAGE))
		return fprintf(stderr, "usage: vecio FILE MiB N(up to 1024, MiB/N pages) [direct|stream]\n"), 2;
	each = len / (size_t)n;
	m = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	iov = calloc((size_t)n, sizeof(*iov));
	fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0600);
	if (m == MAP_FAILED || !iov || fd < 0)
		return perror("vecio: mmap, calloc or open"), 1;
	for (int k = 0; k < n; k++)
		iov[k] = (struct iovec){ m + 2 * (size_t)k * each, each };

	/* Rounds, each written one way and read back another. */
	for (unsigned r = 0; r < sizeof(rounds) / sizeof(rounds[0]); r++) {
		char what[64];
		fill(iov, n, r + 1);
		if (whole(vec_call(rounds[r][0], fd, iov, n), len, way_name[rounds[r][0]]))
			return 1;
		memset(m, 0, 2 * len);
		snprintf(what, sizeof(what), "%s after %s", way_name[rounds[r][1]], way_name[rounds[r][0]]);
		if (whole(vec_call(rounds[r][1], fd, iov, n), len, what) || check(iov, n, r + 1, what))
			return 1;
	}
	/* The file's own offset (-1) goes on from piece to piece. */
	if (lseek(fd, 0, SEEK_SET) || whole(preadv2(fd, iov, n, -1, 0), len, "preadv2 at the file's offset") ||
	    lseek(fd, 0, SEEK_CUR) != (off_t)len || check(iov, n, ROUNDS, "preadv2 at the file's offset"))
		return 1;
	close(fd);
	unlink(argv[1]);
	if (stream && streams(iov, n, len))
		return 1;
	printf("vecio: ok\n");
	return 0;
}
