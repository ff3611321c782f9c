// SPDX-License-Identifier: Apache-2.0
/* GC threads by name (gcthreads.h). */
#include "gcthreads.h"

#include "fm_util.h"
#include "pager.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/*
 * HotSpot 17 names its threads (/proc/self/task/TID/comm, cut at 15 bytes):
 * "GC Thread#N" (G1 and Parallel workers), "G1 Conc#N", "G1 Main Marker",
 * "G1 Refine#N", "G1 Service", "VM Thread" (runs the pauses' serial parts).
 * Older JDKs said "ParGC Thread#N" and "G1 Young RemSet".
 */
static const char *const pause_names[] = { "GC Thread#", "VM Thread", "ParGC Thread#", "GC Thread" };
/*
 * Shenandoah's workers ("Shenandoah GC Threads#N", cut to "Shenandoah GC T") do
 * its pauses' short work and its marking and evacuation alike; most of it
 * runs beside the program, so they count as concurrent. Its control thread
 * is "Shenandoah Control Thread".
 */
static const char *const conc_names[] = { "Shenandoah GC T", "Shenandoah Cont" };
/* G1's concurrent threads mark, refine and sample: they read the heap and write only their own tables. */
static const char *const scan_names[] = { "G1 Conc#", "G1 Main Marker", "G1 Refine#", "G1 Service", "G1 Young RemSet" };

#define TID_SLOTS 4096 /* power of two */
static _Atomic uint64_t tid_cache[TID_SLOTS]; /* tid << 2 | kind; 0 = empty */

static int gc_kind(const char *n)
{
	for (size_t i = 0; i < sizeof(pause_names) / sizeof(pause_names[0]); i++)
		if (!strncmp(n, pause_names[i], strlen(pause_names[i])))
			return FM_GC_PAUSE;
	for (size_t i = 0; i < sizeof(conc_names) / sizeof(conc_names[0]); i++)
		if (!strncmp(n, conc_names[i], strlen(conc_names[i])))
			return FM_GC_CONC;
	for (size_t i = 0; i < sizeof(scan_names) / sizeof(scan_names[0]); i++)
		if (!strncmp(n, scan_names[i], strlen(scan_names[i])))
			return FM_GC_SCAN;
	return 0;
}

/*
 * Called by the pager's fault handlers with the faulting thread's id. A tid
 * is looked up once; tids are reused only after a thread exits, and HotSpot
 * keeps its GC threads for the JVM's life, so a stale entry can only
 * misattribute faults of an application thread that reused a GC tid.
 */
int fm_agent_is_gc_thread(pid_t tid)
{
	unsigned h = ((unsigned)tid * 2654435761u) & (TID_SLOTS - 1);
	char path[64], name[32] = "";
	int gc;

	for (unsigned k = 0; k < 16; k++) {
		uint64_t e = atomic_load_explicit(&tid_cache[(h + k) & (TID_SLOTS - 1)], memory_order_relaxed);
		if (!e)
			break;
		if ((pid_t)(e >> 2) == tid)
			return (int)(e & 3);
	}
	/* comm is read under the task lock only: safe while the thread sits in a fault. */
	snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)tid);
	if (fm_read_file(path, name, sizeof(name)) < 0)
		return 0;
	gc = gc_kind(name);
	for (unsigned k = 0; k < 16; k++) {
		uint64_t zero = 0;
		if (atomic_compare_exchange_strong(&tid_cache[(h + k) & (TID_SLOTS - 1)], &zero,
						   ((uint64_t)tid << 2) | (uint64_t)gc))
			break;
	}
	return gc;
}
