// SPDX-License-Identifier: Apache-2.0
/*
 * What starting a program costs a paged process (issue 19, uffd/fork.c).
 * Run under `farmem run --local` well below --mib:
 *
 *   spawntest [--mib 256] [--times 3] [--child PATH] [METHOD...]
 *
 * METHOD is any of posix_spawn posix_spawnp system popen vfork fork_exec
 * (default: all, in that order). The buffer is filled with a pattern of its
 * own (every word of every page), so most of it is in memd when the spawns
 * start. Per method it starts --times children, each running the child
 * program (default /bin/false: exit status 1 says it ran, and not our 127
 * for an exec that failed; popen reads a line from echo instead), then
 * checks every word of the buffer.
 *
 * fork() brings every page in memd home first (pthread_atfork); vfork(),
 * posix_spawn() (a CLONE_VM|CLONE_VFORK clone in glibc, no atfork handlers)
 * and what glibc builds on it, system() and popen(), should not. To show
 * which paid, the program reads its own pager's counters (the residency
 * map: the memfd "farmem-map", uffd/resmap.h) around each batch, after
 * waiting for the pager to be back at its budget (so that each spawn finds
 * the buffer mostly in memd), and prints per method one line
 *
 *   {"method": "...", "spawns": N, "forks": d, "fork_pages_fetched": d,
 *    "forks_without_paged": d, "remote_reads": d, "resident_before": n,
 *    "call_us": median, "total_us": median}
 *
 * with the counters' increase over the batch (absent without farmem: the
 * same program is the baseline of bench/bench_spawn.py), call_us the time in
 * the spawning call (fork() includes the bring-home), total_us until the
 * child was reaped. Then "spawntest: METHOD ok"; "spawntest: all ok" at the
 * end. Exits 1 with a reason otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "resmap_self.h"

#define PG 4096ul
#define MAX_TIMES 1000

extern char **environ;

static uint64_t *buf;
static size_t npages;
static const char *child_path = "/bin/false";
static const struct fm_resmap_hdr *hdr; /* NULL: not under farmem */

static uint64_t word(size_t page, unsigned k)
{
	uint64_t x = ((uint64_t)page << 12) ^ k ^ 0x243f6a8885a308d3ull;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	return x ^ (x >> 29) ^ 1; /* never 0: a page read as zeros fails */
}

static void fill(void)
{
	for (size_t i = 0; i < npages; i++)
		for (unsigned k = 0; k < PG / 8; k++)
			buf[i * (PG / 8) + k] = word(i, k);
}

/* Words that do not hold the pattern; the first one's page in *first. */
static size_t check(size_t *first)
{
	size_t bad = 0;
	for (size_t i = 0; i < npages; i++)
		for (unsigned k = 0; k < PG / 8; k++)
			if (buf[i * (PG / 8) + k] != word(i, k) && !bad++)
				*first = i;
	return bad;
}

/* The pager writes its counters while we read them: one relaxed load each. */
#define ST(field) __atomic_load_n(&hdr->stats.field, __ATOMIC_RELAXED)

struct counts {
	uint64_t forks, fork_pages_fetched, forks_without_paged, remote_reads;
};

static struct counts counts_now(void)
{
	struct counts c = { 0, 0, 0, 0 };
	if (hdr) {
		c.forks = ST(forks);
		c.fork_pages_fetched = ST(fork_pages_fetched);
		c.forks_without_paged = ST(forks_without_paged);
		c.remote_reads = ST(remote_reads);
	}
	return c;
}

/*
 * Until the pager is back at its budget (a fork brings everything home and
 * the evictor takes it back out afterwards), at most 10 s: each spawn should
 * find the buffer as a working program's would be, mostly in memd.
 */
static void settle(void)
{
	struct timespec ts = { 0, 2000000 };
	if (!hdr)
		return;
	for (int k = 0; k < 5000 && ST(resident_pages) > ST(local_limit_pages) + 256; k++)
		nanosleep(&ts, NULL);
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static char *child_argv[2];

/* The child's status as wait() gives it, or -1 with errno. */
static int reap(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return st;
}

/*
 * vfork() in a function of its own with no locals live across it: the child
 * shares this stack until it execs.
 */
static pid_t start_vfork(void)
{
	pid_t pid = vfork();
	if (pid == 0) {
		execv(child_path, child_argv);
		_exit(127);
	}
	return pid;
}

static pid_t start_fork(void)
{
	pid_t pid = fork();
	if (pid == 0) {
		execv(child_path, child_argv);
		_exit(127);
	}
	return pid;
}

/*
 * One spawn by method m; *call_us the time in the spawning call. Returns 0
 * when the child ran and exited as the child program does.
 */
static int spawn_one(const char *m, double *call_us, char *why, size_t whylen)
{
	double t0 = now_us();
	int st, want = 1, rc;
	pid_t pid = -1;

	if (!strcmp(m, "posix_spawn") || !strcmp(m, "posix_spawnp")) {
		rc = !strcmp(m, "posix_spawn") ? posix_spawn(&pid, child_path, NULL, NULL, child_argv, environ)
					       : posix_spawnp(&pid, strrchr(child_path, '/') + 1, NULL, NULL,
							      child_argv, environ);
		*call_us = now_us() - t0;
		if (rc) {
			snprintf(why, whylen, "%s: %s", m, strerror(rc));
			return -1;
		}
		st = reap(pid);
	} else if (!strcmp(m, "system")) {
		st = system(child_path);
		*call_us = now_us() - t0;
	} else if (!strcmp(m, "popen")) {
		char line[64] = "";
		FILE *f = popen("echo spawntest-popen", "r");
		*call_us = now_us() - t0;
		if (!f) {
			snprintf(why, whylen, "popen: %s", strerror(errno));
			return -1;
		}
		if (!fgets(line, sizeof(line), f) || strcmp(line, "spawntest-popen\n")) {
			snprintf(why, whylen, "popen: read \"%s\"", line);
			pclose(f);
			return -1;
		}
		st = pclose(f);
		want = 0;
	} else if (!strcmp(m, "vfork") || !strcmp(m, "fork_exec")) {
		pid = !strcmp(m, "vfork") ? start_vfork() : start_fork();
		*call_us = now_us() - t0;
		if (pid < 0) {
			snprintf(why, whylen, "%s: %s", m, strerror(errno));
			return -1;
		}
		st = reap(pid);
	} else {
		snprintf(why, whylen, "no method %s", m);
		return -1;
	}
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != want) {
		snprintf(why, whylen, "%s: child status %#x, want exit %d", m, (unsigned)st, want);
		return -1;
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void add(struct counts *sum, struct counts a, struct counts b)
{
	sum->forks += b.forks - a.forks;
	sum->fork_pages_fetched += b.fork_pages_fetched - a.fork_pages_fetched;
	sum->forks_without_paged += b.forks_without_paged - a.forks_without_paged;
	sum->remote_reads += b.remote_reads - a.remote_reads;
}

static int run_method(const char *m, int times)
{
	static double call[MAX_TIMES], total[MAX_TIMES];
	struct counts sum = { 0, 0, 0, 0 };
	uint64_t resident_before = 0;
	size_t first = 0, bad;
	char why[256];

	for (int k = 0; k < times; k++) {
		struct counts c0;
		double t0;

		settle();
		/* The counters cover the spawns only, each from just before it to just after. */
		c0 = counts_now();
		if (hdr && (!k || ST(resident_pages) > resident_before))
			resident_before = ST(resident_pages); /* the most any spawn found resident */
		t0 = now_us();
		if (spawn_one(m, &call[k], why, sizeof(why))) {
			printf("spawntest: %s FAILED: %s\n", m, why);
			return 1;
		}
		total[k] = now_us() - t0;
		add(&sum, c0, counts_now());
	}
	printf("{\"method\": \"%s\", \"spawns\": %d, \"call_us\": %.1f, \"total_us\": %.1f", m, times,
	       median(call, times), median(total, times));
	if (hdr)
		printf(", \"forks\": %llu, \"fork_pages_fetched\": %llu, \"forks_without_paged\": %llu, "
		       "\"remote_reads\": %llu, \"resident_before\": %llu",
		       (unsigned long long)sum.forks, (unsigned long long)sum.fork_pages_fetched,
		       (unsigned long long)sum.forks_without_paged, (unsigned long long)sum.remote_reads,
		       (unsigned long long)resident_before);
	printf("}\n");
	bad = check(&first);
	if (bad) {
		printf("spawntest: %s FAILED: %zu words of the buffer wrong after it, the first in page %zu\n", m,
		       bad, first);
		return 1;
	}
	printf("spawntest: %s ok\n", m);
	fflush(stdout);
	return 0;
}

static const char *const all_methods[] = { "posix_spawn", "posix_spawnp", "system", "popen", "vfork", "fork_exec" };

int main(int argc, char **argv)
{
	size_t mib = 256, first = 0, bad;
	int times = 3, a = 1;

	for (; a < argc && !strncmp(argv[a], "--", 2); a++) {
		if (a + 1 >= argc)
			break;
		if (!strcmp(argv[a], "--mib"))
			mib = strtoul(argv[++a], NULL, 0);
		else if (!strcmp(argv[a], "--times"))
			times = atoi(argv[++a]);
		else if (!strcmp(argv[a], "--child"))
			child_path = argv[++a];
		else
			break;
	}
	if (a < argc && !strncmp(argv[a], "--", 2)) {
		fprintf(stderr, "usage: spawntest [--mib 256] [--times 3] [--child /bin/false] [METHOD...]\n");
		return 2;
	}
	if (times < 1 || times > MAX_TIMES || !mib || child_path[0] != '/') {
		fprintf(stderr, "spawntest: --times 1..%d, --mib > 0, --child an absolute path\n", MAX_TIMES);
		return 2;
	}
	child_argv[0] = (char *)child_path;
	npages = (mib << 20) / PG;
	buf = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	fill();
	hdr = fm_resmap_self();
	printf("spawntest: %zu pages, %s\n", npages, hdr ? "paged" : "not under farmem");
	bad = check(&first);
	if (bad) {
		printf("spawntest: fill FAILED: %zu words wrong, the first in page %zu\n", bad, first);
		return 1;
	}
	if (a == argc) {
		for (size_t k = 0; k < sizeof(all_methods) / sizeof(*all_methods); k++)
			if (run_method(all_methods[k], times))
				return 1;
	} else {
		for (; a < argc; a++)
			if (run_method(argv[a], times))
				return 1;
	}
	printf("spawntest: all ok\n");
	return 0;
}
