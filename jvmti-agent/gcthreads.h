/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which threads are HotSpot's GC threads, by name (/proc/self/task/TID/comm):
 * the pager books their faults as GC faults and, with gc_aware=1, evicts
 * pages only they touched first. docs/jvm.md lists the names.
 */
#ifndef FARMEM_AGENT_GCTHREADS_H
#define FARMEM_AGENT_GCTHREADS_H

#include <sys/types.h>

/*
 * Whether thread tid of this process is a GC thread: 0, FM_GC_PAUSE (the pause
 * workers, the VM thread), FM_GC_CONC (Shenandoah's workers and control
 * thread) or FM_GC_SCAN (G1's marking, refinement and service threads, which
 * write no heap); uffd/pager.h. Safe in a fault handler; cached by tid.
 */
int fm_agent_is_gc_thread(pid_t tid);

#endif
