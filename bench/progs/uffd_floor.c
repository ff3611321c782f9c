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
	uint64_t size = m.size, npages = size / PGSZ;
	uint32_t *order, *lat;
	if (measure_prepare(PROG, &m, &order, &lat))
		return 3;

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
		fill_page(store + p * PGSZ, m.seed, p, m.fill);
	struct measure_result r = { .fill_s = (now_ns() - f0) / 1e9 };

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
	uint64_t sink = 0, wall_ns = 0;
	r.cpu_start = sched_getcpu();
	getrusage(RUSAGE_SELF, &ru0);
	for (uint64_t pass = 0; pass < m.passes; pass++) {
		if (pass)
			madvise(region, size, MADV_DONTNEED);   /* every pass faults again */
		uint64_t w0 = now_ns();
		r.bad += measure_pass(region, order, &m, pass, lat + pass * npages, &sink);
		wall_ns += now_ns() - w0;
	}
	getrusage(RUSAGE_SELF, &ru1);
	r.cpu_end = sched_getcpu();
	atomic_store(&h.stop, 1);
	(void)*(volatile uint8_t *)(region + size);   /* the handler serves it and exits */
	pthread_join(ht, NULL);

	measure_rank(&m, lat, wall_ns, &ru0, &ru1, &r);
	uint64_t served = atomic_load(&h.served), retries = atomic_load(&h.retries);
	int hcpu = atomic_load(&h.cpu);

	if (m.json) {
		measure_json(PROG, &m, &r);
		printf(", \"uffd_faults\": %" PRIu64 ", \"copy_retries\": %" PRIu64 ", \"handler_cpu\": %d, "
		       "\"pin\": \"%s\"}\n", served, retries, hcpu, pin);
	} else {
		printf(PROG ": %s %s, %" PRIu64 " pages (%" PRIu64 " MiB) x %" PRIu64 " passes, store fill %s %.3f s, pin %s\n",
		       m.random_order ? "random" : "seq", m.do_write ? "write" : "read", npages, size >> 20, m.passes,
		       measure_fill_name(m.fill), r.fill_s, pin);
		measure_text(PROG, &m, &r);
		printf(PROG ": uffd faults served %" PRIu64 " (retries %" PRIu64 "), handler cpu %d, "
		       "majflt %ld minflt %ld vcsw %ld ivcsw %ld cpu %d->%d bad_words %" PRIu64 "\n",
		       served, retries, hcpu, r.majflt, r.minflt, r.vcsw, r.ivcsw, r.cpu_start, r.cpu_end, r.bad);
	}
	fflush(stdout);
	(void)sink;
	free(order);
	free(lat);
	munmap(region, size + PGSZ);
	munmap(store, size);
	close(uffd);
	if (r.bad) {
		fprintf(stderr, PROG ": %" PRIu64 " reads returned the wrong data\n", r.bad);
		return 1;
	}
	return 0;
}
