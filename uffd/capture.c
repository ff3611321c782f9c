// SPDX-License-Identifier: Apache-2.0
/* Dirty victims' bytes held by a pipe across their drop (capture.h). */
#include "capture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "evict.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "uffd_ops.h"

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
	/*
	 * A move refuses a shared page as it refuses a pinned one: in the
	 * regions there are now, a refusal is not a pin. No lock (the fork
	 * handler holds the region lock already): a region added meanwhile is
	 * memory the fork did not share.
	 */
	for (int i = 0; i < p->nregions; i++)
		if (p->regions[i].live)
			atomic_store(&p->regions[i].shared, 1);
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

void fm_stages_open(struct fm_pager *p)
{
	size_t len = (size_t)MAX_CAPTURES * FM_EVICT_MAX * PG_SIZE;
	uint64_t ioctls = 0;
	uint8_t *base;

	if (!p->can_move)
		return;
	base = fm_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return;
	/* A fork's child must not inherit pages a batch is moving (nor a range it cannot use). */
	fm_sys_madvise(base, len, MADV_DONTFORK);
	fm_sys_madvise(base, len, MADV_NOHUGEPAGE);
	if (fm_uffd_register(p->uffd, (uintptr_t)base, len, 1, 0, 0, &ioctls)) {
		fm_sys_munmap(base, len);
		return;
	}
	if (!(ioctls & (1ull << _UFFDIO_MOVE))) {
		/* Unregistered first: the unmap of a registered range waits for a reader of its event. */
		fm_uffd_unregister(p->uffd, (uintptr_t)base, len);
		fm_sys_munmap(base, len);
		return;
	}
	p->stage_map = base;
	for (unsigned k = 0; k < MAX_CAPTURES; k++) {
		p->stages[k].base = base + (size_t)k * FM_EVICT_MAX * PG_SIZE;
		atomic_store(&p->stages[k].busy, 0);
	}
}

void fm_stages_close(struct fm_pager *p)
{
	if (!p->stage_map)
		return;
	fm_sys_munmap(p->stage_map, (size_t)MAX_CAPTURES * FM_EVICT_MAX * PG_SIZE);
	p->stage_map = NULL;
}

int fm_pager_move_out(struct fm_pager *p, const char *why)
{
	if (!p->stage_map)
		return 0;
	if (!atomic_exchange(&p->move_out, 1))
		fm_info("eviction moves dirty pages out (UFFDIO_MOVE) and keeps pages pinned for I/O (%s)", why);
	return 1;
}

struct fm_stage *fm_stage_take(struct fm_pager *p)
{
	if (!atomic_load(&p->move_out))
		return NULL;
	for (unsigned k = 0; k < MAX_CAPTURES; k++) {
		int free_ = 0;
		if (atomic_compare_exchange_strong(&p->stages[k].busy, &free_, 1))
			return &p->stages[k];
	}
	return NULL;
}

void fm_stage_give(struct fm_pager *p, struct fm_stage *s, unsigned used)
{
	/* The next batch moves into these slots, and a move into a mapped page fails (EEXIST). */
	if (used && fm_sys_madvise(s->base, (size_t)used * PG_SIZE, MADV_DONTNEED))
		fm_fatal("madvise(DONTNEED) of an eviction stage failed: %s", fm_strerror(errno));
	if (used)
		STAT_ADD(p, evict_syscalls, 1);
	atomic_store(&s->busy, 0);
}
