/* SPDX-License-Identifier: Apache-2.0 */
/*
 * farmem-memd internals: the page store (server_store.c) and the per
 * connection protocol engine (server_conn.c). Neither knows about epoll:
 * memd.c owns sockets, threads and the event loop, and the unit test in
 * tests/unit/test_protocol.c drives a connection on plain byte buffers.
 */
#ifndef FARMEM_MEMD_SERVER_H
#define FARMEM_MEMD_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "protocol.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "memd maps the wire structs directly; port the byte swapping first"
#endif

/* Limits of this memd (not of the protocol): docs/protocol.md, "Limits". */
#define MEMD_MAX_SPACES_PER_SESSION 1024u
/* Address space memd may map for spaces; x86-64 user space is 128 TiB. */
#define MEMD_VA_BUDGET              (64ull << 40)
/* Stop reading a connection's requests while this much reply data waits. */
#define MEMD_TX_HIGH                (2u << 20)
/* A connection must finish HELLO/AUTH within this time. */
#define MEMD_AUTH_TIMEOUT_NS        (10ull * 1000000000ull)
#define MEMD_META_PER_PAGE          (FM_PAGE_SIZE / sizeof(struct fm_shm_meta))

/* ---- store ------------------------------------------------------------ */

struct memd_session;
struct memd_space;

struct memd_store {
	pthread_mutex_t lock;          /* sessions, spaces lists, accounting */
	uint64_t capacity;             /* pages */
	uint64_t session_quota;        /* pages per session */
	uint64_t used;                 /* stream-accounted pages + grants */
	uint64_t va_used;              /* bytes mapped for spaces */
	uint64_t va_budget;
	int numa_node;                 /* bind every space's pages here; -1: no policy */
	int idmap_fd;                  /* --idmap: /dev/swapva, spaces mapped from it; -1: memfds */
	struct memd_session *sessions;
	uint64_t nsessions;
	uint64_t nspaces;
	/* Counters, updated with atomics. */
	uint64_t connections, reads, writes, discards, errors, full_rejects;
	/* The RDMA listener's registrations, set when it starts (rdma.c); NULL without one. */
	const struct memd_rdma_ops *rdma;
};

/*
 * What the store asks of an RDMA listener: it calls these through the
 * store, so the store needs no RDMA code and rdma.c alone knows verbs.
 */
struct memd_rdma_ops {
	/*
	 * Register [addr, addr+len) in the protection domain in *pd_slot (a
	 * session's; allocated on first use).
	 */
	int (*reg)(void **pd_slot, void *addr, size_t len, void **mr, uint32_t *rkey);
	/* Deregister (unpin): QPs that still use its rkey fail, on their own. */
	void (*dereg)(void *mr);
	/* The session ended: its QPs and regions are gone; free its domain. */
	void (*pd_free)(void *pd);
};

int memd_store_init(struct memd_store *st, uint64_t capacity_pages,
		    uint64_t session_quota_pages);
/*
 * --idmap: back every space with identity-mapped memory (VA == PA) from
 * /dev/swapva (kmod-swapva). Such memory is allocated whole when the space
 * opens, so the capacity bounds the spaces' total size, not their present
 * pages; and it cannot be passed as a file, so SHM_MAP and RDMA_MAP answer
 * FM_E_NOSHM. Returns 0, or -errno with msg set to a sentence for the user.
 */
int memd_store_idmap(struct memd_store *st, char *msg, size_t msglen);
/* Frees every session; no connection may still use the store. */
void memd_store_fini(struct memd_store *st);
void memd_store_stats(struct memd_store *st, struct fm_stats *out);

/* A new session with one connection attached; -errno on failure. */
int memd_session_new(struct memd_store *st, struct memd_session **out,
		     uint64_t *id, uint8_t key[FM_SESSION_KEY_LEN]);
/* Attach a connection to an existing session: -EACCES on a bad id or key. */
int memd_session_join(struct memd_store *st, uint64_t id,
		      const uint8_t key[FM_SESSION_KEY_LEN], struct memd_session **out);
/* Detach a connection; the last one frees the session, its spaces and grant. */
void memd_session_put(struct memd_store *st, struct memd_session *s);

/* -ERANGE (npages), -EMFILE/-ENOMEM (memd cannot hold another space). */
int memd_space_open(struct memd_store *st, struct memd_session *s, uint64_t npages,
		    uint32_t *id);
/* -ENOENT if the session has no such space. */
int memd_space_close(struct memd_store *st, struct memd_session *s, uint32_t id);
/* A counted reference to one of the session's spaces, or NULL. */
struct memd_space *memd_space_get(struct memd_store *st, struct memd_session *s,
				  uint32_t id);
void memd_space_put(struct memd_store *st, struct memd_space *sp);

/*
 * Page operations on a referenced space. Pages, entries and statuses are the
 * raw (possibly unaligned) wire arrays; n <= FM_MAX_BATCH for READ and WRITE.
 * They return -ENOENT when the space was closed meanwhile.
 */
int memd_space_read(struct memd_store *st, struct memd_space *sp,
		    const uint8_t *pages, uint32_t n,
		    struct fm_page_status *status, uint8_t *data);
int memd_space_write(struct memd_store *st, struct memd_space *sp,
		     const struct fm_write_ent *ents, const uint8_t *data,
		     uint32_t n, uint8_t *status);
/*
 * COPY: entries in order, each src's stored page (bytes and crc) to dst's
 * slot; src and dst may be the same space. Per entry status: FM_OK,
 * FM_E_RANGE, FM_E_ABSENT (source not present: destination unchanged) or
 * FM_E_FULL (a destination page new to an unmapped space found no room:
 * unchanged). n <= FM_MAX_BATCH.
 */
int memd_space_copy(struct memd_store *st, struct memd_space *src, struct memd_space *dst,
		    const struct fm_copy_ent *ents, uint32_t n, uint8_t *status);
/*
 * EDIT (protocol.h): entries in order on one space's pages, all or nothing.
 * put holds the PUT entries' bytes in order (put_len of them, which must be
 * exactly their sum), get receives the GET entries' bytes (get_cap of room).
 * Returns the GET bytes written, or a negative protocol status: -FM_E_RANGE
 * (a bad entry), -FM_E_TOOBIG (more than FM_MAX_EDIT_PAGES pages, or the
 * GETs overflow get_cap), -FM_E_ABSENT (a page read that memd does not
 * hold), -FM_E_CRC (a touched page's bytes fail its checksum), -FM_E_FULL
 * (no room for new pages), -FM_E_NOSPACE (closed meanwhile). n <= FM_MAX_EDITS.
 */
long memd_space_edit(struct memd_store *st, struct memd_space *sp, const struct fm_edit_ent *ents, uint32_t n,
		     const uint8_t *put, size_t put_len, uint8_t *get, size_t get_cap);
/* -ERANGE (nothing discarded) if any range leaves the space. */
int memd_space_discard(struct memd_store *st, struct memd_space *sp,
		       const struct fm_range *r, uint32_t n);
/*
 * RDMA_MAP: cut the space's mapping into chunks, registered later one by one
 * (RDMA_REG; once: later calls give the same layout), and switch it to grant
 * accounting. -EOPNOTSUPP without an RDMA listener, -EPROTONOSUPPORT for an
 * identity-mapped space (--idmap), -EBUSY for a space shared by SHM_MAP.
 * SPACE_CLOSE and the session's end deregister its chunks.
 */
int memd_space_rdma(struct memd_store *st, struct memd_space *sp, struct fm_rdma_map_rep *rep);
/*
 * RDMA_REG: register chunks[0..n) of an RDMA_MAP'd space, each taking its
 * pages from capacity and quota; out[i] says how each went (protocol.h).
 * -EPERM: not RDMA_MAP'd; -ENOENT: closed.
 */
int memd_space_rdma_reg(struct memd_store *st, struct memd_space *sp, const uint64_t *chunks, uint32_t n,
			struct fm_rdma_reg_ent *out);
/*
 * RDMA_UNREG: deregister chunks[0..n) and free their memory, back to
 * capacity and quota (a chunk not registered is left as it is). -ERANGE
 * (nothing freed) if a chunk is out of range; -EPERM, -ENOENT as RDMA_REG.
 */
int memd_space_rdma_unreg(struct memd_store *st, struct memd_space *sp, const uint64_t *chunks, uint32_t n);
/* Switch the space to grant accounting; *fd is a dup the caller owns. */
int memd_space_shm(struct memd_store *st, struct memd_space *sp,
		   struct fm_shm_map_rep *rep, int *fd);
/*
 * Allocate the memory of a mapped space's slots in the ranges (and of their
 * meta), charged to memd (protocol.h, FM_HELLO_F_ALLOC). -ERANGE: a range
 * leaves the space; -EPERM: not mapped by SHM_MAP; -ENOSPC: the session's
 * spaces would hold more than its grant; else -errno from fallocate.
 */
int memd_space_shm_alloc(struct memd_store *st, struct memd_space *sp, const struct fm_range *r, uint32_t n);
/* Change the session's grant by delta pages; returns the grant after. */
uint64_t memd_quota(struct memd_store *st, struct memd_session *s, int64_t delta);

/* ---- connection ------------------------------------------------------- */

enum memd_conn_state {
	MEMD_C_HELLO = 0,  /* expects HELLO */
	MEMD_C_AUTH,       /* expects AUTH */
	MEMD_C_READY,      /* authenticated */
};

/* What memd_frame_check decided about a header. */
enum memd_verdict {
	MEMD_V_OK = 0,     /* read the payload and run the op */
	MEMD_V_ERR,        /* answer FM_OP_ERROR, skip the payload, go on */
	MEMD_V_CLOSE,      /* answer FM_OP_ERROR and close the connection */
};

struct memd_hdr {
	uint32_t magic;
	uint16_t op;
	uint16_t status;
	uint64_t req_id;
	uint32_t count;
	uint32_t len;
};

/*
 * Validate a request header against the connection state, before its payload
 * is read. Returns an enum memd_verdict; on ERR/CLOSE *status and msg (a
 * sentence for the error reply) are set.
 */
int memd_frame_check(const uint8_t raw[sizeof(struct fm_hdr)], int state,
		     struct memd_hdr *h, uint16_t *status, char *msg, size_t msglen);

struct memd_txbuf {
	struct memd_txbuf *next;
	size_t off;        /* bytes already sent */
	size_t len;        /* bytes queued */
	size_t cap;
	int fd;            /* passed with the first byte of data, or -1 */
	uint8_t data[];
};

struct memd_conn {
	struct memd_store *st;
	const uint8_t *secret;
	size_t secret_len;
	int fd;                    /* -1 in unit tests */
	bool is_unix;              /* can pass fds: SHM_MAP allowed */
	uint32_t client_flags;     /* its HELLO's FM_HELLO_F_* */
	int state;                 /* enum memd_conn_state */
	bool closing;              /* stop reading; close when tx is empty */
	bool eof;                  /* the peer shut down its side */
	uint64_t born_ns;
	uint8_t snonce[FM_NONCE_LEN];
	uint8_t cnonce[FM_NONCE_LEN];
	struct memd_session *sess;

	uint8_t *rx;               /* received bytes [rx_off, rx_len) unparsed */
	size_t rx_off, rx_len, rx_cap;

	struct memd_txbuf *tx_head, *tx_tail;
	size_t tx_bytes;           /* queued and unsent */

	/* Owned by the event loop. */
	void *owner;
	struct memd_conn *prev, *next;
	uint32_t events;
};

void memd_conn_init(struct memd_conn *c, struct memd_store *st, const void *secret,
		    size_t secret_len, int fd, bool is_unix);
/* Detach the session, free buffers and queued fds, close c->fd if >= 0. */
void memd_conn_fini(struct memd_conn *c);

/* Append received bytes (unit tests; the event loop reads into c->rx). */
int memd_conn_feed(struct memd_conn *c, const void *buf, size_t len);
/* Run every complete frame in rx while tx is below MEMD_TX_HIGH. 0 or -ENOMEM. */
int memd_conn_process(struct memd_conn *c);
/* Read from c->fd and process; 0 or -errno (the connection is dead). */
int memd_conn_input(struct memd_conn *c);
/* Send queued replies until EAGAIN; 0 or -errno (the connection is dead). */
int memd_conn_output(struct memd_conn *c);
/* Input (if readable), output, and what became runnable; 0 or -errno. */
int memd_conn_service(struct memd_conn *c, bool readable);
bool memd_conn_wants_read(const struct memd_conn *c);
bool memd_conn_wants_write(const struct memd_conn *c);
/* Nothing left to do: close it. */
bool memd_conn_done(const struct memd_conn *c);

/* server_rdma.c: the --rdma listener and region registration. */
int memd_rdma_start(const char *spec, struct memd_store *st);
/* Tears down every QP (each holds a session reference) before the store goes. */
void memd_rdma_stop(void);
/* The protection domain slot of a session (server_rdma.c). */
void **memd_session_rdma_pd(struct memd_session *s);

#endif /* FARMEM_MEMD_SERVER_H */
