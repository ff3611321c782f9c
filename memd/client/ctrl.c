// SPDX-License-Identifier: Apache-2.0
/* The control connection of a memd session: session, spaces, stats, and the quota grant. */
#include "ctrl.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fm_util.h"

/* Quota is reserved from memd in chunks so that a write rarely needs the control connection. */
#define GRANT_CHUNK 4096
/* After memd grants nothing, ask again only after this long (or after a discard frees room). */
#define QUOTA_BACKOFF_NS (50ull * 1000 * 1000)

static void mark_dead(struct fm_ctrl *c, const char *why)
{
	if (!atomic_exchange(&c->dead, 1) && !c->quiet)
		fm_err("lost memd at %s (%s): evicting stops; pages it held are read back only if their checksums verify",
		       c->peer.addr, why);
}

int fm_ctrl_open(struct fm_ctrl *c, const char *addr, const void *secret, size_t secret_len,
		 int timeout_ms, char *err, size_t errlen)
{
	uint64_t deadline = fm_deadline_in(timeout_ms);
	size_t len;
	uint16_t st;
	int rc;

	memset(c, 0, sizeof(*c));
	c->conn.fd = -1;
	c->timeout_ms = timeout_ms;
	rc = fm_peer_resolve(&c->peer, addr, secret, secret_len, err, errlen);
	if (rc)
		return rc;
	rc = fm_conn_open(&c->conn, &c->peer, deadline, err, errlen);
	if (rc)
		return rc;
	rc = fm_conn_call(&c->conn, FM_OP_SESSION_NEW, 0, NULL, 0, &c->session, sizeof(c->session),
			  &len, &st, NULL, deadline);
	if (!rc && (st || len != sizeof(c->session)))
		rc = -EPROTO;
	if (rc) {
		fm_errmsg(err, errlen, "memd at %s did not open a session: %s", addr,
			  rc == -EPROTO ? "protocol error" : fm_strerror(rc));
		fm_conn_close(&c->conn);
		return rc;
	}
	pthread_mutex_init(&c->lock, NULL);
	return 0;
}

void fm_ctrl_close(struct fm_ctrl *c)
{
	fm_conn_close(&c->conn);
	pthread_mutex_destroy(&c->lock);
}

static int call_locked(struct fm_ctrl *c, uint16_t op, const void *req, size_t reqlen, void *rep,
		       size_t cap, size_t *len, uint16_t *st, int *rep_fd)
{
	int rc = -EPIPE;

	if (c->conn.fd >= 0)
		rc = fm_conn_call(&c->conn, op, 0, &(struct fm_iov){ req, reqlen }, req ? 1 : 0, rep, cap,
				  len, st, rep_fd, fm_deadline_in(c->timeout_ms));
	if (rc)
		mark_dead(c, rc == -ETIMEDOUT ? "no answer in time" : fm_strerror(rc));
	return rc;
}

int fm_ctrl_call(struct fm_ctrl *c, uint16_t op, const void *req, size_t reqlen, void *rep,
		 size_t cap, size_t *len, uint16_t *st, int *rep_fd)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = call_locked(c, op, req, reqlen, rep, cap, len, st, rep_fd);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int fm_ctrl_copy(struct fm_ctrl *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status)
{
	uint64_t deadline = fm_deadline_in(c->timeout_ms);
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = fm_conn_copy_send(&c->conn, src, spages, dst, dpages, n, c->copy_ents, deadline);
	if (!rc)
		rc = fm_conn_copy_recv(&c->conn, n, status, deadline);
	pthread_mutex_unlock(&c->lock);
	if (rc && rc != -EOPNOTSUPP && rc != -ENOENT && rc != -EPROTO)
		mark_dead(c, rc == -ETIMEDOUT ? "no answer in time" : fm_strerror(rc));
	return rc;
}

int fm_ctrl_space_open(struct fm_ctrl *c, uint64_t npages, uint32_t *space_id)
{
	struct fm_space_open_req req = { .npages = npages };
	struct fm_space_open_rep rep;
	size_t len;
	uint16_t st;
	int rc = fm_ctrl_call(c, FM_OP_SPACE_OPEN, &req, sizeof(req), &rep, sizeof(rep), &len, &st, NULL);

	if (rc)
		return rc;
	if (st == FM_E_FULL || st == FM_E_TOOBIG || st == FM_E_RANGE)
		return -ENOSPC;
	if (st || len != sizeof(rep))
		return -EPROTO;
	*space_id = rep.space_id;
	return 0;
}

int fm_ctrl_space_close(struct fm_ctrl *c, uint32_t space_id)
{
	struct fm_space_ref ref = { .space_id = space_id };
	size_t len;
	uint16_t st;

	if (atomic_load(&c->dead))
		return -EPIPE;
	return fm_ctrl_call(c, FM_OP_SPACE_CLOSE, &ref, sizeof(ref), NULL, 0, &len, &st, NULL);
}

int fm_ctrl_stats(struct fm_ctrl *c, struct fm_stats *s)
{
	size_t len;
	uint16_t st;
	int rc = fm_ctrl_call(c, FM_OP_STATS, NULL, 0, s, sizeof(*s), &len, &st, NULL);

	if (!rc && (st || len != sizeof(*s)))
		rc = -EPROTO;
	return rc;
}

int fm_ctrl_join(struct fm_ctrl *c, struct fm_conn *conn, uint64_t deadline, char *err, size_t errlen)
{
	size_t len;
	uint16_t st;
	int rc = fm_conn_open(conn, &c->peer, deadline, err, errlen);

	if (rc)
		return rc;
	rc = fm_conn_call(conn, FM_OP_SESSION_JOIN, 0, &(struct fm_iov){ &c->session, sizeof(c->session) }, 1,
			  NULL, 0, &len, &st, NULL, deadline);
	if (!rc && st)
		rc = -EACCES;
	if (rc) {
		fm_errmsg(err, errlen, "memd at %s did not let a channel join the session: %s", c->peer.addr,
			  fm_strerror(rc));
		fm_conn_close(conn);
	}
	return rc;
}

int fm_ctrl_alive(struct fm_ctrl *c)
{
	struct pollfd p = { .fd = c->conn.fd, .events = POLLIN | POLLRDHUP };

	if (atomic_load(&c->dead))
		return 0;
	if (fm_sys_poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))) {
		mark_dead(c, "its connection closed");
		return 0;
	}
	return 1;
}

void fm_ctrl_hangup(struct fm_ctrl *c)
{
	atomic_store(&c->dead, 1);
	/* shutdown, not close: another thread may be in a call on this fd. */
	if (c->conn.fd >= 0)
		shutdown(c->conn.fd, SHUT_RDWR);
}

/*
 * A page new to memd takes one page of this session's grant. When the local
 * share runs out, ask memd for another chunk; it grants what its capacity and
 * our quota allow, possibly nothing, and the page then stays with the pager.
 */
int fm_ctrl_take_grant(struct fm_ctrl *c)
{
	struct fm_quota_req q = { .delta_pages = GRANT_CHUNK };
	struct fm_quota_rep r;
	size_t len;
	uint16_t st;

	if (atomic_fetch_sub(&c->grant_avail, 1) > 0)
		return 1;
	atomic_fetch_add(&c->grant_avail, 1);
	/* memd said it was full a moment ago: do not ask again for every page. */
	if (fm_now_ns() < atomic_load(&c->full_until_ns))
		return 0;
	pthread_mutex_lock(&c->lock);
	if (atomic_load(&c->grant_avail) <= 0 &&
	    call_locked(c, FM_OP_QUOTA, &q, sizeof(q), &r, sizeof(r), &len, &st, NULL) == 0 && !st &&
	    len == sizeof(r) && r.granted_pages > c->granted_total) {
		atomic_fetch_add(&c->grant_avail, (int_fast64_t)(r.granted_pages - c->granted_total));
		c->granted_total = r.granted_pages;
	} else if (atomic_load(&c->grant_avail) <= 0) {
		atomic_store(&c->full_until_ns, fm_now_ns() + QUOTA_BACKOFF_NS);
	}
	pthread_mutex_unlock(&c->lock);
	if (atomic_fetch_sub(&c->grant_avail, 1) > 0)
		return 1;
	atomic_fetch_add(&c->grant_avail, 1);
	return 0;
}

void fm_ctrl_return_grant(struct fm_ctrl *c, uint64_t pages)
{
	atomic_fetch_add(&c->grant_avail, (int_fast64_t)pages);
	if (pages)
		atomic_store(&c->full_until_ns, 0);
}

/* ---- a transport over one memd session ---------------------------------------- */

static struct fm_session_xport *to_sx(struct fm_xport *x) { return (struct fm_session_xport *)x; }

int fm_session_xport_new(size_t size, const struct fm_xport_cfg *cfg, const char *ctrl_addr, int kind,
			 const struct fm_xport_ops *ops, struct fm_session_xport **out, char *err,
			 size_t errlen)
{
	struct fm_session_xport *sx = calloc(1, size);
	int rc;

	if (!sx)
		return -ENOMEM;
	rc = fm_ctrl_open(&sx->ctrl, ctrl_addr, cfg->secret, cfg->secret_len, cfg->timeout_ms, err, errlen);
	if (rc) {
		free(sx);
		return rc;
	}
	fm_xport_init(&sx->base, ops, kind, cfg->addr, cfg->timeout_ms);
	sx->base.spin_us = cfg->spin_us;
	sx->base.can_copy = !!(sx->ctrl.conn.server_flags & FM_HELLO_F_COPY);
	*out = sx;
	return 0;
}

void fm_session_xport_free(struct fm_session_xport *sx)
{
	fm_ctrl_close(&sx->ctrl);
	free(sx);
}

int fm_session_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id,
				int (*map)(struct fm_xport *x, uint32_t id, uint64_t npages))
{
	struct fm_ctrl *c = &to_sx(x)->ctrl;
	uint32_t id;
	int rc = fm_ctrl_space_open(c, npages, &id);

	if (rc)
		return rc;
	rc = map ? map(x, id, npages) : 0;
	if (rc) {
		fm_ctrl_space_close(c, id);
		return rc;
	}
	*space_id = id;
	return 0;
}

int fm_session_xport_space_close(struct fm_xport *x, uint32_t space_id)
{
	return fm_ctrl_space_close(&to_sx(x)->ctrl, space_id);
}

int fm_session_xport_stats(struct fm_xport *x, struct fm_stats *st) { return fm_ctrl_stats(&to_sx(x)->ctrl, st); }
int fm_session_xport_alive(struct fm_xport *x) { return fm_ctrl_alive(&to_sx(x)->ctrl); }
void fm_session_xport_hangup(struct fm_xport *x) { fm_ctrl_hangup(&to_sx(x)->ctrl); }

/*
 * One request about a space: ref, then n items of size each; the reply into
 * out (cap bytes). 0 and *len, *st; else the connection failed (memd lost).
 */
static int space_call(struct fm_ctrl *c, uint16_t op, uint32_t space_id, const void *items, size_t size,
		      unsigned n, void *out, size_t cap, size_t *len, uint16_t *st)
{
	struct fm_space_ref ref = { .space_id = space_id };
	struct fm_iov iov[2] = { { &ref, sizeof(ref) }, { items, n * size } };
	int rc = -EPIPE;

	pthread_mutex_lock(&c->lock);
	if (c->conn.fd >= 0)
		rc = fm_conn_call(&c->conn, op, n, iov, 2, out, cap, len, st, NULL, fm_deadline_in(c->timeout_ms));
	pthread_mutex_unlock(&c->lock);
	if (rc)
		mark_dead(c, rc == -ETIMEDOUT ? "no answer in time" : fm_strerror(rc));
	return rc;
}

int fm_ctrl_shm_alloc(struct fm_ctrl *c, uint32_t space_id, const struct fm_range *r, unsigned n)
{
	size_t len;
	uint16_t st;
	int rc = space_call(c, FM_OP_SHM_ALLOC, space_id, r, sizeof(*r), n, NULL, 0, &len, &st);

	if (rc)
		return rc;
	if (st == FM_E_FULL)
		return -ENOSPC;
	return st ? -EPROTO : 0;
}

int fm_ctrl_rdma_reg(struct fm_ctrl *c, uint32_t space_id, const uint64_t *chunks, unsigned n,
		     struct fm_rdma_reg_ent *out)
{
	size_t len;
	uint16_t st;
	int rc;

	/* memd refused a chunk a moment ago: do not ask again for every batch. */
	if (fm_now_ns() < atomic_load(&c->full_until_ns))
		return -ENOSPC;
	rc = space_call(c, FM_OP_RDMA_REG, space_id, chunks, sizeof(*chunks), n, out, n * sizeof(*out), &len, &st);
	if (rc)
		return rc;
	if (st || len != n * sizeof(*out))
		return -EPROTO;
	for (unsigned i = 0; i < n; i++)
		if (out[i].status == FM_E_FULL)
			atomic_store(&c->full_until_ns, fm_now_ns() + QUOTA_BACKOFF_NS);
	return 0;
}

int fm_ctrl_rdma_unreg(struct fm_ctrl *c, uint32_t space_id, const uint64_t *chunks, unsigned n)
{
	size_t len;
	uint16_t st;
	int rc = space_call(c, FM_OP_RDMA_UNREG, space_id, chunks, sizeof(*chunks), n, NULL, 0, &len, &st);

	if (rc)
		return rc;
	if (st || len)
		return -EPROTO;
	/* Their memory is memd's again: a chunk refused as full a moment ago may fit now. */
	atomic_store(&c->full_until_ns, 0);
	return 0;
}
