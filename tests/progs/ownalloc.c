// SPDX-License-Identifier: Apache-2.0
/*
 * ownalloc: a program whose executable defines malloc and the rest of the
 * family (as rustc does with jemalloc), so that its calls, and glibc's own
 * (the dynamic loader's, a thread's TLS), never reach the preload shim's
 * malloc. The allocator maps its chunks with mmap while it holds its lock,
 * as jemalloc does; a call of the allocator from inside itself on the same
 * thread (the shim starting a pager from that mmap) aborts with a message
 * instead of hanging. A library's constructor (libownalloc_early.so) takes a
 * big block before the shim's constructor runs. Blocks of every size are
 * written and read back by the main thread and two others. The program's
 * locale (setlocale, whose data glibc allocates with this malloc) goes cold
 * while they run; then more threads start, each reading it at its start with
 * every signal blocked (glibc's __ctype_init), and check their character
 * classes.
 *
 *   ownalloc [--mib N] [--syscall-mmap | --foreign-mmap]
 *
 * prints "ownalloc ok" when every word read back right. --syscall-mmap maps
 * the chunks with syscall(SYS_mmap), as tcmalloc's mmap does: the shim tells
 * them for the allocator's by the code that called syscall(). --foreign-mmap
 * has libownalloc_early.so map them (early_map): the shim cannot tell them
 * for the allocator's, and pages them where faults come by SIGBUS (the
 * locale's data with them).
 */
#include <ctype.h>
#include <errno.h>
#include <locale.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mix.h"

#define CHUNK (4u << 20)
#define HDR 16u

size_t early_check(void);

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;
static char *chunk_at, *chunk_end;
static int syscall_mmap, foreign_mmap;

void *early_map(size_t n);

static void *map(size_t n)
{
	if (foreign_mmap)
		return early_map(n);
	if (syscall_mmap)
		return (void *)syscall(SYS_mmap, NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

static void enter(void)
{
	static const char msg[] = "ownalloc: the allocator was called from inside itself\n";

	if (inside) {
		if (write(2, msg, sizeof(msg) - 1) < 0)
			_exit(3);
		abort();
	}
	inside = 1;
	pthread_mutex_lock(&alloc_lock);
}

static void leave(void)
{
	pthread_mutex_unlock(&alloc_lock);
	inside = 0;
}

/* n bytes aligned to align (a power of two, at least HDR), its size kept in the header before it. */
static void *take(size_t n, size_t align)
{
	size_t need;
	char *p;

	if (n > SIZE_MAX / 2 || align > CHUNK / 4) {
		errno = ENOMEM;
		return NULL;
	}
	need = n + align + HDR;
	enter();
	if (need > CHUNK / 2) {
		/* A big block: a mapping of its own, made under the lock. */
		p = map(need);
	} else {
		if (!chunk_at || (size_t)(chunk_end - chunk_at) < need) {
			chunk_at = map(CHUNK);
			chunk_end = chunk_at == MAP_FAILED ? NULL : chunk_at + CHUNK;
		}
		p = chunk_at;
		if (p != MAP_FAILED)
			chunk_at += need;
	}
	leave();
	if (p == MAP_FAILED) {
		errno = ENOMEM;
		return NULL;
	}
	p = (char *)(((uintptr_t)p + HDR + align - 1) & ~(uintptr_t)(align - 1));
	((size_t *)(void *)p)[-1] = n;
	return p;
}

void *malloc(size_t n) { return take(n, HDR); }

void *calloc(size_t a, size_t b)
{
	size_t n;

	if (__builtin_mul_overflow(a, b, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	return take(n, HDR); /* fresh from mmap: zero */
}

void free(void *p) { (void)p; /* a bump allocator: nothing goes back */ }

size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-1] : 0; }

void *realloc(void *p, size_t n)
{
	void *q = take(n, HDR);
	size_t had = malloc_usable_size(p);

	if (q && p)
		memcpy(q, p, had < n ? had : n);
	return q;
}

void *memalign(size_t align, size_t n) { return take(n, align < HDR ? HDR : align); }
void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) & ~(size_t)4095); }

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p = memalign(align, n);

	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

struct work {
	size_t bytes, seed, bad;
};

/* A thread of the second round: its character classes are the program's locale's. */
static void *classify(void *arg)
{
	size_t *bad = arg;

	*bad = !isalpha('q') || isalpha('7') || toupper('q') != 'Q' || tolower('Q') != 'q' || !isspace('\t');
	return NULL;
}

/* Blocks of 16 B to 64 KiB, some grown by realloc, up to w->bytes in all: written, then read back twice. */
static void *churn(void *arg)
{
	struct work *w = arg;
	size_t cap = w->bytes / 16 + 16, n = 0, total = 0;
	uint64_t **blk = calloc(cap, sizeof(*blk));
	size_t *len = calloc(cap, sizeof(*len));

	if (!blk || !len)
		abort();
	while (total < w->bytes && n < cap) {
		size_t words = 2 + mix(w->seed + n) % 8192;
		uint64_t *b = malloc(16);

		if (!b || !(b = realloc(b, words * 8)))
			abort();
		for (size_t i = 0; i < words; i++)
			b[i] = mix(w->seed ^ (n << 20) ^ i);
		blk[n] = b;
		len[n++] = words;
		total += words * 8;
	}
	for (int pass = 0; pass < 2; pass++)
		for (size_t k = 0; k < n; k++)
			for (size_t i = 0; i < len[k]; i++)
				w->bad += blk[k][i] != mix(w->seed ^ (k << 20) ^ i);
	return NULL;
}

int main(int argc, char **argv)
{
	size_t mib = 64, bad;
	struct work w[3];
	pthread_t th[2];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
			mib = strtoul(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "--syscall-mmap")) {
			syscall_mmap = 1;
		} else if (!strcmp(argv[i], "--foreign-mmap")) {
			foreign_mmap = 1;
		} else {
			fprintf(stderr, "usage: ownalloc [--mib N] [--syscall-mmap | --foreign-mmap]\n");
			return 2;
		}
	}
	/*
	 * The locale's data in a chunk mapped now, under the pager (the chunk
	 * before may predate it): a few blocks of 1 MiB use the rest of it up.
	 */
	for (int i = 0; i < 5; i++)
		if (!malloc(1 << 20))
			return 1;
	if (!setlocale(LC_ALL, "C.UTF-8")) {
		fprintf(stderr, "ownalloc: no C.UTF-8 locale\n");
		return 1;
	}
	for (int i = 0; i < 3; i++)
		w[i] = (struct work){ .bytes = (mib << 20) / 4, .seed = 0x51ed + i };
	for (int i = 0; i < 2; i++)
		if (pthread_create(&th[i], NULL, churn, &w[i + 1]))
			return 1;
	churn(&w[0]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	{
		/* A quarter of the run in one block: a mapping of its own. */
		size_t words = (mib << 20) / 4 / 8;
		uint64_t *big = malloc(words * 8);

		if (!big)
			return 1;
		for (size_t i = 0; i < words; i++)
			big[i] = mix(i ^ 0xb16);
		bad = 0;
		for (size_t i = 0; i < words; i++)
			bad += big[i] != mix(i ^ 0xb16);
	}
	bad += w[0].bad + w[1].bad + w[2].bad + early_check();
	for (int round = 0; round < 4; round++) {
		size_t wrong[2] = { 0 };

		for (int i = 0; i < 2; i++)
			if (pthread_create(&th[i], NULL, classify, &wrong[i]))
				return 1;
		for (int i = 0; i < 2; i++) {
			pthread_join(th[i], NULL);
			bad += wrong[i];
		}
	}
	if (bad) {
		printf("ownalloc: %zu words wrong\n", bad);
		return 1;
	}
	printf("ownalloc ok\n");
	return 0;
}
