/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Captures: how eviction takes a dirty page's bytes without write-protecting
 * it first. vmsplice puts the page itself (a reference, not a copy) into a
 * pipe; the page is then dropped; the pipe is read after the drop. A write
 * that lands before the drop is in the page the pipe holds, one after it
 * faults as missing and waits for the page to settle (fault.c). So the
 * write-protect call per run of dirty victims, and the TLB shootdown each
 * costs when another CPU runs the program, are gone: the batch pays one
 * flush, the drop's.
 *
 * Only in SIGBUS mode: there a page our books call resident but that is not
 * mapped makes vmsplice fail (the fault becomes EFAULT) instead of waiting
 * for a handler that may be the evicting thread itself.
 */
#ifndef FARMEM_CAPTURE_H
#define FARMEM_CAPTURE_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

struct fm_pager;

struct fm_capture {
	int rd, wr;        /* the pipe, sized for FM_EVICT_MAX pages */
	uint8_t *bytes;    /* FM_EVICT_MAX pages: what the pipe held, read after the drop */
	atomic_int busy;
};

/* Open up to n captures; fewer (none) when pipes cannot be had. */
void fm_captures_open(struct fm_pager *p, unsigned n);
void fm_captures_close(struct fm_pager *p);

/* A free capture, or NULL (eviction then write-protects as before). */
struct fm_capture *fm_capture_take(struct fm_pager *p);
void fm_capture_give(struct fm_capture *c);

/*
 * Splice npages pages, given as niov runs, into c. 0 when all went in; else
 * -1 and c is empty again (a page was not mapped).
 */
int fm_capture_splice(struct fm_capture *c, const struct iovec *iov, unsigned niov, unsigned npages);

/*
 * Read the spliced pages, in splice order, to where iov says: c->bytes, or a
 * page's own slot in memd's store (evict.c); iov is used up. Fatal if the
 * pipe fails: the pages are gone.
 */
void fm_capture_collect(struct fm_capture *c, struct iovec *iov, unsigned niov);

#endif
