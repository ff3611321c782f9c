// SPDX-License-Identifier: Apache-2.0
/*
 * Many memd servers behind one transport (transport.h). fm_xport_connect
 * comes here when the address is a comma-separated list; the pager never
 * learns that there is more than one server.
 *
 * Placement. Every page has an order over the servers: rendezvous (highest
 * random weight) hashing of (space, page) with a hash of each server's
 * address. A write goes to the first R live servers of that order. Adding
 * a server moves only the pages whose new first-R includes it (about R/N of
 * them), and nothing needs to move at once: where a page's bytes are is
 * recorded per page (below), so reads follow the record, not the hash.
 *
 * Per page, one 32-bit word: a mask of the server slots holding its latest
 * bytes, plus two claim bits. A write claims the page (WRITING), sends it
 * to its targets in parallel (one request per server, all sent before any
 * reply is read), and stores the set of servers that acknowledged. A server
 * that missed a write drops out of the mask, so a server that comes back
 * with old bytes is never read for that page: never stale data.
 *
 * What a write guarantees. fm_chan_write reports FM_OK for a page only when
 * every target it sent the page to has acknowledged it, or has failed and
 * the page was then sent to, and acknowledged by, the next live server in
 * the page's order. So an acknowledged page has R copies while R servers are
 * live, and at least one copy always; "degraded" writes (fewer than R, only
 * when fewer than R servers are live or a replacement failed too) are counted
 * and re-replicated in the background. A page no server acknowledged makes
 * the call fail (-EPIPE): the pager keeps it (its evict_broken path).
 *
 * Reads go to the live holders in placement order, servers that recently
 * timed out last; a holder that does not answer within the timeout, fails,
 * or returns bytes whose checksum is wrong is skipped for the next one.
 *
 * Health. A connection error (reset, refused, EOF) marks a server lost at
 * once. A timeout marks it slow for SLOW_MS (others are preferred); a server
 * that keeps failing for down_after_ms, or times out STRIKES times within it,
 * is lost. A lost server's slot is never
 * used again: if it comes back, it joins as a new, empty slot. When a loss
 * leaves some page with no live copy (R=1, or R failures), the transport is
 * broken: it names the server, refuses further writes (the pager stops
 * evicting), and a read of such a page fails after saying which server had it.
 *
 * A background thread watches the control connections, re-replicates pages
 * that have fewer than R live copies (claiming each page with REPL, so that
 * a concurrent write of the page always wins), and reconnects lost servers.
 */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fm_util.h"
#include "resmap.h"

#define MAX_SLOTS     28
#define META_MASK     ((1u << MAX_SLOTS) - 1)
#define META_WRITING  (1u << 28)
#define META_REPL     (1u << 29)
#define MAX_SPACES    64
#define SLOW_MS       2000
#define REJOIN_MS     5000
#define STRIKES       6
#define DEFAULT_TIMEOUT_MS 1000

/* Tools mirror the layout (cli/src/farmem/resmap.py): a new counter takes a reserved[] word. */
_Static_assert(sizeof(struct fm_pager_stats) == (24 + FM_LAT_BUCKETS + 32) * sizeof(uint64_t),
	       "the counters after lat_hist are a 32-word block: take reserved[] words, keep the size");

struct slot {
	char addr[128];
	uint64_t hseed;
	struct fm_xport *x;          /* control connection and session; freed at close */
	atomic_int down;
	_Atomic uint64_t slow_until; /* ns: prefer others until then */
	_Atomic uint64_t fail_since; /* ns of the first failure of the current streak; 0 = none */
	_Atomic uint64_t strike_t0;  /* timeouts counted since then ... */
	atomic_int strikes;          /* ... STRIKES of them within down_after_ms: lost */
};

struct mspace {
	uint32_t id;
	uint64_t npages;
	uint32_t sid[MAX_SLOTS];     /* the space's id on each slot; 0 = none */
	_Atomic uint32_t *meta;
	size_t meta_len;
	atomic_int live;
};

struct fm_multi {
	struct fm_xport *shell;
	struct fm_xport_cfg cfg;     /* addr/secret point into shell */
	int R, timeout_ms, down_after_ms;
	pthread_mutex_t lock;        /* spaces, slot changes, loss scans */
	struct slot s[MAX_SLOTS];
	atomic_int nslots;
	struct mspace sp[MAX_SPACES];
	atomic_uint nsp;
	uint32_t next_id;
	struct fm_pager_stats own;
	struct fm_pager_stats *_Atomic st;
	atomic_int broken;
	/* the background thread */
	pthread_t bg;
	int bg_started;
	atomic_int stop, need_scan;
	pthread_mutex_t bg_lock;
	pthread_cond_t bg_cond;
	struct fm_chan *bgchan;
	atomic_int scanning_space;   /* index+1 of the space the scan is in, 0 = none */
};

struct sub { struct fm_conn conn; int open; };

struct fm_mchan {
	struct fm_multi *m;
	struct sub sub[MAX_SLOTS];
	uint8_t *buf;                           /* read replies land here: FM_MAX_BATCH pages */
	struct fm_page_status gst[FM_MAX_BATCH]; /* one group's statuses */
	uint32_t wst[FM_MAX_BATCH];
	struct fm_write_ent ents[FM_MAX_BATCH];
	struct item *it;                        /* writes: FM_MAX_BATCH * MAX_SLOTS */
};

#define MST(m, field, n) __atomic_fetch_add(&atomic_load(&(m)->st)->field, (uint64_t)(n), __ATOMIC_RELAXED)

/* ---- placement ---------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return mix64(h);
}

static uint64_t page_key(uint32_t space, uint64_t page)
{
	return mix64(((uint64_t)space << 40) ^ page);
}

/*
 * The slots of allowed in the page's placement order, those in a slow spell
 * last. Returns how many.
 */
static unsigned order(struct fm_multi *m, uint64_t key, uint32_t allowed, uint8_t *out)
{
	uint64_t score[MAX_SLOTS], now = 0;
	unsigned n = 0, ns = atomic_load_explicit(&m->nslots, memory_order_acquire);

	for (unsigned s = 0; s < ns; s++) {
		uint64_t sc;
		unsigned k;
		if (!(allowed & (1u << s)))
			continue;
		sc = mix64(m->s[s].hseed ^ key) >> 1;
		if (atomic_load_explicit(&m->s[s].slow_until, memory_order_relaxed)) {
			if (!now)
				now = fm_now_ns();
			if (atomic_load_explicit(&m->s[s].slow_until, memory_order_relaxed) > now)
				sc >>= 32; /* still ordered, but after every healthy server */
		}
		for (k = n; k > 0 && score[k - 1] < sc; k--) {
			score[k] = score[k - 1];
			out[k] = out[k - 1];
		}
		score[k] = sc;
		out[k] = (uint8_t)s;
		n++;
	}
	return n;
}

/* Exposed for the unit test: the first r slots of a page over n servers named addrs. */
unsigned fm_multi_placement(const char *const *addrs, unsigned n, uint32_t space, uint64_t page,
			    unsigned r, unsigned *out);
unsigned fm_multi_placement(const char *const *addrs, unsigned n, uint32_t space, uint64_t page,
			    unsigned r, unsigned *out)
{
	uint64_t key = page_key(space, page), best[MAX_SLOTS];
	unsigned k = 0;

	for (unsigned s = 0; s < n && s < MAX_SLOTS; s++) {
		uint64_t sc = mix64(hash_str(addrs[s]) ^ key) >> 1;
		unsigned j;
		for (j = k; j > 0 && best[j - 1] < sc; j--) {
			best[j] = best[j - 1];
			out[j] = out[j - 1];
		}
		best[j] = sc;
		out[j] = s;
		k++;
	}
	return k < r ? k : r;
}

static uint32_t live_mask(struct fm_multi *m)
{
	uint32_t mask = 0;
	unsigned ns = atomic_load_explicit(&m->nslots, memory_order_acquire);
	for (unsigned s = 0; s < ns; s++)
		if (!atomic_load_explicit(&m->s[s].down, memory_order_relaxed))
			mask |= 1u << s;
	return mask;
}

static struct mspace *find_space(struct fm_multi *m, uint32_t id)
{
	unsigned n = atomic_load_explicit(&m->nsp, memory_order_acquire);
	for (unsigned i = 0; i < n; i++)
		if (m->sp[i].id == id && atomic_load_explicit(&m->sp[i].live, memory_order_acquire))
			return &m->sp[i];
	return NULL;
}

/* ---- health -------------------------------------------------------------- */

static void kick_bg(struct fm_multi *m)
{
	atomic_store(&m->need_scan, 1);
	pthread_mutex_lock(&m->bg_lock);
	pthread_cond_signal(&m->bg_cond);
	pthread_mutex_unlock(&m->bg_lock);
}

/* Pages whose every copy was on servers no longer live. Caller holds m->lock. */
static uint64_t count_orphans(struct fm_multi *m, uint32_t live)
{
	uint64_t n = 0;
	unsigned nsp = atomic_load(&m->nsp);
	for (unsigned i = 0; i < nsp; i++) {
		struct mspace *sp = &m->sp[i];
		if (!atomic_load(&sp->live))
			continue;
		for (uint64_t p = 0; p < sp->npages; p++) {
			uint32_t w = atomic_load_explicit(&sp->meta[p], memory_order_relaxed) & META_MASK;
			if (w && !(w & live))
				n++;
		}
	}
	return n;
}

static void slot_lost(struct fm_multi *m, unsigned s, const char *why)
{
	struct slot *sl = &m->s[s];
	uint64_t orphans;
	uint32_t live;

	if (atomic_exchange(&sl->down, 1))
		return;
	MST(m, memd_servers_lost, 1);
	__atomic_fetch_sub(&atomic_load(&m->st)->memd_servers_live, 1, __ATOMIC_RELAXED);
	/* Its session goes when memd notices; no one uses this connection any more. */
	if (sl->x && sl->x->ctrl.fd >= 0)
		shutdown(sl->x->ctrl.fd, SHUT_RDWR);
	pthread_mutex_lock(&m->lock);
	live = live_mask(m);
	orphans = count_orphans(m, live);
	if (orphans)
		atomic_store(&m->broken, 1);
	pthread_mutex_unlock(&m->lock);
	if (orphans)
		fm_err("lost memd at %s (%s): %llu pages were held only there (replicas=%d) and are gone; "
		       "no more pages are written to memd, and the program ends if it reads one of them",
		       sl->addr, why, (unsigned long long)orphans, m->R);
	else if (live)
		fm_err("lost memd at %s (%s): every page it held has a copy elsewhere; %d of the memd servers are left%s",
		       sl->addr, why, __builtin_popcount(live),
		       m->R > 1 ? ", re-replicating in the background" : "");
	else
		fm_err("lost memd at %s (%s): no memd server is left", sl->addr, why);
	kick_bg(m);
}

static int is_timeout(int rc)
{
	return rc == -ETIMEDOUT || rc == -EAGAIN || rc == -EINPROGRESS || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH;
}

static void slot_fail(struct fm_multi *m, unsigned s, int rc)
{
	struct slot *sl = &m->s[s];
	uint64_t now = fm_now_ns(), since = 0;

	if (!is_timeout(rc)) {
		slot_lost(m, s, rc == -ECONNRESET || rc == -EPIPE ? "its connection closed" : strerror(-rc));
		return;
	}
	if (rc == -ETIMEDOUT || rc == -EAGAIN)
		MST(m, memd_timeouts, 1);
	if (atomic_exchange(&sl->slow_until, now + (uint64_t)SLOW_MS * 1000000) < now)
		fm_warn("memd at %s did not answer within %d ms (%s): other replicas first for now",
			sl->addr, m->timeout_ms, strerror(-rc));
	/* A server that keeps timing out is as good as lost, even if small requests still pass. */
	if (now - atomic_load(&sl->strike_t0) > (uint64_t)m->down_after_ms * 1000000) {
		atomic_store(&sl->strike_t0, now);
		atomic_store(&sl->strikes, 1);
	} else if (atomic_fetch_add(&sl->strikes, 1) + 1 >= STRIKES) {
		char why[96];
		snprintf(why, sizeof(why), "%d timeouts within %d ms", STRIKES, m->down_after_ms);
		slot_lost(m, s, why);
		return;
	}
	if (!atomic_compare_exchange_strong(&sl->fail_since, &since, now) &&
	    now - since > (uint64_t)m->down_after_ms * 1000000) {
		char why[96];
		snprintf(why, sizeof(why), "no answer for %llu ms",
			 (unsigned long long)((now - since) / 1000000));
		slot_lost(m, s, why);
	}
}

static inline void slot_ok(struct fm_multi *m, unsigned s)
{
	if (atomic_load_explicit(&m->s[s].fail_since, memory_order_relaxed))
		atomic_store(&m->s[s].fail_since, 0);
}

/* This channel's connection to slot s, opened (and joined to the slot's session) on first use. */
static struct fm_conn *sub_get(struct fm_mchan *ch, unsigned s)
{
	struct fm_multi *m = ch->m;
	struct slot *sl = &m->s[s];
	struct sub *sb = &ch->sub[s];
	struct fm_xport_cfg c;
	char err[256];
	size_t len;
	uint16_t st;
	int rc;

	if (atomic_load(&sl->down)) {
		if (sb->open) {
			fm_conn_close(&sb->conn);
			sb->open = 0;
		}
		return NULL;
	}
	if (sb->open)
		return &sb->conn;
	c = m->cfg;
	c.addr = sl->addr;
	c.timeout_ms = m->timeout_ms;
	rc = fm_conn_open(&sb->conn, &c, err, sizeof(err));
	if (!rc) {
		rc = fm_conn_call(&sb->conn, FM_OP_SESSION_JOIN, 0,
				  &(struct fm_iov){ &sl->x->session, sizeof(sl->x->session) }, 1,
				  NULL, 0, &len, &st, NULL);
		if (!rc && st)
			rc = -EPROTO;
		if (rc)
			fm_conn_close(&sb->conn);
	} else {
		fm_debug("%s", err);
	}
	if (rc) {
		slot_fail(m, s, rc);
		return NULL;
	}
	sb->conn.op_timeout_ms = m->timeout_ms; /* a trickling server times out too */
	sb->open = 1;
	return &sb->conn;
}

static void sub_drop(struct fm_mchan *ch, unsigned s, int rc)
{
	fm_conn_close(&ch->sub[s].conn);
	ch->sub[s].open = 0;
	slot_fail(ch->m, s, rc);
}

/* ---- per-slot batched I/O ----------------------------------------------------------- */

/* One page to or from one slot. */
struct item {
	unsigned i;        /* index into the caller's page arrays */
	uint8_t slot;
	int8_t res;        /* IT_* */
	uint32_t pos;      /* reads: where in ch->buf */
};
enum { IT_PENDING = 0, IT_OK = 1, IT_FAIL = -1, IT_FULL = -2, IT_ABSENT = -3, IT_CRC = -4 };

/*
 * Write items (page i to slot) of one space: one request per slot (or a few,
 * when its pages lie in more runs than one frame carries), all sent before
 * any reply is read, so the R copies travel at once.
 */
static void write_items(struct fm_mchan *ch, struct mspace *sp, const uint64_t *pages,
			const void *const *data, const uint32_t *crc, struct item *it, unsigned nit)
{
	struct fm_multi *m = ch->m;
	struct req { uint8_t slot; uint64_t id; unsigned first, cnt; struct fm_conn *c; } reqs[MAX_SLOTS * 4];
	unsigned nreq = 0, ns = atomic_load(&m->nslots);
	/* items sorted by slot, stable: idx[] */
	unsigned idx[MAX_SLOTS * FM_MAX_BATCH], nidx = 0;
	unsigned start[MAX_SLOTS + 1];

	for (unsigned s = 0; s < ns; s++) {
		start[s] = nidx;
		for (unsigned k = 0; k < nit; k++)
			if (it[k].slot == s)
				idx[nidx++] = k;
	}
	start[ns] = nidx;
	for (unsigned s = 0; s < ns; s++) {
		struct fm_conn *c;
		unsigned j = start[s], end = start[s + 1];
		if (j == end)
			continue;
		c = sp->sid[s] ? sub_get(ch, s) : NULL;
		if (!c) {
			for (; j < end; j++)
				it[idx[j]].res = IT_FAIL;
			continue;
		}
		while (j < end) {
			struct fm_space_ref ref = { .space_id = sp->sid[s] };
			struct fm_write_ent ents[FM_MAX_BATCH];
			struct fm_iov iov[16];
			unsigned niov = 2, cnt = 0, first = j;
			int rc;
			while (j < end && niov < 16) {
				const uint8_t *run = data[it[idx[j]].i];
				size_t len = 0;
				while (j < end && (const uint8_t *)data[it[idx[j]].i] == run + len) {
					ents[cnt++] = (struct fm_write_ent){ .page = pages[it[idx[j]].i],
									     .crc = crc[it[idx[j]].i] };
					len += FM_PAGE_SIZE;
					j++;
				}
				iov[niov++] = (struct fm_iov){ run, len };
			}
			iov[0] = (struct fm_iov){ &ref, sizeof(ref) };
			iov[1] = (struct fm_iov){ ents, cnt * sizeof(ents[0]) };
			uint64_t id;
			rc = fm_conn_send(c, FM_OP_WRITE, cnt, iov, niov, &id);
			if (rc) {
				sub_drop(ch, s, rc);
				/* Requests already sent on this connection die with it. */
				for (unsigned q = 0; q < nreq; q++)
					if (reqs[q].slot == s)
						reqs[q].c = NULL;
				for (unsigned q = start[s]; q < end; q++)
					it[idx[q]].res = IT_FAIL;
				break;
			}
			reqs[nreq++] = (struct req){ .slot = (uint8_t)s, .first = first, .cnt = cnt, .c = c, .id = id };
		}
	}
	for (unsigned q = 0; q < nreq; q++) {
		struct req *r = &reqs[q];
		size_t len;
		uint16_t st;
		int rc;
		if (!r->c || !ch->sub[r->slot].open) {
			for (unsigned k = 0; k < r->cnt; k++)
				it[idx[r->first + k]].res = IT_FAIL;
			continue;
		}
		rc = fm_conn_recvv(r->c, FM_OP_WRITE, r->id,
				   &(struct fm_iov){ ch->wst, r->cnt * sizeof(uint32_t) }, 1, &len, &st, NULL);
		if (!rc && st != FM_E_FULL && (st || len != r->cnt * sizeof(uint32_t)))
			rc = -EPROTO;
		if (rc) {
			sub_drop(ch, r->slot, rc);
			for (unsigned k = 0; k < r->cnt; k++)
				it[idx[r->first + k]].res = IT_FAIL;
			continue;
		}
		slot_ok(m, r->slot);
		for (unsigned k = 0; k < r->cnt; k++)
			it[idx[r->first + k]].res = st == FM_E_FULL || ch->wst[k] == FM_E_FULL ? IT_FULL
						  : ch->wst[k] == FM_OK ? IT_OK : IT_FAIL;
	}
}

/*
 * Read items (page i from slot) of one space into ch->buf at it[].pos, one
 * request per slot, all sent before any reply is read. Checksums verified.
 */
static void read_items(struct fm_mchan *ch, struct mspace *sp, const uint64_t *pages,
		       struct item *it, unsigned nit)
{
	struct fm_multi *m = ch->m;
	struct req { uint8_t slot; uint64_t id; unsigned first, cnt; struct fm_conn *c; } reqs[MAX_SLOTS];
	unsigned nreq = 0, ns = atomic_load(&m->nslots);
	unsigned idx[FM_MAX_BATCH * 2], nidx = 0, start[MAX_SLOTS + 1];

	for (unsigned s = 0; s < ns; s++) {
		start[s] = nidx;
		for (unsigned k = 0; k < nit; k++)
			if (it[k].slot == s)
				idx[nidx++] = k;
	}
	start[ns] = nidx;
	for (unsigned s = 0; s < ns; s++) {
		struct fm_space_ref ref = { .space_id = sp->sid[s] };
		uint64_t pg[FM_MAX_BATCH], id;
		struct fm_conn *c;
		unsigned cnt = start[s + 1] - start[s];
		int rc;
		if (!cnt)
			continue;
		c = sp->sid[s] ? sub_get(ch, s) : NULL;
		if (!c) {
			for (unsigned k = 0; k < cnt; k++)
				it[idx[start[s] + k]].res = IT_FAIL;
			continue;
		}
		for (unsigned k = 0; k < cnt; k++)
			pg[k] = pages[it[idx[start[s] + k]].i];
		rc = fm_conn_send(c, FM_OP_READ, cnt,
				  (struct fm_iov[]){ { &ref, sizeof(ref) }, { pg, cnt * sizeof(uint64_t) } }, 2,
				  &id);
		if (rc) {
			sub_drop(ch, s, rc);
			for (unsigned k = 0; k < cnt; k++)
				it[idx[start[s] + k]].res = IT_FAIL;
			continue;
		}
		reqs[nreq++] = (struct req){ .slot = (uint8_t)s, .first = start[s], .cnt = cnt, .c = c, .id = id };
	}
	for (unsigned q = 0; q < nreq; q++) {
		struct req *r = &reqs[q];
		struct fm_iov rep[1 + FM_MAX_BATCH];
		unsigned nrep = 1;
		size_t len;
		uint16_t st;
		int rc;

		rep[0] = (struct fm_iov){ ch->gst, r->cnt * sizeof(ch->gst[0]) };
		for (unsigned k = 0; k < r->cnt; k++) {
			uint8_t *d = ch->buf + (size_t)it[idx[r->first + k]].pos * FM_PAGE_SIZE;
			if (nrep > 1 && (uint8_t *)rep[nrep - 1].base + rep[nrep - 1].len == d)
				rep[nrep - 1].len += FM_PAGE_SIZE;
			else
				rep[nrep++] = (struct fm_iov){ d, FM_PAGE_SIZE };
		}
		rc = fm_conn_recvv(r->c, FM_OP_READ, r->id, rep, nrep, &len, &st, NULL);
		if (!rc && (st || len != r->cnt * (sizeof(ch->gst[0]) + FM_PAGE_SIZE)))
			rc = st == FM_E_NOSPACE || st == FM_E_RANGE ? -ENOENT : -EPROTO;
		if (rc) {
			if (rc != -ENOENT)
				sub_drop(ch, r->slot, rc);
			for (unsigned k = 0; k < r->cnt; k++)
				it[idx[r->first + k]].res = IT_FAIL;
			continue;
		}
		slot_ok(m, r->slot);
		for (unsigned k = 0; k < r->cnt; k++) {
			struct item *t = &it[idx[r->first + k]];
			const uint8_t *d = ch->buf + (size_t)t->pos * FM_PAGE_SIZE;
			if (ch->gst[k].status == FM_E_ABSENT)
				t->res = IT_ABSENT;
			else if (ch->gst[k].status != FM_OK)
				t->res = IT_FAIL;
			else if (fm_crc32c(d, FM_PAGE_SIZE) != ch->gst[k].crc)
				t->res = IT_CRC;
			else
				t->res = IT_OK;
		}
	}
}

/* ---- the transport API ------------------------------------------------------------- */

static void *bg_main(void *arg);

int fm_multi_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	struct fm_multi *m;
	struct fm_xport *x;
	const char *a;
	int rc = 0;

	if (cfg->secret_len == 0 || cfg->secret_len > sizeof(x->secret)) {
		fm_errmsg(err, errlen, "the memd secret must be 1 to %zu bytes", sizeof(x->secret));
		return -EINVAL;
	}
	if (cfg->pref == FM_PREF_SHM) {
		fm_errmsg(err, errlen, "several memd servers (%s) need the stream transport, not shm", cfg->addr);
		return -EOPNOTSUPP;
	}
	x = calloc(1, sizeof(*x));
	m = calloc(1, sizeof(*m));
	if (!x || !m) {
		free(x);
		free(m);
		return -ENOMEM;
	}
	snprintf(x->addr, sizeof(x->addr), "%s", cfg->addr);
	memcpy(x->secret, cfg->secret, cfg->secret_len);
	x->cfg = *cfg;
	x->cfg.addr = x->addr;
	x->cfg.secret = x->secret;
	x->kind = FM_XPORT_STREAM;
	x->ctrl.fd = -1;
	pthread_mutex_init(&x->lock, NULL);
	x->multi = m;
	m->shell = x;
	m->cfg = x->cfg;
	m->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
	m->down_after_ms = 3 * m->timeout_ms > 3000 ? 3 * m->timeout_ms : 3000;
	m->st = &m->own;
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->bg_lock, NULL);
	pthread_cond_init(&m->bg_cond, NULL);

	for (a = cfg->addr; *a;) {
		const char *e = strchr(a, ',');
		size_t n = e ? (size_t)(e - a) : strlen(a);
		struct slot *sl;
		struct fm_xport_cfg c = m->cfg;
		int ns = atomic_load(&m->nslots);
		if (n == 0 || n >= sizeof(sl->addr)) {
			fm_errmsg(err, errlen, "bad memd address list '%s': empty or overlong entry", cfg->addr);
			rc = -EINVAL;
			goto fail;
		}
		if (ns >= 16) {
			fm_errmsg(err, errlen, "at most 16 memd servers (%s)", cfg->addr);
			rc = -EINVAL;
			goto fail;
		}
		sl = &m->s[ns];
		memcpy(sl->addr, a, n);
		sl->addr[n] = '\0';
		for (int k = 0; k < ns; k++)
			if (!strcmp(m->s[k].addr, sl->addr)) {
				fm_errmsg(err, errlen, "memd %s is listed twice", sl->addr);
				rc = -EINVAL;
				goto fail;
			}
		sl->hseed = hash_str(sl->addr);
		c.addr = sl->addr;
		c.pref = FM_PREF_STREAM;
		c.timeout_ms = m->timeout_ms;
		rc = fm_xport_connect(&c, &sl->x, err, errlen);
		if (rc)
			goto fail;
		atomic_store(&m->nslots, ns + 1);
		a += n;
		if (*a == ',')
			a++;
	}
	m->R = cfg->replicas > 0 ? cfg->replicas : 1;
	if (m->R > atomic_load(&m->nslots)) {
		fm_errmsg(err, errlen, "replicas=%d needs at least %d memd servers, %d given", m->R, m->R,
			  atomic_load(&m->nslots));
		rc = -EINVAL;
		goto fail;
	}
	m->own.memd_servers_live = (uint64_t)atomic_load(&m->nslots);
	rc = fm_multi_chan_open(x, &m->bgchan);
	if (rc) {
		fm_errmsg(err, errlen, "cannot open a channel to the memd servers: %s", strerror(-rc));
		goto fail;
	}
	rc = -pthread_create(&m->bg, NULL, bg_main, m);
	if (rc) {
		fm_errmsg(err, errlen, "cannot start the replication thread: %s", strerror(-rc));
		goto fail;
	}
	m->bg_started = 1;
	fm_info("%d memd servers, %d replica%s of every page", atomic_load(&m->nslots), m->R,
		m->R > 1 ? "s" : "");
	*out = x;
	return 0;
fail:
	fm_multi_close(x);
	return rc;
}

void fm_multi_close(struct fm_xport *x)
{
	struct fm_multi *m = x->multi;

	if (m->bg_started) {
		atomic_store(&m->stop, 1);
		pthread_mutex_lock(&m->bg_lock);
		pthread_cond_signal(&m->bg_cond);
		pthread_mutex_unlock(&m->bg_lock);
		pthread_join(m->bg, NULL);
	}
	if (m->bgchan)
		fm_multi_chan_close(m->bgchan);
	for (unsigned i = 0; i < atomic_load(&m->nsp); i++)
		if (m->sp[i].meta)
			fm_sys_munmap((void *)m->sp[i].meta, m->sp[i].meta_len);
	for (int s = 0; s < atomic_load(&m->nslots); s++)
		if (m->s[s].x)
			fm_xport_close(m->s[s].x);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->bg_lock);
	pthread_cond_destroy(&m->bg_cond);
	pthread_mutex_destroy(&x->lock);
	free(m);
	free(x);
}

void fm_xport_set_stats(struct fm_xport *x, struct fm_pager_stats *st)
{
	struct fm_multi *m;

	if (!x || !(m = x->multi) || !st)
		return;
	st->memd_servers_live = (uint64_t)__builtin_popcount(live_mask(m));
	st->memd_servers_lost = m->own.memd_servers_lost;
	st->memd_timeouts = m->own.memd_timeouts;
	st->memd_failovers = m->own.memd_failovers;
	st->memd_rereplicated = m->own.memd_rereplicated;
	st->memd_degraded_writes = m->own.memd_degraded_writes;
	atomic_store(&m->st, st);
}

/* Open the space on slot s (a new one, or at start). Caller holds m->lock. */
static int open_on_slot(struct fm_multi *m, struct mspace *sp, unsigned s)
{
	int rc = fm_xport_space_open(m->s[s].x, sp->npages, &sp->sid[s]);
	if (rc)
		sp->sid[s] = 0;
	return rc;
}

int fm_multi_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	struct fm_multi *m = x->multi;
	struct mspace *sp = NULL;
	uint32_t live;
	unsigned ok = 0, i;
	int rc = 0;

	if (!npages || npages > FM_MAX_SPACE_PAGES)
		return -ERANGE;
	pthread_mutex_lock(&m->lock);
	for (i = 0; i < atomic_load(&m->nsp); i++)
		if (!atomic_load(&m->sp[i].live) && !m->sp[i].meta && atomic_load(&m->scanning_space) != (int)i + 1)
			sp = &m->sp[i];
	if (!sp && atomic_load(&m->nsp) < MAX_SPACES)
		sp = &m->sp[atomic_load(&m->nsp)];
	if (!sp) {
		pthread_mutex_unlock(&m->lock);
		return -ENOSPC;
	}
	memset(sp->sid, 0, sizeof(sp->sid));
	sp->npages = npages;
	sp->meta_len = (npages * sizeof(uint32_t) + 4095) & ~(size_t)4095;
	sp->meta = fm_sys_mmap(NULL, sp->meta_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (sp->meta == MAP_FAILED) {
		sp->meta = NULL;
		pthread_mutex_unlock(&m->lock);
		return -ENOMEM;
	}
	live = live_mask(m);
	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++) {
		if (!(live & (1u << s)))
			continue;
		rc = open_on_slot(m, sp, s);
		if (rc == -ENOSPC)
			break;
		if (!rc)
			ok++;
	}
	if (rc == -ENOSPC || !ok) {
		for (unsigned s = 0; s < MAX_SLOTS; s++)
			if (sp->sid[s])
				fm_xport_space_close(m->s[s].x, sp->sid[s]);
		fm_sys_munmap((void *)sp->meta, sp->meta_len);
		sp->meta = NULL;
		pthread_mutex_unlock(&m->lock);
		return rc ? rc : -EPIPE;
	}
	sp->id = ++m->next_id;
	atomic_store(&sp->live, 1);
	if (sp == &m->sp[atomic_load(&m->nsp)])
		atomic_fetch_add(&m->nsp, 1);
	*space_id = sp->id;
	pthread_mutex_unlock(&m->lock);
	return 0;
}

int fm_multi_space_close(struct fm_xport *x, uint32_t space_id)
{
	struct fm_multi *m = x->multi;
	struct mspace *sp = find_space(m, space_id);

	if (!sp)
		return -ENOENT;
	atomic_store(&sp->live, 0);
	/* The background scan may be walking it: wait for it to move on. */
	for (int k = 0; k < 10000 && atomic_load(&m->scanning_space) == (int)(sp - m->sp) + 1; k++)
		usleep(1000);
	pthread_mutex_lock(&m->lock);
	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++)
		if (sp->sid[s] && !atomic_load(&m->s[s].down))
			fm_xport_space_close(m->s[s].x, sp->sid[s]);
	if (atomic_load(&m->scanning_space) != (int)(sp - m->sp) + 1) {
		fm_sys_munmap((void *)sp->meta, sp->meta_len);
		sp->meta = NULL;
	}
	pthread_mutex_unlock(&m->lock);
	return 0;
}

int fm_multi_stats(struct fm_xport *x, struct fm_stats *st)
{
	struct fm_multi *m = x->multi;
	uint32_t live = live_mask(m);
	int got = 0, rc = -EPIPE;

	memset(st, 0, sizeof(*st));
	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++) {
		struct fm_stats one;
		uint64_t a[sizeof(one) / 8], b[sizeof(one) / 8];
		if (!(live & (1u << s)))
			continue;
		rc = fm_xport_stats(m->s[s].x, &one);
		if (rc)
			continue;
		memcpy(a, st, sizeof(a));
		memcpy(b, &one, sizeof(b));
		for (size_t k = 0; k < sizeof(a) / 8; k++)
			a[k] += b[k];
		memcpy(st, a, sizeof(a));
		got++;
	}
	return got ? 0 : rc;
}

int fm_multi_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct fm_chan *c = calloc(1, sizeof(*c));
	struct fm_mchan *ch = calloc(1, sizeof(*ch));

	if (!c || !ch) {
		free(c);
		free(ch);
		return -ENOMEM;
	}
	ch->buf = aligned_alloc(FM_PAGE_SIZE, (size_t)FM_MAX_BATCH * FM_PAGE_SIZE);
	ch->it = malloc(sizeof(*ch->it) * FM_MAX_BATCH * MAX_SLOTS);
	if (!ch->buf || !ch->it) {
		free(ch->buf);
		free(ch->it);
		free(c);
		free(ch);
		return -ENOMEM;
	}
	ch->m = x->multi;
	for (int s = 0; s < MAX_SLOTS; s++)
		ch->sub[s].conn.fd = -1;
	c->x = x;
	c->conn.fd = -1;
	c->mchan = ch;
	*out = c;
	return 0;
}

void fm_multi_chan_close(struct fm_chan *c)
{
	struct fm_mchan *ch = c->mchan;

	for (int s = 0; s < MAX_SLOTS; s++)
		if (ch->sub[s].open)
			fm_conn_close(&ch->sub[s].conn);
	free(ch->buf);
	free(ch->it);
	free(ch);
	free(c);
}

/* Take a page for a write or a discard: waits while the re-replicator copies it. */
static uint32_t claim_write(_Atomic uint32_t *w)
{
	uint32_t v = atomic_load(w);
	for (unsigned spins = 0;; spins++) {
		if (v & META_REPL) {
			if (spins < 64)
				sched_yield();
			else
				usleep(100);
			v = atomic_load(w);
			continue;
		}
		if (atomic_compare_exchange_weak(w, &v, v | META_WRITING))
			return v;
	}
}

static void lost_page_msg(struct fm_multi *m, uint32_t space, uint64_t page, uint32_t mask)
{
	char who[512] = "";
	size_t o = 0;
	for (unsigned s = 0; s < MAX_SLOTS && o < sizeof(who) - 2; s++)
		if (mask & (1u << s))
			o += (size_t)snprintf(who + o, sizeof(who) - o, "%s%s", o ? ", " : "", m->s[s].addr);
	fm_err("page %llu of space %u was held only by memd at %s, which %s lost: it cannot be read back",
	       (unsigned long long)page, space, who, __builtin_popcount(mask) > 1 ? "were all" : "was");
}

int fm_multi_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n, const void **src)
{
	struct fm_mchan *ch = c->mchan;
	struct fm_multi *m = ch->m;
	struct mspace *sp = find_space(m, space);
	uint8_t cand[FM_MAX_BATCH][MAX_SLOTS], ncand[FM_MAX_BATCH], next[FM_MAX_BATCH];
	uint8_t crcbad[FM_MAX_BATCH];
	struct item it[FM_MAX_BATCH];
	unsigned nit = 0, left = n;
	uint32_t live;

	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (!sp)
		return -ENOENT;
	live = live_mask(m);
	for (unsigned i = 0; i < n; i++) {
		uint32_t w, h;
		if (pages[i] >= sp->npages)
			return -ERANGE;
		w = atomic_load_explicit(&sp->meta[pages[i]], memory_order_acquire) & META_MASK;
		if (!w)
			return -ENOENT;
		h = w & live;
		if (!h) {
			lost_page_msg(m, space, pages[i], w);
			return -EHOSTDOWN;
		}
		ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), h, cand[i]);
		next[i] = 1;
		crcbad[i] = 0;
		it[nit++] = (struct item){ .i = i, .slot = cand[i][0] };
	}
	/* Each server's pages land next to each other in ch->buf: one read() per reply. */
	{
		unsigned pos = 0, ns = (unsigned)atomic_load(&m->nslots);
		for (unsigned s = 0; s < ns; s++)
			for (unsigned k = 0; k < nit; k++)
				if (it[k].slot == s)
					it[k].pos = pos++;
	}
	for (unsigned round = 0; nit && round < MAX_SLOTS; round++) {
		unsigned nn = 0;
		read_items(ch, sp, pages, it, nit);
		for (unsigned k = 0; k < nit; k++) {
			struct item *t = &it[k];
			if (t->res == IT_OK) {
				src[t->i] = ch->buf + (size_t)t->pos * FM_PAGE_SIZE;
				left--;
				continue;
			}
			if (t->res == IT_CRC) {
				crcbad[t->i] = 1;
				fm_warn("memd at %s returned page %llu of space %u with a bad checksum: trying another replica",
					m->s[t->slot].addr, (unsigned long long)pages[t->i], space);
			}
			/* Skip holders that died meanwhile. */
			while (next[t->i] < ncand[t->i] && atomic_load(&m->s[cand[t->i][next[t->i]]].down))
				next[t->i]++;
			if (next[t->i] < ncand[t->i]) {
				MST(m, memd_failovers, 1);
				it[nn] = *t;
				it[nn].slot = cand[t->i][next[t->i]++];
				it[nn].res = IT_PENDING;
				nn++;
				continue;
			}
			/* No replica left for this page. */
			if (crcbad[t->i])
				return -EIO;
			{
				uint32_t w = atomic_load(&sp->meta[pages[t->i]]) & META_MASK;
				if ((w & live_mask(m)) == 0) {
					lost_page_msg(m, space, pages[t->i], w);
					return -EHOSTDOWN;
				}
				fm_err("no memd holding page %llu of space %u answered (%s)",
				       (unsigned long long)pages[t->i], space,
				       t->res == IT_ABSENT ? "it said it has no such page" : "timeouts or errors");
				return t->res == IT_ABSENT ? -ENOENT : -ETIMEDOUT;
			}
		}
		nit = nn;
	}
	return left ? -ETIMEDOUT : 0;
}

int fm_multi_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		   const void *const *data, uint32_t *status)
{
	struct fm_mchan *ch = c->mchan;
	struct fm_multi *m = ch->m;
	struct mspace *sp = find_space(m, space);
	uint8_t cand[FM_MAX_BATCH][MAX_SLOTS], ncand[FM_MAX_BATCH], next[FM_MAX_BATCH];
	uint32_t crc[FM_MAX_BATCH], old[FM_MAX_BATCH], acked[FM_MAX_BATCH], full[FM_MAX_BATCH];
	struct item *it = ch->it;
	unsigned nit = 0, R;
	uint32_t live;
	int failed = 0;

	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (!sp)
		return -ENOENT;
	if (atomic_load(&m->broken))
		return -EPIPE;
	for (unsigned i = 0; i < n; i++)
		if (pages[i] >= sp->npages)
			return -ERANGE;
	live = live_mask(m);
	R = (unsigned)__builtin_popcount(live);
	if (R > (unsigned)m->R)
		R = (unsigned)m->R;
	if (!R)
		return -EPIPE;
	for (unsigned i = 0; i < n; i++) {
		old[i] = claim_write(&sp->meta[pages[i]]);
		crc[i] = fm_crc32c(data[i], FM_PAGE_SIZE);
		acked[i] = full[i] = 0;
		ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), live, cand[i]);
		next[i] = (uint8_t)(R < ncand[i] ? R : ncand[i]);
		for (unsigned j = 0; j < next[i]; j++)
			it[nit++] = (struct item){ .i = i, .slot = cand[i][j] };
	}
	for (unsigned round = 0; nit && round < MAX_SLOTS; round++) {
		unsigned nn = 0;
		write_items(ch, sp, pages, data, crc, it, nit);
		for (unsigned k = 0; k < nit; k++) {
			struct item *t = &it[k];
			if (t->res == IT_OK) {
				acked[t->i] |= 1u << t->slot;
				continue;
			}
			if (t->res == IT_FULL) {
				full[t->i] |= 1u << t->slot;
				continue;
			}
			/* The target failed: the next live server in the page's order takes it. */
			while (next[t->i] < ncand[t->i] && atomic_load(&m->s[cand[t->i][next[t->i]]].down))
				next[t->i]++;
			if (next[t->i] < ncand[t->i]) {
				MST(m, memd_failovers, 1);
				it[nn] = (struct item){ .i = t->i, .slot = cand[t->i][next[t->i]++] };
				nn++;
			}
		}
		nit = nn;
	}
	live = live_mask(m);
	for (unsigned i = 0; i < n; i++) {
		unsigned copies = (unsigned)__builtin_popcount(acked[i] & live);
		if (acked[i]) {
			unsigned want = (unsigned)__builtin_popcount(live);
			if (want > (unsigned)m->R)
				want = (unsigned)m->R;
			if (copies < want) {
				MST(m, memd_degraded_writes, 1);
				atomic_store(&m->need_scan, 1);
			}
			status[i] = FM_OK;
			atomic_store_explicit(&sp->meta[pages[i]], acked[i], memory_order_release);
		} else {
			/* Not written: the pager keeps the page, and rewrites it before it drops it. */
			status[i] = FM_E_FULL;
			if (!full[i])
				failed = 1;
			atomic_store_explicit(&sp->meta[pages[i]], old[i] & META_MASK, memory_order_release);
		}
	}
	if (failed) {
		fm_err("a page could be written to none of the memd servers it was sent to");
		return -EPIPE;
	}
	return 0;
}

int fm_multi_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	struct fm_mchan *ch = c->mchan;
	struct fm_multi *m = ch->m;
	struct mspace *sp = find_space(m, space);
	uint64_t ids[MAX_SLOTS];
	unsigned ns = (unsigned)atomic_load(&m->nslots);
	uint32_t sent = 0, holders = 0;

	if (n == 0 || n > FM_MAX_RANGES)
		return -EINVAL;
	if (!sp)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (r[i].first >= sp->npages || r[i].npages > sp->npages - r[i].first)
			return -ERANGE;
	/* The record first: from here no one reads these pages from any server. */
	for (unsigned i = 0; i < n; i++)
		for (uint64_t p = r[i].first; p < r[i].first + r[i].npages; p++) {
			if (!(atomic_load_explicit(&sp->meta[p], memory_order_relaxed) & META_MASK))
				continue;
			holders |= claim_write(&sp->meta[p]) & META_MASK;
			atomic_store_explicit(&sp->meta[p], 0, memory_order_release);
		}
	/* Then free the memory on the servers that held any of them; a failure there leaks only space. */
	for (unsigned s = 0; s < ns; s++) {
		struct fm_space_ref ref = { .space_id = sp->sid[s] };
		struct fm_conn *cn;
		if (!(holders & (1u << s)) || !sp->sid[s] || !(cn = sub_get(ch, s)))
			continue;
		if (fm_conn_send(cn, FM_OP_DISCARD, n,
				 (struct fm_iov[]){ { &ref, sizeof(ref) }, { r, n * sizeof(*r) } }, 2, &ids[s]))
			sub_drop(ch, s, -EPIPE);
		else
			sent |= 1u << s;
	}
	for (unsigned s = 0; s < ns; s++) {
		size_t len;
		uint16_t st;
		int rc;
		if (!(sent & (1u << s)) || !ch->sub[s].open)
			continue;
		rc = fm_conn_recvv(&ch->sub[s].conn, FM_OP_DISCARD, ids[s], NULL, 0, &len, &st, NULL);
		if (rc)
			sub_drop(ch, s, rc);
	}
	return 0;
}

/*
 * COPY over several memds. A server can copy a page only if it holds the
 * source, so each entry goes to every live holder of its source page (one
 * request per server, all sent before any reply is read), and the
 * destination's record becomes the set of servers that copied it: reads
 * follow the record, not the hash. A holder that fails is dropped as in a
 * write; fewer than R copies count as a degraded write and the background
 * thread re-replicates. An entry no holder copied keeps the destination's
 * old record, and the caller moves that page another way.
 */
int fm_multi_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		  const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct fm_mchan *ch = c->mchan;
	struct fm_multi *m = ch->m;
	struct mspace *ss = find_space(m, src), *ds = find_space(m, dst);
	uint32_t hold[FM_MAX_BATCH], old[FM_MAX_BATCH], acked[FM_MAX_BATCH], full[FM_MAX_BATCH];
	uint64_t ids[MAX_SLOTS];
	unsigned ns = (unsigned)atomic_load(&m->nslots), want;
	uint32_t live, sent = 0;

	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (!ss || !ds)
		return -ENOENT;
	if (atomic_load(&m->broken))
		return -EPIPE;
	live = live_mask(m);
	if (!live)
		return -EPIPE;
	for (unsigned s = 0; s < ns; s++)
		if ((live & (1u << s)) && !(m->s[s].x->ctrl.server_flags & FM_HELLO_F_COPY))
			return -EOPNOTSUPP;  /* one server predates COPY: the caller reads and writes */
	/* Entries go out in parallel, so they must not depend on each other's order. */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < n; j++)
			if ((ss == ds && dpages[i] == spages[j] && i != j) || (j > i && dpages[i] == dpages[j]))
				return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		uint32_t w;

		hold[i] = acked[i] = full[i] = 0;
		if (spages[i] >= ss->npages || dpages[i] >= ds->npages) {
			status[i] = FM_E_RANGE;
			continue;
		}
		w = atomic_load_explicit(&ss->meta[spages[i]], memory_order_acquire) & META_MASK;
		status[i] = !w ? FM_E_ABSENT : !(w & live) ? FM_E_INTERNAL : FM_OK;
		if (status[i] != FM_OK || (ss == ds && spages[i] == dpages[i]))
			continue;
		hold[i] = w & live;
		old[i] = claim_write(&ds->meta[dpages[i]]);
	}
	for (unsigned s = 0; s < ns; s++) {
		struct fm_copy_req req = { .src_space = ss->sid[s], .dst_space = ds->sid[s] };
		struct fm_copy_ent ents[FM_MAX_BATCH];
		struct fm_conn *cn;
		unsigned cnt = 0;

		for (unsigned i = 0; i < n; i++)
			if (hold[i] & (1u << s))
				ents[cnt++] = (struct fm_copy_ent){ .src_page = spages[i], .dst_page = dpages[i] };
		if (!cnt || !ss->sid[s] || !ds->sid[s] || !(cn = sub_get(ch, s)))
			continue;
		if (fm_conn_send(cn, FM_OP_COPY, cnt,
				 (struct fm_iov[]){ { &req, sizeof(req) }, { ents, cnt * sizeof(ents[0]) } }, 2,
				 &ids[s]))
			sub_drop(ch, s, -EPIPE);
		else
			sent |= 1u << s;
	}
	for (unsigned s = 0; s < ns; s++) {
		unsigned cnt = 0, k = 0;
		size_t len;
		uint16_t st;
		int rc;

		if (!(sent & (1u << s)) || !ch->sub[s].open)
			continue;
		for (unsigned i = 0; i < n; i++)
			cnt += !!(hold[i] & (1u << s));
		rc = fm_conn_recvv(&ch->sub[s].conn, FM_OP_COPY, ids[s],
				   &(struct fm_iov){ ch->wst, cnt * sizeof(uint32_t) }, 1, &len, &st, NULL);
		if (rc) {
			sub_drop(ch, s, rc);
			continue;
		}
		/* A refusal (a space it lost, say) is this server's answer, not its failure. */
		if (st || len != cnt * sizeof(uint32_t))
			continue;
		slot_ok(m, s);
		for (unsigned i = 0; i < n; i++) {
			if (!(hold[i] & (1u << s)))
				continue;
			if (ch->wst[k] == FM_OK)
				acked[i] |= 1u << s;
			else if (ch->wst[k] == FM_E_FULL)
				full[i] |= 1u << s;
			k++;
		}
	}
	live = live_mask(m);
	want = (unsigned)__builtin_popcount(live) < (unsigned)m->R ? (unsigned)__builtin_popcount(live)
								   : (unsigned)m->R;
	for (unsigned i = 0; i < n; i++) {
		if (!hold[i])
			continue;
		if (acked[i]) {
			if ((unsigned)__builtin_popcount(acked[i] & live) < want) {
				MST(m, memd_degraded_writes, 1);
				atomic_store(&m->need_scan, 1);
			}
			atomic_store_explicit(&ds->meta[dpages[i]], acked[i], memory_order_release);
		} else {
			status[i] = full[i] ? FM_E_FULL : FM_E_INTERNAL;
			atomic_store_explicit(&ds->meta[dpages[i]], old[i] & META_MASK, memory_order_release);
		}
	}
	return 0;
}

/* ---- background: health, re-replication, rejoin --------------------------------------- */

struct rr { uint64_t page; uint32_t old; uint8_t from, to; };

/* Copy a batch of claimed pages: read from a live holder, write to the new slot, record it. */
static void rerep_flush(struct fm_multi *m, struct mspace *sp, struct rr *b, unsigned nb)
{
	struct fm_mchan *ch = m->bgchan->mchan;
	uint64_t pages[FM_MAX_BATCH] = { 0 };
	const void *data[FM_MAX_BATCH];
	uint32_t crc[FM_MAX_BATCH];
	struct item it[FM_MAX_BATCH], wit[FM_MAX_BATCH];
	unsigned nw = 0, done = 0;

	for (unsigned k = 0; k < nb; k++) {
		pages[k] = b[k].page;
		it[k] = (struct item){ .i = k, .slot = b[k].from, .pos = k };
	}
	read_items(ch, sp, pages, it, nb);
	for (unsigned k = 0; k < nb; k++) {
		if (it[k].res != IT_OK)
			continue;
		data[k] = ch->buf + (size_t)k * FM_PAGE_SIZE;
		crc[k] = fm_crc32c(data[k], FM_PAGE_SIZE);
		wit[nw++] = (struct item){ .i = k, .slot = b[k].to };
	}
	if (nw)
		write_items(ch, sp, pages, data, crc, wit, nw);
	for (unsigned k = 0, j = 0; k < nb; k++) {
		uint32_t v = b[k].old & META_MASK;
		if (j < nw && wit[j].i == k) {
			if (wit[j].res == IT_OK) {
				v |= 1u << b[k].to;
				done++;
			}
			j++;
		}
		atomic_store_explicit(&sp->meta[b[k].page], v, memory_order_release);
	}
	if (done)
		MST(m, memd_rereplicated, done);
	if (done < nb)
		atomic_store(&m->need_scan, 1);
}

static void rerep_scan(struct fm_multi *m)
{
	struct rr b[64];
	unsigned nsp = atomic_load(&m->nsp);

	for (unsigned i = 0; i < nsp && !atomic_load(&m->stop); i++) {
		struct mspace *sp = &m->sp[i];
		unsigned nb = 0;
		atomic_store(&m->scanning_space, (int)i + 1);
		if (!atomic_load(&sp->live) || !sp->meta) {
			atomic_store(&m->scanning_space, 0);
			continue;
		}
		for (uint64_t p = 0; p < sp->npages && atomic_load(&sp->live) && !atomic_load(&m->stop); p++) {
			uint32_t live = live_mask(m), want = (uint32_t)__builtin_popcount(live), v, h;
			uint8_t cand[MAX_SLOTS];
			unsigned nc, to = MAX_SLOTS, from;
			if (want > (uint32_t)m->R)
				want = (uint32_t)m->R;
			v = atomic_load_explicit(&sp->meta[p], memory_order_acquire);
			h = v & META_MASK & live;
			if (!h || (v & (META_WRITING | META_REPL)) || (uint32_t)__builtin_popcount(h) >= want)
				continue;
			nc = order(m, page_key(sp->id, p), live, cand);
			for (unsigned k = 0; k < nc; k++)
				if (!(h & (1u << cand[k])) && sp->sid[cand[k]]) {
					to = cand[k];
					break;
				}
			if (to == MAX_SLOTS)
				continue;
			nc = order(m, page_key(sp->id, p), h, cand);
			from = cand[0];
			if (!atomic_compare_exchange_strong(&sp->meta[p], &v, v | META_REPL))
				continue;
			b[nb++] = (struct rr){ .page = p, .old = v, .from = (uint8_t)from, .to = (uint8_t)to };
			if (nb == sizeof(b) / sizeof(b[0])) {
				rerep_flush(m, sp, b, nb);
				nb = 0;
			}
		}
		if (nb)
			rerep_flush(m, sp, b, nb);
		atomic_store(&m->scanning_space, 0);
	}
}

/* A lost server answers again: it joins as a new, empty slot. */
static void try_rejoin(struct fm_multi *m)
{
	unsigned ns = (unsigned)atomic_load(&m->nslots);

	for (unsigned s = 0; s < ns && ns < MAX_SLOTS; s++) {
		struct fm_xport_cfg c = m->cfg;
		struct fm_xport *x;
		struct slot *nsl;
		int covered = 0;
		char err[256];
		if (!atomic_load(&m->s[s].down))
			continue;
		for (unsigned k = 0; k < ns; k++)
			if (!atomic_load(&m->s[k].down) && !strcmp(m->s[k].addr, m->s[s].addr))
				covered = 1;
		if (covered)
			continue;
		c.addr = m->s[s].addr;
		c.pref = FM_PREF_STREAM;
		c.timeout_ms = m->timeout_ms;
		if (fm_xport_connect(&c, &x, err, sizeof(err)))
			continue;
		pthread_mutex_lock(&m->lock);
		nsl = &m->s[ns];
		memset(nsl, 0, sizeof(*nsl));
		memcpy(nsl->addr, m->s[s].addr, sizeof(nsl->addr));
		nsl->hseed = m->s[s].hseed;
		nsl->x = x;
		for (unsigned i = 0; i < atomic_load(&m->nsp); i++)
			if (atomic_load(&m->sp[i].live))
				open_on_slot(m, &m->sp[i], ns);
		atomic_store_explicit(&m->nslots, (int)ns + 1, memory_order_release);
		pthread_mutex_unlock(&m->lock);
		__atomic_fetch_add(&atomic_load(&m->st)->memd_servers_live, 1, __ATOMIC_RELAXED);
		fm_warn("memd at %s answers again: it rejoins empty and takes new copies", nsl->addr);
		ns++;
		atomic_store(&m->need_scan, 1);
	}
}

static void *bg_main(void *arg)
{
	struct fm_multi *m = arg;
	uint64_t last_rejoin = 0;

	pthread_setname_np(pthread_self(), "farmem-replica");
	while (!atomic_load(&m->stop)) {
		struct timespec ts;
		unsigned ns;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&m->bg_lock);
		if (!atomic_load(&m->need_scan) && !atomic_load(&m->stop))
			pthread_cond_timedwait(&m->bg_cond, &m->bg_lock, &ts);
		pthread_mutex_unlock(&m->bg_lock);
		if (atomic_load(&m->stop))
			break;
		/* A memd that died while idle: its control connection hangs up. */
		ns = (unsigned)atomic_load(&m->nslots);
		for (unsigned s = 0; s < ns; s++) {
			struct slot *sl = &m->s[s];
			struct pollfd p = { .fd = sl->x ? sl->x->ctrl.fd : -1, .events = POLLIN | POLLRDHUP };
			if (atomic_load(&sl->down) || p.fd < 0)
				continue;
			if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
				slot_lost(m, s, "its connection closed");
		}
		if (fm_now_ns() - last_rejoin > (uint64_t)REJOIN_MS * 1000000) {
			last_rejoin = fm_now_ns();
			if (live_mask(m) != ((1u << (unsigned)atomic_load(&m->nslots)) - 1))
				try_rejoin(m);
		}
		if (m->R > 1 && atomic_exchange(&m->need_scan, 0))
			rerep_scan(m);
		else
			atomic_store(&m->need_scan, 0);
	}
	return NULL;
}
