// SPDX-License-Identifier: Apache-2.0
/*
 * memd's RDMA side (--rdma ADDR:PORT). One thread runs a librdmacm listener:
 * it accepts RC connections and gives each its own QP, then takes no further
 * part in the data path: clients read and write spaces with one-sided verbs.
 *
 * A client learns a region (address, rkey, length) only through RDMA_MAP and
 * RDMA_REG on its authenticated TCP control connection (same port number,
 * docs/protocol.md "RDMA"); a region is a chunk of the space's own mapping of
 * its memfd, registered with ibv_reg_mr (which pins it) in the protection
 * domain of the client's session.
 * A QP is accepted only with that session's id and key in its connect private
 * data, and is created in the same domain: an rkey is worthless on any other
 * session's QPs. SPACE_CLOSE deregisters (unpins) the regions; the session's
 * end frees the domain. A QP that touches memory with a wrong rkey, out of
 * range, or in a deregistered region is moved to the error state by the
 * device; the client sees its QP fail, and when it disconnects or exits we
 * tear down that QP alone.
 */
#include "server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fm_util.h"

/* One accepted QP: it holds a reference to its session (and so to the domain). */
struct rconn {
	struct rdma_cm_id *id;
	struct memd_session *sess;
	struct rconn *prev, *next;
};

static struct {
	struct memd_store *st;
	struct rdma_event_channel *ec;
	struct rdma_cm_id *lid;
	struct ibv_cq *cq;            /* shared by every QP: memd posts nothing, it never polls */
	pthread_t th;
	int stop_fd[2];
	int running;
	pthread_mutex_t lock;         /* conns, counters, domain allocation */
	struct rconn *conns;
	unsigned long accepted, lost;
} R = { .lock = PTHREAD_MUTEX_INITIALIZER, .stop_fd = { -1, -1 } };

/* The domain in *slot, allocated on first use; NULL with errno set. */
static struct ibv_pd *slot_pd(void **slot)
{
	struct ibv_pd *pd;

	pthread_mutex_lock(&R.lock);
	if (!*slot)
		*slot = ibv_alloc_pd(R.lid->verbs);
	pd = *slot;
	pthread_mutex_unlock(&R.lock);
	if (!pd && !errno)
		errno = ENOMEM;
	return pd;
}

static int rdma_reg(void **pd_slot, void *addr, size_t len, void **mr_out, uint32_t *rkey)
{
	struct ibv_pd *pd;
	struct ibv_mr *mr;

	if (!R.running)
		return -EOPNOTSUPP;
	pd = slot_pd(pd_slot);
	if (!pd) {
		int e = errno;
		fm_warn("rdma: cannot allocate a protection domain: %s", strerror(e));
		return -e;
	}
	/* Pins it until SPACE_CLOSE or the session's end. */
	mr = ibv_reg_mr(pd, addr, len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!mr) {
		int e = errno;
		fm_warn("rdma: cannot register %zu bytes: %s", len, strerror(e));
		return -e;
	}
	*mr_out = mr;
	*rkey = mr->rkey;
	return 0;
}

static void rdma_dereg(void *mr)
{
	int e = ibv_dereg_mr(mr);

	if (e)
		fm_warn("rdma: deregistering a closed space's region failed: %s", strerror(e));
	else
		fm_debug("rdma: a closed space's region is deregistered");
}

static void rdma_pd_free(void *pd)
{
	int e = ibv_dealloc_pd(pd);

	if (e)
		fm_warn("rdma: freeing an ended session's protection domain failed: %s", strerror(e));
}

static const struct memd_rdma_ops rdma_ops = { .reg = rdma_reg, .dereg = rdma_dereg, .pd_free = rdma_pd_free };

static void drop_conn(struct rdma_cm_id *id, const char *why)
{
	struct rconn *c = id->context;

	if (id->qp)
		rdma_destroy_qp(id);
	rdma_destroy_id(id);
	pthread_mutex_lock(&R.lock);
	R.lost++;
	if (c) {
		if (c->prev)
			c->prev->next = c->next;
		else
			R.conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
	}
	pthread_mutex_unlock(&R.lock);
	if (c) {
		/* The last reference of an ended session frees its domain here. */
		memd_session_put(R.st, c->sess);
		free(c);
	}
	fm_info("rdma: connection closed (%s)", why);
}

static void reject(struct rdma_cm_id *id, const char *why)
{
	fm_warn("rdma: connection rejected: %s", why);
	rdma_reject(id, NULL, 0);
	rdma_destroy_id(id);
}

static void accept_conn(struct rdma_cm_id *id, const void *priv, size_t priv_len)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = R.cq, .recv_cq = R.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = { .responder_resources = 16, .initiator_depth = 0,
				      .rnr_retry_count = 7 };
	struct fm_rdma_conn_priv pd;
	struct ibv_device_attr da;
	struct memd_session *s = NULL;
	struct ibv_pd *dom;
	struct rconn *c;

	if (id->verbs != R.lid->verbs) {
		reject(id, "on another device");
		return;
	}
	if (!priv || priv_len < sizeof(pd)) {
		reject(id, "no session in its private data");
		return;
	}
	memcpy(&pd, priv, sizeof(pd));
	if (pd.magic != FM_RDMA_CONN_MAGIC) {
		reject(id, "no session in its private data");
		return;
	}
	if (memd_session_join(R.st, pd.session.session_id, pd.session.key, &s)) {
		reject(id, "unknown session or wrong session key");
		return;
	}
	c = calloc(1, sizeof(*c));
	dom = c ? slot_pd(memd_session_rdma_pd(s)) : NULL;
	if (!dom) {
		fm_warn("rdma: no protection domain for a connection: %s", strerror(errno ? errno : ENOMEM));
		goto fail;
	}
	if (!ibv_query_device(id->verbs, &da) && da.max_qp_rd_atom < cp.responder_resources)
		cp.responder_resources = (uint8_t)da.max_qp_rd_atom;
	if (rdma_create_qp(id, dom, &qa)) {
		fm_warn("rdma: cannot create a QP: %s", strerror(errno));
		goto fail;
	}
	c->id = id;
	c->sess = s;
	id->context = c;
	pthread_mutex_lock(&R.lock);
	c->next = R.conns;
	if (R.conns)
		R.conns->prev = c;
	R.conns = c;
	pthread_mutex_unlock(&R.lock);
	if (rdma_accept(id, &cp)) {
		fm_warn("rdma: accept: %s", strerror(errno));
		drop_conn(id, "accept failed");
	}
	return;
fail:
	free(c);
	if (id->qp)
		rdma_destroy_qp(id);
	rdma_reject(id, NULL, 0);
	rdma_destroy_id(id);
	memd_session_put(R.st, s);
}

static void *rdma_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd p[2] = { { .fd = R.ec->fd, .events = POLLIN },
				       { .fd = R.stop_fd[0], .events = POLLIN } };
		struct rdma_cm_event *ev;
		struct rdma_cm_id *id;
		enum rdma_cm_event_type t;

		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			break;
		if (rdma_get_cm_event(R.ec, &ev))
			continue;
		id = ev->id;
		t = ev->event;
		if (t == RDMA_CM_EVENT_CONNECT_REQUEST) {
			/*
			 * The private data lives until the ack, and the ack must come
			 * first: rdma_destroy_id (a reject) waits for it.
			 */
			struct fm_rdma_conn_priv pv = { 0 };
			size_t n = 0;
			if (ev->param.conn.private_data) {
				n = ev->param.conn.private_data_len;
				if (n > sizeof(pv))
					n = sizeof(pv);
				memcpy(&pv, ev->param.conn.private_data, n);
			}
			rdma_ack_cm_event(ev);
			accept_conn(id, n ? &pv : NULL, n);
			continue;
		}
		rdma_ack_cm_event(ev);
		switch (t) {
		case RDMA_CM_EVENT_ESTABLISHED:
			pthread_mutex_lock(&R.lock);
			R.accepted++;
			pthread_mutex_unlock(&R.lock);
			fm_debug("rdma: connection established");
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			rdma_disconnect(id);
			drop_conn(id, "peer disconnected");
			break;
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_REJECTED:
			drop_conn(id, rdma_event_str(t));
			break;
		default:
			break;
		}
	}
	return NULL;
}

int memd_rdma_start(const char *spec, struct memd_store *st)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int rc;

	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) {
		fm_err("--rdma: want ADDR:PORT, not '%s'", spec);
		return -EINVAL;
	}
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = 0;
	rc = getaddrinfo(host, colon + 1, &hints, &ai);
	if (rc) {
		fm_err("--rdma %s: %s", spec, gai_strerror(rc));
		return -EINVAL;
	}
	R.ec = rdma_create_event_channel();
	if (!R.ec || rdma_create_id(R.ec, &R.lid, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(R.lid, ai->ai_addr) || rdma_listen(R.lid, 64)) {
		rc = -errno;
		fm_err("--rdma %s: cannot listen (is there an RDMA device on that address?): %s", spec,
		       strerror(errno));
		goto fail;
	}
	if (!R.lid->verbs) {
		rc = -ENODEV;
		fm_err("--rdma %s: bind a specific address (with an RDMA device), not a wildcard", spec);
		goto fail;
	}
	R.st = st;
	R.cq = ibv_create_cq(R.lid->verbs, 64, NULL, NULL, 0);
	if (!R.cq || pipe(R.stop_fd)) {
		rc = -errno;
		fm_err("--rdma %s: %s", spec, strerror(errno));
		goto fail;
	}
	R.running = 1;
	st->rdma = &rdma_ops; /* for good: sessions that end after a stop still free their regions */
	rc = -pthread_create(&R.th, NULL, rdma_main, NULL);
	if (rc) {
		R.running = 0;
		goto fail;
	}
	freeaddrinfo(ai);
	fm_info("rdma: listening on %s (device %s); control over TCP on the same port", spec,
		ibv_get_device_name(R.lid->verbs->device));
	return 0;
fail:
	freeaddrinfo(ai);
	return rc ? rc : -EIO;
}

void memd_rdma_stop(void)
{
	if (!R.running)
		return;
	if (write(R.stop_fd[1], "x", 1) == 1)
		pthread_join(R.th, NULL);
	R.running = 0;
	/* Each QP's session reference goes, so the store can free sessions and their domains. */
	while (R.conns)
		drop_conn(R.conns->id, "memd stopping");
}
