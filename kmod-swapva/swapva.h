/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR Apache-2.0 */
/*
 * swapva.h - the ABI between the swapva kernel module (/dev/swapva) and
 * user space (libswapva). This one header is the whole contract: the module
 * and libswapva both include it, and nothing else crosses the boundary.
 *
 * Versioning: SWAPVA_ABI_VERSION changes only on an incompatible change.
 * Compatible additions use the feature bits and the reserved fields, which
 * the caller must zero and the module must ignore.
 *
 * Semantics of one segment {src, dst, len} (bytes, all page aligned, len > 0,
 * src and dst ranges disjoint, each inside one anonymous private mapping of
 * the calling process):
 *   SWAPVA_OP_SWAP  exchange the contents of [src, src+len) and [dst, dst+len).
 *   SWAPVA_OP_MOVE  afterwards dst holds src's former contents; the contents
 *                   of src are unspecified ("move with recycle": a PTE swap,
 *                   a memmove and a UFFDIO_MOVE all satisfy it).
 * A segment is all-or-nothing: either every page of it moved, or none did.
 * Segments of one batch must not overlap one another.
 *
 * errno of the first failed segment (struct swapva_batch.err, negative):
 *   EINVAL     misaligned or zero length, wrap-around, overlap, bad flags,
 *              a range not inside one anonymous private mapping, src and dst
 *              mappings that differ in protection, mlock state or anon_vma
 *   EFAULT     a range is not mapped at all; the segment array is unreadable
 *   E2BIG      nr > SWAPVA_MAX_SEGS
 *   EBUSY      a page that is not safe to move: shared after fork, KSM,
 *              pinned (maybe DMA-pinned), in the swap cache, lazily freed,
 *              part of a large folio, locked by someone else, or the mapping
 *              is registered with userfaultfd or is VM_MERGEABLE
 *   EOPNOTSUPP the range holds a huge PMD or a non-present entry (swap,
 *              migration, device), or the process has secondary MMUs (MMU
 *              notifiers): the module cannot move those safely
 *   EAGAIN     the page tables changed under the call; retry
 *   EINTR      a fatal signal arrived between segments
 * SWAPVA_IOC_BATCH returns 0 when every segment completed, else -1 with errno
 * set; struct swapva_batch (done, err, pages) is written back either way.
 * libswapva treats EBUSY, EOPNOTSUPP and EAGAIN as "try the next backend for
 * this segment" and everything else as final.
 */
#ifndef SWAPVA_H
#define SWAPVA_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define SWAPVA_ABI_VERSION 1
#define SWAPVA_DEVICE      "/dev/swapva"
#define SWAPVA_MAX_SEGS    4096

/* feature bits in swapva_info.features */
#define SWAPVA_FEAT_SWAP        (1ULL << 0)  /* SWAPVA_OP_SWAP */
#define SWAPVA_FEAT_MOVE        (1ULL << 1)  /* SWAPVA_OP_MOVE */
#define SWAPVA_FEAT_HOLES       (1ULL << 2)  /* holes (pte_none) move as holes */
#define SWAPVA_FEAT_ONE_FLUSH   (1ULL << 3)  /* one TLB shootdown per batch */
#define SWAPVA_FEAT_RMAP        (1ULL << 4)  /* folio->index follows the page */

struct swapva_info {
	__u32 abi_version;      /* SWAPVA_ABI_VERSION */
	__u32 page_size;
	__u32 max_segs;         /* SWAPVA_MAX_SEGS */
	__u32 breakeven_pages;  /* suggested smallest segment worth a PTE move */
	__u64 features;         /* SWAPVA_FEAT_* */
	__u64 reserved[4];
};

struct swapva_seg {
	__u64 src;
	__u64 dst;
	__u64 len;
};

/* op in the low byte of swapva_batch.flags */
#define SWAPVA_OP_MOVE   0
#define SWAPVA_OP_SWAP   1
#define SWAPVA_OP_MASK   0xffU
#define SWAPVA_FLAGS_ALL SWAPVA_OP_MASK

struct swapva_batch {
	__u64 segs;     /* in: user pointer to struct swapva_seg[nr] */
	__u32 nr;       /* in: number of segments, <= SWAPVA_MAX_SEGS */
	__u32 flags;    /* in: SWAPVA_OP_* */
	__u32 done;     /* out: segments completed, in array order */
	__s32 err;      /* out: 0 or -errno of segment [done] */
	__u64 pages;    /* out: page table entries moved */
	__u64 reserved[2];
};

#define SWAPVA_IOC_MAGIC 0xB7
#define SWAPVA_IOC_INFO  _IOR(SWAPVA_IOC_MAGIC, 1, struct swapva_info)
#define SWAPVA_IOC_BATCH _IOWR(SWAPVA_IOC_MAGIC, 2, struct swapva_batch)
/* Flush this process's TLB entries on every CPU (BATCH already does so). */
#define SWAPVA_IOC_FLUSH _IO(SWAPVA_IOC_MAGIC, 3)

#endif /* SWAPVA_H */
