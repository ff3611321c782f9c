// SPDX-License-Identifier: Apache-2.0
/*
 * fork() of a paged process (uffd/fork.c), checked byte for byte. Run under
 * `farmem run --local` well below --size:
 *
 *   - Two threads rewrite a second buffer all along, so the parent evicts
 *     while it forks.
 *   - The buffer: most pages written with a tag, some never touched, some
 *     freed (MADV_DONTNEED), much of it in memd at the fork.
 *   - The child reads every page (tag, or zeros), writes all of it, and
 *     forks a grandchild that reads the child's bytes; the parent rewrites
 *     the buffer meanwhile and checks its own bytes after.
 *   - With a budget given (the second argument, MiB: farmem run's --local),
 *     the child pages on its own: what it holds of the paged buffer
 *     (mincore) comes down to the budget after the fork, and stays there
 *     while it writes all of the buffer, which is more than the budget.
 *   - fork+exec of /bin/true, several times: works, pages nothing.
 *   - A child that cannot start a pager of its own (no file descriptor
 *     left: RLIMIT_NOFILE at the fork) runs on unpaged, every byte right.
 *   - A child made by a raw clone(), which runs no fork handlers, and reads
 *     a paged page: it must die (SIGSEGV), never read a wrong byte.
 *   - Forks while another thread grows a paged mapping with mremap (the
 *     pager's remap, uffd/remap.c, moves the range's books in steps) and
 *     maps, writes and unmaps another paged mapping: each child starts its
 *     pager with no range it cannot page (the launcher's output says so),
 *     and every byte of the grown mapping is right at the end.
 *   - A fork whose prepare handler, registered before the pager started (so
 *     it runs after the pager's), maps, writes and unmaps a paged mapping:
 *     the fork completes (the shim's hooks do not wait on the fork's own
 *     lock in the forking thread), and the child runs.
 *
 * Prints "forktest: <part> ok" per part; exits 1 with a reason otherwise.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096ul

static size_t npages;
static uint8_t *buf, *churn;
static size_t nchurn, budget_pages;
static atomic_int stop_churn;

/* The mapping the remapper grows: where it is now (only the remapper moves it), and its pages. */
static uint8_t *rbuf;
static size_t rpages;
static atomic_int stop_remap;
static int remap_failed;
static size_t unmaps;

#define REMAP_FIRST (64ul << 20)  /* farmem run's threshold: paged from the start */
#define REMAP_STEP 256ul          /* pages a growth adds */
#define REMAP_MAX_PAGES (96ul << 8)
#define REMAP_FORKS 20

static uint64_t word(uint64_t tag, uint64_t page, unsigned k)
{
	uint64_t x = (tag << 40) ^ (page << 9) ^ k ^ 0x9e3779b97f4a7c15ull;
	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ull;
	return x ^ (x >> 29);
}

/* What page i holds for a given generation: 0 never touched, 1 freed (zeros), else tagged. */
static int kind(size_t i)
{
	if (i % 17 == 5)
		return 0;
	if (i % 23 == 7)
		return 1;
	return 2;
}

static void fill(uint8_t *pg, uint64_t tag, size_t i)
{
	uint64_t *w = (uint64_t *)pg;
	for (unsigned k = 0; k < PG / 8; k += 8) /* every 8th word: cheap, and any zero page fails */
		w[k] = word(tag, i, k);
}

static int holds(const uint8_t *pg, uint64_t tag, size_t i)
{
	const uint64_t *w = (const uint64_t *)pg;
	for (unsigned k = 0; k < PG / 8; k++)
		if (w[k] != (tag && k % 8 == 0 ? word(tag, i, k) : 0))
			return 0;
	return 1;
}

/* Pages of buf that do not hold generation tag; the first one in *first. */
static size_t check(uint64_t tag, size_t *first)
{
	size_t bad = 0;
	for (size_t i = 0; i < npages; i++) {
		uint64_t want = kind(i) == 2 ? tag : 0;
		if (!holds(buf + i * PG, want, i) && !bad++)
			*first = i;
	}
	return bad;
}

static void write_all(uint64_t tag)
{
	for (size_t i = 0; i < npages; i++)
		if (kind(i) == 2)
			fill(buf + i * PG, tag, i);
}

static void *churner(void *arg)
{
	uint64_t x = (uintptr_t)arg * 7919 + 1;
	while (!atomic_load(&stop_churn)) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		churn[(x >> 20) % nchurn * PG + 64] ^= 1;
	}
	return NULL;
}

/* The mappings over [a, a + len), as /proc/self/maps has them (a failure's context). */
static void show_maps(const void *a, size_t len)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo < (uintptr_t)a + len && hi > (uintptr_t)a)
			printf("forktest:   %s", line);
	}
	if (f)
		fclose(f);
}

/*
 * Grows rbuf a MiB at a time by mremap (moving it when it must), writing each
 * new MiB; back to its first size by a shrinking mremap when it reaches 96
 * MiB. Every growth checks the page before and after the old end.
 */
static void *remapper(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_remap)) {
		size_t want = rpages + REMAP_STEP;
		uint8_t *q;

		if (want > REMAP_MAX_PAGES) {
			q = mremap(rbuf, rpages * PG, REMAP_FIRST, 0);
			want = REMAP_FIRST / PG;
		} else {
			q = mremap(rbuf, rpages * PG, want * PG, MREMAP_MAYMOVE);
		}
		if (q == MAP_FAILED) {
			printf("forktest: remap FAILED: mremap of %p+%zu pages to %zu pages: %s\n", (void *)rbuf, rpages,
			       want, strerror(errno));
			show_maps(rbuf, rpages * PG);
			remap_failed = 1;
			return NULL;
		}
		for (size_t i = rpages; i < want; i++)
			fill(q + i * PG, 5, i);
		if (!holds(q + (want - 1) * PG, 5, want - 1) || !holds(q, 5, 0) ||
		    (want > rpages && !holds(q + (rpages - 1) * PG, 5, rpages - 1))) {
			printf("forktest: remap FAILED: wrong bytes after a growth to %zu pages\n", want);
			remap_failed = 1;
			return NULL;
		}
		rbuf = q;
		rpages = want;

		/* A paged mapping made and let go of, pages written in it: mmap and munmap beside the forks. */
		q = mmap(NULL, REMAP_FIRST, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED) {
			printf("forktest: remap FAILED: mmap: %s\n", strerror(errno));
			remap_failed = 1;
			return NULL;
		}
		for (size_t i = 0; i < REMAP_FIRST / PG; i += REMAP_STEP)
			fill(q + i * PG, 6, i);
		if (!holds(q, 6, 0) || munmap(q, REMAP_FIRST)) {
			printf("forktest: remap FAILED: a fresh mapping's first page, or its munmap: %s\n", strerror(errno));
			remap_failed = 1;
			return NULL;
		}
		unmaps++;
	}
	return NULL;
}

/* Set while the "handler" part forks: the prepare handler then maps, writes and unmaps a paged mapping. */
static atomic_int handler_maps;
static int handler_ok = 1;

static void prepare_maps(void)
{
	uint8_t *q;

	if (!atomic_load(&handler_maps))
		return;
	q = mmap(NULL, REMAP_FIRST, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED) {
		handler_ok = 0;
		return;
	}
	fill(q, 7, 0);
	if (!holds(q, 7, 0) || munmap(q, REMAP_FIRST))
		handler_ok = 0;
}

static int fail(const char *what, size_t bad, size_t first)
{
	printf("forktest: %s FAILED: %zu pages wrong, the first %zu\n", what, bad, first);
	return 1;
}

/* Pages of buf present in this process's page tables (churn is below farmem's threshold: not paged). */
static size_t present(void)
{
	static unsigned char v[1 << 16];
	size_t n = 0;

	for (size_t i = 0; i < npages; i += sizeof(v)) {
		size_t m = npages - i < sizeof(v) ? npages - i : sizeof(v);
		if (mincore(buf + i * PG, m * PG, v))
			return SIZE_MAX;
		for (size_t j = 0; j < m; j++)
			n += v[j] & 1;
	}
	return n;
}

/*
 * The child's own pager brings what it holds down to its budget (in a thread
 * of its own, soon after the fork): wait for it, 30 s at most.
 */
static int under_budget(const char *who, const char *when)
{
	size_t have = present();

	for (int k = 0; k < 3000 && have > budget_pages; k++) {
		usleep(10000);
		have = present();
	}
	printf("forktest: %s holds %zu pages of the paged buffer %s (budget %zu)\n", who, have, when, budget_pages);
	if (have > budget_pages) {
		printf("forktest: %s budget FAILED: %zu pages present %s, over its budget of %zu\n", who, have, when,
		       budget_pages);
		return 0;
	}
	return 1;
}

static int child(void)
{
	size_t first = 0, bad = check(1, &first);
	pid_t g;
	int st;

	if (bad)
		return fail("child (the parent's bytes at fork)", bad, first);
	if (budget_pages && !under_budget("child", "after the fork"))
		return 1;
	write_all(2);
	bad = check(2, &first);
	if (bad)
		return fail("child (its own bytes, written over its budget)", bad, first);
	if (budget_pages && !under_budget("child", "after writing all of it"))
		return 1;
	fflush(stdout); /* or the grandchild prints it again */
	g = fork();
	if (g < 0)
		return 1;
	if (g == 0) {
		bad = check(2, &first);
		st = bad ? fail("grandchild", bad, first) : 0;
		if (!st && budget_pages && !under_budget("grandchild", "after the fork"))
			st = 1;
		fflush(stdout);
		_exit(st);
	}
	if (waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st)) {
		printf("forktest: grandchild FAILED: status %#x\n", st);
		return 1;
	}
	bad = check(2, &first);
	return bad ? fail("child (its own bytes)", bad, first) : 0;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 0) : 128, first = 0, bad;
	size_t local_mib = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
	pthread_t th[2];
	pid_t pid;
	int st;

	/* Before the first paged mapping starts the pager (and its fork handlers): this one runs after theirs. */
	pthread_atfork(prepare_maps, NULL, NULL);
	npages = (mib << 20) / PG;
	budget_pages = (local_mib << 20) / PG;
	nchurn = npages / 2;
	buf = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	churn = mmap(NULL, nchurn * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED || churn == MAP_FAILED)
		return 1;
	for (size_t i = 0; i < npages; i++)
		if (kind(i))
			fill(buf + i * PG, 1, i);
	for (size_t i = 0; i < npages; i++)
		if (kind(i) == 1)
			madvise(buf + i * PG, PG, MADV_DONTNEED);
	memset(churn, 1, nchurn * PG);
	for (long t = 0; t < 2; t++)
		pthread_create(&th[t], NULL, churner, (void *)t);

	/* A child that reads the buffer as it was, while the parent rewrites it and evicts. */
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		int rc = child();
		fflush(stdout); /* _exit would drop what a pipe's buffer holds */
		_exit(rc);
	}
	write_all(3);
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
		printf("forktest: child FAILED: status %#x\n", st);
		return 1;
	}
	bad = check(3, &first);
	if (bad)
		return fail("parent (its bytes after the fork)", bad, first);
	printf("forktest: fork ok\n");

	/* fork+exec: the usual way to start a program. */
	for (int k = 0; k < 3; k++) {
		pid = fork();
		if (pid == 0) {
			execl("/bin/true", "true", (char *)NULL);
			_exit(127);
		}
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
			printf("forktest: fork+exec FAILED: status %#x\n", st);
			return 1;
		}
	}
	printf("forktest: exec ok\n");

	/* No descriptor left for the child's pager: it must run on with the memory it got, unpaged. */
	{
		struct rlimit was, none;
		int lowest = dup(0);

		if (lowest < 0 || close(lowest) || getrlimit(RLIMIT_NOFILE, &was))
			return 1;
		none = was;
		none.rlim_cur = (rlim_t)lowest;
		fflush(stdout);
		if (setrlimit(RLIMIT_NOFILE, &none))
			return 1;
		pid = fork();
		if (pid == 0) {
			bad = check(3, &first);
			if (!bad) {
				write_all(4);
				bad = check(4, &first);
			}
			st = bad ? fail("child without a pager", bad, first) : 0;
			fflush(stdout);
			_exit(st);
		}
		setrlimit(RLIMIT_NOFILE, &was);
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
			printf("forktest: child without a pager FAILED: status %#x\n", st);
			return 1;
		}
	}
	printf("forktest: nofd ok\n");

	/* A raw clone() runs no fork handlers: the paged ranges are not in its child at all. */
	pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
	if (pid == 0) {
		volatile uint8_t *p = buf + 3 * PG;
		_exit(*p == 0 ? 3 : 4); /* either is a wrong byte: the page holds a tag */
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV) {
		printf("forktest: raw clone FAILED: status %#x (a SIGSEGV was expected)\n", st);
		return 1;
	}
	printf("forktest: raw clone ok\n");

	/* Forks racing another thread's mremaps of paged memory. */
	{
		pthread_t rt;
		size_t bad_pages = 0;

		rpages = REMAP_FIRST / PG;
		rbuf = mmap(NULL, REMAP_FIRST, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (rbuf == MAP_FAILED)
			return 1;
		for (size_t i = 0; i < rpages; i++)
			fill(rbuf + i * PG, 5, i);
		pthread_create(&rt, NULL, remapper, NULL);
		for (int k = 0; k < REMAP_FORKS; k++) {
			usleep(2000);
			fflush(stdout);
			pid = fork();
			if (pid == 0) {
				/* A hooked call waits until this child's pager has registered what it got. */
				void *m = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
				_exit(m == MAP_FAILED || munmap(m, PG) ? 1 : 0);
			}
			if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
				printf("forktest: remap child FAILED: status %#x\n", st);
				return 1;
			}
		}
		atomic_store(&stop_remap, 1);
		pthread_join(rt, NULL);
		if (remap_failed)
			return 1;
		for (size_t i = 0; i < rpages; i++)
			bad_pages += !holds(rbuf + i * PG, 5, i);
		if (bad_pages)
			return fail("remap (the grown mapping)", bad_pages, 0);
		printf("forktest: remap ok (%d forks, the mapping at %zu MiB, %zu mappings made and unmapped)\n",
		       REMAP_FORKS, rpages >> 8, unmaps);
	}

	/* A fork whose prepare handler maps, writes and unmaps a paged mapping (alarm: a hang fails). */
	alarm(60);
	atomic_store(&handler_maps, 1);
	fflush(stdout);
	pid = fork();
	atomic_store(&handler_maps, 0);
	if (pid == 0)
		_exit(0);
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) || !handler_ok) {
		printf("forktest: handler FAILED: status %#x, mapping %s\n", st, handler_ok ? "ok" : "wrong");
		return 1;
	}
	alarm(0);
	printf("forktest: handler ok\n");

	atomic_store(&stop_churn, 1);
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	bad = check(3, &first);
	if (bad)
		return fail("parent (at the end)", bad, first);
	printf("forktest: all ok\n");
	return 0;
}
