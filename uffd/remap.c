// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_remap: the program's mremap of paged memory, done by the
 * kernel's own mremap. The page-table entries move in one call, and each
 * region's books and memd space go with its pages: a page in memd stays in
 * its slot, nothing is read, written or copied. (fm_pager_move, the way
 * before, copies every remote page inside memd: ~200 ms per 256 MiB where
 * Linux moves swap entries in a millisecond.)
 *
 * The pager asks for UFFD_FEATURE_EVENT_REMAP and EVENT_UNMAP, whose events
 * would hold the mremap until a reader took them (and an unmap event makes
 * the reader forget the range's pages), so the old range is unregistered
 * before the kernel moves it: no event. Unregistering drops the pages'
 * write protection, so each resident page counts as dirty from then on (a
 * write to it is not seen), and the new range is registered before the
 * program gets it back. A page of memd is a hole, and moves as a hole.
 *
 * In three steps, so that no lock is taken while pages are held (a fault
 * on a held page waits for it holding the region lock for reading):
 *
 *  1. (write lock) Books for the new range, every page FILLING: one region
 *     per old region, each with the old one's memd space. A growth joins
 *     the last region where its cap has room, else it is a region of its
 *     own whose space has room for a quarter of the range more.
 *  2. (read lock) Every old page claimed (FILLING), as a move claims them:
 *     an eviction in flight finishes first, none starts. The old range
 *     unregistered, the mremap, the new range registered, its pages given
 *     the old ones' states; the old pages UNTOUCHED.
 *  3. (write lock) The old regions go, their spaces staying open.
 *
 * With MREMAP_DONTUNMAP the old range stays mapped, empty: its regions stay,
 * each with a new memd space, every page untouched.
 *
 * A growth in place (no MREMAP_MAYMOVE) moves nothing: the tail's place is
 * held by a mapping of ours (nothing else is mapped there meanwhile), step 1
 * books the tail, the hold goes, the kernel extends the mapping (which
 * extends its registration), step 2 registers the tail in the books' name.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "budget.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "uffd_ops.h"
#include "wait.h"

/* Regions moved at once: a range grown more often than this is moved by fm_pager_move, into one region. */
#define REMAP_MAX 32

struct remap {
	uintptr_t old, to;
	uint64_t had, want;     /* pages */
	int n;                  /* regions of the range */
	int moves;              /* to another place (else it grows where it is) */
	int keep_old;           /* MREMAP_DONTUNMAP: the old range stays, empty */
	uint8_t kept[REMAP_MAX]; /* ... and old region k stays paged, with a new memd space */
	struct region *from[REMAP_MAX], *into[REMAP_MAX];
	struct region *tail;    /* the growth as a region of its own, or NULL */
	struct region *grown;   /* or the region the growth joined, from page grown_at on */
	uint64_t grown_at;
	uint64_t added;         /* pages the growth added */
	uint8_t *was;           /* the old pages' bytes, claimed */
	/*
	 * A growth in place: the tail's place, held by a mapping of ours until
	 * the kernel's call, so that nothing the books' step maps (memd's store
	 * for the tail's space) lands there and makes the growth fail.
	 */
	void *hold;
	size_t hold_len;
};

/* The live region that starts at a, or NULL. Caller holds rlock. */
static struct region *region_at(struct fm_pager *p, uintptr_t a)
{
	for (int i = 0; i < p->nregions; i++)
		if (p->regions[i].live && p->regions[i].base == a)
			return &p->regions[i];
	return NULL;
}

/*
 * The regions that make [old, old + had pages) end to end, each whole,
 * private anonymous memory with every page paged; 0 when not. Caller
 * holds rlock.
 */
static int gather(struct fm_pager *p, struct remap *m)
{
	uintptr_t a = m->old, e = m->old + (m->had << PG_SHIFT);

	m->n = 0;
	while (a < e) {
		struct region *r = region_at(p, a);

		if (!r || r->end > e || r->sparse || r->alias || m->n == REMAP_MAX)
			return 0;
		for (uint64_t i = 0; i < r->npages; i++)
			if (fm_pg_state(pg_load(&r->pg[i])) == FM_PG_UNMANAGED)
				return 0;
		m->from[m->n++] = r;
		a = r->end;
	}
	return m->n > 0;
}

/* Step 1's books go again (the mremap failed, or was never tried). Caller holds rlock for writing. */
static void unbook(struct fm_pager *p, struct remap *m)
{
	if (m->grown && !m->moves)
		fm_region_resize(p, m->grown, m->grown_at);
	for (int k = 0; k < m->n; k++)
		if (m->into[k])
			fm_region_retire(p, m->into[k], 0);
	if (m->tail)
		fm_region_retire(p, m->tail, 1);
	fm_region_bounds(p);
}

static struct region *book(struct fm_pager *p, uintptr_t a, uint64_t npages, uint64_t cap, uint32_t space,
			   int uffd, uint32_t flags)
{
	struct region *r = fm_region_book(p, a, npages, cap, space, uffd);

	if (!r)
		return NULL;
	memset(r->pg, pg_make(FM_PG_FILLING, 0), npages);
	atomic_store(&r->managed, npages);
	fm_region_publish(p, r, flags);
	return r;
}

/* Step 1. Returns 0, or -EOPNOTSUPP when the range is not for us and -ENOSPC when the books or memd are full. */
static int book_new(struct fm_pager *p, struct remap *m)
{
	uintptr_t tail_at = m->to + (m->had << PG_SHIFT);
	int rc = 0;

	rlock_wr(p);
	if (!gather(p, m)) {
		rlock_un(p);
		return -EOPNOTSUPP;
	}
	/*
	 * No books where the range goes. The caller let go of paged memory at a
	 * fixed place, and a growth in place holds a place where nothing is
	 * mapped; what is left are the books of pages unmapped in a sparse
	 * region, or in the middle of a mapping (UNMANAGED).
	 */
	if (fm_overlap_next(p, m->moves ? m->to : tail_at, m->to + (m->want << PG_SHIFT), &(struct fm_overlap){ 0 })) {
		rlock_un(p);
		return -EOPNOTSUPP;
	}
	for (int k = 0; k < m->n; k++) {
		struct region *r = m->from[k];

		m->into[k] = !m->moves ? NULL
			     : book(p, m->to + (r->base - m->old), r->npages, r->cap, r->space, r->uffd,
				    fm_resmap_slot(p->hdr, (unsigned)r->slot)->flags & ~FM_REGION_F_LIVE);
		if (m->moves && !m->into[k])
			rc = -ENOSPC;
	}
	if (!rc && m->want > m->had) {
		struct region *last = m->moves ? m->into[m->n - 1] : m->from[m->n - 1];
		uint64_t n = m->want - m->had, cap = n > m->had / 4 ? n : m->had / 4;
		uint32_t space;

		/* A tail's uffd is its mapping's: extended in place, the kernel registered it with the head's. */
		m->added = n;
		if (last->cap - last->npages >= n) {
			/* Room in its last region's space: the growth joins it. */
			m->grown = last;
			m->grown_at = last->npages;
			fm_region_resize(p, last, last->npages + n);
			memset(last->pg + m->grown_at, pg_make(FM_PG_FILLING, 0), n);
		} else if (fm_xport_space_open(p->x, cap, &space)) {
			rc = -ENOSPC;
		} else if (!(m->tail = book(p, tail_at, n, cap, space, last->uffd, 0))) {
			fm_xport_space_close(p->x, space);
			rc = -ENOSPC;
		}
	}
	if (rc)
		unbook(p, m);
	else
		fm_region_bounds(p);
	rlock_un(p);
	return rc;
}

/* What a page that was b is after the move. */
static uint8_t moved_byte(uint8_t b)
{
	if (fm_pg_is_resident(b))
		return pg_make(FM_PG_DIRTY, FM_PGF_REF | (b & FM_PGF_HAS_REMOTE));
	return fm_pg_state(b) == FM_PG_REMOTE ? b : pg_make(FM_PG_UNTOUCHED, 0);
}

/*
 * MREMAP_DONTUNMAP left r's range mapped and empty (it reads as zeros): it
 * stays paged with a memd space of its own (its old one went with its
 * pages), registered again. 0 when it cannot (memd refused a space): step
 * 3 lets it go, and the range is plain memory. Caller holds rlock and every
 * page of r (FILLING).
 */
static int keep_empty(struct fm_pager *p, struct region *r)
{
	uint32_t space;

	if (fm_xport_space_open(p->x, r->cap, &space))
		return 0;
	if (fm_region_uffd_register(r, r->base, r->npages << PG_SHIFT, 0)) {
		fm_xport_space_close(p->x, space);
		return 0;
	}
	r->space = space;
	fm_resmap_slot(p->hdr, (unsigned)r->slot)->space_id = space;
	if (r->heat)
		memset(r->heat, 0, r->npages);
	return 1;
}

/* Step 2. Returns the new address, or MAP_FAILED with errno (the kernel's): then nothing has moved. */
static void *move_pages(struct fm_pager *p, struct remap *m)
{
	uint64_t off = 0, resident = 0, remote = 0;
	void *q;
	int e;

	rlock_rd(p);
	for (int k = 0; k < m->n && m->moves; k++) {
		struct region *r = m->from[k];
		int rc;

		for (uint64_t i = 0; i < r->npages; i++)
			m->was[off++] = fm_claim(p, &r->pg[i]);
		rc = fm_uffd_unregister(r->uffd, r->base, r->npages << PG_SHIFT);
		if (rc)
			fm_fatal("UFFDIO_UNREGISTER of %#lx+%llu pages for an mremap failed: %s", (unsigned long)r->base,
				 (unsigned long long)r->npages, strerror(-rc));
	}
	if (m->hold) {
		fm_sys_munmap(m->hold, m->hold_len);
		m->hold = NULL;
	}
	q = (void *)syscall(SYS_mremap, m->old, m->had << PG_SHIFT, m->want << PG_SHIFT,
			    m->moves ? MREMAP_MAYMOVE | MREMAP_FIXED | (m->keep_old ? MREMAP_DONTUNMAP : 0) : 0, m->to);
	e = errno;
	if (q == MAP_FAILED || (uintptr_t)q != m->to) {
		if (q != MAP_FAILED)
			fm_fatal("mremap moved %#lx to %p, not to %#lx", (unsigned long)m->old, q, (unsigned long)m->to);
		off = 0;
		for (int k = 0; k < m->n && m->moves; k++) {
			struct region *r = m->from[k];
			int rc = fm_region_uffd_register(r, r->base, r->npages << PG_SHIFT, 0);

			if (rc)
				fm_fatal("cannot register %#lx+%llu pages again after a failed mremap: %s",
					 (unsigned long)r->base, (unsigned long long)r->npages, strerror(-rc));
			/* Unregistering dropped their write protection: resident pages are dirty now. */
			for (uint64_t i = 0; i < r->npages; i++, off++)
				pg_release_from(&r->pg[i], FM_PG_FILLING, moved_byte(m->was[off]));
		}
		fm_settled(p);
		rlock_un(p);
		errno = e;
		return MAP_FAILED;
	}
	off = 0;
	for (int k = 0; k < m->n && m->moves; k++) {
		struct region *r = m->from[k], *nr = m->into[k];
		int rc = fm_region_uffd_register(nr, nr->base, nr->npages << PG_SHIFT, 0);

		/* Its remote pages would read as zeros: stop here, not run on. */
		if (rc)
			fm_fatal("cannot register %#lx+%llu pages again after an mremap moved them: %s",
				 (unsigned long)nr->base, (unsigned long long)r->npages, strerror(-rc));
		if (r->heat && nr->heat)
			memcpy(nr->heat, r->heat, r->npages);
		for (uint64_t i = 0; i < r->npages; i++, off++) {
			uint8_t b = m->was[off];

			resident += fm_pg_is_resident(b);
			remote += fm_pg_state(b) == FM_PG_REMOTE;
			pg_release_from(&nr->pg[i], FM_PG_FILLING, moved_byte(b));
		}
		if (m->keep_old)
			m->kept[k] = keep_empty(p, r);
		for (uint64_t i = 0; i < r->npages; i++)
			pg_release_from(&r->pg[i], FM_PG_FILLING, pg_make(FM_PG_UNTOUCHED, 0));
	}
	if (m->grown) {
		struct region *g = m->grown;
		/* Moved, it was registered whole above. */
		int rc = m->moves ? 0
				  : fm_region_uffd_register(g, g->base + (m->grown_at << PG_SHIFT),
							    (g->npages - m->grown_at) << PG_SHIFT, 0);

		if (rc)
			fm_fatal("cannot register the %llu pages an mremap added at %#lx: %s",
				 (unsigned long long)(g->npages - m->grown_at),
				 (unsigned long)(g->base + (m->grown_at << PG_SHIFT)), strerror(-rc));
		for (uint64_t i = m->grown_at; i < g->npages; i++)
			pg_release_from(&g->pg[i], FM_PG_FILLING, pg_make(FM_PG_UNTOUCHED, 0));
	}
	if (m->tail) {
		int rc = fm_region_uffd_register(m->tail, m->tail->base, m->tail->npages << PG_SHIFT, 0);

		if (rc)
			fm_fatal("cannot register the %llu pages an mremap added at %#lx: %s",
				 (unsigned long long)m->tail->npages, (unsigned long)m->tail->base, strerror(-rc));
		for (uint64_t i = 0; i < m->tail->npages; i++)
			pg_release_from(&m->tail->pg[i], FM_PG_FILLING, pg_make(FM_PG_UNTOUCHED, 0));
	}
	fm_settled(p);
	rlock_un(p);
	STAT_ADD(p, remaps, 1);
	STAT_ADD(p, remap_pages_resident, resident);
	STAT_ADD(p, remap_pages_kept, remote);
	return q;
}

/* Step 3 (and step 1's undoing). */
static void let_old_go(struct fm_pager *p, struct remap *m, int moved)
{
	rlock_wr(p);
	if (!moved) {
		unbook(p, m);
	} else {
		for (int k = 0; k < m->n && m->moves; k++) {
			struct region *r = m->from[k];

			if (m->kept[k]) {
				atomic_fetch_add(&p->registered, r->npages);
				continue;
			}
			fm_region_retire(p, r, 0);
			fm_region_gone(p, r->base, r->end);
		}
		atomic_fetch_add(&p->registered, m->added);
		fm_region_bounds(p);
		fm_budget_set(p);
	}
	rlock_un(p);
}

struct remap_call {
	struct fm_pager *p;
	void *old, *at, **out;
	size_t len, new_len;
	int flags, rc;
};

static void remap_run(void *v)
{
	struct remap_call *c = v;

	c->rc = fm_pager_remap(c->p, c->old, c->len, c->new_len, c->flags, c->at, c->out);
}

int fm_pager_remap(struct fm_pager *p, void *old, size_t len, size_t new_len, int flags, void *at, void **out)
{
	struct remap_call c = { p, old, at, out, len, new_len, flags, 0 };
	struct remap m = {
		.old = (uintptr_t)old, .had = len >> PG_SHIFT, .want = new_len >> PG_SHIFT,
		.moves = !!(flags & MREMAP_MAYMOVE), .keep_old = !!(flags & MREMAP_DONTUNMAP),
	};
	void *q, *spot = NULL;
	int rc;

	/* It takes the region lock for writing: on farmem's stack when the caller's is paged (region.c). */
	if (fm_region_off_paged_stack(p, remap_run, &c))
		return c.rc;
	if (!len || ((m.old | len | new_len | (uintptr_t)at) & (PG_SIZE - 1)) || new_len < len ||
	    (flags & ~(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP)) || !!(flags & MREMAP_FIXED) != !!at ||
	    (m.keep_old && (!m.moves || new_len != len)))
		return -EOPNOTSUPP;
	if (!m.moves && new_len == len) {
		*out = old; /* the kernel too leaves it as it is */
		return 0;
	}
	if (!m.moves) {
		m.to = m.old;
		m.hold_len = new_len - len;
		m.hold = fm_sys_mmap((void *)(m.old + len), m.hold_len, PROT_NONE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		if (m.hold != (void *)(m.old + len)) {
			/* Something is mapped there: the kernel's answer too. */
			if (m.hold != MAP_FAILED)
				fm_sys_munmap(m.hold, m.hold_len);
			return m.hold == MAP_FAILED && errno != EEXIST ? -ENOSPC : -ENOMEM;
		}
	} else if (at) {
		m.to = (uintptr_t)at;
	} else {
		/* A place of the new size, which the move then takes (MREMAP_FIXED unmaps what is there). */
		spot = fm_sys_mmap(NULL, new_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (spot == MAP_FAILED)
			return -ENOSPC;
		m.to = (uintptr_t)spot;
	}
	m.was = m.moves ? malloc(m.had) : NULL;
	if (m.moves && !m.was) {
		rc = -ENOSPC;
		goto out;
	}
	rc = book_new(p, &m);
	if (rc)
		goto out;
	q = move_pages(p, &m);
	rc = q == MAP_FAILED ? -errno : 0;
	let_old_go(p, &m, q != MAP_FAILED);
	if (!rc) {
		spot = NULL; /* the range is there now */
		*out = q;
		fm_debug("mremap of %p+%zu KiB to %p+%zu KiB: %d region(s) went with their books", old, len >> 10,
			 q, new_len >> 10, m.n);
	}
out:
	free(m.was);
	if (spot)
		fm_sys_munmap(spot, new_len);
	if (m.hold)
		fm_sys_munmap(m.hold, m.hold_len);
	return rc;
}
