/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pager's side of memd: one interface over three transports.
 *
 *  - stream: the two-sided request/response protocol over TCP or a Unix
 *    socket (docs/protocol.md); every read and write is a round trip.
 *  - shm:    one-sided access to a same-host memd's store, a memfd passed over
 *    the Unix socket after authentication; the socket carries only space
 *    management and quota.
 *  - rdma:   one-sided verbs into registered spaces (client_rdma.c); space
 *    management, quota and COPY go over a TCP control connection.
 *
 * The fault path calls fm_chan_read/fm_chan_write and never learns which
 * one it has. A channel belongs to one thread; the transport itself (space
 * management) is thread-safe.
 */
#ifndef FARMEM_TRANSPORT_H
#define FARMEM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

struct fm_xport;
struct fm_chan;

enum fm_xport_pref { FM_PREF_AUTO = 0, FM_PREF_STREAM = 1, FM_PREF_SHM = 2 };

struct fm_xport_cfg {
	const char *addr;      /* "unix:/path", "tcp:HOST:PORT" or "HOST:PORT" */
	const void *secret;    /* shared secret (the token's bytes) */
	size_t secret_len;
	int pref;              /* enum fm_xport_pref */
	int timeout_ms;        /* connect and per-request timeout; 0 = 10 s (1 s with several memds) */
	int replicas;          /* several memds ("A,B,C"): copies of every page; 0 = 1 */
};

/*
 * Connect, authenticate, create a session. On failure returns -errno and
 * writes a sentence for the user into err.
 */
int fm_xport_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out,
		     char *err, size_t errlen);
void fm_xport_close(struct fm_xport *x);
/* enum fm_transport_kind (resmap.h) */
int fm_xport_kind(const struct fm_xport *x);
const char *fm_xport_addr(const struct fm_xport *x);

int fm_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id);
int fm_xport_space_close(struct fm_xport *x, uint32_t space_id);
int fm_xport_stats(struct fm_xport *x, struct fm_stats *st);

/*
 * Several memd servers: an address with commas ("A,B,C") connects one
 * stream transport per server behind this same interface (client_multi.c).
 * Pages are placed by rendezvous hashing, written to cfg->replicas of them
 * and read from the first replica that answers. Its failover counters go to
 * st (the residency map's stats) once this is called; a no-op otherwise.
 */
struct fm_pager_stats;
void fm_xport_set_stats(struct fm_xport *x, struct fm_pager_stats *st);

/* A channel for the calling thread. */
int fm_chan_open(struct fm_xport *x, struct fm_chan **out);
void fm_chan_close(struct fm_chan *c);

/*
 * Read n (<= FM_MAX_BATCH) pages. On success src[i] points at page i's
 * bytes, checksum verified, valid until the next call on this channel.
 * Returns 0, -EIO (checksum), -ENOENT (memd has no such page) or -errno.
 */
int fm_chan_read(struct fm_chan *c, uint32_t space, const uint64_t *pages,
		 unsigned n, const void **src);

/*
 * Write n (<= FM_MAX_BATCH) pages and return only when memd holds their
 * bytes. status[i] is FM_OK or FM_E_FULL (memd refused it: keep it local).
 * Returns 0 when every status is valid, or -errno when none is.
 */
int fm_chan_write(struct fm_chan *c, uint32_t space, const uint64_t *pages,
		  unsigned n, const void *const *data, uint32_t *status);

/*
 * Copy n (<= FM_MAX_BATCH) pages inside memd, in order: page spages[i] of
 * space src to page dpages[i] of space dst, stored bytes and checksum,
 * without bringing them here. stream and rdma: one COPY request (rdma on the
 * control connection); shm: slot to slot in the shared store; several
 * memds: COPY to every live server holding the source. status[i] is FM_OK
 * (memd holds the source's bytes at the destination) or, with the
 * destination unchanged, FM_E_ABSENT (no such source page), FM_E_FULL (no
 * room), FM_E_RANGE or FM_E_INTERNAL (no server holding the source copied
 * it): the caller moves those pages another way. Returns 0 when every
 * status is valid, -EOPNOTSUPP when memd cannot copy (one that predates
 * COPY: read and write instead), or -errno when none is.
 */
int fm_chan_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status);

/* Tell memd that these pages are dead: their next read is FM_E_ABSENT. */
int fm_chan_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r,
		    unsigned n);

#endif /* FARMEM_TRANSPORT_H */
