/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What faultlat and uffd_floor share, so that the two sides of the floor
 * comparison fill, time and rank pages the same way: page patterns, the clock,
 * sizes, options, the measured pass, its percentiles and the keys both print.
 * Header-only: each benchmark stays one program.
 */
#ifndef FARMEM_BENCH_MEASURE_H
#define FARMEM_BENCH_MEASURE_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "size_arg.h"

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

/* ---- the measured pass and its figures, the same on both sides ---- */

/*
 * The pass's page order (a permutation from the seed, or in address order)
 * and a latency slot per access, the slots touched now so that none of their
 * faults lands in the pass. Small malloc'd buffers, below the shim's
 * threshold for the sizes the benchmarks use (8 bytes a page a pass).
 */
static int measure_prepare(const char *prog, const struct measure_opts *m, uint32_t **order, uint32_t **lat)
{
	uint64_t npages = m->size / PGSZ, naccess = npages * m->passes;

	*order = malloc(npages * sizeof **order);
	*lat = malloc(naccess * sizeof **lat);
	if (!*order || !*lat) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return -1;
	}
	for (uint64_t i = 0; i < npages; i++)
		(*order)[i] = (uint32_t)i;
	if (m->random_order) {
		uint64_t s = splitmix64(m->seed ^ 0x7065726d) | 1;
		for (uint64_t i = npages - 1; i > 0; i--) {
			uint64_t j = xs_next(&s) % (i + 1);
			uint32_t t = (*order)[i];
			(*order)[i] = (*order)[j];
			(*order)[j] = t;
		}
	}
	memset(*lat, 0, naccess * sizeof **lat);
	return 0;
}

/*
 * Pass number `pass` over the region in order: one 8-byte word of each page
 * read (checked against the fill) or written, each access timed alone into
 * lat[0, npages). Returns the words read wrong; what was read goes into *sink.
 */
static uint64_t measure_pass(uint8_t *region, const uint32_t *order, const struct measure_opts *m, uint64_t pass,
			     uint32_t *lat, uint64_t *sink)
{
	uint64_t npages = m->size / PGSZ, bad = 0;

	for (uint64_t i = 0; i < npages; i++) {
		uint32_t p = order[i];
		volatile uint64_t *w = (volatile uint64_t *)(region + (uint64_t)p * PGSZ);
		uint64_t a, b, v = 0;
		if (m->do_write) {
			uint64_t nv = pass + 1;
			a = now_ns();
			w[1] = nv;
			b = now_ns();
		} else {
			a = now_ns();
			v = w[0];
			b = now_ns();
		}
		uint64_t d = b - a;
		lat[i] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
		if (!m->do_write) {
			*sink += v;
			if (v != page_word0(m->seed, p))
				bad++;
		}
	}
	return bad;
}

/* What the pass measured: its accesses over the fault threshold ranked, its rates. */
struct measure_result {
	uint64_t naccess, faults, bad;
	double fill_s, wall_s, p50, p90, p99, p999, fmax, fmean, access_mean, pps, mbps, fps;
	long majflt, minflt, vcsw, ivcsw;
	int cpu_start, cpu_end;
};

/* The pass's figures into r: lat's slots over the threshold are moved to its front and sorted. */
static void measure_rank(const struct measure_opts *m, uint32_t *lat, uint64_t wall_ns, const struct rusage *ru0,
			   const struct rusage *ru1, struct measure_result *r)
{
	uint64_t thr_ns = (uint64_t)(m->thr_us * 1000.0), naccess = m->size / PGSZ * m->passes, nf = 0;
	double sum_all = 0, fsum = 0;

	for (uint64_t i = 0; i < naccess; i++) {
		sum_all += lat[i];
		if (lat[i] > thr_ns)
			lat[nf++] = lat[i];
	}
	qsort(lat, nf, sizeof *lat, cmp_u32);
	for (uint64_t i = 0; i < nf; i++)
		fsum += lat[i];
	r->naccess = naccess;
	r->faults = nf;
	r->wall_s = wall_ns / 1e9;
	r->p50 = pct_us(lat, nf, 0.50);
	r->p90 = pct_us(lat, nf, 0.90);
	r->p99 = pct_us(lat, nf, 0.99);
	r->p999 = pct_us(lat, nf, 0.999);
	r->fmax = nf ? lat[nf - 1] / 1000.0 : 0.0;
	r->fmean = nf ? fsum / nf / 1000.0 : 0.0;
	r->access_mean = naccess ? sum_all / naccess / 1000.0 : 0.0;
	r->pps = r->wall_s > 0 ? naccess / r->wall_s : 0;
	r->mbps = r->wall_s > 0 ? naccess * (double)PGSZ / r->wall_s / 1e6 : 0;
	r->fps = r->wall_s > 0 ? nf / r->wall_s : 0;
	r->majflt = ru1->ru_majflt - ru0->ru_majflt;
	r->minflt = ru1->ru_minflt - ru0->ru_minflt;
	r->vcsw = ru1->ru_nvcsw - ru0->ru_nvcsw;
	r->ivcsw = ru1->ru_nivcsw - ru0->ru_nivcsw;
}

static const char *measure_fill_name(enum fill_kind f)
{
	return f == FILL_RANDOM ? "random" : f == FILL_COMPRESSIBLE ? "compressible" : "zero";
}

/* The keys both programs print, as one JSON object left open for each program's own. */
static void measure_json(const char *prog, const struct measure_opts *m, const struct measure_result *r)
{
	printf("{\"program\": \"%s\", \"pattern\": \"%s\", \"op\": \"%s\", \"fill\": \"%s\", "
	       "\"size_bytes\": %" PRIu64 ", \"page_size\": %u, \"pages\": %" PRIu64 ", "
	       "\"passes\": %" PRIu64 ", \"accesses\": %" PRIu64 ", \"fill_s\": %.6f, "
	       "\"pass_wall_s\": %.6f, \"pages_per_s\": %.1f, \"mb_per_s\": %.2f, "
	       "\"fault_threshold_us\": %.3f, \"faults\": %" PRIu64 ", \"faults_per_s\": %.1f, "
	       "\"fault_p50_us\": %.3f, \"fault_p90_us\": %.3f, \"fault_p99_us\": %.3f, "
	       "\"fault_p999_us\": %.3f, \"fault_max_us\": %.3f, \"fault_mean_us\": %.3f, "
	       "\"access_mean_us\": %.3f, \"majflt\": %ld, \"minflt\": %ld, "
	       "\"vcsw\": %ld, \"ivcsw\": %ld, \"cpu_start\": %d, \"cpu_end\": %d, "
	       "\"bad_words\": %" PRIu64 "",
	       prog, m->random_order ? "random" : "seq", m->do_write ? "write" : "read", measure_fill_name(m->fill),
	       m->size, PGSZ, m->size / PGSZ, m->passes, r->naccess, r->fill_s, r->wall_s, r->pps, r->mbps, m->thr_us,
	       r->faults, r->fps, r->p50, r->p90, r->p99, r->p999, r->fmax, r->fmean, r->access_mean, r->majflt,
	       r->minflt, r->vcsw, r->ivcsw, r->cpu_start, r->cpu_end, r->bad);
}

/* The text lines both programs print: the pass, then its faults. */
static void measure_text(const char *prog, const struct measure_opts *m, const struct measure_result *r)
{
	printf("%s: pass %.3f s, %.0f pages/s, %.1f MB/s, mean access %.3f us\n", prog, r->wall_s, r->pps, r->mbps,
	       r->access_mean);
	printf("%s: faults (>%.1f us): %" PRIu64 ", %.0f/s, p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f max %.1f us\n",
	       prog, m->thr_us, r->faults, r->fps, r->p50, r->p90, r->p99, r->p999, r->fmax);
}

#endif
