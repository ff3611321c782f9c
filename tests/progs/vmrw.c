// SPDX-License-Identifier: Apache-2.0
/*
 * process_vm_readv and process_vm_writev between two paged processes, as an
 * MPI library's single-copy transfers between ranks (Open MPI's CMA) and
 * stress-ng's vm-rw do them.
 *
 *   vmrw MIB ROUNDS [forked|reserved]
 *
 * The parent forks a child, and each maps two buffers of MIB MiB: the
 * parent src and dst, the child in and out (with "forked" the parent maps
 * its two before the fork, so that their pages were the child's too for a
 * while, copy-on-write; with "reserved" all four are reserved PROT_NONE and
 * then made writable, where farmem has the kernel wait for pages). Each round the parent writes a new
 * pattern over src and then presses its budget, the child reads the parent's
 * src into in with process_vm_readv (one call of all of it, then in 61
 * scattered pieces of uneven sizes), checks every byte, and writes out's
 * pattern into the parent's dst with process_vm_writev, which the parent
 * checks. Under farmem with a small budget most of src, dst, in and out has
 * left for memd by the time the kernel copies. Prints "vmrw: ok" and exits
 * 0, or says what was wrong and exits 1.
 */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PIECES 61

static uint64_t word(uint64_t seed, size_t i)
{
	uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);

	return x ^ (x >> 29);
}

static void fill(uint64_t *b, size_t words, uint64_t seed)
{
	for (size_t i = 0; i < words; i++)
		b[i] = word(seed, i);
}

/* The first wrong word, or -1; and how many are wrong, and what the first holds. */
static long first_wrong(const uint64_t *b, size_t words, uint64_t seed)
{
	long first = -1, wrong = 0;

	for (size_t i = 0; i < words; i++)
		if (b[i] != word(seed, i) && !wrong++)
			first = (long)i;
	if (wrong)
		fprintf(stderr, "vmrw: %ld words wrong, the first at byte %#lx holds %#llx for %#llx\n", wrong,
			(unsigned long)first * 8, (unsigned long long)b[first], (unsigned long long)word(seed, (size_t)first));
	return first;
}

/*
 * "reserved": the buffers reserved PROT_NONE and then made writable, as a
 * runtime's heap is (farmem pages those where the kernel waits for a page,
 * as with glibc's heaps).
 */
static int reserved;

static uint64_t *map(size_t len)
{
	void *p = mmap(NULL, len, reserved ? PROT_NONE : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p != MAP_FAILED && reserved && mprotect(p, len, PROT_READ | PROT_WRITE))
		p = MAP_FAILED;
	if (p == MAP_FAILED) {
		perror("vmrw: mmap");
		exit(1);
	}
	return p;
}

static void msg(int fd, char c)
{
	if (write(fd, &c, 1) != 1) {
		perror("vmrw: write");
		exit(1);
	}
}

static char wait_msg(int fd)
{
	char c = 0;

	if (read(fd, &c, 1) != 1)
		return 0;
	return c;
}

/* The same bytes of both sides as PIECES iovecs each, cut at different places. */
static ssize_t in_pieces(pid_t pid, uint64_t *local, uint64_t *remote, size_t len, int write_remote)
{
	struct iovec lv[PIECES], rv[PIECES];
	size_t at_l = 0, at_r = 0;

	for (int k = 0; k < PIECES; k++) {
		size_t end_l = k == PIECES - 1 ? len : len / PIECES * (k + 1) - 4096 * (k % 3);
		size_t end_r = k == PIECES - 1 ? len : len / PIECES * (k + 1) + 8 * (k % 5);
		lv[k] = (struct iovec){ (char *)local + at_l, end_l - at_l };
		rv[k] = (struct iovec){ (char *)remote + at_r, end_r - at_r };
		at_l = end_l;
		at_r = end_r;
	}
	return write_remote ? process_vm_writev(pid, lv, PIECES, rv, PIECES, 0)
			    : process_vm_readv(pid, lv, PIECES, rv, PIECES, 0);
}

static int child(pid_t parent, int from_parent, int to_parent, uint64_t *src, uint64_t *dst, size_t len, int rounds)
{
	uint64_t *in = map(len), *out = map(len);
	size_t words = len / 8;

	for (int round = 0; round < rounds; round++) {
		if (wait_msg(from_parent) != 'r')
			return fprintf(stderr, "vmrw: the parent went away in round %d\n", round), 1;
		for (int how = 0; how < 2; how++) {
			struct iovec l = { in, len }, r = { src, len };
			ssize_t n;
			long bad;

			memset(in, 0xee, len);
			n = how ? in_pieces(parent, in, src, len, 0) : process_vm_readv(parent, &l, 1, &r, 1, 0);
			if (n != (ssize_t)len)
				return fprintf(stderr, "vmrw: round %d: process_vm_readv%s returned %zd of %zu: %s\n", round,
					       how ? " in pieces" : "", n, len, n < 0 ? strerror(errno) : "short"), 1;
			bad = first_wrong(in, words, (uint64_t)round);
			if (bad >= 0)
				return fprintf(stderr, "vmrw: round %d: process_vm_readv%s: word %ld wrong\n", round,
					       how ? " in pieces" : "", bad), 1;
		}
		fill(out, words, 1000 + (uint64_t)round);
		{
			ssize_t n = round % 2 ? in_pieces(parent, out, dst, len, 1)
					      : process_vm_writev(parent, &(struct iovec){ out, len }, 1,
								  &(struct iovec){ dst, len }, 1, 0);
			if (n != (ssize_t)len)
				return fprintf(stderr, "vmrw: round %d: process_vm_writev returned %zd of %zu: %s\n",
					       round, n, len, n < 0 ? strerror(errno) : "short"), 1;
		}
		msg(to_parent, 'w');
	}
	return 0;
}

/* src and dst mapped before the fork (forked), or NULL: mapped now, after it. */
static int parent(int to_child, int from_child, uint64_t *src, uint64_t *dst, size_t len, int rounds)
{
	uint64_t where[2];
	int rc = 0;

	if (!src) {
		src = map(len);
		dst = map(len);
	}
	where[0] = (uintptr_t)src;
	where[1] = (uintptr_t)dst;
	if (write(to_child, where, sizeof(where)) != (ssize_t)sizeof(where)) {
		perror("vmrw: write");
		return 1;
	}
	for (int round = 0; round < rounds && !rc; round++) {
		long bad;

		fill(src, len / 8, (uint64_t)round);
		memset(dst, 0x55, len); /* dst after src: src's pages are the older, and leave first */
		msg(to_child, 'r');
		if (wait_msg(from_child) != 'w') {
			fprintf(stderr, "vmrw: the child stopped in round %d\n", round);
			return 1;
		}
		bad = first_wrong(dst, len / 8, 1000 + (uint64_t)round);
		if (bad >= 0) {
			fprintf(stderr, "vmrw: round %d: word %ld of what process_vm_writev wrote is wrong\n", round, bad);
			rc = 1;
		}
	}
	return rc;
}

int main(int argc, char **argv)
{
	size_t len;
	int rounds, down[2], up[2], status, rc;
	uint64_t *before = NULL;
	pid_t pid;

	if (argc < 3 || argc > 4 || atoi(argv[1]) < 1 || atoi(argv[2]) < 1 ||
	    (argc == 4 && strcmp(argv[3], "forked") && strcmp(argv[3], "reserved"))) {
		fprintf(stderr, "usage: vmrw MIB ROUNDS [forked|reserved]\n");
		return 2;
	}
	reserved = argc == 4 && !strcmp(argv[3], "reserved");
	len = (size_t)atoi(argv[1]) << 20;
	rounds = atoi(argv[2]);
	/*
	 * forked: the parent's buffers are mapped, and paged, before the fork,
	 * so the child got copies of their pages (copy-on-write).
	 */
	if (argc == 4 && !reserved) {
		before = map(2 * len);
		memset(before, 0x55, 2 * len);
	}
	if (pipe(down) || pipe(up)) {
		perror("vmrw: pipe");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("vmrw: fork");
		return 1;
	}
	if (pid == 0) {
		uint64_t where[2];
		close(down[1]);
		close(up[0]);
		if (read(down[0], where, sizeof(where)) != (ssize_t)sizeof(where))
			_exit(1);
		_exit(child(getppid(), down[0], up[1], (uint64_t *)(uintptr_t)where[0], (uint64_t *)(uintptr_t)where[1],
			    len, rounds));
	}
	close(down[0]);
	close(up[1]);
	rc = parent(down[1], up[0], before, before ? (uint64_t *)((char *)before + len) : NULL, len, rounds);
	close(down[1]);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		rc = 1;
	if (!rc)
		printf("vmrw: ok (%d rounds of %zu MiB)\n", rounds, len >> 20);
	return rc;
}
