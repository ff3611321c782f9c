// SPDX-License-Identifier: Apache-2.0
/*
 * Pages lent to another process's process_vm_readv and process_vm_writev
 * (lend.h): the lender, a thread of the pager, and the caller's side.
 */
#include "lend.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "fm_fds.h"
#include "fm_util.h"
#include "pager_internal.h"

/* How long a caller waits for the lender's answer before it makes its call anyway. */
#define LEND_WAIT_MS 10000

static socklen_t lend_address(pid_t pid, struct sockaddr_un *a)
{
	int n;

	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	/* Abstract (sun_path[0] is 0): nothing left behind in a directory, gone with the process. */
	n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, FM_LEND_NAME, (int)pid);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The slots of the request a connection holds, per connection; the lender's thread alone touches them. */
struct held {
	unsigned n;
	int slot[FM_LEND_RANGES];
};

static void give_back(struct fm_pager *p, struct held *h)
{
	for (unsigned k = 0; k < h->n; k++)
		fm_pager_io_end(p, h->slot[k]);
	h->n = 0;
}

static void drop_conn(struct fm_pager *p, int k, struct held *h)
{
	int fd = p->lend_conn[k];

	give_back(p, h);
	p->lend_conn[k] = -1;
	fm_fd_close(fd);
}

static int well_formed(const struct fm_lend_request *q, long got)
{
	uint64_t bytes = 0;

	if (got < (long)offsetof(struct fm_lend_request, r) || q->magic != FM_LEND_MAGIC || q->n > FM_LEND_RANGES ||
	    (size_t)got != offsetof(struct fm_lend_request, r) + q->n * sizeof(q->r[0]) || q->write > 1)
		return -EINVAL;
	for (unsigned k = 0; k < q->n; k++) {
		if (q->r[k].len > FM_LEND_BYTES || q->r[k].addr > UINT64_MAX - q->r[k].len)
			return -EINVAL;
		bytes += q->r[k].len;
	}
	return bytes > FM_LEND_BYTES ? -E2BIG : 0;
}

/* One request on connection k: the last one's pins given back, this one's taken, the answer sent. */
static void serve(struct fm_pager *p, int k, struct held *h)
{
	struct fm_lend_request q;
	struct fm_lend_reply a = { .magic = FM_LEND_MAGIC };
	long got = fm_sys_read(p->lend_conn[k], &q, sizeof(q));

	give_back(p, h);
	if (got <= 0) {
		if (got == 0 || (errno != EINTR && errno != EAGAIN))
			drop_conn(p, k, h);
		return;
	}
	a.status = well_formed(&q, got);
	for (unsigned j = 0; !a.status && j < q.n; j++) {
		int s;
		if (!q.r[j].len)
			continue;
		s = fm_pager_io_begin(p, (const void *)(uintptr_t)q.r[j].addr, (size_t)q.r[j].len, (int)q.write);
		/* Where the kernel waits for pages: pinned only, so that none leaves while the kernel writes it. */
		if (s == -1 && q.write)
			s = fm_pager_pin_in_place(p, (const void *)(uintptr_t)q.r[j].addr, (size_t)q.r[j].len);
		if (s >= 0)
			h->slot[h->n++] = s;
	}
	a.pinned = h->n;
	if (!a.status)
		STAT_ADD(p, lend_requests, 1);
	if (fm_sys_write(p->lend_conn[k], &a, sizeof(a)) != (long)sizeof(a))
		drop_conn(p, k, h);
}

static int peer_may(int fd)
{
	struct ucred c;
	socklen_t len = sizeof(c);

	return !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) && (c.uid == 0 || c.uid == geteuid());
}

static void take_conn(struct fm_pager *p)
{
	int fd = accept4(p->lend_listen, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (peer_may(fd)) {
		for (int k = 0; k < LEND_CONNS; k++) {
			if (p->lend_conn[k] < 0) {
				p->lend_conn[k] = fm_fd_keep(fd);
				return;
			}
		}
	}
	/* Refused, or every connection busy: the caller makes its call unlent. */
	close(fd);
}

static void *lender_main(void *arg)
{
	struct fm_pager *p = arg;
	struct held held[LEND_CONNS] = { 0 };

	pthread_setname_np(pthread_self(), "farmem-lend");
	for (;;) {
		struct pollfd pf[2 + LEND_CONNS];
		int at[LEND_CONNS], n = 2;

		pf[0] = (struct pollfd){ .fd = p->lend_stop, .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = p->lend_listen, .events = POLLIN };
		for (int k = 0; k < LEND_CONNS; k++) {
			if (p->lend_conn[k] < 0)
				continue;
			at[n - 2] = k;
			pf[n++] = (struct pollfd){ .fd = p->lend_conn[k], .events = POLLIN };
		}
		if (fm_sys_poll(pf, (unsigned long)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			fm_warn("lender: poll failed: %s; other processes' calls on paged memory go unlent",
				fm_strerror(errno));
			break;
		}
		if (pf[0].revents)
			break;
		for (int j = 2; j < n; j++)
			if (pf[j].revents)
				serve(p, at[j - 2], &held[at[j - 2]]);
		if (pf[1].revents)
			take_conn(p);
	}
	for (int k = 0; k < LEND_CONNS; k++)
		if (p->lend_conn[k] >= 0)
			drop_conn(p, k, &held[k]);
	return NULL;
}

int fm_lend_start(struct fm_pager *p)
{
	struct sockaddr_un a;
	socklen_t len = lend_address(getpid(), &a);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), rc;

	if (fd < 0)
		return -errno;
	/* A second pager in this process (a program that embeds its own) finds the name taken: one lends. */
	if (bind(fd, (struct sockaddr *)&a, len) || listen(fd, LEND_CONNS)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	p->lend_listen = fm_fd_keep(fd);
	p->lend_stop = fm_fd_keep(eventfd(0, EFD_CLOEXEC));
	if (p->lend_stop < 0) {
		rc = -errno;
		fm_lend_stop(p);
		return rc;
	}
	rc = -fm_thread_create(&p->lender, NULL, lender_main, p);
	if (rc) {
		fm_lend_stop(p);
		return rc;
	}
	p->lender_started = 1;
	return 0;
}

static void close_listener(struct fm_pager *p)
{
	if (p->lend_listen >= 0)
		fm_fd_close(p->lend_listen);
	if (p->lend_stop >= 0)
		fm_fd_close(p->lend_stop);
	p->lend_listen = p->lend_stop = -1;
	p->lender_started = 0;
}

void fm_lend_stop(struct fm_pager *p)
{
	uint64_t one = 1;

	if (p->lender_started && fm_sys_write(p->lend_stop, &one, sizeof(one)) == (long)sizeof(one))
		pthread_join(p->lender, NULL);
	close_listener(p);
}

void fm_lend_forget(struct fm_pager *p)
{
	/* The copies of the parent's: its lender thread is not here to serve them. */
	for (int k = 0; k < LEND_CONNS; k++) {
		int fd = p->lend_conn[k];
		p->lend_conn[k] = -1;
		if (fd >= 0)
			fm_fd_close(fd);
	}
	close_listener(p);
}

int fm_lend_connect(pid_t pid)
{
	struct sockaddr_un a;
	socklen_t len = lend_address(pid, &a);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, len)) {
		close(fd);
		return -1;
	}
	return fd;
}

int fm_lend_ask(int fd, const struct iovec *v, unsigned n, int write)
{
	struct fm_lend_request q = { .magic = FM_LEND_MAGIC, .n = n, .write = write ? 1 : 0 };
	struct fm_lend_reply a;
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	size_t len = offsetof(struct fm_lend_request, r) + n * sizeof(q.r[0]);

	if (n > FM_LEND_RANGES)
		return -1;
	for (unsigned k = 0; k < n; k++)
		q.r[k] = (struct fm_lend_range){ (uintptr_t)v[k].iov_base, v[k].iov_len };
	if (fm_sys_send(fd, &q, len, MSG_NOSIGNAL) != (long)len)
		return -1;
	while (fm_sys_poll(&pf, 1, LEND_WAIT_MS) < 0)
		if (errno != EINTR)
			return -1;
	if (!pf.revents || fm_sys_read(fd, &a, sizeof(a)) != (long)sizeof(a) || a.magic != FM_LEND_MAGIC)
		return -1;
	return a.status ? -1 : 0;
}
