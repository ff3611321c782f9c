/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The agent's options: `-agentpath:libfarmem_agent.so=key=value,key=value,...`
 * (async-profiler's grammar), or the same list through jcmd JVMTI.agent_load.
 * The keys are the knobs of uffd/knobs.h whose scope has FM_KS_OPT: the pager's
 * (into cfg) and the agent's own (the fields below). A knob that has a
 * FARMEM_* variable is read from it first; the option wins. An unknown key or
 * a bad value is always an error: a typo never runs a JVM its user thinks is
 * paged. No JVMTI here, so a unit test can drive it.
 */
#ifndef FARMEM_AGENT_OPTIONS_H
#define FARMEM_AGENT_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "pager.h"

struct fm_agent_opts {
	struct fm_pager_cfg cfg;
	unsigned local_pct;       /* of the heap, converted to bytes once its size is known */
	int onerror;              /* onerror: 0 exit, 1 continue */
	unsigned discard;         /* discard the collector's free space after each GC pause */
	unsigned heap_sizing;     /* the young generation held to a quarter of the budget (heap.h) */
	unsigned gc_moves;        /* a pause's memmove (and G1's memcpy of arrays) of remote heap pages done in memd (gcmove.h) */
	unsigned object_reads;    /* a program thread's fault on an array brings the array's other remote pages (klass.h) */
	unsigned gc_referents;    /* a full GC's fault through a reference brings the next references' objects (klass.h) */
	int detach;               /* detach: given (set to 1 by the parser, not by knobs.h) */
	char msgfile[256];
	char secret_file[256];
};

/* Parse OPTIONS (NULL: none) into o. Returns 0, or -EINVAL with err naming the key. */
int fm_agent_parse_options(const char *options, struct fm_agent_opts *o, char *err, size_t errlen);

/*
 * The budget in bytes once the heap's size (-Xmx) is known: a percentage is of
 * the heap. A budget larger than the heap: -E2BIG with err (nothing would ever
 * be remote). heap_bytes 0: unknown, left as it is.
 */
int fm_agent_settle_budget(struct fm_agent_opts *o, uint64_t heap_bytes, char *err, size_t errlen);

#endif
