// SPDX-License-Identifier: Apache-2.0
/*
 * Two memds with two replicas, one of them full: every page written has one
 * copy (a degraded write), and the background's re-replication cannot place
 * the second. It must wait between attempts (memd/client/multi.c, bg_main):
 * it used to try again at once, and held a CPU for as long as the server
 * stayed full (0.79 s of CPU in 2 s with nothing else to do). Every page
 * still reads back right.
 */
#include <sys/resource.h>
#include <time.h>

#include "fm_util.h"
#include "unit.h"
#include "unit_xport.h"

#define NPAGES 256
#define IDLE_S 2

static uint8_t pages[NPAGES * 4096] __attribute__((aligned(4096)));
static uint8_t check[4096] __attribute__((aligned(4096)));
static struct fm_xport_counters ctr;

static double cpu_seconds(void)
{
	struct rusage u;

	getrusage(RUSAGE_SELF, &u);
	return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int main(void)
{
	struct unit_two_memds md;
	struct unit_xport u;
	uint32_t status[64];
	uint64_t idx[64];
	const void *data[64];
	struct timespec idle = { IDLE_S, 0 };
	double cpu;
	int wrong = 0, refused = 0;

	fm_log_level = FM_LOG_ERROR;
	/* Room for 64 pages on the second: the rest of the 256 get one copy. */
	if (unit_start_two_memds(&md, "full", "16M", "256K"))
		return 1;
	if (unit_xport_open(&u, "test_multi_full", md.two, FM_PREF_AUTO, 500, 2, NPAGES, &ctr))
		return 1;
	for (uint64_t p = 0; p < NPAGES; p++)
		write_page(pages, p, 1);
	for (unsigned r = 0; r < NPAGES / 64; r++) {
		for (unsigned k = 0; k < 64; k++) {
			idx[k] = r * 64 + k;
			data[k] = pages + idx[k] * 4096;
		}
		CHECK(fm_chan_write(u.c, u.space, idx, 64, data, status) == 0);
		for (unsigned k = 0; k < 64; k++)
			refused += status[k] != FM_OK;
	}
	CHECK(refused == 0);
	CHECK(__atomic_load_n(&ctr.degraded_writes, __ATOMIC_RELAXED) > 0);

	cpu = cpu_seconds();
	nanosleep(&idle, NULL);
	cpu = cpu_seconds() - cpu;
	/* The background's attempts in 2 s: a handful of scans of 256 pages, not a busy loop. */
	CHECK(cpu < 0.2);

	for (uint64_t p = 0; p < NPAGES; p++) {
		const void *src;
		if (fm_chan_read(u.c, u.space, &p, 1, &src)) {
			wrong++;
			continue;
		}
		memcpy(check, src, 4096);
		for (unsigned k = 0; k < 4096 / 8; k++)
			if (((const uint64_t *)check)[k] != page_word(p, 1, k)) {
				wrong++;
				break;
			}
	}
	CHECK(wrong == 0);

	unit_xport_close(&u);
	for (int i = 0; i < 2; i++) {
		kill(md.pid[i], SIGKILL);
		waitpid(md.pid[i], NULL, 0);
		unit_memd_files_remove(md.sock[i]);
	}
	if (failures) {
		fprintf(stderr, "test_multi_full: %d checks failed (%d pages refused, %.3f s of CPU while idle, "
			"%d wrong pages)\n", failures, refused, cpu, wrong);
		return 1;
	}
	printf("test_multi_full: ok (%llu degraded writes; %.3f s of CPU in %d s idle; every page right)\n",
	       (unsigned long long)__atomic_load_n(&ctr.degraded_writes, __ATOMIC_RELAXED), cpu, IDLE_S);
	return 0;
}
