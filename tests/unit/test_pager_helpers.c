// SPDX-License-Identifier: Apache-2.0
/*
 * A fault handler's helpers (fill_threads, uffd/monitor.c), against a real
 * memd, with ASan and UBSan. The faults a thread sleeps for (a region
 * registered FM_REG_KERNEL_WAITS with fault=signal, every region with
 * fault=thread) are served by one handler, and by the others only while
 * faults queue behind it.
 *
 * Eight threads rewrite random pages of their own slices of a region four
 * times the budget, so that faults queue; the helpers must have served some,
 * and every page must hold its last write. One thread alone never has more
 * than one fault waiting: there the helpers must serve none. With
 * fill_threads=1 there is no helper thread at all. Run from the repository
 * root.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define LEN (32ul << 20)
#define NPAGES (LEN / PG)
#define THREADS 8
#define WRITES 3000 /* per thread */

struct writer {
	uint8_t *a;
	uint64_t first, n; /* its slice of pages */
	uint32_t *ver;
	unsigned seed;
};

static void *rewrite(void *arg)
{
	struct writer *w = arg;

	for (unsigned k = 0; k < WRITES; k++) {
		uint64_t i = w->first + (uint64_t)rand_r(&w->seed) % w->n;
		write_page(w->a, i, ++w->ver[i]);
	}
	return NULL;
}

/* Every page of a written, rewritten by threads threads; returns the pages that do not hold their last write. */
static uint64_t rewrite_all(uint8_t *a, uint32_t *ver, unsigned threads)
{
	struct writer w[THREADS];
	pthread_t t[THREADS];
	uint64_t bad = 0;

	for (uint64_t i = 0; i < NPAGES; i++)
		write_page(a, i, ver[i] = 1);
	for (unsigned k = 0; k < threads; k++) {
		w[k] = (struct writer){ .a = a, .first = k * (NPAGES / threads), .n = NPAGES / threads, .ver = ver,
					.seed = 11 + k };
		CHECK(pthread_create(&t[k], NULL, rewrite, &w[k]) == 0);
	}
	for (unsigned k = 0; k < threads; k++)
		pthread_join(t[k], NULL);
	for (uint64_t i = 0; i < NPAGES; i++)
		bad += !page_ok(a, i, ver[i]);
	return bad;
}

static void one_case(const char *sock, const char *fault, const char *fill_threads, unsigned threads)
{
	int signal_mode = strcmp(fault, "signal") == 0;
	struct fm_pager *p;
	struct fm_resmap_hdr *h;
	uint32_t *ver = calloc(NPAGES, sizeof(*ver));
	char err[256];
	uint8_t *a = NULL;
	uint64_t bad, helped;

	p = unit_pager_at(sock, fault, "8M",
			  (const char *const[]){ "fault", fault, "fill_threads", fill_threads, "transport", "stream", NULL });
	if (!p || !ver)
		goto out;
	h = fm_pager_map(p);
	if (signal_mode)
		CHECK(fm_pager_open_kernel_waits(p, err, sizeof(err)) == 0);
	a = unit_region(p, LEN, signal_mode ? FM_REG_KERNEL_WAITS : 0);
	if (!a)
		goto out;
	/* fault=signal: farmem-fault1 serves, farmem-fault2 helps; fault=thread: 0 and 1. */
	CHECK(!!unit_thread_started(signal_mode ? "farmem-fault2" : "farmem-fault1", 2000) ==
	      (strcmp(fill_threads, "1") != 0));
	bad = rewrite_all(a, ver, threads);
	helped = h->stats.helped_faults;
	CHECK(bad == 0);
	/* Three writes in four land on a page that is not resident (a region four times the budget). */
	CHECK(h->stats.faults >= (uint64_t)threads * WRITES / 2);
	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	if (threads == 1 || strcmp(fill_threads, "1") == 0)
		CHECK(helped == 0);
	else
		CHECK(helped > 0);
	printf("test_pager_helpers: fault=%s fill_threads=%s, %u threads: %llu faults, %llu by helpers\n", fault,
	       fill_threads, threads, (unsigned long long)h->stats.faults, (unsigned long long)helped);
	CHECK(fm_pager_unregister(p, a, LEN) == 0);
	munmap(a, LEN);
out:
	free(ver);
	if (p)
		fm_pager_stop(p);
}

static void run(const char *sock, const char *fault)
{
	one_case(sock, fault, "2", THREADS);
	one_case(sock, fault, "2", 1);
	one_case(sock, fault, "1", THREADS);
}

int main(void)
{
	return unit_main("test_pager_helpers", run);
}
