// SPDX-License-Identifier: Apache-2.0
/*
 * A fault on a page another thread holds waits for the hold to end, however
 * it ends. Not every FILLING hold ends in an install that wakes a thread
 * asleep in the kernel: a stale write-protect fault on a page that left, a
 * compaction's remote page and a move's source go back unfilled. A handler
 * thread that took the hold for a fill on its way and let the fault go
 * left the thread asleep for good (test_pager_inproc hung once in a few
 * loaded runs). Here the test itself takes the hold (the page's byte in the
 * residency map), faults the page from another thread, and lets the hold go
 * with nothing installed: the fault must be served all the same.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"
#include "wait.h"

#define PG 4096ul
#define REGION (16ul << 20)
#define NPAGES (REGION / PG)

struct reader {
	const uint8_t *a;
	uint64_t page;
	uint32_t ver;
	atomic_int done;
	int ok;
};

static void *read_page(void *arg)
{
	struct reader *rd = arg;

	rd->ok = page_ok(rd->a, rd->page, rd->ver);
	atomic_store(&rd->done, 1);
	return NULL;
}

/*
 * Hold page i FILLING, fault it from another thread, let the hold go as it
 * was, with nothing installed: the reader must finish and read ver's bytes.
 */
static void held_then_let_go(struct fm_pager *p, struct fm_resmap_hdr *h, const uint8_t *a, uint64_t i,
			     uint32_t ver, const char *what)
{
	struct reader rd = { .a = a, .page = i, .ver = ver };
	uint8_t *b = unit_state_byte(h, i), was = __atomic_load_n(b, __ATOMIC_ACQUIRE), held;
	struct timespec until;
	pthread_t th;

	held = pg_make(FM_PG_FILLING, was);
	if (!pg_cas(b, &was, held)) {
		fprintf(stderr, "%s: page %lu changed under the test\n", what, (unsigned long)i);
		CHECK(0);
		return;
	}
	CHECK(pthread_create(&th, NULL, read_page, &rd) == 0);
	usleep(200 * 1000);
	/* The hold is ours: the reader cannot have its page yet. */
	CHECK(!atomic_load(&rd.done));
	fm_release(p, b, held, was);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 20;
	if (pthread_timedjoin_np(th, NULL, &until)) {
		fprintf(stderr, "%s: the fault on page %lu was never served after the hold ended\n", what,
			(unsigned long)i);
		CHECK(0);
		/* The reader sleeps in the kernel for good: end the test here, not at the alarm. */
		_exit(1);
	}
	CHECK(rd.ok);
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p = NULL;
	struct fm_resmap_hdr *h;
	char addr[128], what[64];
	uint8_t *a;
	volatile uint8_t sink = 0;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	snprintf(what, sizeof(what), "fault=%s", fault);
	p = unit_pager(what, addr, "2M", (const char *const[]){ "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	if (!a)
		goto out;

	/* A page never touched, held and let go untouched (a stale write-protect fault's hold). */
	snprintf(what, sizeof(what), "fault=%s, untouched", fault);
	CHECK(fm_pg_state(__atomic_load_n(unit_state_byte(h, 3000), __ATOMIC_ACQUIRE)) == FM_PG_UNTOUCHED);
	held_then_let_go(p, h, a, 3000, 0, what);

	/* A page only memd holds, held and let go remote (a compaction's hold on a remote page). */
	write_page(a, 10, 7);
	for (uint64_t i = 100; i < NPAGES && fm_pg_state(__atomic_load_n(unit_state_byte(h, 10), __ATOMIC_ACQUIRE)) !=
						     FM_PG_REMOTE; i++)
		sink += a[i * PG];
	(void)sink;
	snprintf(what, sizeof(what), "fault=%s, remote", fault);
	CHECK(fm_pg_state(__atomic_load_n(unit_state_byte(h, 10), __ATOMIC_ACQUIRE)) == FM_PG_REMOTE);
	held_then_let_go(p, h, a, 10, 7, what);

	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	munmap(a, REGION);
out:
	fm_pager_stop(p);
	printf("test_fault_holds: fault=%s done\n", fault);
}

int main(void)
{
	return unit_main("test_fault_holds", exercise);
}
