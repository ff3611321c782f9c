// SPDX-License-Identifier: Apache-2.0
/*
 * Many memd servers behind one transport (transport.h). fm_xport_connect
 * comes here when the address is a comma-separated list; the pager never
 * learns that there is more than one server. Each server is a child
 * transport (stream), used only through the table of operations (ops.h):
 * its split operations let one call send to every server before it waits
 * for any.
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
 * live, and at least one copy always; "degraded" writes (fewer than R copies:
 * fewer than R servers are live, or a replacement failed too) are counted,
 * and re-replicated in the background when a server left can take a copy. A
 * page no server acknowledged makes the call fail (-EPIPE): the pager keeps
 * it (its evict_broken path).
 *
 * Reads go to the live holders in placement order, servers in a slow spell
 * last; a holder that does not answer within the timeout, fails, or returns
 * bytes whose checksum is wrong is skipped for the next one.
 *
 * Health. A connection error (reset, refused, EOF) marks a server lost at
 * once. A timeout starts a slow spell of SLOW_MS (others are preferred), and
 * so does an answer that took more than half the timeout: a server that is
 * slow but never quite times out must not serve every fault at its pace. A
 * server that answers nothing for down_after_ms is lost. One that times out
 * STRIKES times within it but still answers now and then is lost too, unless
 * it holds the only live copy of some page: giving it up would end the
 * program at the next read of that page, while keeping it costs only time.
 * It stays, asked last, until the background has copied those pages to other
 * servers (with R=1 there is nowhere to copy them: it stays while it
 * answers). A lost server's slot is never used again: if it comes
 * back, it joins as a new, empty slot. When a loss leaves some page with no
 * live copy (R=1, or R failures), the transport is broken: it names the
 * server, refuses further writes (the pager stops evicting), and a read of
 * such a page fails after saying which server had it.
 *
 * A background thread watches the control connections, re-replicates pages
 * that have fewer than R live copies (claiming each page with REPL, so that
 * a concurrent write of the page always wins; a pass that could copy none,
 * every server that could take one being full or failing, waits before the
 * next, longer each time up to 3.2 s), reconnects lost servers, and
 * gives every channel a channel to a server that joined: the data path
 * never allocates (transport.h, signal safety).
 */
#include "ops.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"

#define MAX_SLOTS     28
#define MAX_SERVERS   16
#define MAX_REPLICAS  8
#define META_MASK     ((1u << MAX_SLOTS) - 1)
#define META_WRITING  (1u << 28)
#define META_REPL     (1u << 29)
#define SLOW_MS       2000
#define REJOIN_MS     5000
#define STRIKES       6
#define DEFAULT_TIMEOUT_MS 1000
/* A call's items: every page to at most MAX_REPLICAS servers. */
#define MAX_ITEMS     (FM_MAX_BATCH * MAX_REPLICAS)

struct slot {
	char addr[128];
	uint64_t hseed;
	struct fm_xport *x;          /* the child transport; freed at close */
	atomic_int down;
	_Atomic uint64_t slow_until; /* ns: prefer others until then */
	_Atomic uint64_t quiet_until;/* ns: its timeouts were reported; say so again after then */
	atomic_int said_slow;        /* its late answers were reported */
	_Atomic uint64_t fail_since; /* ns of the first failure of the current streak; 0 = none */
	_Atomic uint64_t strike_t0;  /* timeouts counted since then ... */
	atomic_int strikes;          /* ... STRIKES of them within down_after_ms: lost */
	atomic_int said_kept;        /* kept for its sole copies: reported */
	atomic_int told;             /* its loss was reported */
};

struct mspace {
	uint32_t id;
	uint64_t npages;
	uint32_t sid[MAX_SLOTS];     /* the space's id on each slot; 0 = none */
	_Atomic uint32_t *meta;
	size_t meta_len;
	atomic_int live;
};

struct mchan;

struct fm_multi {
	struct fm_xport base;
	struct fm_xport_cfg cfg;     /* secret points into secret[] */
	uint8_t secret[256];
	int R, down_after_ms;
	pthread_mutex_t lock;        /* spaces, slot changes, loss scans */
	struct slot s[MAX_SLOTS];
	atomic_int nslots;
	struct mspace sp[FM_XPORT_MAX_SPACES];
	atomic_uint nsp;
	uint32_t next_id;
	atomic_int broken;
	pthread_mutex_t chans_lock;  /* the channel list, and adding a child channel to one */
	struct mchan *chans;
	/* the background thread */
	pthread_t bg;
	int bg_started;
	atomic_int stop, need_scan, need_fill;
	sem_t wake;                  /* sem_post is signal-safe: the data path wakes the thread */
	struct mchan *bgchan;
	atomic_int scanning_space;   /* index+1 of the space the scan is in, 0 = none */
};

/* One page to or from one slot. */
struct item {
	unsigned i;        /* index into the caller's page arrays */
	uint8_t slot;
	int8_t res;        /* IT_* */
};
enum { IT_PENDING = 0, IT_OK = 1, IT_FAIL = -1, IT_FULL = -2, IT_ABSENT = -3, IT_CRC = -4 };

/* What one exchange sends: the pages of a call; each item picks one of them. */
struct xreq {
	uint16_t op;                 /* FM_OP_READ, FM_OP_WRITE, FM_OP_COPY */
	const struct mspace *ss;     /* the space (COPY: the source) */
	const struct mspace *ds;     /* COPY: the destination */
	const uint64_t *pages;       /* COPY: source pages */
	const uint64_t *dpages;      /* COPY */
	const void *const *data;     /* WRITE */
	const uint32_t *crc;         /* WRITE */
};

/*
 * A channel: one child channel per server, and the scratch of one call,
 * here and not on the stack (a call may run in a signal handler).
 */
struct mchan {
	struct fm_chan base;
	struct fm_multi *m;
	struct mchan *next_chan;                 /* m->chans */
	struct fm_chan *_Atomic sub[MAX_SLOTS];  /* set once, by open or by the background thread */
	uint8_t *buf;                            /* reads kept across a retry: FM_MAX_BATCH pages */
	/* per page of a call */
	uint8_t cand[FM_MAX_BATCH][MAX_SLOTS], ncand[FM_MAX_BATCH], next[FM_MAX_BATCH];
	uint8_t crcbad[FM_MAX_BATCH];
	uint8_t got[FM_MAX_BATCH];               /* reads: 1 read in this round, 2 kept in buf */
	uint32_t crc[FM_MAX_BATCH], old[FM_MAX_BATCH], acked[FM_MAX_BATCH], full[FM_MAX_BATCH];
	uint32_t hold[FM_MAX_BATCH];
	/* per item; exchange() lines the f* arrays up with the items it sorted */
	struct item it[MAX_ITEMS], tmp[MAX_ITEMS], nxt[MAX_ITEMS]; /* nxt: writes' next round */
	uint64_t fpages[MAX_ITEMS], fdpages[MAX_ITEMS];
	const void *fdata[MAX_ITEMS];
	const void *fsrc[MAX_ITEMS];
	uint32_t fcrc[MAX_ITEMS], fstatus[MAX_ITEMS];
	struct fm_req rq[MAX_SLOTS];
};

#define MST(m, field, n) FM_XPORT_COUNT(&(m)->base, field, n)

static struct fm_multi *to_multi(struct fm_xport *x) { return (struct fm_multi *)x; }
static struct mchan *to_mchan(struct fm_chan *c) { return (struct mchan *)c; }

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
	unsigned n = 0, ns = (unsigned)atomic_load_explicit(&m->nslots, memory_order_acquire);

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

static uint32_t live_mask(struct fm_multi *m)
{
	uint32_t mask = 0;
	unsigned ns = (unsigned)atomic_load_explicit(&m->nslots, memory_order_acquire);
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
	sem_post(&m->wake);
}

/* What a server's loss did to the pages: those with no live copy, and those it held that have copies left. */
struct census {
	uint64_t orphans;   /* every copy was on servers no longer live */
	uint64_t affected;  /* held by the lost server, with a live copy elsewhere */
	unsigned copies;    /* the fewest live copies among the affected */
};

/* Caller holds m->lock. */
static struct census count_copies(struct fm_multi *m, uint32_t live, unsigned lost)
{
	struct census c = { .copies = MAX_SLOTS };
	unsigned nsp = atomic_load(&m->nsp);

	for (unsigned i = 0; i < nsp; i++) {
		struct mspace *sp = &m->sp[i];
		if (!atomic_load(&sp->live))
			continue;
		for (uint64_t p = 0; p < sp->npages; p++) {
			uint32_t w = atomic_load_explicit(&sp->meta[p], memory_order_relaxed) & META_MASK;
			unsigned k = (unsigned)__builtin_popcount(w & live);
			if (w && !k) {
				c.orphans++;
			} else if (w & (1u << lost)) {
				c.affected++;
				if (k < c.copies)
					c.copies = k;
			}
		}
	}
	return c;
}

/*
 * Give a server up. Called from the data path too: m->lock is held
 * elsewhere only over this transport's own memory (transport.h).
 */
static void slot_lost(struct fm_multi *m, unsigned s, const char *why)
{
	struct slot *sl = &m->s[s];
	struct census c;
	uint32_t live;
	unsigned left;

	if (atomic_exchange(&sl->down, 1))
		return;
	MST(m, servers_lost, 1);
	MST(m, servers_live, -1);
	/* Its session goes when memd notices; no one uses its connections any more. */
	sl->x->ops->hangup(sl->x);
	pthread_mutex_lock(&m->lock);
	live = live_mask(m);
	c = count_copies(m, live, s);
	if (c.orphans)
		atomic_store(&m->broken, 1);
	pthread_mutex_unlock(&m->lock);
	left = (unsigned)__builtin_popcount(live);
	if (c.orphans)
		fm_err("lost memd at %s (%s): %llu pages were held only there (replicas=%d) and are gone; "
		       "no more pages are written to memd, and the program ends if it reads one of them",
		       sl->addr, why, (unsigned long long)c.orphans, m->R);
	else if (!left)
		fm_err("lost memd at %s (%s): no memd server is left", sl->addr, why);
	else if (!c.affected)
		fm_warn("lost memd at %s (%s): it held no pages; %u memd server%s left", sl->addr, why, left,
			left == 1 ? " is" : "s are");
	else
		/* Survivable: the run goes on, so a warning, with what it costs and whether it mends. */
		fm_warn("lost memd at %s (%s): every page it held has a copy elsewhere, %llu of them now %u "
			"cop%s (replicas=%d); %u memd server%s left: %s",
			sl->addr, why, (unsigned long long)c.affected, c.copies, c.copies == 1 ? "y" : "ies", m->R,
			left, left == 1 ? " is" : "s are",
			left >= (unsigned)m->R ? "re-replicating them in the background"
			: left > c.copies ? "re-replicating them to as many copies as there are servers"
			: "too few to re-replicate, so they keep that many copies until a server joins");
	atomic_store(&sl->told, 1);
	kick_bg(m);
}

/* Pages whose only live copy is on slot s. Caller holds m->lock. */
static uint64_t sole_copies(struct fm_multi *m, unsigned s)
{
	uint32_t live = live_mask(m);
	unsigned nsp = atomic_load(&m->nsp);
	uint64_t n = 0;

	for (unsigned i = 0; i < nsp; i++) {
		struct mspace *sp = &m->sp[i];
		if (!atomic_load(&sp->live))
			continue;
		for (uint64_t p = 0; p < sp->npages; p++)
			if ((atomic_load_explicit(&sp->meta[p], memory_order_relaxed) & META_MASK & live) == 1u << s)
				n++;
	}
	return n;
}

static int is_timeout(int rc)
{
	return rc == -ETIMEDOUT || rc == -EAGAIN || rc == -EINPROGRESS || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH;
}

/* Start a slow spell; says so when one was not under way. */
static int slow_spell(struct fm_multi *m, unsigned s, uint64_t now)
{
	return atomic_exchange(&m->s[s].slow_until, now + (uint64_t)SLOW_MS * 1000000) < now;
}

static void slot_fail(struct fm_multi *m, unsigned s, int rc)
{
	struct slot *sl = &m->s[s];
	uint64_t now = fm_now_ns(), since = 0;
	char why[96];

	if (!is_timeout(rc)) {
		slot_lost(m, s, rc == -ECONNRESET || rc == -EPIPE ? "its connection closed" : fm_strerror(rc));
		return;
	}
	if (rc == -ETIMEDOUT || rc == -EAGAIN)
		MST(m, timeouts, 1);
	slow_spell(m, s, now);
	if (atomic_exchange(&sl->quiet_until, now + (uint64_t)SLOW_MS * 1000000) < now)
		fm_warn("memd at %s did not answer within %d ms (%s): other replicas first for now",
			sl->addr, m->base.timeout_ms, fm_strerror(rc));
	/* A server that keeps timing out is as good as lost, even if small requests still pass. */
	if (now - atomic_load(&sl->strike_t0) > (uint64_t)m->down_after_ms * 1000000) {
		atomic_store(&sl->strike_t0, now);
		atomic_store(&sl->strikes, 1);
	} else if (atomic_fetch_add(&sl->strikes, 1) + 1 >= STRIKES) {
		uint64_t sole;
		pthread_mutex_lock(&m->lock);
		sole = sole_copies(m, s);
		pthread_mutex_unlock(&m->lock);
		if (!sole) {
			fm_fmt(why, sizeof(why), "%d timeouts within %d ms", STRIKES, m->down_after_ms);
			slot_lost(m, s, why);
			return;
		}
		/* Slow, not gone: it answers now and then, and it alone has these pages. */
		atomic_store(&sl->strike_t0, now);
		atomic_store(&sl->strikes, 0);
		if (!atomic_exchange(&sl->said_kept, 1))
			fm_warn("memd at %s keeps timing out (%d times within %d ms) but holds the only copy of %llu pages: "
				"kept, asked last, %s", sl->addr, STRIKES, m->down_after_ms, (unsigned long long)sole,
				m->R > 1 && __builtin_popcount(live_mask(m)) > 1
				? "while they are copied to other servers" : "while it answers");
		if (m->R > 1)
			kick_bg(m);
	}
	if (!atomic_compare_exchange_strong(&sl->fail_since, &since, now) &&
	    now - since > (uint64_t)m->down_after_ms * 1000000) {
		fm_fmt(why, sizeof(why), "no answer for %llu ms", (unsigned long long)((now - since) / 1000000));
		slot_lost(m, s, why);
	}
}

/*
 * An answer; one that took over half the timeout starts a slow spell all the
 * same: a server that is slow but never quite times out must not serve
 * every fault at its pace. Said once per server: on a loaded machine any
 * server can be late now and then.
 */
static void slot_ok(struct fm_multi *m, unsigned s, uint64_t took_ns)
{
	if (atomic_load_explicit(&m->s[s].fail_since, memory_order_relaxed))
		atomic_store(&m->s[s].fail_since, 0);
	if (took_ns > (uint64_t)m->base.timeout_ms * 500000 && slow_spell(m, s, fm_now_ns()) &&
	    !atomic_exchange(&m->s[s].said_slow, 1))
		fm_warn("memd at %s answers slowly (%llu ms, over half the %d ms timeout): other replicas first while it does",
			m->s[s].addr, (unsigned long long)(took_ns / 1000000), m->base.timeout_ms);
}

/* This channel's channel to slot s, or NULL (the server is lost, or the background thread has not made one yet). */
static struct fm_chan *sub(struct mchan *mc, unsigned s)
{
	struct fm_chan *ch;

	if (atomic_load_explicit(&mc->m->s[s].down, memory_order_relaxed))
		return NULL;
	ch = atomic_load_explicit(&mc->sub[s], memory_order_acquire);
	if (!ch && !atomic_exchange(&mc->m->need_fill, 1))
		sem_post(&mc->m->wake);  /* the background thread makes it: opening one allocates */
	return ch;
}

/* ---- one exchange with several servers --------------------------------------------- */

/*
 * The items (page it[].i to or from slot it[].slot), one request per slot,
 * every request sent before any reply is read, all by one deadline. Sets
 * each item's res. Sorts the items by slot; mc->f* line up with them after
 * (READ: fsrc[k] is item k's bytes, valid until that slot's channel is used
 * again).
 */
static void exchange(struct mchan *mc, const struct xreq *xr, struct item *it, unsigned nit)
{
	struct fm_multi *m = mc->m;
	unsigned ns = (unsigned)atomic_load(&m->nslots), start[MAX_SLOTS + 1], k = 0;
	uint64_t t0 = fm_now_ns(), deadline = t0 + (uint64_t)m->base.timeout_ms * 1000000;
	uint32_t started = 0;

	for (unsigned s = 0; s < ns; s++) {
		start[s] = k;
		for (unsigned j = 0; j < nit; j++)
			if (it[j].slot == s)
				mc->tmp[k++] = it[j];
	}
	start[ns] = k;
	memcpy(it, mc->tmp, k * sizeof(*it));
	for (k = 0; k < nit; k++) {
		unsigned i = it[k].i;
		mc->fpages[k] = xr->pages[i];
		if (xr->op == FM_OP_COPY)
			mc->fdpages[k] = xr->dpages[i];
		if (xr->op == FM_OP_WRITE) {
			mc->fdata[k] = xr->data[i];
			mc->fcrc[k] = xr->crc[i];
		}
	}
	for (unsigned s = 0; s < ns; s++) {
		unsigned first = start[s], cnt = start[s + 1] - first;
		struct fm_chan *ch;
		int rc = 0;

		if (!cnt)
			continue;
		ch = xr->ss->sid[s] && (xr->op != FM_OP_COPY || xr->ds->sid[s]) ? sub(mc, s) : NULL;
		if (ch) {
			mc->rq[s] = (struct fm_req){
				.op = xr->op, .space = xr->ss->sid[s], .dst = xr->op == FM_OP_COPY ? xr->ds->sid[s] : 0,
				.n = cnt, .pages = mc->fpages + first, .dpages = mc->fdpages + first,
				.data = mc->fdata + first, .crc = mc->fcrc + first, .src = mc->fsrc + first,
				.status = mc->fstatus + first };
			rc = ch->x->ops->start(ch, &mc->rq[s], deadline);
			if (!rc) {
				started |= 1u << s;
				continue;
			}
		}
		for (unsigned j = first; j < first + cnt; j++)
			it[j].res = IT_FAIL;
		if (rc && rc != -EOPNOTSUPP)
			slot_fail(m, s, rc);
	}
	for (unsigned s = 0; s < ns; s++) {
		struct fm_chan *ch = atomic_load_explicit(&mc->sub[s], memory_order_relaxed);
		unsigned first = start[s], cnt = start[s + 1] - first;
		int rc;

		if (!(started & (1u << s)))
			continue;
		rc = ch->x->ops->finish(ch, &mc->rq[s], deadline);
		if (rc) {
			for (unsigned j = first; j < first + cnt; j++)
				it[j].res = IT_FAIL;
			/* A refusal (a space or page it does not know) is this server's answer, not its failure. */
			if (rc != -ERANGE && rc != -ENOENT && rc != -EOPNOTSUPP)
				slot_fail(m, s, rc);
			continue;
		}
		slot_ok(m, s, fm_now_ns() - t0);
		for (unsigned j = first; j < first + cnt; j++) {
			uint32_t st = mc->fstatus[j];
			it[j].res = st == FM_OK ? IT_OK : st == FM_E_FULL ? IT_FULL
				  : xr->op == FM_OP_READ && st == FM_E_ABSENT ? IT_ABSENT
				  : xr->op == FM_OP_READ && st == FM_E_CRC ? IT_CRC : IT_FAIL;
		}
	}
}

/* ---- the data path ---------------------------------------------------------------- */

/*
 * How long one call keeps trying a page whose servers all failed it, none of
 * them lost yet: a server that keeps failing is lost after down_after_ms, so
 * by then every page has an answer, a replica that answers, or no live copy.
 */
static uint64_t call_bound(struct fm_multi *m)
{
	return fm_deadline_in(m->down_after_ms + 2 * m->base.timeout_ms);
}

/* Before another pass over the same servers: a pass that failed fast must not spin. */
static void pass_pause(uint64_t pass_start)
{
	struct timespec ts = { 0, 10 * 1000000 };

	if (fm_now_ns() - pass_start < 10ull * 1000000)
		nanosleep(&ts, NULL);
}

/* Take a page for a write or a discard: waits while the re-replicator copies it. */
static uint32_t claim_write(_Atomic uint32_t *w)
{
	uint32_t v = atomic_load(w);
	for (unsigned spins = 0;; spins++) {
		if (v & META_REPL) {
			struct timespec ts = { 0, 100000 };
			if (spins < 64)
				sched_yield();
			else
				nanosleep(&ts, NULL);
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
	/*
	 * The reader that finds a page gone may get here while the thread that
	 * lost the server is still counting what went with it; the program ends
	 * next, so let that report (which server, why, how much) come out first.
	 */
	for (unsigned s = 0; s < MAX_SLOTS; s++)
		for (unsigned ms = 0; (mask & (1u << s)) && !atomic_load(&m->s[s].told) && ms < 2000; ms++) {
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
		}
	for (unsigned s = 0; s < MAX_SLOTS && o < sizeof(who) - 2; s++)
		if (mask & (1u << s))
			o += (size_t)fm_fmt(who + o, sizeof(who) - o, "%s%s", o ? ", " : "", m->s[s].addr);
	fm_err("page %llu of space %u was held only by memd at %s, which %s lost: it cannot be read back",
	       (unsigned long long)page, space, who, __builtin_popcount(mask) > 1 ? "were all" : "was");
}

static int multi_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n, const void **src)
{
	struct mchan *mc = to_mchan(c);
	struct fm_multi *m = mc->m;
	struct mspace *sp = find_space(m, space);
	struct item *it = mc->it;
	unsigned nit = 0, left = n;
	uint32_t live;

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
		mc->ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), h, mc->cand[i]);
		mc->next[i] = 1;
		mc->crcbad[i] = mc->got[i] = 0;
		it[nit++] = (struct item){ .i = i, .slot = mc->cand[i][0] };
	}
	for (uint64_t bound = call_bound(m); nit;) {
		uint64_t t0 = fm_now_ns();
		unsigned nn = 0, again = 0;
		exchange(mc, &(struct xreq){ .op = FM_OP_READ, .ss = sp, .pages = pages }, it, nit);
		for (unsigned k = 0; k < nit; k++) {
			struct item *t = &it[k];
			unsigned i = t->i;
			if (t->res == IT_OK) {
				src[i] = mc->fsrc[k];
				mc->got[i] = 1;
				left--;
				continue;
			}
			if (t->res == IT_CRC) {
				mc->crcbad[i] = 1;
				fm_warn("memd at %s returned page %llu of space %u with a bad checksum: trying another replica",
					m->s[t->slot].addr, (unsigned long long)pages[i], space);
			}
			/* Skip holders that died meanwhile. */
			while (mc->next[i] < mc->ncand[i] && atomic_load(&m->s[mc->cand[i][mc->next[i]]].down))
				mc->next[i]++;
			if (mc->next[i] < mc->ncand[i]) {
				MST(m, failovers, 1);
				it[nn++] = (struct item){ .i = i, .slot = mc->cand[i][mc->next[i]++] };
				continue;
			}
			/* No replica left for this page in this pass. */
			if (mc->crcbad[i])
				return -EIO;
			{
				uint32_t w = atomic_load(&sp->meta[pages[i]]) & META_MASK, h = w & live_mask(m);
				if (!h) {
					lost_page_msg(m, space, pages[i], w);
					return -EHOSTDOWN;
				}
				if (t->res != IT_ABSENT && fm_now_ns() < bound) {
					/* Its servers failed, none is lost yet: another pass over them. */
					mc->ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), h, mc->cand[i]);
					mc->next[i] = 1;
					it[nn++] = (struct item){ .i = i, .slot = mc->cand[i][0] };
					again = 1;
					continue;
				}
				fm_err("no memd holding page %llu of space %u answered (%s)",
				       (unsigned long long)pages[i], space,
				       t->res == IT_ABSENT ? "it said it has no such page" : "timeouts or errors");
				return t->res == IT_ABSENT ? -ENOENT : -ETIMEDOUT;
			}
		}
		/* The retries may use a channel that holds pages read in this round: keep those here. */
		if (nn)
			for (unsigned i = 0; i < n; i++)
				if (mc->got[i] == 1) {
					memcpy(mc->buf + (size_t)i * FM_PAGE_SIZE, src[i], FM_PAGE_SIZE);
					src[i] = mc->buf + (size_t)i * FM_PAGE_SIZE;
					mc->got[i] = 2;
				}
		if (again)
			pass_pause(t0);
		nit = nn;
	}
	return left ? -ETIMEDOUT : 0;
}

/* Whether it[0..n) still holds an item of page i (this round's results are not all in yet). */
static int pending(const struct item *it, unsigned n, unsigned i)
{
	for (unsigned k = 0; k < n; k++)
		if (it[k].i == i)
			return 1;
	return 0;
}

/*
 * Sends the write items it[0..nit) (in mc->it), and the failovers and
 * passes they lead to, until every page is acked, full or out of servers.
 */
static void write_items(struct mchan *mc, struct mspace *sp, uint32_t space, const uint64_t *pages,
			const void *const *data, unsigned nit)
{
	struct fm_multi *m = mc->m;
	struct item *it = mc->it, *nx = mc->nxt;

	for (uint64_t bound = call_bound(m); nit;) {
		uint64_t t0 = fm_now_ns();
		unsigned nn = 0, again = 0;
		exchange(mc, &(struct xreq){ .op = FM_OP_WRITE, .ss = sp, .pages = pages, .data = data, .crc = mc->crc },
			 it, nit);
		for (unsigned k = 0; k < nit; k++) {
			struct item *t = &it[k];
			unsigned i = t->i;
			if (t->res == IT_OK) {
				mc->acked[i] |= 1u << t->slot;
				continue;
			}
			if (t->res == IT_FULL) {
				mc->full[i] |= 1u << t->slot;
				continue;
			}
			/* The target failed: the next live server in the page's order takes it. */
			while (mc->next[i] < mc->ncand[i] && atomic_load(&m->s[mc->cand[i][mc->next[i]]].down))
				mc->next[i]++;
			if (mc->next[i] < mc->ncand[i]) {
				MST(m, failovers, 1);
				nx[nn++] = (struct item){ .i = i, .slot = mc->cand[i][mc->next[i]++] };
				continue;
			}
			/*
			 * Every server it could go to failed it, none lost yet: another pass,
			 * unless a copy took or memd is full (then it stays with the pager).
			 */
			if (!mc->acked[i] && !mc->full[i] && fm_now_ns() < bound && !pending(nx, nn, i) &&
			    !pending(it + k + 1, nit - k - 1, i)) {
				uint32_t l = live_mask(m);
				unsigned r = (unsigned)__builtin_popcount(l) < (unsigned)m->R ? (unsigned)__builtin_popcount(l)
											: (unsigned)m->R;
				mc->ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), l, mc->cand[i]);
				mc->next[i] = (uint8_t)(r < mc->ncand[i] ? r : mc->ncand[i]);
				for (unsigned j = 0; j < mc->next[i]; j++)
					nx[nn++] = (struct item){ .i = i, .slot = mc->cand[i][j] };
				again = 1;
			}
		}
		if (again)
			pass_pause(t0);
		{
			struct item *done = it;
			it = nx;
			nx = done;
		}
		nit = nn;
	}
}

static int multi_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		       const void *const *data, uint32_t *status)
{
	struct mchan *mc = to_mchan(c);
	struct fm_multi *m = mc->m;
	struct mspace *sp = find_space(m, space);
	unsigned nit = 0, R;
	uint32_t live;
	int failed = 0;

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
		mc->old[i] = claim_write(&sp->meta[pages[i]]);
		mc->crc[i] = fm_crc32c(data[i], FM_PAGE_SIZE);
		mc->acked[i] = mc->full[i] = 0;
		mc->ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), live, mc->cand[i]);
		mc->next[i] = (uint8_t)(R < mc->ncand[i] ? R : mc->ncand[i]);
		for (unsigned j = 0; j < mc->next[i]; j++)
			mc->it[nit++] = (struct item){ .i = i, .slot = mc->cand[i][j] };
	}
	for (unsigned round = 0;; round++) {
		write_items(mc, sp, space, pages, data, nit);
		nit = 0;
		/*
		 * A copy acked by a server lost since is no copy: the census of the
		 * loss ran while this write held the page, so recorded as written it
		 * would be dropped by the pager and gone (CI, 2026-12-03: all three
		 * servers slow, one lost mid-write). Its pages go again to those left.
		 */
		live = live_mask(m);
		if (!live || round == 2)
			break;
		R = (unsigned)__builtin_popcount(live);
		if (R > (unsigned)m->R)
			R = (unsigned)m->R;
		for (unsigned i = 0; i < n; i++) {
			if (!mc->acked[i] || (mc->acked[i] & live))
				continue;
			mc->acked[i] = mc->full[i] = 0;
			mc->ncand[i] = (uint8_t)order(m, page_key(space, pages[i]), live, mc->cand[i]);
			mc->next[i] = (uint8_t)(R < mc->ncand[i] ? R : mc->ncand[i]);
			for (unsigned j = 0; j < mc->next[i]; j++)
				mc->it[nit++] = (struct item){ .i = i, .slot = mc->cand[i][j] };
		}
		if (!nit)
			break;
		MST(m, failovers, 1);
	}
	/* Under the lock a loss's census takes: it sees these pages either as left or as written. */
	pthread_mutex_lock(&m->lock);
	live = live_mask(m);
	for (unsigned i = 0; i < n; i++) {
		unsigned copies = (unsigned)__builtin_popcount(mc->acked[i] & live);
		if (copies) {
			/* Against R, not the servers left: a page with fewer copies than asked for is degraded. */
			if (copies < (unsigned)m->R) {
				MST(m, degraded_writes, 1);
				if (copies < (unsigned)__builtin_popcount(live))
					atomic_store(&m->need_scan, 1);  /* a server left can take another copy */
			}
			status[i] = FM_OK;
			atomic_store_explicit(&sp->meta[pages[i]], mc->acked[i], memory_order_release);
		} else {
			/* Not written: the pager keeps the page, and rewrites it before it drops it. */
			status[i] = FM_E_FULL;
			if (!mc->full[i])
				failed = 1;
			atomic_store_explicit(&sp->meta[pages[i]], mc->old[i] & META_MASK, memory_order_release);
		}
	}
	pthread_mutex_unlock(&m->lock);
	if (failed) {
		fm_err("a page could be written to none of the memd servers it was sent to");
		return -EPIPE;
	}
	return 0;
}

static int multi_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	struct mchan *mc = to_mchan(c);
	struct fm_multi *m = mc->m;
	struct mspace *sp = find_space(m, space);
	unsigned ns = (unsigned)atomic_load(&m->nslots);
	uint64_t deadline = fm_deadline_in(m->base.timeout_ms);
	uint32_t started = 0, holders = 0;

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
		struct fm_chan *ch = (holders & (1u << s)) && sp->sid[s] ? sub(mc, s) : NULL;
		int rc;

		if (!ch)
			continue;
		mc->rq[s] = (struct fm_req){ .op = FM_OP_DISCARD, .space = sp->sid[s], .n = n, .ranges = r };
		rc = ch->x->ops->start(ch, &mc->rq[s], deadline);
		if (rc)
			slot_fail(m, s, rc);
		else
			started |= 1u << s;
	}
	for (unsigned s = 0; s < ns; s++) {
		struct fm_chan *ch = atomic_load_explicit(&mc->sub[s], memory_order_relaxed);
		int rc;

		if (!(started & (1u << s)))
			continue;
		rc = ch->x->ops->finish(ch, &mc->rq[s], deadline);
		if (rc && rc != -ERANGE)
			slot_fail(m, s, rc);
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
static int multi_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		      const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct mchan *mc = to_mchan(c);
	struct fm_multi *m = mc->m;
	struct mspace *ss = find_space(m, src), *ds = find_space(m, dst);
	struct item *it = mc->it;
	unsigned ns = (unsigned)atomic_load(&m->nslots), nit = 0;
	uint32_t live;

	if (!ss || !ds)
		return -ENOENT;
	if (atomic_load(&m->broken))
		return -EPIPE;
	live = live_mask(m);
	if (!live)
		return -EPIPE;
	for (unsigned s = 0; s < ns; s++)
		if ((live & (1u << s)) && !m->s[s].x->can_copy)
			return -EOPNOTSUPP;  /* one server predates COPY: the caller reads and writes */
	/* Entries go out in parallel, so they must not depend on each other's order. */
	for (unsigned i = 0; i < n; i++)
		for (unsigned j = 0; j < n; j++)
			if ((ss == ds && dpages[i] == spages[j] && i != j) || (j > i && dpages[i] == dpages[j]))
				return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		uint32_t w;

		mc->hold[i] = mc->acked[i] = mc->full[i] = 0;
		if (spages[i] >= ss->npages || dpages[i] >= ds->npages) {
			status[i] = FM_E_RANGE;
			continue;
		}
		w = atomic_load_explicit(&ss->meta[spages[i]], memory_order_acquire) & META_MASK;
		status[i] = !w ? FM_E_ABSENT : !(w & live) ? FM_E_INTERNAL : FM_OK;
		if (status[i] != FM_OK || (ss == ds && spages[i] == dpages[i]))
			continue;
		mc->hold[i] = w & live;
		mc->old[i] = claim_write(&ds->meta[dpages[i]]);
		for (unsigned s = 0, k = 0; s < ns && k < MAX_REPLICAS; s++)
			if (mc->hold[i] & (1u << s)) {
				it[nit++] = (struct item){ .i = i, .slot = (uint8_t)s };
				k++;
			}
	}
	if (nit)
		exchange(mc, &(struct xreq){ .op = FM_OP_COPY, .ss = ss, .ds = ds, .pages = spages, .dpages = dpages },
			 it, nit);
	for (unsigned k = 0; k < nit; k++) {
		if (it[k].res == IT_OK)
			mc->acked[it[k].i] |= 1u << it[k].slot;
		else if (it[k].res == IT_FULL)
			mc->full[it[k].i] |= 1u << it[k].slot;
	}
	live = live_mask(m);
	for (unsigned i = 0; i < n; i++) {
		if (!mc->hold[i])
			continue;
		if (mc->acked[i]) {
			unsigned copies = (unsigned)__builtin_popcount(mc->acked[i] & live);
			if (copies < (unsigned)m->R) {
				MST(m, degraded_writes, 1);
				if (copies < (unsigned)__builtin_popcount(live))
					atomic_store(&m->need_scan, 1);
			}
			atomic_store_explicit(&ds->meta[dpages[i]], mc->acked[i], memory_order_release);
		} else {
			status[i] = mc->full[i] ? FM_E_FULL : FM_E_INTERNAL;
			atomic_store_explicit(&ds->meta[dpages[i]], mc->old[i] & META_MASK, memory_order_release);
		}
	}
	return 0;
}

/* ---- spaces, channels, stats ---------------------------------------------------------------- */

/* Open the space on slot s (a new one, or at start). Caller holds m->lock. */
static int open_on_slot(struct fm_multi *m, struct mspace *sp, unsigned s)
{
	int rc = m->s[s].x->ops->space_open(m->s[s].x, sp->npages, &sp->sid[s]);
	if (rc)
		sp->sid[s] = 0;
	return rc;
}

static int multi_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	struct fm_multi *m = to_multi(x);
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
	if (!sp && atomic_load(&m->nsp) < FM_XPORT_MAX_SPACES)
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
				m->s[s].x->ops->space_close(m->s[s].x, sp->sid[s]);
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

static int multi_space_close(struct fm_xport *x, uint32_t space_id)
{
	struct fm_multi *m = to_multi(x);
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
			m->s[s].x->ops->space_close(m->s[s].x, sp->sid[s]);
	if (atomic_load(&m->scanning_space) != (int)(sp - m->sp) + 1) {
		fm_sys_munmap((void *)sp->meta, sp->meta_len);
		sp->meta = NULL;
	}
	pthread_mutex_unlock(&m->lock);
	return 0;
}

static int multi_stats(struct fm_xport *x, struct fm_stats *st)
{
	struct fm_multi *m = to_multi(x);
	uint32_t live = live_mask(m);
	int got = 0, rc = -EPIPE;

	memset(st, 0, sizeof(*st));
	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++) {
		struct fm_stats one;
		uint64_t a[sizeof(one) / 8], b[sizeof(one) / 8];
		if (!(live & (1u << s)))
			continue;
		rc = m->s[s].x->ops->stats(m->s[s].x, &one);
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

/* Some server answers, for the pager's liveness checks. */
static int multi_alive(struct fm_xport *x)
{
	return live_mask(to_multi(x)) != 0;
}

static void multi_hangup(struct fm_xport *x)
{
	struct fm_multi *m = to_multi(x);

	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++)
		m->s[s].x->ops->hangup(m->s[s].x);
}

/* Give mc a channel to slot s, unless it has one or s is lost. Caller holds chans_lock. */
static void add_sub(struct fm_multi *m, struct mchan *mc, unsigned s)
{
	struct fm_xport *cx = m->s[s].x;
	struct fm_chan *ch;

	if (atomic_load(&mc->sub[s]) || atomic_load(&m->s[s].down))
		return;
	if (cx->ops->chan_open(cx, &ch) == 0)
		atomic_store_explicit(&mc->sub[s], ch, memory_order_release);
}

static void multi_chan_close(struct fm_chan *c)
{
	struct mchan *mc = to_mchan(c);
	struct fm_multi *m = mc->m;

	pthread_mutex_lock(&m->chans_lock);
	for (struct mchan **p = &m->chans; *p; p = &(*p)->next_chan)
		if (*p == mc) {
			*p = mc->next_chan;
			break;
		}
	pthread_mutex_unlock(&m->chans_lock);
	for (int s = 0; s < MAX_SLOTS; s++) {
		struct fm_chan *ch = atomic_load(&mc->sub[s]);
		if (ch)
			ch->x->ops->chan_close(ch);
	}
	free(mc->buf);
	free(mc);
}

static int multi_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct fm_multi *m = to_multi(x);
	struct mchan *mc = calloc(1, sizeof(*mc));

	if (!mc)
		return -ENOMEM;
	mc->base.x = x;
	mc->m = m;
	mc->buf = aligned_alloc(FM_PAGE_SIZE, (size_t)FM_MAX_BATCH * FM_PAGE_SIZE);
	if (!mc->buf) {
		free(mc);
		return -ENOMEM;
	}
	/* Under chans_lock: a server that joins meanwhile either is seen here or sees this channel. */
	pthread_mutex_lock(&m->chans_lock);
	for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++)
		add_sub(m, mc, s);
	mc->next_chan = m->chans;
	m->chans = mc;
	pthread_mutex_unlock(&m->chans_lock);
	*out = &mc->base;
	return 0;
}

/* ---- background: health, re-replication, rejoin --------------------------------------- */

struct rr { uint64_t page; uint32_t old; uint8_t from, to; };

/* Copy a batch of claimed pages: read from a live holder, write to the new slot, record it; how many were. */
static unsigned rerep_flush(struct fm_multi *m, struct mspace *sp, struct rr *b, unsigned nb)
{
	struct mchan *mc = m->bgchan;
	uint64_t pages[64];
	const void *data[64];
	uint32_t crc[64];
	uint8_t copied[64] = { 0 };
	struct item it[64], wit[64];
	unsigned nw = 0, done = 0;

	for (unsigned k = 0; k < nb; k++) {
		pages[k] = b[k].page;
		it[k] = (struct item){ .i = k, .slot = b[k].from };
	}
	exchange(mc, &(struct xreq){ .op = FM_OP_READ, .ss = sp, .pages = pages }, it, nb);
	for (unsigned k = 0; k < nb; k++) {
		unsigned i = it[k].i;
		if (it[k].res != IT_OK)
			continue;
		data[i] = mc->fsrc[k];  /* in the holder's channel; the write goes on another */
		crc[i] = fm_crc32c(data[i], FM_PAGE_SIZE);
		wit[nw++] = (struct item){ .i = i, .slot = b[i].to };
	}
	if (nw)
		exchange(mc, &(struct xreq){ .op = FM_OP_WRITE, .ss = sp, .pages = pages, .data = data, .crc = crc },
			 wit, nw);
	for (unsigned k = 0; k < nw; k++)
		if (wit[k].res == IT_OK)
			copied[wit[k].i] = 1;
	for (unsigned k = 0; k < nb; k++) {
		uint32_t v = b[k].old & META_MASK;
		if (copied[k]) {
			v |= 1u << b[k].to;
			done++;
		}
		atomic_store_explicit(&sp->meta[b[k].page], v, memory_order_release);
	}
	if (done)
		MST(m, rereplicated, done);
	if (done < nb)
		atomic_store(&m->need_scan, 1);
	return done;
}

/* One pass over every space; the pages it copied. */
static uint64_t rerep_scan(struct fm_multi *m)
{
	struct rr b[64];
	unsigned nsp = atomic_load(&m->nsp);
	uint64_t copied = 0;

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
			/* From a server in a slow spell a page at a time: a batch would miss the timeout. */
			if (nb == sizeof(b) / sizeof(b[0]) ||
			    atomic_load_explicit(&m->s[from].slow_until, memory_order_relaxed) > fm_now_ns()) {
				copied += rerep_flush(m, sp, b, nb);
				nb = 0;
			}
		}
		if (nb)
			copied += rerep_flush(m, sp, b, nb);
		atomic_store(&m->scanning_space, 0);
	}
	return copied;
}

/* Every channel gets a channel to every live server: after a server joins, or an open that failed. */
static void fill_chans(struct fm_multi *m)
{
	pthread_mutex_lock(&m->chans_lock);
	for (struct mchan *mc = m->chans; mc; mc = mc->next_chan)
		for (unsigned s = 0; s < (unsigned)atomic_load(&m->nslots); s++)
			add_sub(m, mc, s);
	pthread_mutex_unlock(&m->chans_lock);
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
		if (fm_stream_connect(&c, 1, &x, err, sizeof(err)))
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
		MST(m, servers_live, 1);
		fm_warn("memd at %s answers again: it rejoins empty and takes new copies", nsl->addr);
		ns++;
		atomic_store(&m->need_scan, 1);
	}
}

static void *bg_main(void *arg)
{
	struct fm_multi *m = arg;
	uint64_t last_rejoin = 0;
	unsigned idle_scans = 0;  /* scans in a row that copied nothing */

	pthread_setname_np(pthread_self(), "farmem-replica");
	while (!atomic_load(&m->stop)) {
		struct timespec ts;
		unsigned ns;
		/*
		 * A scan that copied nothing (the servers that could take a copy are
		 * full, or failing) is tried again after a wait that doubles up to
		 * 3.2 s, not at once: at once, it held a CPU for as long as a
		 * server stayed full.
		 */
		long wait_ms = 200L << (idle_scans < 4 ? idle_scans : 4);

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += wait_ms / 1000;
		ts.tv_nsec += (wait_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (!atomic_load(&m->need_scan) || idle_scans)
			sem_timedwait(&m->wake, &ts);
		while (sem_trywait(&m->wake) == 0)
			;
		if (atomic_load(&m->stop))
			break;
		/* A memd that died while idle: its control connection hangs up. */
		ns = (unsigned)atomic_load(&m->nslots);
		for (unsigned s = 0; s < ns; s++)
			if (!atomic_load(&m->s[s].down) && !m->s[s].x->ops->alive(m->s[s].x))
				slot_lost(m, s, "its connection closed");
		if (fm_now_ns() - last_rejoin > (uint64_t)REJOIN_MS * 1000000) {
			last_rejoin = fm_now_ns();
			if (live_mask(m) != ((1u << (unsigned)atomic_load(&m->nslots)) - 1))
				try_rejoin(m);
			atomic_store(&m->need_fill, 1);
		}
		if (atomic_exchange(&m->need_fill, 0))
			fill_chans(m);
		if (m->R > 1 && atomic_exchange(&m->need_scan, 0))
			idle_scans = (rerep_scan(m) || !atomic_load(&m->need_scan)) ? 0 : idle_scans + 1;
		else
			atomic_store(&m->need_scan, 0);
	}
	return NULL;
}

/* ---- connect and close ------------------------------------------------------------- */

static void multi_close(struct fm_xport *x)
{
	struct fm_multi *m = to_multi(x);

	if (m->bg_started) {
		atomic_store(&m->stop, 1);
		sem_post(&m->wake);
		pthread_join(m->bg, NULL);
	}
	if (m->bgchan)
		multi_chan_close(&m->bgchan->base);
	for (unsigned i = 0; i < atomic_load(&m->nsp); i++)
		if (m->sp[i].meta)
			fm_sys_munmap((void *)m->sp[i].meta, m->sp[i].meta_len);
	for (int s = 0; s < atomic_load(&m->nslots); s++)
		if (m->s[s].x)
			m->s[s].x->ops->close(m->s[s].x);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->chans_lock);
	sem_destroy(&m->wake);
	free(m);
}

static const struct fm_xport_ops multi_ops = {
	.space_open = multi_space_open,
	.space_close = multi_space_close,
	.stats = multi_stats,
	.alive = multi_alive,
	.hangup = multi_hangup,
	.close = multi_close,
	.chan_open = multi_chan_open,
	.chan_close = multi_chan_close,
	.read = multi_read,
	.write = multi_write,
	.copy = multi_copy,
	.discard = multi_discard,
};

int fm_multi_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	struct fm_multi *m;
	struct fm_chan *bg;
	const char *a;
	int rc = 0;

	if (cfg->secret_len == 0 || cfg->secret_len > sizeof(m->secret)) {
		fm_errmsg(err, errlen, "the memd secret must be 1 to %zu bytes", sizeof(m->secret));
		return -EINVAL;
	}
	if (cfg->pref == FM_PREF_SHM) {
		fm_errmsg(err, errlen, "several memd servers (%s) need the stream transport, not shm", cfg->addr);
		return -EOPNOTSUPP;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	fm_xport_init(&m->base, &multi_ops, FM_XPORT_STREAM, cfg->addr,
		      cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS);
	memcpy(m->secret, cfg->secret, cfg->secret_len);
	m->cfg = *cfg;
	m->cfg.secret = m->secret;
	m->cfg.pref = FM_PREF_STREAM;
	m->cfg.timeout_ms = m->base.timeout_ms;
	m->down_after_ms = 3 * m->base.timeout_ms > 3000 ? 3 * m->base.timeout_ms : 3000;
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->chans_lock, NULL);
	sem_init(&m->wake, 0, 0);

	for (a = cfg->addr; *a;) {
		const char *e = strchr(a, ',');
		size_t n = e ? (size_t)(e - a) : strlen(a);
		struct fm_xport_cfg c = m->cfg;
		int ns = atomic_load(&m->nslots);
		struct slot *sl = &m->s[ns];

		if (n == 0 || n >= sizeof(sl->addr)) {
			fm_errmsg(err, errlen, "bad memd address list '%s': empty or overlong entry", cfg->addr);
			rc = -EINVAL;
			goto fail;
		}
		if (ns >= MAX_SERVERS) {
			fm_errmsg(err, errlen, "at most %d memd servers (%s)", MAX_SERVERS, cfg->addr);
			rc = -EINVAL;
			goto fail;
		}
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
		rc = fm_stream_connect(&c, 1, &sl->x, err, errlen);
		if (rc)
			goto fail;
		atomic_store(&m->nslots, ns + 1);
		a += n;
		if (*a == ',')
			a++;
	}
	m->R = cfg->replicas > 0 ? cfg->replicas : 1;
	if (m->R > atomic_load(&m->nslots) || m->R > MAX_REPLICAS) {
		fm_errmsg(err, errlen, "replicas=%d needs at least %d memd servers (at most %d replicas), %d given",
			  m->R, m->R, MAX_REPLICAS, atomic_load(&m->nslots));
		rc = -EINVAL;
		goto fail;
	}
	m->base.own.servers_live = (uint64_t)atomic_load(&m->nslots);
	m->base.can_copy = 1;
	rc = multi_chan_open(&m->base, &bg);
	if (rc) {
		fm_errmsg(err, errlen, "cannot open a channel to the memd servers: %s", fm_strerror(rc));
		goto fail;
	}
	m->bgchan = to_mchan(bg);
	rc = -fm_thread_create(&m->bg, NULL, bg_main, m);
	if (rc) {
		fm_errmsg(err, errlen, "cannot start the replication thread: %s", fm_strerror(rc));
		goto fail;
	}
	m->bg_started = 1;
	fm_info("%d memd servers, %d replica%s of every page", atomic_load(&m->nslots), m->R,
		m->R > 1 ? "s" : "");
	*out = &m->base;
	return 0;
fail:
	multi_close(&m->base);
	return rc;
}
