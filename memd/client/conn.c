// SPDX-License-Identifier: Apache-2.0
/* The client's end of one memd connection: connect, authenticate, exchange frames, all by a deadline. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "fm_fds.h"
#include "fm_util.h"

int fm_peer_resolve(struct fm_peer *p, const char *addr, const void *secret, size_t secret_len,
		    char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL, *ai;
	const char *hp, *colon;
	char host[256];
	size_t hl;

	memset(p, 0, sizeof(*p));
	if (secret_len == 0 || secret_len > sizeof(p->secret)) {
		fm_errmsg(err, errlen, "the memd secret must be 1 to %zu bytes", sizeof(p->secret));
		return -EINVAL;
	}
	if (strlen(addr) >= sizeof(p->addr)) {
		fm_errmsg(err, errlen, "memd address too long: %.64s...", addr);
		return -ENAMETOOLONG;
	}
	strcpy(p->addr, addr);
	memcpy(p->secret, secret, secret_len);
	p->secret_len = secret_len;
	if (strncmp(addr, "unix:", 5) == 0) {
		struct sockaddr_un *sa = (struct sockaddr_un *)&p->sa[0];
		if (strlen(addr + 5) >= sizeof(sa->sun_path)) {
			fm_errmsg(err, errlen, "memd socket path too long: %s", addr + 5);
			return -ENAMETOOLONG;
		}
		sa->sun_family = AF_UNIX;
		strcpy(sa->sun_path, addr + 5);
		p->salen[0] = sizeof(*sa);
		p->naddr = 1;
		p->is_unix = 1;
		return 0;
	}
	hp = strncmp(addr, "tcp:", 4) == 0 ? addr + 4 : addr;
	colon = strrchr(hp, ':');
	if (!colon || colon == hp || !colon[1] || (size_t)(colon - hp) >= sizeof(host)) {
		fm_errmsg(err, errlen, "memd address '%s': want unix:PATH, tcp:HOST:PORT or HOST:PORT", addr);
		return -EINVAL;
	}
	hl = (size_t)(colon - hp);
	memcpy(host, hp, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0) {
		fm_errmsg(err, errlen, "cannot connect to memd at %s: no such host", addr);
		return -EHOSTUNREACH;
	}
	for (ai = res; ai && p->naddr < FM_PEER_ADDRS; ai = ai->ai_next) {
		if (ai->ai_addrlen > sizeof(p->sa[0]))
			continue;
		memcpy(&p->sa[p->naddr], ai->ai_addr, ai->ai_addrlen);
		p->salen[p->naddr++] = ai->ai_addrlen;
	}
	freeaddrinfo(res);
	if (!p->naddr) {
		fm_errmsg(err, errlen, "cannot connect to memd at %s: no usable address", addr);
		return -EHOSTUNREACH;
	}
	return 0;
}

/* Wait until fd is ready for ev or the deadline passes. */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		uint64_t now = fm_now_ns();
		struct pollfd p = { .fd = fd, .events = ev };
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		/* Rounded up: a wait that ends early would only come round again. */
		r = fm_sys_poll(&p, 1, (int)((deadline - now + 999999) / 1000000));
		if (r > 0)
			return (p.revents & POLLNVAL) ? -EBADF : 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int connect_one(const struct sockaddr *sa, socklen_t len, int is_unix, uint64_t deadline, int *out)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int one = 1, e = 0;
	socklen_t el = sizeof(e);

	if (fd < 0)
		return -errno;
	fd = fm_fd_keep(fd);
	while (connect(fd, sa, len) < 0) {
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN && is_unix) {
			/* A Unix socket's backlog is full: nothing to poll for, so try again shortly. */
			struct timespec ts = { 0, 1000000 };
			if (fm_now_ns() >= deadline) {
				e = ETIMEDOUT;
				goto fail;
			}
			nanosleep(&ts, NULL);
			continue;
		}
		if (errno != EINPROGRESS) {
			e = errno;
			goto fail;
		}
		e = -wait_fd(fd, POLLOUT, deadline);
		if (!e && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
			e = errno;
		if (e)
			goto fail;
		break;
	}
	/* Requests are small and latency-bound: do not let Nagle hold them. */
	if (!is_unix)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*out = fd;
	return 0;
fail:
	close(fd);
	return -e;
}

/* Move the scatter list v[*i..nv) past n bytes. */
static void advance(struct iovec *v, unsigned nv, unsigned *i, size_t n)
{
	while (n > 0 && *i < nv) {
		if (n >= v[*i].iov_len) {
			n -= v[*i].iov_len;
			(*i)++;
		} else {
			v[*i].iov_base = (char *)v[*i].iov_base + n;
			v[*i].iov_len -= n;
			n = 0;
		}
	}
}

static int send_frame(struct fm_conn *c, uint16_t op, uint32_t count, const struct fm_iov *iov,
		      unsigned niov, uint64_t req_id, uint64_t deadline)
{
	struct iovec *v = c->sendv;
	struct fm_hdr h = { .magic = FM_PROTO_MAGIC, .op = op, .req_id = req_id, .count = count };
	unsigned i = 0, nv = 0;

	if (niov > FM_CONN_MAX_IOV)
		return -E2BIG;
	v[nv++] = (struct iovec){ &h, sizeof(h) };
	for (unsigned k = 0; k < niov; k++) {
		if (!iov[k].len)
			continue;
		v[nv++] = (struct iovec){ (void *)iov[k].base, iov[k].len };
		h.len += (uint32_t)iov[k].len;
	}
	while (i < nv) {
		struct msghdr m = { .msg_iov = v + i, .msg_iovlen = nv - i };
		/* MSG_NOSIGNAL: a vanished memd must not SIGPIPE the program we page. */
		ssize_t n = fm_sys_sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		int rc;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -errno;
			rc = wait_fd(c->fd, POLLOUT, deadline);
			if (rc)
				return rc;
			continue;
		}
		advance(v, nv, &i, (size_t)n);
	}
	return 0;
}

int fm_conn_send(struct fm_conn *c, uint16_t op, uint32_t count, const struct fm_iov *iov,
		 unsigned niov, uint64_t deadline)
{
	int rc;

	if (c->fd < 0)
		return -ENOTCONN;
	if (c->pending)  /* the last reply was never read: the stream is out of step */
		rc = -EPROTO;
	else
		rc = send_frame(c, op, count, iov, niov, c->next_req + 1, deadline);
	if (rc) {
		fm_conn_close(c);
		return rc;
	}
	c->pending = ++c->next_req;
	return 0;
}

/*
 * Read the reply's header and payload in as few recvmsg calls as the bytes
 * arrive in: the header and the payload buffers form one scatter list. One
 * request is in flight, so nothing follows the reply on the socket; bytes
 * of an FM_OP_ERROR reply's message beyond our buffers are drained.
 */
static int recv_frame(struct fm_conn *c, const struct fm_iov *rep, unsigned nrep, size_t *rep_len,
		      uint16_t *status, int *rep_fd, uint64_t deadline)
{
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } cm;
	struct iovec v[1 + FM_CONN_MAX_REP];
	struct fm_hdr h;
	char drain[256];
	size_t got = 0, cap = 0, want;
	unsigned nv = 0, i = 0;
	int have_hdr = 0, want_fd = rep_fd != NULL;
	uint64_t spin_until = 0;

	if (nrep > FM_CONN_MAX_REP)
		return -E2BIG;
	if (c->spin_skip)
		c->spin_skip--;
	else if (c->spin_ns)
		spin_until = fm_now_ns() + c->spin_ns;
	if (rep_fd)
		*rep_fd = -1;
	v[nv++] = (struct iovec){ &h, sizeof(h) };
	for (unsigned k = 0; k < nrep; k++) {
		if (!rep[k].len)
			continue;
		v[nv++] = (struct iovec){ (void *)rep[k].base, rep[k].len };
		cap += rep[k].len;
	}
	want = sizeof(h) + cap;  /* until the header says how long the reply is */
	while (got < want) {
		struct iovec d = { drain, want - got < sizeof(drain) ? want - got : sizeof(drain) };
		struct msghdr m = { .msg_iov = v + i, .msg_iovlen = nv - i };
		ssize_t n;
		int rc;

		if (i == nv) {
			m.msg_iov = &d;
			m.msg_iovlen = 1;
		}
		if (want_fd) {
			m.msg_control = cm.buf;
			m.msg_controllen = sizeof(cm.buf);
		}
		n = fm_sys_recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -errno;
			if (spin_until && fm_now_ns() < spin_until) {
				for (int k = 0; k < FM_POLL_PAUSES; k++)
					fm_cpu_relax();
				continue;
			}
			if (spin_until)
				c->spin_skip = FM_CONN_SPIN_SKIP;
			spin_until = 0;
			rc = wait_fd(c->fd, POLLIN, deadline);
			if (rc)
				return rc;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (want_fd && m.msg_controllen) {
			struct cmsghdr *cmh = CMSG_FIRSTHDR(&m);
			if (cmh && cmh->cmsg_level == SOL_SOCKET && cmh->cmsg_type == SCM_RIGHTS) {
				memcpy(rep_fd, CMSG_DATA(cmh), sizeof(int));
				*rep_fd = fm_fd_keep(*rep_fd);
			}
			want_fd = 0;
		}
		got += (size_t)n;
		advance(v, nv, &i, (size_t)n);
		if (!have_hdr && got >= sizeof(h)) {
			have_hdr = 1;
			if (h.magic != FM_PROTO_MAGIC || h.len > FM_MAX_PAYLOAD)
				return -EPROTO;
			/* Only an error's message may be longer than what we asked for. */
			if (h.op != FM_OP_ERROR && (h.req_id != c->pending || h.len > cap))
				return -EPROTO;
			want = sizeof(h) + h.len;
		}
		if (have_hdr && got > want)  /* more than the reply: memd sent what we did not ask */
			return -EPROTO;
	}
	if (h.op == FM_OP_ERROR) {
		/* The message is for logs (memd's); the status says what happened. */
		fm_debug("memd at fd %d refused a request: status %u", c->fd, h.status);
		*status = h.status ? h.status : FM_E_INTERNAL;
		if (rep_len)
			*rep_len = 0;
		return 0;
	}
	if (rep_len)
		*rep_len = h.len;
	*status = h.status;
	return 0;
}

int fm_conn_recv(struct fm_conn *c, const struct fm_iov *rep, unsigned nrep, size_t *rep_len,
		 uint16_t *status, int *rep_fd, uint64_t deadline)
{
	int rc;

	if (c->fd < 0)
		return -ENOTCONN;
	if (!c->pending)
		return -EPROTO;
	rc = recv_frame(c, rep, nrep, rep_len, status, rep_fd, deadline);
	if (rc) {
		if (rep_fd && *rep_fd >= 0) {
			close(*rep_fd);
			*rep_fd = -1;
		}
		fm_conn_close(c);
		return rc;
	}
	c->pending = 0;
	return 0;
}

int fm_conn_call(struct fm_conn *c, uint16_t op, uint32_t count, const struct fm_iov *iov,
		 unsigned niov, void *rep, size_t rep_cap, size_t *rep_len, uint16_t *status,
		 int *rep_fd, uint64_t deadline)
{
	struct fm_iov r = { rep, rep_cap };
	int rc = fm_conn_send(c, op, count, iov, niov, deadline);

	return rc ? rc : fm_conn_recv(c, &r, 1, rep_len, status, rep_fd, deadline);
}

int fm_conn_copy_send(struct fm_conn *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		      const uint64_t *dpages, unsigned n, struct fm_copy_ent *ents, uint64_t deadline)
{
	struct fm_copy_req req = { .src_space = src, .dst_space = dst };

	/* A memd that does not announce COPY is not asked (it would answer FM_E_OP, which means the same). */
	if (c->fd >= 0 && !(c->server_flags & FM_HELLO_F_COPY))
		return -EOPNOTSUPP;
	for (unsigned i = 0; i < n; i++)
		ents[i] = (struct fm_copy_ent){ .src_page = spages[i], .dst_page = dpages[i] };
	return fm_conn_send(c, FM_OP_COPY, n,
			    (struct fm_iov[]){ { &req, sizeof(req) }, { ents, n * sizeof(ents[0]) } }, 2,
			    deadline);
}

int fm_conn_copy_recv(struct fm_conn *c, unsigned n, uint32_t *status, uint64_t deadline)
{
	struct fm_iov rep = { status, n * sizeof(uint32_t) };
	size_t len;
	uint16_t st;
	int rc = fm_conn_recv(c, &rep, 1, &len, &st, NULL, deadline);

	if (rc)
		return rc;
	if (st == FM_E_OP)
		return -EOPNOTSUPP;
	if (st == FM_E_NOSPACE)
		return -ENOENT;
	if (st || len != n * sizeof(uint32_t))
		return -EPROTO;
	for (unsigned i = 0; i < n; i++)
		if (status[i] != FM_OK && status[i] != FM_E_ABSENT && status[i] != FM_E_FULL &&
		    status[i] != FM_E_RANGE)
			return -EPROTO;
	return 0;
}

int fm_conn_edit_send(struct fm_conn *c, const struct fm_space_ref *ref, const struct fm_edit_ent *e, unsigned n,
		      const void *put, size_t put_len, uint64_t deadline)
{
	if (c->fd >= 0 && !(c->server_flags & FM_HELLO_F_EDIT))
		return -EOPNOTSUPP;
	return fm_conn_send(c, FM_OP_EDIT, n,
			    (struct fm_iov[]){ { ref, sizeof(*ref) }, { e, n * sizeof(e[0]) }, { put, put_len } }, 3,
			    deadline);
}

int fm_conn_edit_recv(struct fm_conn *c, void *get, size_t get_len, uint64_t deadline)
{
	struct fm_iov rep = { get, get_len };
	size_t len;
	uint16_t st;
	int rc = fm_conn_recv(c, &rep, 1, &len, &st, NULL, deadline);

	if (rc)
		return rc;
	switch (st) {
	case FM_OK:
		return len == get_len ? 0 : -EPROTO;
	case FM_E_OP:
		return -EOPNOTSUPP;
	case FM_E_FULL:
		return -ENOSPC;
	case FM_E_CRC:
		return -EIO;
	case FM_E_ABSENT:
		return -ENOENT;
	case FM_E_NOSPACE:
		return -ESRCH;
	default:
		return -EPROTO;
	}
}

int fm_conn_open(struct fm_conn *c, const struct fm_peer *p, uint64_t deadline, char *err, size_t errlen)
{
	struct fm_hello_req hreq = { .min_version = FM_PROTO_VERSION, .max_version = FM_PROTO_VERSION,
				       .flags = FM_HELLO_F_RDMA_REG };
	struct fm_hello_rep hrep;
	struct fm_auth_req areq;
	struct fm_auth_rep arep;
	uint8_t want[FM_MAC_LEN];
	size_t len;
	uint16_t st;
	int rc = -EHOSTUNREACH;

	memset(c, 0, sizeof(*c));
	c->fd = -1;
	if (fm_auth_init(err, errlen))
		return -ELIBACC;
	for (unsigned k = 0; k < p->naddr && c->fd < 0; k++)
		rc = connect_one((const struct sockaddr *)&p->sa[k], p->salen[k], p->is_unix, deadline, &c->fd);
	if (c->fd < 0) {
		fm_errmsg(err, errlen, "cannot connect to memd at %s: %s", p->addr, fm_strerror(rc));
		return rc;
	}
	c->is_unix = p->is_unix;
	rc = fm_random(hreq.client_nonce, sizeof(hreq.client_nonce));
	if (!rc)
		rc = fm_conn_call(c, FM_OP_HELLO, 0, &(struct fm_iov){ &hreq, sizeof(hreq) }, 1,
				  &hrep, sizeof(hrep), &len, &st, NULL, deadline);
	if (rc)
		goto fail_msg;
	if (st || len != sizeof(hrep)) {
		fm_errmsg(err, errlen, "memd at %s refused the handshake (status %u%s)", p->addr, st,
			  st == FM_E_VERSION ? ": no common protocol version" : "");
		rc = -EPROTO;
		goto fail;
	}
	c->server_flags = hrep.flags;
	fm_auth_client_mac(p->secret, p->secret_len, hrep.server_nonce, hreq.client_nonce, areq.mac);
	rc = fm_conn_call(c, FM_OP_AUTH, 0, &(struct fm_iov){ &areq, sizeof(areq) }, 1,
			  &arep, sizeof(arep), &len, &st, NULL, deadline);
	if (rc == -ECONNRESET || (!rc && st == FM_E_AUTH)) {
		fm_errmsg(err, errlen, "memd at %s rejected our secret (authentication failed)", p->addr);
		rc = -EACCES;
		goto fail;
	}
	if (rc)
		goto fail_msg;
	fm_auth_server_mac(p->secret, p->secret_len, hrep.server_nonce, hreq.client_nonce, want);
	if (st || len != sizeof(arep) || !fm_auth_mac_equal(want, arep.mac)) {
		fm_errmsg(err, errlen, "memd at %s could not prove it knows the secret", p->addr);
		rc = -EACCES;
		goto fail;
	}
	return 0;

fail_msg:
	fm_errmsg(err, errlen, "memd at %s: handshake failed: %s", p->addr,
		  rc == -ETIMEDOUT ? "no answer in time" : fm_strerror(rc));
fail:
	fm_conn_close(c);
	return rc;
}

void fm_conn_close(struct fm_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->pending = 0;
}
