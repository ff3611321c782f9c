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

/*
 * Stages (evict_move): the other way across the drop. UFFDIO_MOVE moves a
 * dirty victim's page itself (its page-table entry) into a stage of ours,
 * registered with the pager's uffd as the move wants its destination; its
 * bytes are read there and the stage is emptied after the write-back. The
 * kernel refuses to move a page that is pinned (an O_DIRECT read in flight
 * writes it by DMA, past the page table and any write-protect, after the
 * submitting call returned): such a page stays, where a drop would have lost
 * the read's bytes. Works with either fault mode; a write after the move
 * faults as missing and waits for the page to settle, as after a capture.
 */
struct fm_stage {
	uint8_t *base;     /* FM_EVICT_MAX pages, empty between batches */
	atomic_int busy;
};

/* Map and register the stages (none when the uffd cannot move, or the mapping fails). */
void fm_stages_open(struct fm_pager *p);
void fm_stages_close(struct fm_pager *p);
/* A free stage when eviction moves pages out, or NULL. */
struct fm_stage *fm_stage_take(struct fm_pager *p);
/* Empty the first used pages of s and free it. */
void fm_stage_give(struct fm_pager *p, struct fm_stage *s, unsigned used);

#endif
