// SPDX-License-Identifier: Apache-2.0
/* Dirty victims' bytes held by a pipe across their drop (capture.h). */
#include "capture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "evict.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "pager_internal.h"

#ifndef PR_GET_MEMORY_MERGE
#define PR_GET_MEMORY_MERGE 68
#endif

void fm_captures_open(struct fm_pager *p, unsigned n)
{
	if (n > MAX_CAPTURES)
		n = MAX_CAPTURES;
	for (p->ncaptures = 0; p->ncaptures < n; p->ncaptures++) {
		struct fm_capture *c = &p->captures[p->ncaptures];
		int fd[2];
		if (pipe2(fd, O_CLOEXEC))
			break;
		/* Every page of a batch must fit, or vmsplice would wait for a reader: us. */
		if (fcntl(fd[1], F_SETPIPE_SZ, FM_EVICT_MAX * PG_SIZE) < (int)(FM_EVICT_MAX * PG_SIZE) ||
		    !(c->bytes = aligned_alloc(PG_SIZE, (size_t)FM_EVICT_MAX * PG_SIZE))) {
			close(fd[0]);
			close(fd[1]);
			break;
		}
		c->rd = fm_fd_keep(fd[0]);
		c->wr = fm_fd_keep(fd[1]);
		atomic_store(&c->busy, 0);
	}
	if (p->ncaptures < n)
		fm_info("eviction write-protects dirty pages (pipes for %u of %u captures: %s)", p->ncaptures, n,
			fm_strerror(errno));
}

void fm_captures_close(struct fm_pager *p)
{
	for (unsigned k = 0; k < p->ncaptures; k++) {
		close(p->captures[k].rd);
		close(p->captures[k].wr);
		free(p->captures[k].bytes);
	}
	p->ncaptures = 0;
}

void fm_pager_no_capture(struct fm_pager *p, const char *why)
{
	if (p->ncaptures && !atomic_exchange(&p->capture_off, 1))
		fm_info("eviction write-protects dirty pages from now on: %s", why);
}

/* Process-wide KSM (Linux 6.4+), which the program may turn on at any time. */
static int ksm_on(void)
{
	return prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) == 1;
}

struct fm_capture *fm_capture_take(struct fm_pager *p)
{
	if (!p->ncaptures || atomic_load(&p->capture_off))
		return NULL;
	if (ksm_on()) {
		fm_pager_no_capture(p, "the program turned on KSM (PR_SET_MEMORY_MERGE)");
		return NULL;
	}
	for (unsigned k = 0; k < p->ncaptures; k++) {
		int free_ = 0;
		if (atomic_compare_exchange_strong(&p->captures[k].busy, &free_, 1))
			return &p->captures[k];
	}
	return NULL;
}

void fm_capture_give(struct fm_capture *c)
{
	atomic_store(&c->busy, 0);
}

int fm_capture_splice(struct fm_capture *c, const struct iovec *iov, unsigned niov, unsigned npages)
{
	size_t want = (size_t)npages * PG_SIZE, got = 0;
	ssize_t k;

	/* The pipe has room for every page: vmsplice stops early only at a page it cannot get. */
	do
		k = fm_sys_vmsplice(c->wr, iov, niov, 0);
	while (k < 0 && errno == EINTR);
	if (k > 0)
		got = (size_t)k;
	if (got == want)
		return 0;
	if (got) {
		struct iovec spilled = { .iov_base = c->bytes, .iov_len = got };

		fm_capture_collect(c, &spilled, 1);
	}
	return -1;
}

void fm_capture_collect(struct fm_capture *c, struct iovec *left, unsigned niov)
{
	unsigned first = 0;

	while (first < niov) {
		ssize_t k = fm_sys_readv(c->rd, left + first, (int)(niov - first));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			fm_fatal("cannot read evicted pages back from their pipe: %s",
				 k < 0 ? fm_strerror(errno) : "it ran dry");
		/* A short read stops anywhere: step over what it filled. */
		while (first < niov && (size_t)k >= left[first].iov_len)
			k -= (ssize_t)left[first++].iov_len;
		if (first < niov) {
			left[first].iov_base = (uint8_t *)left[first].iov_base + k;
			left[first].iov_len -= (size_t)k;
		}
	}
}
