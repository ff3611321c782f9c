/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside the client: the table of operations every transport fills in, the
 * part of a transport and of a channel that the table's users see, and the
 * transports' constructors. transport.h's functions are thin dispatchers
 * over the table (xport.c); the transport of several memds (multi.c) uses
 * its children through the same table, never their insides.
 *
 * The deadline is part of the table's contract: every operation returns
 * within x->timeout_ms of its start (-ETIMEDOUT), start/finish by the
 * deadline the caller gives. The data operations (read, write, copy,
 * discard, start, finish, hangup) keep transport.h's signal-safety rules.
 */
#ifndef FARMEM_CLIENT_OPS_H
#define FARMEM_CLIENT_OPS_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include "protocol.h"
#include "transport.h"

/* One data request, for the split operations (start, then finish). */
struct fm_req {
	uint16_t op;                    /* FM_OP_READ, FM_OP_WRITE, FM_OP_COPY, FM_OP_DISCARD */
	uint32_t space;                 /* COPY: the source space */
	uint32_t dst;                   /* COPY: the destination space */
	unsigned n;                     /* pages; DISCARD: ranges */
	const uint64_t *pages;          /* READ, WRITE; COPY: the source pages */
	const uint64_t *dpages;         /* COPY: the destination pages */
	const void *const *data;        /* WRITE */
	const uint32_t *crc;            /* WRITE: the pages' checksums, or NULL to compute them */
	const struct fm_range *ranges;  /* DISCARD */
	/* results */
	const void **src;               /* READ: as fm_chan_read */
	/*
	 * WRITE, COPY: as fm_chan_write/fm_chan_copy. READ: NULL (the batch
	 * fails as a whole, as fm_chan_read), or per page FM_OK, FM_E_ABSENT or
	 * FM_E_CRC, src set for the FM_OK ones, and finish returns 0.
	 */
	uint32_t *status;
};

struct fm_xport_ops {
	int (*space_open)(struct fm_xport *x, uint64_t npages, uint32_t *space_id);
	int (*space_close)(struct fm_xport *x, uint32_t space_id);
	int (*stats)(struct fm_xport *x, struct fm_stats *st);
	int (*alive)(struct fm_xport *x);       /* 1 while memd's control connection is up */
	void (*hangup)(struct fm_xport *x);     /* give memd up: every later call fails */
	void (*close)(struct fm_xport *x);
	int (*chan_open)(struct fm_xport *x, struct fm_chan **out);
	void (*chan_close)(struct fm_chan *c);
	int (*read)(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		    const void **src);
	int (*write)(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		     const void *const *data, uint32_t *status);
	int (*copy)(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		    const uint64_t *dpages, unsigned n, uint32_t *status);
	int (*discard)(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);
	/* transport.h's fm_chan_forget and fm_chan_release: NULL where discard frees memd's memory itself. */
	int (*forget)(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);
	int (*release)(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n);
	uint64_t (*kept_pages)(struct fm_xport *x);
	void (*pause)(struct fm_xport *x, int begin);  /* NULL where reads are checked elsewhere */
	/* transport.h's fm_chan_edit: NULL where memd cannot be asked (rdma, several memds). */
	int (*edit)(struct fm_chan *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
		    const void *put, size_t put_len, size_t get_len, const void **get);
	/* In place (transport.h): NULL where memd's store is not mapped here. */
	int (*page_open)(struct fm_chan *c, uint32_t space, uint64_t page, unsigned flags, uint8_t **bytes);
	int (*page_seal)(struct fm_chan *c, uint32_t space, uint64_t page);
	/*
	 * Split operations, so that a caller with requests for several
	 * transports sends them all before it waits for any reply (several
	 * memds: the R copies of a write travel at once). NULL where a
	 * transport cannot have a request in flight. One request in flight per
	 * channel; rq and what it points to stay valid until finish returns.
	 * A failed start needs no finish.
	 */
	int (*start)(struct fm_chan *c, const struct fm_req *rq, uint64_t deadline);
	int (*finish)(struct fm_chan *c, const struct fm_req *rq, uint64_t deadline);
};

/* The part of every transport that the table's users see; a transport's own struct begins with it. */
struct fm_xport {
	const struct fm_xport_ops *ops;
	int kind;                    /* enum fm_xport_kind */
	int timeout_ms;              /* every operation's deadline */
	unsigned spin_us;            /* fm_xport_cfg's: stream channels' fm_conn.spin_ns, rdma's CQ polling */
	int can_copy;                /* memd knows COPY */
	int quiet;                   /* a child of several memds: the parent speaks for it */
	char addr[256];
	struct fm_xport_counters own;
	struct fm_xport_counters *_Atomic counters;  /* own, or the pager's (fm_xport_set_counters) */
};

/* The part of every channel that the table's users see. */
struct fm_chan {
	struct fm_xport *x;
};

#define FM_XPORT_COUNT(x, field, n) \
	__atomic_fetch_add(&__atomic_load_n(&(x)->counters, __ATOMIC_ACQUIRE)->field, (uint64_t)(n), \
			   __ATOMIC_RELAXED)

/* Fill in the common part: ops, kind, address, timeout, counters. Inline: a transport calls nothing in xport.c. */
static inline void fm_xport_init(struct fm_xport *x, const struct fm_xport_ops *ops, int kind,
				 const char *addr, int timeout_ms)
{
	size_t n = strnlen(addr, sizeof(x->addr) - 1);

	x->ops = ops;
	x->kind = kind;
	x->timeout_ms = timeout_ms;
	memcpy(x->addr, addr, n);
	x->addr[n] = '\0';
	atomic_store(&x->counters, &x->own);
}

/*
 * The constructors, each with fm_xport_connect's contract; fm_xport_connect
 * picks one by the address. A child of several memds is a stream transport
 * with child set: quiet, its parent reports what goes wrong.
 */
int fm_stream_connect(const struct fm_xport_cfg *cfg, int child, struct fm_xport **out, char *err,
		      size_t errlen);
int fm_shm_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen);
int fm_rdma_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen);
int fm_multi_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen);

#endif /* FARMEM_CLIENT_OPS_H */
