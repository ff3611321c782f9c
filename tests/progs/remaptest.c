// SPDX-License-Identifier: Apache-2.0
/*
 * remaptest: memory-management calls on paged ranges stay correct under
 * farmem. Run it with a local budget well below --size so that most pages
 * are remote when each check runs:
 *   farmem run --local 32M -- remaptest --size 256M
 * Every check verifies bytes; the first failure prints and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define PG 4096ul

static uint64_t pattern(uint64_t page, uint64_t salt, unsigned word)
{
	uint64_t x = page * 0x9e3779b97f4a7c15ull ^ salt ^ ((uint64_t)word << 32);
	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return x ^ (x >> 32);
}

/* Pages [first, first+pages) of base get the pattern of their own page numbers. */
static void fill_at(uint8_t *base, size_t first, size_t pages, uint64_t salt)
{
	for (size_t p = first; p < first + pages; p++) {
		uint64_t *w = (uint64_t *)(base + p * PG);
		for (unsigned k = 0; k < PG / 8; k++)
			w[k] = pattern(p, salt, k);
	}
}

static void fill(uint8_t *base, size_t pages, uint64_t salt)
{
	fill_at(base, 0, pages, salt);
}

static int check(const char *what, const uint8_t *base, size_t first, size_t pages, uint64_t salt, size_t pat_first)
{
	for (size_t p = first; p < first + pages; p++) {
		const uint64_t *w = (const uint64_t *)(base + p * PG);
		for (unsigned k = 0; k < PG / 8; k++) {
			uint64_t want = salt == 0 ? 0 : pattern(p - first + pat_first, salt, k);
			if (w[k] != want) {
				fprintf(stderr, "remaptest: %s: page %zu word %u: expected %#llx, got %#llx\n",
					what, p, k, (unsigned long long)want, (unsigned long long)w[k]);
				return 1;
			}
		}
	}
	return 0;
}

/* Touch another region end to end so that the pages under test are evicted. */
static void churn(uint8_t *other, size_t pages)
{
	for (size_t p = 0; p < pages; p++)
		other[p * PG] ^= 1;
}

struct churner {
	uint8_t *other;
	size_t pages;
	atomic_int stop;
};

static void *churn_until_stopped(void *arg)
{
	struct churner *c = arg;

	while (!atomic_load(&c->stop))
		churn(c->other, c->pages);
	return NULL;
}

/*
 * 5. A new mapping made with MAP_FIXED right over paged memory (an allocator
 * decommitting and recommitting, without munmap) while another thread keeps the
 * evictor busy: the evictor must never drop the new mapping's pages, which it
 * once could when it had picked the old mapping's pages just before.
 */
static int fixed_over_paged(uint8_t *other, size_t pages)
{
	const size_t chunk = 2048; /* 8 MiB: below the shim's threshold, so left unpaged */
	size_t size = pages * PG;
	struct churner c = { .other = other, .pages = pages };
	uint8_t *a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	pthread_t t;
	int bad = 0;

	if (a == MAP_FAILED || chunk > pages)
		return 1;
	fill(a, pages, 5);
	if (pthread_create(&t, NULL, churn_until_stopped, &c))
		return 1;
	for (unsigned round = 0; round < 64 && !bad; round++) {
		size_t first = (round * 7919ul * chunk / 3) % (pages - chunk + 1);
		if (mmap(a + first * PG, chunk * PG, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
			perror("mmap fixed over paged memory");
			bad = 1;
			break;
		}
		fill(a + first * PG, chunk, 100 + round);
		bad = check("fixed mapping over paged memory", a + first * PG, 0, chunk, 100 + round, 0);
		/* back to a range of the paged kind for the next round's neighbours */
		fill(a + first * PG, chunk, 5);
	}
	atomic_store(&c.stop, 1);
	pthread_join(t, NULL);
	munmap(a, size);
	return bad;
}

/*
 * A line of /proc/self/status in KiB, -1 if unknown: VmHWM, the most held
 * resident (memd's store pages that the shm transport maps included);
 * RssAnon, private anonymous memory resident now.
 */
static long status_kib(const char *field)
{
	char line[256];
	long kib = -1;
	size_t n = strlen(field);
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%ld", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

/*
 * The peak resident size (VmHWM, KiB), first set back to the resident size
 * now (clear_refs 5), so that a call's rise shows even below an earlier
 * peak (the whole range, written at the start, and memd's store pages
 * that the shm transport maps here).
 */
static long peak_from_now(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY);

	if (fd >= 0) {
		if (write(fd, "5", 1) != 1)
			perror("remaptest: clear_refs");
		close(fd);
	}
	return status_kib("VmHWM");
}

/* A call raised the peak resident size (VmHWM, hwm KiB before it) by more than a quarter of size: it brought size home. */
static int brought_home(const char *what, long hwm, size_t size)
{
	if (status_kib("VmHWM") - hwm <= (long)(size >> 10) / 4)
		return 0;
	fprintf(stderr, "remaptest: %s raised the peak resident size from %ld to %ld KiB\n", what, hwm,
		status_kib("VmHWM"));
	return 1;
}

/*
 * An mremap that must succeed (at `at` when it is not NULL) and bring
 * nothing home for a range of size bytes: the new address, or NULL after
 * saying why.
 */
static void *remap_in_budget(const char *what, void *old, size_t old_len, size_t new_len, int flags, void *at,
			     size_t size)
{
	long hwm = peak_from_now();
	void *r = mremap(old, old_len, new_len, flags, at);

	if (r == MAP_FAILED || (at && r != at)) {
		fprintf(stderr, "remaptest: %s: %s\n", what, r == MAP_FAILED ? strerror(errno) : "moved elsewhere");
		return NULL;
	}
	return brought_home(what, hwm, size) ? NULL : r;
}

/* Just after size bytes were written, more than half of them are resident: they are not paged. */
static int not_paged(const char *what, size_t size)
{
	if (status_kib("RssAnon") <= (long)(size >> 10) / 2)
		return 0;
	fprintf(stderr, "remaptest: %s is not paged: %ld KiB resident after writing %zu MiB\n", what,
		status_kib("RssAnon"), size >> 20);
	return 1;
}

/*
 * Write n pages at base, which must be paged (not_paged), push them out
 * with other's, and read them back.
 */
static int written_paged(const char *what, uint8_t *base, size_t n, uint64_t salt, uint8_t *other, size_t pages)
{
	fill(base, n, salt);
	if (not_paged(what, n * PG))
		return 1;
	churn(other, pages);
	return check(what, base, 0, n, salt, 0);
}

/* NULL that the compiler cannot see: realloc(NULL, n) would become malloc(n). */
static void *volatile no_block;

/* Whether a failed call said what the kernel said. */
static int failed_with(const char *what, int failed, int want)
{
	if (failed && errno == want)
		return 0;
	fprintf(stderr, "remaptest: %s: %s, errno %d (%s), expected %d (%s)\n", what,
		failed ? "failed" : "succeeded", failed ? errno : 0, failed ? strerror(errno) : "-", want,
		strerror(want));
	return 1;
}

/*
 * 6. Calls that fail on (or beside) paged memory fail with the kernel's own
 * errno, which programs act on: ENOMEM for a mapping too large, EEXIST for
 * MAP_FIXED_NOREPLACE over a mapping (allocators probe address space with
 * it), EINVAL for mremap's and madvise's bad arguments, EBADF for a read
 * into an evicted page. The paged range is intact after.
 */
static int failures_say_why(uint8_t *other, size_t pages)
{
	size_t size = pages * PG;
	long hwm;
	uint8_t *a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *r;

	if (a == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	fill(a, pages, 6);
	churn(other, pages);
	errno = 0;
	r = mmap(NULL, 1ul << 62, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (failed_with("mmap of 4 EiB", r == MAP_FAILED, ENOMEM))
		return 1;
	errno = 0;
	r = mmap(a + PG, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (failed_with("MAP_FIXED_NOREPLACE over paged memory", r == MAP_FAILED, EEXIST))
		return 1;
	errno = 0;
	r = mremap(a, size, size, MREMAP_FIXED, a + PG);  /* MREMAP_FIXED without MREMAP_MAYMOVE */
	if (failed_with("mremap of paged memory with bad flags", r == MAP_FAILED, EINVAL))
		return 1;
	errno = 0;
	if (failed_with("madvise of paged memory with bad advice", madvise(a, size, 12345) != 0, EINVAL))
		return 1;
	errno = 0;
	hwm = peak_from_now();
	r = mremap(a, size, size + PG, MREMAP_MAYMOVE | MREMAP_DONTUNMAP);  /* it moves, it does not resize */
	if (failed_with("mremap of paged memory with MREMAP_DONTUNMAP and a new size", r == MAP_FAILED, EINVAL) ||
	    brought_home("a refused mremap with MREMAP_DONTUNMAP", hwm, size))
		return 1;
	errno = 0;
	r = mremap(a, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, a + size / 2);  /* overlapping */
	if (failed_with("mremap of paged memory onto itself", r == MAP_FAILED, EINVAL))
		return 1;
	/* Growing a range that spans two mappings (mprotect split it) is the kernel's EFAULT. */
	if (mprotect(a + size / 2, size / 2, PROT_READ)) {
		perror("mprotect");
		return 1;
	}
	errno = 0;
	r = mremap(a, size, size + PG, MREMAP_MAYMOVE);
	if (failed_with("mremap growing paged memory over two mappings", r == MAP_FAILED, EFAULT))
		return 1;
	if (mprotect(a + size / 2, size / 2, PROT_READ | PROT_WRITE)) {
		perror("mprotect");
		return 1;
	}
	errno = 0;  /* a covered call (preload_io.c) into an evicted page */
	if (failed_with("read into paged memory from a bad descriptor", read(-1, a + size / 2, PG) < 0, EBADF))
		return 1;
	churn(other, pages);
	if (check("paged range after failed calls", a, 0, pages, 6, 0))
		return 1;
	munmap(a, size);
	return 0;
}

/*
 * 3c. Growing where it lies and moving when it cannot: without
 * MREMAP_MAYMOVE the range grows in place (where there is room) or fails
 * with ENOMEM, changing nothing; with it, a range with no room after it
 * moves. Then forty growths of a page each, which take up the room left
 * in the books of the range's last part. Contents follow, the tails are
 * zero, nothing comes home, the result is paged.
 */
static int grows_in_parts(uint8_t *other, size_t pages)
{
	size_t size = pages * PG, len;
	uint8_t *a, *guard, *b;
	long hwm;

	/* Room for 64 pages after the range, then a page in the way. */
	a = mmap(NULL, size + 65 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	munmap(a, size + 65 * PG);
	if (mmap(a, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != a) {
		perror("mmap");
		return 1;
	}
	guard = mmap(a + size + 64 * PG, PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (guard != a + size + 64 * PG) {
		perror("mmap guard");
		return 1;
	}
	fill(a, pages, 14);
	churn(other, pages);
	if (remap_in_budget("an mremap that grows in place", a, size, size + 64 * PG, 0, a, size) != a)
		return 1;
	hwm = peak_from_now();
	errno = 0;
	if (failed_with("an mremap that cannot grow in place",
			mremap(a, size + 64 * PG, size + 128 * PG, 0) == MAP_FAILED, ENOMEM) ||
	    brought_home("an mremap that cannot grow in place", hwm, size))
		return 1;
	churn(other, pages);
	if (check("grown in place", a, 0, pages, 14, 0) || check("tail grown in place", a, pages, 64, 0, 0))
		return 1;
	b = remap_in_budget("a growing mremap with no room where it is", a, size + 64 * PG, size + 128 * PG,
			    MREMAP_MAYMOVE, NULL, size);
	if (!b)
		return 1;
	if (b == a) {
		fprintf(stderr, "remaptest: an mremap grew over a mapping in its way\n");
		return 1;
	}
	munmap(guard, PG);
	churn(other, pages);
	if (check("moved when it could not grow", b, 0, pages, 14, 0) || check("its tail", b, pages, 128, 0, 0))
		return 1;
	len = size + 128 * PG;
	hwm = peak_from_now();
	for (int k = 0; k < 40; k++, len += PG) {
		b = mremap(b, len, len + PG, MREMAP_MAYMOVE);
		if (b == MAP_FAILED) {
			perror("remaptest: mremap growing a page");
			return 1;
		}
		b[len + 8] = (uint8_t)k;
	}
	if (brought_home("forty growths of a page", hwm, size))
		return 1;
	churn(other, pages);
	if (check("after forty growths", b, 0, pages, 14, 0))
		return 1;
	for (int k = 0; k < 40; k++)
		if (b[size + (128 + (size_t)k) * PG + 8] != (uint8_t)k) {
			fprintf(stderr, "remaptest: growth %d lost its byte\n", k);
			return 1;
		}
	if (written_paged("a range grown in parts", b, len / PG, 15, other, pages))
		return 1;
	munmap(b, len);
	return 0;
}

/*
 * 3d. Moves and growths while another thread keeps the evictor busy: each
 * round writes new bytes into part of the range (dirty pages, some leaving
 * as the move begins), moves it, grows it or moves it to a fixed place,
 * writes again after the move (a write the pager must see though the move
 * dropped the pages' write protection), and checks every page.
 */
static int moves_under_eviction(uint8_t *other, size_t pages)
{
	size_t len = pages * PG, n = pages / 8;
	struct churner c = { .other = other, .pages = pages };
	uint8_t *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *salt = calloc(pages, 1);
	pthread_t t;
	int bad = 0;

	if (a == MAP_FAILED || !salt)
		return 1;
	fill(a, pages, 16);
	memset(salt, 16, pages);
	if (pthread_create(&t, NULL, churn_until_stopped, &c))
		return 1;
	for (unsigned round = 0; round < 6 && !bad; round++) {
		size_t first = (round * 7919ul) % (pages - 2 * n), second = first + n;
		uint8_t *b, *to = NULL;

		fill_at(a, first, n, 17 + round);
		memset(salt + first, 17 + round, n);
		if (round % 3 == 2) {
			to = mmap(NULL, len + PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			munmap(to, len + PG);
			b = mremap(a, len, len + PG, MREMAP_MAYMOVE | MREMAP_FIXED, to);
		} else {
			b = mremap(a, len, len + PG, MREMAP_MAYMOVE);
		}
		if (b == MAP_FAILED || (to && b != to)) {
			perror("remaptest: mremap under eviction");
			bad = 1;
			break;
		}
		a = b;
		len += PG;
		/* Written right after the move: the pages it found resident are dirty, not clean. */
		fill_at(a, second, n, 40 + round);
		memset(salt + second, 40 + round, n);
		churn(other, pages);
		for (size_t p = 0; p < pages && !bad; p++)
			bad = check("moved under eviction", a, p, 1, salt[p], p);
		bad = bad || check("grown under eviction", a, pages, len / PG - pages, 0, 0);
	}
	atomic_store(&c.stop, 1);
	pthread_join(t, NULL);
	munmap(a, len);
	free(salt);
	return bad;
}

int main(int argc, char **argv)
{
	size_t size = 256ul << 20, pages, half;
	uint8_t *a, *other, *b;
	int opt;

	static const struct option opts[] = { { "size", required_argument, 0, 's' }, { 0, 0, 0, 0 } };
	while ((opt = getopt_long(argc, argv, "s:", opts, NULL)) != -1) {
		if (opt == 's') {
			char *end;
			size = strtoul(optarg, &end, 10);
			if (*end == 'M' || *end == 'm')
				size <<= 20;
			else if (*end == 'G' || *end == 'g')
				size <<= 30;
		} else {
			fprintf(stderr, "usage: remaptest [--size N[M|G]]\n");
			return 2;
		}
	}
	pages = size / PG;
	half = pages / 2;
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	other = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED || other == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	fill(a, pages, 1);
	churn(other, pages);
	if (check("after eviction", a, 0, pages, 1, 0))
		return 1;

	/* 1. MADV_DONTNEED of (mostly remote) pages: they must read as zeros, not as the old bytes. */
	churn(other, pages);
	if (madvise(a + 16 * PG, 64 * PG, MADV_DONTNEED)) {
		perror("madvise");
		return 1;
	}
	if (check("dontneed zeroes", a, 16, 64, 0, 0) || check("dontneed neighbours", a, 80, 16, 1, 80))
		return 1;

	/* 2. munmap then a new mapping at the same place: zeros again. */
	fill(a, pages, 2);
	churn(other, pages);
	if (munmap(a + half * PG, (pages - half) * PG)) {
		perror("munmap");
		return 1;
	}
	b = mmap(a + half * PG, (pages - half) * PG, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (b == MAP_FAILED) {
		perror("mmap fixed");
		return 1;
	}
	if (check("remapped half is zero", a, half, pages - half, 0, 0) || check("first half kept", a, 0, half, 2, 0))
		return 1;
	munmap(a, pages * PG);

	/*
	 * 2b. mremap that shrinks in place, with and without MREMAP_MAYMOVE:
	 * the head keeps its bytes where it lies, and nothing comes home for
	 * it (the peak resident size grows by far less than the range).
	 */
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fill(a, pages, 7);
	churn(other, pages);
	if (!remap_in_budget("a shrinking mremap", a, size, half * PG, MREMAP_MAYMOVE, a, size) ||
	    !remap_in_budget("a shrinking mremap without MREMAP_MAYMOVE", a, half * PG, half / 2 * PG, 0, a, size))
		return 1;
	churn(other, pages);
	if (check("head after shrinking mremap", a, 0, half / 2, 7, 0))
		return 1;
	/*
	 * The books end where the mapping does: it grows back in place, with
	 * nothing brought home (64 MiB came home before session 23, which a
	 * budget's worth of evictions hid in part: the bound is 8 MiB).
	 */
	churn(other, pages);
	if (remap_in_budget("an mremap growing in place what one shrank", a, half / 2 * PG, half * PG, 0, a, 32ul << 20) != a)
		return 1;
	churn(other, pages);
	if (check("head after growing back", a, 0, half / 2, 7, 0) ||
	    check("tail grown back is zero", a, half / 2, half - half / 2, 0, 0))
		return 1;
	/*
	 * 2c. The program flips paged memory back to MADV_DOFORK or
	 * MADV_HUGEPAGE (stress-ng's mremap stressor does), then grows it in
	 * place: the range is still one mapping, and the next mremap of all of
	 * it works (it failed with EFAULT before session 48: the grown part,
	 * made DONTFORK and NOHUGEPAGE by the pager, split the mapping in two).
	 */
	for (int advice = 0; advice < 2; advice++) {
		uint8_t *c;
		if (madvise(a, half * PG, advice ? MADV_HUGEPAGE : MADV_DOFORK)) {
			perror("madvise");
			return 1;
		}
		if (mremap(a, half * PG, half / 2 * PG, 0) != a ||
		    (c = mremap(a, half / 2 * PG, half * PG, 0)) != a) {
			fprintf(stderr, "remaptest: shrinking and growing in place: %s\n", strerror(errno));
			return 1;
		}
		c = mremap(a, half * PG, half * PG + 64 * PG, MREMAP_MAYMOVE);
		if (c == MAP_FAILED) {
			fprintf(stderr, "remaptest: an mremap of a range grown in place after madvise(%s): %s\n",
				advice ? "MADV_HUGEPAGE" : "MADV_DOFORK", strerror(errno));
			return 1;
		}
		a = mremap(c, half * PG + 64 * PG, half * PG, MREMAP_MAYMOVE);
		if (a == MAP_FAILED || check("head after madvise and mremaps", a, 0, half / 2, 7, 0))
			return 1;
	}
	munmap(a, half * PG);
	/* Let go in two parts, the range is free for paging again: a new mapping there is paged. */
	b = mmap(a, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (b != a) {
		perror("mmap where the shrunk range was");
		return 1;
	}
	if (written_paged("a new mapping where a range was let go in parts", b, pages, 8, other, pages))
		return 1;
	munmap(b, size);

	/*
	 * 3. mremap that moves and grows, twice: contents follow, the tail is
	 * zero, nothing comes home for it (the peak resident size grows by far
	 * less than the range), and the new range is paged.
	 */
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fill(a, pages, 3);
	churn(other, pages);
	b = remap_in_budget("a growing mremap", a, size, size + 64 * PG, MREMAP_MAYMOVE, NULL, size);
	if (!b || !(b = remap_in_budget("a growing mremap, again", b, size + 64 * PG, size + 128 * PG, MREMAP_MAYMOVE,
					 NULL, size)))
		return 1;
	churn(other, pages);
	if (check("mremap moved contents", b, 0, pages, 3, 0) || check("mremap tail", b, pages, 128, 0, 0))
		return 1;
	if (written_paged("a range mremap grew", b, pages + 128, 9, other, pages))
		return 1;
	munmap(b, size + 128 * PG);

	if (grows_in_parts(other, pages) || moves_under_eviction(other, pages))
		return 1;

	/*
	 * 3e. MREMAP_DONTUNMAP: the bytes move, the old range stays mapped and
	 * reads as zeros, nothing comes home, and both ranges are paged.
	 */
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fill(a, pages, 18);
	churn(other, pages);
	b = remap_in_budget("an mremap with MREMAP_DONTUNMAP", a, size, size, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL,
			    size);
	if (!b)
		return 1;
	churn(other, pages);
	if (check("moved by MREMAP_DONTUNMAP", b, 0, pages, 18, 0) || check("left by MREMAP_DONTUNMAP", a, 0, pages, 0, 0))
		return 1;
	if (written_paged("the range MREMAP_DONTUNMAP left", a, pages, 19, other, pages) ||
	    written_paged("the range MREMAP_DONTUNMAP made", b, pages, 20, other, pages))
		return 1;
	munmap(a, size);
	munmap(b, size);

	/*
	 * 3f. A read-only range (mprotect) moves and grows paged too: its bytes
	 * follow, nothing comes home, and made writable again it is paged.
	 */
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fill(a, pages, 21);
	churn(other, pages);
	if (mprotect(a, size, PROT_READ)) {
		perror("mprotect");
		return 1;
	}
	b = remap_in_budget("an mremap of a read-only range", a, size, size + 64 * PG, MREMAP_MAYMOVE, NULL, size);
	if (!b)
		return 1;
	churn(other, pages);
	if (check("read-only range moved", b, 0, pages, 21, 0) || check("its tail", b, pages, 64, 0, 0))
		return 1;
	if (mprotect(b, size + 64 * PG, PROT_READ | PROT_WRITE)) {
		perror("mprotect");
		return 1;
	}
	if (written_paged("a read-only range that moved, writable again", b, pages, 22, other, pages))
		return 1;
	munmap(b, size + 64 * PG);

	/*
	 * 3b. mremap with MREMAP_FIXED onto paged memory written with other
	 * bytes, the same size and then half of it: the contents follow, the
	 * target's old bytes are gone, nothing comes home, the result is paged.
	 */
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED || b == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	fill(a, pages, 10);
	fill(b, pages, 11);
	churn(other, pages);
	if (!remap_in_budget("an mremap onto a fixed address", a, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, b, size))
		return 1;
	churn(other, pages);
	if (check("mremap fixed onto paged memory", b, 0, pages, 10, 0))
		return 1;
	a = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(a, size);  /* a free range to move to */
	if (!remap_in_budget("a shrinking mremap to a fixed address", b, size, half * PG, MREMAP_MAYMOVE | MREMAP_FIXED,
			     a, size))
		return 1;
	churn(other, pages);
	if (check("mremap fixed, shrinking", a, 0, half, 10, 0))
		return 1;
	if (written_paged("a range mremap moved to a fixed address", a, half, 12, other, pages))
		return 1;
	munmap(a, half * PG);

	/*
	 * 4. Big malloc blocks are paged too, and one that realloc grows keeps
	 * its bytes without coming home; calloc after free is zero.
	 */
	{
		uint8_t *m = malloc(size), *c;
		long hwm;
		if (!m)
			return 1;
		fill(m, pages, 4);
		churn(other, pages);
		if (check("malloc block", m, 0, pages, 4, 0))
			return 1;
		churn(other, pages);
		hwm = peak_from_now();
		m = realloc(m, size + size / 2);
		if (!m || brought_home("a realloc that grows a big block", hwm, size))
			return 1;
		churn(other, pages);
		if (check("big block realloc grew", m, 0, pages, 4, 0))
			return 1;
		free(m);
		c = calloc(1, size);
		if (!c)
			return 1;
		churn(other, pages);
		if (check("calloc zero", c, 0, pages, 0, 0))
			return 1;
		m = realloc(c, size * 2);
		if (!m || check("realloc kept zeros", m, 0, pages, 0, 0))
			return 1;
		free(m);
		/* A buffer grown from NULL is a big block at once (it stayed glibc's, unpaged, until session 22). */
		m = realloc(no_block, size);
		if (!m)
			return 1;
		if (written_paged("a big block from realloc(NULL)", m, pages, 13, other, pages))
			return 1;
		free(m);
	}
	if (fixed_over_paged(other, pages))
		return 1;
	if (failures_say_why(other, pages))
		return 1;
	printf("remaptest: ok (%zu MiB)\n", size >> 20);
	return 0;
}
