// SPDX-License-Identifier: Apache-2.0
/*
 * memd's protocol engine for one connection: frame validation, the
 * handshake state machine, the ops, and non-blocking buffered I/O.
 *
 * Requests are run strictly in arrival order and every reply is queued
 * behind the previous one, which is what lets clients pipeline. Reading
 * stops while MEMD_TX_HIGH bytes of replies wait, so a client that sends
 * without reading costs memd a bounded amount of memory and nothing else.
 */
#include "server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "auth.h"
#include "fm_util.h"

#define HDR_LEN   sizeof(struct fm_hdr)
#define RX_MIN    (64u << 10)
#define TX_CHUNK  (64u << 10)
#define IOV_MAX_GATHER 16

/* ---- frame validation ------------------------------------------------- */

struct op_shape {
	uint32_t fixed;     /* payload bytes before the items */
	uint32_t item;      /* payload bytes per counted item; 0: count must be 0 */
	uint32_t max_count;
	const char *name;
	bool tail;          /* bytes may follow the items (EDIT's PUT data): the op checks how many */
};

static const struct op_shape op_shapes[] = {
	[FM_OP_HELLO]        = { sizeof(struct fm_hello_req), 0, 0, "HELLO" },
	[FM_OP_AUTH]         = { sizeof(struct fm_auth_req), 0, 0, "AUTH" },
	[FM_OP_SESSION_NEW]  = { 0, 0, 0, "SESSION_NEW" },
	[FM_OP_SESSION_JOIN] = { sizeof(struct fm_session), 0, 0, "SESSION_JOIN" },
	[FM_OP_SPACE_OPEN]   = { sizeof(struct fm_space_open_req), 0, 0, "SPACE_OPEN" },
	[FM_OP_SPACE_CLOSE]  = { sizeof(struct fm_space_ref), 0, 0, "SPACE_CLOSE" },
	[FM_OP_READ]         = { sizeof(struct fm_space_ref), sizeof(uint64_t),
				 FM_MAX_BATCH, "READ" },
	[FM_OP_WRITE]        = { sizeof(struct fm_space_ref),
				 sizeof(struct fm_write_ent) + FM_PAGE_SIZE, FM_MAX_BATCH, "WRITE" },
	[FM_OP_DISCARD]      = { sizeof(struct fm_space_ref), sizeof(struct fm_range),
				 FM_MAX_RANGES, "DISCARD" },
	[FM_OP_STATS]        = { 0, 0, 0, "STATS" },
	[FM_OP_SHM_MAP]      = { sizeof(struct fm_space_ref), 0, 0, "SHM_MAP" },
	[FM_OP_QUOTA]        = { sizeof(struct fm_quota_req), 0, 0, "QUOTA" },
	[FM_OP_RDMA_MAP]     = { sizeof(struct fm_space_ref), 0, 0, "RDMA_MAP" },
	[FM_OP_COPY]         = { sizeof(struct fm_copy_req), sizeof(struct fm_copy_ent),
				 FM_MAX_BATCH, "COPY" },
	[FM_OP_EDIT]         = { sizeof(struct fm_space_ref), sizeof(struct fm_edit_ent),
				 FM_MAX_EDITS, "EDIT", true },
	[FM_OP_SHM_ALLOC]    = { sizeof(struct fm_space_ref), sizeof(struct fm_range),
				 FM_MAX_RANGES, "SHM_ALLOC" },
	[FM_OP_RDMA_REG]     = { sizeof(struct fm_space_ref), sizeof(uint64_t),
				 FM_MAX_RDMA_REG, "RDMA_REG" },
	[FM_OP_RDMA_UNREG]   = { sizeof(struct fm_space_ref), sizeof(uint64_t),
				 FM_MAX_RDMA_REG, "RDMA_UNREG" },
};

static const struct op_shape *shape_of(uint16_t op)
{
	if (op == 0 || op >= sizeof(op_shapes) / sizeof(op_shapes[0]))
		return NULL;
	return &op_shapes[op];
}

static int verdict(int v, uint16_t st, uint16_t *status, char *msg, size_t msglen,
		   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int verdict(int v, uint16_t st, uint16_t *status, char *msg, size_t msglen,
		   const char *fmt, ...)
{
	va_list ap;

	*status = st;
	va_start(ap, fmt);
	vsnprintf(msg, msglen, fmt, ap);
	va_end(ap);
	return v;
}

int memd_frame_check(const uint8_t raw[sizeof(struct fm_hdr)], int state,
		     struct memd_hdr *h, uint16_t *status, char *msg, size_t msglen)
{
	struct fm_hdr w;
	const struct op_shape *sh;
	uint64_t want;

	memcpy(&w, raw, sizeof(w));
	h->magic = w.magic;
	h->op = w.op;
	h->status = w.status;
	h->req_id = w.req_id;
	h->count = w.count;
	h->len = w.len;
	*status = FM_OK;
	if (msglen)
		msg[0] = '\0';

	/* Without a trusted magic or length the stream cannot be resynchronised. */
	if (h->magic != FM_PROTO_MAGIC)
		return verdict(MEMD_V_CLOSE, FM_E_PROTO, status, msg, msglen,
			       "bad magic 0x%08x", h->magic);
	if (h->len > FM_MAX_PAYLOAD)
		return verdict(MEMD_V_CLOSE, FM_E_TOOBIG, status, msg, msglen,
			       "payload of %u bytes exceeds the limit of %u", h->len,
			       (unsigned)FM_MAX_PAYLOAD);

	/* Nothing but the handshake, in its order, before authentication. */
	if (state == MEMD_C_HELLO && h->op != FM_OP_HELLO) {
		if (h->op == FM_OP_AUTH)
			return verdict(MEMD_V_CLOSE, FM_E_STATE, status, msg, msglen,
				       "AUTH before HELLO");
		return verdict(MEMD_V_CLOSE, FM_E_AUTH, status, msg, msglen,
			       "op %u before authentication", h->op);
	}
	if (state == MEMD_C_AUTH && h->op != FM_OP_AUTH) {
		if (h->op == FM_OP_HELLO)
			return verdict(MEMD_V_CLOSE, FM_E_STATE, status, msg, msglen,
				       "second HELLO");
		return verdict(MEMD_V_CLOSE, FM_E_AUTH, status, msg, msglen,
			       "op %u before authentication", h->op);
	}

	sh = shape_of(h->op);
	if (!sh)
		return verdict(MEMD_V_ERR, FM_E_OP, status, msg, msglen, "unknown op %u", h->op);
	if (sh->item && h->count > sh->max_count)
		return verdict(MEMD_V_ERR, FM_E_TOOBIG, status, msg, msglen,
			       "%s count %u exceeds the limit of %u", sh->name, h->count,
			       sh->max_count);
	if (!sh->item && h->count != 0)
		return verdict(MEMD_V_CLOSE, FM_E_PROTO, status, msg, msglen,
			       "%s with count %u (must be 0)", sh->name, h->count);
	want = sh->fixed + (uint64_t)sh->item * h->count;
	if (sh->tail ? h->len < want : h->len != want)
		return verdict(MEMD_V_CLOSE, FM_E_PROTO, status, msg, msglen,
			       "%s with count %u needs %s%llu payload bytes, not %u", sh->name,
			       h->count, sh->tail ? "at least " : "", (unsigned long long)want, h->len);
	/* A HELLO or AUTH after the handshake is a protocol violation too. */
	if (state == MEMD_C_READY && (h->op == FM_OP_HELLO || h->op == FM_OP_AUTH))
		return verdict(MEMD_V_CLOSE, FM_E_STATE, status, msg, msglen,
			       "%s after authentication", sh->name);
	return MEMD_V_OK;
}

/* ---- buffers ---------------------------------------------------------- */

void memd_conn_init(struct memd_conn *c, struct memd_store *st, const void *secret,
		    size_t secret_len, int fd, bool is_unix)
{
	memset(c, 0, sizeof(*c));
	c->st = st;
	c->secret = secret;
	c->secret_len = secret_len;
	c->fd = fd;
	c->is_unix = is_unix;
	c->state = MEMD_C_HELLO;
	c->born_ns = fm_now_ns();
	__atomic_fetch_add(&st->connections, 1, __ATOMIC_RELAXED);
}

void memd_conn_fini(struct memd_conn *c)
{
	struct memd_txbuf *t, *next;

	memd_session_put(c->st, c->sess);
	c->sess = NULL;
	for (t = c->tx_head; t; t = next) {
		next = t->next;
		if (t->fd >= 0)
			close(t->fd);
		free(t);
	}
	c->tx_head = c->tx_tail = NULL;
	c->tx_bytes = 0;
	free(c->rx);
	c->rx = NULL;
	c->rx_off = c->rx_len = c->rx_cap = 0;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	__atomic_fetch_sub(&c->st->connections, 1, __ATOMIC_RELAXED);
}

/*
 * Room for n bytes at the end of the reply queue. A reply that carries an fd
 * starts a buffer of its own, because the fd travels with the first byte of
 * one sendmsg and must arrive with that reply's header.
 */
static uint8_t *tx_reserve(struct memd_conn *c, size_t n, int fd)
{
	struct memd_txbuf *t = c->tx_tail;
	size_t cap;

	if (fd < 0 && t && t->cap - t->len >= n) {
		uint8_t *p = t->data + t->len;

		t->len += n;
		c->tx_bytes += n;
		return p;
	}
	cap = n > TX_CHUNK / 2 ? n : TX_CHUNK;
	t = malloc(sizeof(*t) + cap);
	if (!t)
		return NULL;
	t->next = NULL;
	t->off = 0;
	t->len = n;
	t->cap = cap;
	t->fd = fd;
	if (c->tx_tail)
		c->tx_tail->next = t;
	else
		c->tx_head = t;
	c->tx_tail = t;
	c->tx_bytes += n;
	return t->data;
}

static uint8_t *reply(struct memd_conn *c, const struct memd_hdr *h, uint32_t count,
		      size_t len, int fd)
{
	struct fm_hdr out = {
		.magic = FM_PROTO_MAGIC,
		.op = h->op,
		.status = FM_OK,
		.req_id = h->req_id,
		.count = count,
		.len = (uint32_t)len,
	};
	uint8_t *p = tx_reserve(c, HDR_LEN + len, fd);

	if (!p)
		return NULL;
	memcpy(p, &out, HDR_LEN);
	return p + HDR_LEN;
}

/* Take back the last reservation (a reply that turned out to be an error). */
static void tx_unreserve(struct memd_conn *c, size_t n)
{
	c->tx_tail->len -= n;
	c->tx_bytes -= n;
}

static int reply_err(struct memd_conn *c, const struct memd_hdr *h, uint16_t status,
		     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int reply_err(struct memd_conn *c, const struct memd_hdr *h, uint16_t status,
		     const char *fmt, ...)
{
	char msg[256];
	struct fm_hdr out;
	va_list ap;
	size_t n;
	uint8_t *p;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n = strlen(msg);
	out = (struct fm_hdr){
		.magic = FM_PROTO_MAGIC,
		.op = FM_OP_ERROR,
		.status = status,
		.req_id = h->req_id,
		.count = 0,
		.len = (uint32_t)n,
	};
	__atomic_fetch_add(&c->st->errors, 1, __ATOMIC_RELAXED);
	fm_debug("fd %d: req %llu op %u: error %u: %s", c->fd,
		 (unsigned long long)h->req_id, h->op, status, msg);
	p = tx_reserve(c, HDR_LEN + n, -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &out, HDR_LEN);
	memcpy(p + HDR_LEN, msg, n);
	return 0;
}

/* ---- ops -------------------------------------------------------------- */

static int op_hello(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_hello_req req;
	struct fm_hello_rep rep;
	uint8_t *p;

	memcpy(&req, pl, sizeof(req));
	if (req.min_version > FM_PROTO_VERSION || req.max_version < FM_PROTO_VERSION ||
	    req.min_version > req.max_version) {
		c->closing = true;
		return reply_err(c, h, FM_E_VERSION,
				 "client speaks versions %u..%u, memd speaks %u",
				 req.min_version, req.max_version, FM_PROTO_VERSION);
	}
	memcpy(c->cnonce, req.client_nonce, FM_NONCE_LEN);
	c->client_flags = req.flags;
	if (fm_random(c->snonce, FM_NONCE_LEN)) {
		c->closing = true;
		return reply_err(c, h, FM_E_INTERNAL, "no randomness for the nonce");
	}
	memset(&rep, 0, sizeof(rep));
	rep.version = FM_PROTO_VERSION;
	rep.flags = (c->is_unix ? FM_HELLO_F_SHM | FM_HELLO_F_ALLOC : 0) | FM_HELLO_F_COPY | FM_HELLO_F_EDIT |
		    FM_HELLO_F_RDMA_REG | FM_HELLO_F_RDMA_UNREG;
	memcpy(rep.server_nonce, c->snonce, FM_NONCE_LEN);
	p = reply(c, h, 0, sizeof(rep), -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &rep, sizeof(rep));
	c->state = MEMD_C_AUTH;
	return 0;
}

/* Who is at the other end of fd, for the log: an address, or a local process by its pid. */
static void peer_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";

	if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
		snprintf(buf, len, "a client with no socket");
		return;
	}
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(buf, len, "tcp:%s:%u", host, ntohs(a->sin_port));
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "tcp:[%s]:%u", host, ntohs(a->sin6_port));
	} else {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
			snprintf(buf, len, "a local process (unix socket, pid %d, uid %u)", (int)cr.pid, cr.uid);
		else
			snprintf(buf, len, "a local process (unix socket)");
	}
}

static int op_auth(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_auth_req req;
	struct fm_auth_rep rep;
	uint8_t want[FM_MAC_LEN];
	uint8_t *p;

	memcpy(&req, pl, sizeof(req));
	fm_auth_client_mac(c->secret, c->secret_len, c->snonce, c->cnonce, want);
	if (!fm_auth_mac_equal(want, req.mac)) {
		c->closing = true;
		char who[160];
		peer_name(c->fd, who, sizeof(who));
		fm_warn("authentication failed from %s", who);
		return reply_err(c, h, FM_E_AUTH, "authentication failed");
	}
	fm_auth_server_mac(c->secret, c->secret_len, c->snonce, c->cnonce, rep.mac);
	p = reply(c, h, 0, sizeof(rep), -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &rep, sizeof(rep));
	c->state = MEMD_C_READY;
	return 0;
}

static int op_session(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_session s;
	uint64_t id;
	uint8_t *p;
	int ret;

	if (c->sess)
		return reply_err(c, h, FM_E_STATE, "connection already has a session");
	if (h->op == FM_OP_SESSION_JOIN) {
		memcpy(&s, pl, sizeof(s));
		ret = memd_session_join(c->st, s.session_id, s.key, &c->sess);
		if (ret)
			return reply_err(c, h, FM_E_AUTH, "no session with this id and key");
		return reply(c, h, 0, 0, -1) ? 0 : -ENOMEM;
	}
	ret = memd_session_new(c->st, &c->sess, &id, s.key);
	s.session_id = id;
	if (ret)
		return reply_err(c, h, FM_E_INTERNAL, "cannot create a session: %s",
				 strerror(-ret));
	p = reply(c, h, 0, sizeof(s), -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &s, sizeof(s));
	return 0;
}

static int op_space_open(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_space_open_req req;
	struct fm_space_open_rep rep = { 0 };
	uint32_t id = 0;
	uint8_t *p;
	int ret;

	memcpy(&req, pl, sizeof(req));
	ret = memd_space_open(c->st, c->sess, req.npages, &id);
	rep.space_id = id;
	if (ret == -ERANGE)
		return reply_err(c, h, FM_E_RANGE, "space of %llu pages: must be 1..%llu",
				 (unsigned long long)req.npages,
				 (unsigned long long)FM_MAX_SPACE_PAGES);
	if (ret == -EMFILE || ret == -ENFILE || ret == -ENOMEM || ret == -ENOSPC)
		return reply_err(c, h, FM_E_FULL, "memd cannot hold another space of %llu pages: %s",
				 (unsigned long long)req.npages, strerror(-ret));
	if (ret)
		return reply_err(c, h, FM_E_INTERNAL, "cannot create a space: %s", strerror(-ret));
	p = reply(c, h, 0, sizeof(rep), -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &rep, sizeof(rep));
	return 0;
}

static int nospace(struct memd_conn *c, const struct memd_hdr *h, uint32_t id)
{
	return reply_err(c, h, FM_E_NOSPACE, "no space %u in this session", id);
}

static int op_space(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_space_ref ref;
	struct memd_space *sp;
	uint8_t *p;
	int ret, fd = -1;

	memcpy(&ref, pl, sizeof(ref));
	if (h->op == FM_OP_SPACE_CLOSE) {
		if (memd_space_close(c->st, c->sess, ref.space_id))
			return nospace(c, h, ref.space_id);
		return reply(c, h, 0, 0, -1) ? 0 : -ENOMEM;
	}
	if ((h->op == FM_OP_SHM_MAP || h->op == FM_OP_SHM_ALLOC) && !c->is_unix)
		return reply_err(c, h, FM_E_NOSHM, "%s needs a Unix-socket connection",
				 h->op == FM_OP_SHM_MAP ? "SHM_MAP" : "SHM_ALLOC");
	sp = memd_space_get(c->st, c->sess, ref.space_id);
	if (!sp)
		return nospace(c, h, ref.space_id);

	switch (h->op) {
	case FM_OP_READ: {
		size_t slen = (size_t)h->count * sizeof(struct fm_page_status);
		size_t len = slen + (size_t)h->count * FM_PAGE_SIZE;

		/* Pages are copied straight into the queued reply. */
		p = reply(c, h, h->count, len, -1);
		ret = -ENOMEM;
		if (!p)
			break;
		ret = memd_space_read(c->st, sp, pl + sizeof(ref), h->count,
				      (struct fm_page_status *)p, p + slen);
		if (ret)
			tx_unreserve(c, HDR_LEN + len);
		break;
	}
	case FM_OP_WRITE: {
		const uint8_t *ents = pl + sizeof(ref);
		const uint8_t *data = ents + (size_t)h->count * sizeof(struct fm_write_ent);
		size_t len = (size_t)h->count * sizeof(uint32_t);

		p = reply(c, h, h->count, len, -1);
		ret = -ENOMEM;
		if (!p)
			break;
		ret = memd_space_write(c->st, sp, (const struct fm_write_ent *)ents, data,
				       h->count, p);
		if (ret)
			tx_unreserve(c, HDR_LEN + len);
		break;
	}
	case FM_OP_DISCARD:
		/* Check before queueing the reply: an error replaces it. */
		ret = memd_space_discard(c->st, sp, (const struct fm_range *)(pl + sizeof(ref)),
					 h->count);
		if (ret == -ERANGE) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_RANGE, "a range leaves space %u", ref.space_id);
		}
		if (!ret && !reply(c, h, 0, 0, -1))
			ret = -ENOMEM;
		break;
	case FM_OP_SHM_ALLOC:
		ret = memd_space_shm_alloc(c->st, sp, (const struct fm_range *)(pl + sizeof(ref)), h->count);
		if (ret == -ERANGE || ret == -EPERM || ret == -ENOSPC) {
			memd_space_put(c->st, sp);
			if (ret == -ERANGE)
				return reply_err(c, h, FM_E_RANGE, "a range leaves space %u", ref.space_id);
			if (ret == -EPERM)
				return reply_err(c, h, FM_E_STATE, "SHM_ALLOC: space %u is not mapped (SHM_MAP)",
						 ref.space_id);
			return reply_err(c, h, FM_E_FULL, "SHM_ALLOC: the session's spaces would hold more "
					 "memory than its grant");
		}
		if (ret && ret != -ENOENT) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_FULL, "SHM_ALLOC: cannot allocate in space %u: %s",
					 ref.space_id, strerror(-ret));
		}
		if (!ret && !reply(c, h, 0, 0, -1))
			ret = -ENOMEM;
		break;
	case FM_OP_RDMA_MAP: {  /* chunks are registered at RDMA_REG, in the session's protection domain */
		struct fm_rdma_map_rep rrep;

		if (c->st->rdma && !(c->client_flags & FM_HELLO_F_RDMA_REG)) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_STATE, "RDMA_MAP: memd registers regions chunk by chunk "
					 "(RDMA_REG) and this client does not: upgrade it");
		}
		ret = memd_space_rdma(c->st, sp, &rrep);
		if (ret == -EBUSY) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_STATE, "RDMA_MAP: space %u is shared by SHM_MAP",
					 ref.space_id);
		}
		if (ret == -EPROTONOSUPPORT) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_NOSHM, "RDMA_MAP: memd keeps spaces in "
					 "identity-mapped memory (--idmap): use the stream operations");
		}
		if (ret == -EOPNOTSUPP) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_NOSHM, "RDMA_MAP: memd has no RDMA listener (--rdma)");
		}
		if (ret && ret != -ENOENT) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_INTERNAL, "RDMA_MAP: cannot register space %u: %s",
					 ref.space_id, strerror(-ret));
		}
		if (ret)
			break;
		p = reply(c, h, 0, sizeof(rrep), -1);
		if (!p) {
			ret = -ENOMEM;
			break;
		}
		memcpy(p, &rrep, sizeof(rrep));
		break;
	}
	case FM_OP_RDMA_REG: {
		size_t len = (size_t)h->count * sizeof(struct fm_rdma_reg_ent);

		p = reply(c, h, h->count, len, -1);
		ret = -ENOMEM;
		if (!p)
			break;
		/* The reply buffer may be unaligned; the entries are packed. */
		ret = memd_space_rdma_reg(c->st, sp, (const uint64_t *)(pl + sizeof(ref)), h->count,
					  (struct fm_rdma_reg_ent *)p);
		if (ret) {
			tx_unreserve(c, HDR_LEN + len);
			if (ret == -EPERM) {
				memd_space_put(c->st, sp);
				return reply_err(c, h, FM_E_STATE, "RDMA_REG: space %u is not RDMA_MAP'd",
						 ref.space_id);
			}
		}
		break;
	}
	case FM_OP_RDMA_UNREG:
		ret = memd_space_rdma_unreg(c->st, sp, (const uint64_t *)(pl + sizeof(ref)), h->count);
		if (ret == -ERANGE || ret == -EPERM) {
			memd_space_put(c->st, sp);
			if (ret == -ERANGE)
				return reply_err(c, h, FM_E_RANGE, "RDMA_UNREG: a chunk out of space %u",
						 ref.space_id);
			return reply_err(c, h, FM_E_STATE, "RDMA_UNREG: space %u is not RDMA_MAP'd", ref.space_id);
		}
		if (!ret && !reply(c, h, 0, 0, -1))
			ret = -ENOMEM;
		break;
	case FM_OP_SHM_MAP: {
		struct fm_shm_map_rep rep;

		ret = memd_space_shm(c->st, sp, &rep, &fd);
		if (ret == -EBUSY) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_STATE, "SHM_MAP: space %u is registered for RDMA",
					 ref.space_id);
		}
		if (ret == -EOPNOTSUPP) {
			memd_space_put(c->st, sp);
			return reply_err(c, h, FM_E_NOSHM, "SHM_MAP: memd keeps spaces in "
					 "identity-mapped memory (--idmap): use the stream operations");
		}
		if (ret)
			break;
		p = reply(c, h, 0, sizeof(rep), fd);
		if (!p) {
			close(fd);
			ret = -ENOMEM;
			break;
		}
		memcpy(p, &rep, sizeof(rep));
		break;
	}
	default:
		ret = -EINVAL;
		break;
	}
	memd_space_put(c->st, sp);
	/* Closed by another connection of the session while we held it. */
	if (ret == -ENOENT)
		return nospace(c, h, ref.space_id);
	return ret;
}

/* Both spaces are looked up in this connection's session only: another session's is no space. */
static int op_copy(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_copy_req req;
	struct memd_space *src, *dst;
	size_t len = (size_t)h->count * sizeof(uint32_t);
	uint8_t *p;
	int ret = -ENOMEM;

	memcpy(&req, pl, sizeof(req));
	src = memd_space_get(c->st, c->sess, req.src_space);
	if (!src)
		return nospace(c, h, req.src_space);
	dst = memd_space_get(c->st, c->sess, req.dst_space);
	if (!dst) {
		memd_space_put(c->st, src);
		return nospace(c, h, req.dst_space);
	}
	p = reply(c, h, h->count, len, -1);
	if (p) {
		ret = memd_space_copy(c->st, src, dst,
				      (const struct fm_copy_ent *)(pl + sizeof(req)), h->count, p);
		if (ret)
			tx_unreserve(c, HDR_LEN + len);
	}
	memd_space_put(c->st, dst);
	memd_space_put(c->st, src);
	/* One of them was closed by another connection of the session meanwhile. */
	if (ret == -ENOENT)
		return reply_err(c, h, FM_E_NOSPACE, "space %u or %u was closed", req.src_space,
				 req.dst_space);
	return ret;
}

/* EDIT: the reply is the GET entries' bytes, so its room is reserved from their lengths first. */
static int op_edit(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_space_ref ref;
	const uint8_t *ents = pl + sizeof(ref);
	size_t items = (size_t)h->count * sizeof(struct fm_edit_ent), gets = 0;
	const uint8_t *put = ents + items;
	size_t put_len = h->len - sizeof(ref) - items;
	struct memd_space *sp;
	uint8_t *p;
	long got;

	memcpy(&ref, pl, sizeof(ref));
	for (uint32_t i = 0; i < h->count; i++) {
		struct fm_edit_ent e;
		memcpy(&e, ents + (size_t)i * sizeof(e), sizeof(e));
		if (e.kind == FM_EDIT_GET && e.len <= FM_PAGE_SIZE)
			gets += e.len;
	}
	if (gets > FM_MAX_PAYLOAD)
		return reply_err(c, h, FM_E_TOOBIG, "EDIT would return %zu bytes, more than %u", gets,
				 (unsigned)FM_MAX_PAYLOAD);
	sp = memd_space_get(c->st, c->sess, ref.space_id);
	if (!sp)
		return nospace(c, h, ref.space_id);
	p = reply(c, h, 0, gets, -1);
	if (!p) {
		memd_space_put(c->st, sp);
		return -ENOMEM;
	}
	got = memd_space_edit(c->st, sp, (const struct fm_edit_ent *)ents, h->count, put, put_len, p, gets);
	memd_space_put(c->st, sp);
	if (got >= 0 && (size_t)got == gets)
		return 0;
	tx_unreserve(c, HDR_LEN + gets);
	switch (got) {
	case -FM_E_RANGE:
		return reply_err(c, h, FM_E_RANGE, "EDIT: an entry's kind or length is bad, a side leaves its page "
				 "or space %u, or the PUT bytes are not %zu", ref.space_id, put_len);
	case -FM_E_TOOBIG:
		return reply_err(c, h, FM_E_TOOBIG, "EDIT touches more than %u pages", (unsigned)FM_MAX_EDIT_PAGES);
	case -FM_E_ABSENT:
		return reply_err(c, h, FM_E_ABSENT, "EDIT reads a page memd does not hold");
	case -FM_E_CRC:
		return reply_err(c, h, FM_E_CRC, "EDIT touches a page whose bytes fail its checksum");
	case -FM_E_FULL:
		return reply_err(c, h, FM_E_FULL, "no room for the pages EDIT would make");
	case -FM_E_NOSPACE:
		return nospace(c, h, ref.space_id);
	default:
		return reply_err(c, h, FM_E_INTERNAL, "EDIT failed (%ld)", got);
	}
}

static int op_stats(struct memd_conn *c, const struct memd_hdr *h)
{
	struct fm_stats s;
	uint8_t *p = reply(c, h, 0, sizeof(s), -1);

	if (!p)
		return -ENOMEM;
	memd_store_stats(c->st, &s);
	memcpy(p, &s, sizeof(s));
	return 0;
}

static int op_quota(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	struct fm_quota_req req;
	struct fm_quota_rep rep;
	uint8_t *p;

	memcpy(&req, pl, sizeof(req));
	rep.granted_pages = memd_quota(c->st, c->sess, req.delta_pages);
	p = reply(c, h, 0, sizeof(rep), -1);
	if (!p)
		return -ENOMEM;
	memcpy(p, &rep, sizeof(rep));
	return 0;
}

static int dispatch(struct memd_conn *c, const struct memd_hdr *h, const uint8_t *pl)
{
	switch (h->op) {
	case FM_OP_HELLO:
		return op_hello(c, h, pl);
	case FM_OP_AUTH:
		return op_auth(c, h, pl);
	case FM_OP_STATS:
		return op_stats(c, h);
	default:
		break;
	}
	if (!c->sess && h->op != FM_OP_SESSION_NEW && h->op != FM_OP_SESSION_JOIN)
		return reply_err(c, h, FM_E_STATE, "no session: send SESSION_NEW or SESSION_JOIN");
	switch (h->op) {
	case FM_OP_SESSION_NEW:
	case FM_OP_SESSION_JOIN:
		return op_session(c, h, pl);
	case FM_OP_SPACE_OPEN:
		return op_space_open(c, h, pl);
	case FM_OP_QUOTA:
		return op_quota(c, h, pl);
	case FM_OP_COPY:
		return op_copy(c, h, pl);
	case FM_OP_EDIT:
		return op_edit(c, h, pl);
	default:
		return op_space(c, h, pl);
	}
}

/* ---- the request loop ------------------------------------------------- */

static size_t rx_avail(const struct memd_conn *c)
{
	return c->rx_len - c->rx_off;
}

/* Payload length announced by a buffered header, or 0 if none is buffered. */
static size_t rx_frame_len(const struct memd_conn *c)
{
	struct fm_hdr w;

	if (rx_avail(c) < HDR_LEN)
		return 0;
	memcpy(&w, c->rx + c->rx_off, HDR_LEN);
	return w.len <= FM_MAX_PAYLOAD ? w.len : 0;
}

/* A whole frame (or a header that will be refused) waits in rx. */
static bool frame_ready(const struct memd_conn *c)
{
	return rx_avail(c) >= HDR_LEN && rx_avail(c) >= HDR_LEN + rx_frame_len(c);
}

static int rx_reserve(struct memd_conn *c, size_t need)
{
	uint8_t *p;

	/* Move the unparsed tail to the front before growing. */
	if (c->rx_off && c->rx_cap - c->rx_off < need) {
		memmove(c->rx, c->rx + c->rx_off, rx_avail(c));
		c->rx_len -= c->rx_off;
		c->rx_off = 0;
	}
	if (c->rx_cap - c->rx_off >= need)
		return 0;
	p = realloc(c->rx, c->rx_off + need);
	if (!p)
		return -ENOMEM;
	c->rx = p;
	c->rx_cap = c->rx_off + need;
	return 0;
}

int memd_conn_feed(struct memd_conn *c, const void *buf, size_t len)
{
	int ret;

	if (!len)
		return 0;
	ret = rx_reserve(c, rx_avail(c) + len);
	if (ret)
		return ret;
	memcpy(c->rx + c->rx_len, buf, len);
	c->rx_len += len;
	return 0;
}

int memd_conn_process(struct memd_conn *c)
{
	int ret = 0;

	while (!c->closing && c->tx_bytes < MEMD_TX_HIGH && rx_avail(c) >= HDR_LEN) {
		struct memd_hdr h;
		uint16_t status;
		char msg[200];
		int v;

		v = memd_frame_check(c->rx + c->rx_off, c->state, &h, &status, msg, sizeof(msg));
		if (v == MEMD_V_CLOSE) {
			/* Nothing after this frame is read: answer, flush, close. */
			c->closing = true;
			ret = reply_err(c, &h, status, "%s", msg);
			break;
		}
		if (rx_avail(c) < HDR_LEN + h.len)
			break;
		if (v == MEMD_V_ERR)
			ret = reply_err(c, &h, status, "%s", msg);
		else
			ret = dispatch(c, &h, c->rx + c->rx_off + HDR_LEN);
		c->rx_off += HDR_LEN + h.len;
		if (ret)
			break;
	}
	if (c->rx_off == c->rx_len) {
		c->rx_off = c->rx_len = 0;
		/* An idle connection keeps a small buffer, not its largest frame. */
		if (c->rx_cap > RX_MIN) {
			free(c->rx);
			c->rx = NULL;
			c->rx_cap = 0;
		}
	}
	return ret;
}

bool memd_conn_wants_read(const struct memd_conn *c)
{
	return !c->closing && !c->eof && c->tx_bytes < MEMD_TX_HIGH;
}

bool memd_conn_wants_write(const struct memd_conn *c)
{
	return c->tx_head != NULL;
}

bool memd_conn_done(const struct memd_conn *c)
{
	if (c->tx_head)
		return false;
	return c->closing || (c->eof && !frame_ready(c));
}

int memd_conn_input(struct memd_conn *c)
{
	for (int i = 0; i < 4 && memd_conn_wants_read(c); i++) {
		size_t need = RX_MIN, room;
		ssize_t n;
		int ret;

		/* Room for the whole frame being received, so that it can complete. */
		if (rx_avail(c) >= HDR_LEN && HDR_LEN + rx_frame_len(c) > need)
			need = HDR_LEN + rx_frame_len(c);
		if (need < rx_avail(c) + 4096)
			need = rx_avail(c) + 4096;
		ret = rx_reserve(c, need);
		if (ret)
			return ret;
		room = c->rx_cap - c->rx_len;
		n = recv(c->fd, c->rx + c->rx_len, room, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			return -errno;
		}
		if (n == 0)
			c->eof = true;
		c->rx_len += (size_t)n;
		ret = memd_conn_process(c);
		if (ret)
			return ret;
		if ((size_t)n < room)
			break;
	}
	return 0;
}

int memd_conn_output(struct memd_conn *c)
{
	while (c->tx_head) {
		struct iovec iov[IOV_MAX_GATHER];
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} cm;
		struct msghdr mh = { 0 };
		struct memd_txbuf *t = c->tx_head;
		int k = 0, pass = -1;
		ssize_t n;

		if (t->fd >= 0 && t->off == 0)
			pass = t->fd;
		for (; t && k < IOV_MAX_GATHER; t = t->next) {
			/* An fd rides on the first byte of a sendmsg: stop before the next one. */
			if (k > 0 && t->fd >= 0)
				break;
			iov[k].iov_base = t->data + t->off;
			iov[k].iov_len = t->len - t->off;
			k++;
		}
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)k;
		if (pass >= 0) {
			struct cmsghdr *ch;

			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.buf;
			mh.msg_controllen = sizeof(cm.buf);
			ch = CMSG_FIRSTHDR(&mh);
			ch->cmsg_level = SOL_SOCKET;
			ch->cmsg_type = SCM_RIGHTS;
			ch->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(ch), &pass, sizeof(int));
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		if (pass >= 0) {
			/* The peer has its own reference now. */
			close(pass);
			c->tx_head->fd = -1;
		}
		c->tx_bytes -= (size_t)n;
		while (n > 0 || (c->tx_head && c->tx_head->off == c->tx_head->len)) {
			t = c->tx_head;
			size_t left = t->len - t->off;

			if ((size_t)n < left) {
				t->off += (size_t)n;
				break;
			}
			n -= (ssize_t)left;
			c->tx_head = t->next;
			if (!c->tx_head)
				c->tx_tail = NULL;
			if (t->fd >= 0)
				close(t->fd);
			free(t);
		}
	}
	return 0;
}

int memd_conn_service(struct memd_conn *c, bool readable)
{
	int ret;

	if (readable) {
		ret = memd_conn_input(c);
		if (ret)
			return ret;
	}
	for (;;) {
		size_t before;

		ret = memd_conn_output(c);
		if (ret)
			return ret;
		/* Frames held back by a full reply queue can run now. */
		if (c->closing || c->tx_bytes >= MEMD_TX_HIGH || !frame_ready(c))
			break;
		before = rx_avail(c);
		ret = memd_conn_process(c);
		if (ret)
			return ret;
		if (rx_avail(c) == before && !c->closing)
			break;
	}
	return 0;
}
