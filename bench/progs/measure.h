/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What faultlat and uffd_floor share, so that the two sides of the floor
 * comparison fill, time and rank pages the same way: page patterns, the clock,
 * sizes, percentiles. Header-only: each benchmark stays one program.
 */
#ifndef FARMEM_BENCH_MEASURE_H
#define FARMEM_BENCH_MEASURE_H

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PGSZ 4096u
#define WORDS (PGSZ / 8u)

enum fill_kind { FILL_RANDOM, FILL_COMPRESSIBLE, FILL_ZERO };

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static inline uint64_t xs_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static uint64_t page_seed(uint64_t seed, uint64_t page)
{
	uint64_t h = splitmix64(splitmix64(seed ^ 0x6661756c746c6174ULL) ^ page);
	return h ? h : 1;
}

/* Word 0 of a page: the one the measured pass reads and checks. */
static uint64_t page_word0(uint64_t seed, uint64_t page)
{
	uint64_t s = page_seed(seed, page);
	return xs_next(&s);
}

static void fill_page(uint8_t *p, uint64_t seed, uint64_t page, enum fill_kind k)
{
	uint64_t *w = (uint64_t *)p;
	uint64_t s = page_seed(seed, page);
	unsigned n = k == FILL_RANDOM ? WORDS : k == FILL_COMPRESSIBLE ? WORDS / 2 : 1;
	for (unsigned i = 0; i < n; i++)
		w[i] = xs_next(&s);
	/* the rest stays zero (fresh anonymous memory) */
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'k': case 'K': mul = 1ULL << 10; end++; break;
	case 'm': case 'M': mul = 1ULL << 20; end++; break;
	case 'g': case 'G': mul = 1ULL << 30; end++; break;
	case 't': case 'T': mul = 1ULL << 40; end++; break;
	default: break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array, in microseconds. */
static double pct_us(const uint32_t *sorted, uint64_t n, double q)
{
	if (!n)
		return 0.0;
	uint64_t r = (uint64_t)(q * (double)n + 0.999999999);
	if (r < 1)
		r = 1;
	if (r > n)
		r = n;
	return sorted[r - 1] / 1000.0;
}


/* ---- the options both benchmarks take (each adds its own from O_OWN on) ---- */

enum { O_SIZE = 1, O_PATTERN, O_PASSES, O_WRITE, O_JSON, O_SEED, O_FILL, O_THR, O_HELP, O_OWN };

#define MEASURE_LONGOPTS                                                    \
	{"size", required_argument, 0, O_SIZE},                             \
	{"pattern", required_argument, 0, O_PATTERN},                       \
	{"passes", required_argument, 0, O_PASSES},                         \
	{"write", no_argument, 0, O_WRITE},                                 \
	{"json", no_argument, 0, O_JSON},                                   \
	{"seed", required_argument, 0, O_SEED},                             \
	{"fill", required_argument, 0, O_FILL},                             \
	{"fault-threshold-us", required_argument, 0, O_THR},                \
	{"help", no_argument, 0, O_HELP}

struct measure_opts {
	uint64_t size, seed, passes;
	int random_order, do_write, json;
	enum fill_kind fill;
	double thr_us;
};

#define MEASURE_OPTS_INIT { .seed = 1, .passes = 1, .random_order = 1, .fill = FILL_RANDOM, .thr_us = 1.0 }

/* 1 if o is a shared option (applied), 0 if it is not, -1 after a message
 * when its value is bad. */
static int measure_opt(const char *prog, struct measure_opts *m, int o, const char *arg)
{
	char *end;

	errno = 0;
	switch (o) {
	case O_SIZE:
		if (parse_size(arg, &m->size) || !m->size || m->size % PGSZ) {
			fprintf(stderr, "%s: bad --size '%s' (a positive multiple of 4 KiB)\n", prog, arg);
			return -1;
		}
		return 1;
	case O_PATTERN:
		if (!strcmp(arg, "random") || !strcmp(arg, "seq") || !strcmp(arg, "sequential")) {
			m->random_order = !strcmp(arg, "random");
			return 1;
		}
		fprintf(stderr, "%s: bad --pattern '%s' (random or seq)\n", prog, arg);
		return -1;
	case O_PASSES:
		m->passes = strtoull(arg, &end, 10);
		if (errno || *end || !m->passes || m->passes > 1000) {
			fprintf(stderr, "%s: bad --passes '%s'\n", prog, arg);
			return -1;
		}
		return 1;
	case O_WRITE:
		m->do_write = 1;
		return 1;
	case O_JSON:
		m->json = 1;
		return 1;
	case O_SEED:
		m->seed = strtoull(arg, &end, 0);
		if (errno || *end) {
			fprintf(stderr, "%s: bad --seed '%s'\n", prog, arg);
			return -1;
		}
		return 1;
	case O_FILL:
		if (!strcmp(arg, "random"))
			m->fill = FILL_RANDOM;
		else if (!strcmp(arg, "compressible"))
			m->fill = FILL_COMPRESSIBLE;
		else if (!strcmp(arg, "zero"))
			m->fill = FILL_ZERO;
		else {
			fprintf(stderr, "%s: bad --fill '%s'\n", prog, arg);
			return -1;
		}
		return 1;
	case O_THR:
		m->thr_us = strtod(arg, &end);
		if (errno || *end || !(m->thr_us > 0)) {
			fprintf(stderr, "%s: bad --fault-threshold-us '%s'\n", prog, arg);
			return -1;
		}
		return 1;
	default:
		return 0;
	}
}

/* After parsing: no stray arguments, a size, and page indexes that fit 32 bits. */
static int measure_opts_check(const char *prog, const struct measure_opts *m, int argc, char **argv)
{
	if (optind < argc) {
		fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
		return -1;
	}
	if (!m->size) {
		fprintf(stderr, "%s: --size is required\n", prog);
		return -1;
	}
	if (m->size / PGSZ > UINT32_MAX) {
		fprintf(stderr, "%s: --size too large\n", prog);
		return -1;
	}
	return 0;
}

#endif
