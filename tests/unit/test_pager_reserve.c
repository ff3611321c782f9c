// SPDX-License-Identifier: Apache-2.0
/*
 * A fault at the limit whose eviction batch finds every resident page held
 * by another thread (batches, fills and moves hold pages for microseconds to
 * milliseconds) waits for a hold to end and takes room then: the page does
 * not come in over the budget (uffd/fault.c, reserve_room). Holds that last
 * longer than its waits let the page in over the budget one page, rather
 * than stall the fault for good. The test itself takes the holds (the pages'
 * bytes in the residency map, UPDATING, as a move's), with the budget full.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"
#include "wait.h"

#define PG 4096ul
#define REGION (8ul << 20)
#define NPAGES (REGION / PG)
#define WRITTEN 800u /* pages written first: past the budget of 512, the first ones are in memd */

struct reader {
	const uint8_t *a;
	uint64_t page;
	atomic_long tid;
	atomic_int done;
	int ok;
};

static void *read_page(void *arg)
{
	struct reader *rd = arg;

	atomic_store(&rd->tid, (long)syscall(SYS_gettid));
	rd->ok = page_ok(rd->a, rd->page, 1);
	atomic_store(&rd->done, 1);
	return NULL;
}

static uint8_t *state_byte(struct fm_resmap_hdr *h, uint64_t i)
{
	return (uint8_t *)h + h->regions[0].map_offset + i;
}

/* Thread tid's state letter from /proc ('S' asleep, 'R' running), or 0. */
static char thread_state(long tid)
{
	char path[64], buf[256], *c;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	c = strrchr(buf, ')');
	return c && c[1] == ' ' ? c[2] : 0;
}

static int any_held(struct fm_resmap_hdr *h)
{
	for (uint64_t i = 0; i < NPAGES; i++)
		if (pg_is_hold(fm_pg_state(__atomic_load_n(state_byte(h, i), __ATOMIC_ACQUIRE))))
			return 1;
	return 0;
}

/* Hold every resident page of the region UPDATING; held[i] keeps its byte before. Returns how many. */
static unsigned hold_resident(struct fm_resmap_hdr *h, uint8_t *held)
{
	unsigned n = 0;

	for (uint64_t i = 0; i < NPAGES; i++) {
		uint8_t *b = state_byte(h, i), was = __atomic_load_n(b, __ATOMIC_ACQUIRE);
		unsigned s = fm_pg_state(was);

		held[i] = 0;
		if (s != FM_PG_CLEAN && s != FM_PG_DIRTY)
			continue;
		if (!pg_cas(b, &was, pg_make(FM_PG_UPDATING, was))) {
			i--; /* changed under us (nothing should run now): look again */
			continue;
		}
		held[i] = was;
		n++;
	}
	return n;
}

static void let_go(struct fm_pager *p, struct fm_resmap_hdr *h, const uint8_t *held)
{
	for (uint64_t i = 0; i < NPAGES; i++)
		if (held[i])
			fm_release(p, state_byte(h, i), pg_make(FM_PG_UPDATING, held[i]), held[i]);
}

/* ms after now, on CLOCK_REALTIME (pthread_timedjoin_np's clock). */
static struct timespec after_ms(long ms)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/*
 * The budget full and every resident page held; a reader faults page, which
 * is in memd. release_ms < 0: the holds end once the reader sleeps, and the
 * page must come in within the budget; else they end after release_ms, and
 * the reader must have its page before that, one page over the budget.
 */
static void held_at_the_limit(struct fm_pager *p, struct fm_resmap_hdr *h, const uint8_t *a, uint64_t page,
			      int release_ms, const char *what)
{
	static uint8_t held[NPAGES];
	uint64_t limit = h->stats.local_limit_pages;
	struct reader rd = { .a = a, .page = page };
	struct timespec until;
	pthread_t th;
	unsigned n;
	int joined = 0;

	/* Fresh pages until the budget is full to the page: no room without an eviction. */
	for (uint64_t i = WRITTEN; i < NPAGES && __atomic_load_n(&h->stats.resident_pages, __ATOMIC_ACQUIRE) < limit;
	     i++)
		write_page((uint8_t *)a, i, 1);
	CHECK(h->stats.resident_pages == limit);
	/* A handler thread lets the last fill go after it woke the writer. */
	for (int k = 0; k < 2000 && any_held(h); k++)
		usleep(1000);
	CHECK(fm_pg_state(__atomic_load_n(state_byte(h, page), __ATOMIC_ACQUIRE)) == FM_PG_REMOTE);
	CHECK(h->stats.peak_resident_pages <= limit);
	n = hold_resident(h, held);
	if (n != limit) {
		unsigned hist[16] = { 0 };
		for (uint64_t i = 0; i < NPAGES; i++)
			hist[fm_pg_state(__atomic_load_n(state_byte(h, i), __ATOMIC_ACQUIRE)) & 15]++;
		fprintf(stderr, "%s: held %u of %lu resident;", what, n, (unsigned long)limit);
		for (unsigned k = 0; k < 16; k++)
			if (hist[k])
				fprintf(stderr, " state %u: %u", k, hist[k]);
		fprintf(stderr, "\n");
	}
	CHECK(n == limit);

	CHECK(pthread_create(&th, NULL, read_page, &rd) == 0);
	if (release_ms < 0) {
		/* Asleep: the reader in the kernel (thread mode) or in reserve_room's wait (signal mode). */
		for (int k = 0; k < 20000 && !(atomic_load(&rd.tid) && thread_state(atomic_load(&rd.tid)) == 'S') &&
				!atomic_load(&rd.done);
		     k++)
			usleep(50);
		usleep(2000);
		if (atomic_load(&rd.done))
			fprintf(stderr, "%s: the page came in while every resident page was held\n", what);
		CHECK(!atomic_load(&rd.done));
		let_go(p, h, held);
	} else {
		until = after_ms(release_ms);
		joined = !pthread_timedjoin_np(th, NULL, &until);
		if (!joined)
			fprintf(stderr, "%s: the fault waited on holds for %d ms\n", what, release_ms);
		CHECK(joined);
		let_go(p, h, held);
	}
	until = after_ms(20000);
	if (!joined && pthread_timedjoin_np(th, NULL, &until)) {
		fprintf(stderr, "%s: the fault on page %lu was never served\n", what, (unsigned long)page);
		CHECK(0);
		_exit(1);
	}
	CHECK(rd.ok);
	if (release_ms < 0) {
		if (h->stats.peak_resident_pages > limit)
			fprintf(stderr, "%s: peak %lu pages over a budget of %lu\n", what,
				(unsigned long)h->stats.peak_resident_pages, (unsigned long)limit);
		CHECK(h->stats.peak_resident_pages <= limit);
	} else {
		CHECK(h->stats.peak_resident_pages == limit + 1);
	}
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint8_t *a;
	char what[96];

	/* No evictor thread: it would keep resident pages under the limit, and the faults take no batch. */
	p = unit_pager_at(sock, fault, "2M", (const char *const[]){ "fault", fault, "evict_threads", "0",
								  "prefetch", "0", NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	if (!a)
		goto out;
	for (uint64_t i = 0; i < WRITTEN; i++)
		write_page(a, i, 1);

	snprintf(what, sizeof(what), "fault=%s, holds let go", fault);
	held_at_the_limit(p, h, a, 0, -1, what);
	/* Holds that outlast the waits (4 of at most 10 ms): the page comes in over the budget, not never. */
	snprintf(what, sizeof(what), "fault=%s, holds kept", fault);
	held_at_the_limit(p, h, a, 1, 2000, what);

	unit_region_end(p, a, REGION, 0);
out:
	fm_pager_stop(p);
	printf("test_pager_reserve: fault=%s done\n", fault);
}

int main(void)
{
	return unit_main("test_pager_reserve", exercise);
}
