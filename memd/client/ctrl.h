/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control connection of one memd session: the session itself, space
 * management, statistics, and the quota grant that the one-sided
 * transports (shm, rdma) draw on for pages new to memd. The stream, shm and
 * rdma transports each hold one; the stream transport's channels join its
 * session.
 *
 * Every call ends by the transport's timeout (fm_ctrl.timeout_ms). A
 * failure of the control connection marks memd lost (fm_ctrl.dead), said
 * once.
 *
 * Locking: lock is held only around an exchange on the connection, over
 * this structure's own memory, never while paged memory is touched: a
 * SIGBUS handler never finds its own thread holding it (transport.h).
 */
#ifndef FARMEM_CLIENT_CTRL_H
#define FARMEM_CLIENT_CTRL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "conn.h"
#include "ops.h"
#include "protocol.h"

struct fm_ctrl {
	struct fm_peer peer;
	struct fm_conn conn;
	struct fm_session session;
	int timeout_ms;
	int quiet;                          /* a child of several memds: its parent reports losses */
	pthread_mutex_t lock;               /* one exchange at a time on conn */
	atomic_int dead;                    /* memd vanished: no more writes */
	/* The quota grant: pages memd agreed to store for this session and that are not used yet. */
	atomic_int_fast64_t grant_avail;
	uint64_t granted_total;             /* memd's figure for the session; under lock */
	atomic_uint_fast64_t full_until_ns; /* memd granted nothing: until then, do not ask */
	struct fm_copy_ent copy_ents[FM_MAX_BATCH]; /* fm_ctrl_copy's request; under lock */
};

/* Resolve addr, connect, authenticate, open a session. 0, or -errno with a sentence in err. */
int fm_ctrl_open(struct fm_ctrl *c, const char *addr, const void *secret, size_t secret_len,
		 int timeout_ms, char *err, size_t errlen);
void fm_ctrl_close(struct fm_ctrl *c);

/* One exchange on the control connection. */
int fm_ctrl_call(struct fm_ctrl *c, uint16_t op, const void *req, size_t reqlen, void *rep,
		 size_t cap, size_t *len, uint16_t *st, int *rep_fd);
/* COPY over the control connection (the rdma transport's; fm_chan_copy's statuses and returns). */
int fm_ctrl_copy(struct fm_ctrl *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status);

/* SPACE_OPEN (-ENOSPC when memd has no room), SPACE_CLOSE, STATS. */
int fm_ctrl_space_open(struct fm_ctrl *c, uint64_t npages, uint32_t *space_id);
int fm_ctrl_space_close(struct fm_ctrl *c, uint32_t space_id);
int fm_ctrl_stats(struct fm_ctrl *c, struct fm_stats *st);

/*
 * Connect conn to the same memd and join this session (a stream channel).
 * Signal-safe: the address was resolved by fm_ctrl_open. err may be NULL.
 */
int fm_ctrl_join(struct fm_ctrl *c, struct fm_conn *conn, uint64_t deadline, char *err, size_t errlen);

/* 1 while memd's control connection is up (a poll of it, no exchange). */
int fm_ctrl_alive(struct fm_ctrl *c);
/* Hang up: memd drops the session once it sees it; every later call fails. Signal-safe. */
void fm_ctrl_hangup(struct fm_ctrl *c);

/*
 * Take one page of the grant for a page new to memd: 1, or 0 when memd
 * grants no more (the page stays with the pager). Asks memd for another
 * chunk when the local share runs out.
 */
int fm_ctrl_take_grant(struct fm_ctrl *c);
/* Pages that left memd (a discard) or were not used after all. */
void fm_ctrl_return_grant(struct fm_ctrl *c, uint64_t pages);
/*
 * memd allocates the memory of a mapped space's slots in the ranges, charged
 * to its memory cgroup (protocol.h, FM_HELLO_F_ALLOC); each slot holds a page
 * of the grant. 0; -ENOSPC when memd refuses; -EPROTO; else the connection
 * failed (memd lost).
 */
int fm_ctrl_shm_alloc(struct fm_ctrl *c, uint32_t space_id, const struct fm_range *r, unsigned n);
/*
 * RDMA_REG: memd registers chunks[0..n) of an RDMA_MAP'd space; out[i] has
 * each one's status and rkeys (protocol.h). 0; -ENOSPC without asking while
 * memd refused one a moment ago; -EPROTO; else memd is lost.
 */
int fm_ctrl_rdma_reg(struct fm_ctrl *c, uint32_t space_id, const uint64_t *chunks, unsigned n,
		     struct fm_rdma_reg_ent *out);
/*
 * RDMA_UNREG: memd deregisters chunks[0..n) and frees them (a memd that sets
 * FM_HELLO_F_RDMA_UNREG). 0; -EPROTO (memd refused: they stay registered);
 * else memd is lost.
 */
int fm_ctrl_rdma_unreg(struct fm_ctrl *c, uint32_t space_id, const uint64_t *chunks, unsigned n);

/*
 * The start of a transport over one memd session (stream, shm, rdma): what
 * their tables share is here, once.
 */
struct fm_session_xport {
	struct fm_xport base;
	struct fm_ctrl ctrl;
};

/*
 * Allocate size zeroed bytes (a struct that begins with struct
 * fm_session_xport), open the control connection to ctrl_addr with cfg's
 * secret and timeout, and fill in the common part. 0, or -errno with a
 * sentence in err.
 */
int fm_session_xport_new(size_t size, const struct fm_xport_cfg *cfg, const char *ctrl_addr, int kind,
			 const struct fm_xport_ops *ops, struct fm_session_xport **out, char *err,
			 size_t errlen);
void fm_session_xport_free(struct fm_session_xport *sx);

/*
 * SPACE_OPEN, then map(x, id, npages): the transport's own view of the
 * space (shm's memfd, rdma's region); a space that cannot be mapped is
 * closed again.
 */
int fm_session_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id,
				int (*map)(struct fm_xport *x, uint32_t id, uint64_t npages));
/* The table entries that are the control connection's alone. */
int fm_session_xport_space_close(struct fm_xport *x, uint32_t space_id);
int fm_session_xport_stats(struct fm_xport *x, struct fm_stats *st);
int fm_session_xport_alive(struct fm_xport *x);
void fm_session_xport_hangup(struct fm_xport *x);

#endif /* FARMEM_CLIENT_CTRL_H */
