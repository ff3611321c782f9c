// SPDX-License-Identifier: Apache-2.0
/*
 * The stream transport: the request/response protocol over TCP or a Unix
 * socket. Each channel has its own connection, joined to the control
 * connection's session; every call is one request and its reply, sent and
 * awaited by a deadline. After a failure the channel's connection is closed
 * (a late reply would put it out of step) and made again on the next call.
 */
#include "ops.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "ctrl.h"
#include "fm_util.h"

struct stream_chan {
	struct fm_chan base;
	struct fm_conn conn;                     /* fd -1: made again on the next call */
	uint8_t *buf;                            /* READ replies: FM_MAX_BATCH pages */
	struct fm_page_status st[FM_MAX_BATCH];
	struct fm_write_ent ents[FM_MAX_BATCH];
	struct fm_copy_ent cents[FM_MAX_BATCH];
	struct fm_space_ref ref;
	struct fm_iov iov[FM_CONN_MAX_IOV];
};

static struct fm_session_xport *to_sx(struct fm_xport *x) { return (struct fm_session_xport *)x; }
static struct stream_chan *to_chan(struct fm_chan *c) { return (struct stream_chan *)c; }

static int stream_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	return fm_session_xport_space_open(x, npages, space_id, NULL);
}

static void stream_close(struct fm_xport *x) { fm_session_xport_free(to_sx(x)); }

static void stream_chan_close(struct fm_chan *c)
{
	struct stream_chan *sc = to_chan(c);

	fm_conn_close(&sc->conn);
	free(sc->buf);
	free(sc);
}

static int stream_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct stream_chan *sc = calloc(1, sizeof(*sc));
	char err[256];
	int rc;

	if (!sc)
		return -ENOMEM;
	sc->base.x = x;
	sc->conn.fd = -1;
	sc->buf = aligned_alloc(FM_PAGE_SIZE, (size_t)FM_MAX_BATCH * FM_PAGE_SIZE);
	if (!sc->buf) {
		stream_chan_close(&sc->base);
		return -ENOMEM;
	}
	rc = fm_ctrl_join(&to_sx(x)->ctrl, &sc->conn, fm_deadline_in(x->timeout_ms), err, sizeof(err));
	sc->conn.spin_ns = x->spin_us * 1000u;
	if (rc) {
		if (!x->quiet)
			fm_err("%s", err);
		stream_chan_close(&sc->base);
		return rc;
	}
	*out = &sc->base;
	return 0;
}

/* Say once per call why memd failed us, unless a parent (several memds) speaks for this one. */
static int report(struct stream_chan *sc, int rc)
{
	struct fm_xport *x = sc->base.x;

	if (!x->quiet && rc == -ETIMEDOUT)
		fm_err("memd at %s did not answer within %d ms", x->addr, x->timeout_ms);
	return rc;
}

static int stream_start(struct fm_chan *c, const struct fm_req *rq, uint64_t deadline)
{
	struct stream_chan *sc = to_chan(c);
	struct fm_session_xport *s = to_sx(c->x);
	struct fm_iov *iov = sc->iov;
	unsigned niov = 2;
	int rc;

	if (sc->conn.fd < 0) {
		if (atomic_load(&s->ctrl.dead))
			return -EPIPE;
		rc = fm_ctrl_join(&s->ctrl, &sc->conn, deadline, NULL, 0);
		if (rc)
			return report(sc, rc);
		sc->conn.spin_ns = c->x->spin_us * 1000u;
	}
	sc->ref.space_id = rq->space;
	iov[0] = (struct fm_iov){ &sc->ref, sizeof(sc->ref) };
	switch (rq->op) {
	case FM_OP_READ:
		iov[1] = (struct fm_iov){ rq->pages, rq->n * sizeof(uint64_t) };
		break;
	case FM_OP_DISCARD:
		iov[1] = (struct fm_iov){ rq->ranges, rq->n * sizeof(rq->ranges[0]) };
		break;
	case FM_OP_WRITE:
		for (unsigned i = 0; i < rq->n; i++)
			sc->ents[i] = (struct fm_write_ent){
				.page = rq->pages[i],
				.crc = rq->crc ? rq->crc[i] : fm_crc32c(rq->data[i], FM_PAGE_SIZE) };
		iov[1] = (struct fm_iov){ sc->ents, rq->n * sizeof(sc->ents[0]) };
		/* Page data goes out from where it lies, no staging copy; pages that follow each other share a piece. */
		for (unsigned i = 0; i < rq->n; niov++) {
			const uint8_t *start = rq->data[i];
			size_t run = FM_PAGE_SIZE;
			for (i++; i < rq->n && (const uint8_t *)rq->data[i] == start + run; i++)
				run += FM_PAGE_SIZE;
			iov[niov] = (struct fm_iov){ start, run };
		}
		break;
	case FM_OP_COPY:
		rc = fm_conn_copy_send(&sc->conn, rq->space, rq->pages, rq->dst, rq->dpages, rq->n, sc->cents,
				       deadline);
		return rc == -EOPNOTSUPP ? rc : report(sc, rc);
	default:
		return -EINVAL;
	}
	return report(sc, fm_conn_send(&sc->conn, rq->op, rq->n, iov, niov, deadline));
}

static int finish_read(struct stream_chan *sc, const struct fm_req *rq, uint64_t deadline)
{
	/* Statuses into their array, pages straight into the aligned buffer: no extra copy. */
	struct fm_iov rep[2] = { { sc->st, rq->n * sizeof(sc->st[0]) },
				 { sc->buf, (size_t)rq->n * FM_PAGE_SIZE } };
	size_t len;
	uint16_t st;
	int rc = fm_conn_recv(&sc->conn, rep, 2, &len, &st, NULL, deadline);

	if (rc)
		return report(sc, rc);
	if (st == FM_E_RANGE || st == FM_E_NOSPACE)
		return -ERANGE;
	if (st || len != rq->n * (sizeof(sc->st[0]) + FM_PAGE_SIZE)) {
		fm_conn_close(&sc->conn);
		return -EPROTO;
	}
	for (unsigned i = 0; i < rq->n; i++) {
		const uint8_t *d = sc->buf + (size_t)i * FM_PAGE_SIZE;
		uint32_t ps = sc->st[i].status;

		if (ps == FM_OK && fm_crc32c(d, FM_PAGE_SIZE) != sc->st[i].crc)
			ps = FM_E_CRC;
		if (ps != FM_OK && ps != FM_E_ABSENT && ps != FM_E_CRC)
			return -EPROTO;
		if (rq->status)
			rq->status[i] = ps;
		else if (ps != FM_OK)
			return ps == FM_E_ABSENT ? -ENOENT : -EIO;
		if (ps == FM_OK)
			rq->src[i] = d;
	}
	return 0;
}

static int finish_write(struct stream_chan *sc, const struct fm_req *rq, uint64_t deadline)
{
	struct fm_iov rep = { rq->status, rq->n * sizeof(uint32_t) };
	size_t len;
	uint16_t st;
	int rc = fm_conn_recv(&sc->conn, &rep, 1, &len, &st, NULL, deadline);

	if (rc)
		return report(sc, rc);
	if (st == FM_E_FULL) {
		for (unsigned i = 0; i < rq->n; i++)
			rq->status[i] = FM_E_FULL;
		return 0;
	}
	if (st == FM_E_RANGE || st == FM_E_NOSPACE)
		return -ERANGE;
	if (st || len != rq->n * sizeof(uint32_t))
		return -EPROTO;
	for (unsigned i = 0; i < rq->n; i++)
		if (rq->status[i] != FM_OK && rq->status[i] != FM_E_FULL)
			return -EPROTO;
	return 0;
}

static int stream_finish(struct fm_chan *c, const struct fm_req *rq, uint64_t deadline)
{
	struct stream_chan *sc = to_chan(c);
	size_t len;
	uint16_t st;
	int rc;

	switch (rq->op) {
	case FM_OP_READ:
		return finish_read(sc, rq, deadline);
	case FM_OP_WRITE:
		return finish_write(sc, rq, deadline);
	case FM_OP_COPY:
		rc = fm_conn_copy_recv(&sc->conn, rq->n, rq->status, deadline);
		return rc == -EOPNOTSUPP || rc == -ENOENT || rc == -EPROTO ? rc : report(sc, rc);
	case FM_OP_DISCARD:
		rc = fm_conn_recv(&sc->conn, NULL, 0, &len, &st, NULL, deadline);
		if (rc)
			return report(sc, rc);
		return !st ? 0 : st == FM_E_RANGE ? -ERANGE : -EPROTO;
	}
	return -EINVAL;
}

/* start, then finish, by one deadline. */
static int stream_call(struct fm_chan *c, const struct fm_req *rq)
{
	uint64_t deadline = fm_deadline_in(c->x->timeout_ms);
	int rc = stream_start(c, rq, deadline);

	return rc ? rc : stream_finish(c, rq, deadline);
}

static int stream_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		       const void **src)
{
	return stream_call(c, &(struct fm_req){ .op = FM_OP_READ, .space = space, .n = n, .pages = pages,
						 .src = src });
}

static int stream_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
			const void *const *data, uint32_t *status)
{
	/* memd's control connection hung up: it is gone, do not trust it with a page. */
	if (!fm_ctrl_alive(&to_sx(c->x)->ctrl))
		return -EPIPE;
	return stream_call(c, &(struct fm_req){ .op = FM_OP_WRITE, .space = space, .n = n, .pages = pages,
						 .data = data, .status = status });
}

static int stream_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		       const uint64_t *dpages, unsigned n, uint32_t *status)
{
	/* A copy makes pages that only memd holds: the same rule as a write. */
	if (!fm_ctrl_alive(&to_sx(c->x)->ctrl))
		return -EPIPE;
	return stream_call(c, &(struct fm_req){ .op = FM_OP_COPY, .space = src, .dst = dst, .n = n,
						 .pages = spages, .dpages = dpages, .status = status });
}

/* The reply lands in the channel's READ buffer: GETs are at most FM_MAX_BATCH pages. */
static int stream_edit(struct fm_chan *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
		       const void *put, size_t put_len, size_t get_len, const void **get)
{
	struct stream_chan *sc = to_chan(c);
	uint64_t deadline = fm_deadline_in(c->x->timeout_ms);
	int rc;

	/* An edit makes pages that only memd holds: the same rule as a write. */
	if (!fm_ctrl_alive(&to_sx(c->x)->ctrl))
		return -EPIPE;
	if (get_len > (size_t)FM_MAX_BATCH * FM_PAGE_SIZE)
		return -E2BIG;
	if (sc->conn.fd < 0) {
		if (atomic_load(&to_sx(c->x)->ctrl.dead))
			return -EPIPE;
		rc = fm_ctrl_join(&to_sx(c->x)->ctrl, &sc->conn, deadline, NULL, 0);
		if (rc)
			return report(sc, rc);
	}
	sc->ref = (struct fm_space_ref){ .space_id = space };
	rc = fm_conn_edit_send(&sc->conn, &sc->ref, e, n, put, put_len, deadline);
	if (!rc)
		rc = fm_conn_edit_recv(&sc->conn, sc->buf, get_len, deadline);
	if (!rc)
		*get = sc->buf;
	return rc == -ETIMEDOUT ? report(sc, rc) : rc;
}

static int stream_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	return stream_call(c, &(struct fm_req){ .op = FM_OP_DISCARD, .space = space, .n = n, .ranges = r });
}

static const struct fm_xport_ops stream_ops = {
	.space_open = stream_space_open,
	.space_close = fm_session_xport_space_close,
	.stats = fm_session_xport_stats,
	.alive = fm_session_xport_alive,
	.hangup = fm_session_xport_hangup,
	.close = stream_close,
	.chan_open = stream_chan_open,
	.chan_close = stream_chan_close,
	.read = stream_read,
	.write = stream_write,
	.copy = stream_copy,
	.discard = stream_discard,
	.edit = stream_edit,
	.start = stream_start,
	.finish = stream_finish,
};

int fm_stream_connect(const struct fm_xport_cfg *cfg, int child, struct fm_xport **out, char *err,
		      size_t errlen)
{
	struct fm_session_xport *sx;
	int rc = fm_session_xport_new(sizeof(*sx), cfg, cfg->addr, FM_XPORT_STREAM, &stream_ops, &sx, err, errlen);

	if (rc)
		return rc;
	sx->base.quiet = sx->ctrl.quiet = child;
	*out = &sx->base;
	return 0;
}
