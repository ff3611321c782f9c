/* SPDX-License-Identifier: Apache-2.0 */
/*
 * faultlat: per-access latency of touching every page of a large region once,
 * the program the core benchmark runs under farmem and under Linux swap.
 *
 *   faultlat --size 512M --pattern random|seq [--passes P] [--write] [--json]
 *            [--seed S] [--fill random|compressible|zero] [--thp]
 *            [--fault-threshold-us US]
 *
 * 1. Maps SIZE bytes anonymous private (one mapping, so the preload shim
 *    registers it) and writes every 4 KiB page once in full, so that under a
 *    small local budget most pages end up remote (or swapped out).
 * 2. The measured pass: touches each page exactly once, in a random
 *    permutation or sequentially, reading (or with --write, writing) one
 *    8-byte word, and times every access on its own with
 *    clock_gettime(CLOCK_MONOTONIC) (vDSO; the clocksource here is tsc).
 *    Reads are checked against the fill pattern (bad_words must be 0).
 *
 * Accesses slower than the fault threshold (1.0 us) count as faults; their
 * p50/p90/p99 and the pass throughput are reported, as text or, with --json,
 * as one JSON object on stdout.  uffd_floor prints the same keys.
 *
 * --split (under the farmem pager only): the pager's own figures for the
 * remote faults of the measured pass, read from this process's residency map
 * (uffd/resmap.h, split_*), set against the wait measured here. Per remote
 * fault: transport (memd round trip), copy (UFFDIO_COPY: copy into place and
 * wake), handler (the rest of the handler's time: lookup, reservation, direct
 * eviction) and kernel (the measured wait minus the handler's time: fault
 * entry, event delivery to the handler, the faulting thread running again).
 * The "fault" part is kernel + handler. The measured wait is the mean
 * over the accesses above the fault threshold, so the threshold must sit above
 * the noise (under TCG, tens of us) and the two fault counts should agree.
 *
 * Fill content: "random" (default) is incompressible, so zram gains nothing
 * from compression; "compressible" is half random, half zero; "zero" leaves
 * pages zero-filled apart from the checked word (zram stores those for free).
 * The region is madvise(MADV_NOHUGEPAGE)'d unless --thp, so every system
 * under comparison moves 4 KiB pages whatever the machine's THP setting.
 *
 * Exit status: 0 ok, 1 a read returned the wrong data, 2 usage, 3 system error.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "measure.h"
#include "resmap_self.h"
#define PROG "faultlat"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " --size SIZE [--pattern random|seq] [--passes P] [--write] [--json]\n"
		"                [--seed S] [--fill random|compressible|zero] [--thp]\n"
		"                [--fault-threshold-us US] [--split]\n"
		"  --size SIZE        region size (K/M/G suffixes, multiple of 4 KiB; required)\n"
		"  --pattern P        order of the measured pass: random permutation or seq (default random)\n"
		"  --passes P         measured passes over every page (default 1)\n"
		"  --write            the measured access writes a word instead of reading one\n"
		"  --json             one JSON object on stdout instead of text\n"
		"  --seed S           seed of the fill pattern and the permutation (default 1)\n"
		"  --fill KIND        page content: random (default), compressible (half zero), zero\n"
		"  --thp              do not madvise(MADV_NOHUGEPAGE) the region\n"
		"  --fault-threshold-us US   accesses slower than this count as faults (default 1.0)\n"
		"  --split            under the farmem pager: split the remote faults' time into\n"
		"                     kernel, handler, transport and copy (the pager's residency map)\n");
}

struct split_snap { uint64_t faults, handler_ns, transport_ns, copy_ns; };

static struct split_snap split_read(const struct fm_resmap_hdr *h)
{
	const struct fm_pager_stats *st = &h->stats;
	return (struct split_snap){
		.faults = __atomic_load_n(&st->split_faults, __ATOMIC_RELAXED),
		.handler_ns = __atomic_load_n(&st->split_handler_ns, __ATOMIC_RELAXED),
		.transport_ns = __atomic_load_n(&st->split_transport_ns, __ATOMIC_RELAXED),
		.copy_ns = __atomic_load_n(&st->split_copy_ns, __ATOMIC_RELAXED),
	};
}

int main(int argc, char **argv)
{
	enum { O_THP = O_OWN, O_SPLIT };
	static const struct option opts[] = {
		MEASURE_LONGOPTS,
		{"thp", no_argument, 0, O_THP},
		{"split", no_argument, 0, O_SPLIT},
		{0, 0, 0, 0},
	};
	struct measure_opts m = MEASURE_OPTS_INIT;
	int thp = 0, split = 0;

	for (;;) {
		int o = getopt_long(argc, argv, "", opts, NULL), r;

		if (o == -1)
			break;
		r = measure_opt(PROG, &m, o, optarg);
		if (r < 0)
			return 2;
		if (r)
			continue;
		switch (o) {
		case O_THP: thp = 1; break;
		case O_SPLIT: split = 1; break;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (measure_opts_check(PROG, &m, argc, argv)) {
		usage(stderr);
		return 2;
	}
	uint64_t size = m.size, npages = size / PGSZ;
	uint32_t *order, *lat;
	if (measure_prepare(PROG, &m, &order, &lat))
		return 3;

	uint8_t *region = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED) {
		fprintf(stderr, PROG ": mmap %" PRIu64 " bytes: %s\n", size, strerror(errno));
		return 3;
	}
	if (!thp)
		madvise(region, size, MADV_NOHUGEPAGE);

	uint64_t f0 = now_ns();
	for (uint64_t p = 0; p < npages; p++)
		fill_page(region + p * PGSZ, m.seed, p, m.fill);
	struct measure_result r = { .fill_s = (now_ns() - f0) / 1e9 };

	const struct fm_resmap_hdr *rm = NULL;
	struct split_snap sp0 = { 0 }, sp1 = { 0 };
	if (split) {
		rm = fm_resmap_self();
		if (!rm) {
			fprintf(stderr, PROG ": --split: no farmem residency map in this process "
				"(run it under the pager: LD_PRELOAD=libfarmem_preload.so or farmem run)\n");
			return 3;
		}
	}
	struct rusage ru0, ru1;
	uint64_t sink = 0;
	r.cpu_start = sched_getcpu();
	getrusage(RUSAGE_SELF, &ru0);
	if (rm)
		sp0 = split_read(rm);
	uint64_t w0 = now_ns();
	for (uint64_t pass = 0; pass < m.passes; pass++)
		r.bad += measure_pass(region, order, &m, pass, lat + pass * npages, &sink);
	uint64_t wall_ns = now_ns() - w0;
	if (rm)
		sp1 = split_read(rm);
	getrusage(RUSAGE_SELF, &ru1);
	r.cpu_end = sched_getcpu();
	measure_rank(&m, lat, wall_ns, &ru0, &ru1, &r);

	/* Per remote fault, in us: the measured wait and the pager's parts of it. */
	uint64_t sn = sp1.faults - sp0.faults;
	double s_wait = r.fmean, s_hand = 0, s_xp = 0, s_cp = 0, s_kern = 0;
	if (sn) {
		s_xp = (sp1.transport_ns - sp0.transport_ns) / 1e3 / sn;
		s_cp = (sp1.copy_ns - sp0.copy_ns) / 1e3 / sn;
		s_hand = (sp1.handler_ns - sp0.handler_ns) / 1e3 / sn - s_xp - s_cp;
		s_kern = s_wait - (s_hand + s_xp + s_cp);
	}

	if (m.json) {
		measure_json(PROG, &m, &r);
		if (rm)
			printf(", \"split_remote_faults\": %" PRIu64 ", \"split_wait_us\": %.3f, "
			       "\"split_kernel_us\": %.3f, \"split_handler_us\": %.3f, "
			       "\"split_transport_us\": %.3f, \"split_copy_us\": %.3f",
			       sn, s_wait, s_kern, s_hand, s_xp, s_cp);
		printf("}\n");
	} else {
		printf(PROG ": %s %s, %" PRIu64 " pages (%" PRIu64 " MiB) x %" PRIu64 " passes, fill %s %.3f s\n",
		       m.random_order ? "random" : "seq", m.do_write ? "write" : "read", npages, size >> 20, m.passes,
		       measure_fill_name(m.fill), r.fill_s);
		measure_text(PROG, &m, &r);
		printf(PROG ": majflt %ld minflt %ld vcsw %ld ivcsw %ld cpu %d->%d bad_words %" PRIu64 "\n",
		       r.majflt, r.minflt, r.vcsw, r.ivcsw, r.cpu_start, r.cpu_end, r.bad);
		if (rm && sn && s_wait > 0)
			printf(PROG ": split of %" PRIu64 " remote faults (pager) vs %" PRIu64 " measured: "
			       "%.1f us/fault = kernel %.1f (%.0f%%) + handler %.1f (%.0f%%) + "
			       "transport %.1f (%.0f%%) + copy %.1f (%.0f%%)\n",
			       sn, r.faults, s_wait, s_kern, 100 * s_kern / s_wait, s_hand, 100 * s_hand / s_wait,
			       s_xp, 100 * s_xp / s_wait, s_cp, 100 * s_cp / s_wait);
		else if (rm)
			printf(PROG ": split: no remote faults in the measured pass\n");
	}
	fflush(stdout);
	(void)sink;
	free(order);
	free(lat);
	munmap(region, size);
	if (r.bad) {
		fprintf(stderr, PROG ": %" PRIu64 " reads returned the wrong data\n", r.bad);
		return 1;
	}
	return 0;
}
