/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A transport, one space and one channel on it, for the unit tests that
 * drive memd/client directly (no pager): what each of them would otherwise
 * set up by hand.
 */
#ifndef FARMEM_UNIT_XPORT_H
#define FARMEM_UNIT_XPORT_H

#include <stdio.h>
#include <string.h>

#include "memd_spawn.h"
#include "transport.h"

struct unit_xport {
	struct fm_xport *x;
	struct fm_chan *c;
	uint32_t space;
};

/*
 * Connect to addr with the unit secret, open a space of npages and a
 * channel; counters (may be NULL) receive several memds' counts. 0, or -1
 * after saying why, in name's words.
 */
static inline int unit_xport_open(struct unit_xport *u, const char *name, const char *addr, int pref,
				  int timeout_ms, int replicas, uint64_t npages,
				  struct fm_xport_counters *counters)
{
	struct fm_xport_cfg cfg = { .addr = addr, .secret = UNIT_MEMD_SECRET,
				    .secret_len = strlen(UNIT_MEMD_SECRET), .pref = pref,
				    .timeout_ms = timeout_ms, .replicas = replicas };
	char err[256] = "";

	memset(u, 0, sizeof(*u));
	if (fm_xport_connect(&cfg, &u->x, err, sizeof(err)) || fm_xport_space_open(u->x, npages, &u->space) ||
	    fm_chan_open(u->x, &u->c)) {
		fprintf(stderr, "%s: cannot set up: %s\n", name, err);
		return -1;
	}
	if (counters)
		fm_xport_set_counters(u->x, counters);
	return 0;
}

static inline void unit_xport_close(struct unit_xport *u)
{
	fm_chan_close(u->c);
	fm_xport_close(u->x);
}

#endif /* FARMEM_UNIT_XPORT_H */
