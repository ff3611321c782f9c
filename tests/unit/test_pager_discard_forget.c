// SPDX-License-Identifier: Apache-2.0
/*
 * A discard kills the remote copies of the pages it makes the program's
 * again, in batches: the forget goes to memd after the page's byte changed.
 * A page left resident and dirty (a discard with no pressure) that the
 * evictor wrote to memd in between had its new copy dropped by that forget:
 * REMOTE in the books, nothing in memd, and the program's next touch
 * stopped it (once in 30 attach runs of GcChurn: "page ... is in memd but
 * cannot be read back"). Here the test widens that window on purpose: it
 * holds the page after the dirty one, so the discard waits there with the
 * forget not yet sent, and makes the evictor take every page it can. Then
 * the discard ends and the page must still read back.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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
#define DIRTY_PAGE 10ul

struct discarder {
	struct fm_pager *p;
	uint8_t *a;
	atomic_int done;
};

static void *discard_two(void *arg)
{
	struct discarder *d = arg;

	fm_pager_discard_reused(d->p, d->a + DIRTY_PAGE * PG, 2 * PG);
	atomic_store(&d->done, 1);
	return NULL;
}

/* Settled: a handler thread lets the page go only after the faulting thread is woken. */
static int dirty_with_copy(struct fm_pager *p, struct fm_resmap_hdr *h)
{
	uint8_t b = fm_settle(p, unit_state_byte(h, DIRTY_PAGE));

	return fm_pg_state(b) == FM_PG_DIRTY && (b & FM_PGF_HAS_REMOTE);
}

/* Write every page from `from` on: the budget is a fraction of the region, so the evictor runs. */
static void churn(uint8_t *a, uint64_t from, uint32_t v)
{
	for (uint64_t i = from; i < NPAGES; i++)
		write_page(a, i, v);
}

static void exercise(const char *sock, const char *fault)
{
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	struct discarder d = { 0 };
	char what[64];
	uint8_t *a, *b, was, held;
	pthread_t th;
	volatile uint8_t sink;

	snprintf(what, sizeof(what), "fault=%s", fault);
	p = unit_pager_at(sock, fault, "2M", (const char *const[]){ "fault", fault, NULL });
	if (!p)
		return;
	h = fm_pager_map(p);
	a = unit_region(p, REGION, 0);
	if (!a)
		goto out;

	/*
	 * Page 10 goes to memd, comes back and is written again: dirty, with an
	 * old copy in memd. The evictor may take it again before the test looks
	 * (it runs on after the churn): then again.
	 */
	for (int tries = 0; tries < 20; tries++) {
		write_page(a, DIRTY_PAGE, 7);
		churn(a, 100, 1);
		usleep(50 * 1000);
		if (fm_pg_state(fm_settle(p, unit_state_byte(h, DIRTY_PAGE))) != FM_PG_REMOTE)
			continue;
		sink = a[DIRTY_PAGE * PG];
		(void)sink;
		write_page(a, DIRTY_PAGE, 8);
		if (dirty_with_copy(p, h))
			break;
	}
	CHECK(dirty_with_copy(p, h));

	/* The discard of pages 10 and 11 stops at 11, which the test holds. */
	b = unit_state_byte(h, DIRTY_PAGE + 1);
	was = fm_settle(p, b);
	held = pg_make(FM_PG_UPDATING, was);
	if (fm_pg_state(was) == FM_PG_REMOTE || fm_pg_state(was) == FM_PG_UNTOUCHED)
		held = pg_make(FM_PG_FILLING, was);
	if (!pg_cas(b, &was, held)) {
		fprintf(stderr, "%s: page 11 changed under the test\n", what);
		CHECK(0);
		goto unreg;
	}
	d.p = p;
	d.a = a;
	CHECK(pthread_create(&th, NULL, discard_two, &d) == 0);
	usleep(100 * 1000);
	CHECK(!atomic_load(&d.done));

	/* Everything the evictor can take goes, page 10 too if the discard let it go already. */
	churn(a, 100, 2);
	churn(a, 100, 3);

	fm_release(p, b, held, was);
	CHECK(pthread_join(th, NULL) == 0);

	/* Its bytes are dead to the program, but the page must come back: from memd, or as it was. */
	sink = a[DIRTY_PAGE * PG];
	write_page(a, DIRTY_PAGE, 9);
	churn(a, 100, 4);
	CHECK(page_ok(a, DIRTY_PAGE, 9));
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
unreg:
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	munmap(a, REGION);
out:
	fm_pager_stop(p);
	printf("test_pager_discard_forget: fault=%s done\n", fault);
}

int main(void)
{
	return unit_main("test_pager_discard_forget", exercise);
}
