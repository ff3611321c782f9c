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
 * Every page a move touches is held first, by compare-and-swap, until the
 * next move of the call does not use it: REMOTE and UNTOUCHED pages as
 * FILLING (their store slot is changed, and they stay remote), DIRTY and
 * CLEAN ones as UPDATING (used through the heap; the evictor keeps off). A
 * clean page a move writes is unprotected while held, a move's run of them
 * in one call, and is let go DIRTY: declined, the collector's copy took a
 * write-protect fault per page, each unprotect a TLB shootdown. A page in
 * any other state (someone else holds it; unmanaged) ends the call there:
 * the collector copies that object itself, faulting as usual. A store page
 * is checked against its checksum when opened and
 * sealed with a new one before it is let go, so a page memd damaged is found
 * here as on any read, and memd holds the moved bytes before anyone else can
 * use the page: nothing is lost.
 */
#include <errno.h>
#include <stdlib.h>
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
	uint8_t whole;      /* the move it was opened for overwrites it whole: opened unread, unzeroed */
	uint8_t opening;    /* clean and written: to be unprotected (open_clean_held) before a byte is */
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

/* All but h[], which only n says is in use: a header read's call zeroed 14 KiB for one page. */
static void call_init(struct call *c, struct fm_pager *p)
{
	c->p = p;
	c->r = NULL;
	c->fc = (struct fm_borrowed){ .tid = fm_thread_id() };
	c->own = NULL;
	c->n = 0;
	memset(c->where, 0, sizeof(c->where));
}

static struct fm_chan *chan(struct call *c)
{
	int rc;

	if (c->own || !c->p->npool) {
		if (!c->own && (rc = fm_chan_open(c->p->x, &c->own)))
			fm_fatal("cannot open a channel to memd for a collector's move: %s", fm_strerror(-rc));
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

/* memd said no (full, no such op, gone): nothing changed, and the collector does the work itself. */
static int refused(int rc)
{
	return rc == -ENOSPC || rc == -EOPNOTSUPP || rc == -EPIPE;
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
		e->opening |= (uint8_t)(write && e->kind == HELD_LOCAL && fm_pg_state(e->old) == FM_PG_CLEAN);
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
	} else if (s == FM_PG_DIRTY || s == FM_PG_CLEAN) {
		if (!pg_cas(&c->r->pg[i], &b, pg_make(FM_PG_UPDATING, b)))
			return -EBUSY;
		e->kind = HELD_LOCAL;
		e->opening = (uint8_t)(s == FM_PG_CLEAN && write);
		e->bytes = (uint8_t *)(c->r->base + (i << PG_SHIFT));
	} else {
		return -EBUSY;
	}
	index_held(c, c->n++);
	return 0;
}

/*
 * The clean pages held to be written, unprotected: consecutive ones in one
 * call (one TLB shootdown), as a write-protect fault's open_clean does. Held
 * UPDATING, no eviction protects one again meanwhile; from here on each is
 * let go DIRTY, whether a byte is written or the move is given up (memd's
 * copy is then still good, and written again at no harm).
 */
static void open_clean_held(struct call *c)
{
	for (unsigned k = 0; k < c->n;) {
		unsigned m = 1;

		if (!c->h[k].opening) {
			k++;
			continue;
		}
		while (k + m < c->n && c->h[k + m].opening && c->h[k + m].i == c->h[k].i + m)
			m++;
		fm_uffd_wp(c->r->uffd, c->r->base + (c->h[k].i << PG_SHIFT), (size_t)m << PG_SHIFT, 0);
		for (unsigned j = k; j < k + m; j++) {
			struct held *e = &c->h[j];
			uint8_t fl = (uint8_t)((e->old | FM_PGF_REF) & ~(FM_PGF_PREFETCH | FM_PGF_GARBAGE));

			e->old = pg_make(FM_PG_DIRTY, fl);
			e->opening = 0;
		}
		STAT_ADD(c->p, compact_opened, m);
		k += m;
	}
}

/* Let go of a held page: a store page (open by now) stays remote, its bytes sealed in memd. */
static void let_go(struct call *c, const struct held *e)
{
	uint8_t *b = &c->r->pg[e->i];

	if (e->kind == HELD_LOCAL) {
		pg_release_from(b, FM_PG_UPDATING, e->old);
	} else {
		fm_memd_holds(c->p);
		pg_release_from(b, FM_PG_FILLING, pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE));
	}
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
				       (fm_pg_state(e->old) == FM_PG_UNTOUCHED ? FM_PAGE_CREATE : 0) |
					       (e->whole ? FM_PAGE_OVERWRITE : 0),
				       &e->bytes);
		if (refused(rc))
			return rc;
		if (rc) {
			STAT_ADD(p, transport_errors, 1);
			if (rc == -EIO)
				STAT_ADD(p, crc_errors, 1);
			fm_fatal("page %#lx is in memd but cannot be read back for a collector's move (%s%s)",
				 (unsigned long)(c->r->base + (e->i << PG_SHIFT)), fm_strerror(-rc),
				 rc == -EIO ? ": checksum mismatch" : "");
		}
	}
	return 0;
}

/* Hold the pages move m reads, then those it writes; stops at the first that cannot be held. */
static int hold_move(struct call *c, const struct fm_byte_move *m)
{
	uint64_t s0 = (m->src - c->r->base) >> PG_SHIFT, s1 = (m->src + m->len - 1 - c->r->base) >> PG_SHIFT;
	uint64_t d0 = (m->dst - c->r->base) >> PG_SHIFT, d1 = (m->dst + m->len - 1 - c->r->base) >> PG_SHIFT;
	int rc = 0;

	for (uint64_t i = s0; !rc && i <= s1; i++)
		rc = hold(c, i, 0);
	for (uint64_t i = d0; !rc && i <= d1; i++)
		rc = hold(c, i, 1);
	open_clean_held(c);
	return rc;
}

/*
 * The store pages newly held for move m that it writes whole, and reads
 * nothing of: their old bytes are dead, so they are opened without a
 * checksum's read or zeroing. A later move of the call that reads one reads
 * what m wrote.
 */
static void mark_whole(struct call *c, unsigned from, const struct fm_byte_move *m)
{
	uintptr_t s0 = m->src & ~(uintptr_t)(PG_SIZE - 1), s1 = m->src + m->len;

	for (unsigned k = from; k < c->n; k++) {
		struct held *e = &c->h[k];
		uintptr_t a = c->r->base + (e->i << PG_SHIFT);
		e->whole = e->kind == HELD_STORE && e->write && m->dst <= a && m->dst + m->len >= a + PG_SIZE &&
			   (a + PG_SIZE <= s0 || a >= s1);
	}
}

/*
 * A page opened whole for a move that is not done after all: its old bytes
 * stand. One memd held is left as it was (not written, so not sealed); one it
 * did not is a new page of zeros, as an open would have made it.
 */
static void unwhole(struct held *e)
{
	if (!e->whole)
		return;
	e->whole = 0;
	e->write = 0;
	if (fm_pg_state(e->old) == FM_PG_UNTOUCHED)
		memset(e->bytes, 0, PG_SIZE);
}

/* Hold and open every page of move m; on failure nothing of it is held. */
static int take_move(struct call *c, const struct fm_byte_move *m)
{
	unsigned from = c->n;
	int rc = hold_move(c, m);

	if (!rc) {
		mark_whole(c, from, m);
		rc = open_store(c, from);
	}
	if (rc) {
		/* A store page opened for this move stays held until the end: it may be a new one, sealed as zeros. */
		unsigned keep = from;
		for (unsigned k = from; k < c->n; k++)
			if (c->h[k].kind == HELD_STORE && c->h[k].bytes) {
				unwhole(&c->h[k]);
				c->h[keep++] = c->h[k];
			} else if (c->h[k].kind == HELD_LOCAL)
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

/*
 * The piece of move m that starts `done` bytes in, in memmove's order: down
 * (dst below src) from the start, up (overlapping from below) from the end.
 * No piece crosses a page of either side. Returns its length.
 */
static size_t next_piece(const struct fm_byte_move *m, size_t done, uintptr_t *s, uintptr_t *d)
{
	size_t left = m->len - done, n;

	if (m->dst <= m->src) {
		*s = m->src + done;
		*d = m->dst + done;
		n = PG_SIZE - (*s & (PG_SIZE - 1));
		if (PG_SIZE - (*d & (PG_SIZE - 1)) < n)
			n = PG_SIZE - (*d & (PG_SIZE - 1));
		return n < left ? n : left;
	}
	uintptr_t se = m->src + left, de = m->dst + left;
	n = ((se - 1) & (PG_SIZE - 1)) + 1;
	if (((de - 1) & (PG_SIZE - 1)) + 1 < n)
		n = ((de - 1) & (PG_SIZE - 1)) + 1;
	if (n > left)
		n = left;
	*s = se - n;
	*d = de - n;
	return n;
}

/* memmove's semantics, piece by piece. */
static void move(struct call *c, const struct fm_byte_move *m)
{
	for (size_t done = 0, n; done < m->len; done += n) {
		uintptr_t s, d;
		n = next_piece(m, done, &s, &d);
		memmove(at(c, d), at(c, s), n);
	}
	if (m->set_first_word)
		memcpy(at(c, m->dst), &m->first_word, sizeof(m->first_word));
}

/* --- over the wire: memd's EDIT ------------------------------------------------------ */

/*
 * With a memd whose store is not mapped here (stream: TCP or a Unix socket),
 * the same moves go to memd as EDIT requests (protocol.h): MOVE for a piece
 * from a page memd holds to another, PUT for one from a resident page, GET
 * for one to a resident page. memd applies a request all or nothing; the
 * pieces between resident pages, and what GETs bring, are applied here only
 * once memd said yes, so a refused request leaves every byte as it was and
 * the collector copies that move itself. That order is sound because no
 * piece reads bytes an earlier piece of the request writes (a compaction's
 * destinations never reach a later source; a promotion's destination is
 * fresh): a move whose source would is sent in the next request.
 */
#define EDIT_PUT_MAX (512u << 10)
#define EDIT_GET_MAX (512u << 10)
#define EDIT_LOCAL_MAX 1024u

struct local_op {
	uint8_t *dst;
	const uint8_t *src;    /* a resident page's bytes, or NULL: get_off into the reply, or zeros */
	uint32_t len;
	uint32_t get_off;      /* with src NULL: offset into the GET bytes, or UINT32_MAX for zeros */
};

struct edit_batch {
	struct fm_edit_ent e[FM_MAX_EDITS];
	unsigned ne;
	uint8_t *put;          /* EDIT_PUT_MAX */
	size_t put_len, get_len;
	struct local_op lo[EDIT_LOCAL_MAX];
	unsigned nlo;
	uintptr_t dst_lo[FM_MAX_EDITS], dst_hi[FM_MAX_EDITS]; /* the batch's moves' destinations */
	unsigned nmoves;
	unsigned store_pages;
};

static int store_page(const struct held *e)
{
	return e->kind == HELD_STORE;
}

/* Room in the batch (and the call's held pages) for move m, counted generously: two entries, two local ops a page. */
static int batch_has_room(const struct call *c, const struct edit_batch *b, const struct fm_byte_move *m)
{
	size_t pages = (m->len >> PG_SHIFT) + 2;

	return c->n + 2 * pages <= HELD_MAX &&
	       b->ne + 2 * pages + 1 <= FM_MAX_EDITS && b->nlo + 2 * pages + 1 <= EDIT_LOCAL_MAX &&
	       b->put_len + m->len + 8 <= EDIT_PUT_MAX && b->get_len + m->len <= EDIT_GET_MAX &&
	       b->store_pages + 2 * pages <= FM_MAX_EDIT_PAGES;
}

/* Does move m read bytes a move already in the batch writes? Then it waits for the next request. */
static int reads_batch(const struct edit_batch *b, const struct fm_byte_move *m)
{
	for (unsigned k = 0; k < b->nmoves; k++)
		if (m->src < b->dst_hi[k] && b->dst_lo[k] < m->src + m->len)
			return 1;
	return 0;
}

static uint64_t space_off(const struct call *c, uintptr_t a)
{
	return (uint64_t)(a - c->r->base);
}

/* One piece: n bytes from s to d, each inside one page. */
static void add_piece(struct call *c, struct edit_batch *b, uintptr_t s, uintptr_t d, uint32_t n)
{
	struct held *hs = find_held(c, (s - c->r->base) >> PG_SHIFT), *hd = find_held(c, (d - c->r->base) >> PG_SHIFT);
	int s_untouched = store_page(hs) && fm_pg_state(hs->old) == FM_PG_UNTOUCHED;

	if (!store_page(hd)) {
		struct local_op *o = &b->lo[b->nlo++];
		*o = (struct local_op){ .dst = (uint8_t *)d, .len = n, .get_off = UINT32_MAX };
		if (!store_page(hs)) {
			o->src = (const uint8_t *)s;
		} else if (!s_untouched) {
			o->get_off = (uint32_t)b->get_len;
			b->e[b->ne++] = (struct fm_edit_ent){ .kind = FM_EDIT_GET, .len = n, .src = space_off(c, s) };
			b->get_len += n;
		}
		return;
	}
	hd->write = 1;
	if (store_page(hs) && !s_untouched) {
		b->e[b->ne++] = (struct fm_edit_ent){ .kind = FM_EDIT_MOVE, .len = n, .src = space_off(c, s),
						      .dst = space_off(c, d) };
		return;
	}
	/* From a resident page (its bytes now: nothing in the batch writes them), or zeros. */
	if (store_page(hs))
		memset(b->put + b->put_len, 0, n);
	else
		memcpy(b->put + b->put_len, (const void *)s, n);
	b->e[b->ne++] = (struct fm_edit_ent){ .kind = FM_EDIT_PUT, .len = n, .dst = space_off(c, d) };
	b->put_len += n;
}

static void add_move(struct call *c, struct edit_batch *b, const struct fm_byte_move *m)
{
	for (size_t done = 0, n; done < m->len; done += n) {
		uintptr_t s, d;
		n = next_piece(m, done, &s, &d);
		add_piece(c, b, s, d, (uint32_t)n);
	}
	if (m->set_first_word) {
		struct held *hd = find_held(c, (m->dst - c->r->base) >> PG_SHIFT);
		if (store_page(hd)) {
			memcpy(b->put + b->put_len, &m->first_word, sizeof(m->first_word));
			b->e[b->ne++] = (struct fm_edit_ent){ .kind = FM_EDIT_PUT, .len = sizeof(m->first_word),
							      .dst = space_off(c, m->dst) };
			b->put_len += sizeof(m->first_word);
		} else {
			b->lo[b->nlo++] = (struct local_op){ .dst = (uint8_t *)m->dst, .src = (const uint8_t *)&m->first_word,
							     .len = sizeof(m->first_word) };
		}
	}
	b->dst_lo[b->nmoves] = m->dst;
	b->dst_hi[b->nmoves++] = m->dst + m->len;
}

/* Hold a move's pages for the edit path (nothing opened). On failure nothing of it is held. */
static int take_move_edit(struct call *c, const struct fm_byte_move *m, unsigned *new_store)
{
	unsigned from = c->n;
	int rc = hold_move(c, m);

	if (rc) {
		for (unsigned k = from; k < c->n; k++)
			pg_release_from(&c->r->pg[c->h[k].i], c->h[k].kind == HELD_LOCAL ? FM_PG_UPDATING : FM_PG_FILLING,
					c->h[k].old);
		c->n = from;
		unindex_from(c, from);
		return rc;
	}
	for (unsigned k = from; k < c->n; k++)
		*new_store += store_page(&c->h[k]);
	return 0;
}

/* Let every held page go: a store page written now remote with memd's new bytes, the others as they were. */
static void release_edit(struct call *c, int applied)
{
	for (unsigned k = 0; k < c->n; k++) {
		struct held *e = &c->h[k];
		uint8_t *b = &c->r->pg[e->i];
		if (e->kind == HELD_LOCAL) {
			pg_release_from(b, FM_PG_UPDATING, e->old);
		} else if (applied && e->write) {
			fm_memd_holds(c->p);
			pg_release_from(b, FM_PG_FILLING, pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE));
		} else {
			pg_release_from(b, FM_PG_FILLING, e->old);
		}
	}
	c->n = 0;
	memset(c->where, 0, sizeof(c->where));
}

/*
 * Send the batch; on success apply its local part. 0, or the transport's
 * refusal (-ENOSPC, -EOPNOTSUPP, -EPIPE): nothing changed anywhere. Anything
 * else is fatal: a page memd cannot give back, or a request whose fate is
 * unknown (sent, never answered), after which no byte of these pages can be
 * trusted.
 */
static int send_batch(struct call *c, struct edit_batch *b)
{
	struct fm_pager *p = c->p;
	const uint8_t *get = NULL;
	int rc = 0;

	if (b->ne) {
		rc = fm_chan_edit(chan(c), c->r->space, b->e, b->ne, b->put, b->put_len, b->get_len,
				  (const void **)&get);
		if (refused(rc))
			return rc;
		if (rc) {
			STAT_ADD(p, transport_errors, 1);
			if (rc == -EIO)
				STAT_ADD(p, crc_errors, 1);
			fm_fatal("memd at %s could not do a collector's moves in its store (%s%s): the heap's pages "
				 "there cannot be trusted", fm_xport_addr(p->x), fm_strerror(-rc),
				 rc == -EIO ? ": checksum mismatch" : "");
		}
		STAT_ADD(p, remote_read_bytes, b->get_len);
		STAT_ADD(p, remote_write_bytes, b->put_len);
	}
	for (unsigned k = 0; k < b->nlo; k++) {
		struct local_op *o = &b->lo[k];
		if (o->src)
			memmove(o->dst, o->src, o->len);
		else if (o->get_off != UINT32_MAX)
			memcpy(o->dst, get + o->get_off, o->len);
		else
			memset(o->dst, 0, o->len);
	}
	return 0;
}

static long move_bytes_edit(struct fm_pager *p, const struct fm_byte_move *m, unsigned n)
{
	struct call *c = calloc(1, sizeof(*c));
	struct edit_batch *b = calloc(1, sizeof(*b));
	unsigned done = 0, sent = 0;
	uint64_t bytes = 0, pages = 0;
	long ret = 0;
	int ridx;

	if (b)
		b->put = malloc(EDIT_PUT_MAX);
	if (!c || !b || !b->put) {
		ret = -ENOMEM;
		goto out;
	}
	c->p = p;
	c->fc.tid = fm_thread_id();
	rlock_rd(p);
	c->r = fm_region_find(p, m[0].src, &ridx);
	for (;;) {
		const struct fm_byte_move *x = done < n ? &m[done] : NULL;
		unsigned new_store = 0;
		int stop = 0, rc;

		if (x) {
			if (!c->r || c->r->alias || x->src < c->r->base || x->src + x->len > c->r->end ||
			    x->dst < c->r->base || x->dst + x->len > c->r->end)
				stop = 1;
			else if (b->nmoves && (reads_batch(b, x) || !batch_has_room(c, b, x)))
				; /* send what is queued first, then this one */
			else if (!batch_has_room(c, b, x) || take_move_edit(c, x, &new_store))
				stop = 1; /* too large alone, or a page busy: the collector's */
			else {
				b->store_pages += new_store;
				add_move(c, b, x);
				done++;
				continue;
			}
		}
		if (b->nmoves) {
			for (unsigned k = 0; k < c->n; k++)
				pages += store_page(&c->h[k]) && c->h[k].write;
			rc = send_batch(c, b);
			release_edit(c, !rc);
			if (rc) {
				if (rc == -EOPNOTSUPP && !sent) {
					atomic_store(&p->edit_off, 1);
					ret = -EOPNOTSUPP;
				}
				break;
			}
			for (unsigned k = sent; k < done; k++)
				bytes += m[k].len;
			sent = done;
			b->ne = b->nlo = b->nmoves = b->store_pages = 0;
			b->put_len = b->get_len = 0;
		}
		if (!x || stop)
			break;
	}
	rlock_un(p);
	chan_done(c);
	fm_settled(p);
	STAT_ADD(p, compact_moves, sent);
	STAT_ADD(p, compact_bytes, bytes);
	STAT_ADD(p, compact_pages, pages);
	if (sent < n)
		STAT_ADD(p, compact_declined, 1);
	if (!ret)
		ret = sent;
out:
	if (b)
		free(b->put);
	free(b);
	free(c);
	return ret;
}

/*
 * memd holds the moved bytes before anyone may use the page again. A page
 * memd held that moves only read still matches its checksum: no seal, which
 * would read it all again for the same sum. One it did not hold (opened as
 * zeros) is sealed so that it is there from now on. Returns 1 if sealed.
 */
static int seal(struct call *c, const struct held *e)
{
	if (e->kind != HELD_STORE || (!e->write && fm_pg_state(e->old) != FM_PG_UNTOUCHED))
		return 0;
	if (fm_chan_page_seal(chan(c), c->r->space, e->i))
		fm_fatal("memd's store went away under a collector's move at %#lx",
			 (unsigned long)(c->r->base + (e->i << PG_SHIFT)));
	return 1;
}

/* 1 if move m (inside the call's region) reads or writes page i. */
static int uses(const struct call *c, const struct fm_byte_move *m, uint64_t i)
{
	uintptr_t a = c->r->base + (i << PG_SHIFT);

	return (m->src < a + PG_SIZE && m->src + m->len > a) || (m->dst < a + PG_SIZE && m->dst + m->len > a);
}

/*
 * After a move, the pages the next one does not use are sealed and let go.
 * Held to the end of the call, a promotion's last page, which the next
 * object allocated after it shares, kept the worker that copies that object
 * waiting for the whole call (hundreds of pages of moves) instead of one
 * move. A page a later move uses again is held again then.
 */
static uint64_t let_go_unused(struct call *c, const struct fm_byte_move *next)
{
	unsigned keep = 0;
	uint64_t sealed = 0;

	for (unsigned k = 0; k < c->n; k++) {
		struct held *e = &c->h[k];
		if (next && uses(c, next, e->i)) {
			c->h[keep++] = *e;
			continue;
		}
		sealed += (uint64_t)seal(c, e);
		let_go(c, e);
	}
	if (keep < c->n) {
		c->n = keep;
		unindex_from(c, keep);
		fm_settled(c->p);
	}
	return sealed;
}

long fm_pager_move_bytes(struct fm_pager *p, const struct fm_byte_move *m, unsigned n)
{
	struct call c;
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
		return atomic_load(&p->edit_off) ? -EOPNOTSUPP : move_bytes_edit(p, m, n);
	call_init(&c, p);
	rlock_rd(p);
	c.r = fm_region_find(p, m[0].src, &ridx);
	for (; done < n; done++) {
		const struct fm_byte_move *x = &m[done];
		if (!c.r || c.r->alias || x->src < c.r->base || x->src + x->len > c.r->end ||
		    x->dst < c.r->base || x->dst + x->len > c.r->end || take_move(&c, x))
			break;
		move(&c, x);
		bytes += x->len;
		/* The next move, if it lies in the region: one outside it ends the call anyway. */
		x = done + 1 < n ? &m[done + 1] : NULL;
		if (x && (x->src < c.r->base || x->src + x->len > c.r->end || x->dst < c.r->base ||
			  x->dst + x->len > c.r->end))
			x = NULL;
		pages += let_go_unused(&c, x);
	}
	pages += let_go_unused(&c, NULL);
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

/*
 * One word or a few of one page, read or written where the page lies over
 * the wire: a GET or a PUT of one entry, the page held meanwhile.
 */
static int words_edit(struct fm_pager *p, uintptr_t a, void *buf, size_t len, int write)
{
	struct call c;
	struct fm_edit_ent e;
	const void *get;
	int ridx, rc = -EBUSY;

	if (atomic_load(&p->edit_off))
		return -EOPNOTSUPP;
	call_init(&c, p);
	rlock_rd(p);
	c.r = fm_region_find(p, a, &ridx);
	if (c.r && !c.r->alias && !hold(&c, (a - c.r->base) >> PG_SHIFT, write)) {
		struct held *h = &c.h[0];

		open_clean_held(&c);
		if (h->kind == HELD_LOCAL) {
			if (write)
				memcpy((void *)a, buf, len);
			else
				memcpy(buf, (const void *)a, len);
			rc = 0;
		} else if (!write && fm_pg_state(h->old) == FM_PG_UNTOUCHED) {
			memset(buf, 0, len); /* nothing in memd: zeros */
			rc = 0;
		} else {
			e = (struct fm_edit_ent){ .kind = write ? FM_EDIT_PUT : FM_EDIT_GET, .len = (uint32_t)len };
			if (write)
				e.dst = a - c.r->base;
			else
				e.src = a - c.r->base;
			rc = fm_chan_edit(chan(&c), c.r->space, &e, 1, write ? buf : NULL, write ? len : 0,
					  write ? 0 : len, &get);
			if (!rc && !write)
				memcpy(buf, get, len);
			if (rc == -EOPNOTSUPP)
				atomic_store(&p->edit_off, 1);
			if (rc && !refused(rc)) {
				STAT_ADD(p, transport_errors, 1);
				fm_fatal("memd at %s could not %s a collector's header word in its store (%s)",
					 fm_xport_addr(p->x), write ? "write" : "read", fm_strerror(-rc));
			}
		}
		h->write = (uint8_t)(write && !rc);
		release_edit(&c, 1);
	}
	rlock_un(p);
	chan_done(&c);
	fm_settled(p);
	return rc;
}

/* The same with memd's store mapped here (shm): the page opened in place, sealed if written. */
static int words_shm(struct fm_pager *p, uintptr_t a, void *buf, size_t len, int write)
{
	struct call c;
	int ridx, rc = -EBUSY;

	call_init(&c, p);
	rlock_rd(p);
	c.r = fm_region_find(p, a, &ridx);
	if (c.r && !c.r->alias && !hold(&c, (a - c.r->base) >> PG_SHIFT, write)) {
		struct held *e = &c.h[0];

		open_clean_held(&c);
		if (!write && e->kind == HELD_STORE && fm_pg_state(e->old) == FM_PG_UNTOUCHED) {
			memset(buf, 0, len); /* never written, or only zeros: nothing in memd to open */
			rc = 0;
		} else if (e->kind == HELD_LOCAL || !(rc = open_store(&c, 0))) {
			if (write)
				memcpy(at(&c, a), buf, len);
			else
				memcpy(buf, at(&c, a), len);
			rc = 0;
			if (write && e->kind == HELD_STORE && fm_chan_page_seal(chan(&c), c.r->space, e->i))
				fm_fatal("memd's store went away under a collector's write at %#lx", (unsigned long)a);
			STAT_ADD(p, compact_pages, write && e->kind == HELD_STORE);
		}
		/* A read leaves the page as it was: nothing changed, so no seal. */
		if (e->kind == HELD_LOCAL) {
			pg_release_from(&c.r->pg[e->i], FM_PG_UPDATING, e->old);
		} else if (write && (!rc || e->bytes)) {
			fm_memd_holds(p);
			pg_release_from(&c.r->pg[e->i], FM_PG_FILLING, pg_make(FM_PG_REMOTE, FM_PGF_HAS_REMOTE));
		} else {
			pg_release_from(&c.r->pg[e->i], FM_PG_FILLING, e->old);
		}
	}
	rlock_un(p);
	chan_done(&c);
	fm_settled(p);
	return rc;
}

static int words(struct fm_pager *p, uintptr_t a, void *buf, size_t len, int write)
{
	if (!len || (a & (PG_SIZE - 1)) + len > PG_SIZE)
		return -EINVAL;
	if (fm_xport_kind(p->x) != FM_XPORT_SHM)
		return words_edit(p, a, buf, len, write);
	return words_shm(p, a, buf, len, write);
}

int fm_pager_read_words(struct fm_pager *p, const void *addr, void *out, size_t len)
{
	return words(p, (uintptr_t)addr, out, len, 0);
}

int fm_pager_write_words(struct fm_pager *p, void *addr, const void *data, size_t len)
{
	return words(p, (uintptr_t)addr, (void *)data, len, 1);
}
