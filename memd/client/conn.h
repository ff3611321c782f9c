/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One authenticated connection to memd (docs/protocol.md), the frames on it,
 * and the address it goes to. Used by the control connection (ctrl.h) and
 * the stream transport's channels.
 *
 * Every call that waits takes an absolute deadline (fm_now_ns() clock) and
 * returns -ETIMEDOUT when it passes, however the peer behaves: silent,
 * trickling, or stopped with its connection open. The socket is
 * non-blocking; waiting is poll(2) for the time left.
 *
 * One request is in flight per connection: send, then receive its reply,
 * then the next. A reply is read straight into the caller's buffers.
 *
 * Signal-safe (transport.h): fm_conn_open, _send, _recv, _call and _close
 * allocate nothing and take no lock. fm_peer_resolve is not: it runs at
 * connect time, so that a connection made again later needs no resolver.
 */
#ifndef FARMEM_CLIENT_CONN_H
#define FARMEM_CLIENT_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "protocol.h"

#define FM_PEER_ADDRS 4

/* Where memd is and how to prove we may talk to it. */
struct fm_peer {
	char addr[256];                        /* as the user wrote it, for messages */
	int is_unix;
	unsigned naddr;
	struct sockaddr_storage sa[FM_PEER_ADDRS];
	socklen_t salen[FM_PEER_ADDRS];
	uint8_t secret[256];
	size_t secret_len;
};

/* "unix:/path", "tcp:HOST:PORT" or "HOST:PORT". 0, or -errno with a sentence in err. */
int fm_peer_resolve(struct fm_peer *p, const char *addr, const void *secret, size_t secret_len,
		    char *err, size_t errlen);

struct fm_iov { const void *base; size_t len; };

/* Requests carry at most this many pieces: header fields, entries, one per run of pages. */
#define FM_CONN_MAX_IOV (FM_MAX_BATCH + 4)

struct fm_conn {
	int fd;                 /* -1: not connected */
	int is_unix;
	uint32_t server_flags;  /* FM_HELLO_F_* */
	uint64_t next_req;
	uint64_t pending;       /* req_id of the request in flight, 0 = none */
	/*
	 * A reply is polled for (non-blocking reads) up to spin_ns before the
	 * caller sleeps in poll(): on a machine whose idle CPUs halt, waking a
	 * sleeper is an IPI (in a VM, an exit to the host) on each side of every
	 * round trip. Only while replies come that fast: after a poll that ran
	 * out, the next FM_CONN_SPIN_SKIP replies are slept on at once (spin_skip
	 * counts them down), so a slower memd (a network away) costs a poll now
	 * and then, not every time.
	 */
	uint32_t spin_ns;
	uint32_t spin_skip;
	struct iovec sendv[1 + FM_CONN_MAX_IOV]; /* a request's pieces: here, not on a signal handler's stack */
};
#define FM_CONN_SPIN_SKIP 16
/* Replies land in at most this many buffers. */
#define FM_CONN_MAX_REP 4

/*
 * Connect and run HELLO/AUTH, checking memd's own proof of the secret.
 * err may be NULL (nothing is formatted then). 0 or -errno.
 */
int fm_conn_open(struct fm_conn *c, const struct fm_peer *p, uint64_t deadline, char *err, size_t errlen);
void fm_conn_close(struct fm_conn *c);

/*
 * Send one request: the concatenation of iov[0..niov) as payload. On a
 * transport error the connection is closed and -errno returned.
 */
int fm_conn_send(struct fm_conn *c, uint16_t op, uint32_t count, const struct fm_iov *iov,
		 unsigned niov, uint64_t deadline);
/*
 * Receive the reply to the request in flight, its payload (at most the sum
 * of rep[].len bytes) scattered over rep[0..nrep). Returns 0 with *status
 * the header status (an FM_OP_ERROR reply: its status, *rep_len 0), or
 * -errno for a transport failure or a malformed reply, after which the
 * connection is closed. rep_fd: an fd memd attached (SHM_MAP), or -1.
 */
int fm_conn_recv(struct fm_conn *c, const struct fm_iov *rep, unsigned nrep, size_t *rep_len,
		 uint16_t *status, int *rep_fd, uint64_t deadline);
/* Send, then receive into one buffer. */
int fm_conn_call(struct fm_conn *c, uint16_t op, uint32_t count, const struct fm_iov *iov,
		 unsigned niov, void *rep, size_t rep_cap, size_t *rep_len, uint16_t *status,
		 int *rep_fd, uint64_t deadline);

/*
 * One COPY request (fm_chan_copy's statuses and returns): a stream
 * channel's connection, or the rdma transport's control connection.
 */
int fm_conn_copy_send(struct fm_conn *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		      const uint64_t *dpages, unsigned n, struct fm_copy_ent *ents, uint64_t deadline);
int fm_conn_copy_recv(struct fm_conn *c, unsigned n, uint32_t *status, uint64_t deadline);

/* One EDIT request (fm_chan_edit): the GET bytes land in get (get_len of them expected). */
int fm_conn_edit_send(struct fm_conn *c, const struct fm_space_ref *ref, const struct fm_edit_ent *e, unsigned n,
		      const void *put, size_t put_len, uint64_t deadline);
int fm_conn_edit_recv(struct fm_conn *c, void *get, size_t get_len, uint64_t deadline);

#endif /* FARMEM_CLIENT_CONN_H */
