/* SPDX-License-Identifier: Apache-2.0 */
/*
 * arenatest: small malloc blocks of many threads, which glibc keeps in the
 * threads' own heaps (64 MiB reserved PROT_NONE, made writable with mprotect
 * as they grow), not in mappings of their own. Under farmem the shim pages
 * those heaps as they are made writable (uffd/preload.c, reservations).
 *
 * Each round every thread builds a list of blocks of 16 to 400 bytes, a
 * quarter of them from calloc (checked to be zeros), each filled with a
 * pattern of its key; then each thread checks the list of the next thread
 * and frees it, block by block (a free into another thread's arena takes
 * that arena's lock, and more threads than arenas share them). Freeing a
 * heap's top makes glibc give its pages back with its own madvise, which no
 * hook sees. All threads also write lines to one stdio stream opened by a
 * worker thread, so its FILE (and its lock) lives in a thread's heap. At the
 * end the stream is read back and every line counted, and one more list,
 * built by a thread and kept, is checked by a forked child.
 *
 * Before the rounds each thread also takes IO_BLOCKS small blocks that hold
 * what a program hands the kernel: a path, a struct stat, a read buffer.
 * The rounds leave them cold (evicted, under farmem); after them each block
 * goes to the kernel through syscall(2), which no cover of the shim sees:
 * openat of its path, pread into its buffer, fstat into its struct stat.
 * Each must succeed with the file's bytes and size (an evicted page the
 * kernel cannot wait for would give EFAULT).
 *
 * With --main, the main thread does all of that alone (one list, no
 * fork): its blocks come from glibc's main heap, which grows with brk.
 *
 * With --dlopen LIB, the library is opened first (RTLD_GLOBAL), as PHP and
 * Python open their extensions: the dynamic linker keeps what it needs to
 * look up a symbol (the library's link map, the grown global scope) in
 * blocks of the main heap, which get paged and go cold like the rest.
 *
 * With --printf, a printf specifier is registered first (%Y, as R's libraries
 * register theirs) and the locale is taken from the environment: glibc keeps
 * both in blocks of the main heap, which go cold like the rest. A pager
 * thread that formatted with printf read them (R hung so).
 *
 * With --reserve, no threads: one reservation of 1.5 times --mib, made
 * PROT_NONE the way V8's and .NET's heaps are, whose parts the program makes
 * writable with mprotect, 4 MiB at a time, and fills. Then, each part checked
 * after: one part is made unreadable and readable again (its bytes stay), one
 * gets a guard page (PROT_NONE) every GUARD_EVERY pages, as V8's code space
 * has, and the pages between them are written again and left cold, one is
 * replaced by a fresh writable mapping (MAP_FIXED: zeros), the last eighth
 * is unmapped, and a new reservation is made and committed in that hole.
 * With --reserve --wide, GHC's way instead (reserve_wide); with --windows N
 * too, small parts in N windows of 4 GiB each (reserve_windows).
 *
 * With --pages, V8's way (v8_pages): --mib of 256 KiB pages, each reserved
 * PROT_NONE on its own, trimmed to its alignment and made writable; with
 * --fork too, a child of a fork reads them and reserves its own (v8_fork);
 * with --edges, pages are unmapped in part, moved and mapped over (v8_edges).
 * With --many N, N pages with a word written in each (v8_many); with
 * --fork-race N, N forks beside a thread that takes and frees pages (with
 * --full, in a full pool; with --untouched, reserved and unmapped only).
 *
 * Prints "arenatest: ok ..." with the peak resident set (VmHWM, before the
 * fork) in MiB, or
 * the first wrong byte. Exit 0, 1 on a wrong byte or count, 2 on usage.
 *
 *   arenatest [--threads 24] [--mib 192] [--rounds 3] [--reserve [--wide [--windows N]] | --pages [--fork] [--edges] | --many N | --fork-race N [--full | --untouched] | --main] [--dlopen LIB] [--printf]
 */
#include <dirent.h>
#include <dlfcn.h>
#include <getopt.h>
#include <locale.h>
#include <printf.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mix.h"

struct node {
	struct node *next;
	uint64_t key;
	uint32_t len;
	uint8_t data[];
};

static unsigned nthreads = 24, rounds = 3;
static size_t per_thread;
static struct node **lists;
static pthread_barrier_t barrier;
static FILE *log_file;
static char log_path[64];
static atomic_ulong nodes_built, lines_written, io_calls;
static atomic_int failed;

#define IO_BLOCKS 512
#define IO_FILE_BYTES 4096
#define IO_BUF 128

struct io_block {
	char path[64];
	struct stat st;
	uint8_t buf[IO_BUF];
};
static char io_path[64];

static uint8_t io_byte(unsigned off)
{
	return (uint8_t)(mix(off) >> 7);
}

static struct io_block **io_take(void)
{
	struct io_block **b = malloc(IO_BLOCKS * sizeof(*b));

	for (unsigned k = 0; b && k < IO_BLOCKS; k++) {
		b[k] = malloc(sizeof(**b));
		if (!b[k])
			return NULL;
		memset(b[k], 0xa5, sizeof(**b));
		snprintf(b[k]->path, sizeof(b[k]->path), "%s", io_path);
	}
	return b;
}

/* Each block to the kernel, past every cover: openat its path, pread into it, fstat into it. */
static int io_check(unsigned t, struct io_block **b)
{
	for (unsigned k = 0; k < IO_BLOCKS; k++) {
		unsigned off = (t * IO_BLOCKS + k) * 8 % (IO_FILE_BYTES - IO_BUF);
		long fd = syscall(SYS_openat, AT_FDCWD, b[k]->path, O_RDONLY | O_CLOEXEC), n, st;

		if (fd < 0) {
			fprintf(stderr, "arenatest: thread %u block %u: openat of a path in the heap: %s\n", t, k,
				strerror(errno));
			return 1;
		}
		n = syscall(SYS_pread64, fd, b[k]->buf, IO_BUF, (long)off);
		st = syscall(SYS_fstat, fd, &b[k]->st);
		syscall(SYS_close, fd);
		if (n != IO_BUF || st) {
			fprintf(stderr, "arenatest: thread %u block %u: pread %ld, fstat %ld into the heap: %s\n", t, k, n,
				st, strerror(errno));
			return 1;
		}
		for (unsigned j = 0; j < IO_BUF; j++)
			if (b[k]->buf[j] != io_byte(off + j)) {
				fprintf(stderr, "arenatest: thread %u block %u: byte %u read is %#x\n", t, k, j, b[k]->buf[j]);
				return 1;
			}
		if (b[k]->st.st_size != IO_FILE_BYTES) {
			fprintf(stderr, "arenatest: thread %u block %u: fstat says %lld bytes\n", t, k,
				(long long)b[k]->st.st_size);
			return 1;
		}
		free(b[k]);
		atomic_fetch_add(&io_calls, 3);
	}
	free(b);
	return 0;
}

static uint8_t byte_of(uint64_t key, uint32_t j)
{
	return (uint8_t)(mix(key * 1024 + j / 8) >> (8 * (j % 8)));
}

static void build(unsigned t, unsigned round)
{
	struct node *head = NULL;
	uint64_t seed = mix(((uint64_t)t << 32) | round);
	size_t bytes = 0;

	for (uint64_t idx = 0; bytes < per_thread; idx++) {
		uint32_t len = 16 + (uint32_t)(mix(seed + idx) % 385);
		uint64_t key = ((uint64_t)t << 48) | ((uint64_t)round << 40) | idx;
		struct node *n = idx % 4 ? malloc(sizeof(*n) + len) : calloc(1, sizeof(*n) + len);

		if (!n) {
			fprintf(stderr, "arenatest: out of memory\n");
			exit(1);
		}
		if (!(idx % 4))
			for (uint32_t j = 0; j < len; j++)
				if (n->data[j]) {
					fprintf(stderr, "arenatest: calloc gave a nonzero byte (thread %u, block %llu)\n", t,
						(unsigned long long)idx);
					atomic_store(&failed, 1);
					break;
				}
		n->key = key;
		n->len = len;
		for (uint32_t j = 0; j < len; j++)
			n->data[j] = byte_of(key, j);
		n->next = head;
		head = n;
		bytes += sizeof(*n) + len;
		if (idx % 1000 == 0) {
			fprintf(log_file, "thread %u round %u block %llu\n", t, round, (unsigned long long)idx);
			atomic_fetch_add(&lines_written, 1);
		}
		atomic_fetch_add(&nodes_built, 1);
	}
	lists[t] = head;
}

static void check_and_free(unsigned t, unsigned round)
{
	unsigned from = (t + 1) % nthreads;
	struct node *n = lists[from];

	while (n) {
		struct node *next = n->next;
		if ((n->key >> 48) != from || ((n->key >> 40) & 0xff) != round) {
			fprintf(stderr, "arenatest: block %p has key %#llx, not one of thread %u's in round %u\n", (void *)n,
				(unsigned long long)n->key, from, round);
			atomic_store(&failed, 1);
			return;
		}
		for (uint32_t j = 0; j < n->len; j++)
			if (n->data[j] != byte_of(n->key, j)) {
				fprintf(stderr, "arenatest: block %#llx byte %u is %#x, not %#x\n", (unsigned long long)n->key, j,
					n->data[j], byte_of(n->key, j));
				atomic_store(&failed, 1);
				return;
			}
		free(n);
		n = next;
	}
	lists[from] = NULL;
}

/* Every block of thread t's list of the given round as built: 0, or 1 with a message. */
static int check_list(unsigned t, unsigned round)
{
	for (struct node *n = lists[t]; n; n = n->next) {
		if ((n->key >> 48) != t || ((n->key >> 40) & 0xff) != round) {
			fprintf(stderr, "arenatest: block %p has key %#llx\n", (void *)n, (unsigned long long)n->key);
			return 1;
		}
		for (uint32_t j = 0; j < n->len; j++)
			if (n->data[j] != byte_of(n->key, j)) {
				fprintf(stderr, "arenatest: block %#llx byte %u is wrong\n", (unsigned long long)n->key, j);
				return 1;
			}
	}
	return 0;
}

static void *builder(void *arg)
{
	build(0, rounds);
	return arg;
}

/*
 * Under farmem a forked child starts a pager of its own for the paged
 * ranges it got, on a thread named farmem-child that ends once the pager
 * runs. A child that finds every page home (the fork brought them) could
 * otherwise exit before then, and the run would count one paged process or
 * two by chance. Waits at most 10 s; returns at once without farmem.
 */
static void child_pager_settles(void)
{
	for (int tries = 0; tries < 10000; tries++) {
		char path[64], comm[32];
		int found = 0;
		DIR *d = opendir("/proc/self/task");
		struct dirent *e;

		while (d && !found && (e = readdir(d))) {
			FILE *f;
			snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", e->d_name);
			f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
			found = f && fgets(comm, sizeof(comm), f) && !strncmp(comm, "farmem-child", 12);
			if (f)
				fclose(f);
		}
		if (d)
			closedir(d);
		if (!found)
			return;
		usleep(1000);
	}
}

/* A list built by a thread, kept, then read by a forked child: its heap's pages are the child's too. */
static int fork_reads_heap(void)
{
	pthread_t th;
	pid_t pid;
	int status;

	if (pthread_create(&th, NULL, builder, NULL) || pthread_join(th, NULL))
		return 1;
	pid = fork();
	if (pid == 0) {
		int bad = check_list(0, rounds);
		/* A hooked call waits until the child's pager has started (and named its thread). */
		void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (page != MAP_FAILED)
			munmap(page, 4096);
		child_pager_settles();
		_exit(bad);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "arenatest: the forked child found its parent's blocks wrong\n");
		return 1;
	}
	return check_list(0, rounds);
}

static void *worker(void *arg)
{
	unsigned t = (unsigned)(uintptr_t)arg;

	if (t == 0) {
		/* Opened here, so that the FILE is a block of this thread's heap. */
		log_file = fopen(log_path, "w+");
		if (!log_file) {
			perror("arenatest: fopen");
			exit(1);
		}
	}
	struct io_block **io = io_take();

	if (!io) {
		fprintf(stderr, "arenatest: out of memory\n");
		exit(1);
	}
	pthread_barrier_wait(&barrier);
	for (unsigned r = 0; r < rounds && !atomic_load(&failed); r++) {
		build(t, r);
		pthread_barrier_wait(&barrier);
		check_and_free(t, r);
		pthread_barrier_wait(&barrier);
	}
	if (!atomic_load(&failed) && io_check(t, io))
		atomic_store(&failed, 1);
	return NULL;
}

static int io_file(void)
{
	uint8_t bytes[IO_FILE_BYTES];
	FILE *f;

	snprintf(io_path, sizeof(io_path), "/tmp/arenatest.%d.io", (int)getpid());
	for (unsigned k = 0; k < IO_FILE_BYTES; k++)
		bytes[k] = io_byte(k);
	f = fopen(io_path, "w");
	if (!f || fwrite(bytes, 1, sizeof(bytes), f) != sizeof(bytes) || fclose(f)) {
		perror("arenatest: the file the threads read");
		return 1;
	}
	return 0;
}

static long hwm_mib(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb < 0 ? -1 : kb >> 10;
}

#define PART (4ul << 20)

/*
 * Block id of size bytes, at p: each word its offset's mix (salt 0: zeros).
 * unit names the block in the message ("reserve: part 3 word 5 is ... (committed)").
 */
static int check_block(const uint8_t *p, size_t size, size_t id, unsigned salt, const char *unit, const char *what)
{
	const uint64_t *w = (const void *)p;

	for (size_t k = 0; k < size / 8; k++)
		if (w[k] != (salt ? mix(id * size + k * 8 + salt) : 0)) {
			fprintf(stderr, "arenatest: %s %zu word %zu is %#llx (%s)\n", unit, id, k,
				(unsigned long long)w[k], what);
			return 1;
		}
	return 0;
}

static int check_at(const uint8_t *p, size_t part, unsigned salt, const char *what)
{
	return check_block(p, PART, part, salt, "reserve: part", what);
}

static int check_part(const uint8_t *base, size_t part, unsigned salt, const char *what)
{
	return check_at(base + part * PART, part, salt, what);
}

static void fill_at(uint8_t *p, size_t part, unsigned salt)
{
	uint64_t *w = (void *)p;

	for (size_t k = 0; k < PART / 8; k++)
		w[k] = mix(part * PART + k * 8 + salt);
}

static void fill_words(uint8_t *base, size_t part, size_t first, size_t n, unsigned salt)
{
	uint64_t *w = (void *)(base + part * PART);

	for (size_t k = first; k < first + n; k++)
		w[k] = mix(part * PART + k * 8 + salt);
}

static void fill_part(uint8_t *base, size_t part, unsigned salt)
{
	fill_words(base, part, 0, PART / 8, salt);
}

#define GUARD_EVERY 16
#define PAGE_WORDS (4096 / 8)

/*
 * Guard pages in a part (PROT_NONE, out of the pager's reach), the pages
 * between them written again, then every other part read so that those
 * leave, dirty, in batches that reach over the guards; then the guards are
 * made writable and written too. Returns 0 when the part holds salt 3.
 */
static int guarded_part(uint8_t *base, size_t parts, size_t part)
{
	size_t pages = PART / 4096;
	int bad = 0;

	for (size_t pg = 1; pg < pages; pg += GUARD_EVERY)
		bad |= mprotect(base + part * PART + pg * 4096, 4096, PROT_NONE);
	for (size_t pg = 0; pg < pages && !bad; pg++)
		if (pg % GUARD_EVERY != 1)
			fill_words(base, part, pg * PAGE_WORDS, PAGE_WORDS, 3);
	for (size_t k = 0; k < parts && !bad; k++)
		if (k != part)
			bad = check_part(base, k, 1, "beside the guarded part");
	for (size_t pg = 1; pg < pages && !bad; pg += GUARD_EVERY)
		if (!(bad = mprotect(base + part * PART + pg * 4096, 4096, PROT_READ | PROT_WRITE)))
			fill_words(base, part, pg * PAGE_WORDS, PAGE_WORDS, 3);
	return bad || check_part(base, part, 3, "guarded");
}

static int reserve(unsigned long mib)
{
	size_t parts = (mib << 20) / PART, len = parts * PART * 3 / 2, hole = parts / 8;
	uint8_t *base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	size_t mid = parts / 2, fresh = parts / 4, guarded = parts / 4 + 1;
	int bad = 0;

	if (base == MAP_FAILED || parts < 16) {
		fprintf(stderr, "arenatest: reserve: cannot reserve %zu bytes\n", len);
		return 1;
	}
	for (size_t k = 0; k < parts; k++) {
		if (mprotect(base + k * PART, PART, PROT_READ | PROT_WRITE)) {
			perror("arenatest: reserve: mprotect");
			return 1;
		}
		fill_part(base, k, 1);
	}
	for (size_t k = 0; k < parts && !bad; k++)
		bad = check_part(base, k, 1, "committed");
	/* Unreadable, then readable again: the bytes stay. */
	bad |= mprotect(base + mid * PART, PART, PROT_NONE) || mprotect(base + mid * PART, PART, PROT_READ | PROT_WRITE);
	for (size_t k = 0; k < parts && !bad; k++)
		bad = check_part(base, k, 1, "after the round trip through PROT_NONE");
	bad = bad || guarded_part(base, parts, guarded);
	/* Replaced in place by fresh memory: zeros, then written again. */
	if (!bad && mmap(base + fresh * PART, PART, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
		    MAP_FAILED)
		bad = 1;
	bad = bad || check_part(base, fresh, 0, "replaced");
	if (!bad)
		fill_part(base, fresh, 2);
	/* The last eighth goes, and a new reservation may take its place. */
	bad = bad || munmap(base + (parts - hole) * PART, hole * PART);
	for (size_t k = 0; k < parts - hole && !bad; k++)
		bad = check_part(base, k, k == fresh ? 2 : k == guarded ? 3 : 1, "after the unmap");
	if (!bad) {
		uint8_t *again = mmap(base + (parts - hole) * PART, hole * PART, PROT_NONE,
				      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		bad = again == MAP_FAILED || mprotect(again, hole * PART, PROT_READ | PROT_WRITE);
		for (size_t k = parts - hole; k < parts && !bad; k++)
			bad = check_part(base, k, 0, "new reservation");
	}
	if (bad)
		return 1;
	printf("arenatest: ok reserve parts=%zu hwm=%ld MiB\n", parts, hwm_mib());
	return 0;
}

/*
 * --reserve --wide: GHC's heap. 1 TiB reserved PROT_NONE (its runtime's
 * reservation), parts made memory by mmap MAP_FIXED (its commit), most from
 * the start upwards as its heap grows, one across a 4 GiB boundary of the
 * address space and one 700 GiB in. Filled, then checked twice under
 * eviction; one part given back (mmap PROT_NONE over it) and made memory
 * again reads zeros.
 */
static int reserve_wide(unsigned long mib)
{
	size_t parts = (mib << 20) / PART, len = (1ull << 40) + PART;
	uint8_t *base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint8_t **at = calloc(parts, sizeof(*at));
	uintptr_t boundary;
	int bad = 0;

	if (base == MAP_FAILED || !at || parts < 4) {
		fprintf(stderr, "arenatest: reserve --wide: cannot reserve %zu bytes\n", len);
		return 1;
	}
	boundary = (((uintptr_t)base + (8ull << 30)) | ((4ull << 30) - 1)) + 1;
	for (size_t k = 0; k < parts; k++)
		at[k] = base + k * PART;
	at[parts - 2] = (uint8_t *)boundary - PART / 2;
	at[parts - 1] = base + (700ull << 30);
	for (size_t k = 0; k < parts; k++) {
		if (mmap(at[k], PART, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != at[k]) {
			perror("arenatest: reserve --wide: mmap MAP_FIXED");
			return 1;
		}
		fill_at(at[k], k, 1);
	}
	for (int round = 0; round < 2; round++)
		for (size_t k = 0; k < parts && !bad; k++)
			bad = check_at(at[k], k, 1, "a wide reservation's part");
	if (!bad && (mmap(at[1], PART, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) != at[1] ||
		     mmap(at[1], PART, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != at[1]))
		bad = 1;
	bad = bad || check_at(at[1], 1, 0, "a wide reservation's part given back and made memory again");
	for (size_t k = 0; k < parts && !bad; k++)
		bad = k != 1 && check_at(at[k], k, 1, "a wide reservation's part, after one was given back");
	if (bad)
		return 1;
	printf("arenatest: ok reserve-wide parts=%zu hwm=%ld MiB\n", parts, hwm_mib());
	return 0;
}

/*
 * --reserve --wide --windows N: a reservation of N + 1 windows of 4 GiB, and
 * in each of N windows four small parts made memory one after another, as
 * a runtime commits its heap here and there. More windows than the pager
 * has regions for: the windows it cannot take stay local memory, their
 * bytes as right as the paged ones', and each is offered to the pager once
 * (the caller counts the warnings).
 */
#define WINDOW (4ull << 30)
#define WINDOW_PARTS 4
#define WINDOW_PART (16ul << 10)

static uint64_t window_word(size_t win, size_t part, size_t k)
{
	return mix(((win * WINDOW_PARTS + part) << 20) + k * 8 + 1);
}

static int reserve_windows(unsigned long nwin)
{
	size_t len = (nwin + 1) * WINDOW;
	uint8_t *base = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0), *first;

	if (base == MAP_FAILED) {
		fprintf(stderr, "arenatest: reserve --windows: cannot reserve %zu bytes\n", len);
		return 1;
	}
	first = (uint8_t *)(((uintptr_t)base + WINDOW - 1) & ~(uintptr_t)(WINDOW - 1));
	for (size_t win = 0; win < nwin; win++)
		for (size_t part = 0; part < WINDOW_PARTS; part++) {
			uint8_t *at = first + win * WINDOW + part * (1ul << 20);
			uint64_t *w = (void *)at;

			if (mmap(at, WINDOW_PART, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != at) {
				perror("arenatest: reserve --windows: mmap MAP_FIXED");
				return 1;
			}
			for (size_t k = 0; k < WINDOW_PART / 8; k++)
				w[k] = window_word(win, part, k);
		}
	for (int round = 0; round < 2; round++)
		for (size_t win = 0; win < nwin; win++)
			for (size_t part = 0; part < WINDOW_PARTS; part++) {
				const uint64_t *w = (const void *)(first + win * WINDOW + part * (1ul << 20));

				for (size_t k = 0; k < WINDOW_PART / 8; k++)
					if (w[k] != window_word(win, part, k)) {
						fprintf(stderr, "arenatest: reserve --windows: window %zu part %zu word %zu is %#llx\n",
							win, part, k, (unsigned long long)w[k]);
						return 1;
					}
			}
	printf("arenatest: ok reserve-windows windows=%lu hwm=%ld MiB\n", nwin, hwm_mib());
	return 0;
}

/* --printf: a specifier of the program's own, %Y, the number in brackets. */
static int print_y(FILE *f, const struct printf_info *info, const void *const *args)
{
	(void)info;
	return fprintf(f, "[%d]", *(const int *)args[0]);
}

/*
 * --pages: V8's JavaScript heap. Each 256 KiB page is reserved on its own,
 * PROT_NONE, twice its size less a page so that an aligned page fits; the
 * reservation is trimmed to that page with munmap, and the page made
 * writable with mprotect and filled: --mib of them, more than the shim's
 * tables of reservations (128) and regions (512) hold one by one. Every page
 * is checked; every third is freed the way V8 frees one (PROT_NONE,
 * MADV_DONTNEED, munmap) and as many are reserved again, which must read
 * zeros, and filled; every page is checked again. Then one page is grown by
 * mremap (it moves) and one shrunk in place, and every page checked again.
 */
#define V8_PAGE (256ul << 10)

static uint8_t *v8_page_new(void)
{
	size_t len = 2 * V8_PAGE - 4096;
	uint8_t *r = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0), *p;

	if (r == MAP_FAILED)
		return NULL;
	p = (uint8_t *)(((uintptr_t)r + V8_PAGE - 1) & ~(uintptr_t)(V8_PAGE - 1));
	if ((p > r && munmap(r, (size_t)(p - r))) ||
	    (r + len > p + V8_PAGE && munmap(p + V8_PAGE, (size_t)(r + len - p - V8_PAGE))) ||
	    mprotect(p, V8_PAGE, PROT_READ | PROT_WRITE))
		return NULL;
	return p;
}

/* Freed the way V8 frees a page: made unreadable, its memory dropped, unmapped. */
static int v8_page_free(uint8_t *p)
{
	return mprotect(p, V8_PAGE, PROT_NONE) || madvise(p, V8_PAGE, MADV_DONTNEED) || munmap(p, V8_PAGE);
}

static void v8_fill(uint8_t *p, size_t id, unsigned salt)
{
	uint64_t *w = (void *)p;

	for (size_t k = 0; k < V8_PAGE / 8; k++)
		w[k] = mix(id * V8_PAGE + k * 8 + salt);
}

static int v8_check(const uint8_t *p, size_t id, unsigned salt, const char *what)
{
	return check_block(p, V8_PAGE, id, salt, "pages: page", what);
}

/*
 * --pages --fork: a child of a fork checks every page it got, reserves a page
 * of its own (the pool's books and lock are the parent's, copied) and fills
 * and checks it; the parent checks every page after the child is gone.
 */
static int v8_fork(uint8_t **page, const unsigned *salt, size_t n)
{
	int status = 0, bad = 0;
	pid_t pid = fork();

	if (pid < 0)
		return 1;
	if (pid == 0) {
		uint8_t *mine = v8_page_new();

		for (size_t k = 0; k < n && !bad; k++)
			bad = v8_check(page[k], k, salt[k], "in a child of a fork");
		if (!bad && mine)
			v8_fill(mine, n, 4);
		_exit(bad || !mine || v8_check(mine, n, 4, "the child's own page"));
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "arenatest: pages: the child of a fork failed (status %#x)\n", status);
		return 1;
	}
	for (size_t k = 0; k < n && !bad; k++)
		bad = v8_check(page[k], k, salt[k], "after a fork");
	if (!bad)
		printf("arenatest: pages: a child of a fork read every page and reserved its own\n");
	return bad;
}

static int with_fork;  /* --fork */
static int with_edges; /* --edges */

/* Bytes [from, to) of page id, filled with salt (0: zeros). */
static int v8_check_part(const uint8_t *p, size_t id, unsigned salt, size_t from, size_t to, const char *what)
{
	const uint64_t *w = (const void *)p;

	for (size_t k = from / 8; k < to / 8; k++)
		if (w[k] != (salt ? mix(id * V8_PAGE + k * 8 + salt) : 0)) {
			fprintf(stderr, "arenatest: pages: page %zu word %zu is %#llx (%s)\n", id, k,
				(unsigned long long)w[k], what);
			return 1;
		}
	return 0;
}

/* The largest anonymous PROT_NONE mapping: under farmem, the untouched tail of the shim's pool. */
static int largest_reserved(uintptr_t *lo, uintptr_t *hi)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];

	*lo = *hi = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long a, b, off, ino;
		char perms[8], dev[16];
		int path = 0;

		if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &a, &b, perms, &off, dev, &ino, &path) < 6 ||
		    strcmp(perms, "---p") || (path && line[path] && line[path] != '\n'))
			continue;
		if (b - a > *hi - *lo) {
			*lo = a;
			*hi = b;
		}
	}
	fclose(f);
	return 0;
}

/*
 * --pages --edges, under farmem: one munmap across the pool's top edge, its
 * last page and a page mapped right above it. The page above is unmapped;
 * the pool's page stays reserved (else the kernel could place a mapping in
 * the hole and the pool hand out the same addresses), and pages reserved
 * after read zeros and keep their bytes.
 */
static int v8_pool_edge(void)
{
	uintptr_t lo, hi;
	unsigned char vec;
	uint8_t *above, *q;
	int bad;

	if (largest_reserved(&lo, &hi) || hi - lo < (64ul << 20)) {
		fprintf(stderr, "arenatest: pages: no pool found in /proc/self/maps\n");
		return 1;
	}
	above = mmap((void *)hi, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (above == MAP_FAILED) {
		/* Something of the program's own lies right above the pool: its top edge cannot be crossed here. */
		printf("arenatest: pages: the page above the pool is taken: its edge not crossed\n");
		return 0;
	}
	above[0] = 1;
	if (munmap((void *)(hi - 4096), 2 * 4096)) {
		perror("arenatest: pages: munmap across the pool's edge");
		return 1;
	}
	bad = mincore((void *)hi, 4096, &vec) == 0 || errno != ENOMEM;
	if (bad)
		fprintf(stderr, "arenatest: pages: the page above the pool is still mapped\n");
	if (!bad && mincore((void *)(hi - 4096), 4096, &vec)) {
		fprintf(stderr, "arenatest: pages: the pool's last page was unmapped: a hole in the pool\n");
		bad = 1;
	}
	q = bad ? NULL : v8_page_new();
	bad = bad || !q || v8_check(q, 9, 0, "reserved after an unmap across the pool's edge");
	if (!bad) {
		v8_fill(q, 9, 7);
		bad = v8_check(q, 9, 7, "reserved after an unmap across the pool's edge") || v8_page_free(q);
	}
	if (!bad)
		printf("arenatest: pages: an unmap across the pool's edge: the pool kept its page, the other went\n");
	return bad;
}

/*
 * --pages --edges: what else a program may do with a page it got, each page
 * checked after: made unreadable and readable again (its bytes stay); moved
 * by mremap with MREMAP_DONTUNMAP (the bytes go along, the page left behind
 * reads zeros and takes new ones); half of it unmapped (the other half keeps
 * its bytes); part of it replaced by a file mapped over it (MAP_FIXED: the
 * file's bytes there, the page's around them), then unmapped whole and a new
 * page reserved. Pages 4 to 7. Then a page reserved with MAP_32BIT must lie
 * in the first 2 GiB.
 */
static int v8_edges(uint8_t **page, unsigned *salt, size_t n)
{
	static const size_t part = 64ul << 10;
	char path[64];
	unsigned was;
	uint8_t *q, *f;
	int fd, bad;

	if (n < 8)
		return 0;
	was = salt[5];
	bad = mprotect(page[4], V8_PAGE, PROT_NONE) || mprotect(page[4], V8_PAGE, PROT_READ) ||
	      v8_check(page[4], 4, salt[4], "made unreadable, then read-only") ||
	      mprotect(page[4], V8_PAGE, PROT_READ | PROT_WRITE);
	if (bad)
		return 1;

	q = mremap(page[5], V8_PAGE, V8_PAGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP);
	if (q == MAP_FAILED) {
		perror("arenatest: pages: mremap(MREMAP_DONTUNMAP)");
		return 1;
	}
	bad = v8_check(q, 5, salt[5], "moved by mremap(MREMAP_DONTUNMAP)") ||
	      v8_check(page[5], 5, 0, "the page mremap(MREMAP_DONTUNMAP) left");
	if (!bad) {
		v8_fill(page[5], 5, salt[5] = 4);
		bad = v8_check(q, 5, was, "moved, after the page it left was written") ||
		      v8_check(page[5], 5, salt[5], "written after mremap(MREMAP_DONTUNMAP) left it") ||
		      munmap(q, V8_PAGE);
	}
	if (bad)
		return 1;

	bad = munmap(page[6] + V8_PAGE / 2, V8_PAGE / 2) ||
	      v8_check_part(page[6], 6, salt[6], 0, V8_PAGE / 2, "its second half unmapped") ||
	      munmap(page[6], V8_PAGE / 2) || !(page[6] = v8_page_new()) ||
	      v8_check(page[6], 6, 0, "reserved after a page was unmapped in halves");
	if (bad)
		return 1;
	v8_fill(page[6], 6, salt[6] = 4);

	snprintf(path, sizeof(path), "/tmp/arenatest-file.%d", (int)getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)part)) {
		perror("arenatest: pages: a file");
		return 1;
	}
	unlink(path);
	f = mmap(NULL, part, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	bad = f == MAP_FAILED;
	if (!bad) {
		memset(f, 0x3c, part);
		bad = munmap(f, part);
	}
	f = bad ? MAP_FAILED : mmap(page[7] + part, part, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
	close(fd);
	if (f != page[7] + part) {
		perror("arenatest: pages: a file mapped over part of a page");
		return 1;
	}
	for (size_t k = 0; k < part && !bad; k++)
		bad = f[k] != 0x3c;
	if (bad)
		fprintf(stderr, "arenatest: pages: the file mapped over part of a page reads wrong\n");
	bad = bad || v8_check_part(page[7], 7, salt[7], 0, part, "before the file mapped over it") ||
	      v8_check_part(page[7], 7, salt[7], 2 * part, V8_PAGE, "after the file mapped over it");
	bad = bad || munmap(page[7], V8_PAGE) || !(page[7] = v8_page_new()) ||
	      v8_check(page[7], 7, 0, "reserved after a page with a file in it was unmapped");
	if (bad)
		return 1;
	v8_fill(page[7], 7, salt[7] = 4);

	/* MAP_32BIT asks for the first 2 GiB (JITs that jump with 32-bit offsets): a place the kernel picks there. */
	q = mmap(NULL, V8_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
	if (q == MAP_FAILED || (uintptr_t)q + V8_PAGE > (2ul << 30)) {
		fprintf(stderr, "arenatest: pages: a MAP_32BIT reservation was placed at %p\n", (void *)q);
		return 1;
	}
	bad = mprotect(q, V8_PAGE, PROT_READ | PROT_WRITE);
	if (!bad) {
		v8_fill(q, 8, 6);
		bad = v8_check(q, 8, 6, "reserved MAP_32BIT") || munmap(q, V8_PAGE);
	}
	if (bad)
		return 1;
	printf("arenatest: pages: unreadable and back, MREMAP_DONTUNMAP, half unmapped, a file over a part, "
	       "MAP_32BIT: right\n");
	return getenv("FARMEM_LOCAL") ? v8_pool_edge() : 0;
}

static int v8_pages(unsigned long mib)
{
	size_t n = (mib << 20) / V8_PAGE, freed = 0, after = 0;
	uint8_t **page = calloc(n, sizeof(*page));
	unsigned *salt = calloc(n, sizeof(*salt));
	int bad = !page || !salt;

	for (size_t k = 0; k < n && !bad; k++) {
		bad = !(page[k] = v8_page_new());
		if (!bad)
			v8_fill(page[k], k, salt[k] = 1);
		after += !bad && k && page[k] == page[k - 1] + V8_PAGE;
	}
	if (bad)
		perror("arenatest: pages: a page");
	else
		printf("arenatest: pages: %zu of %zu placed right after the one before\n", after, n - 1);
	for (size_t k = 0; k < n && !bad; k++)
		bad = v8_check(page[k], k, salt[k], "filled");
	for (size_t k = 0; k < n && !bad; k += 3, freed++)
		bad = v8_page_free(page[k]);
	for (size_t k = 0; k < n && !bad; k += 3) {
		bad = !(page[k] = v8_page_new()) || v8_check(page[k], k, 0, "reserved again");
		if (!bad)
			v8_fill(page[k], k, salt[k] = 2);
	}
	for (size_t k = 0; k < n && !bad; k++)
		bad = v8_check(page[k], k, salt[k], "after a third were freed and reserved again");
	/*
	 * An mremap of a page: grown, it moves out (its bytes with it), and
	 * the place it leaves is free for a new page; shrunk in place, its head
	 * keeps its bytes and stays writable.
	 */
	if (!bad && n >= 4) {
		uint8_t *left = page[1], *grown = mremap(page[1], V8_PAGE, 2 * V8_PAGE, MREMAP_MAYMOVE), *there;

		/* Under farmem the pool holds the place: nothing of anyone else's is put inside it. */
		if (grown != MAP_FAILED && grown != left) {
			there = mmap(left, V8_PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			printf("arenatest: pages: the place an mremap left is %s\n", there == MAP_FAILED ? "held" : "free");
			if (there != MAP_FAILED)
				munmap(there, V8_PAGE);
		}
		bad = grown == MAP_FAILED || v8_check(grown, 1, salt[1], "grown by mremap") ||
		      munmap(grown, 2 * V8_PAGE) || !(page[1] = v8_page_new()) ||
		      v8_check(page[1], 1, 0, "reserved after an mremap moved one out");
		if (!bad)
			v8_fill(page[1], 1, salt[1] = 3);
		bad = bad || mremap(page[2], V8_PAGE, V8_PAGE / 2, 0) != page[2];
		if (!bad) {
			const uint64_t *w = (const void *)page[2];

			for (size_t k = 0; k < V8_PAGE / 16 && !bad; k++)
				bad = w[k] != mix(2 * V8_PAGE + k * 8 + salt[2]);
			memset(page[2], 0x5a, V8_PAGE / 2);
			bad = bad || munmap(page[2], V8_PAGE / 2) || !(page[2] = v8_page_new());
			if (!bad)
				v8_fill(page[2], 2, salt[2] = 3);
		}
		if (bad)
			fprintf(stderr, "arenatest: pages: mremap of a page went wrong\n");
	}
	bad = bad || (with_edges && v8_edges(page, salt, n));
	for (size_t k = 0; k < n && !bad; k++)
		bad = v8_check(page[k], k, salt[k], "at the end");
	bad = bad || (with_fork && v8_fork(page, salt, n));
	free(page);
	free(salt);
	if (bad)
		return 1;
	printf("arenatest: ok pages=%zu freed=%zu hwm=%ld MiB\n", n, freed, hwm_mib());
	return 0;
}

/*
 * --many N: N pages reserved V8's way and made writable, one word of each
 * written (a large heap, little of it used yet), each word checked, then
 * every page freed V8's way. The shim's pool is 8 GiB: 32,767 such pages.
 */
static int v8_many(size_t n)
{
	uint8_t **page = calloc(n, sizeof(*page));
	size_t after = 0, k;
	int bad = !page;

	for (k = 0; k < n && !bad; k++) {
		bad = !(page[k] = v8_page_new());
		if (!bad)
			((uint64_t *)(void *)page[k])[k % (V8_PAGE / 8)] = mix(k);
		after += !bad && k && page[k] == page[k - 1] + V8_PAGE;
	}
	if (bad)
		fprintf(stderr, "arenatest: many: page %zu: %s\n", k - 1, strerror(errno));
	for (k = 0; k < n && !bad; k++) {
		const uint64_t *w = (const void *)page[k];

		bad = w[k % (V8_PAGE / 8)] != mix(k) || w[(k + 1) % (V8_PAGE / 8)];
		if (bad)
			fprintf(stderr, "arenatest: many: page %zu reads wrong\n", k);
	}
	for (k = 0; k < n && !bad; k++)
		bad = v8_page_free(page[k]);
	free(page);
	if (bad)
		return 1;
	printf("arenatest: ok many=%zu placed right after the one before %zu\n", n, after);
	return 0;
}

/*
 * --fork-race N: a thread reserves, writes and frees pages V8's way without
 * a pause while the main thread forks N times; each child reserves a page,
 * writes and reads it, and exits. A lock of the shim's that a fork caught
 * held by the other thread stays held in the child, whose first mapping
 * then waits for ever: a child still there after 20 s counts as hung.
 */
static atomic_int race_stop;
static atomic_ulong race_pages;
static int with_full; /* --full */
static int with_untouched; /* --untouched */
static uint8_t **full_page;
static size_t full_n;

static void *race_churn(void *arg)
{
	(void)arg;
	while (!atomic_load(&race_stop)) {
		uint8_t *p = v8_page_new();

		if (!p)
			return (void *)1;
		p[atomic_load(&race_pages) % V8_PAGE] = 1;
		if (v8_page_free(p))
			return (void *)1;
		atomic_fetch_add(&race_pages, 1);
	}
	return NULL;
}

/*
 * --fork-race N --full: the pool filled first (33,000 pages; it holds
 * 32,767), then the thread frees a page, takes it again and asks for one
 * more, which searches the whole full pool under its lock before the kernel
 * places it: the lock is held for much of the time the forks happen.
 */
static void *race_churn_full(void *arg)
{
	(void)arg;
	for (size_t j = 0; !atomic_load(&race_stop); j = (j + 1) % full_n) {
		uint8_t *again, *more;

		if (v8_page_free(full_page[j]) || !(again = v8_page_new()) || !(more = v8_page_new()))
			return (void *)1;
		full_page[j] = again;
		again[0] = 1;
		if (v8_page_free(more))
			return (void *)1;
		atomic_fetch_add(&race_pages, 2);
	}
	return NULL;
}

/*
 * --fork-race N --untouched: the thread reserves a page and unmaps it again,
 * never making it writable. Nothing of it is paged, so its unmap takes none
 * of the locks a fork holds (remap_lock, resv_lock): only the pool's, which a
 * fork then catches held. The churn of whole pages above waits for the fork
 * at each munmap and mprotect, and the build before the pool's lock went
 * into the fork handlers passed it.
 */
static void *race_churn_untouched(void *arg)
{
	size_t len = 2 * V8_PAGE - 4096;

	(void)arg;
	while (!atomic_load(&race_stop)) {
		void *r = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (r == MAP_FAILED || munmap(r, len))
			return (void *)1;
		atomic_fetch_add(&race_pages, 1);
	}
	return NULL;
}

static int v8_fill_pool(size_t n)
{
	full_page = calloc(n, sizeof(*full_page));
	for (full_n = 0; full_page && full_n < n; full_n++)
		if (!(full_page[full_n] = v8_page_new()))
			break;
	if (full_n < n)
		fprintf(stderr, "arenatest: fork-race: page %zu: %s\n", full_n, strerror(errno));
	return full_n < n;
}

static int v8_fork_race(unsigned long forks)
{
	unsigned long hung = 0, failed_children = 0;
	void *churn_bad = NULL;
	pthread_t th;

	if (with_full && v8_fill_pool(33000))
		return 1;
	if (pthread_create(&th, NULL, with_untouched ? race_churn_untouched : with_full ? race_churn_full : race_churn,
			   NULL))
		return 1;
	for (unsigned long k = 0; k < forks; k++) {
		int status = 0, waited = 0;
		pid_t pid = fork(), got = 0;

		if (pid < 0) {
			perror("arenatest: fork-race: fork");
			break;
		}
		if (pid == 0) {
			uint8_t *mine = v8_page_new();

			if (mine)
				v8_fill(mine, k, 5);
			_exit(!mine || v8_check(mine, k, 5, "a child's own page"));
		}
		while (waited < 20000 && (got = waitpid(pid, &status, WNOHANG)) == 0) {
			usleep(1000);
			waited++;
		}
		if (got == 0) {
			hung++;
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
		} else if (got != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
			failed_children++;
		}
	}
	atomic_store(&race_stop, 1);
	pthread_join(th, &churn_bad);
	for (size_t j = 0; j < full_n; j++)
		churn_bad = v8_page_free(full_page[j]) ? (void *)1 : churn_bad;
	free(full_page);
	printf("arenatest: fork-race: %lu forks, %lu pages churned beside them, %lu children hung, %lu failed\n",
	       forks, atomic_load(&race_pages), hung, failed_children);
	if (churn_bad || hung || failed_children)
		return 1;
	printf("arenatest: ok fork-race\n");
	return 0;
}

static int print_y_arginfo(const struct printf_info *info, size_t n, int *types, int *sizes)
{
	(void)info;
	(void)sizes;
	if (n > 0)
		types[0] = PA_INT;
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "mib", required_argument, NULL, 'm' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "reserve", no_argument, NULL, 'R' },
		{ "wide", no_argument, NULL, 'W' },
		{ "windows", required_argument, NULL, 'w' },
		{ "main", no_argument, NULL, 'M' },
		{ "pages", no_argument, NULL, 'V' },
		{ "fork", no_argument, NULL, 'F' },
		{ "edges", no_argument, NULL, 'E' },
		{ "many", required_argument, NULL, 'N' },
		{ "fork-race", required_argument, NULL, 'X' },
		{ "full", no_argument, NULL, 'U' },
		{ "untouched", no_argument, NULL, 'T' },
		{ "dlopen", required_argument, NULL, 'D' },
		{ "printf", no_argument, NULL, 'P' },
		{ 0 },
	};
	unsigned long mib = 192, windows = 0, many = 0, forks = 0;
	unsigned long lines = 0;
	long hwm;
	char line[128];
	pthread_t *th;
	int c;

	int reserved = 0, main_only = 0, printf_own = 0, wide = 0, v8 = 0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end;
		unsigned long v;

		if (c == 'R' || c == 'M' || c == 'W' || c == 'V' || c == 'F' || c == 'E' || c == 'U' || c == 'T') {
			reserved |= c == 'R';
			with_full |= c == 'U';
			with_untouched |= c == 'T';
			with_fork |= c == 'F';
			with_edges |= c == 'E';
			v8 |= c == 'V';
			wide |= c == 'W';
			main_only |= c == 'M';
			continue;
		}
		if (c == 'P') {
			setlocale(LC_ALL, "");
			register_printf_specifier('Y', print_y, print_y_arginfo);
			printf_own = 1;
			continue;
		}
		if (c == 'D') {
			if (!dlopen(optarg, RTLD_NOW | RTLD_GLOBAL)) {
				fprintf(stderr, "arenatest: %s\n", dlerror());
				return 2;
			}
			continue;
		}
		v = c == '?' ? 0 : strtoul(optarg, &end, 10);
		if (c == 'N' && v && !*end && v <= 100000) {
			many = v;
			continue;
		}
		if (!v || *end || v > 4096) {
			fprintf(stderr, "usage: arenatest [--threads 24] [--mib 192] [--rounds 3] [--reserve [--wide [--windows N]] | --pages [--fork] [--edges] | --many N | --fork-race N [--full | --untouched] | --main] [--dlopen LIB] [--printf]\n");
			return 2;
		}
		if (c == 't')
			nthreads = (unsigned)v;
		else if (c == 'm')
			mib = v;
		else if (c == 'r')
			rounds = (unsigned)v;
		else if (c == 'w')
			windows = v;
		else if (c == 'X')
			forks = v;
		else
			return 2;
	}
	if (many)
		return v8_many(many);
	if ((with_full || with_untouched) && (!forks || (with_full && with_untouched))) {
		fprintf(stderr, "arenatest: --full and --untouched go with --fork-race, one of them at a time\n");
		return 2;
	}
	if (forks)
		return v8_fork_race(forks);
	if (v8)
		return v8_pages(mib);
	if (reserved)
		return wide && windows ? reserve_windows(windows) : wide ? reserve_wide(mib) : reserve(mib);
	if (main_only)
		nthreads = 1;
	per_thread = (mib << 20) / nthreads;
	snprintf(log_path, sizeof(log_path), "/tmp/arenatest.%d", (int)getpid());
	if (io_file())
		return 1;
	lists = calloc(nthreads, sizeof(*lists));
	th = calloc(nthreads, sizeof(*th));
	if (!lists || !th || pthread_barrier_init(&barrier, NULL, nthreads))
		return 1;
	if (main_only)
		worker(0);
	for (unsigned t = 0; t < nthreads && !main_only; t++)
		if (pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t)) {
			perror("arenatest: pthread_create");
			return 1;
		}
	for (unsigned t = 0; t < nthreads && !main_only; t++)
		pthread_join(th[t], NULL);
	unlink(io_path);
	if (atomic_load(&failed))
		return 1;
	/* Before the fork: it brings every paged page home first (uffd/fork.c). */
	hwm = hwm_mib();
	if (!main_only && fork_reads_heap())
		return 1;
	rewind(log_file);
	while (fgets(line, sizeof(line), log_file))
		lines += !strncmp(line, "thread ", 7);
	fclose(log_file);
	unlink(log_path);
	if (lines != atomic_load(&lines_written)) {
		fprintf(stderr, "arenatest: the stream holds %lu lines, %lu were written\n", lines,
			atomic_load(&lines_written));
		return 1;
	}
	if (printf_own) {
		const char *own = "%Y"; /* a variable: the compiler does not know the program's specifier */

		snprintf(line, sizeof(line), own, 7);
		if (strcmp(line, "[7]")) {
			fprintf(stderr, "arenatest: the program's own printf specifier gave %s\n", line);
			return 1;
		}
	}
	if (main_only)
		snprintf(line, sizeof(line), "main");
	else
		snprintf(line, sizeof(line), "%u", nthreads);
	printf("arenatest: ok threads=%s rounds=%u blocks=%lu lines=%lu syscalls=%lu fork=%s hwm=%ld MiB\n", line,
	       rounds, atomic_load(&nodes_built), lines, atomic_load(&io_calls), main_only ? "none" : "ok", hwm);
	return 0;
}
