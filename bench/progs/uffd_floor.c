/* SPDX-License-Identifier: Apache-2.0 */
/*
 * uffd_floor: the bare userfaultfd floor that every farmem fault is compared with.
 *
 *   uffd_floor --size 512M --pattern random|seq [--passes P] [--write] [--json]
 *              [--seed S] [--fill random|compressible|zero] [--pin none|same|split]
 *              [--fault-threshold-us US]
 *
 * The same measured pass as faultlat (every page touched once, one 8-byte word,
 * each access timed on its own), but the region is registered with this
 * program's own userfaultfd (UFFDIO_REGISTER_MODE_MISSING) and never touched
 * beforehand, so every access is a missing fault.  One handler thread blocks in
 * read() and serves each fault with one UFFDIO_COPY of 4 KiB from a local,
 * pre-filled store of SIZE bytes (same content as faultlat's fill), so the
 * figure is the cost of the kernel's uffd round trip with no transport at all.
 * Between passes the region is zapped with MADV_DONTNEED so every pass faults.
 *
 * --pin: none (default, the scheduler decides, as for farmem's threads), same
 * (faulting and handler threads both on CPU 0), split (faulter CPU 0, handler
 * CPU 1).  On this VM kind a cross-CPU wakeup costs ~8 us (anchors.md §8).
 *
 * Output: the same text lines and JSON keys as faultlat, plus uffd_faults (the
 * faults the handler served: equal to the accesses), copy_retries, handler_cpu
 * and pin.  Needs root or access to /dev/userfaultfd: it opens /dev/userfaultfd
 * and asks for a descriptor with USERFAULTFD_IOC_NEW, and falls back to the
 * userfaultfd(2) system call.
 *
 * Exit status: 0 ok, 1 a read returned the wrong data, 2 usage, 3 system error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "measure.h"
#define PROG "uffd_floor"
#define MSG_BATCH 64

/* ---- the userfaultfd side ---- */

struct handler {
	int uffd;
	uint8_t *region;
	const uint8_t *store;
	uint64_t size;
	int pin_cpu;                 /* -1: unpinned */
	atomic_uint_fast64_t served;
	atomic_uint_fast64_t retries;
	atomic_int cpu;
	atomic_int stop;             /* set, then touch the sentinel page: the handler exits */
};

/* The sentinel page just past the measured region is served from here. */
static uint8_t zero_page[PGSZ] __attribute__((aligned(PGSZ)));

static int pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof set, &set);
}

static int open_uffd(void)
{
	int fd = -1;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC);
		close(dev);
	}
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	return fd;
}

/* The faulting thread stays blocked until its fault is served: a handler that
 * cannot serve it must end the process. */
static void handler_fail(const char *what, int err)
{
	fprintf(stderr, PROG ": handler: %s: %s\n", what, strerror(err));
	fflush(stderr);
	_exit(3);
}

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct uffd_msg msgs[MSG_BATCH];

	if (h->pin_cpu >= 0)
		pin_to(h->pin_cpu);
	for (;;) {
		ssize_t n = read(h->uffd, msgs, sizeof msgs);   /* blocks */
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			handler_fail("read", errno);
		}
		atomic_store_explicit(&h->cpu, sched_getcpu(), memory_order_relaxed);
		for (size_t i = 0; i < (size_t)n / sizeof msgs[0]; i++) {
			if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			uint64_t addr = msgs[i].arg.pagefault.address & ~(uint64_t)(PGSZ - 1);
			uint64_t off = addr - (uint64_t)(uintptr_t)h->region;
			int sentinel = off >= h->size;
			struct uffdio_copy c = {
				.dst = addr,
				.src = sentinel ? (uint64_t)(uintptr_t)zero_page
						: (uint64_t)(uintptr_t)(h->store + off),
				.len = PGSZ,
				.mode = 0,
			};
			while (ioctl(h->uffd, UFFDIO_COPY, &c) < 0) {
				if (errno == EEXIST) {        /* already there: just wake */
					struct uffdio_range r = { .start = addr, .len = PGSZ };
					ioctl(h->uffd, UFFDIO_WAKE, &r);
					break;
				}
				if (errno == EAGAIN || errno == EINTR) {
					atomic_fetch_add_explicit(&h->retries, 1, memory_order_relaxed);
					c.copy = 0;
					continue;
				}
				handler_fail("UFFDIO_COPY", errno);
			}
			if (sentinel) {
				if (atomic_load(&h->stop))
					return NULL;
				continue;
			}
			atomic_fetch_add_explicit(&h->served, 1, memory_order_relaxed);
		}
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " --size SIZE [--pattern random|seq] [--passes P] [--write] [--json]\n"
		"                  [--seed S] [--fill random|compressible|zero] [--pin none|same|split]\n"
		"                  [--fault-threshold-us US]\n"
		"  --size SIZE        region size (K/M/G suffixes, multiple of 4 KiB; required)\n"
		"  --pattern P        order of the measured pass: random permutation or seq (default random)\n"
		"  --passes P         measured passes (default 1); the region is zapped between passes\n"
		"  --write            the measured access writes a word instead of reading one\n"
		"  --json             one JSON object on stdout instead of text\n"
		"  --seed S           seed of the store's content and the permutation (default 1)\n"
		"  --fill KIND        store content: random (default), compressible, zero\n"
		"  --pin WHERE        none (default), same (both threads on CPU 0), split (CPU 0 and 1)\n"
		"  --fault-threshold-us US   accesses slower than this count as faults (default 1.0)\n");
}

int main(int argc, char **argv)
{
	enum { O_PIN = O_OWN };
	static const struct option opts[] = {
		MEASURE_LONGOPTS,
		{"pin", required_argument, 0, O_PIN},
		{0, 0, 0, 0},
	};
	struct measure_opts m = MEASURE_OPTS_INIT;
	const char *pin = "none";

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
		case O_PIN:
			if (strcmp(optarg, "none") && strcmp(optarg, "same") && strcmp(optarg, "split")) {
				fprintf(stderr, PROG ": bad --pin '%s' (none, same or split)\n", optarg);
				return 2;
			}
			pin = optarg;
			break;
		case O_HELP: usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (measure_opts_check(PROG, &m, argc, argv)) {
		usage(stderr);
		return 2;
	}
	uint64_t size = m.size, seed = m.seed, passes = m.passes;
	int random_order = m.random_order, do_write = m.do_write, json = m.json;
	enum fill_kind fill = m.fill;
	double thr_us = m.thr_us;
	uint64_t npages = size / PGSZ;
	uint64_t naccess = npages * passes;

	uint32_t *order = malloc(npages * sizeof *order);
	uint32_t *lat = malloc(naccess * sizeof *lat);
	if (!order || !lat) {
		fprintf(stderr, PROG ": out of memory\n");
		return 3;
	}
	for (uint64_t i = 0; i < npages; i++)
		order[i] = (uint32_t)i;
	if (random_order) {
		uint64_t s = splitmix64(seed ^ 0x7065726d) | 1;
		for (uint64_t i = npages - 1; i > 0; i--) {
			uint64_t j = xs_next(&s) % (i + 1);
			uint32_t t = order[i];
			order[i] = order[j];
			order[j] = t;
		}
	}
	memset(lat, 0, naccess * sizeof *lat);

	/* The store: what a memory server would hold, here local and pre-filled. */
	uint8_t *store = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* the region plus one sentinel page, used to stop the handler */
	uint8_t *region = mmap(NULL, size + PGSZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (store == MAP_FAILED || region == MAP_FAILED) {
		fprintf(stderr, PROG ": mmap %" PRIu64 " bytes: %s\n", size, strerror(errno));
		return 3;
	}
	madvise(region, size + PGSZ, MADV_NOHUGEPAGE);
	uint64_t f0 = now_ns();
	for (uint64_t p = 0; p < npages; p++)
		fill_page(store + p * PGSZ, seed, p, fill);
	uint64_t fill_ns = now_ns() - f0;

	int uffd = open_uffd();
	if (uffd < 0) {
		fprintf(stderr, PROG ": userfaultfd: %s (needs root or access to /dev/userfaultfd)\n",
			strerror(errno));
		return 3;
	}
	struct uffdio_api api = { .api = UFFD_API, .features = 0 };
	if (ioctl(uffd, UFFDIO_API, &api) < 0) {
		fprintf(stderr, PROG ": UFFDIO_API: %s\n", strerror(errno));
		return 3;
	}
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)region, .len = size + PGSZ },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0) {
		fprintf(stderr, PROG ": UFFDIO_REGISTER: %s\n", strerror(errno));
		return 3;
	}
	if (!(reg.ioctls & (1ULL << _UFFDIO_COPY))) {
		fprintf(stderr, PROG ": UFFDIO_COPY not available on the range\n");
		return 3;
	}

	static struct handler h;
	h.uffd = uffd;
	h.region = region;
	h.store = store;
	h.size = size;
	h.pin_cpu = !strcmp(pin, "same") ? 0 : !strcmp(pin, "split") ? 1 : -1;
	atomic_init(&h.cpu, -1);
	if (strcmp(pin, "none") && pin_to(0)) {
		fprintf(stderr, PROG ": sched_setaffinity: %s\n", strerror(errno));
		return 3;
	}
	pthread_t ht;
	int e = pthread_create(&ht, NULL, handler_main, &h);
	if (e) {
		fprintf(stderr, PROG ": pthread_create: %s\n", strerror(e));
		return 3;
	}

	struct rusage ru0, ru1;
	uint64_t bad = 0, sink = 0, wall_ns = 0;
	int cpu_start = sched_getcpu();
	getrusage(RUSAGE_SELF, &ru0);
	uint64_t k = 0;
	for (uint64_t pass = 0; pass < passes; pass++) {
		if (pass)
			madvise(region, size, MADV_DONTNEED);   /* every pass faults again */
		uint64_t w0 = now_ns();
		for (uint64_t i = 0; i < npages; i++, k++) {
			uint32_t p = order[i];
			volatile uint64_t *w = (volatile uint64_t *)(region + (uint64_t)p * PGSZ);
			uint64_t a, b, v = 0;
			if (do_write) {
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
			lat[k] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
			if (!do_write) {
				sink += v;
				if (v != page_word0(seed, p))
					bad++;
			}
		}
		wall_ns += now_ns() - w0;
	}
	getrusage(RUSAGE_SELF, &ru1);
	int cpu_end = sched_getcpu();
	atomic_store(&h.stop, 1);
	(void)*(volatile uint8_t *)(region + size);   /* the handler serves it and exits */
	pthread_join(ht, NULL);

	uint64_t thr_ns = (uint64_t)(thr_us * 1000.0);
	uint64_t nf = 0;
	double sum_all = 0;
	for (uint64_t i = 0; i < naccess; i++) {
		sum_all += lat[i];
		if (lat[i] > thr_ns)
			lat[nf++] = lat[i];
	}
	qsort(lat, nf, sizeof *lat, cmp_u32);
	double wall_s = wall_ns / 1e9;
	double p50 = pct_us(lat, nf, 0.50), p90 = pct_us(lat, nf, 0.90);
	double p99 = pct_us(lat, nf, 0.99), p999 = pct_us(lat, nf, 0.999);
	double fmax = nf ? lat[nf - 1] / 1000.0 : 0.0;
	double fmean = 0;
	for (uint64_t i = 0; i < nf; i++)
		fmean += lat[i];
	fmean = nf ? fmean / nf / 1000.0 : 0.0;
	double pps = wall_s > 0 ? naccess / wall_s : 0;
	double mbps = wall_s > 0 ? naccess * (double)PGSZ / wall_s / 1e6 : 0;
	double fps = wall_s > 0 ? nf / wall_s : 0;
	long majflt = ru1.ru_majflt - ru0.ru_majflt, minflt = ru1.ru_minflt - ru0.ru_minflt;
	long vcsw = ru1.ru_nvcsw - ru0.ru_nvcsw, ivcsw = ru1.ru_nivcsw - ru0.ru_nivcsw;
	uint64_t served = atomic_load(&h.served), retries = atomic_load(&h.retries);
	int hcpu = atomic_load(&h.cpu);
	const char *pat = random_order ? "random" : "seq";
	const char *op = do_write ? "write" : "read";
	const char *fills = fill == FILL_RANDOM ? "random" : fill == FILL_COMPRESSIBLE ? "compressible" : "zero";

	if (json) {
		printf("{\"program\": \"" PROG "\", \"pattern\": \"%s\", \"op\": \"%s\", \"fill\": \"%s\", "
		       "\"size_bytes\": %" PRIu64 ", \"page_size\": %u, \"pages\": %" PRIu64 ", "
		       "\"passes\": %" PRIu64 ", \"accesses\": %" PRIu64 ", \"fill_s\": %.6f, "
		       "\"pass_wall_s\": %.6f, \"pages_per_s\": %.1f, \"mb_per_s\": %.2f, "
		       "\"fault_threshold_us\": %.3f, \"faults\": %" PRIu64 ", \"faults_per_s\": %.1f, "
		       "\"fault_p50_us\": %.3f, \"fault_p90_us\": %.3f, \"fault_p99_us\": %.3f, "
		       "\"fault_p999_us\": %.3f, \"fault_max_us\": %.3f, \"fault_mean_us\": %.3f, "
		       "\"access_mean_us\": %.3f, \"majflt\": %ld, \"minflt\": %ld, "
		       "\"vcsw\": %ld, \"ivcsw\": %ld, \"cpu_start\": %d, \"cpu_end\": %d, "
		       "\"bad_words\": %" PRIu64 ", \"uffd_faults\": %" PRIu64 ", \"copy_retries\": %" PRIu64 ", "
		       "\"handler_cpu\": %d, \"pin\": \"%s\"}\n",
		       pat, op, fills, size, PGSZ, npages, passes, naccess, fill_ns / 1e9,
		       wall_s, pps, mbps, thr_us, nf, fps, p50, p90, p99, p999, fmax, fmean,
		       naccess ? sum_all / naccess / 1000.0 : 0.0, majflt, minflt, vcsw, ivcsw,
		       cpu_start, cpu_end, bad, served, retries, hcpu, pin);
	} else {
		printf(PROG ": %s %s, %" PRIu64 " pages (%" PRIu64 " MiB) x %" PRIu64 " passes, store fill %s %.3f s, pin %s\n",
		       pat, op, npages, size >> 20, passes, fills, fill_ns / 1e9, pin);
		printf(PROG ": pass %.3f s, %.0f pages/s, %.1f MB/s, mean access %.3f us\n",
		       wall_s, pps, mbps, naccess ? sum_all / naccess / 1000.0 : 0.0);
		printf(PROG ": faults (>%.1f us): %" PRIu64 ", %.0f/s, p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f max %.1f us\n",
		       thr_us, nf, fps, p50, p90, p99, p999, fmax);
		printf(PROG ": uffd faults served %" PRIu64 " (retries %" PRIu64 "), handler cpu %d, "
		       "majflt %ld minflt %ld vcsw %ld ivcsw %ld cpu %d->%d bad_words %" PRIu64 "\n",
		       served, retries, hcpu, majflt, minflt, vcsw, ivcsw, cpu_start, cpu_end, bad);
	}
	fflush(stdout);
	(void)sink;
	free(order);
	free(lat);
	munmap(region, size + PGSZ);
	munmap(store, size);
	close(uffd);
	if (bad) {
		fprintf(stderr, PROG ": %" PRIu64 " reads returned the wrong data\n", bad);
		return 1;
	}
	return 0;
}
