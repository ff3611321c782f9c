// SPDX-License-Identifier: Apache-2.0
/*
 * Module-only checks of /dev/swapva that need the qemu lane (root, the
 * module loaded, swap on zram, 2 vCPUs). One test per invocation:
 *   swapva_kmod_test idmap|rmap|shootdown|concurrent|signal|kill
 * prints "ok <test> ..." or "FAIL [<test>] ..." lines and exits 0 or 1.
 * Talks to the module with the raw ioctls (swapva.h), not through libswapva,
 * so that what is checked is the module's own behaviour.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../../kmod-swapva/swapva.h"

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_SOFT_OFFLINE
#define MADV_SOFT_OFFLINE 101
#endif

#define PS 4096UL
static int fails, checks, kfd = -1;
static const char *cur = "";

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		__atomic_fetch_add(&checks, 1, __ATOMIC_RELAXED);             \
		if (!(cond)) {                                                \
			__atomic_fetch_add(&fails, 1, __ATOMIC_RELAXED);      \
			printf("FAIL [%s] %s:%d: ", cur, __FILE__, __LINE__); \
			printf(__VA_ARGS__);                                  \
			printf("\n");                                         \
			fflush(stdout);                                       \
		}                                                             \
	} while (0)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Page contents: every word says which logical page it is. */
static void fill(uint8_t *p, uint64_t id)
{
	uint64_t *w = (uint64_t *)p;

	for (unsigned i = 0; i < PS / 8; i++)
		w[i] = id * 0x9E3779B97F4A7C15ULL + i;
}

static int holds(const uint8_t *p, uint64_t id)
{
	const uint64_t *w = (const uint64_t *)p;

	for (unsigned i = 0; i < PS / 8; i++)
		if (w[i] != id * 0x9E3779B97F4A7C15ULL + i)
			return 0;
	return 1;
}

static void *map_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	madvise(p, len, MADV_NOHUGEPAGE);  /* the module refuses huge PMDs */
	return p;
}

static int kbatch(unsigned flags, struct swapva_seg *s, unsigned n, struct swapva_batch *b)
{
	memset(b, 0, sizeof(*b));
	b->segs = (uint64_t)(uintptr_t)s;
	b->nr = n;
	b->flags = flags;
	return ioctl(kfd, SWAPVA_IOC_BATCH, b) ? -errno : 0;
}

/* /proc/self/pagemap entry of one page (root sees PFNs). */
static uint64_t pagemap(const void *va)
{
	static int fd = -1;
	uint64_t e = 0;

	if (fd < 0)
		fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || pread(fd, &e, 8, (off_t)((uintptr_t)va / PS) * 8) != 8)
		return 0;
	return e;
}
#define PM_PRESENT (1ULL << 63)
#define PM_SWAP    (1ULL << 62)
#define PM_PFN(e)  ((e) & ((1ULL << 55) - 1))

static uint64_t vmstat(const char *key)
{
	char k[64];
	unsigned long long v;
	uint64_t r = 0;
	FILE *f = fopen("/proc/vmstat", "r");

	while (f && fscanf(f, "%63s %llu", k, &v) == 2)
		if (!strcmp(k, key))
			r = v;
	if (f)
		fclose(f);
	return r;
}

static uint64_t memfree_kb(void)
{
	char k[64];
	unsigned long long v;
	uint64_t r = 0;
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fscanf(f, "%63s %llu kB\n", k, &v) == 2)
		if (!strcmp(k, "MemFree:"))
			r = v;
	if (f)
		fclose(f);
	return r;
}

/* ---- idmap ------------------------------------------------------------------ */

static int idq(void *p, size_t len, struct swapva_idmap_query *q)
{
	memset(q, 0, sizeof(*q));
	q->addr = (uint64_t)(uintptr_t)p;
	q->len = len;
	return ioctl(kfd, SWAPVA_IOC_IDMAP_QUERY, q) ? -errno : 0;
}

/* Every page mapped at VA == PA according to pagemap; data round-trips. */
static unsigned check_identity(uint8_t *p, size_t len, const char *what)
{
	unsigned bad = 0;

	for (size_t o = 0; o < len; o += PS) {
		uint64_t e = pagemap(p + o);

		if (!(e & PM_PRESENT) || PM_PFN(e) * PS != (uint64_t)(uintptr_t)(p + o))
			bad++;
	}
	CHECK(bad == 0, "%s: %u of %zu pages not at VA == PA in pagemap", what, bad, len / PS);
	return bad;
}

static void idmap_one(size_t len, unsigned long mode, const char *what)
{
	struct swapva_idmap_query q;
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, mode);

	CHECK(p != MAP_FAILED, "%s: mmap %zu bytes: %s", what, len, strerror(errno));
	if (p == MAP_FAILED)
		return;
	/* zeroed: no kernel data leaks to user space */
	for (size_t o = 0; o < len; o += PS)
		CHECK(((uint64_t *)(p + o))[7] == 0, "%s: page %zu not zeroed", what, o / PS);
	CHECK(idq(p, len, &q) == 0 && q.pages == len / PS && q.present == q.pages &&
		      q.identity == q.pages,
	      "%s: query pages %llu present %llu identity %llu", what, (unsigned long long)q.pages,
	      (unsigned long long)q.present, (unsigned long long)q.identity);
	check_identity(p, len, what);
	for (size_t o = 0; o < len; o += PS)
		fill(p + o, o / PS + 77);
	for (size_t o = 0; o < len; o += PS)
		CHECK(holds(p + o, o / PS + 77), "%s: page %zu lost its data", what, o / PS);
	printf("INFO: idmap %s: %zu KiB at %p (VA == PA)\n", what, len >> 10, (void *)p);
	munmap(p, len);
}

static int t_idmap(void)
{
	struct swapva_info in;
	struct swapva_idmap_query q;
	uint8_t *p, *r;
	size_t big = 32UL << 20;
	uint64_t before, during, after;
	pid_t pid;
	int st;

	CHECK(ioctl(kfd, SWAPVA_IOC_INFO, &in) == 0 && (in.features & SWAPVA_FEAT_IDMAP),
	      "INFO lacks SWAPVA_FEAT_IDMAP");
	idmap_one(PS, SWAPVA_IDMAP_FALLBACK, "1 page");
	idmap_one(16 * PS, SWAPVA_IDMAP_STRICT, "16 pages strict");
	idmap_one(3 * PS, SWAPVA_IDMAP_STRICT, "3 pages strict (not a power of two)");
	idmap_one(4UL << 20, SWAPVA_IDMAP_STRICT, "4 MiB strict (largest buddy block)");
	idmap_one(12UL << 20, SWAPVA_IDMAP_STRICT, "12 MiB strict (alloc_contig_range)");

	/* partial munmap keeps the rest mapped and identity */
	p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, SWAPVA_IDMAP_STRICT);
	CHECK(p != MAP_FAILED, "32 MiB strict: %s", strerror(errno));
	if (p != MAP_FAILED) {
		check_identity(p, big, "32 MiB strict");
		CHECK(munmap(p + (8UL << 20), 8UL << 20) == 0, "partial munmap");
		CHECK(idq(p, 8UL << 20, &q) == 0 && q.identity == (8UL << 20) / PS,
		      "after partial munmap: identity %llu", (unsigned long long)q.identity);
		check_identity(p + (16UL << 20), 16UL << 20, "tail after partial munmap");
		munmap(p, 8UL << 20);
		munmap(p + (16UL << 20), 16UL << 20);
	}
	/*
	 * The pages go back to the kernel when unmapped: 16 rounds of 32 MiB
	 * would eat 512 MiB if they leaked. (One round is within MemFree's noise.)
	 */
	before = memfree_kb();
	during = 0;
	for (int i = 0; i < 16; i++) {
		p = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_SHARED, kfd,
			 i % 2 ? SWAPVA_IDMAP_FALLBACK : SWAPVA_IDMAP_STRICT);
		CHECK(p != MAP_FAILED, "round %d: %s", i, strerror(errno));
		if (p == MAP_FAILED)
			break;
		p[big - 1] = 1;
		if (i == 0)
			during = memfree_kb();
		munmap(p, big);
	}
	after = memfree_kb();
	printf("INFO: idmap: MemFree kB before %llu, with 32 MiB mapped %llu, after 16 rounds %llu\n",
	       (unsigned long long)before, (unsigned long long)during, (unsigned long long)after);
	CHECK(after + (64UL << 10) > before, "MemFree fell by %lld kB over 16 map/unmap rounds",
	      (long long)(before - after));

	/* shared with a child after fork: same pages, still identity there */
	p = mmap(NULL, 8 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, SWAPVA_IDMAP_STRICT);
	CHECK(p != MAP_FAILED, "8 pages strict: %s", strerror(errno));
	if (p != MAP_FAILED) {
		fill(p, 5);
		pid = fork();
		if (pid == 0) {
			struct swapva_idmap_query cq;
			int ok = holds(p, 5) && idq(p, 8 * PS, &cq) == 0 && cq.identity == 8;

			fill(p + PS, 6);
			_exit(ok ? 0 : 1);
		}
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "child does not see the identity pages");
		CHECK(holds(p + PS, 6), "the child's write is not visible to the parent");
		/* mremap moves it: the query must notice */
		r = mremap(p, 8 * PS, 8 * PS, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(64UL << 30));
		CHECK(r != MAP_FAILED, "mremap: %s", strerror(errno));
		if (r != MAP_FAILED) {
			CHECK(idq(r, 8 * PS, &q) == 0 && q.present == 8 && q.identity == 0,
			      "moved mapping: present %llu identity %llu", (unsigned long long)q.present,
			      (unsigned long long)q.identity);
			CHECK(holds(r, 5), "moved mapping lost its data");
			munmap(r, 8 * PS);
		}
	}

	/* a page dropped with MADV_DONTNEED is gone: touching it is SIGBUS, not a new page */
	pid = fork();
	if (pid == 0) {
		p = mmap(NULL, 2 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, SWAPVA_IDMAP_FALLBACK);
		if (p == MAP_FAILED || madvise(p, PS, MADV_DONTNEED))
			_exit(3);
		p[PS] = 1;  /* still mapped */
		*(volatile uint8_t *)p = 1;
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS,
	      "touching a dropped identity page: status %#x, want SIGBUS", st);

	/* the query on ordinary memory: present, not identity */
	p = map_anon(4 * PS);
	memset(p, 1, 4 * PS);
	CHECK(idq(p, 4 * PS, &q) == 0 && q.present == 4 && q.identity == 0,
	      "anon: present %llu identity %llu", (unsigned long long)q.present,
	      (unsigned long long)q.identity);
	munmap(p, 4 * PS);

	/*
	 * Occupy every low address where RAM could be: strict must fail with
	 * EEXIST, fallback must map the block elsewhere (contiguous, not identity).
	 */
	r = mmap((void *)SWAPVA_IDMAP_MIN_VA, (64UL << 30) - SWAPVA_IDMAP_MIN_VA, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	CHECK(r == (void *)SWAPVA_IDMAP_MIN_VA, "cannot reserve low 64 GiB: %s", strerror(errno));
	if (r == (void *)SWAPVA_IDMAP_MIN_VA) {
		p = mmap(NULL, 16 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, SWAPVA_IDMAP_STRICT);
		CHECK(p == MAP_FAILED && errno == EEXIST, "strict with PA range taken: %p %s", (void *)p,
		      strerror(errno));
		p = mmap(NULL, 16 * PS, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, SWAPVA_IDMAP_FALLBACK);
		CHECK(p != MAP_FAILED, "fallback with PA range taken: %s", strerror(errno));
		if (p != MAP_FAILED) {
			unsigned contig = 1;
			uint64_t e0 = pagemap(p);

			CHECK(idq(p, 16 * PS, &q) == 0 && q.present == 16 && q.identity == 0,
			      "fallback: present %llu identity %llu", (unsigned long long)q.present,
			      (unsigned long long)q.identity);
			for (unsigned i = 1; i < 16; i++)
				contig &= PM_PFN(pagemap(p + i * PS)) == PM_PFN(e0) + i;
			CHECK(contig && (e0 & PM_PRESENT), "fallback block not physically contiguous");
			fill(p + 15 * PS, 9);
			CHECK(holds(p + 15 * PS, 9), "fallback mapping data");
			munmap(p, 16 * PS);
		}
		munmap(r, (64UL << 30) - SWAPVA_IDMAP_MIN_VA);
	}

	/* bad requests */
	p = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_PRIVATE, kfd, 0);
	CHECK(p == MAP_FAILED && errno == EINVAL, "MAP_PRIVATE: %s", strerror(errno));
	p = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_SHARED, kfd, 2 * PS);
	CHECK(p == MAP_FAILED && errno == EINVAL, "offset 2 pages: %s", strerror(errno));
	CHECK(idq((void *)1, PS, &q) == -EINVAL, "query misaligned");
	CHECK(idq((void *)PS, 0, &q) == -EINVAL, "query empty");

	/* CAP_SYS_ADMIN: an unprivileged user gets EPERM for both */
	pid = fork();
	if (pid == 0) {
		int fd, ok;

		if (setgid(65534) || setuid(65534))
			_exit(3);
		fd = open(SWAPVA_DEVICE, O_RDWR);
		if (fd < 0) {
			printf("FAIL [idmap] open %s as uid 65534: %s\n", SWAPVA_DEVICE, strerror(errno));
			_exit(4);
		}
		kfd = fd;
		p = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		ok = p == MAP_FAILED && errno == EPERM;
		if (!ok)
			printf("FAIL [idmap] unprivileged mmap: %p %s\n", (void *)p, strerror(errno));
		ok = ok && idq((void *)PS, PS, &q) == -EPERM;
		_exit(ok ? 0 : 1);
	}
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "unprivileged mmap/query not refused with EPERM (child status %d)", st);
	return 0;
}

/* ---- rmap: swapped pages survive migration, compaction and reclaim ------------ */

static int t_rmap(void)
{
	const unsigned n = 4096;  /* 16 MiB */
	uint8_t *a = map_anon(n * PS);
	uint64_t *model = calloc(n, sizeof(*model)), s = 88172645463325252ULL, pfn0, e;
	uint64_t out0, in0;
	unsigned char *used = calloc(n, 1);
	unsigned moved = 0, swapped = 0, bad = 0, offl = 0;
	struct swapva_batch b;
	FILE *f;

	for (unsigned i = 0; i < n; i++) {
		fill(a + i * PS, i);
		model[i] = i;
	}
	/* random disjoint segments, up to 8 per batch, 1..32 pages each */
	for (unsigned it = 0; it < 300; it++) {
		struct swapva_seg sg[8];
		unsigned k = 0;

		memset(used, 0, n);
		for (unsigned t = 0; t < 40 && k < 8; t++) {
			unsigned len = 1 + rnd(&s) % 32, x = rnd(&s) % (n - len), y = rnd(&s) % (n - len), c = 0;

			for (unsigned j = 0; j < len; j++)
				c |= used[x + j] | used[y + j];
			if (c || (x < y + len && y < x + len))
				continue;
			memset(used + x, 1, len);
			memset(used + y, 1, len);
			sg[k++] = (struct swapva_seg){ (uint64_t)(uintptr_t)(a + x * PS),
						       (uint64_t)(uintptr_t)(a + y * PS), len * PS };
		}
		CHECK(kbatch(SWAPVA_OP_SWAP, sg, k, &b) == 0 && b.done == k, "batch %u: err %d done %u",
		      it, b.err, b.done);
		for (unsigned j = 0; j < b.done; j++) {
			unsigned x = (sg[j].src - (uintptr_t)a) / PS, y = (sg[j].dst - (uintptr_t)a) / PS;

			for (unsigned i = 0; i < sg[j].len / PS; i++) {
				uint64_t t = model[x + i];

				model[x + i] = model[y + i];
				model[y + i] = t;
			}
		}
	}
	for (unsigned i = 0; i < n; i++) {
		bad += !holds(a + i * PS, model[i]);
		moved += model[i] != i;
	}
	CHECK(bad == 0, "%u pages wrong after the swaps", bad);
	printf("INFO: rmap: %u of %u pages not at their first address\n", moved, n);

	/*
	 * Migration finds the PTE through the rmap (anon_vma + folio->index):
	 * a moved page whose index was left stale cannot be unmapped, so
	 * soft-offlining it fails.
	 */
	for (unsigned i = 0; i < n && offl < 32; i++) {
		if (model[i] == i)
			continue;
		pfn0 = PM_PFN(pagemap(a + i * PS));
		if (madvise(a + i * PS, PS, MADV_SOFT_OFFLINE)) {
			CHECK(0, "soft offline of moved page %u: %s", i, strerror(errno));
			break;
		}
		e = pagemap(a + i * PS);
		CHECK((e & PM_PRESENT) && PM_PFN(e) != pfn0, "page %u did not migrate", i);
		CHECK(holds(a + i * PS, model[i]), "page %u wrong after migration", i);
		offl++;
		i += 97;
	}
	printf("INFO: rmap: %u moved pages migrated (soft offline)\n", offl);

	f = fopen("/proc/sys/vm/compact_memory", "w");
	CHECK(f && fputs("1\n", f) >= 0 && fclose(f) == 0, "compact_memory");
	bad = 0;
	for (unsigned i = 0; i < n; i++)
		bad += !holds(a + i * PS, model[i]);
	CHECK(bad == 0, "%u pages wrong after compaction", bad);

	/* Reclaim: try_to_unmap also walks the rmap. Needs swap (zram). */
	out0 = vmstat("pswpout");
	in0 = vmstat("pswpin");
	CHECK(madvise(a, n * PS, MADV_PAGEOUT) == 0, "MADV_PAGEOUT: %s", strerror(errno));
	for (unsigned i = 0; i < n; i++)
		swapped += !!(pagemap(a + i * PS) & PM_SWAP);
	printf("INFO: rmap: MADV_PAGEOUT swapped out %u of %u pages (pswpout +%llu)\n", swapped, n,
	       (unsigned long long)(vmstat("pswpout") - out0));
	CHECK(swapped >= n * 9 / 10, "only %u of %u pages paged out (is swap on?)", swapped, n);
	bad = 0;
	for (unsigned i = 0; i < n; i++)
		bad += !holds(a + i * PS, model[i]);
	CHECK(bad == 0, "%u pages wrong after page-out and swap-in", bad);
	CHECK(vmstat("pswpin") > in0, "no swap-in happened");
	munmap(a, n * PS);
	free(model);
	free(used);
	return 0;
}

/* ---- shootdown: a thread on another CPU sees the new page at once ----------- */

static uint8_t *sd_a;
static volatile int sd_phase, sd_ack, sd_stop;
static volatile uint64_t sd_expect;
static unsigned sd_stale, sd_early;

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static void *sd_reader(void *arg)
{
	pin((int)(intptr_t)arg);
	while (!sd_stop) {
		/* phase 0: read A (keeps the translation in this CPU's TLB) */
		while (sd_phase == 0 && !sd_stop)
			if (*(volatile uint64_t *)(sd_a + 64) != sd_expect)
				sd_early++;
		if (sd_stop)
			break;
		__atomic_store_n(&sd_ack, 1, __ATOMIC_SEQ_CST);  /* hands off A */
		while (sd_phase == 1 && !sd_stop)
			;
		/* phase 2: the swap returned; one read must see the new page */
		if (*(volatile uint64_t *)(sd_a + 64) != sd_expect)
			sd_stale++;
		__atomic_store_n(&sd_ack, 2, __ATOMIC_SEQ_CST);
		while (sd_phase == 2 && !sd_stop)
			;
	}
	return NULL;
}

static int t_shootdown(void)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint8_t *m = map_anon(2 * PS);
	uint8_t *b = m + PS;
	struct swapva_seg sg = { 0 };
	struct swapva_batch bt;
	pthread_t th;
	const unsigned iters = 1000;

	CHECK(ncpu >= 2, "needs 2 CPUs, has %ld (VM_SMP)", ncpu);
	if (ncpu < 2)
		return 0;
	sd_a = m;
	fill(m, 1);
	fill(b, 2);
	sd_expect = ((uint64_t *)m)[8];
	sg.src = (uint64_t)(uintptr_t)m;
	sg.dst = (uint64_t)(uintptr_t)b;
	sg.len = PS;
	pin(0);
	pthread_create(&th, NULL, sd_reader, (void *)(intptr_t)1);
	for (unsigned it = 0; it < iters; it++) {
		usleep(200);  /* let the reader touch A */
		sd_ack = 0;
		sd_phase = 1;
		while (__atomic_load_n(&sd_ack, __ATOMIC_SEQ_CST) != 1)
			;
		CHECK(kbatch(SWAPVA_OP_SWAP, &sg, 1, &bt) == 0, "swap %u: %d", it, bt.err);
		sd_expect = ((uint64_t *)m)[8];  /* what this CPU sees now */
		sd_phase = 2;
		while (__atomic_load_n(&sd_ack, __ATOMIC_SEQ_CST) != 2)
			;
		sd_phase = 0;
	}
	sd_stop = 1;
	pthread_join(th, NULL);
	CHECK(sd_stale == 0, "%u of %u reads on CPU 1 saw the old page after the call", sd_stale, iters);
	CHECK(sd_early == 0, "%u reads saw a changed page outside a call", sd_early);
	CHECK(holds(m, iters % 2 ? 2 : 1) && holds(b, iters % 2 ? 1 : 2), "final contents");
	printf("INFO: shootdown: %u swaps, reader on CPU 1, %u stale reads\n", iters, sd_stale);
	return 0;
}

/* ---- concurrent batches ---------------------------------------------------- */

#define CT_THREADS 4
#define CT_PAGES   1024  /* 4 MiB: two PTE tables shared by every thread */
static uint8_t *ct_r, *ct_x, *ct_y;
static volatile int ct_stop;
static unsigned ct_swaps, ct_busy;

struct ct_arg {
	int t;
	uint64_t model[CT_PAGES / CT_THREADS];
};

/* Thread t owns pages t, t+4, ...: its segments share PTE tables with everyone's. */
static void *ct_owner(void *p)
{
	struct ct_arg *ca = p;
	uint64_t s = 0x1234567ULL * (ca->t + 1);
	const unsigned per = CT_PAGES / CT_THREADS;

	for (unsigned i = 0; i < per; i++)
		ca->model[i] = i * CT_THREADS + ca->t;
	for (unsigned it = 0; it < 400; it++) {
		struct swapva_seg sg[16];
		struct swapva_batch b;
		unsigned char used[CT_PAGES / CT_THREADS] = { 0 };
		unsigned k = 0;

		for (unsigned t = 0; t < 32 && k < 16; t++) {
			unsigned x = rnd(&s) % per, y = rnd(&s) % per;

			if (x == y || used[x] || used[y])
				continue;
			used[x] = used[y] = 1;
			sg[k++] = (struct swapva_seg){
				(uint64_t)(uintptr_t)(ct_r + (x * CT_THREADS + ca->t) * PS),
				(uint64_t)(uintptr_t)(ct_r + (y * CT_THREADS + ca->t) * PS), PS };
		}
		int e = kbatch(SWAPVA_OP_SWAP, sg, k, &b);

		CHECK((e == 0 && b.done == k) || e == -EBUSY, "thread %d batch %u: err %d done %u",
		      ca->t, it, b.err, b.done);
		if (e == -EBUSY)
			__atomic_fetch_add(&ct_busy, 1, __ATOMIC_RELAXED);
		for (unsigned j = 0; j < b.done; j++) {
			unsigned x = ((sg[j].src - (uintptr_t)ct_r) / PS) / CT_THREADS;
			unsigned y = ((sg[j].dst - (uintptr_t)ct_r) / PS) / CT_THREADS;
			uint64_t tmp = ca->model[x];

			ca->model[x] = ca->model[y];
			ca->model[y] = tmp;
		}
	}
	return NULL;
}

/* Two threads swap X<->Y and Y<->X at once (an ABBA lock order if unordered). */
static void *ct_pair(void *p)
{
	int rev = (int)(intptr_t)p;
	struct swapva_seg sg = { (uint64_t)(uintptr_t)(rev ? ct_y : ct_x),
				 (uint64_t)(uintptr_t)(rev ? ct_x : ct_y), 600 * PS };
	struct swapva_batch b;

	for (unsigned it = 0; it < 200; it++) {
		int e = kbatch(SWAPVA_OP_SWAP, &sg, 1, &b);

		/* EBUSY (a folio lock held elsewhere for long) is allowed; it moved nothing */
		CHECK(e == 0 || e == -EBUSY, "pair %d swap %u: %d", rev, it, b.err);
		if (e == 0)
			__atomic_fetch_add(&ct_swaps, 1, __ATOMIC_RELAXED);
		else if (e == -EBUSY)
			__atomic_fetch_add(&ct_busy, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* mmap_lock writers and MADV_DONTNEED next to the batches. */
static void *ct_noise(void *p)
{
	uint8_t *z = p;

	while (!ct_stop) {
		void *q = mmap(NULL, 16 * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (q != MAP_FAILED) {
			memset(q, 3, 16 * PS);
			mprotect(q, 16 * PS, PROT_READ);
			munmap(q, 16 * PS);
		}
		memset(z, 4, 64 * PS);
		madvise(z, 64 * PS, MADV_DONTNEED);
	}
	return NULL;
}

static int t_concurrent(void)
{
	/* one VMA for everything: one anon_vma, shared PTE tables */
	uint8_t *m = map_anon((CT_PAGES + 2 * 1200 + 64) * PS);
	struct ct_arg *ca = calloc(CT_THREADS, sizeof(*ca));
	pthread_t th[CT_THREADS + 3];
	unsigned bad = 0;
	double t0 = now();

	alarm(600);  /* a deadlock ends the test (SIGALRM kills it) */
	ct_r = m;
	ct_x = m + CT_PAGES * PS;
	ct_y = ct_x + 1200 * PS;  /* ranges of 600 pages crossing a PMD boundary */
	for (unsigned i = 0; i < CT_PAGES; i++)
		fill(ct_r + i * PS, i);
	for (unsigned i = 0; i < 600; i++) {
		fill(ct_x + i * PS, 100000 + i);
		fill(ct_y + i * PS, 200000 + i);
	}
	for (int t = 0; t < CT_THREADS; t++) {
		ca[t].t = t;
		pthread_create(&th[t], NULL, ct_owner, &ca[t]);
	}
	pthread_create(&th[CT_THREADS], NULL, ct_pair, (void *)0);
	pthread_create(&th[CT_THREADS + 1], NULL, ct_pair, (void *)1);
	pthread_create(&th[CT_THREADS + 2], NULL, ct_noise, ct_y + 1200 * PS);
	for (int t = 0; t < CT_THREADS + 2; t++)
		pthread_join(th[t], NULL);
	ct_stop = 1;
	pthread_join(th[CT_THREADS + 2], NULL);
	for (int t = 0; t < CT_THREADS; t++)
		for (unsigned i = 0; i < CT_PAGES / CT_THREADS; i++)
			bad += !holds(ct_r + (i * CT_THREADS + t) * PS, ca[t].model[i]);
	CHECK(bad == 0, "%u pages of the owner threads wrong", bad);
	bad = 0;
	for (unsigned i = 0; i < 600; i++) {  /* an even number of swaps: back where they were */
		unsigned odd = ct_swaps % 2;

		bad += !holds(ct_x + i * PS, (odd ? 200000 : 100000) + i) +
		       !holds(ct_y + i * PS, (odd ? 100000 : 200000) + i);
	}
	CHECK(bad == 0, "%u pages of the X<->Y pair wrong after %u swaps", bad, ct_swaps);
	CHECK(ct_busy <= 20, "%u of 400 crossed swaps refused with EBUSY", ct_busy);
	printf("INFO: concurrent: %d owner threads x 400 batches + 2x200 crossed 600-page swaps "
	       "(%u EBUSY) + mmap/mprotect/munmap/DONTNEED noise in %.1f s\n", CT_THREADS, ct_busy,
	       now() - t0);
	alarm(0);
	return 0;
}

/* ---- signals ------------------------------------------------------------------ */

#define SG_SEGS 4096
#define SG_LEN  4  /* pages per segment */
static uint8_t *sg_a, *sg_b;
static struct swapva_seg sg_segs[SG_SEGS];
static volatile int sg_entered;
static struct swapva_batch sg_res;
static int sg_ret;
static unsigned sg_flags;

static void on_usr1(int sig)
{
	(void)sig;
}

static void *sg_worker(void *p)
{
	(void)p;
	sg_entered = 1;
	sg_ret = kbatch(SWAPVA_OP_SWAP | sg_flags, sg_segs, SG_SEGS, &sg_res);
	return NULL;
}

/* Every segment either fully swapped (parity 1) or fully untouched. */
static unsigned sg_verify(const unsigned char *par)
{
	unsigned bad = 0;

	for (unsigned i = 0; i < SG_SEGS; i++)
		for (unsigned j = 0; j < SG_LEN; j++) {
			uint64_t ida = (uint64_t)i * SG_LEN + j, idb = ida + 1000000;

			if (par[i]) {
				uint64_t t = ida;

				ida = idb;
				idb = t;
			}
			bad += !holds(sg_a + ((uint64_t)i * SG_LEN + j) * PS, ida) ||
			       !holds(sg_b + ((uint64_t)i * SG_LEN + j) * PS, idb);
		}
	return bad;
}

static int t_signal(void)
{
	struct sigaction sa = { .sa_handler = on_usr1 };  /* no SA_RESTART */
	unsigned char *par = calloc(SG_SEGS, 1);
	unsigned partial = 0, delay = 500;
	pthread_t th;
	double t0;

	sigaction(SIGUSR1, &sa, NULL);
	sg_a = map_anon(2UL * SG_SEGS * SG_LEN * PS);
	sg_b = sg_a + (uint64_t)SG_SEGS * SG_LEN * PS;
	for (uint64_t i = 0; i < (uint64_t)SG_SEGS * SG_LEN; i++) {
		fill(sg_a + i * PS, i);
		fill(sg_b + i * PS, i + 1000000);
	}
	for (unsigned i = 0; i < SG_SEGS; i++)
		sg_segs[i] = (struct swapva_seg){ (uint64_t)(uintptr_t)(sg_a + (uint64_t)i * SG_LEN * PS),
						  (uint64_t)(uintptr_t)(sg_b + (uint64_t)i * SG_LEN * PS),
						  SG_LEN * PS };
	/* how long does a whole batch take here? */
	t0 = now();
	CHECK(kbatch(SWAPVA_OP_SWAP, sg_segs, SG_SEGS, &sg_res) == 0, "uninterrupted batch");
	memset(par, 1, SG_SEGS);
	printf("INFO: signal: one batch of %d x %d pages takes %.1f ms\n", SG_SEGS, SG_LEN,
	       (now() - t0) * 1e3);
	CHECK(sg_verify(par) == 0, "after the whole batch");

	/* with SWAPVA_F_INTR a signal stops the batch between segments */
	for (unsigned attempt = 0; attempt < 12 && !partial; attempt++) {
		sg_entered = 0;
		sg_flags = SWAPVA_F_INTR;
		pthread_create(&th, NULL, sg_worker, NULL);
		while (!sg_entered)
			;
		usleep(delay);
		pthread_kill(th, SIGUSR1);
		pthread_join(th, NULL);
		for (unsigned i = 0; i < sg_res.done; i++)
			par[i] ^= 1;
		if (sg_ret == 0) {
			CHECK(sg_res.done == SG_SEGS, "done %u with success", sg_res.done);
			delay = delay > 2000 ? delay / 2 : delay;  /* the signal came late */
			continue;
		}
		CHECK(sg_ret == -EINTR && sg_res.err == -EINTR, "interrupted batch: ret %d err %d", sg_ret,
		      sg_res.err);
		CHECK(sg_res.done < SG_SEGS && sg_res.pages == (uint64_t)sg_res.done * SG_LEN,
		      "done %u pages %llu", sg_res.done, (unsigned long long)sg_res.pages);
		partial = sg_res.done > 0 ? 1 : 0;
		if (!partial)
			delay *= 2;  /* the signal came before the first segment */
		printf("INFO: signal: attempt %u after %u us: EINTR with %u of %d segments done\n",
		       attempt, delay, sg_res.done, SG_SEGS);
		CHECK(sg_verify(par) == 0, "half-moved segment after EINTR at %u", sg_res.done);
	}
	CHECK(partial, "no attempt was interrupted part way");
	CHECK(sg_verify(par) == 0, "final state");

	/* without the flag an ordinary signal does not cut a batch short */
	sg_entered = 0;
	sg_flags = 0;
	pthread_create(&th, NULL, sg_worker, NULL);
	while (!sg_entered)
		;
	usleep(delay);
	pthread_kill(th, SIGUSR1);
	pthread_join(th, NULL);
	CHECK(sg_ret == 0 && sg_res.done == SG_SEGS, "without F_INTR: ret %d done %u", sg_ret,
	      sg_res.done);
	if (sg_ret == 0)
		for (unsigned i = 0; i < SG_SEGS; i++)
			par[i] ^= 1;
	CHECK(sg_verify(par) == 0, "after the batch without F_INTR");
	return 0;
}

/* SIGKILL during endless big batches: the process dies promptly and cleanly. */
static int t_kill(void)
{
	pid_t pid = fork();
	int st = 0;
	double t0;

	if (pid == 0) {
		uint8_t *a = map_anon(2UL * SG_SEGS * SG_LEN * PS);
		struct swapva_batch b;

		memset(a, 7, 2UL * SG_SEGS * SG_LEN * PS);
		for (unsigned i = 0; i < SG_SEGS; i++)
			sg_segs[i] = (struct swapva_seg){ (uint64_t)(uintptr_t)(a + (uint64_t)i * SG_LEN * PS),
							  (uint64_t)(uintptr_t)(a + ((uint64_t)SG_SEGS + i) * SG_LEN * PS),
							  SG_LEN * PS };
		for (;;)
			kbatch(SWAPVA_OP_SWAP, sg_segs, SG_SEGS, &b);
	}
	usleep(1500 * 1000);
	t0 = now();
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
	      "child status %d", st);
	printf("INFO: kill: child reaped %.1f ms after SIGKILL\n", (now() - t0) * 1e3);
	CHECK(now() - t0 < 10, "SIGKILL took %.1f s", now() - t0);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(void);
	} tests[] = { { "idmap", t_idmap },	    { "rmap", t_rmap },	    { "shootdown", t_shootdown },
		      { "concurrent", t_concurrent }, { "signal", t_signal }, { "kill", t_kill } };
	int ran = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	kfd = open(SWAPVA_DEVICE, O_RDWR | O_CLOEXEC);
	if (kfd < 0) {
		printf("FAIL [open] %s: %s\n", SWAPVA_DEVICE, strerror(errno));
		return 1;
	}
	for (unsigned i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (argc > 1 && strcmp(argv[1], tests[i].name))
			continue;
		int f0 = fails;
		double t0 = now();

		cur = tests[i].name;
		tests[i].fn();
		ran++;
		if (fails == f0)
			printf("ok %s (%.1f s)\n", tests[i].name, now() - t0);
	}
	if (!ran) {
		printf("FAIL [args] unknown test '%s'\n", argv[1]);
		return 2;
	}
	return fails ? 1 : 0;
}
