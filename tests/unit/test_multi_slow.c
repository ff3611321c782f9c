// SPDX-License-Identifier: Apache-2.0
/*
 * Several memds, one of them slow: stopped and resumed over and over, so it
 * times out again and again but answers in between. With one replica every
 * page it holds exists nowhere else, so giving it up for its timeouts would
 * end a program at its next read of one of them (memd/client/multi.c,
 * "Health"). It must be kept while it answers: every read comes back with
 * the bytes written. Stopped for good, it is still given up once it has
 * answered nothing for down_after_ms, and a read of one of its pages then
 * fails within the call's bound instead of waiting for ever.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "fm_util.h"
#include "unit.h"
#include "unit_xport.h"

#define NPAGES     64
#define TIMEOUT_MS 100
#define FLAP_S     3     /* within down_after_ms (3000 ms at this timeout) */
#define STOP_MS    150   /* stopped: every call to it times out */
#define RUN_MS     30    /* running: it answers what is queued */

/* Counted by the transport's threads: a plain load could be folded across the loops. */
#define COUNTER(f) __atomic_load_n(&ctr.f, __ATOMIC_RELAXED)

static uint8_t pages[NPAGES * 4096] __attribute__((aligned(4096)));
static uint8_t check[NPAGES * 4096] __attribute__((aligned(4096)));
static pid_t slow_pid;
static atomic_int flapping = 1;

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static void *flap(void *arg)
{
	uint64_t end = fm_now_ns() + (uint64_t)FLAP_S * 1000000000;

	(void)arg;
	while (fm_now_ns() < end) {
		unit_stop_memd(slow_pid);
		sleep_ms(STOP_MS);
		kill(slow_pid, SIGCONT);
		sleep_ms(RUN_MS);
	}
	atomic_store(&flapping, 0);
	return NULL;
}

/* Reads page p back and compares it with version 1; the call's status. */
static int read_back(struct fm_chan *c, uint32_t space, uint64_t p, int *wrong)
{
	const void *src;
	int rc = fm_chan_read(c, space, &p, 1, &src);

	if (!rc) {
		memcpy(check + p * 4096, src, 4096);
		if (!page_ok(check, p, 1))
			(*wrong)++;
	}
	return rc;
}

int main(void)
{
	struct unit_two_memds md;
	struct unit_xport u;
	static struct fm_xport_counters ctr;
	uint32_t status[NPAGES];
	uint64_t idx[NPAGES], t0;
	const void *data[NPAGES];
	unsigned reads = 0, failed_reads = 0, failed_after = 0;
	int wrong = 0;
	pthread_t t;
	pid_t b;

	fm_log_level = FM_LOG_ERROR;  /* the timeouts below are meant */
	if (unit_start_two_memds(&md, "slow", "16M", "16M"))
		return 1;
	slow_pid = md.pid[0];
	b = md.pid[1];
	if (unit_xport_open(&u, "test_multi_slow", md.two, FM_PREF_AUTO, TIMEOUT_MS, 1, NPAGES, &ctr))
		return 1;
	for (unsigned p = 0; p < NPAGES; p++) {
		write_page(pages, p, 1);
		idx[p] = p;
		data[p] = pages + (size_t)p * 4096;
	}
	CHECK(fm_chan_write(u.c, u.space, idx, NPAGES, data, status) == 0);
	for (unsigned p = 0; p < NPAGES; p++)
		CHECK(status[p] == FM_OK);

	/* Slow: every page read again and again while its server stops and resumes. */
	if (pthread_create(&t, NULL, flap, NULL))
		return 1;
	while (atomic_load(&flapping))
		for (unsigned p = 0; p < NPAGES && atomic_load(&flapping); p++, reads++)
			if (read_back(u.c, u.space, p, &wrong))
				failed_reads++;
	pthread_join(t, NULL);
	/* Enough timeouts that the old rule (STRIKES within down_after_ms) would have given it up. */
	CHECK(COUNTER(timeouts) >= 12);
	CHECK(COUNTER(servers_lost) == 0);
	CHECK(failed_reads == 0);
	CHECK(wrong == 0);
	for (unsigned p = 0; p < NPAGES; p++)
		CHECK(read_back(u.c, u.space, p, &wrong) == 0);
	CHECK(wrong == 0);

	/* Stopped for good: given up after down_after_ms; its pages fail, the others still read. */
	CHECK(unit_stop_memd(slow_pid) == 0);
	t0 = fm_now_ns();
	for (unsigned p = 0; p < NPAGES; p++) {
		int rc = read_back(u.c, u.space, p, &wrong);
		if (rc) {
			CHECK(rc == -EHOSTDOWN || rc == -ETIMEDOUT);
			failed_after++;
		}
	}
	CHECK(failed_after > 0 && failed_after < NPAGES);
	CHECK(wrong == 0);
	/* down_after_ms (3 s) and one call's timeouts, on a loaded machine. */
	CHECK(fm_now_ns() - t0 < 10ull * 1000000000);
	CHECK(COUNTER(servers_lost) == 1);

	kill(slow_pid, SIGCONT);
	unit_xport_close(&u);
	kill(slow_pid, SIGKILL);
	kill(b, SIGKILL);
	waitpid(slow_pid, NULL, 0);
	waitpid(b, NULL, 0);
	unit_memd_files_remove(md.sock[0]);
	unit_memd_files_remove(md.sock[1]);
	if (failures) {
		fprintf(stderr, "test_multi_slow: %d checks failed (%u of %u reads failed while slow, %d wrong pages)\n",
			failures, failed_reads, reads, wrong);
		return 1;
	}
	printf("test_multi_slow: ok (%u reads while its server flapped, %llu timeouts, none failed; "
	       "stopped for good: %u of %d pages lost, given up)\n",
	       reads, (unsigned long long)COUNTER(timeouts), failed_after, NPAGES);
	return 0;
}
