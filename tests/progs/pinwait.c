/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pinwait: a server's shape. THREADS threads sleep in read() or recv() on a
 * socket, each into a page-aligned 4 KiB buffer in glibc's heap (a region the
 * kernel waits for), as a thread pool waiting for requests does. Meanwhile
 * the main thread writes MiB of paged memory to a file and reads it back
 * with pread, 1 MiB at a time, past the budget, and checks every page. Then
 * each sleeper gets a message and checks it.
 *
 *   pinwait FILE MiB THREADS [mapped]   (prints "pinwait: ok", or what went wrong)
 *
 * mapped: the sleepers' buffers are pages of a mapping of their own, paged
 * with faults raised as SIGBUS, and they read a pipe (which keeps its bytes
 * for a read that met an evicted page, where a socket's message would be
 * dropped): each sleeper holds a pin, as it must, and past MAX_PINS the
 * main thread's calls find the table full.
 *
 * Under fault=signal a sleeper's buffer is shaped like an O_DIRECT read's;
 * before session 49 each took one of the pager's pin slots for as long as it
 * slept, and past MAX_PINS (then 1024) sleepers the main thread's calls found the
 * table full (pins_refused in the summary): their buffers, made resident but
 * not kept, left again under the call, and pwrite returned short.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAGE 4096ul
#define CHUNK (1ul << 20)

static int sock[2];
static atomic_int asleep;
static uint64_t **bufs;
static int mapped;

static uint64_t word(size_t page, uint64_t salt)
{
	return (page + 1) * 0x9e3779b97f4a7c15ull ^ salt;
}

static void *sleeper(void *arg)
{
	uintptr_t k = (uintptr_t)arg;
	uint64_t *buf = bufs[k];
	ssize_t n;

	atomic_fetch_add(&asleep, 1);
	/* One message each (SOCK_SEQPACKET): half through read, half through recv. */
	n = k & 1 && !mapped ? recv(sock[1], buf, PAGE, 0) : read(sock[1], buf, PAGE);
	if (n != (ssize_t)PAGE || buf[1] != word(buf[0], 7) || buf[PAGE / 8 - 1] != ~buf[1]) {
		fprintf(stderr, "pinwait: sleeper %lu got %zd bytes, message %lu malformed\n", (unsigned long)k, n,
			(unsigned long)buf[0]);
		return (void *)1;
	}
	return NULL;
}

static int file_round(const char *path, size_t mib)
{
	size_t len = mib << 20;
	uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);

	if (m == MAP_FAILED || fd < 0)
		return perror("pinwait: mmap or open"), 1;
	for (size_t p = 0; p < len / PAGE; p++) {
		uint64_t *w = (uint64_t *)(m + p * PAGE);
		w[0] = word(p, 1);
		w[PAGE / 8 - 1] = ~w[0];
	}
	/* A regular file's pwrite and pread move all they are asked for: anything short is a failure. */
	for (size_t off = 0; off < len; off += CHUNK) {
		ssize_t n = pwrite(fd, m + off, CHUNK, (off_t)off);
		if (n != (ssize_t)CHUNK)
			return fprintf(stderr, "pinwait: pwrite at %zu returned %zd (%s)\n", off, n,
				       n < 0 ? strerror(errno) : "short"), 1;
	}
	memset(m, 0, len);
	for (size_t off = 0; off < len; off += CHUNK) {
		ssize_t n = pread(fd, m + off, CHUNK, (off_t)off);
		if (n != (ssize_t)CHUNK)
			return fprintf(stderr, "pinwait: pread at %zu returned %zd (%s)\n", off, n,
				       n < 0 ? strerror(errno) : "short"), 1;
	}
	for (size_t p = 0; p < len / PAGE; p++) {
		uint64_t *w = (uint64_t *)(m + p * PAGE);
		if (w[0] != word(p, 1) || w[PAGE / 8 - 1] != ~w[0])
			return fprintf(stderr, "pinwait: page %zu reads %#lx\n", p, (unsigned long)w[0]), 1;
	}
	close(fd);
	unlink(path);
	return munmap(m, len);
}

int main(int argc, char **argv)
{
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 0;
	int threads = argc > 3 ? atoi(argv[3]) : 0, bad = 0;
	pthread_t *t;
	pthread_attr_t attr;
	static uint64_t msg[PAGE / 8];

	mapped = argc == 5 && !strcmp(argv[4], "mapped");
	if (argc != 4 + mapped || !mib || threads <= 0)
		return fprintf(stderr, "usage: pinwait FILE MiB THREADS [mapped]\n"), 2;
	t = calloc((size_t)threads, sizeof(*t));
	bufs = calloc((size_t)threads, sizeof(*bufs));
	if (!t || !bufs || (mapped ? pipe(sock) : socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sock)))
		return perror("pinwait: pipe or socketpair"), 1;
	if (mapped) { /* the pipe's write end is sock[0], as the socket's sending end is */
		int r = sock[0];
		sock[0] = sock[1];
		sock[1] = r;
	}
	/* Heap past farmem's threshold, so that the sleepers' buffers are paged heap. */
	for (int k = 0; k < 512; k++)
		memset(malloc(64ul << 10), k, 64ul << 10);
	if (mapped) {
		uint8_t *m = mmap(NULL, (size_t)threads * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return perror("pinwait: mmap"), 1;
		for (int k = 0; k < threads; k++)
			bufs[k] = (uint64_t *)(m + (size_t)k * PAGE);
	}
	for (int k = 0; k < threads && !mapped; k++)
		if (posix_memalign((void **)&bufs[k], PAGE, PAGE))
			return perror("pinwait: posix_memalign"), 1;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64ul << 10);
	for (int k = 0; k < threads; k++)
		if (pthread_create(&t[k], &attr, sleeper, (void *)(uintptr_t)k))
			return fprintf(stderr, "pinwait: thread %d not started\n", k), 1;
	while (atomic_load(&asleep) < threads)
		usleep(1000);
	usleep(200000); /* in their reads by now */
	if (file_round(argv[1], mib))
		return 1;
	for (int k = 0; k < threads; k++) {
		msg[0] = (uint64_t)k;
		msg[1] = word((size_t)k, 7);
		msg[PAGE / 8 - 1] = ~msg[1];
		if (write(sock[0], msg, PAGE) != (ssize_t)PAGE)
			return perror("pinwait: write"), 1;
	}
	for (int k = 0; k < threads; k++) {
		void *r;
		pthread_join(t[k], &r);
		bad |= r != NULL;
	}
	if (bad)
		return 1;
	printf("pinwait: ok\n");
	return 0;
}
