// SPDX-License-Identifier: Apache-2.0
/*
 * swapva_bench: cost of moving/swapping n-page objects with each libswapva
 * backend vs. memmove, side by side in one run. Objects rotate through a
 * pool larger than the last-level cache, so memmove sees cold-ish data as a
 * GC copy would. Both sides of every object are populated before each timed
 * call (a collector moves into space that held garbage), so MOVE includes
 * freeing the destination's old pages where the backend does that.
 *
 *   swapva_bench [--backends uffd,kmod,memmove] [--sizes 1,2,4,...]
 *                [--iters N] [--pool-mb M] [--op move|swap|both]
 *                [--dst populated|empty]
 * --dst empty drops MOVE's destination before each timed call (untimed), as
 * farmem's discard leaves a collector's free regions: memmove then takes a
 * zero-fill fault per page, UFFDIO_MOVE one move.
 * One JSON object per (backend, op, pages) on stdout:
 *   {"backend":"uffd","op":"move","pages":64,"median_ns":...,"iters":...}
 * backend "copy" is the plain memmove baseline (no library).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../kmod-swapva/libswapva.h"

#define PS 4096UL

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void touch(char *p, size_t len)
{
	for (size_t o = 0; o < len; o += PS)
		p[o] = (char)(o >> 12 | 1);
}

static void copy_swap(char *a, char *b, size_t len)
{
	static char bounce[64 * 1024];

	for (size_t o = 0; o < len; o += sizeof(bounce)) {
		size_t n = len - o < sizeof(bounce) ? len - o : sizeof(bounce);

		memcpy(bounce, a + o, n);
		memcpy(a + o, b + o, n);
		memcpy(b + o, bounce, n);
	}
}

static int dcmp(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

/* ns per op (median) for one (backend, op, pages) */
static double measure(struct swapva_ctx *c, int copy, unsigned op, size_t pages, int iters,
		      size_t pool_bytes, int dst_empty, int *err)
{
	size_t len = pages * PS;
	size_t k = pool_bytes / (2 * len);

	if (k < 2)
		k = 2;
	if (k > 4096)
		k = 4096;
	char *m = mmap(NULL, 2 * k * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED) {
		*err = errno;
		return 0;
	}
	madvise(m, 2 * k * len, MADV_NOHUGEPAGE);
	touch(m, 2 * k * len);
	if (!copy)  /* as a collector registers its heap once */
		swapva_register(c, m, 2 * k * len);
	double *t = calloc((size_t)iters, sizeof(*t));
	int n = 0;

	*err = 0;
	for (int i = 0; i < iters; i++) {
		char *a = m + (size_t)(i % k) * 2 * len, *b = a + len;

		if (i >= (int)k && op == SWAPVA_OP_MOVE && !copy) {
			touch(a, len);  /* refill what the last move emptied (untimed) */
			touch(b, len);
		}
		if (dst_empty && op == SWAPVA_OP_MOVE)
			madvise(b, len, MADV_DONTNEED);
		double t0 = now_ns();
		int e = 0;

		if (copy) {
			if (op == SWAPVA_OP_MOVE)
				memmove(b, a, len);
			else
				copy_swap(a, b, len);
		} else {
			struct swapva_seg s = { (uint64_t)a, (uint64_t)b, len };

			e = swapva_batch(c, op, &s, 1, NULL);
		}
		t[n++] = now_ns() - t0;
		if (e) {
			*err = e;
			break;
		}
	}
	if (!copy)
		swapva_release(c, m, 2 * k * len);
	munmap(m, 2 * k * len);
	/* median: the machine is shared, the mean mostly measures the others */
	qsort(t, (size_t)n, sizeof(*t), dcmp);
	double med = n ? t[n / 2] : 0;

	free(t);
	return med;
}

int main(int argc, char **argv)
{
	const char *backends = NULL, *sizes = "1,2,4,8,16,32,64,128,256,512,1024,4096", *ops = "both";
	int iters = 0, dst_empty = 0;
	size_t pool = 64UL << 20;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--backends"))
			backends = argv[i + 1];
		else if (!strcmp(argv[i], "--sizes"))
			sizes = argv[i + 1];
		else if (!strcmp(argv[i], "--iters"))
			iters = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--pool-mb"))
			pool = strtoul(argv[i + 1], NULL, 0) << 20;
		else if (!strcmp(argv[i], "--op"))
			ops = argv[i + 1];
		else if (!strcmp(argv[i], "--dst") && (!strcmp(argv[i + 1], "empty") ||
							 !strcmp(argv[i + 1], "populated")))
			dst_empty = !strcmp(argv[i + 1], "empty");
		else {
			fprintf(stderr, "usage: see the comment at the top of swapva_bench.c\n");
			return 2;
		}
	}
	unsigned avail = swapva_available();
	char list[128];

	if (!backends) {
		snprintf(list, sizeof(list), "%s%scopy", avail & 2 ? "kmod," : "", avail & 4 ? "uffd," : "");
		backends = list;
	}
	printf("{\"available\":\"%s%smemmove\"}\n", avail & 2 ? "kmod," : "", avail & 4 ? "uffd," : "");
	char *bl = strdup(backends);

	for (char *sv1, *bn = strtok_r(bl, ",", &sv1); bn; bn = strtok_r(NULL, ",", &sv1)) {
		int copy = !strcmp(bn, "copy");
		enum swapva_backend want = copy ? SWAPVA_BACKEND_MEMMOVE : SWAPVA_BACKEND_AUTO;
		struct swapva_ctx *c;

		for (int b = 1; b < SWAPVA_NBACKENDS; b++)
			if (!strcmp(bn, swapva_backend_name(b)))
				want = b;
		if (swapva_open(&c, want)) {
			printf("{\"backend\":\"%s\",\"error\":\"unavailable\"}\n", bn);
			continue;
		}
		swapva_set_strict(c, 1);
		for (int o = 0; o < 2; o++) {
			unsigned op = o ? SWAPVA_OP_SWAP : SWAPVA_OP_MOVE;

			if (strcmp(ops, "both") && strcmp(ops, o ? "swap" : "move"))
				continue;
			char *sl = strdup(sizes);

			for (char *sv2, *sn = strtok_r(sl, ",", &sv2); sn; sn = strtok_r(NULL, ",", &sv2)) {
				size_t pages = strtoul(sn, NULL, 0);
				int it = iters ? iters : (int)(pages >= 1024 ? 60 : pages >= 64 ? 300 : 2000);
				int e;

				measure(c, copy, op, pages, it / 10 + 1, pool, dst_empty, &e);  /* warm up */
				double ns = measure(c, copy, op, pages, it, pool, dst_empty, &e);

				printf("{\"backend\":\"%s\",\"op\":\"%s\",\"pages\":%zu,\"median_ns\":%.0f,"
				       "\"iters\":%d,\"dst\":\"%s\",\"error\":\"%s\"}\n",
				       bn, o ? "swap" : "move", pages, ns, it,
				       dst_empty && !o ? "empty" : "populated", e ? strerror(e) : "");
			}
			free(sl);
		}
		swapva_close(c);
	}
	free(bl);
	return 0;
}
