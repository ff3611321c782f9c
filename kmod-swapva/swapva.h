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
 *   EINTR      a fatal signal (or with SWAPVA_F_INTR any signal) arrived
 *              between segments
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
#define SWAPVA_FEAT_IDMAP       (1ULL << 5)  /* identity-mapped mmap + IDMAP_QUERY */

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
/*
 * Stop at the next segment boundary when any signal is pending: the call
 * fails with EINTR, done = segments completed (each whole), the rest
 * untouched; the caller resumes at segs[done]. Without it only a fatal
 * signal stops a batch (the process is dying anyway).
 */
#define SWAPVA_F_INTR    0x100U
#define SWAPVA_FLAGS_ALL (SWAPVA_OP_MASK | SWAPVA_F_INTR)

struct swapva_batch {
	__u64 segs;     /* in: user pointer to struct swapva_seg[nr] */
	__u32 nr;       /* in: number of segments, <= SWAPVA_MAX_SEGS */
	__u32 flags;    /* in: SWAPVA_OP_* | SWAPVA_F_INTR */
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

/*
 * Identity-mapped memory (DVM): mmap(NULL, len, prot, MAP_SHARED, fd, off) of
 * /dev/swapva allocates len bytes of zeroed, physically contiguous memory and
 * places it at the virtual address equal to its physical address when that
 * range of the caller's address space is free (the placement check is the
 * kernel's own MAP_FIXED_NOREPLACE one; never below SWAPVA_IDMAP_MIN_VA).
 * The offset selects the mode:
 *   SWAPVA_IDMAP_FALLBACK  identity if possible; else the contiguous block at
 *                          an ordinary address; else (no contiguous block)
 *                          separate pages at an ordinary address
 *   SWAPVA_IDMAP_STRICT    identity or fail: EEXIST (the range PA..PA+len is
 *                          taken or out of reach), ENOMEM (no contiguous block)
 * Either way the caller learns what it got from SWAPVA_IOC_IDMAP_QUERY.
 * errno: EPERM without CAP_SYS_ADMIN (a physical address is a secret);
 * EINVAL for MAP_PRIVATE (copy-on-write would replace identity pages by
 * ordinary copies) or another offset. With MAP_FIXED the caller chose the
 * address: STRICT then fails with EEXIST unless the block lands exactly there.
 * The pages are ordinary refcounted pages inserted with vm_insert_pages: not
 * on the LRU, so never reclaimed, swapped or migrated (VA == PA stays true
 * while mapped); freed by the last munmap; shared with children after fork;
 * pinnable (RDMA registration works). mremap can move them; the query then
 * says they are no longer identity-mapped. MADV_DONTNEED frees a page for
 * good: touching it again is SIGBUS. docs/swapva.md has the rationale.
 */
#define SWAPVA_IDMAP_FALLBACK 0x0
#define SWAPVA_IDMAP_STRICT   0x1000  /* mmap offset (bytes): page 1 */
#define SWAPVA_IDMAP_MIN_VA   (1ULL << 20)

struct swapva_idmap_query {
	__u64 addr;      /* in: page aligned */
	__u64 len;       /* in: bytes, page aligned, > 0 */
	__u64 pages;     /* out: pages in the range */
	__u64 present;   /* out: pages mapped (present in the page table) */
	__u64 identity;  /* out: pages mapped at VA == PA */
	__u64 reserved[3];
};
/* CAP_SYS_ADMIN; EINVAL for a misaligned, empty or wrapping range. */
#define SWAPVA_IOC_IDMAP_QUERY _IOWR(SWAPVA_IOC_MAGIC, 4, struct swapva_idmap_query)

#endif /* SWAPVA_H */
