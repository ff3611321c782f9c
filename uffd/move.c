// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_move: a collector's page moves (SwapVA compaction) inside memory
 * the pager owns. libswapva cannot do them there: UFFDIO_MOVE needs the
 * destination registered with the userfaultfd that moves, and the heap is
 * registered with ours. So the pager moves, and keeps its books right:
 *
 *   source page            destination gets                   source becomes
 *   resident (clean/dirty) the page itself (UFFDIO_MOVE: the  untouched
 *                          PTE moves, no bytes are copied),
 *                          dirty: memd's copy belongs to the
 *                          source's slot and dies
 *   remote                 a remote page: memd copies it to   untouched
 *                          the destination's slot (COPY; in
 *                          the shared store with shm; read
 *                          and written with a memd that
 *                          cannot), never local; if memd is
 *                          full, the bytes come in, dirty
 *   untouched              nothing: untouched                 untouched
 *
 * A destination's old contents are garbage: resident ones are dropped with
 * no write-back and remote copies die, as in fm_pager_discard. Every page of
 * a batch is claimed first (FILLING: handlers and the evictor keep off it,
 * like an install), after the evictor or a handler finishes a page that is
 * in a transitional state; only then is anything changed. A remote copy dies
 * only after its bytes are at the destination, so no write is ever lost.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "budget.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "uffd_ops.h"
#include "wait.h"

#define MOVE_BATCH 256u /* pages claimed at a time */

/* The live region holding all of [a, a+len), or NULL. Caller holds rlock. */
static struct region *region_of(struct fm_pager *p, uintptr_t a, size_t len)
{
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		if (r->live && a >= r->base && a < r->end && len <= r->end - a)
			return r;
	}
	return NULL;
}

/* Copy one present source page to an empty destination, then drop the source. */
static void copy_page(struct fm_pager *p, uintptr_t dst, uintptr_t src)
{
	unsigned char in = 0;
	int rc;

	if (mincore((void *)src, PG_SIZE, &in) == 0 && !(in & 1))
		return; /* a hole: zeros, which an empty destination reads as */
	rc = fm_uffd_copy(p->uffd, dst, (const void *)src, PG_SIZE, 0, 0, NULL);
	if (rc)
		fm_fatal("UFFDIO_COPY for a page move at %#lx failed: %s", (unsigned long)dst, strerror(-rc));
	if (fm_sys_madvise((void *)src, PG_SIZE, MADV_DONTNEED))
		fm_fatal("madvise(DONTNEED) of a moved page failed: %s", strerror(errno));
	STAT_ADD(p, swapva_pages_copied, 1);
}

/* Move the present pages [src, src+n pages) to the empty [dst, ...); what UFFDIO_MOVE refuses is copied. */
static void move_run(struct fm_pager *p, uintptr_t dst, uintptr_t src, uint64_t n)
{
	uint64_t done = 0;
	unsigned again = 0;

	while (done < n) {
		int64_t moved = 0;
		int rc = p->can_move ? fm_uffd_move(p->uffd, dst + (done << PG_SHIFT), src + (done << PG_SHIFT),
						    (n - done) << PG_SHIFT, 1, &moved)
				     : -ENOTSUP;

		if (!rc) {
			STAT_ADD(p, swapva_pages_moved, n - done);
			return;
		}
		if (moved > 0) {
			done += (uint64_t)moved >> PG_SHIFT;
			STAT_ADD(p, swapva_pages_moved, (uint64_t)moved >> PG_SHIFT);
			continue;
		}
		if (rc == -EAGAIN && again++ < 16)
			continue;
		if (rc == -EEXIST && again++ < 16) {
			/* Something is mapped there after all: it is garbage, like the rest. */
			fm_sys_madvise((void *)(dst + (done << PG_SHIFT)), PG_SIZE, MADV_DONTNEED);
			continue;
		}
		/* EBUSY (a page shared after fork, or pinned), no UFFDIO_MOVE: copy this page. */
		copy_page(p, dst + (done << PG_SHIFT), src + (done << PG_SHIFT));
		done++;
		again = 0;
	}
}

/*
 * Read m remote pages of a moved range over the misc channel and return with
 * misc_lock held (data points into the channel until it is dropped). A page
 * memd cannot give back is fatal: the caller was about to drop its source.
 */
static void read_locked(struct fm_pager *p, uint32_t space, const uint64_t *idx, unsigned m,
			const void **data)
{
	int rc;

	pthread_mutex_lock(&p->misc_lock);
	rc = fm_chan_read(p->misc_chan, space, idx, m, data);
	if (rc) {
		pthread_mutex_unlock(&p->misc_lock);
		STAT_ADD(p, transport_errors, 1);
		fm_fatal("a page moved by the collector is in memd but cannot be read back (%s)", strerror(-rc));
	}
	STAT_ADD(p, remote_reads, m);
	STAT_ADD(p, remote_read_bytes, (uint64_t)m * PG_SIZE);
}

/*
 * Remote source pages idx[0..n) of rs stay remote. memd copies them to the
 * destination's slots (rd, from di0) itself, one COPY per batch (inside the
 * shared store with shm): no page bytes come here or go back. With a memd
 * that cannot (it predates COPY, or memd_copy=0), memd's copies are read and
 * written to the destination's slots through a bounce buffer, because a
 * read's pointers live only until the channel's next call. kept[j] says
 * whether page idx[j] is now remote at its destination; the others (memd
 * full, or its transport failed) are for fetch_to.
 */
static unsigned relink(struct fm_pager *p, struct region *rs, const uint64_t *idx, unsigned n, uint64_t si0,
		       struct region *rd, uint64_t di0, uint8_t *kept)
{
	const void *data[FM_MAX_BATCH];
	const void *from[FM_MAX_BATCH];
	uint64_t didx[FM_MAX_BATCH];
	uint32_t status[FM_MAX_BATCH];
	unsigned done = 0, copied = 0, written = 0;

	memset(kept, 0, n);
	if (atomic_load(&p->evict_broken) || !p->bounce)
		return 0;
	for (unsigned k = 0; k < n;) {
		unsigned m = n - k < FM_MAX_BATCH ? n - k : FM_MAX_BATCH;
		int rc;
		for (unsigned j = 0; j < m; j++)
			didx[j] = di0 + (idx[k + j] - si0);
		if (atomic_load(&p->memd_copy)) {
			pthread_mutex_lock(&p->misc_lock);
			rc = fm_chan_copy(p->misc_chan, rs->space, idx + k, rd->space, didx, m, status);
			pthread_mutex_unlock(&p->misc_lock);
			if (rc != -EOPNOTSUPP) {
				STAT_ADD(p, swapva_copy_calls, 1);
				if (rc)
					STAT_ADD(p, transport_errors, 1);
				for (unsigned j = 0; j < m; j++)
					if (!rc && status[j] == FM_OK) {
						kept[k + j] = 1;
						copied++;
					}
				k += m;
				continue;
			}
			/* Said once: every later move reads and writes too. */
			if (atomic_exchange(&p->memd_copy, 0))
				fm_info("memd at %s cannot copy pages itself (it predates COPY): moved remote pages are read and written back",
					fm_xport_addr(p->x));
		}
		read_locked(p, rs->space, idx + k, m, data);
		for (unsigned j = 0; j < m; j++) {
			memcpy(p->bounce + ((size_t)j << PG_SHIFT), data[j], PG_SIZE);
			from[j] = p->bounce + ((size_t)j << PG_SHIFT);
		}
		rc = fm_chan_write(p->misc_chan, rd->space, didx, m, from, status);
		pthread_mutex_unlock(&p->misc_lock);
		if (rc)
			STAT_ADD(p, transport_errors, 1);
		for (unsigned j = 0; j < m; j++)
			if (!rc && status[j] == FM_OK) {
				kept[k + j] = 1;
				written++;
			}
		k += m;
	}
	done = copied + written;
	STAT_ADD(p, remote_writes, written);
	STAT_ADD(p, remote_write_bytes, (uint64_t)written * PG_SIZE);
	STAT_ADD(p, swapva_remote_copied, copied);
	STAT_ADD(p, swapva_pages_remote, done);
	return done;
}

/* Bring remote source pages idx[0..n) of rs to the matching destination pages, dirty. */
static void fetch_to(struct fm_pager *p, struct region *rs, const uint64_t *idx, unsigned n,
		     uint64_t si0, uintptr_t dst0)
{
	const void *data[FM_MAX_BATCH];

	for (unsigned k = 0; k < n;) {
		unsigned m = n - k < FM_MAX_BATCH ? n - k : FM_MAX_BATCH;
		read_locked(p, rs->space, idx + k, m, data);
		for (unsigned j = 0; j < m; j++) {
			uintptr_t d = dst0 + ((idx[k + j] - si0) << PG_SHIFT);
			int rc = fm_uffd_copy(p->uffd, d, data[j], PG_SIZE, 0, 0, NULL);
			if (rc == -EEXIST) {
				fm_sys_madvise((void *)d, PG_SIZE, MADV_DONTNEED); /* garbage, like the rest */
				rc = fm_uffd_copy(p->uffd, d, data[j], PG_SIZE, 0, 0, NULL);
			}
			if (rc)
				fm_fatal("UFFDIO_COPY for a page move at %#lx failed: %s", (unsigned long)d, strerror(-rc));
		}
		pthread_mutex_unlock(&p->misc_lock);
		STAT_ADD(p, swapva_pages_fetched, m);
		k += m;
	}
}

static void move_batch(struct fm_pager *p, struct region *rd, uint64_t di0, struct region *rs,
		       uint64_t si0, unsigned n)
{
	uint8_t db[MOVE_BATCH], sb[MOVE_BATCH];
	uint64_t remote[MOVE_BATCH], fetch[MOVE_BATCH];
	uint8_t kept[MOVE_BATCH], now_remote[MOVE_BATCH];
	uintptr_t dst0 = rd->base + (di0 << PG_SHIFT), src0 = rs->base + (si0 << PG_SHIFT);
	struct fm_dead dd = { .n = 0 }, sd = { .n = 0 };
	unsigned nremote = 0, nfetch = 0;
	int64_t res = 0;

	memset(now_remote, 0, sizeof(now_remote));

	for (unsigned k = 0; k < n; k++)
		db[k] = fm_claim(p, &rd->pg[di0 + k]);
	for (unsigned k = 0; k < n; k++)
		sb[k] = fm_claim(p, &rs->pg[si0 + k]);

	/* The destination's old contents are garbage: drop them, no write-back. */
	for (unsigned k = 0; k < n;) {
		unsigned e = k;
		if (db[k] & FM_PGF_HAS_REMOTE)
			fm_dead_add(p, &dd, rd->space, di0 + k);
		if (!fm_pg_is_resident(db[k])) {
			k++;
			continue;
		}
		while (e + 1 < n && fm_pg_is_resident(db[e + 1])) {
			e++;
			if (db[e] & FM_PGF_HAS_REMOTE)
				fm_dead_add(p, &dd, rd->space, di0 + e);
		}
		if (fm_sys_madvise((void *)(dst0 + ((uintptr_t)k << PG_SHIFT)), (size_t)(e - k + 1) << PG_SHIFT,
				   MADV_DONTNEED))
			fm_fatal("madvise(DONTNEED) of a move's destination failed: %s", strerror(errno));
		res -= e - k + 1;
		k = e + 1;
	}
	fm_dead_flush(p, &dd);

	/* Resident source pages move in runs (UFFDIO_MOVE); remote ones move inside memd (relink). */
	for (unsigned k = 0; k < n;) {
		unsigned e = k;
		if (fm_pg_state(sb[k]) == FM_PG_REMOTE) {
			remote[nremote++] = si0 + k;
			k++;
			continue;
		}
		if (!fm_pg_is_resident(sb[k])) {
			STAT_ADD(p, swapva_pages_untouched, 1);
			k++;
			continue;
		}
		while (e + 1 < n && fm_pg_is_resident(sb[e + 1]))
			e++;
		move_run(p, dst0 + ((uintptr_t)k << PG_SHIFT), src0 + ((uintptr_t)k << PG_SHIFT), e - k + 1);
		k = e + 1;
	}
	if (nremote) {
		relink(p, rs, remote, nremote, si0, rd, di0, kept);
		for (unsigned j = 0; j < nremote; j++) {
			if (kept[j])
				now_remote[remote[j] - si0] = 1;
			else
				fetch[nfetch++] = remote[j];
		}
	}
	if (nfetch) {
		fetch_to(p, rs, fetch, nfetch, si0, dst0);
		res += nfetch;
	}
	/* The bytes are at the destination: now the source's remote copies may die. */
	for (unsigned k = 0; k < n; k++)
		if (sb[k] & FM_PGF_HAS_REMOTE)
			fm_dead_add(p, &sd, rs->space, si0 + k);
	fm_dead_flush(p, &sd);

	for (unsigned k = 0; k < n; k++) {
		int has = fm_pg_is_resident(sb[k]) || fm_pg_state(sb[k]) == FM_PG_REMOTE;
		uint8_t nb = now_remote[k] ? pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE)
			   : has ? pg_make(FM_PG_DIRTY, FM_PGF_REF) : pg_make(FM_PG_UNTOUCHED, 0);

		if (now_remote[k])
			fm_memd_holds(p);
		pg_release_from(&rd->pg[di0 + k], FM_PG_FILLING, nb);
		pg_release_from(&rs->pg[si0 + k], FM_PG_FILLING, pg_make(FM_PG_UNTOUCHED, 0));
	}
	if (res)
		fm_resident_add(p, res);
	/* A fault on a page we held waits to settle (fault.c), a handler thread's too: it serves the page then. */
	fm_settled(p);
}

/* Whether pages [first, first+n) of r are all paged. */
static int all_managed(const struct region *r, uint64_t first, uint64_t n)
{
	for (uint64_t k = first; k < first + n; k++)
		if (fm_pg_state(pg_load(&r->pg[k])) == FM_PG_UNMANAGED)
			return 0;
	return 1;
}

/*
 * The source may span regions end to end (an mremap'd range that grew in
 * place several times is a region per growth): it moves region by region,
 * each part checked before anything moves.
 */
int fm_pager_move(struct fm_pager *p, void *dst, const void *src, size_t len)
{
	uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
	struct region *rd, *rs;
	uint64_t di, si, n;
	int rc = 0;

	if (!len || ((d | s | len) & (PG_SIZE - 1)) || d + len < d || s + len < s)
		return -EINVAL;
	if (d < s + len && s < d + len)
		return -EINVAL; /* overlapping: the caller splits into disjoint chunks */
	rlock_rd(p);
	rd = region_of(p, d, len);
	if (!rd)
		rc = -ENOENT;
	for (int pass = 0; pass < 2 && !rc; pass++) {
		for (size_t off = 0; off < len && !rc; off += n << PG_SHIFT) {
			rs = region_of(p, s + off, PG_SIZE);
			if (!rs) {
				rc = -ENOENT;
				break;
			}
			/* Shared memory (UFFDIO_MOVE takes private anonymous pages only), or the other userfaultfd. */
			if (rd->alias || rs->alias || rd->uffd != p->uffd || rs->uffd != p->uffd) {
				rc = -EOPNOTSUPP;
				break;
			}
			di = (d + off - rd->base) >> PG_SHIFT;
			si = (s + off - rs->base) >> PG_SHIFT;
			n = (len - off) >> PG_SHIFT;
			if (n > rs->npages - si)
				n = rs->npages - si;
			if (!pass) {
				if (!all_managed(rd, di, n) || !all_managed(rs, si, n))
					rc = -EINVAL;
				continue;
			}
			if (!off)
				STAT_ADD(p, swapva_calls, 1);
			for (uint64_t k = 0; k < n; k += MOVE_BATCH)
				move_batch(p, rd, di + k, rs, si + k,
					   (unsigned)(n - k < MOVE_BATCH ? n - k : MOVE_BATCH));
		}
	}
	rlock_un(p);
	return rc;
}
