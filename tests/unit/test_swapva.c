// SPDX-License-Identifier: Apache-2.0
/*
 * libswapva tests. With no arguments: every backend available here, each
 * forced in turn (strict, so a refused segment fails instead of falling
 * through), plus the automatic ladder. `--backend kmod|uffd|memmove|auto`
 * runs one. The qemu lane runs it with --backend kmod against /dev/swapva.
 * Prints "test_swapva: OK ..." and exits 0, or lists failures and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kmod-swapva/libswapva.h"

#define PS 4096UL
static int fails, checks;
static const char *cur = "";

#define CHECK(cond, ...)                                                         \
	do {                                                                     \
		checks++;                                                        \
		if (!(cond)) {                                                   \
			fails++;                                                 \
			printf("FAIL [%s] %s:%d: ", cur, __FILE__, __LINE__);    \
			printf(__VA_ARGS__);                                     \
			printf("\n");                                            \
		}                                                                \
	} while (0)

static uint64_t word(uint64_t seed, uint64_t page, uint64_t w)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL ^ (page << 20) ^ w;

	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ULL;
	return x ^ (x >> 29) ^ 1;  /* never 0, so holes are distinguishable */
}

static void fill(void *p, size_t pages, uint64_t seed)
{
	uint64_t *q = p;

	for (size_t i = 0; i < pages; i++)
		for (size_t w = 0; w < PS / 8; w++)
			q[i * PS / 8 + w] = word(seed, i, w);
}

/* first bad page index, or -1 */
static long verify(const void *p, size_t pages, uint64_t seed)
{
	const uint64_t *q = p;

	for (size_t i = 0; i < pages; i++)
		for (size_t w = 0; w < PS / 8; w++)
			if (q[i * PS / 8 + w] != word(seed, i, w))
				return (long)i;
	return -1;
}

static void *anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	madvise(p, len, MADV_NOHUGEPAGE);  /* the module refuses huge PMDs */
	return p;
}

static void test_sizes(struct swapva_ctx *c, int b, int strict)
{
	static const size_t sizes[] = { 1, 2, 9, 10, 11, 64, 512, 513, 4096 };

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i], len = n * PS;
		char *a = anon(len), *bb = anon(len);
		struct swapva_result r;
		struct swapva_seg s = { (uint64_t)a, (uint64_t)bb, len };
		int e;

		fill(a, n, 1 + i);
		fill(bb, n, 100 + i);
		e = swapva_batch(c, SWAPVA_OP_SWAP, &s, 1, &r);
		CHECK(e == 0, "swap %zu pages: %s", n, strerror(e));
		CHECK(verify(a, n, 100 + i) < 0 && verify(bb, n, 1 + i) < 0, "swap %zu pages: data", n);
		if (strict)
			CHECK(r.segs_by[b] == 1, "swap %zu pages not done by %s", n,
			      swapva_backend_name(b));
		e = swapva_swap(c, a, bb, len);
		CHECK(e == 0 && verify(a, n, 1 + i) < 0 && verify(bb, n, 100 + i) < 0,
		      "swap back %zu pages: %s", n, strerror(e));
		e = swapva_batch(c, SWAPVA_OP_MOVE, &s, 1, &r);
		CHECK(e == 0 && verify(bb, n, 1 + i) < 0, "move %zu pages: %s", n, strerror(e));
		if (strict)
			CHECK(r.segs_by[b] == 1, "move %zu pages not done by %s", n,
			      swapva_backend_name(b));
		/* the source is still usable memory afterwards */
		memset(a, 0x5a, len);
		CHECK(a[len - 1] == 0x5a, "source writable after move");
		munmap(a, len);
		munmap(bb, len);
	}
}

/* 1000 random disjoint segments in one call == the same done one by one on a
 * reference copy. */
static void test_batch(struct swapva_ctx *c, int b, int strict, unsigned op)
{
	const size_t pages = 8192, nseg = 1000;
	char *m = anon(pages * PS);
	char *ref = malloc(pages * PS), *tmp = malloc(8 * PS);
	unsigned char *used = calloc(pages, 1);
	struct swapva_seg *s = calloc(nseg, sizeof(*s));
	struct swapva_result r;
	size_t k = 0;
	unsigned rnd = 12345;

	fill(m, pages, 7);
	while (k < nseg) {
		size_t n = 1 + (rnd = rnd * 1103515245 + 12345) % 4;
		size_t x = (rnd = rnd * 1103515245 + 12345) % (pages - n);
		size_t y = (rnd = rnd * 1103515245 + 12345) % (pages - n);
		int ok = 1;

		for (size_t j = 0; j < n; j++)
			ok &= !used[x + j] && !used[y + j];
		if (!ok || (x < y + n && y < x + n))
			continue;
		for (size_t j = 0; j < n; j++)
			used[x + j] = used[y + j] = 1;
		s[k++] = (struct swapva_seg){ (uint64_t)(m + x * PS), (uint64_t)(m + y * PS), n * PS };
	}
	memcpy(ref, m, pages * PS);
	for (size_t i = 0; i < nseg; i++) {
		char *x = ref + (s[i].src - (uint64_t)m), *y = ref + (s[i].dst - (uint64_t)m);

		memcpy(tmp, y, s[i].len);
		memcpy(y, x, s[i].len);
		if (op == SWAPVA_OP_SWAP)
			memcpy(x, tmp, s[i].len);
	}
	int e = swapva_batch(c, op, s, nseg, &r);

	CHECK(e == 0 && r.done == nseg, "batch of %zu: %s done=%u", nseg, strerror(e), r.done);
	if (strict)
		CHECK(r.segs_by[b] == nseg, "batch: %llu of %zu by %s",
		      (unsigned long long)r.segs_by[b], nseg, swapva_backend_name(b));
	if (op == SWAPVA_OP_SWAP) {
		CHECK(memcmp(ref, m, pages * PS) == 0, "batch swap result differs from reference");
	} else {
		int bad = 0;

		for (size_t i = 0; i < nseg; i++)  /* MOVE: only the destinations are defined */
			bad |= memcmp(ref + (s[i].dst - (uint64_t)m), (char *)s[i].dst, s[i].len) != 0;
		CHECK(!bad, "batch move result differs from reference");
	}
	munmap(m, pages * PS);
	free(ref);
	free(tmp);
	free(used);
	free(s);
}

static void test_rejects(struct swapva_ctx *c)
{
	const size_t len = 16 * PS;
	char *a = anon(len), *b = anon(len);
	struct swapva_result r;
	int e;

	fill(a, 16, 3);
	fill(b, 16, 4);
	CHECK(swapva_move(c, b + 1, a, PS) == EINVAL, "misaligned dst");
	CHECK(swapva_move(c, b, a + 8, PS) == EINVAL, "misaligned src");
	CHECK(swapva_move(c, b, a, PS + 1) == EINVAL, "misaligned len");
	CHECK(swapva_move(c, b, a, 0) == EINVAL, "zero length");
	CHECK(swapva_swap(c, a, a + 2 * PS, 4 * PS) == EINVAL, "overlapping src/dst");
	CHECK(swapva_move(c, (void *)(~0UL & ~(PS - 1)), a, 2 * PS) == EINVAL, "wrap-around");
	CHECK(swapva_batch(c, 7, NULL, 0, &r) == EINVAL, "bad op");

	/* an invalid segment k: [0, k) run, then EINVAL at k */
	struct swapva_seg s[3] = {
		{ (uint64_t)a, (uint64_t)b, PS },
		{ (uint64_t)(a + PS), (uint64_t)(b + PS), PS },
		{ (uint64_t)(a + 2 * PS), (uint64_t)(b + 2 * PS) + 1, PS },
	};
	e = swapva_batch(c, SWAPVA_OP_SWAP, s, 3, &r);
	CHECK(e == EINVAL && r.done == 2 && r.err == EINVAL, "bad 3rd segment: e=%d done=%u", e,
	      r.done);
	CHECK(verify(a, 2, 4) < 0 && verify(b, 2, 3) < 0, "segments before the bad one ran");
	swapva_batch(c, SWAPVA_OP_SWAP, s, 2, &r);  /* undo */

	/* overlapping segments in one batch: the later one is refused */
	struct swapva_seg o[3] = {
		{ (uint64_t)a, (uint64_t)b, 2 * PS },
		{ (uint64_t)(a + 4 * PS), (uint64_t)(b + 4 * PS), PS },
		{ (uint64_t)(b + PS), (uint64_t)(a + 8 * PS), PS },
	};
	e = swapva_batch(c, SWAPVA_OP_SWAP, o, 3, &r);
	CHECK(e == EINVAL && r.done == 2, "overlapping segments: e=%d done=%u", e, r.done);
	swapva_batch(c, SWAPVA_OP_SWAP, o, 2, &r);  /* undo */
	CHECK(verify(a, 16, 3) < 0 && verify(b, 16, 4) < 0, "undo");

	/* not anonymous private memory */
	char *sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(swapva_move(c, sh, a, PS) == EINVAL, "MAP_SHARED dst");
	CHECK(swapva_move(c, b, sh, PS) == EINVAL, "MAP_SHARED src");
	munmap(sh, len);
	char path[] = "/tmp/swapva-test-XXXXXX";
	int fd = mkstemp(path);
	if (fd >= 0 && ftruncate(fd, len) == 0) {
		char *f = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);

		CHECK(swapva_move(c, f, a, PS) == EINVAL, "file-backed private dst");
		munmap(f, len);
	}
	if (fd >= 0) {
		close(fd);
		unlink(path);
	}
	char *ro = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	e = swapva_move(c, ro, a, PS);
	CHECK(e == EINVAL, "read-only dst: %s", strerror(e));
	munmap(ro, len);

	/* a hole in the address space */
	char *gap = anon(len);
	munmap(gap, len);
	e = swapva_move(c, gap, a, PS);
	CHECK(e == EFAULT || e == ENOMEM || e == EINVAL, "unmapped dst: %s", strerror(e));
	CHECK(verify(a, 16, 3) < 0, "src intact after refusals");
	munmap(a, len);
	munmap(b, len);
}

/* Untouched pages (no PTE) move as holes and read back as zeros. */
static void test_holes(struct swapva_ctx *c)
{
	const size_t n = 64, len = n * PS;
	char *a = anon(len), *b = anon(len), *z = calloc(1, PS);
	int e, bad = 0;

	for (size_t i = 0; i < n; i += 2)  /* even pages present in a, odd in b */
		memset(a + i * PS, (int)(i + 1), PS);
	for (size_t i = 1; i < n; i += 2)
		memset(b + i * PS, (int)(i + 1), PS);
	e = swapva_swap(c, a, b, len);
	CHECK(e == 0, "swap with holes: %s", strerror(e));
	for (size_t i = 0; i < n; i++) {
		unsigned char want = (unsigned char)(i + 1);

		if (i % 2 == 0)
			bad |= b[i * PS] != (char)want || b[i * PS + PS - 1] != (char)want ||
			       memcmp(a + i * PS, z, PS);
		else
			bad |= a[i * PS] != (char)want || memcmp(b + i * PS, z, PS);
	}
	CHECK(!bad, "holes: data after swap");
	/* an all-hole source moved onto data leaves zeros */
	char *h = anon(len);
	e = swapva_move(c, b, h, len);
	CHECK(e == 0, "move all-hole source: %s", strerror(e));
	bad = 0;
	for (size_t i = 0; i < n; i++)
		bad |= memcmp(b + i * PS, z, PS) != 0;
	CHECK(!bad, "all-hole move leaves zeros");
	munmap(h, len);
	munmap(a, len);
	munmap(b, len);
	free(z);
}

/* Pages shared with a child after fork are refused by the PTE backends
 * (EBUSY); strict mode reports it, the ladder falls to memmove. */
static void test_fork(struct swapva_ctx *c, int b, int strict)
{
	const size_t n = 16, len = n * PS;
	char *a = anon(len), *d = anon(len);
	int pfd[2];
	pid_t pid;
	struct swapva_result r;
	int e;

	fill(a, n, 11);
	fill(d, n, 12);
	if (pipe(pfd))
		return;
	pid = fork();
	if (pid == 0) {
		char ch;

		close(pfd[1]);
		if (read(pfd[0], &ch, 1) < 0)
			_exit(3);
		_exit(verify(a, n, 11) < 0 && verify(d, n, 12) < 0 ? 0 : 1);
	}
	struct swapva_seg s = { (uint64_t)a, (uint64_t)d, len };
	e = swapva_batch(c, SWAPVA_OP_SWAP, &s, 1, &r);
	if (strict && b != SWAPVA_BACKEND_MEMMOVE) {
		CHECK(e == EBUSY, "swap of pages shared after fork: %s", strerror(e));
		CHECK(verify(a, n, 11) < 0 && verify(d, n, 12) < 0, "refused swap left data alone");
	} else {
		CHECK(e == 0 && verify(a, n, 12) < 0 && verify(d, n, 11) < 0,
		      "swap after fork (fallthrough): %s", strerror(e));
	}
	close(pfd[0]);
	if (write(pfd[1], "x", 1) < 0)
		perror("write");
	close(pfd[1]);
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child's copy unchanged");
	munmap(a, len);
	munmap(d, len);
}

static int run(enum swapva_backend want, int strict)
{
	struct swapva_ctx *c;
	int e = swapva_open(&c, want), f0 = fails;

	if (e) {
		printf("FAIL [%s] swapva_open: %s\n", swapva_backend_name(want), strerror(e));
		fails++;
		return 1;
	}
	swapva_set_strict(c, strict);
	int b = swapva_backend(c);
	char name[64];

	snprintf(name, sizeof(name), "%s%s", swapva_describe(c), strict ? ",strict" : "");
	cur = name;
	test_sizes(c, b, strict);
	test_batch(c, b, strict, SWAPVA_OP_SWAP);
	test_batch(c, b, strict, SWAPVA_OP_MOVE);
	test_rejects(c);
	test_holes(c);
	test_fork(c, b, strict);
	printf("%s: %s (%d checks so far)\n", name, fails == f0 ? "ok" : "FAILED", checks);
	swapva_close(c);
	return fails != f0;
}

int main(int argc, char **argv)
{
	unsigned avail = swapva_available();

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "--backend")) {
		int b = -1;

		for (int i = 0; i < SWAPVA_NBACKENDS; i++)
			if (!strcmp(argv[2], swapva_backend_name(i)))
				b = i;
		if (b < 0) {
			fprintf(stderr, "unknown backend %s\n", argv[2]);
			return 2;
		}
		run(b, b != SWAPVA_BACKEND_AUTO);
	} else {
		printf("available:%s%s memmove\n", avail & 2 ? " kmod" : "", avail & 4 ? " uffd" : "");
		for (int b = SWAPVA_BACKEND_KMOD; b <= SWAPVA_BACKEND_MEMMOVE; b++)
			if (avail & (1u << b))
				run(b, 1);
		run(SWAPVA_BACKEND_AUTO, 0);
	}
	if (fails) {
		printf("test_swapva: %d of %d checks FAILED\n", fails, checks);
		return 1;
	}
	printf("test_swapva: OK %d checks\n", checks);
	return 0;
}
