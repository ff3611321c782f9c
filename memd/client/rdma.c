// SPDX-License-Identifier: Apache-2.0
/*
 * The rdma transport: one-sided verbs into the regions memd advertises with
 * RDMA_MAP (the space's memfd layout: page data, then fm_shm_meta {crc,
 * flags} per page, as the shm transport uses it).
 *
 *  read:  per page, RDMA READ of the data and of its meta into this channel's
 *         registered buffer; one chain, only the last work request signalled
 *         (RC completes in order, so its completion covers the chain). Then
 *         flags and checksum are checked here.
 *  write: copy into the registered buffer, crc, then per page RDMA WRITE of
 *         the data followed by RDMA WRITE of {crc, PRESENT} (flags last);
 *         the signalled completion of the last one means memd's memory holds
 *         every byte, so the pager may drop its copy.
 *  discard: RDMA WRITE of zeroed meta (no hole punching: the region is pinned);
 *         a chunk left with no page goes back to memd (RDMA_UNREG).
 *  copy:  COPY over the TCP control connection: memd copies slot to slot.
 *
 * Capacity: registration pins memory, so memd registers a space chunk by
 * chunk (RDMA_REG) as this client first writes into each, and a chunk
 * registered is the grant of its pages: memd holds what was written, not
 * every space's full size. A chunk memd refuses leaves its pages with the
 * pager, as a full memd does. (A memd before FM_HELLO_F_RDMA_REG registers
 * the whole region and pages take the QUOTA grant, as over shm.) This
 * client is the only writer of its spaces, so which pages are present is
 * kept in a local bitmap, and how many each chunk holds.
 *
 * A chunk whose last page was discarded goes back to memd (RDMA_UNREG, a
 * memd that sets FM_HELLO_F_RDMA_UNREG): a JVM's free regions would
 * otherwise stay pinned at their peak. memd deregisters it, and a work
 * request that used its rkeys then would fail and take the QP with it, so
 * every work request holds its chunk (busy[c]) from reading the rkeys until
 * its completion, and the release waits for none to be held: it marks the
 * chunk RELEASING first, which makes a new work request wait (a write) or
 * find the page absent (a read: the chunk holds no page). A signal handler
 * that interrupted its own thread's work request or release must not wait
 * for it: a thread that holds chunks releases none, and a write in the
 * thread that is releasing does not wait for the release (its page is
 * refused as full and stays with the pager).
 */
#include "rdma.h"
#include "ops.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "ctrl.h"
#include "fm_util.h"

/*
 * libibverbs and librdmacm (and the netlink libraries under them) are opened
 * when an rdma:// address is first used, not linked: the preload shim goes
 * into every process `farmem run` starts, and loading them cost each exec
 * about half a millisecond. Calls go through this table (verbs.ibv_...); the
 * verbs that are inline in the headers (post, poll, notify) call through the
 * device's own ops and need no symbol.
 */
#define FM_RDMA_CALLS(X)                                                          \
	X(ibverbs, ibv_alloc_pd) X(ibverbs, ibv_dealloc_pd) X(ibverbs, ibv_reg_mr)      \
	X(ibverbs, ibv_dereg_mr) X(ibverbs, ibv_query_device)                        \
	X(ibverbs, ibv_create_comp_channel) X(ibverbs, ibv_destroy_comp_channel)     \
	X(ibverbs, ibv_create_cq) X(ibverbs, ibv_destroy_cq)                         \
	X(ibverbs, ibv_get_cq_event) X(ibverbs, ibv_ack_cq_events)                   \
	X(ibverbs, ibv_wc_status_str)                                                \
	X(rdmacm, rdma_create_event_channel) X(rdmacm, rdma_destroy_event_channel)   \
	X(rdmacm, rdma_create_id) X(rdmacm, rdma_destroy_id)                         \
	X(rdmacm, rdma_resolve_addr) X(rdmacm, rdma_resolve_route)                   \
	X(rdmacm, rdma_create_qp) X(rdmacm, rdma_destroy_qp) X(rdmacm, rdma_connect) \
	X(rdmacm, rdma_disconnect) X(rdmacm, rdma_get_cm_event)                      \
	X(rdmacm, rdma_ack_cm_event) X(rdmacm, rdma_event_str)

#undef ibv_reg_mr /* a header macro choosing between two entry points: ours takes plain flags */
#define FM_RDMA_PTR(lib, name) __typeof__(name) *name;
static struct {
	FM_RDMA_CALLS(FM_RDMA_PTR)
	char err[256];
} verbs;
#undef FM_RDMA_PTR
static pthread_once_t verbs_once = PTHREAD_ONCE_INIT;

static void verbs_open(void)
{
	void *ibverbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	void *rdmacm = ibverbs ? dlopen("librdmacm.so.1", RTLD_NOW | RTLD_GLOBAL) : NULL;
	const char *missing = NULL;

	if (!ibverbs || !rdmacm) {
		snprintf(verbs.err, sizeof(verbs.err), "cannot load the RDMA libraries (Debian: "
			 "libibverbs1 librdmacm1): %s", dlerror());
		return;
	}
#define FM_RDMA_SYM(lib, name)                                                    \
	if (!missing && !(verbs.name = (__typeof__(name) *)dlsym(lib, #name)))      \
		missing = #name;
	FM_RDMA_CALLS(FM_RDMA_SYM)
#undef FM_RDMA_SYM
	if (missing)
		snprintf(verbs.err, sizeof(verbs.err), "the RDMA libraries lack %s", missing);
}

static int verbs_load(char *err, size_t errlen)
{
	pthread_once(&verbs_once, verbs_open);
	if (!verbs.err[0])
		return 0;
	fm_errmsg(err, errlen, "%s", verbs.err);
	return -ELIBACC;
}


#define RDMA_ZERO_META 4096u  /* metas zeroed per discard work request */

enum { CHUNK_UNREG, CHUNK_REG, CHUNK_RELEASING };
#define RDMA_REG_TRIES 8  /* a write's registrations of one chunk, each released again before its hold */

/* This thread's chunk holds, and whether it is releasing chunks (it may be interrupted in either). */
static __thread unsigned tls_holds __attribute__((tls_model("initial-exec")));
static __thread int tls_releasing __attribute__((tls_model("initial-exec")));

struct rspace {
	uint32_t id;
	uint64_t npages;
	uint64_t data_addr, meta_addr;
	uint32_t rkey;     /* the whole region's, when chunk_pages is 0 */
	uint8_t *present;  /* bitmap, atomics */
	uint64_t chunk_pages, nchunks;
	struct rkeys { uint32_t data, meta; } *keys;
	uint8_t *reg;      /* reg[c]: CHUNK_*; CHUNK_REG once keys[c] is set (release) */
	uint32_t *held;    /* held[c]: chunk c's present pages */
	uint32_t *busy;    /* busy[c]: work requests that hold chunk c (posted or about to be) */
	int valid;         /* published last */
};

struct rdma {
	struct fm_session_xport sx;  /* control over TCP to ADDR:PORT: session, spaces, quota, COPY */
	char host[256];
	char port[16];
	pthread_mutex_t lock;        /* the space table's changes */
	/*
	 * Over an RDMA_REG or RDMA_UNREG and the chunk states it changes: an
	 * answer published after a later release would bring back dead rkeys.
	 */
	pthread_mutex_t reg_lock;
	struct rspace sp[FM_XPORT_MAX_SPACES];
	unsigned nsp;
};

struct rchan {
	struct fm_chan base;
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf;                 /* FM_MAX_BATCH pages, then metas, then zero metas */
	struct fm_shm_meta *meta;
	struct fm_shm_meta *zero;
	struct ibv_send_wr wr[2 * FM_MAX_BATCH];
	struct ibv_sge sge[2 * FM_MAX_BATCH];
	int dead;
	/* rdma_copy's scratch */
	uint64_t csp[FM_MAX_BATCH], cdp[FM_MAX_BATCH];
	uint32_t cst[FM_MAX_BATCH];
	unsigned cidx[FM_MAX_BATCH];
	uint8_t took[FM_MAX_BATCH];
	/* register_chunks' and release_chunks' scratch */
	uint64_t rchunks[FM_MAX_RDMA_REG];
	struct fm_rdma_reg_ent rents[FM_MAX_RDMA_REG];
	/* the chunks this call's work requests hold, one entry per request */
	uint64_t holds[2 * FM_MAX_BATCH];
	unsigned nholds;
};

static struct rdma *to_rdma(struct fm_xport *x) { return (struct rdma *)x; }
static struct rchan *to_rchan(struct fm_chan *c) { return (struct rchan *)c; }

/* How long a release waits for work requests, a write for a release: each ends within a call's deadline. */
static uint64_t chunk_wait_ns(const struct rchan *rc)
{
	return 2ull * (uint64_t)rc->base.x->timeout_ms * 1000 * 1000;
}

static struct rspace *find_rspace(struct rdma *r, uint32_t id)
{
	unsigned n = __atomic_load_n(&r->nsp, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; i < n; i++)
		if (__atomic_load_n(&r->sp[i].valid, __ATOMIC_ACQUIRE) && r->sp[i].id == id)
			return &r->sp[i];
	return NULL;
}

static int space_map(struct fm_xport *x, uint32_t id, uint64_t npages)
{
	struct rdma *r = to_rdma(x);
	struct fm_space_ref ref = { .space_id = id };
	struct fm_rdma_map_rep rep;
	struct rspace *s = NULL;
	size_t len;
	uint16_t st;
	int rc;

	rc = fm_ctrl_call(&r->sx.ctrl, FM_OP_RDMA_MAP, &ref, sizeof(ref), &rep, sizeof(rep), &len, &st, NULL);
	if (rc)
		return rc;
	if (st == FM_E_NOSHM) {
		fm_err("memd at %s has no RDMA listener (start it with --rdma ADDR:PORT)", r->sx.base.addr);
		return -EOPNOTSUPP;
	}
	if (st == FM_E_STATE) {
		fm_err("memd at %s refused to register space %u for RDMA (its log says why)", r->sx.base.addr, id);
		return -EPROTO;
	}
	if (st || len != sizeof(rep) || rep.npages != npages ||
	    rep.meta_offset < rep.data_offset + npages * FM_PAGE_SIZE ||
	    rep.map_len < rep.meta_offset + npages * sizeof(struct fm_shm_meta))
		return -EPROTO;
	pthread_mutex_lock(&r->lock);
	for (unsigned i = 0; i < r->nsp; i++)
		if (!r->sp[i].valid && !r->sp[i].present)
			s = &r->sp[i];
	if (!s && r->nsp < FM_XPORT_MAX_SPACES)
		s = &r->sp[r->nsp];
	if (s) {
		uint64_t nchunks = rep.chunk_pages ? (npages + rep.chunk_pages - 1) / rep.chunk_pages : 0;

		free(s->present);
		free(s->keys);
		free(s->reg);
		free(s->held);
		free(s->busy);
		s->present = calloc((npages + 7) / 8, 1);
		s->keys = nchunks ? calloc(nchunks, sizeof(*s->keys)) : NULL;
		s->reg = nchunks ? calloc(nchunks, 1) : NULL;
		s->held = nchunks ? calloc(nchunks, sizeof(*s->held)) : NULL;
		s->busy = nchunks ? calloc(nchunks, sizeof(*s->busy)) : NULL;
		if (s->present && nchunks && (!s->keys || !s->reg || !s->held || !s->busy)) {
			free(s->present);
			s->present = NULL;
		}
		if (s->present) {
			s->chunk_pages = rep.chunk_pages;
			s->nchunks = nchunks;
			s->id = id;
			s->npages = npages;
			s->data_addr = rep.addr + rep.data_offset;
			s->meta_addr = rep.addr + rep.meta_offset;
			s->rkey = rep.rkey;
			__atomic_store_n(&s->valid, 1, __ATOMIC_RELEASE);
			if (s == &r->sp[r->nsp])
				__atomic_store_n(&r->nsp, r->nsp + 1, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&r->lock);
	return s && s->present ? 0 : -ENOSPC;
}

static int rdma_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	return fm_session_xport_space_open(x, npages, space_id, space_map);
}

static int rdma_space_close(struct fm_xport *x, uint32_t space_id)
{
	struct rdma *r = to_rdma(x);
	struct rspace *s = find_rspace(r, space_id);

	if (s) {
		pthread_mutex_lock(&r->lock);
		__atomic_store_n(&s->valid, 0, __ATOMIC_RELEASE);
		/* The bitmap stays allocated (a channel may still look at it); the slot is not reused. */
		pthread_mutex_unlock(&r->lock);
		/* Its chunks' memory goes back to memd's capacity: a refused chunk may fit now. */
		if (s->chunk_pages)
			atomic_store(&r->sx.ctrl.full_until_ns, 0);
	}
	return fm_session_xport_space_close(x, space_id);
}

static void rdma_close(struct fm_xport *x)
{
	struct rdma *r = to_rdma(x);

	for (unsigned i = 0; i < r->nsp; i++) {
		free(r->sp[i].present);
		free(r->sp[i].keys);
		free(r->sp[i].reg);
		free(r->sp[i].held);
		free(r->sp[i].busy);
	}
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->reg_lock);
	fm_session_xport_free(&r->sx);
}

/* Wait for one rdma_cm event of the wanted type on the channel's own event channel. */
static int cm_wait(struct rchan *rc, enum rdma_cm_event_type want, int timeout_ms)
{
	struct pollfd p = { .fd = rc->ec->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type t;
	int st;

	if (fm_sys_poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	if (verbs.rdma_get_cm_event(rc->ec, &ev))
		return -errno;
	t = ev->event;
	st = ev->status;
	verbs.rdma_ack_cm_event(ev);
	if (t != want) {
		fm_debug("rdma: %s (status %d) while waiting for %s", verbs.rdma_event_str(t), st,
			 verbs.rdma_event_str(want));
		return t == RDMA_CM_EVENT_REJECTED ? -ECONNREFUSED : -EHOSTUNREACH;
	}
	return 0;
}

static void rdma_chan_close(struct fm_chan *c)
{
	struct rchan *rc = to_rchan(c);

	if (rc->id && rc->id->qp) {
		verbs.rdma_disconnect(rc->id);
		verbs.rdma_destroy_qp(rc->id);
	}
	if (rc->mr)
		verbs.ibv_dereg_mr(rc->mr);
	if (rc->cq)
		verbs.ibv_destroy_cq(rc->cq);
	if (rc->cc)
		verbs.ibv_destroy_comp_channel(rc->cc);
	if (rc->pd)
		verbs.ibv_dealloc_pd(rc->pd);
	if (rc->id)
		verbs.rdma_destroy_id(rc->id);
	if (rc->ec)
		verbs.rdma_destroy_event_channel(rc->ec);
	free(rc->buf);
	free(rc);
}

static int rdma_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct rdma *r = to_rdma(x);
	struct rchan *rc = calloc(1, sizeof(*rc));
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	size_t buflen = (size_t)FM_MAX_BATCH * FM_PAGE_SIZE +
			(size_t)(FM_MAX_BATCH + RDMA_ZERO_META) * sizeof(struct fm_shm_meta);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2 * FM_MAX_BATCH + 8, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 0,
	};
	/* memd puts the QP in our session's protection domain, where our regions are. */
	struct fm_rdma_conn_priv priv = { .magic = FM_RDMA_CONN_MAGIC, .session = r->sx.ctrl.session };
	struct rdma_conn_param cp = { .initiator_depth = 16, .responder_resources = 0,
				      .retry_count = 7, .rnr_retry_count = 7,
				      .private_data = &priv, .private_data_len = sizeof(priv) };
	struct ibv_device_attr da;
	int ret, tmo = x->timeout_ms;

	if (!rc)
		return -ENOMEM;
	rc->base.x = x;
	ret = getaddrinfo(r->host, r->port, &hints, &ai);
	if (ret) {
		fm_err("rdma: %s: %s", r->host, gai_strerror(ret));
		free(rc);
		return -EHOSTUNREACH;
	}
	rc->ec = verbs.rdma_create_event_channel();
	if (!rc->ec || verbs.rdma_create_id(rc->ec, &rc->id, NULL, RDMA_PS_TCP) ||
	    verbs.rdma_resolve_addr(rc->id, NULL, ai->ai_addr, tmo)) {
		ret = -errno;
		goto fail;
	}
	ret = cm_wait(rc, RDMA_CM_EVENT_ADDR_RESOLVED, tmo);
	if (!ret)
		ret = verbs.rdma_resolve_route(rc->id, tmo) ? -errno : cm_wait(rc, RDMA_CM_EVENT_ROUTE_RESOLVED, tmo);
	if (ret)
		goto fail;
	rc->buf = aligned_alloc(FM_PAGE_SIZE, (buflen + FM_PAGE_SIZE - 1) & ~(size_t)(FM_PAGE_SIZE - 1));
	rc->pd = verbs.ibv_alloc_pd(rc->id->verbs);
	rc->cc = verbs.ibv_create_comp_channel(rc->id->verbs);
	rc->cq = rc->cc ? verbs.ibv_create_cq(rc->id->verbs, 4 * FM_MAX_BATCH + 16, NULL, rc->cc, 0) : NULL;
	if (!rc->buf || !rc->pd || !rc->cq) {
		ret = -ENOMEM;
		goto fail;
	}
	memset(rc->buf, 0, buflen);
	rc->meta = (struct fm_shm_meta *)(rc->buf + (size_t)FM_MAX_BATCH * FM_PAGE_SIZE);
	rc->zero = rc->meta + FM_MAX_BATCH;
	rc->mr = verbs.ibv_reg_mr(rc->pd, rc->buf, buflen, IBV_ACCESS_LOCAL_WRITE);
	if (!rc->mr) {
		ret = -errno;
		goto fail;
	}
	qa.send_cq = qa.recv_cq = rc->cq;
	if (verbs.rdma_create_qp(rc->id, rc->pd, &qa)) {
		ret = -errno;
		goto fail;
	}
	if (!verbs.ibv_query_device(rc->id->verbs, &da) && da.max_qp_init_rd_atom < cp.initiator_depth)
		cp.initiator_depth = (uint8_t)da.max_qp_init_rd_atom;
	if (verbs.rdma_connect(rc->id, &cp)) {
		ret = -errno;
		goto fail;
	}
	ret = cm_wait(rc, RDMA_CM_EVENT_ESTABLISHED, tmo);
	if (ret)
		goto fail;
	freeaddrinfo(ai);
	*out = &rc->base;
	return 0;
fail:
	fm_err("rdma: cannot connect a QP to %s:%s: %s", r->host, r->port, fm_strerror(ret));
	freeaddrinfo(ai);
	rdma_chan_close(&rc->base);
	return ret ? ret : -EIO;
}

static void add_wr(struct rchan *rc, unsigned k, enum ibv_wr_opcode op, void *local, uint32_t len,
		   uint64_t raddr, uint32_t rkey)
{
	rc->sge[k] = (struct ibv_sge){ .addr = (uintptr_t)local, .length = len, .lkey = rc->mr->lkey };
	rc->wr[k] = (struct ibv_send_wr){ .wr_id = k, .sg_list = &rc->sge[k], .num_sge = 1,
					  .opcode = op, .wr.rdma = { .remote_addr = raddr, .rkey = rkey } };
	if (k)
		rc->wr[k - 1].next = &rc->wr[k];
}

/*
 * Post wr[0..n) as one chain, the last signalled, and wait for its
 * completion: polling the CQ (for the transport's spin_us at most: a poll
 * is a read of memory, a sleep a wakeup), then sleeping on the completion
 * channel for what is left of the call's deadline. A QP that misses the
 * deadline is given up (dead): its late completions must not be taken for
 * the next call's.
 */
static int post_wait(struct rchan *rc, unsigned n)
{
	uint64_t deadline = fm_deadline_in(rc->base.x->timeout_ms), spin_until = 0;
	struct ibv_send_wr *bad = NULL;
	struct ibv_wc wc[16];
	int got, done = 0, armed = 0, rcode = 0;

	if (rc->dead)
		return -EPIPE;
	rc->wr[n - 1].next = NULL;
	rc->wr[n - 1].send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(rc->id->qp, rc->wr, &bad)) {
		rc->dead = 1;
		fm_err("rdma: post_send failed: the QP is gone");
		return -EPIPE;
	}
	while (!done) {
		got = ibv_poll_cq(rc->cq, 16, wc);
		if (got < 0) {
			rc->dead = 1;
			return -EIO;
		}
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				if (!rc->dead)
					fm_err("rdma: work request failed: %s (memd dropped this QP)",
					       verbs.ibv_wc_status_str(wc[i].status));
				rc->dead = 1;
				rcode = -EIO;
			}
			if (wc[i].wr_id == n - 1)
				done = 1;
		}
		if (done || got)
			continue;
		if (!spin_until)
			spin_until = fm_now_ns() + rc->base.x->spin_us * 1000ull;
		if (fm_now_ns() < spin_until) {
			fm_cpu_relax();
			continue;
		}
		if (!armed) {
			/* Arm, then poll once more so a completion that raced the arming is seen. */
			ibv_req_notify_cq(rc->cq, 0);
			armed = 1;
			continue;
		}
		{
			uint64_t now = fm_now_ns();
			struct pollfd p = { .fd = rc->cc->fd, .events = POLLIN };
			struct ibv_cq *cq;
			void *ctx;
			int r = now < deadline ? fm_sys_poll(&p, 1, (int)((deadline - now + 999999) / 1000000)) : 0;

			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				if (fm_now_ns() < deadline)
					continue;
				rc->dead = 1;
				fm_err("rdma: no completion in %d ms: memd at %s lost", rc->base.x->timeout_ms,
				       rc->base.x->addr);
				return -ETIMEDOUT;
			}
			if (!verbs.ibv_get_cq_event(rc->cc, &cq, &ctx))
				verbs.ibv_ack_cq_events(cq, 1);
			armed = 0;
		}
		if (rc->dead && rcode)
			break;
	}
	if (rc->dead && rcode) {
		/* Drain the flushed rest of the chain. */
		while (ibv_poll_cq(rc->cq, 16, wc) > 0)
			;
	}
	return rcode;
}

static int holds_already(const struct rchan *rc, uint64_t c)
{
	for (unsigned i = 0; i < rc->nholds; i++)
		if (rc->holds[i] == c)
			return 1;
	return 0;
}

/*
 * The rkeys of page p's data and meta for a work request of this call, its
 * chunk held until unhold_all: 1, or 0 when its chunk is not registered
 * (memd holds nothing of it). A chunk being released that holds a page is
 * as good as registered: its release will find the page and give up. One
 * that holds none is as good as gone, or waited for when the caller wants
 * it registered (a write), unless this thread is the one releasing. One
 * this call holds already stays good: its release waits for this call.
 */
static int rkeys_hold(struct rchan *rc, struct rspace *s, uint64_t p, int wait, uint32_t *data, uint32_t *meta)
{
	uint64_t c, until = 0;
	uint8_t st;

	if (!s->chunk_pages) {
		*data = *meta = s->rkey;
		return 1;
	}
	c = p / s->chunk_pages;
	for (;;) {
		/* Counted as this thread's before busy: a signal handler here must not wait for it. */
		tls_holds++;
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		/* busy before reg, as release_chunks sets reg before it reads busy: one of them sees the other. */
		__atomic_add_fetch(&s->busy[c], 1, __ATOMIC_SEQ_CST);
		st = __atomic_load_n(&s->reg[c], __ATOMIC_SEQ_CST);
		if (st == CHUNK_REG || (st == CHUNK_RELEASING && (__atomic_load_n(&s->held[c], __ATOMIC_SEQ_CST) ||
								  holds_already(rc, c))))
			break;
		__atomic_sub_fetch(&s->busy[c], 1, __ATOMIC_RELEASE);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		tls_holds--;
		if (st == CHUNK_UNREG || !wait || tls_releasing)
			return 0;
		if (!until)
			until = fm_now_ns() + chunk_wait_ns(rc);
		else if (fm_now_ns() >= until)
			return 0;
		sched_yield();
	}
	rc->holds[rc->nholds++] = c;
	*data = s->keys[c].data;
	*meta = s->keys[c].meta;
	return 1;
}

/* The holds of this call's work requests given up: they completed, or were never posted. */
static void unhold_all(struct rchan *rc, struct rspace *s)
{
	for (unsigned i = 0; i < rc->nholds; i++) {
		__atomic_sub_fetch(&s->busy[rc->holds[i]], 1, __ATOMIC_RELEASE);
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		tls_holds--;
	}
	rc->nholds = 0;
}

/* Page p of a chunked space present: its bit set, and its chunk's count if the bit was new. */
static void mark_present(struct rspace *s, uint64_t p)
{
	uint8_t bit = (uint8_t)(1u << (p & 7));

	if (!(__atomic_fetch_or(&s->present[p >> 3], bit, __ATOMIC_ACQ_REL) & bit))
		__atomic_add_fetch(&s->held[p / s->chunk_pages], 1, __ATOMIC_SEQ_CST);
}

/*
 * Chunk c's rkeys, from memd's answer, published (reg[c] last), reg_lock
 * held. Registered already (by another channel: the same rkeys) or being
 * released, it is left as it is.
 */
static void chunk_registered(struct rspace *s, uint64_t c, const struct fm_rdma_reg_ent *e)
{
	if (__atomic_load_n(&s->reg[c], __ATOMIC_ACQUIRE) != CHUNK_UNREG)
		return;
	s->keys[c] = (struct rkeys){ e->data_rkey, e->meta_rkey };
	__atomic_store_n(&s->reg[c], CHUNK_REG, __ATOMIC_RELEASE);
}

/* RDMA_REG of rc->rchunks[0..k) and what memd registered of them published. */
static int register_listed(struct rdma *r, struct rchan *rc, struct rspace *s, unsigned k)
{
	int ret;

	pthread_mutex_lock(&r->reg_lock);
	ret = fm_ctrl_rdma_reg(&r->sx.ctrl, s->id, rc->rchunks, k, rc->rents);
	for (unsigned j = 0; !ret && j < k; j++)
		if (rc->rents[j].status == FM_OK)
			chunk_registered(s, rc->rchunks[j], &rc->rents[j]);
	pthread_mutex_unlock(&r->reg_lock);
	/* Refused (full, or an answer that makes no sense): their pages stay with the pager. */
	return ret == -ENOSPC || ret == -EPROTO ? 0 : ret;
}

/* RDMA_UNREG of rc->rchunks[0..k), each RELEASING with no work request held: unregistered, or back. */
static void unregister_listed(struct rdma *r, struct rchan *rc, struct rspace *s, unsigned k)
{
	int ret;

	pthread_mutex_lock(&r->reg_lock);
	ret = fm_ctrl_rdma_unreg(&r->sx.ctrl, s->id, rc->rchunks, k);
	for (unsigned j = 0; j < k; j++)
		__atomic_store_n(&s->reg[rc->rchunks[j]], ret ? CHUNK_REG : CHUNK_UNREG, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&r->reg_lock);
}

/*
 * Wait until no work request holds chunk c (RELEASING now): 1 when it then
 * holds no page either, else it is registered as before and 0 (a work
 * request still holding it after chunk_wait_ns, or a write that held it
 * before it was RELEASING, or a work request that found a page there).
 */
static int release_drained(struct rchan *rc, struct rspace *s, uint64_t c)
{
	uint64_t until = 0;

	while (__atomic_load_n(&s->busy[c], __ATOMIC_SEQ_CST)) {
		if (!until)
			until = fm_now_ns() + chunk_wait_ns(rc);
		else if (fm_now_ns() >= until)
			break;
		sched_yield();
	}
	if (__atomic_load_n(&s->busy[c], __ATOMIC_SEQ_CST) || __atomic_load_n(&s->held[c], __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&s->reg[c], CHUNK_REG, __ATOMIC_RELEASE);
		return 0;
	}
	return 1;
}

/*
 * The chunks that ranges r[0..n) touch, those left with no page given back
 * to memd, up to FM_MAX_RDMA_REG a request. While it waits for a chunk's
 * work requests it has no other chunk RELEASING: a write that waits for
 * one of those may hold this one.
 */
static void release_chunks(struct rdma *rd, struct rchan *rc, struct rspace *s, const struct fm_range *r,
			   unsigned n)
{
	unsigned k = 0;

	/* A thread interrupted with chunks held (or releasing) would wait for itself. */
	if (!s->chunk_pages || !(rd->sx.ctrl.conn.server_flags & FM_HELLO_F_RDMA_UNREG) || tls_holds ||
	    tls_releasing)
		return;
	tls_releasing = 1;
	for (unsigned i = 0; i < n; i++) {
		if (!r[i].npages)
			continue;
		for (uint64_t c = r[i].first / s->chunk_pages; c <= (r[i].first + r[i].npages - 1) / s->chunk_pages;
		     c++) {
			uint8_t want = CHUNK_REG;

			if (__atomic_load_n(&s->held[c], __ATOMIC_SEQ_CST) ||
			    !__atomic_compare_exchange_n(&s->reg[c], &want, CHUNK_RELEASING, 0, __ATOMIC_SEQ_CST,
							 __ATOMIC_SEQ_CST))
				continue;
			if (k && __atomic_load_n(&s->busy[c], __ATOMIC_SEQ_CST)) {
				unregister_listed(rd, rc, s, k);
				k = 0;
			}
			if (!release_drained(rc, s, c))
				continue;
			rc->rchunks[k++] = c;
			if (k == FM_MAX_RDMA_REG) {
				unregister_listed(rd, rc, s, k);
				k = 0;
			}
		}
	}
	if (k)
		unregister_listed(rd, rc, s, k);
	tls_releasing = 0;
}

/*
 * The chunks of pages[0..n) (in range) not registered yet are, one RDMA_REG
 * per FM_MAX_RDMA_REG of them; a chunk memd refuses stays unregistered, and
 * the caller refuses its pages as full. 0, or memd is lost.
 */
static int register_chunks(struct rdma *r, struct rchan *rc, struct rspace *s, const uint64_t *pages,
			   unsigned n)
{
	unsigned k = 0;

	for (unsigned i = 0; s->chunk_pages && i < n; i++) {
		uint64_t c = pages[i] / s->chunk_pages;
		unsigned j = 0;

		if (pages[i] >= s->npages || __atomic_load_n(&s->reg[c], __ATOMIC_ACQUIRE) != CHUNK_UNREG)
			continue;
		while (j < k && rc->rchunks[j] != c)
			j++;
		if (j < k)
			continue;
		rc->rchunks[k++] = c;
		if (k == FM_MAX_RDMA_REG) {
			int ret = register_listed(r, rc, s, k);

			if (ret)
				return ret;
			k = 0;
		}
	}
	return k ? register_listed(r, rc, s, k) : 0;
}

static int rdma_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		     const void **src)
{
	struct rchan *rc = to_rchan(c);
	struct rspace *s = find_rspace(to_rdma(c->x), space);
	unsigned k = 0;
	int ret;

	if (!s)
		return -ENOENT;
	rc->nholds = 0;
	for (unsigned i = 0; i < n; i++) {
		uint64_t p = pages[i];
		uint32_t dk, mk;

		ret = p >= s->npages ? -ERANGE : !rkeys_hold(rc, s, p, 0, &dk, &mk) ? -ENOENT : 0;
		if (ret) {
			unhold_all(rc, s);
			return ret;
		}
		add_wr(rc, k++, IBV_WR_RDMA_READ, rc->buf + (size_t)i * FM_PAGE_SIZE, FM_PAGE_SIZE,
		       s->data_addr + p * FM_PAGE_SIZE, dk);
		add_wr(rc, k++, IBV_WR_RDMA_READ, &rc->meta[i], sizeof(struct fm_shm_meta),
		       s->meta_addr + p * sizeof(struct fm_shm_meta), mk);
	}
	ret = post_wait(rc, k);
	unhold_all(rc, s);
	if (ret)
		return ret;
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *d = rc->buf + (size_t)i * FM_PAGE_SIZE;
		if (!(rc->meta[i].flags & FM_SHM_PRESENT))
			return -ENOENT;
		if (fm_crc32c(d, FM_PAGE_SIZE) != rc->meta[i].crc)
			return -EIO;
		src[i] = d;
	}
	return 0;
}

/*
 * Page p's rkeys held for a write, its chunk registered again when another
 * page's discard emptied and released it since register_chunks. 1; 0 when
 * memd refuses the chunk (full); else memd is lost.
 */
static int hold_for_write(struct rdma *r, struct rchan *rc, struct rspace *s, uint64_t p, uint32_t *dk,
			  uint32_t *mk)
{
	for (unsigned tries = 0;; tries++) {
		int ret;

		if (rkeys_hold(rc, s, p, 1, dk, mk))
			return 1;
		if (!s->chunk_pages || tries == RDMA_REG_TRIES)
			return 0;
		ret = register_chunks(r, rc, s, &p, 1);
		if (ret)
			return ret;
	}
}

static int rdma_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		      const void *const *data, uint32_t *status)
{
	struct rchan *rc = to_rchan(c);
	struct rdma *r = to_rdma(c->x);
	struct rspace *s;
	unsigned k = 0;
	int ret;

	/* memd's control connection hung up: it is gone, do not trust it with a page. */
	if (!fm_ctrl_alive(&r->sx.ctrl))
		return -EPIPE;
	s = find_rspace(r, space);
	if (!s)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (pages[i] >= s->npages)
			return -ERANGE;
	ret = register_chunks(r, rc, s, pages, n);
	if (ret)
		return ret;
	rc->nholds = 0;
	for (unsigned i = 0; i < n; i++) {
		uint64_t p = pages[i];
		uint8_t bit, old;
		uint8_t *d = rc->buf + (size_t)i * FM_PAGE_SIZE;
		uint32_t dk, mk;

		ret = hold_for_write(r, rc, s, p, &dk, &mk);
		if (ret < 0) {
			unhold_all(rc, s);
			return ret;
		}
		if (!ret) {
			status[i] = FM_E_FULL;
			continue;
		}
		bit = (uint8_t)(1u << (p & 7));
		old = __atomic_load_n(&s->present[p >> 3], __ATOMIC_ACQUIRE);
		if (s->chunk_pages) {
			mark_present(s, p);
		} else if (!(old & bit)) {
			if (!fm_ctrl_take_grant(&r->sx.ctrl)) {
				status[i] = FM_E_FULL;
				continue;
			}
			if (__atomic_fetch_or(&s->present[p >> 3], bit, __ATOMIC_ACQ_REL) & bit)
				fm_ctrl_return_grant(&r->sx.ctrl, 1);  /* another channel won */
		}
		memcpy(d, data[i], FM_PAGE_SIZE);
		rc->meta[i] = (struct fm_shm_meta){ .crc = fm_crc32c(d, FM_PAGE_SIZE),
						    .flags = FM_SHM_PRESENT };
		/* Data, then {crc, flags}: flags last. */
		add_wr(rc, k++, IBV_WR_RDMA_WRITE, d, FM_PAGE_SIZE, s->data_addr + p * FM_PAGE_SIZE, dk);
		add_wr(rc, k++, IBV_WR_RDMA_WRITE, &rc->meta[i], sizeof(struct fm_shm_meta),
		       s->meta_addr + p * sizeof(struct fm_shm_meta), mk);
		status[i] = FM_OK;
	}
	ret = k ? post_wait(rc, k) : 0;
	unhold_all(rc, s);
	return ret;
}

static int rdma_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	struct rchan *rc = to_rchan(c);
	struct rdma *rd = to_rdma(c->x);
	struct rspace *s = find_rspace(rd, space);
	unsigned k = 0;
	int ret;

	if (!s)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (r[i].first >= s->npages || r[i].npages > s->npages - r[i].first)
			return -ERANGE;
	rc->nholds = 0;
	for (unsigned i = 0; i < n; i++) {
		uint64_t freed = 0;
		for (uint64_t p = r[i].first; p < r[i].first + r[i].npages; p++) {
			uint8_t bit = (uint8_t)(1u << (p & 7));
			if (!(__atomic_fetch_and(&s->present[p >> 3], (uint8_t)~bit, __ATOMIC_ACQ_REL) & bit))
				continue;
			freed++;
			if (s->chunk_pages)
				__atomic_sub_fetch(&s->held[p / s->chunk_pages], 1, __ATOMIC_SEQ_CST);
		}
		for (uint64_t p = r[i].first, m; p < r[i].first + r[i].npages; p += m) {
			uint32_t dk, mk;

			m = r[i].first + r[i].npages - p;
			if (m > RDMA_ZERO_META)
				m = RDMA_ZERO_META;
			/* A work request stays within one chunk's region; a chunk not registered holds nothing. */
			if (s->chunk_pages && m > s->chunk_pages - p % s->chunk_pages)
				m = s->chunk_pages - p % s->chunk_pages;
			if (!rkeys_hold(rc, s, p, 0, &dk, &mk))
				continue;
			add_wr(rc, k++, IBV_WR_RDMA_WRITE, rc->zero,
			       (uint32_t)(m * sizeof(struct fm_shm_meta)),
			       s->meta_addr + p * sizeof(struct fm_shm_meta), mk);
			if (k == 2 * FM_MAX_BATCH) {
				ret = post_wait(rc, k);
				unhold_all(rc, s);
				if (ret)
					return ret;
				k = 0;
			}
		}
		/* A chunk's memory is the grant of its pages: it goes back whole, below. */
		if (!s->chunk_pages)
			fm_ctrl_return_grant(&rd->sx.ctrl, freed);
	}
	ret = k ? post_wait(rc, k) : 0;
	unhold_all(rc, s);
	if (!ret)
		release_chunks(rd, rc, s, r, n);
	return ret;
}

/*
 * RDMA READ and WRITE are one-sided: a copy from one region to another
 * would bring the bytes here and back. memd copies them itself instead,
 * asked over the control connection (COPY). This side keeps its books: a
 * destination page new to memd takes a page of the grant first, and only a
 * page memd copied is marked present.
 */
static int rdma_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		     const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct rchan *rch = to_rchan(c);
	struct rdma *r = to_rdma(c->x);
	struct rspace *ss, *ds;
	unsigned m = 0;
	int rc;

	/* A copy makes pages that only memd holds: the same rule as a write. */
	if (!fm_ctrl_alive(&r->sx.ctrl))
		return -EPIPE;
	ss = find_rspace(r, src);
	ds = find_rspace(r, dst);
	if (!ss || !ds)
		return -ENOENT;
	/* memd writes a destination page only into a registered chunk (it is the page's grant). */
	rc = register_chunks(r, rch, ds, dpages, n);
	if (rc)
		return rc;
	/* Held over the COPY too: memd writes there, and a release would free what it wrote. */
	rch->nholds = 0;
	for (unsigned i = 0; i < n; i++) {
		uint32_t dk, mk;

		uint64_t s = spages[i], d = dpages[i];

		if (s >= ss->npages || d >= ds->npages) {
			status[i] = FM_E_RANGE;
			continue;
		}
		/* This client is the only writer of its spaces: the bitmap is the truth. */
		if (!(__atomic_load_n(&ss->present[s >> 3], __ATOMIC_ACQUIRE) & (1u << (s & 7)))) {
			status[i] = FM_E_ABSENT;
			continue;
		}
		status[i] = FM_OK;
		if (ss == ds && s == d)
			continue;
		rch->took[m] = 0;
		rc = hold_for_write(r, rch, ds, d, &dk, &mk);
		if (rc < 0) {
			unhold_all(rch, ds);
			return rc;
		}
		if (!rc) {
			status[i] = FM_E_FULL;
			continue;
		}
		if (!ds->chunk_pages && !(__atomic_load_n(&ds->present[d >> 3], __ATOMIC_ACQUIRE) & (1u << (d & 7)))) {
			if (!fm_ctrl_take_grant(&r->sx.ctrl)) {
				status[i] = FM_E_FULL;
				continue;
			}
			rch->took[m] = 1;
		}
		rch->csp[m] = s;
		rch->cdp[m] = d;
		rch->cidx[m++] = i;
	}
	if (!m) {
		unhold_all(rch, ds);
		return 0;
	}
	rc = fm_ctrl_copy(&r->sx.ctrl, src, rch->csp, dst, rch->cdp, m, rch->cst);
	for (unsigned j = 0; j < m; j++) {
		uint64_t d = rch->cdp[j];
		uint8_t bit = (uint8_t)(1u << (d & 7));

		status[rch->cidx[j]] = rc ? FM_E_INTERNAL : rch->cst[j];
		if (ds->chunk_pages && !rc && rch->cst[j] == FM_OK)
			mark_present(ds, d);
		if (!rch->took[j])
			continue;
		if (rc || rch->cst[j] != FM_OK)
			fm_ctrl_return_grant(&r->sx.ctrl, 1);
		else if (__atomic_fetch_or(&ds->present[d >> 3], bit, __ATOMIC_ACQ_REL) & bit)
			fm_ctrl_return_grant(&r->sx.ctrl, 1);  /* another channel won */
	}
	unhold_all(rch, ds);
	return rc;
}

static const struct fm_xport_ops rdma_ops = {
	.space_open = rdma_space_open,
	.space_close = rdma_space_close,
	.stats = fm_session_xport_stats,
	.alive = fm_session_xport_alive,
	.hangup = fm_session_xport_hangup,
	.close = rdma_close,
	.chan_open = rdma_chan_open,
	.chan_close = rdma_chan_close,
	.read = rdma_read,
	.write = rdma_write,
	.copy = rdma_copy,
	.discard = rdma_discard,
};

int fm_rdma_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	const char *hp = cfg->addr + strlen("rdma://"), *colon = strrchr(hp, ':');
	struct fm_session_xport *sx;
	char ctrl_addr[280];
	struct rdma *r;
	int rc = verbs_load(err, errlen);

	if (rc)
		return rc;
	if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof(r->host) ||
	    strlen(colon + 1) == 0 || strlen(colon + 1) >= sizeof(r->port)) {
		fm_errmsg(err, errlen, "memd address '%s': want rdma://ADDR:PORT", cfg->addr);
		return -EINVAL;
	}
	/* Control over TCP to the same address and port (memd listens for both there). */
	fm_fmt(ctrl_addr, sizeof(ctrl_addr), "tcp:%s", hp);
	rc = fm_session_xport_new(sizeof(*r), cfg, ctrl_addr, FM_XPORT_RDMA, &rdma_ops, &sx, err, errlen);
	if (rc)
		return rc;
	r = (struct rdma *)sx;
	memcpy(r->host, hp, (size_t)(colon - hp));
	fm_fmt(r->port, sizeof(r->port), "%s", colon + 1);
	pthread_mutex_init(&r->lock, NULL);
	pthread_mutex_init(&r->reg_lock, NULL);
	*out = &sx->base;
	return 0;
}

/*
 * Test hook (tests/vm/rdma_peer.c): one RDMA READ of len bytes at any remote
 * address with any rkey, as a hostile peer would post it. Returns post_wait's
 * result: -EIO when the device refused it (and this channel's QP is then dead).
 */
int fm_rdma_test_raw_read(struct fm_chan *c, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct rchan *rc = to_rchan(c);

	if (c->x->kind != FM_XPORT_RDMA || len > FM_PAGE_SIZE)
		return -EINVAL;
	add_wr(rc, 0, IBV_WR_RDMA_READ, rc->buf, len, raddr, rkey);
	return post_wait(rc, 1);
}

/* The region of a space (test hook): 0 and its data address and rkey. */
int fm_rdma_test_region(struct fm_xport *x, uint32_t space, uint64_t *data_addr, uint64_t *npages,
			uint32_t *rkey)
{
	struct rspace *s = x->kind == FM_XPORT_RDMA ? find_rspace(to_rdma(x), space) : NULL;
	struct rdma *r = to_rdma(x);
	uint64_t first = 0;
	struct fm_rdma_reg_ent e;
	int rc = 0;

	if (!s)
		return -ENOENT;
	*rkey = s->rkey;
	/* Chunked: the first chunk's region, registered now if it is not yet. */
	if (s->chunk_pages) {
		pthread_mutex_lock(&r->reg_lock);
		if (__atomic_load_n(&s->reg[0], __ATOMIC_ACQUIRE) != CHUNK_REG) {
			rc = fm_ctrl_rdma_reg(&r->sx.ctrl, space, &first, 1, &e);
			if (!rc && e.status != FM_OK)
				rc = -ENOSPC;
			if (!rc)
				chunk_registered(s, 0, &e);
		}
		*rkey = s->keys[0].data;
		pthread_mutex_unlock(&r->reg_lock);
	}
	*data_addr = s->data_addr;
	*npages = s->chunk_pages && s->chunk_pages < s->npages ? s->chunk_pages : s->npages;
	return rc;
}
