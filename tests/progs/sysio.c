// SPDX-License-Identifier: Apache-2.0
/*
 * System calls that move data into and out of paged memory that has been
 * evicted: the kernel, not the program, touches the pages (copy_to_user and
 * copy_from_user fault on them), so a fault path that serves only the
 * program's own instructions loses them (issue 19; userfaultfd's SIGBUS mode
 * gives the system call EFAULT).
 *
 *   sysio --dir DIR [--size MiB] [--expect-evicted PCT]
 *
 * buf (SIZE MiB) and a pusher (2 x SIZE) are private anonymous mappings, big
 * enough for the preload shim to page. Before each method buf is filled with
 * a pattern of its own and evicted by writing the whole pusher (up to four
 * times, while less than PCT of buf has left); mincore() then tells how much
 * of buf is no longer resident (--expect-evicted fails the run below PCT). Each method then moves data with the kernel:
 *
 *   into buf:   read, pread, preadv, readv, recv, io_uring READ, READV and RECV,
 *               stdio's fread (glibc reads a large request straight into buf)
 *   out of buf: write, send, fwrite (the bytes are read back into plain memory)
 *   fixed:      io_uring READ_FIXED into buf registered as a fixed buffer, or
 *               "registration refused" (farmem refuses paged memory)
 *
 * The transfers start at odd offsets and leave gaps, so partly written pages
 * must keep the bytes that were in memd. Every byte of buf is checked: those
 * the kernel wrote against the file or the peer, the rest against the fill.
 * Prints one line per method and "sysio ok", or what was wrong, exit 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "mix.h"

#define PAGE 4096ul
#define CHUNK (1ul << 20)
#define HEAD 123ul    /* bytes of each chunk that no transfer writes */
#define TAIL 777ul    /* ... and at its end */
#define FILE_SEED 0x5eedf11eull

static size_t size = 64ul << 20;
static unsigned expect_evicted;
static unsigned char *buf, *pusher;
static int fails;


/* Byte off of the pattern with this seed: little-endian words of mix(seed ^ word index). */
static unsigned char pat(uint64_t seed, uint64_t off)
{
	return (unsigned char)(mix(seed ^ (off >> 3)) >> ((off & 7) * 8));
}

static void fill(unsigned char *p, size_t n, uint64_t seed, uint64_t base)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pat(seed, base + i);
}

static void die(const char *what)
{
	fprintf(stderr, "sysio: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void *map(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

/* Percentage of buf's pages that are not resident. */
static unsigned evicted_pct(void)
{
	size_t n = size / PAGE, out = 0;
	unsigned char *vec = malloc(n);

	if (!vec || mincore(buf, size, vec))
		die("mincore");
	for (size_t i = 0; i < n; i++)
		out += !(vec[i] & 1);
	free(vec);
	return (unsigned)(out * 100 / n);
}

/*
 * Fill buf with seed's pattern, then push it out of local memory: the pusher
 * written through, again while too much of buf stays. A pager may keep what
 * was written before a stream over what the stream fetched ahead (farmem
 * lets pages fetched ahead go first, as Linux keeps readahead on its
 * inactive list): one pass left up to 18% of buf resident. The passes after
 * the first go in a scattered order: in order, they would be a loop over
 * more than the budget, whose pages farmem lets go first (loop_evict), and
 * they would push out the pusher, not buf.
 */
static unsigned prepare(uint64_t seed)
{
	size_t pages = 2 * size / PAGE, step = 17;
	unsigned ev = 0;

	for (;;) { /* step and pages coprime: k * step % pages takes every page once */
		size_t a = pages, b = step;
		while (b) {
			size_t t = a % b;
			a = b;
			b = t;
		}
		if (a == 1)
			break;
		step += 2;
	}
	fill(buf, size, seed, 0);
	for (unsigned pass = 0; pass < 4 && (pass == 0 || ev < expect_evicted); pass++) {
		for (size_t k = 0; k < pages; k++) {
			size_t i = (pass ? k * step % pages : k) * PAGE;
			pusher[i] = (unsigned char)(i >> 12 ^ seed ^ pass);
		}
		ev = evicted_pct();
	}
	return ev;
}

/* The chunks a transfer covers: [k * CHUNK + HEAD, (k + 1) * CHUNK - TAIL). */
#define NCHUNK (size / CHUNK)
#define CH_OFF(k) ((k) * CHUNK + HEAD)
#define CH_LEN (CHUNK - HEAD - TAIL)

/*
 * Every byte of buf: in a chunk, the source's pattern at the same offset
 * (file or peer); elsewhere the fill.
 */
static void verify(const char *method, uint64_t seed, uint64_t src_seed, unsigned ev)
{
	size_t bad = 0, first = SIZE_MAX;

	for (size_t k = 0; k < NCHUNK; k++) {
		size_t lo = CH_OFF(k), hi = lo + CH_LEN;
		for (size_t i = k * CHUNK; i < (k + 1) * CHUNK; i++) {
			unsigned char want = i >= lo && i < hi ? pat(src_seed, i) : pat(seed, i);
			if (buf[i] != want) {
				bad++;
				if (first == SIZE_MAX)
					first = i;
			}
		}
	}
	if (ev < expect_evicted) {
		printf("%s: FAILED: only %u%% of the buffer was evicted before the call (want %u%%)\n",
		       method, ev, expect_evicted);
		fails++;
	} else if (bad) {
		printf("%s: FAILED: %zu bytes wrong, the first at offset %zu (evicted %u%% before the call)\n",
		       method, bad, first, ev);
		fails++;
	} else {
		printf("%s: ok (evicted %u%% before the call)\n", method, ev);
	}
	fflush(stdout);
}

static void full(ssize_t got, size_t want, const char *what)
{
	if (got < 0)
		die(what);
	if ((size_t)got != want) {
		fprintf(stderr, "sysio: %s moved %zd bytes of %zu\n", what, got, want);
		exit(1);
	}
}

/* A new file DIR/NAME, read-write; its path in path. */
static int open_scratch(const char *dir, const char *name, char *path, size_t len)
{
	int fd;

	snprintf(path, len, "%s/%s", dir, name);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die(path);
	return fd;
}

/* --- a peer that sends the file pattern, or receives and checks ---------------- */

struct peer {
	int fd;
	uint64_t seed;
	size_t bad;
};

static void *send_pattern(void *v)
{
	struct peer *p = v;
	unsigned char *tmp = malloc(CH_LEN); /* small: plain memory, never paged */

	for (size_t k = 0; k < NCHUNK; k++) {
		fill(tmp, CH_LEN, p->seed, CH_OFF(k));
		for (size_t done = 0; done < CH_LEN;) {
			ssize_t n = send(p->fd, tmp + done, CH_LEN - done, 0);
			if (n < 0)
				die("send");
			done += (size_t)n;
		}
	}
	free(tmp);
	return NULL;
}

static void *recv_check(void *v)
{
	struct peer *p = v;
	unsigned char *tmp = malloc(CH_LEN);

	for (size_t k = 0; k < NCHUNK; k++) {
		full(recv(p->fd, tmp, CH_LEN, MSG_WAITALL), CH_LEN, "recv (peer)");
		for (size_t i = 0; i < CH_LEN; i++)
			p->bad += tmp[i] != pat(p->seed, CH_OFF(k) + i);
	}
	free(tmp);
	return NULL;
}

/* A socketpair with fn (send_pattern or recv_check) on the far end; returns the near end. */
static int start_peer(struct peer *p, void *(*fn)(void *), pthread_t *th)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair");
	p->fd = sv[1];
	if (pthread_create(th, NULL, fn, p))
		die("pthread_create");
	return sv[0];
}

static void stop_peer(struct peer *p, int near, pthread_t th)
{
	pthread_join(th, NULL);
	close(near);
	close(p->fd);
}

/* --- the methods ------------------------------------------------------------ */

static void by_read(int fd, int positional)
{
	uint64_t seed = positional ? 2 : 1;
	unsigned ev = prepare(seed);

	for (size_t k = 0; k < NCHUNK; k++) {
		if (positional) {
			full(pread(fd, buf + CH_OFF(k), CH_LEN, (off_t)CH_OFF(k)), CH_LEN, "pread");
		} else {
			if (lseek(fd, (off_t)CH_OFF(k), SEEK_SET) < 0)
				die("lseek");
			full(read(fd, buf + CH_OFF(k), CH_LEN), CH_LEN, "read");
		}
	}
	verify(positional ? "pread" : "read", seed, FILE_SEED, ev);
}

/* preadv: each chunk in one call, as two iovecs split at an odd offset. */
static void by_preadv(int fd)
{
	unsigned ev = prepare(3);
	size_t half = CH_LEN / 2 + 5;

	for (size_t k = 0; k < NCHUNK; k++) {
		struct iovec iov[2] = {{buf + CH_OFF(k), half}, {buf + CH_OFF(k) + half, CH_LEN - half}};
		full(preadv(fd, iov, 2, (off_t)CH_OFF(k)), CH_LEN, "preadv");
	}
	verify("preadv", 3, FILE_SEED, ev);
}

/*
 * readv over many iovecs in one call needs the source contiguous: the file
 * holds the pattern at the chunk offsets, so a second file, packed, is read
 * with one readv per eight chunks.
 */
static void by_readv_packed(const char *dir)
{
	char path[4096];
	unsigned char *tmp = malloc(CH_LEN);
	struct iovec iov[8];
	unsigned ev;
	int fd;

	fd = open_scratch(dir, "packed", path, sizeof(path));
	for (size_t k = 0; k < NCHUNK; k++) {
		fill(tmp, CH_LEN, FILE_SEED, CH_OFF(k));
		full(write(fd, tmp, CH_LEN), CH_LEN, "write packed");
	}
	free(tmp);
	if (lseek(fd, 0, SEEK_SET) < 0)
		die("lseek");
	ev = prepare(4);
	for (size_t k = 0; k < NCHUNK;) {
		int n = 0;
		for (; n < 8 && k + (size_t)n < NCHUNK; n++)
			iov[n] = (struct iovec){buf + CH_OFF(k + n), CH_LEN};
		full(readv(fd, iov, n), (size_t)n * CH_LEN, "readv");
		k += (size_t)n;
	}
	close(fd);
	unlink(path);
	verify("readv (8 iovecs a call)", 4, FILE_SEED, ev);
}

static void by_recv(void)
{
	pthread_t th;
	struct peer p = {.seed = FILE_SEED};
	unsigned ev = prepare(5);
	int fd = start_peer(&p, send_pattern, &th);

	for (size_t k = 0; k < NCHUNK; k++)
		full(recv(fd, buf + CH_OFF(k), CH_LEN, MSG_WAITALL), CH_LEN, "recv");
	stop_peer(&p, fd, th);
	verify("recv", 5, FILE_SEED, ev);
}

/* io_uring: every chunk in flight at once (READ, READV or RECV), then all completions. */
static void by_uring(int fd, int op)
{
	static const char *const names[] = {"io_uring READ", "io_uring READV", "io_uring RECV"};
	uint64_t seed = 6 + (uint64_t)op;
	struct io_uring ring;
	struct iovec *iov = calloc(NCHUNK, sizeof(*iov));
	int sock = -1;
	pthread_t th;
	struct peer p = {.seed = FILE_SEED};
	unsigned ev, depth = 64;
	int rc;

	if (!iov)
		die("calloc");
	rc = io_uring_queue_init(depth, &ring, 0);
	if (rc < 0) {
		errno = -rc;
		die("io_uring_queue_init");
	}
	ev = prepare(seed);
	if (op == 2)
		sock = start_peer(&p, send_pattern, &th);
	for (size_t k = 0; k < NCHUNK;) {
		/* A stream is read in order: one RECV at a time; file reads go in batches. */
		size_t batch = op == 2 ? 1 : depth;
		size_t n = 0;
		for (; n < batch && k + n < NCHUNK; n++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			size_t c = k + n;
			iov[c] = (struct iovec){buf + CH_OFF(c), CH_LEN};
			if (op == 0)
				io_uring_prep_read(sqe, fd, buf + CH_OFF(c), CH_LEN, CH_OFF(c));
			else if (op == 1)
				io_uring_prep_readv(sqe, fd, &iov[c], 1, CH_OFF(c));
			else
				io_uring_prep_recv(sqe, sock, buf + CH_OFF(c), CH_LEN, MSG_WAITALL);
		}
		rc = io_uring_submit_and_wait(&ring, (unsigned)n);
		if (rc < 0) {
			errno = -rc;
			die("io_uring_submit_and_wait");
		}
		for (size_t j = 0; j < n; j++) {
			struct io_uring_cqe *cqe;
			rc = io_uring_wait_cqe(&ring, &cqe);
			if (rc < 0) {
				errno = -rc;
				die("io_uring_wait_cqe");
			}
			if (cqe->res < 0) {
				errno = -cqe->res;
				die(names[op]);
			}
			full(cqe->res, CH_LEN, names[op]);
			io_uring_cqe_seen(&ring, cqe);
		}
		k += n;
	}
	if (op == 2)
		stop_peer(&p, sock, th);
	io_uring_queue_exit(&ring);
	free(iov);
	verify(names[op], seed, FILE_SEED, ev);
}

/*
 * io_uring READ_FIXED into buf registered as a fixed buffer. The kernel pins a
 * registered buffer and writes the pinned pages directly: farmem refuses to
 * register paged memory (a pinned page that the pager evicted would take the
 * I/O's bytes with it). Refused is a result, not a failure; wrong bytes are.
 */
static void by_uring_fixed(int fd)
{
	struct io_uring ring;
	struct iovec iov = {buf, size};
	unsigned ev;
	int rc;

	rc = io_uring_queue_init(8, &ring, 0);
	if (rc < 0) {
		errno = -rc;
		die("io_uring_queue_init");
	}
	fill(buf, size, 11, 0);
	rc = io_uring_register_buffers(&ring, &iov, 1);
	if (rc < 0) {
		printf("io_uring READ_FIXED: registration refused (%s)\n", strerror(-rc));
		io_uring_queue_exit(&ring);
		return;
	}
	ev = prepare(11);
	for (size_t k = 0; k < NCHUNK; k++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		struct io_uring_cqe *cqe;
		io_uring_prep_read_fixed(sqe, fd, buf + CH_OFF(k), CH_LEN, CH_OFF(k), 0);
		rc = io_uring_submit_and_wait(&ring, 1);
		if (rc >= 0)
			rc = io_uring_wait_cqe(&ring, &cqe);
		if (rc < 0) {
			errno = -rc;
			die("io_uring READ_FIXED");
		}
		full(cqe->res < 0 ? (errno = -cqe->res, -1) : cqe->res, CH_LEN, "io_uring READ_FIXED");
		io_uring_cqe_seen(&ring, cqe);
	}
	io_uring_unregister_buffers(&ring);
	io_uring_queue_exit(&ring);
	verify("io_uring READ_FIXED", 11, FILE_SEED, ev);
}

/* stdio: a request larger than the stream's buffer goes straight from the file into buf. */
static void by_fread(int fd)
{
	unsigned ev = prepare(12);
	FILE *f = fdopen(dup(fd), "r");

	if (!f)
		die("fdopen");
	for (size_t k = 0; k < NCHUNK; k++) {
		if (fseek(f, (long)CH_OFF(k), SEEK_SET))
			die("fseek");
		full((ssize_t)fread(buf + CH_OFF(k), 1, CH_LEN, f), CH_LEN, "fread");
	}
	fclose(f);
	verify("fread", 12, FILE_SEED, ev);
}

/*
 * Out of evicted memory to a file, read back elsewhere: write(), or stdio's
 * fwrite (which bypasses the stream's buffer for a request this large).
 */
static void to_file(const char *dir, const char *method, uint64_t seed, int stdio)
{
	char path[4096];
	unsigned char *tmp = malloc(CH_LEN);
	size_t bad = 0;
	unsigned ev;
	FILE *f = NULL;
	int fd;

	fd = open_scratch(dir, method, path, sizeof(path));
	if (stdio && !(f = fdopen(dup(fd), "w")))
		die("fdopen");
	if (!tmp)
		die("malloc");
	ev = prepare(seed);
	for (size_t k = 0; k < NCHUNK; k++)
		full(stdio ? (ssize_t)fwrite(buf + CH_OFF(k), 1, CH_LEN, f) : write(fd, buf + CH_OFF(k), CH_LEN),
		     CH_LEN, method);
	if (f && fclose(f))
		die("fclose");
	for (size_t k = 0; k < NCHUNK; k++) {
		full(pread(fd, tmp, CH_LEN, (off_t)(k * CH_LEN)), CH_LEN, "pread back");
		for (size_t i = 0; i < CH_LEN; i++)
			bad += tmp[i] != pat(seed, CH_OFF(k) + i);
	}
	close(fd);
	unlink(path);
	free(tmp);
	/* buf itself was only read: it must still hold the fill everywhere. */
	if (bad) {
		printf("%s: FAILED: %zu bytes wrong in the file (evicted %u%% before the call)\n", method, bad, ev);
		fails++;
		return;
	}
	verify(method, seed, seed, ev);
}

static void by_send(void)
{
	pthread_t th;
	struct peer p = {.seed = 10};
	unsigned ev = prepare(10);
	int fd = start_peer(&p, recv_check, &th);

	for (size_t k = 0; k < NCHUNK; k++)
		full(send(fd, buf + CH_OFF(k), CH_LEN, 0), CH_LEN, "send");
	stop_peer(&p, fd, th);
	if (p.bad) {
		printf("send: FAILED: the peer received %zu wrong bytes (evicted %u%% before the call)\n", p.bad, ev);
		fails++;
		return;
	}
	verify("send", 10, 10, ev);
}

int main(int argc, char **argv)
{
	const char *dir = NULL;
	char path[4096];
	unsigned char *tmp;
	int fd;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--dir"))
			dir = argv[i + 1];
		else if (!strcmp(argv[i], "--size"))
			size = strtoul(argv[i + 1], NULL, 0) << 20;
		else if (!strcmp(argv[i], "--expect-evicted"))
			expect_evicted = (unsigned)strtoul(argv[i + 1], NULL, 0);
	}
	if (!dir || size < CHUNK) {
		fprintf(stderr, "usage: sysio --dir DIR [--size MiB] [--expect-evicted PCT]\n");
		return 2;
	}
	buf = map(size);
	pusher = map(2 * size);

	/* The source file: the file pattern at every offset (written from plain memory). */
	fd = open_scratch(dir, "src", path, sizeof(path));
	tmp = malloc(CHUNK);
	for (size_t off = 0; off < size; off += CHUNK) {
		fill(tmp, CHUNK, FILE_SEED, off);
		full(write(fd, tmp, CHUNK), CHUNK, "write src");
	}
	free(tmp);

	by_read(fd, 0);
	by_read(fd, 1);
	by_preadv(fd);
	by_readv_packed(dir);
	by_recv();
	by_uring(fd, 0);
	by_uring(fd, 1);
	by_uring(fd, 2);
	by_uring_fixed(fd);
	by_fread(fd);
	to_file(dir, "write", 9, 0);
	to_file(dir, "fwrite", 13, 1);
	by_send();
	close(fd);
	unlink(path);
	if (fails) {
		printf("sysio: %d methods failed\n", fails);
		return 1;
	}
	printf("sysio ok\n");
	return 0;
}
