// SPDX-License-Identifier: Apache-2.0
/*
 * The pager on a shared-memory region (FM_REG_SHMEM, minor-fault mode),
 * built with ASan and UBSan, against a real memd. The region is made the way
 * HotSpot makes an -XX:AllocateHeapAt=/dev/shm heap: a file in /dev/shm,
 * unlinked, preallocated with fallocate, mapped MAP_SHARED, its fd closed.
 * It is written, rewritten at random, discarded in part, unmapped behind the
 * pager's back (minor faults) and checked byte for byte; the file's pages in
 * the page cache (mincore) must stay within the budget, which is what makes
 * the budget real memory. Run from the repository root.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager.h"
#include "resmap.h"
#include "transport.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (48ul << 20)
#define NPAGES (REGION / PG)
#define LOCAL (8ul << 20)


/*
 * Pages the file holds: the memory the region really takes (a preallocated
 * page counts, though mincore does not see it). The test keeps an fd for
 * this; the pager never sees it.
 */
static int heap_fd = -1;

static uint64_t in_file(void)
{
	struct stat st;

	if (fstat(heap_fd, &st))
		return UINT64_MAX;
	return (uint64_t)st.st_blocks * 512 / PG;
}

static uint64_t verify(const uint8_t *a, const uint32_t *ver)
{
	uint64_t bad = 0;
	for (uint64_t i = 0; i < NPAGES; i++)
		if (ver[i] != UINT32_MAX && !page_ok(a, i, ver[i])) {
			if (!bad)
				fprintf(stderr, "page %llu differs (version %u)\n", (unsigned long long)i, ver[i]);
			bad++;
		}
	return bad;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#define SETTLE_MS 60000 /* a bound for a stuck pager, not a wait: a loaded machine takes what it takes */

/* Pages of region 0 a handler or the evictor is working on. */
static uint64_t in_flight(const struct fm_resmap_hdr *h)
{
	const uint8_t *m = (const uint8_t *)h + h->regions[0].map_offset;
	uint64_t n = 0;

	for (uint64_t i = 0; i < h->regions[0].npages; i++) {
		unsigned s = fm_pg_state(__atomic_load_n(&m[i], __ATOMIC_RELAXED));
		n += s == FM_PG_FILLING || s == FM_PG_UPDATING || s == FM_PG_LEAVING;
	}
	return n;
}

static uint64_t activity(const struct fm_resmap_hdr *h)
{
	const struct fm_pager_stats *s = &h->stats;

	return s->faults + s->minor_faults + s->remote_reads + s->zero_fills + s->evict_batches +
	       s->prefetch_issued + s->resident_pages;
}

static uint64_t evictions(const struct fm_resmap_hdr *h)
{
	return h->stats.evictions_clean + h->stats.evictions_dirty;
}

/*
 * Wait until the pager's threads have caught up with the program: no page
 * in flight, at most `high` pages resident (above it the evictor is at
 * work), and no counter moving for 50 ms. On a loaded machine a handler's
 * prefetch or an eviction run can lag the program by far more than any fixed
 * sleep. A thread descheduled for longer can still fool this, so what
 * follows checks for that itself. Returns 0 if it did not happen in time.
 */
static int settle(const struct fm_resmap_hdr *h, uint64_t high)
{
	uint64_t deadline = now_ms() + SETTLE_MS, last = UINT64_MAX, since = 0;

	while (now_ms() < deadline) {
		uint64_t act = activity(h);
		if (act != last || in_flight(h) || h->stats.resident_pages > high) {
			last = act;
			since = now_ms();
		} else if (now_ms() - since >= 50) {
			return 1;
		}
		usleep(5 * 1000);
	}
	fprintf(stderr, "the pager did not settle in %d s: %llu pages resident (high %llu), %llu in flight\n",
		SETTLE_MS / 1000, (unsigned long long)h->stats.resident_pages, (unsigned long long)high,
		(unsigned long long)in_flight(h));
	return 0;
}

/* A heap file as HotSpot makes one for -XX:AllocateHeapAt=/dev/shm. */
static uint8_t *map_heap_file(void)
{
	char path[] = "/dev/shm/farmem-unit-XXXXXX";
	int fd = mkstemp(path);
	void *a;

	if (fd < 0)
		return MAP_FAILED;
	unlink(path);
	if (posix_fallocate(fd, 0, (off_t)REGION)) {
		close(fd);
		return MAP_FAILED;
	}
	a = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	heap_fd = fd;
	return a;
}

/*
 * Reads zero pages of the file while the pager registers it, as a running
 * JVM does during `farmem attach`: a minor fault queued before registration
 * punches its page out must come back as a missing fault, not an error.
 */
static atomic_int reader_stop;
static atomic_ulong reader_bad, reader_reads;

static void *reader(void *arg)
{
	const uint8_t *a = arg;
	unsigned seed = 99;

	while (!atomic_load(&reader_stop)) {
		uint64_t i = 2 + (uint64_t)rand_r(&seed) % 1000; /* well within the budget: nothing is evicted */
		if (!page_ok(a, i, 0))
			atomic_fetch_add(&reader_bad, 1);
		atomic_fetch_add(&reader_reads, 1);
	}
	return NULL;
}

static void exercise(const char *sock, const char *transport, const char *fault)
{
	struct fm_pager_cfg cfg;
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	char addr[128], what[64];
	uint32_t *ver;
	uint8_t *a;
	unsigned seed = 4321;
	uint64_t limit_pages = LOCAL / PG, high, n;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "%s, fault=%s", transport, fault);
	p = unit_pager(what, addr, "8M",
		       (const char *const[]){ "transport", transport, "fill_threads", "2", "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	/*
	 * An evictor thread (fault=thread without fill_follow) keeps resident
	 * pages under the high mark; faulting threads and handlers evict at the limit.
	 */
	fm_pager_cfg_defaults(&cfg);
	high = strcmp(fault, "thread") || cfg.fill_follow ? limit_pages : limit_pages * cfg.evict_high / 100;
	a = map_heap_file();
	ver = calloc(NPAGES, sizeof(*ver));
	CHECK(a != MAP_FAILED && ver);
	if (a == MAP_FAILED || !ver)
		goto out;
	CHECK(in_file() == NPAGES); /* preallocated: every page is in the file */

	/* Before registration: page 0 mapped with data, page 1 with data but unmapped, the rest zeros. */
	write_page(a, 0, 1);
	write_page(a, 1, 1);
	ver[0] = ver[1] = 1;
	CHECK(madvise(a + PG, PG, MADV_DONTNEED) == 0);
	{
		pthread_t th;
		atomic_store(&reader_stop, 0);
		atomic_store(&reader_reads, 0);
		CHECK(pthread_create(&th, NULL, reader, a) == 0);
		while (atomic_load(&reader_reads) < 1000)
			sched_yield();
		CHECK(fm_pager_register(p, a, REGION, FM_REG_SHMEM) == 0);
		for (unsigned long r0 = atomic_load(&reader_reads); atomic_load(&reader_reads) < r0 + 1000;)
			sched_yield();
		atomic_store(&reader_stop, 1);
		pthread_join(th, NULL);
		CHECK(atomic_load(&reader_bad) == 0);
		/*
		 * What it touched is resident now: let it go again so the counts
		 * below hold, once the handlers are done. A handler's prefetch
		 * that settle() did not see can still fill pages behind the
		 * discard; the books count those (resident above 2), so discard
		 * again. A page in the file the books do not count is a bug no
		 * discard mends: the checks below fail on it at once.
		 */
		CHECK(settle(h, high));
		for (int tries = 1;; tries++) {
			uint64_t res;
			/* What a program does to drop pages: the pager forgets them and makes them leave the file, in one call. */
			CHECK(fm_pager_forget(p, a + 2 * PG, REGION - 2 * PG, MADV_REMOVE) == 0);
			res = h->stats.resident_pages;
			if (in_file() == 2 || res <= 2 || tries == 10)
				break;
			fprintf(stderr, "after discard %d: %llu pages in the file, %llu resident: again\n", tries,
				(unsigned long long)in_file(), (unsigned long long)res);
			CHECK(settle(h, high));
		}
	}
	CHECK(h->regions[0].flags & FM_REGION_F_SHMEM);
	/* The unmapped zero pages left the file; the two with data stay, adopted. */
	CHECK(in_file() == 2);
	CHECK(h->stats.resident_pages == 2 && h->stats.registered_pages == NPAGES);
	/*
	 * Still seen about once in 20 loaded runs (either transport): 3 pages
	 * in the file, 2 resident, nothing in flight, for 5 s and more. A page
	 * the books lost; cause not found yet. Say which.
	 */
	if (in_file() != 2 || h->stats.resident_pages != 2) {
		static unsigned char vec[NPAGES];
		const uint8_t *m = (const uint8_t *)h + h->regions[0].map_offset;
		fprintf(stderr, "registered: %llu pages in the file, %llu resident, %llu in flight\n",
			(unsigned long long)in_file(), (unsigned long long)h->stats.resident_pages,
			(unsigned long long)in_flight(h));
		if (mincore(a, REGION, vec) == 0)
			for (uint64_t i = 0; i < NPAGES; i++)
				if ((vec[i] & 1) || fm_pg_state(m[i]) != FM_PG_UNTOUCHED)
					fprintf(stderr, "  page %llu: %s the page cache, state byte %#x\n",
						(unsigned long long)i, vec[i] & 1 ? "in" : "not in", m[i]);
	}
	/* Pages the books do not count would spin the faults below (a wrong drop livelocks them). */
	if (failures)
		goto out;
	/* A minor fault maps the file's page again (unless the reader's faults mapped it around theirs). */
	CHECK(page_ok(a, 1, 1));

	for (uint64_t i = 2; i < NPAGES; i++) {
		write_page(a, i, 1);
		ver[i] = 1;
	}
	for (unsigned k = 0; k < 2 * NPAGES; k++) {
		uint64_t i = (uint64_t)rand_r(&seed) % NPAGES;
		write_page(a, i, ++ver[i]);
	}
	CHECK(verify(a, ver) == 0);
	n = in_file();
	CHECK(n <= limit_pages);
	if (n > limit_pages)
		fprintf(stderr, "%llu pages in the page cache, budget %llu\n", (unsigned long long)n,
			(unsigned long long)limit_pages);

	/*
	 * Unmap resident pages behind the pager's back, as reclaim does: they
	 * stay in the file, and the next touch is a minor fault that must map the
	 * file's (latest) bytes, dirty or clean.
	 *
	 * Unless the evictor runs meanwhile: it was still bringing the resident
	 * pages down to evict_low after the writes above, or was kicked again.
	 * Its clock then takes the pages this pass has not touched yet (their
	 * REF bits are clear, the touched ones' are set), each comes back by a
	 * remote read that evicts the next: a whole pass can go without a minor
	 * fault (seen: 0 of 1900). The bytes are right either way, but only a
	 * pass with no eviction from its start until the pager has settled
	 * after it says how many minor faults there must be: one per page.
	 * Such a pass is retried a few times.
	 */
	{
		static unsigned char vec[NPAGES];
		uint64_t minor = 0, found = 0, evicted = UINT64_MAX;
		for (int pass = 0; pass < 5 && evicted; pass++) {
			uint64_t m0, e0;
			CHECK(settle(h, high));
			m0 = h->stats.minor_faults;
			e0 = evictions(h);
			found = 0;
			CHECK(mincore(a, REGION, vec) == 0); /* in the file and uptodate */
			for (uint64_t i = 0; i < NPAGES; i++)
				if (vec[i] & 1) {
					CHECK(madvise(a + i * PG, PG, MADV_DONTNEED) == 0);
					found++;
				}
			for (uint64_t i = 0; i < NPAGES; i++)
				if (vec[i] & 1) {
					CHECK(page_ok(a, i, ver[i]));
					if (i % 2)
						write_page(a, i, ++ver[i]);
				}
			CHECK(settle(h, high));
			minor = h->stats.minor_faults - m0;
			evicted = evictions(h) - e0;
			if (evicted)
				fprintf(stderr, "minor-fault pass %d: %llu pages evicted during it, %llu minor faults for "
					"%llu pages unmapped: again\n", pass, (unsigned long long)evicted,
					(unsigned long long)minor, (unsigned long long)found);
		}
		CHECK(evicted == 0);
		CHECK(found > 100);
		CHECK(minor == found);
		if (minor != found)
			fprintf(stderr, "%llu pages unmapped, %llu minor faults\n", (unsigned long long)found,
				(unsigned long long)minor);
	}

	/* Discard as a collector does: garbage (its bytes no longer matter), a write afterwards must survive. */
	{
		uint64_t discards = h->stats.discards;
		CHECK(fm_pager_discard(p, a + 200 * PG, 400 * PG) > 0);
		CHECK(h->stats.discards > discards);
		for (uint64_t i = 200; i < 600; i++)
			ver[i] = UINT32_MAX;
		CHECK(in_file() <= limit_pages);
		for (uint64_t i = 200; i < 600; i += 2)
			write_page(a, i, ver[i] = 9);
		for (unsigned k = 0; k < NPAGES; k++) {
			uint64_t i = 1000 + (uint64_t)rand_r(&seed) % (NPAGES - 1000);
			write_page(a, i, ++ver[i]);
		}
	}
	CHECK(verify(a, ver) == 0);
	CHECK(in_file() <= limit_pages);
	CHECK(h->stats.remote_reads > 0 && h->stats.evictions_dirty > 0 && h->stats.zero_fills > 0);
	CHECK(h->stats.peak_resident_pages <= h->stats.local_limit_pages);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);

	/* Bring everything home, then let the region go: the file holds every byte. */
	CHECK(fm_pager_fetch_all(p, a, REGION) == 0);
	CHECK(in_file() >= NPAGES - 400);
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	CHECK(verify(a, ver) == 0);
	munmap(a, REGION);
	close(heap_fd);
	printf("test_pager_shmem: %s: %llu remote reads, %llu dirty evictions, %llu minor faults\n", transport,
	       (unsigned long long)h->stats.remote_reads, (unsigned long long)h->stats.evictions_dirty,
	       (unsigned long long)h->stats.minor_faults);
out:
	free(ver);
	fm_pager_stop(p);
}

static pid_t memd_pid;

static void timed_out(int sig)
{
	static const char msg[] = "test_pager_shmem: no end after 600 s: the pager hangs or livelocks\n";

	(void)sig;
	if (memd_pid > 0)
		kill(memd_pid, SIGTERM);
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(1);
}

int main(void)
{
	char sock[64];
	pid_t memd;
	int st;

	/* A livelocked pager must fail `make test`, not stall it. */
	signal(SIGALRM, timed_out);
	alarm(600);

	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-shmem-%d.sock", getpid());
	memd = unit_start_memd(sock, "256M");
	if (memd < 0)
		return 1;
	memd_pid = memd;
	exercise(sock, "shm", "signal");
	exercise(sock, "shm", "thread");
	if (!failures)
		exercise(sock, "stream", "signal");
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (failures) {
		fprintf(stderr, "test_pager_shmem: %d checks failed\n", failures);
		return 1;
	}
	printf("test_pager_shmem: ok\n");
	return 0;
}
