// SPDX-License-Identifier: Apache-2.0
/*
 * fm_pager_move_bytes: a collector's object moves done where the pages lie
 * (pager.h). A full GC's compaction slides every live object down the heap;
 * with most of the heap in memd, copying an object there means fetching its
 * source pages, faulting in destination pages whose old bytes are dead, and
 * later writing the destination back: the same bytes cross twice, and the
 * pages pushed out to make room are the ones the compaction reaches next.
 * Semeru and Mako move that work to the memory server. Here each page of a
 * move is used where it is: a resident page through the heap, a page only
 * memd holds in memd's store (fm_chan_page_open: shm, whose store is mapped
 * here), so a remote object moved to a remote destination never comes here.
 *
 * Every page a call touches is held first, by compare-and-swap, for the
 * whole call: REMOTE and UNTOUCHED pages as FILLING (their store slot is
 * changed, and they stay remote), DIRTY ones as UPDATING (written through
 * the heap; the evictor keeps off), CLEAN ones as UPDATING if only read. A
 * page in any other state (someone else holds it; a clean page to be
 * written, which would need an unprotect; unmanaged) ends the call there:
 * the collector copies that object itself, faulting as usual. A store page
 * is checked against its checksum when opened and sealed with a new one at
 * the end, so a page memd damaged is found here as on any read, and memd
 * holds the moved bytes before the pages are let go: nothing is lost.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "chanpool.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "region.h"
#include "uffd_ops.h"
#include "wait.h"

/* Pages one call may hold (on the caller's stack): the collector sends batches well under it. */
#define HELD_MAX 512u

enum held_kind { HELD_LOCAL, HELD_STORE };

struct held {
	uint64_t i;
	uint8_t old;        /* its byte before the hold */
	uint8_t kind;       /* enum held_kind */
	uint8_t write;      /* some move writes it */
	uint8_t *bytes;     /* where its bytes are: the heap page, or the store's */
};

struct call {
	struct fm_pager *p;
	struct region *r;
	struct fm_borrowed fc;  /* a pool channel (fault=signal) */
	struct fm_chan *own;    /* or one of the call's own: handler-thread mode has no pool */
	struct held h[HELD_MAX];
	unsigned n;
	uint16_t where[2 * HELD_MAX]; /* page index -> 1 + its place in h, open addressing; 0 empty */
};

static struct fm_chan *chan(struct call *c)
{
	int rc;

	if (c->own || !c->p->npool) {
		if (!c->own && (rc = fm_chan_open(c->p->x, &c->own)))
			fm_fatal("cannot open a channel to memd for a collector's move: %s", strerror(-rc));
		return c->own;
	}
	return fm_borrow(c->p, &c->fc);
}

static void chan_done(struct call *c)
{
	fm_give_back(c->p, &c->fc);
	fm_chan_close(c->own);
	c->own = NULL;
}

static struct held *find_held(struct call *c, uint64_t i)
{
	for (unsigned s = (unsigned)i & (2 * HELD_MAX - 1);; s = (s + 1) & (2 * HELD_MAX - 1)) {
		unsigned k = c->where[s];
		if (!k)
			return NULL;
		if (c->h[k - 1].i == i)
			return &c->h[k - 1];
	}
}

/* The table has room: at most HELD_MAX entries in twice as many slots. */
static void index_held(struct call *c, unsigned k)
{
	unsigned s = (unsigned)c->h[k].i & (2 * HELD_MAX - 1);

	while (c->where[s])
		s = (s + 1) & (2 * HELD_MAX - 1);
	c->where[s] = (uint16_t)(k + 1);
}

/* Forget the entries [from, c->n) (rolled back): the table is rebuilt from what is left. */
static void unindex_from(struct call *c, unsigned from)
{
	memset(c->where, 0, sizeof(c->where));
	for (unsigned k = 0; k < from; k++)
		index_held(c, k);
}

/*
 * Hold page i for a move that reads it (write 0) or writes it. Returns 0, or
 * -EBUSY when the page cannot be used here (nothing was changed).
 */
static int hold(struct call *c, uint64_t i, int write)
{
	struct held *e = find_held(c, i);
	uint8_t b;
	unsigned s;

	if (e) {
		if (write && e->kind == HELD_LOCAL && fm_pg_state(e->old) == FM_PG_CLEAN)
			return -EBUSY;
		e->write |= (uint8_t)write;
		return 0;
	}
	if (c->n == HELD_MAX)
		return -EBUSY;
	b = pg_load(&c->r->pg[i]);
	s = fm_pg_state(b);
	e = &c->h[c->n];
	*e = (struct held){ .i = i, .old = b, .write = (uint8_t)write };
	if (s == FM_PG_REMOTE || s == FM_PG_UNTOUCHED) {
		if (!pg_cas(&c->r->pg[i], &b, pg_make(FM_PG_FILLING, b)))
			return -EBUSY;
		e->kind = HELD_STORE;
	} else if (s == FM_PG_DIRTY || (s == FM_PG_CLEAN && !write)) {
		if (!pg_cas(&c->r->pg[i], &b, pg_make(FM_PG_UPDATING, b)))
			return -EBUSY;
		e->kind = HELD_LOCAL;
		e->bytes = (uint8_t *)(c->r->base + (i << PG_SHIFT));
	} else {
		return -EBUSY;
	}
	index_held(c, c->n++);
	return 0;
}

/* Let go of held pages [from, c->n): store pages (all open by now) stay remote, their bytes sealed in memd. */
static void release_from(struct call *c, unsigned from)
{
	struct fm_pager *p = c->p;

	for (unsigned k = from; k < c->n; k++) {
		struct held *e = &c->h[k];
		uint8_t *b = &c->r->pg[e->i];
		if (e->kind == HELD_LOCAL)
			pg_release_from(b, FM_PG_UPDATING, e->old);
		else
			pg_release_from(b, FM_PG_FILLING, pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE));
		/* A handler thread's fault on a page we held waits in the kernel for a wake. */
		if (!p->in_thread && e->kind == HELD_STORE)
			fm_uffd_wake(p->uffd, c->r->base + (e->i << PG_SHIFT), PG_SIZE);
	}
	c->n = from;
}

/*
 * The store pages held since `from` that are not open yet, opened. A page memd
 * cannot give back is fatal, as on a read; no room for a new one ends the call.
 */
static int open_store(struct call *c, unsigned from)
{
	struct fm_pager *p = c->p;

	for (unsigned k = from; k < c->n; k++) {
		struct held *e = &c->h[k];
		int rc;
		if (e->kind != HELD_STORE || e->bytes)
			continue;
		rc = fm_chan_page_open(chan(c), c->r->space, e->i,
				       fm_pg_state(e->old) == FM_PG_UNTOUCHED, &e->bytes);
		if (rc == -ENOSPC || rc == -EOPNOTSUPP || rc == -EPIPE)
			return rc;
		if (rc) {
			STAT_ADD(p, transport_errors, 1);
			if (rc == -EIO)
				STAT_ADD(p, crc_errors, 1);
			fm_fatal("page %#lx is in memd but cannot be read back for a collector's move (%s%s)",
				 (unsigned long)(c->r->base + (e->i << PG_SHIFT)), strerror(-rc),
				 rc == -EIO ? ": checksum mismatch" : "");
		}
	}
	return 0;
}

/* Hold and open every page of move m; on failure nothing of it is held. */
static int take_move(struct call *c, const struct fm_byte_move *m)
{
	uint64_t s0 = (m->src - c->r->base) >> PG_SHIFT, s1 = (m->src + m->len - 1 - c->r->base) >> PG_SHIFT;
	uint64_t d0 = (m->dst - c->r->base) >> PG_SHIFT, d1 = (m->dst + m->len - 1 - c->r->base) >> PG_SHIFT;
	unsigned from = c->n;
	int rc = 0;

	for (uint64_t i = s0; !rc && i <= s1; i++)
		rc = hold(c, i, 0);
	for (uint64_t i = d0; !rc && i <= d1; i++)
		rc = hold(c, i, 1);
	if (!rc)
		rc = open_store(c, from);
	if (rc) {
		/* A store page opened for this move stays held until the end: it may be a new one, sealed as zeros. */
		unsigned keep = from;
		for (unsigned k = from; k < c->n; k++)
			if (c->h[k].kind == HELD_STORE && c->h[k].bytes)
				c->h[keep++] = c->h[k];
			else if (c->h[k].kind == HELD_LOCAL)
				pg_release_from(&c->r->pg[c->h[k].i], FM_PG_UPDATING, c->h[k].old);
			else
				pg_release_from(&c->r->pg[c->h[k].i], FM_PG_FILLING, c->h[k].old);
		c->n = keep;
		unindex_from(c, keep);
	}
	return rc;
}

/* Where byte a of the heap is during this call: the heap itself, or memd's store. */
static uint8_t *at(struct call *c, uintptr_t a)
{
	struct held *e = find_held(c, (a - c->r->base) >> PG_SHIFT);

	return e->bytes + (a & (PG_SIZE - 1));
}

/* memmove's semantics, piece by piece: no piece crosses a page of either side. */
static void move(struct call *c, const struct fm_byte_move *m)
{
	size_t done = 0;
	int down = m->dst <= m->src;

	while (done < m->len) {
		/* Down: from the start, as memmove does; up (overlapping from below): from the end. */
		size_t left = m->len - done, n;
		uintptr_t s, d;
		if (down) {
			s = m->src + done;
			d = m->dst + done;
			n = PG_SIZE - (s & (PG_SIZE - 1));
			if (PG_SIZE - (d & (PG_SIZE - 1)) < n)
				n = PG_SIZE - (d & (PG_SIZE - 1));
		} else {
			uintptr_t se = m->src + left, de = m->dst + left;
			n = ((se - 1) & (PG_SIZE - 1)) + 1;
			if (((de - 1) & (PG_SIZE - 1)) + 1 < n)
				n = ((de - 1) & (PG_SIZE - 1)) + 1;
			if (n > left)
				n = left;
			s = se - n;
			d = de - n;
		}
		if (n > left)
			n = left;
		memmove(at(c, d), at(c, s), n);
		done += n;
	}
	if (m->set_first_word)
		memcpy(at(c, m->dst), &m->first_word, sizeof(m->first_word));
}

long fm_pager_move_bytes(struct fm_pager *p, const struct fm_byte_move *m, unsigned n)
{
	struct call c = { .p = p };
	unsigned done = 0;
	uint64_t bytes = 0, pages = 0;
	int ridx;

	if (!n)
		return 0;
	for (unsigned k = 0; k < n; k++)
		if (!m[k].len || m[k].src + m[k].len < m[k].src || m[k].dst + m[k].len < m[k].dst ||
		    (m[k].set_first_word && m[k].len < sizeof(m[k].first_word)))
			return -EINVAL;
	if (fm_xport_kind(p->x) != FM_XPORT_SHM)
		return -EOPNOTSUPP;
	c.fc.tid = gettid();
	rlock_rd(p);
	c.r = fm_region_find(p, m[0].src, &ridx);
	for (; done < n; done++) {
		const struct fm_byte_move *x = &m[done];
		if (!c.r || c.r->alias || x->src < c.r->base || x->src + x->len > c.r->end ||
		    x->dst < c.r->base || x->dst + x->len > c.r->end || take_move(&c, x))
			break;
		move(&c, x);
		bytes += x->len;
	}
	/* memd holds the moved bytes before anyone may use the pages again. */
	for (unsigned k = 0; k < c.n; k++) {
		struct held *e = &c.h[k];
		if (e->kind != HELD_STORE)
			continue;
		if (fm_chan_page_seal(chan(&c), c.r->space, e->i))
			fm_fatal("memd's store went away under a collector's move at %#lx",
				 (unsigned long)(c.r->base + (e->i << PG_SHIFT)));
		pages++;
	}
	release_from(&c, 0);
	rlock_un(p);
	chan_done(&c);
	fm_settled(p);
	STAT_ADD(p, compact_moves, done);
	STAT_ADD(p, compact_bytes, bytes);
	STAT_ADD(p, compact_pages, pages);
	if (done < n)
		STAT_ADD(p, compact_declined, 1);
	return done;
}

int fm_pager_read_words(struct fm_pager *p, const void *addr, void *out, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	struct call c = { .p = p };
	int ridx, rc = -EBUSY;

	if (!len || (a & (PG_SIZE - 1)) + len > PG_SIZE)
		return -EINVAL;
	if (fm_xport_kind(p->x) != FM_XPORT_SHM)
		return -EOPNOTSUPP;
	c.fc.tid = gettid();
	rlock_rd(p);
	c.r = fm_region_find(p, a, &ridx);
	if (c.r && !c.r->alias && !hold(&c, (a - c.r->base) >> PG_SHIFT, 0)) {
		struct held *e = &c.h[0];
		if (e->kind == HELD_STORE && fm_pg_state(e->old) == FM_PG_UNTOUCHED) {
			memset(out, 0, len); /* never written, or only zeros: nothing in memd to open */
			rc = 0;
		} else if (e->kind == HELD_LOCAL || !(rc = open_store(&c, 0))) {
			memcpy(out, at(&c, a), len);
			rc = 0;
		}
		/* Released as it was: nothing changed, so no seal. */
		if (e->kind == HELD_LOCAL)
			pg_release_from(&c.r->pg[e->i], FM_PG_UPDATING, e->old);
		else
			pg_release_from(&c.r->pg[e->i], FM_PG_FILLING, e->old);
		if (!p->in_thread && e->kind == HELD_STORE)
			fm_uffd_wake(p->uffd, a & ~(uintptr_t)(PG_SIZE - 1), PG_SIZE);
	}
	rlock_un(p);
	chan_done(&c);
	fm_settled(p);
	return rc;
}

int fm_pager_write_words(struct fm_pager *p, void *addr, const void *data, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	struct call c = { .p = p };
	int ridx, rc = -EBUSY;

	if (!len || (a & (PG_SIZE - 1)) + len > PG_SIZE)
		return -EINVAL;
	if (fm_xport_kind(p->x) != FM_XPORT_SHM)
		return -EOPNOTSUPP;
	c.fc.tid = gettid();
	rlock_rd(p);
	c.r = fm_region_find(p, a, &ridx);
	if (c.r && !c.r->alias && !hold(&c, (a - c.r->base) >> PG_SHIFT, 1)) {
		struct held *e = &c.h[0];
		if (e->kind == HELD_LOCAL || !(rc = open_store(&c, 0))) {
			memcpy(at(&c, a), data, len);
			rc = 0;
			if (e->kind == HELD_STORE && fm_chan_page_seal(chan(&c), c.r->space, e->i))
				fm_fatal("memd's store went away under a collector's write at %#lx", (unsigned long)a);
			STAT_ADD(p, compact_pages, e->kind == HELD_STORE);
		}
		if (e->kind == HELD_LOCAL)
			pg_release_from(&c.r->pg[e->i], FM_PG_UPDATING, e->old);
		else if (!rc || e->bytes)
			pg_release_from(&c.r->pg[e->i], FM_PG_FILLING, pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE));
		else
			pg_release_from(&c.r->pg[e->i], FM_PG_FILLING, e->old);
		if (!p->in_thread && e->kind == HELD_STORE)
			fm_uffd_wake(p->uffd, a & ~(uintptr_t)(PG_SIZE - 1), PG_SIZE);
	}
	rlock_un(p);
	chan_done(&c);
	fm_settled(p);
	return rc;
}
