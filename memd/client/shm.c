// SPDX-License-Identifier: Apache-2.0
/*
 * The shm transport: a same-host memd passes each space's store (a memfd:
 * page data, then an fm_shm_meta {crc, flags} per page) over the Unix
 * socket, and pages move with plain loads and stores into it. A read is a
 * pointer into the store and a checksum check, no system call. The control
 * connection carries space management and the quota grant only.
 */
#include "ops.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctrl.h"
#include "fm_util.h"

struct space_map {
	uint32_t id;
	uint64_t npages;
	uint8_t *data;             /* published last: find_space keys on it without a lock */
	struct fm_shm_meta *meta;
	size_t map_len;
	int memfd;
	/*
	 * mem[p]: slot p has memory in the memfd (written since it was last
	 * punched). kept: slots with memory that memd holds no page in. Both
	 * change under the caller's hold on the page (transport.h).
	 */
	uint8_t *mem;
	uint64_t kept;
	/* checked[p]: the pause in which slot p's bytes last matched its checksum (fm_xport_pause). */
	uint32_t *checked;
	size_t books_len;          /* mem and checked, one mapping */
};

/*
 * mem and checked for a space of npages, in one anonymous mapping: zero
 * until used, so a space that is mostly never paged (a runtime's 4 GiB
 * window of address space with a few MiB in it) costs what it uses, not
 * five bytes a page taken from the pager's own arena (which ran out at
 * 204 such spaces).
 */
static uint8_t *books_map(uint64_t npages, size_t *len)
{
	uint64_t n = npages ? npages : 1;
	void *p;

	*len = (size_t)((n * (1 + sizeof(uint32_t)) + sizeof(uint32_t) + FM_PAGE_SIZE - 1) & ~(uint64_t)(FM_PAGE_SIZE - 1));
	p = fm_sys_mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* checked follows mem, aligned for its words. */
static uint32_t *books_checked(uint8_t *mem, uint64_t npages)
{
	uint64_t n = npages ? npages : 1;

	return (uint32_t *)(void *)(mem + ((n + sizeof(uint32_t) - 1) & ~(uint64_t)(sizeof(uint32_t) - 1)));
}

struct shm {
	struct fm_session_xport sx;
	pthread_mutex_t lock;      /* the space table's changes */
	struct space_map spaces[FM_XPORT_MAX_SPACES];
	unsigned nspaces;
	uint64_t alive_ns;         /* when a poll last found memd's control connection up */
	unsigned pauses;           /* fm_xport_pause nesting, under lock */
	uint32_t pause_id;         /* the pause under way, 0 when none: read without the lock */
	uint32_t last_pause_id;
	/*
	 * memd lives in another memory cgroup and allocates the slots before
	 * their first write (protocol.h, FM_HELLO_F_ALLOC): its cgroup, not
	 * ours, pays for its store. The grant then counts slots with memory,
	 * kept ones too, not pages: memd never holds more than it granted.
	 */
	int memd_allocates;
};

static struct shm *to_shm(struct fm_xport *x) { return (struct shm *)x; }

static struct space_map *find_space(struct shm *s, uint32_t id)
{
	unsigned n = __atomic_load_n(&s->nspaces, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; i < n; i++)
		if (s->spaces[i].id == id && __atomic_load_n(&s->spaces[i].data, __ATOMIC_ACQUIRE))
			return &s->spaces[i];
	return NULL;
}

/*
 * Slot p's bytes match its checksum: checked already in this pause (nothing
 * but the pause's workers wrote the store since, each through a write or a
 * seal that checksums what it wrote), or checked now.
 */
static int intact(struct shm *s, struct space_map *sm, uint64_t p)
{
	uint32_t now = __atomic_load_n(&s->pause_id, __ATOMIC_RELAXED);

	if (now && __atomic_load_n(&sm->checked[p], __ATOMIC_RELAXED) == now)
		return 1;
	if (fm_crc32c(sm->data + p * FM_PAGE_SIZE, FM_PAGE_SIZE) != sm->meta[p].crc)
		return 0;
	/* Outside a pause nothing is marked: no later pause has this one's id, so a fault pays no store. */
	if (now)
		__atomic_store_n(&sm->checked[p], now, __ATOMIC_RELAXED);
	return 1;
}

/* Slot p's checksum was just computed from the bytes it holds. */
static void summed(struct shm *s, struct space_map *sm, uint64_t p)
{
	uint32_t now = __atomic_load_n(&s->pause_id, __ATOMIC_RELAXED);

	if (now)
		__atomic_store_n(&sm->checked[p], now, __ATOMIC_RELAXED);
}

/* Slot p, which memd holds no page in, is written: memory it kept is in use again. 1 if it had memory. */
static int slot_filled(struct space_map *sm, uint64_t p)
{
	if (!__atomic_exchange_n(&sm->mem[p], 1, __ATOMIC_RELAXED))
		return 0;
	__atomic_fetch_sub(&sm->kept, 1, __ATOMIC_RELAXED);
	return 1;
}

/* Slot p's memory goes back to the system (a hole is punched there next). 1 if it had memory. */
static int slot_punched(struct space_map *sm, uint64_t p, int was_present)
{
	if (!__atomic_exchange_n(&sm->mem[p], 0, __ATOMIC_RELAXED))
		return 0;
	if (!was_present)
		__atomic_fetch_sub(&sm->kept, 1, __ATOMIC_RELAXED);
	return 1;
}

/*
 * Does writing slot p, which holds no page, take a page of the grant? Always
 * when the grant counts pages; when memd allocates (memd_allocates), it
 * counts slots with memory, so not for one that kept its memory.
 */
static int takes_grant(struct shm *s, struct space_map *sm, uint64_t p)
{
	return !s->memd_allocates || !__atomic_load_n(&sm->mem[p], __ATOMIC_RELAXED);
}

/*
 * Does slot p hold a page? With memd allocating, one without memory does
 * not (a page is written only into memory), and its meta is not read:
 * reading a hole of a shared mapping allocates it, in our cgroup.
 */
static int slot_present(struct shm *s, struct space_map *sm, uint64_t p)
{
	if (s->memd_allocates && !__atomic_load_n(&sm->mem[p], __ATOMIC_RELAXED))
		return 0;
	return !!(__atomic_load_n(&sm->meta[p].flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT);
}

#define RUN_AHEAD 256 /* slots given memory past a run being filled, at most */

/*
 * A run of slots about to be filled continues one that has memory (the slot
 * before it has some: a collector's promotion, a first fill evicted in
 * order): stretch it over up to RUN_AHEAD slots after it that have none,
 * each taking a page of the grant, so that the run's next pages need no
 * request. Returns how many it added.
 */
static uint64_t stretch_run(struct shm *s, struct space_map *sm, struct fm_range *r)
{
	uint64_t end = r->first + r->npages, added = 0;

	if (!r->first || !__atomic_load_n(&sm->mem[r->first - 1], __ATOMIC_RELAXED))
		return 0;
	while (added < RUN_AHEAD && end + added < sm->npages &&
	       !__atomic_load_n(&sm->mem[end + added], __ATOMIC_RELAXED) && fm_ctrl_take_grant(&s->sx.ctrl))
		added++;
	r->npages += added;
	return added;
}

/*
 * The n slots from first that stretch_run added, which the caller does not
 * hold: allocated (ok), they are kept (memory, no page) with their grant,
 * unless another thread gave one memory meanwhile with a grant of its own.
 * Refused, their grants go back, and what memd gave them before it refused
 * stays until their range is discarded: another thread may be filling one,
 * so no hole is punched there.
 */
static void settle_stretch(struct shm *s, struct space_map *sm, uint64_t first, uint64_t n, int ok)
{
	uint64_t back = ok ? 0 : n;

	for (uint64_t q = first; ok && q < first + n; q++) {
		uint8_t none = 0;

		if (__atomic_compare_exchange_n(&sm->mem[q], &none, 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			__atomic_fetch_add(&sm->kept, 1, __ATOMIC_RELAXED);
		else
			back++;
	}
	fm_ctrl_return_grant(&s->sx.ctrl, back);
}

#define ALLOC_RANGES 64 /* per request: a scattered batch takes a few */

/* A channel: the scratch of memd allocating, kept here and not on a signal handler's stack (transport.h). */
struct shm_chan {
	struct fm_chan base;
	uint64_t fresh[FM_MAX_BATCH];
	struct fm_range ranges[ALLOC_RANGES];
};

static struct shm_chan *to_chan(struct fm_chan *c) { return (struct shm_chan *)c; }

/*
 * Slots among pages[0..n), held by the caller, that take a page of the grant
 * and have no memory yet get it from memd, a request per ALLOC_RANGES runs;
 * the last run is stretched (stretch_run). 0; -ENOSPC when memd refused (or
 * answered what it should not), with nothing of it left behind in the
 * slots held; else memd is lost.
 */
static int memd_allocate(struct shm *s, struct shm_chan *ch, struct space_map *sm, const uint64_t *pages, unsigned n)
{
	struct fm_range *r = ch->ranges;
	unsigned i = 0;
	int rc = 0;

	while (i < n && !rc) {
		unsigned nr = 0;

		for (; i < n; i++) {
			if (__atomic_load_n(&sm->mem[pages[i]], __ATOMIC_RELAXED))
				continue;
			if (nr && r[nr - 1].first + r[nr - 1].npages == pages[i]) {
				r[nr - 1].npages++;
				continue;
			}
			if (nr == ALLOC_RANGES)
				break;
			r[nr++] = (struct fm_range){ pages[i], 1 };
		}
		if (!nr)
			break;
		if (i == n) {
			uint64_t end = r[nr - 1].first + r[nr - 1].npages, added = stretch_run(s, sm, &r[nr - 1]);

			rc = fm_ctrl_shm_alloc(&s->sx.ctrl, sm->id, r, nr);
			settle_stretch(s, sm, end, added, !rc);
		} else {
			rc = fm_ctrl_shm_alloc(&s->sx.ctrl, sm->id, r, nr);
		}
	}
	if (rc != -ENOSPC && rc != -EPROTO)
		return rc;
	/* Refused, maybe after some was allocated (this request's or an earlier one's): that memory would be no slot's. */
	for (i = 0; i < n; i++)
		if (!__atomic_load_n(&sm->mem[pages[i]], __ATOMIC_RELAXED))
			fallocate(sm->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  (off_t)(pages[i] * FM_PAGE_SIZE), FM_PAGE_SIZE);
	return -ENOSPC;
}

static int map_space(struct fm_xport *x, uint32_t id, uint64_t npages)
{
	struct shm *s = to_shm(x);
	struct fm_space_ref ref = { .space_id = id };
	struct fm_shm_map_rep rep;
	struct space_map *sm = NULL;
	size_t len, books_len;
	uint16_t st;
	int fd = -1, rc;
	uint8_t *mem;
	void *p;

	rc = fm_ctrl_call(&s->sx.ctrl, FM_OP_SHM_MAP, &ref, sizeof(ref), &rep, sizeof(rep), &len, &st, &fd);
	if (rc)
		return rc;
	if (st || len != sizeof(rep) || fd < 0 || rep.npages != npages ||
	    rep.data_offset % FM_PAGE_SIZE || rep.meta_offset % FM_PAGE_SIZE ||
	    rep.meta_offset < rep.data_offset + npages * FM_PAGE_SIZE ||
	    rep.map_len < rep.meta_offset + npages * sizeof(struct fm_shm_meta)) {
		rc = -EPROTO;
		goto fail;
	}
	p = fm_sys_mmap(NULL, rep.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	mem = books_map(npages, &books_len);
	if (!mem) {
		fm_sys_munmap(p, rep.map_len);
		rc = -ENOMEM;
		goto fail;
	}
	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < s->nspaces; i++)
		if (!s->spaces[i].data)
			sm = &s->spaces[i];
	if (!sm && s->nspaces < FM_XPORT_MAX_SPACES)
		sm = &s->spaces[s->nspaces];
	if (sm) {
		sm->id = id;
		sm->npages = npages;
		sm->memfd = fd;
		sm->map_len = rep.map_len;
		sm->meta = (struct fm_shm_meta *)((uint8_t *)p + rep.meta_offset);
		sm->mem = mem;
		sm->kept = 0;
		sm->checked = books_checked(mem, npages);
		sm->books_len = books_len;
		__atomic_store_n(&sm->data, (uint8_t *)p + rep.data_offset, __ATOMIC_RELEASE);
		if (sm == &s->spaces[s->nspaces])
			__atomic_store_n(&s->nspaces, s->nspaces + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&s->lock);
	if (!sm) {
		fm_sys_munmap(p, rep.map_len);
		fm_sys_munmap(mem, books_len);
		rc = -ENOSPC;
		goto fail;
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return rc;
}

static int shm_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	return fm_session_xport_space_open(x, npages, space_id, map_space);
}

static int shm_space_close(struct fm_xport *x, uint32_t space_id)
{
	struct shm *s = to_shm(x);
	struct space_map *sm = find_space(s, space_id);

	if (sm) {
		pthread_mutex_lock(&s->lock);
		fm_sys_munmap(sm->data, sm->map_len);
		close(sm->memfd);
		__atomic_store_n(&sm->data, NULL, __ATOMIC_RELEASE);
		sm->memfd = -1;
		fm_sys_munmap(sm->mem, sm->books_len);
		sm->mem = NULL;
		sm->checked = NULL;
		pthread_mutex_unlock(&s->lock);
	}
	return fm_session_xport_space_close(x, space_id);
}

static void shm_close(struct fm_xport *x)
{
	struct shm *s = to_shm(x);

	for (unsigned i = 0; i < s->nspaces; i++) {
		if (s->spaces[i].data)
			fm_sys_munmap(s->spaces[i].data, s->spaces[i].map_len);
		if (s->spaces[i].data && s->spaces[i].memfd >= 0)
			close(s->spaces[i].memfd);
		if (s->spaces[i].mem)
			fm_sys_munmap(s->spaces[i].mem, s->spaces[i].books_len);
	}
	pthread_mutex_destroy(&s->lock);
	fm_session_xport_free(&s->sx);
}

static int shm_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct shm_chan *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->base.x = x;
	*out = &c->base;
	return 0;
}

static void shm_chan_close(struct fm_chan *c) { free(c); }

static int shm_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n, const void **src)
{
	struct shm *s = to_shm(c->x);
	struct space_map *sm = find_space(s, space);

	if (!sm)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++) {
		uint64_t p = pages[i];

		if (p >= sm->npages)
			return -ERANGE;
		if (!(__atomic_load_n(&sm->meta[p].flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT))
			return -ENOENT;
		if (!intact(s, sm, p))
			return -EIO;
		src[i] = sm->data + p * FM_PAGE_SIZE;
	}
	return 0;
}

/*
 * With memd allocating: the pages of a write new to the store (status
 * FM_E_ABSENT; present FM_OK; refused FM_E_FULL). One whose slot has no
 * memory takes a page of the grant (its bit in took) and memd's memory, one
 * request for the batch. 0, or memd is lost (every grant taken is back).
 */
static int allocate_new(struct shm *s, struct shm_chan *ch, struct space_map *sm, const uint64_t *pages,
			unsigned n, uint32_t *status, uint64_t *took)
{
	uint64_t *fresh = ch->fresh;
	unsigned nf = 0;
	int rc;

	for (unsigned i = 0; i < n; i++) {
		status[i] = FM_OK;
		if (slot_present(s, sm, pages[i]))
			continue;
		status[i] = FM_E_ABSENT;
		if (!takes_grant(s, sm, pages[i]))
			continue;
		if (i >= FM_MAX_BATCH || !fm_ctrl_take_grant(&s->sx.ctrl)) {
			status[i] = FM_E_FULL;
			continue;
		}
		took[i / 64] |= 1ull << (i % 64);
		fresh[nf++] = pages[i];
	}
	if (!nf)
		return 0;
	rc = memd_allocate(s, ch, sm, fresh, nf);
	if (!rc)
		return 0;
	for (unsigned i = 0; i < n && i < FM_MAX_BATCH; i++)
		if (took[i / 64] & (1ull << (i % 64)))
			status[i] = FM_E_FULL;
	memset(took, 0, FM_MAX_BATCH / 8);
	fm_ctrl_return_grant(&s->sx.ctrl, nf);
	return rc == -ENOSPC ? 0 : rc;
}

static int shm_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		     const void *const *data, uint32_t *status)
{
	struct shm *s = to_shm(c->x);
	uint64_t took[FM_MAX_BATCH / 64] = { 0 };
	struct space_map *sm;

	/* memd's control connection hung up: it is gone, do not trust it with a page. */
	if (!fm_ctrl_alive(&s->sx.ctrl))
		return -EPIPE;
	sm = find_space(s, space);
	if (!sm)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++)
		if (pages[i] >= sm->npages)
			return -ERANGE;
	if (s->memd_allocates) {
		int rc = allocate_new(s, to_chan(c), sm, pages, n, status, took);

		if (rc)
			return rc;
	}
	for (unsigned i = 0; i < n; i++) {
		uint64_t p = pages[i];
		struct fm_shm_meta *m = &sm->meta[p];

		if (s->memd_allocates) {
			if (status[i] == FM_E_FULL)
				continue;
			/* A slot given memory by another thread's run meanwhile came with its own grant. */
			if (status[i] == FM_E_ABSENT && slot_filled(sm, p) && i < FM_MAX_BATCH &&
			    (took[i / 64] & (1ull << (i % 64))))
				fm_ctrl_return_grant(&s->sx.ctrl, 1);
		} else if (!(__atomic_load_n(&m->flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT)) {
			if (!fm_ctrl_take_grant(&s->sx.ctrl)) {
				status[i] = FM_E_FULL;
				continue;
			}
			slot_filled(sm, p);
		}
		/*
		 * Data and checksum first, then the flag with release order: a
		 * reader that acquires FM_SHM_PRESENT sees both. The store is in
		 * the memfd's page cache when this returns, so the pager may drop
		 * its own copy as soon as we come back. Bytes put in the slot
		 * already (transport.h) are only summed.
		 */
		if (data[i] != sm->data + p * FM_PAGE_SIZE)
			memcpy(sm->data + p * FM_PAGE_SIZE, data[i], FM_PAGE_SIZE);
		m->crc = fm_crc32c(sm->data + p * FM_PAGE_SIZE, FM_PAGE_SIZE);
		summed(s, sm, p);
		__atomic_store_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
		status[i] = FM_OK;
	}
	return 0;
}

/*
 * The same copy as memd's, done here in the shared store, slot to slot with
 * no bounce. A destination page new to the store takes a page of the grant,
 * as a write does.
 */
static int shm_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		    const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct shm *s = to_shm(c->x);
	struct space_map *ss, *ds;

	/* A copy makes pages that only memd holds: the same rule as a write. */
	if (!fm_ctrl_alive(&s->sx.ctrl))
		return -EPIPE;
	ss = find_space(s, src);
	ds = find_space(s, dst);
	if (!ss || !ds)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++) {
		uint64_t sp = spages[i], dp = dpages[i];
		struct fm_shm_meta *m;
		uint32_t crc;

		if (sp >= ss->npages || dp >= ds->npages) {
			status[i] = FM_E_RANGE;
			continue;
		}
		if (!(__atomic_load_n(&ss->meta[sp].flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT)) {
			status[i] = FM_E_ABSENT;
			continue;
		}
		status[i] = FM_OK;
		if (ss == ds && sp == dp)
			continue;
		m = &ds->meta[dp];
		if (!slot_present(s, ds, dp)) {
			int rc, took = takes_grant(s, ds, dp);

			if (took && !fm_ctrl_take_grant(&s->sx.ctrl)) {
				status[i] = FM_E_FULL;
				continue;
			}
			rc = took && s->memd_allocates ? memd_allocate(s, to_chan(c), ds, &dp, 1) : 0;
			if (rc) {
				fm_ctrl_return_grant(&s->sx.ctrl, 1);
				if (rc != -ENOSPC)
					return rc;
				status[i] = FM_E_FULL;
				continue;
			}
			if (slot_filled(ds, dp) && took && s->memd_allocates)
				fm_ctrl_return_grant(&s->sx.ctrl, 1);
		}
		/* The acquire above published the source's crc and bytes; the flag goes last, as in a write. */
		crc = ss->meta[sp].crc;
		memcpy(ds->data + dp * FM_PAGE_SIZE, ss->data + sp * FM_PAGE_SIZE, FM_PAGE_SIZE);
		m->crc = crc;
		/* The source's bytes, not checked here: a mark from earlier in this pause must not stand. */
		__atomic_store_n(&ds->checked[dp], 0, __ATOMIC_RELAXED);
		__atomic_store_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	}
	return 0;
}

/* The ranges' pages leave memd; punch: their memory goes back to the system now. */
static int forget_ranges(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n, int punch)
{
	struct shm *s = to_shm(c->x);
	struct space_map *sm = find_space(s, space);

	if (!sm)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++) {
		uint64_t freed = 0;

		if (r[i].first >= sm->npages || r[i].npages > sm->npages - r[i].first)
			return -ERANGE;
		for (uint64_t p = r[i].first; p < r[i].first + r[i].npages; p++) {
			int was = 0, had;

			if (!s->memd_allocates || __atomic_load_n(&sm->mem[p], __ATOMIC_RELAXED))
				was = !!(__atomic_exchange_n(&sm->meta[p].flags, 0, __ATOMIC_ACQ_REL) & FM_SHM_PRESENT);
			had = punch ? slot_punched(sm, p, was) : __atomic_load_n(&sm->mem[p], __ATOMIC_RELAXED);

			if (!punch && was && had)
				__atomic_fetch_add(&sm->kept, 1, __ATOMIC_RELAXED);
			/* Counting slots with memory, the grant goes back with the memory (takes_grant). */
			if (s->memd_allocates)
				freed += (uint64_t)(punch ? (had || was) : (was && !had));
			else
				freed += (uint64_t)was;
		}
		if (punch)
			fallocate(sm->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  (off_t)(r[i].first * FM_PAGE_SIZE), (off_t)(r[i].npages * FM_PAGE_SIZE));
		fm_ctrl_return_grant(&s->sx.ctrl, freed);
	}
	return 0;
}

static int shm_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	return forget_ranges(c, space, r, n, 1);
}

/*
 * The memory stays in the store: a later write to the slot reuses it instead
 * of faulting a fresh page into the memfd (transport.h, fm_chan_forget).
 */
static int shm_forget(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	return forget_ranges(c, space, r, n, 0);
}

static void punch(struct shm *s, struct space_map *sm, uint64_t first, uint64_t end)
{
	uint64_t had = 0;

	for (uint64_t p = first; p < end; p++)
		had += (uint64_t)slot_punched(sm, p, 0);
	if (end > first)
		fallocate(sm->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(first * FM_PAGE_SIZE),
			  (off_t)((end - first) * FM_PAGE_SIZE));
	if (s->memd_allocates)
		fm_ctrl_return_grant(&s->sx.ctrl, had);
}

/*
 * The caller holds the pages, so no write to these slots races the punch. A
 * slot memd holds keeps its memory: the page was written to memd again
 * after it was kept, and the forget that kills that copy is still on its way
 * (the caller batches forgets); that forget keeps the slot again.
 */
static int shm_release(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	struct shm *s = to_shm(c->x);
	struct space_map *sm = find_space(s, space);

	if (!sm)
		return -ENOENT;
	for (unsigned i = 0; i < n; i++) {
		uint64_t run, end = r[i].first + r[i].npages;
		if (r[i].first >= sm->npages || r[i].npages > sm->npages - r[i].first)
			return -ERANGE;
		run = r[i].first;
		/* Runs of slots with memory and no page: a hole is punched only where there is something. */
		for (uint64_t p = r[i].first; p < end; p++)
			if (!__atomic_load_n(&sm->mem[p], __ATOMIC_RELAXED) ||
			    (__atomic_load_n(&sm->meta[p].flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT)) {
				punch(s, sm, run, p);
				run = p + 1;
			}
		punch(s, sm, run, end);
	}
	return 0;
}

/*
 * A page new to the store is as a write: memd must still be there. The poll
 * is a system call, and a collector's call opens hundreds of new pages: one
 * poll a millisecond answers for the pages opened meanwhile (a memd that died
 * within it is found by the next poll, or the next write's).
 */
#define ALIVE_POLL_NS 1000000ull

static int alive_lately(struct shm *s)
{
	uint64_t now = fm_now_ns(), last = __atomic_load_n(&s->alive_ns, __ATOMIC_RELAXED);

	if (now - last < ALIVE_POLL_NS)
		return !atomic_load(&s->sx.ctrl.dead); /* given up on (a hangup): at once */
	if (!fm_ctrl_alive(&s->sx.ctrl))
		return 0;
	__atomic_store_n(&s->alive_ns, now, __ATOMIC_RELAXED);
	return 1;
}

/*
 * In place: the caller holds the page, and memd never touches a mapped
 * space's pages, so nobody else writes the slot meanwhile. A page made here
 * stays unpublished (no FM_SHM_PRESENT) until it is sealed. A page the
 * caller overwrites whole is neither checked nor zeroed: its old bytes are
 * dead, and reading a cold page for its checksum or clearing it was a third
 * of what opening cost a collector's promotion.
 */
static int shm_page_open(struct fm_chan *c, uint32_t space, uint64_t page, unsigned flags, uint8_t **bytes)
{
	struct shm *s = to_shm(c->x);
	struct space_map *sm;
	uint8_t *d;
	int took;

	sm = find_space(s, space);
	if (!sm)
		return -ENOENT;
	if (page >= sm->npages)
		return -ERANGE;
	d = sm->data + page * FM_PAGE_SIZE;
	if (slot_present(s, sm, page)) {
		if (!(flags & FM_PAGE_OVERWRITE) && !intact(s, sm, page))
			return -EIO;
	} else {
		if (!(flags & FM_PAGE_CREATE))
			return -ENOENT;
		if (!alive_lately(s))
			return -EPIPE;
		took = takes_grant(s, sm, page);
		if (took && !fm_ctrl_take_grant(&s->sx.ctrl))
			return -ENOSPC;
		if (took && s->memd_allocates) {
			int rc = memd_allocate(s, to_chan(c), sm, &page, 1);

			if (rc) {
				fm_ctrl_return_grant(&s->sx.ctrl, 1);
				return rc == -ENOSPC ? rc : -EPIPE;
			}
		}
		if (slot_filled(sm, page) && took && s->memd_allocates)
			fm_ctrl_return_grant(&s->sx.ctrl, 1);
		if (!(flags & FM_PAGE_OVERWRITE))
			memset(d, 0, FM_PAGE_SIZE);
	}
	*bytes = d;
	return 0;
}

static int shm_page_seal(struct fm_chan *c, uint32_t space, uint64_t page)
{
	struct shm *s = to_shm(c->x);
	struct space_map *sm = find_space(s, space);
	struct fm_shm_meta *m;

	if (!sm)
		return -ENOENT;
	if (page >= sm->npages)
		return -ERANGE;
	m = &sm->meta[page];
	/* As a write: checksum first, then the flag with release order. */
	m->crc = fm_crc32c(sm->data + page * FM_PAGE_SIZE, FM_PAGE_SIZE);
	summed(s, sm, page);
	__atomic_store_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	return 0;
}

static uint64_t shm_kept_pages(struct fm_xport *x)
{
	struct shm *s = to_shm(x);
	unsigned n = __atomic_load_n(&s->nspaces, __ATOMIC_ACQUIRE);
	uint64_t kept = 0;

	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < n; i++)
		if (s->spaces[i].data)
			kept += __atomic_load_n(&s->spaces[i].kept, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
	return kept;
}

/* A pause's checks last until it ends: the next one starts with every slot unchecked. */
static void shm_pause(struct fm_xport *x, int begin)
{
	struct shm *s = to_shm(x);

	pthread_mutex_lock(&s->lock);
	if (begin && s->pauses++ == 0) {
		if (++s->last_pause_id == 0) {
			/* 2^32 pauses on, ids come round again: no old mark may pass for this pause's. */
			for (unsigned i = 0; i < s->nspaces; i++)
				if (s->spaces[i].checked)
					memset(s->spaces[i].checked, 0, s->spaces[i].npages * sizeof(uint32_t));
			s->last_pause_id = 1;
		}
		__atomic_store_n(&s->pause_id, s->last_pause_id, __ATOMIC_RELAXED);
	} else if (!begin && s->pauses && --s->pauses == 0) {
		__atomic_store_n(&s->pause_id, 0, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&s->lock);
}

static const struct fm_xport_ops shm_ops = {
	.space_open = shm_space_open,
	.space_close = shm_space_close,
	.stats = fm_session_xport_stats,
	.alive = fm_session_xport_alive,
	.hangup = fm_session_xport_hangup,
	.close = shm_close,
	.chan_open = shm_chan_open,
	.chan_close = shm_chan_close,
	.read = shm_read,
	.write = shm_write,
	.copy = shm_copy,
	.discard = shm_discard,
	.forget = shm_forget,
	.release = shm_release,
	.kept_pages = shm_kept_pages,
	.pause = shm_pause,
	.page_open = shm_page_open,
	.page_seal = shm_page_seal,
};

/* The memory cgroup of process pid (fm_memory_cgroup). 0, or -1 when it cannot be read. */
static int memory_cgroup(pid_t pid, char *out, size_t cap)
{
	char path[64], buf[2048];

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	return fm_read_file(path, buf, sizeof(buf)) < 0 ? -1 : fm_memory_cgroup(buf, out, cap);
}

/*
 * Is memd (the peer of the Unix socket fd) in another memory cgroup than
 * this process? When that cannot be told (another pid namespace, no /proc),
 * say yes: the cost is a request a batch, where the other answer would let
 * this process's cgroup pay for memd's store.
 */
static int memd_in_other_cgroup(int fd)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	char mine[256], its[256];

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) || cr.pid <= 0)
		return 1;
	if (memory_cgroup(getpid(), mine, sizeof(mine)) || memory_cgroup(cr.pid, its, sizeof(its)))
		return 1;
	return strcmp(mine, its) != 0;
}

int fm_shm_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	struct fm_session_xport *sx;
	struct shm *s;
	int rc = fm_session_xport_new(sizeof(*s), cfg, cfg->addr, FM_XPORT_SHM, &shm_ops, &sx, err, errlen);

	if (rc)
		return rc;
	s = (struct shm *)sx;
	if (!sx->ctrl.conn.is_unix || !(sx->ctrl.conn.server_flags & FM_HELLO_F_SHM)) {
		fm_errmsg(err, errlen, "memd at %s cannot share its store (shm needs a Unix socket to a memd on this host)",
			  cfg->addr);
		fm_session_xport_free(sx);
		return -EOPNOTSUPP;
	}
	pthread_mutex_init(&s->lock, NULL);
	if (memd_in_other_cgroup(sx->ctrl.conn.fd)) {
		if (sx->ctrl.conn.server_flags & FM_HELLO_F_ALLOC) {
			s->memd_allocates = 1;
			fm_info("memd at %s is in another memory cgroup: it allocates its store's pages", cfg->addr);
		} else {
			fm_warn("memd at %s is in another memory cgroup and predates SHM_ALLOC: this process's "
				"cgroup is charged for the pages it writes to memd's store (--transport stream is not)",
				cfg->addr);
		}
	}
	/* Slot to slot in the shared store: no request to memd, so no server that predates COPY. */
	sx->base.can_copy = 1;
	*out = &sx->base;
	return 0;
}
