/* SPDX-License-Identifier: Apache-2.0 */
/* Internal to the client transports: one authenticated connection to memd. */
#ifndef FARMEM_CLIENT_CONN_H
#define FARMEM_CLIENT_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "protocol.h"
#include "transport.h"

struct fm_conn {
	int fd;
	int is_unix;
	uint32_t server_flags;
	uint64_t next_req;
	int op_timeout_ms;  /* > 0: a whole send or reply must complete within this (a trickle too) */
};

/* Connect to addr, run HELLO/AUTH (verifying memd's own proof of the secret). */
int fm_conn_open(struct fm_conn *c, const struct fm_xport_cfg *cfg, char *err, size_t errlen);
void fm_conn_close(struct fm_conn *c);

/*
 * One request/reply exchange. The request payload is the concatenation of
 * iov; the reply payload (at most rep_cap bytes) lands in rep, its length in
 * *rep_len. Returns 0 with *status set to the header status, or -errno for
 * transport failures (the connection is then unusable).
 */
struct fm_iov { const void *base; size_t len; };
int fm_conn_call(struct fm_conn *c, uint16_t op, uint32_t count,
		 const struct fm_iov *iov, unsigned niov,
		 void *rep, size_t rep_cap, size_t *rep_len, uint16_t *status,
		 int *rep_fd);
/* The same, with the reply payload scattered over rep[0..nrep). */
int fm_conn_callv(struct fm_conn *c, uint16_t op, uint32_t count,
		  const struct fm_iov *iov, unsigned niov,
		  const struct fm_iov *rep, unsigned nrep, size_t *rep_len, uint16_t *status,
		  int *rep_fd);

/*
 * The two halves of fm_conn_callv, for a client that has requests in flight
 * on several connections at once (client_multi.c): send, then receive the
 * reply to req_id. The same error rules as fm_conn_callv.
 */
int fm_conn_send(struct fm_conn *c, uint16_t op, uint32_t count,
		 const struct fm_iov *iov, unsigned niov, uint64_t *req_id);
int fm_conn_recvv(struct fm_conn *c, uint16_t op, uint64_t req_id,
		  const struct fm_iov *rep, unsigned nrep, size_t *rep_len, uint16_t *status,
		  int *rep_fd);

struct space_map {
	uint32_t id;
	uint64_t npages;
	uint8_t *data;
	struct fm_shm_meta *meta;
	size_t map_len;
	int memfd;
};

struct fm_xport {
	struct fm_xport_cfg cfg;
	char addr[256];
	uint8_t secret[256];
	int kind;                      /* enum fm_transport_kind */
	struct fm_session session;
	pthread_mutex_t lock;          /* guards ctrl and the space table */
	struct fm_conn ctrl;
	atomic_int dead;               /* memd vanished: no more writes */
	/* shm: mapped spaces, and this session's unused quota grant */
	struct space_map spaces[64];
	unsigned nspaces;
	atomic_int_fast64_t grant_avail;   /* granted and not yet used */
	uint64_t granted_total;            /* memd's figure for the session; under lock */
	atomic_uint_fast64_t full_until_ns; /* memd refused quota: until then, do not ask */
	struct fm_multi *multi;        /* many memd servers: client_multi.c does everything */
	struct fm_rdma *rdma;          /* rdma://: client_rdma.c (regions, QP address) */
};

struct fm_chan {
	struct fm_xport *x;
	struct fm_conn conn;           /* stream only */
	uint8_t *buf;                  /* stream: reply staging, FM_MAX_BATCH pages */
	struct fm_page_status st[FM_MAX_BATCH];
	struct fm_mchan *mchan;        /* a channel of a many-memd transport (client_multi.c) */
	struct fm_rchan *rchan;        /* rdma: this thread's RC QP (client_rdma.c) */
};

/* client_multi.c: a transport over several memd servers (an address with commas). */
int fm_multi_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen);
void fm_multi_close(struct fm_xport *x);
int fm_multi_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id);
int fm_multi_space_close(struct fm_xport *x, uint32_t space_id);
int fm_multi_stats(struct fm_xport *x, struct fm_stats *st);
int fm_multi_chan_open(struct fm_xport *x, struct fm_chan **out);
void fm_multi_chan_close(struct fm_chan *c);
int fm_multi_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		  const void **src);
int fm_multi_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		   const void *const *data, uint32_t *status);
int fm_multi_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);
int fm_multi_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		  const uint64_t *dpages, unsigned n, uint32_t *status);

int fm_errmsg(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
