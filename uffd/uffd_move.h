/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UFFDIO_MOVE into an empty destination, with the count of what moved right,
 * for the pager (uffd_ops.c) and libswapva, which both move pages this way.
 *
 * Why: since the batched moves of Linux 6.18 (move_pages_ptes), move_pages()
 * keeps -EAGAIN in its error after a retry (a page under migration, a large
 * folio being split): the next batch at the same address moves, up to a page
 * table's end, but is neither counted nor stepped over, and the retry there
 * finds that batch's first page at the destination and stops with -EEXIST.
 * So EEXIST (or EAGAIN and a short count) comes back while pages past the
 * count did move: their bytes are at the destination and the source has
 * holes there. Taken at its word, a caller loses those pages (it moves into
 * slots that hold them, or drops them as garbage, or reads the source, which
 * now faults). Compaction is enough to cause it (kcompactd, or writing
 * /proc/sys/vm/compact_memory, as tests/unit/test_uffd_move.c does).
 *
 * Given a destination that was empty when the move began, a mapped page
 * there past the count can only have come from this move, so after EEXIST
 * the run of mapped destination pages whose source pages are gone is counted
 * as moved and the move goes on after it. A destination page mapped with its
 * source page still there is a real EEXIST (somebody mapped it meanwhile).
 * The destination must stay untouched by others while it moves (a collector's
 * destination, a stage): PAGEMAP_SCAN reads the page tables, which is all
 * the kernel's EEXIST looks at (a swapped-out page is not none either).
 */
#ifndef FARMEM_UFFD_MOVE_H
#define FARMEM_UFFD_MOVE_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "uffd_compat.h"

#define FM_MAPPED_PAGE (PAGE_IS_PRESENT | PAGE_IS_SWAPPED)

/*
 * First page of [a, b) that is mapped (want 1) or not (want 0), or b when
 * there is none; -1 if the page tables cannot be read (no PAGEMAP_SCAN).
 */
static inline int64_t fm_pagemap_first(int pagemap, uint64_t a, uint64_t b, int want)
{
	struct page_region v;
	struct pm_scan_arg s = {
		.size = sizeof(s), .start = a, .end = b,
		.vec = (uintptr_t)&v, .vec_len = 1, .max_pages = 1,
		.category_inverted = want ? 0 : FM_MAPPED_PAGE,
		.category_mask = want ? 0 : FM_MAPPED_PAGE,
		.category_anyof_mask = want ? FM_MAPPED_PAGE : 0,
		.return_mask = FM_MAPPED_PAGE,
	};
	long n;

	if (a >= b)
		return (int64_t)b;
	n = ioctl(pagemap, PAGEMAP_SCAN, &s);
	if (n < 0)
		return -1;
	return (int64_t)(n > 0 ? v.start : b);
}

/*
 * The same as fm_pagemap_first without a descriptor, by mincore: resident
 * (want 1) or not. An anonymous page swapped out and not in the swap cache
 * reads as not resident, which PAGEMAP_SCAN would call mapped.
 */
static inline int64_t fm_mincore_first(uint64_t a, uint64_t b, int want)
{
	const uint64_t ps = (uint64_t)sysconf(_SC_PAGESIZE);
	unsigned char vec[64];

	for (uint64_t at = a; at < b;) {
		uint64_t n = (b - at + ps - 1) / ps < 64 ? (b - at + ps - 1) / ps : 64;

		if (mincore((void *)(uintptr_t)at, n * ps, vec))
			return -1;
		for (uint64_t k = 0; k < n; k++)
			if ((vec[k] & 1) == (want != 0))
				return (int64_t)(at + k * ps);
		at += n * ps;
	}
	return (int64_t)b;
}

/*
 * Bytes from dst/src that moved though the kernel did not count them: the
 * mapped destination pages there whose source pages are gone. 0 if none.
 * Without a descriptor for pagemap (a program out of them) mincore answers:
 * taking the kernel's count at its word would lose the pages it moved. A
 * moved page swapped out at once reads as not there: the count stops short
 * of it, and the move ends there with EEXIST as if somebody had mapped it
 * (the same loss as before this fallback, for that page only).
 */
static inline uint64_t fm_move_uncounted(uint64_t dst, uint64_t src, uint64_t len)
{
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	int64_t d = -1, s = -1;

	if (pagemap >= 0) {
		d = fm_pagemap_first(pagemap, dst, dst + len, 0);
		s = d > (int64_t)dst ? fm_pagemap_first(pagemap, src, src + ((uint64_t)d - dst), 1) : -1;
		close(pagemap);
	}
	if (d < 0) {
		d = fm_mincore_first(dst, dst + len, 0);
		s = d > (int64_t)dst ? fm_mincore_first(src, src + ((uint64_t)d - dst), 1) : -1;
	}
	if (s < 0)
		return 0;
	return (uint64_t)s - src;
}

/*
 * Move [src, src+len) to the empty [dst, dst+len). Returns 0 or -errno as
 * UFFDIO_MOVE does (EAGAIN with a short count: go on from there); *moved is
 * how many bytes moved, a prefix, counted right; *recounts (if not NULL) is
 * raised by each short count of the kernel's that was put right.
 */
static inline int fm_move_to_empty(int uffd, uint64_t dst, uint64_t src, uint64_t len, uint64_t mode,
				   uint64_t *moved, unsigned *recounts)
{
	uint64_t done = 0;
	int rc = 0;

	while (done < len) {
		struct uffdio_move m = { .dst = dst + done, .src = src + done, .len = len - done, .mode = mode };
		uint64_t more;

		if (ioctl(uffd, UFFDIO_MOVE, &m) == 0) {
			done = len;
			rc = 0;
			break;
		}
		rc = -errno;
		if (m.move > 0)
			done += (uint64_t)m.move;
		if (rc != -EEXIST)
			break;
		more = fm_move_uncounted(dst + done, src + done, len - done);
		if (!more)
			break;
		if (recounts)
			(*recounts)++;
		done += more;
		rc = 0;
	}
	*moved = done;
	return rc;
}

#endif /* FARMEM_UFFD_MOVE_H */
