// SPDX-License-Identifier: Apache-2.0
/* The client's end of one memd connection: connect, authenticate, exchange frames. */
#include "conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "fm_util.h"

int fm_errmsg(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return 0;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return 0;
}

static void set_timeouts(int fd, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int connect_unix(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	*out = fd;
	return 0;
}

static int connect_tcp(const char *hostport, int *out, int ms)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL, *ai;
	int fd = -1, err = -EINVAL, one = 1;
	size_t hl;

	if (!colon || colon == hostport || !colon[1])
		return -EINVAL;
	hl = (size_t)(colon - hostport);
	if (hl >= sizeof(host))
		return -ENAMETOOLONG;
	memcpy(host, hostport, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
		return -EHOSTUNREACH;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			err = -errno;
			continue;
		}
		/* Bound the connect too: Linux applies SO_SNDTIMEO to a blocking connect(). */
		set_timeouts(fd, ms);
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		err = errno == EINPROGRESS ? -ETIMEDOUT : -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return err;
	/* Requests are small and latency-bound: do not let Nagle hold them. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*out = fd;
	return 0;
}

static uint64_t op_deadline(const struct fm_conn *c)
{
	return c->op_timeout_ms > 0 ? fm_now_ns() + (uint64_t)c->op_timeout_ms * 1000000u : 0;
}

static int past(uint64_t deadline)
{
	return deadline && fm_now_ns() > deadline;
}

/* fm_read_full with the connection's whole-operation deadline. */
static int read_full_dl(struct fm_conn *c, void *buf, size_t len, uint64_t deadline)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = read(c->fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		}
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
		if (len && past(deadline))
			return -ETIMEDOUT;
	}
	return 0;
}

static int send_frame(struct fm_conn *c, uint16_t op, uint32_t count,
		      const struct fm_iov *iov, unsigned niov, uint64_t req_id)
{
	struct iovec v[1 + 16];
	struct fm_hdr h = { .magic = FM_PROTO_MAGIC, .op = op, .req_id = req_id, .count = count };
	size_t total = 0, left;
	unsigned i, nv = 0;
	uint64_t deadline = op_deadline(c);

	if (niov > 16)
		return -E2BIG;
	v[nv++] = (struct iovec){ &h, sizeof(h) };
	for (i = 0; i < niov; i++) {
		if (!iov[i].len)
			continue;
		v[nv++] = (struct iovec){ (void *)iov[i].base, iov[i].len };
		h.len += (uint32_t)iov[i].len;
	}
	total = sizeof(h) + h.len;
	left = total;
	i = 0;
	while (left) {
		struct msghdr m = { .msg_iov = v + i, .msg_iovlen = nv - i };
		ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		}
		left -= (size_t)n;
		if (left && past(deadline))
			return -ETIMEDOUT;
		while (n > 0 && i < nv) {
			if ((size_t)n >= v[i].iov_len) {
				n -= (ssize_t)v[i].iov_len;
				i++;
			} else {
				v[i].iov_base = (char *)v[i].iov_base + n;
				v[i].iov_len -= (size_t)n;
				n = 0;
			}
		}
	}
	return 0;
}

/* Read the reply header, with an fd if memd attached one (SHM_MAP). */
static int recv_hdr(struct fm_conn *c, struct fm_hdr *h, int *rep_fd)
{
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } cm;
	struct iovec v = { h, sizeof(*h) };
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1 };
	size_t got = 0;

	if (rep_fd) {
		*rep_fd = -1;
		m.msg_control = cm.buf;
		m.msg_controllen = sizeof(cm.buf);
	}
	while (got < sizeof(*h)) {
		ssize_t n;
		v.iov_base = (char *)h + got;
		v.iov_len = sizeof(*h) - got;
		n = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		}
		if (n == 0)
			return -ECONNRESET;
		if (rep_fd && m.msg_controllen) {
			struct cmsghdr *cmh = CMSG_FIRSTHDR(&m);
			if (cmh && cmh->cmsg_level == SOL_SOCKET && cmh->cmsg_type == SCM_RIGHTS)
				memcpy(rep_fd, CMSG_DATA(cmh), sizeof(int));
			m.msg_control = NULL;
			m.msg_controllen = 0;
		}
		got += (size_t)n;
	}
	if (h->magic != FM_PROTO_MAGIC)
		return -EPROTO;
	return 0;
}

int fm_conn_send(struct fm_conn *c, uint16_t op, uint32_t count,
		 const struct fm_iov *iov, unsigned niov, uint64_t *req_id)
{
	*req_id = ++c->next_req;
	return send_frame(c, op, count, iov, niov, *req_id);
}

int fm_conn_recvv(struct fm_conn *c, uint16_t op, uint64_t id,
		  const struct fm_iov *rep, unsigned nrep, size_t *rep_len, uint16_t *status,
		  int *rep_fd)
{
	struct fm_hdr h;
	size_t cap = 0, left;
	int err;

	uint64_t deadline = op_deadline(c);

	for (unsigned i = 0; i < nrep; i++)
		cap += rep[i].len;
	err = recv_hdr(c, &h, rep_fd);
	if (err)
		return err;
	if (h.len > FM_MAX_PAYLOAD)
		return -EPROTO;
	if (h.op == FM_OP_ERROR) {
		/* The message is for logs; the status says what happened. */
		char msg[512];
		size_t keep = h.len < sizeof(msg) - 1 ? h.len : sizeof(msg) - 1;
		err = read_full_dl(c, msg, keep, deadline);
		for (left = h.len - keep; !err && left;) {
			size_t k = left < sizeof(msg) ? left : sizeof(msg);
			err = read_full_dl(c, msg, k, deadline);
			left -= k;
		}
		if (err)
			return err;
		msg[keep < sizeof(msg) ? keep : sizeof(msg) - 1] = '\0';
		fm_debug("memd error %u for op %u: %s", h.status, op, msg);
		*status = h.status ? h.status : FM_E_INTERNAL;
		if (rep_len)
			*rep_len = 0;
		return 0;
	}
	if (h.req_id != id || h.len > cap)
		return -EPROTO;
	left = h.len;
	for (unsigned i = 0; i < nrep && left; i++) {
		size_t k = left < rep[i].len ? left : rep[i].len;
		err = read_full_dl(c, (void *)rep[i].base, k, deadline);
		if (err)
			return err;
		left -= k;
	}
	if (rep_len)
		*rep_len = h.len;
	*status = h.status;
	return 0;
}

int fm_conn_callv(struct fm_conn *c, uint16_t op, uint32_t count,
		  const struct fm_iov *iov, unsigned niov,
		  const struct fm_iov *rep, unsigned nrep, size_t *rep_len, uint16_t *status,
		  int *rep_fd)
{
	uint64_t id;
	int err = fm_conn_send(c, op, count, iov, niov, &id);

	if (err)
		return err;
	return fm_conn_recvv(c, op, id, rep, nrep, rep_len, status, rep_fd);
}

int fm_conn_call(struct fm_conn *c, uint16_t op, uint32_t count,
		 const struct fm_iov *iov, unsigned niov,
		 void *rep, size_t rep_cap, size_t *rep_len, uint16_t *status,
		 int *rep_fd)
{
	struct fm_iov r = { rep, rep_cap };
	return fm_conn_callv(c, op, count, iov, niov, &r, 1, rep_len, status, rep_fd);
}

int fm_conn_open(struct fm_conn *c, const struct fm_xport_cfg *cfg, char *err, size_t errlen)
{
	struct fm_hello_req hreq = { .min_version = FM_PROTO_VERSION, .max_version = FM_PROTO_VERSION };
	struct fm_hello_rep hrep;
	struct fm_auth_req areq;
	struct fm_auth_rep arep;
	uint8_t want[FM_MAC_LEN];
	const char *a = cfg->addr;
	size_t len;
	uint16_t st;
	int rc;

	memset(c, 0, sizeof(*c));
	c->fd = -1;
	if (fm_auth_init(err, errlen))
		return -ELIBACC;
	if (strncmp(a, "unix:", 5) == 0) {
		c->is_unix = 1;
		rc = connect_unix(a + 5, &c->fd);
	} else {
		rc = connect_tcp(strncmp(a, "tcp:", 4) == 0 ? a + 4 : a, &c->fd,
				 cfg->timeout_ms > 0 ? cfg->timeout_ms : 10000);
	}
	if (rc) {
		fm_errmsg(err, errlen, "cannot connect to memd at %s: %s", a, strerror(-rc));
		return rc;
	}
	set_timeouts(c->fd, cfg->timeout_ms > 0 ? cfg->timeout_ms : 10000);

	rc = fm_random(hreq.client_nonce, sizeof(hreq.client_nonce));
	if (rc)
		goto fail_msg;
	rc = fm_conn_call(c, FM_OP_HELLO, 0, &(struct fm_iov){ &hreq, sizeof(hreq) }, 1,
			  &hrep, sizeof(hrep), &len, &st, NULL);
	if (rc)
		goto fail_msg;
	if (st || len != sizeof(hrep)) {
		fm_errmsg(err, errlen, "memd at %s refused the handshake (status %u%s)", a, st,
			  st == FM_E_VERSION ? ": no common protocol version" : "");
		rc = -EPROTO;
		goto fail;
	}
	c->server_flags = hrep.flags;
	fm_auth_client_mac(cfg->secret, cfg->secret_len, hrep.server_nonce, hreq.client_nonce, areq.mac);
	rc = fm_conn_call(c, FM_OP_AUTH, 0, &(struct fm_iov){ &areq, sizeof(areq) }, 1,
			  &arep, sizeof(arep), &len, &st, NULL);
	if (rc == -ECONNRESET || (!rc && st == FM_E_AUTH)) {
		fm_errmsg(err, errlen, "memd at %s rejected our secret (authentication failed)", a);
		rc = -EACCES;
		goto fail;
	}
	if (rc)
		goto fail_msg;
	fm_auth_server_mac(cfg->secret, cfg->secret_len, hrep.server_nonce, hreq.client_nonce, want);
	if (st || len != sizeof(arep) || !fm_auth_mac_equal(want, arep.mac)) {
		fm_errmsg(err, errlen, "memd at %s could not prove it knows the secret", a);
		rc = -EACCES;
		goto fail;
	}
	return 0;

fail_msg:
	fm_errmsg(err, errlen, "memd at %s: handshake failed: %s", a, strerror(-rc));
fail:
	fm_conn_close(c);
	return rc;
}

void fm_conn_close(struct fm_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}
