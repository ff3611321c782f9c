// SPDX-License-Identifier: Apache-2.0
/*
 * Prefetch over shared-memory pages that are in the file though the pager's
 * books say otherwise (written into the file by another mapping or write(2),
 * as fm_shmem_minor expects). UFFDIO_COPY meets such a page with EEXIST, or
 * with a short copy and EAGAIN when it is not the first of a run. Before the
 * fix the pager died on the EAGAIN, booked the file's bytes as a CLEAN copy
 * (a clean eviction then threw them away), and booked the pages after the
 * EEXIST as installed when they were not (their next fault mapped zeros over
 * memd's bytes). Real pager, real memd, real userfaultfd. Run from the
 * repository root after make.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define NPAGES 4096ul
#define REGION (NPAGES * PG)


static struct fm_resmap_hdr *h;
static uint8_t *a;
static int fd = -1;

static unsigned state(uint64_t i)
{
	return fm_pg_state(((const volatile uint8_t *)h)[h->regions[0].map_offset + i]);
}

static uint64_t word(uint64_t page, uint32_t tag, unsigned k)
{
	uint64_t x = (page << 20) ^ ((uint64_t)tag << 48) ^ k;
	x *= 0x9e3779b97f4a7c15ull;
	return x ^ (x >> 29);
}

static void fill(uint64_t *w, uint64_t page, uint32_t tag)
{
	for (unsigned k = 0; k < PG / 8; k++)
		w[k] = word(page, tag, k);
}

static int holds(uint64_t page, uint32_t tag)
{
	const volatile uint64_t *w = (const volatile uint64_t *)(a + page * PG);
	for (unsigned k = 0; k < PG / 8; k++)
		if (w[k] != word(page, tag, k))
			return 0;
	return 1;
}

static int zeros(uint64_t page)
{
	const volatile uint64_t *w = (const volatile uint64_t *)(a + page * PG);
	for (unsigned k = 0; k < PG / 8; k++)
		if (w[k])
			return 0;
	return 1;
}

/* Put bytes into the file behind the pager's back: the books do not change. */
static void write_behind(uint64_t page, uint32_t tag)
{
	static uint64_t buf[PG / 8];
	fill(buf, page, tag);
	CHECK(pwrite(fd, buf, PG, (off_t)(page * PG)) == (ssize_t)PG);
}

/* Three reads with stride 1 from one thread: the third fault prefetches the next pages. */
static void stream_to(uint64_t first)
{
	for (uint64_t i = first; i < first + 3; i++)
		(void)*(volatile uint8_t *)(a + i * PG);
}

/* Wait until no page of [lo, hi) is in flight (the prefetch runs after the fault is answered). */
static void settle(uint64_t lo, uint64_t hi)
{
	for (int t = 0; t < 2000; t++) {
		int busy = 0;
		for (uint64_t i = lo; i < hi; i++)
			busy |= state(i) == FM_PG_FILLING || state(i) == FM_PG_UPDATING;
		if (!busy)
			return;
		usleep(1000);
	}
}

/* Write pages from `from` on until page `watch` is no longer resident (the clock hand passed it). */
static void push_out(uint64_t watch, uint64_t from)
{
	static uint64_t buf[PG / 8];
	for (int round = 0; round < 8 && fm_pg_is_resident((uint8_t)state(watch)); round++)
		for (uint64_t i = from; i < NPAGES; i++) {
			fill(buf, i, 7);
			memcpy(a + i * PG, buf, PG);
		}
	CHECK(!fm_pg_is_resident((uint8_t)state(watch)));
}

int main(void)
{
	struct fm_pager *p = NULL;
	char addr[128], sock[64], path[] = "/dev/shm/farmem-unit-pf-XXXXXX";
	pid_t memd;
	int st;

	snprintf(sock, sizeof(sock), "/tmp/farmem-unit-shmpf-%d.sock", getpid());
	memd = unit_start_memd(sock, "256M");
	if (memd < 0)
		return 1;
	snprintf(addr, sizeof(addr), "unix:%s", sock);
	p = unit_pager("prefetch 8", addr, "4M", (const char *const[]){ "prefetch", "8", NULL });
	if (!p)
		return 1;
	h = fm_pager_map(p);
	fd = mkstemp(path);
	CHECK(fd >= 0 && unlink(path) == 0 && ftruncate(fd, (off_t)REGION) == 0);
	a = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(a != MAP_FAILED);
	if (a == MAP_FAILED || failures)
		return 1;
	CHECK(fm_pager_register(p, a, REGION, FM_REG_SHMEM) == 0);

	/*
	 * A zero run whose first page is in the file: the copy fails with
	 * EEXIST. The file's bytes are the program's; they must survive an
	 * eviction.
	 */
	write_behind(13, 1);
	CHECK(state(13) == FM_PG_UNTOUCHED);
	stream_to(10);
	settle(10, 24);
	CHECK(holds(13, 1));
	push_out(13, 100);
	CHECK(holds(13, 1));

	/* A zero run with a page in the file in its middle: a short copy, EAGAIN. */
	write_behind(35, 2);
	stream_to(30);
	settle(30, 44);
	CHECK(holds(35, 2));
	for (uint64_t i = 33; i < 41; i++)
		CHECK(i == 35 || zeros(i));

	/*
	 * A remote run whose first page is in the file: the pages after it
	 * must come from memd, not be booked as installed and then refilled
	 * with zeros.
	 */
	{
		static uint64_t buf[PG / 8];
		for (uint64_t i = 50; i < 64; i++) {
			fill(buf, i, 3);
			memcpy(a + i * PG, buf, PG);
		}
		push_out(50, 100);
		for (uint64_t i = 50; i < 64; i++)
			if (state(i) != FM_PG_REMOTE)
				fprintf(stderr, "note: page %llu not remote (state %u)\n", (unsigned long long)i, state(i));
		write_behind(53, 4);
		stream_to(50);
		settle(50, 64);
		for (uint64_t i = 54; i < 61; i++)
			if (!holds(i, 3)) {
				fprintf(stderr, "page %llu lost memd's bytes (state %u)\n", (unsigned long long)i, state(i));
				failures++;
			}
	}

	CHECK(h->stats.crc_errors == 0 && h->stats.transport_errors == 0);
	CHECK(fm_pager_unregister(p, a, REGION) == 0);
	munmap(a, REGION);
	close(fd);
	fm_pager_stop(p);
	kill(memd, SIGTERM);
	waitpid(memd, &st, 0);
	if (failures) {
		fprintf(stderr, "test_pager_shmem_prefetch: %d checks failed\n", failures);
		return 1;
	}
	printf("test_pager_shmem_prefetch: ok\n");
	return 0;
}
