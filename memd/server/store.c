// SPDX-License-Identifier: Apache-2.0
/*
 * memd's page store: sessions, spaces and capacity accounting.
 *
 * Each space is one sealed memfd laid out as protocol.h describes (page
 * data, then one fm_shm_meta per page) and mapped MAP_SHARED here. The
 * same bytes may be mapped by a Unix-socket client (SHM_MAP), so the meta
 * flags are the only truth about which pages are present, and they are
 * published with release stores after data and crc.
 *
 * Locking: st->lock guards the session list, every session's space list,
 * reference counts and the accounting figures; it is held only briefly and
 * never while taking a space lock. A space's rwlock is held shared by the
 * page operations (which touch pages with atomics) and exclusively by the
 * rare state changes (close, the switch to shared-memory accounting).
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <numaif.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/falloc.h>

#include "fm_util.h"
#include "swapva.h"

struct memd_space {
	struct memd_space *next;       /* session's list, under st->lock */
	struct memd_session *sess;
	uint32_t id;
	unsigned refs;                 /* under st->lock */
	pthread_rwlock_t rw;
	bool dead;                     /* closed: no more page operations */
	bool mapped;                   /* handed out by SHM_MAP: grant accounting */
	bool idmap;                    /* map is from /dev/swapva; fd is -1 */
	int fd;
	uint8_t *map;
	uint64_t map_len;
	uint64_t npages;
	uint64_t meta_offset;
	struct fm_shm_meta *meta;
	/*
	 * One bit per meta page (MEMD_META_PER_PAGE pages) known to exist in
	 * the memfd. Touching a shmem hole through a shared mapping allocates
	 * a page, so a READ of absent pages must not touch meta that memd
	 * never wrote: this anonymous private bitmap reads as zeros for free.
	 */
	uint64_t *known;
	size_t known_len;
	uint64_t present;              /* pages counted against capacity (atomic) */
	/*
	 * RDMA_MAP: the space is registered chunk by chunk, each chunk at its
	 * first RDMA_REG (FM_HELLO_F_RDMA_REG); the array and the chunks change
	 * under rw held for writing. rdma_pinned: the pages registered, data
	 * and meta, taken from capacity with reserve().
	 */
	struct memd_rdma_chunk *rdma_chunks;
	uint64_t rdma_nchunks, rdma_chunk_pages, rdma_pinned;
};

struct memd_rdma_chunk {
	void *data_mr, *meta_mr;       /* both or neither */
	uint32_t data_rkey, meta_rkey;
};

struct memd_session {
	struct memd_session *next;
	uint64_t id;
	uint8_t key[FM_SESSION_KEY_LEN];
	unsigned conns;
	struct memd_space *spaces;
	unsigned nspaces;
	uint32_t next_space_id;
	uint64_t pages;                /* pages of unmapped spaces */
	uint64_t grant;                /* QUOTA grant */
	uint64_t alloc_bound;          /* >= data pages SHM_ALLOC gave its memfds (under alloc_lock) */
	pthread_mutex_t alloc_lock;    /* one SHM_ALLOC at a time, from its count of room to its fallocate */
	void *rdma_pd;                 /* its RDMA protection domain (server_rdma.c) */
};

void **memd_session_rdma_pd(struct memd_session *s)
{
	return &s->rdma_pd;
}

static inline uint64_t min3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t m = a < b ? a : b;
	return m < c ? m : c;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
	return (v + to - 1) / to * to;
}

/* Constant time: a session key is a credential. */
static bool key_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;
	for (unsigned i = 0; i < FM_SESSION_KEY_LEN; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

int memd_store_init(struct memd_store *st, uint64_t capacity_pages,
		    uint64_t session_quota_pages)
{
	memset(st, 0, sizeof(*st));
	st->capacity = capacity_pages;
	st->session_quota = session_quota_pages;
	st->va_budget = MEMD_VA_BUDGET;
	st->numa_node = -1;
	st->idmap_fd = -1;
	return -pthread_mutex_init(&st->lock, NULL);
}

int memd_store_idmap(struct memd_store *st, char *msg, size_t msglen)
{
	struct swapva_info in;
	struct swapva_idmap_query q = { 0 };
	void *p;
	int fd, e;

	fd = open(SWAPVA_DEVICE, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		e = errno;
		snprintf(msg, msglen, e == ENOENT ?
			 "--idmap: %s does not exist: load the kmod-swapva module (insmod swapva.ko)" :
			 "--idmap: cannot open %s: %s", SWAPVA_DEVICE, strerror(e));
		return -e;
	}
	if (ioctl(fd, SWAPVA_IOC_INFO, &in) || in.abi_version != SWAPVA_ABI_VERSION ||
	    !(in.features & SWAPVA_FEAT_IDMAP)) {
		snprintf(msg, msglen, "--idmap: the module behind %s has no identity-mapped allocation "
			 "(ABI %u, features %#llx)", SWAPVA_DEVICE, in.abi_version,
			 (unsigned long long)in.features);
		close(fd);
		return -EOPNOTSUPP;
	}
	/* One page now, so that a missing capability is an error at start, not per space. */
	p = mmap(NULL, FM_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, SWAPVA_IDMAP_FALLBACK);
	if (p == MAP_FAILED) {
		e = errno;
		snprintf(msg, msglen, e == EPERM ?
			 "--idmap: identity-mapped memory needs CAP_SYS_ADMIN (it reveals physical "
			 "addresses): run memd as root or give it that capability" :
			 "--idmap: cannot map memory from %s: %s", SWAPVA_DEVICE, strerror(e));
		close(fd);
		return -e;
	}
	q.addr = (uint64_t)(uintptr_t)p;
	q.len = FM_PAGE_SIZE;
	if (ioctl(fd, SWAPVA_IOC_IDMAP_QUERY, &q) == 0)
		fm_info("--idmap: %s ready; a probe page is %sidentity-mapped", SWAPVA_DEVICE,
			q.identity ? "" : "NOT ");
	munmap(p, FM_PAGE_SIZE);
	st->idmap_fd = fd;
	/* The memory is allocated whole: spaces may map no more than the capacity. */
	st->va_budget = st->capacity * FM_PAGE_SIZE;
	return 0;
}

void memd_store_stats(struct memd_store *st, struct fm_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&st->lock);
	out->capacity_pages = st->capacity;
	out->used_pages = st->used;
	out->sessions = st->nsessions;
	out->spaces = st->nspaces;
	pthread_mutex_unlock(&st->lock);
	out->connections = __atomic_load_n(&st->connections, __ATOMIC_RELAXED);
	out->reads = __atomic_load_n(&st->reads, __ATOMIC_RELAXED);
	out->writes = __atomic_load_n(&st->writes, __ATOMIC_RELAXED);
	out->discards = __atomic_load_n(&st->discards, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&st->errors, __ATOMIC_RELAXED);
	out->full_rejects = __atomic_load_n(&st->full_rejects, __ATOMIC_RELAXED);
}

/* ---- accounting ------------------------------------------------------- */

/* Take up to want pages from capacity and the session quota; returns how many. */
static uint64_t reserve(struct memd_store *st, struct memd_session *s, uint64_t want)
{
	uint64_t k, avail, qavail, held;

	if (!want)
		return 0;
	pthread_mutex_lock(&st->lock);
	avail = st->capacity > st->used ? st->capacity - st->used : 0;
	held = s->pages + s->grant;
	qavail = st->session_quota > held ? st->session_quota - held : 0;
	k = min3(want, avail, qavail);
	st->used += k;
	s->pages += k;
	pthread_mutex_unlock(&st->lock);
	return k;
}

static void unreserve(struct memd_store *st, struct memd_session *s, uint64_t n)
{
	if (!n)
		return;
	pthread_mutex_lock(&st->lock);
	st->used -= n;
	s->pages -= n;
	pthread_mutex_unlock(&st->lock);
}

uint64_t memd_quota(struct memd_store *st, struct memd_session *s, int64_t delta)
{
	uint64_t grant;

	pthread_mutex_lock(&st->lock);
	if (delta > 0) {
		uint64_t avail = st->capacity > st->used ? st->capacity - st->used : 0;
		uint64_t held = s->pages + s->grant;
		uint64_t qavail = st->session_quota > held ? st->session_quota - held : 0;
		uint64_t k = min3((uint64_t)delta, avail, qavail);

		s->grant += k;
		st->used += k;
	} else if (delta < 0) {
		/* 0 - (uint64_t)delta is |delta| even for INT64_MIN. */
		uint64_t rel = 0 - (uint64_t)delta;

		if (rel > s->grant)
			rel = s->grant;
		s->grant -= rel;
		st->used -= rel;
	}
	grant = s->grant;
	pthread_mutex_unlock(&st->lock);
	return grant;
}

/* ---- sessions --------------------------------------------------------- */

int memd_session_new(struct memd_store *st, struct memd_session **out,
		     uint64_t *id, uint8_t key[FM_SESSION_KEY_LEN])
{
	struct memd_session *s, *o;
	int ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	ret = fm_random(s->key, sizeof(s->key));
	if (ret)
		goto fail;
	s->conns = 1;
	pthread_mutex_init(&s->alloc_lock, NULL);
	pthread_mutex_lock(&st->lock);
	/* Ids are random so that they cannot be guessed; keep them unique and non-zero. */
	for (;;) {
		ret = fm_random(&s->id, sizeof(s->id));
		if (ret) {
			pthread_mutex_unlock(&st->lock);
			goto fail;
		}
		for (o = st->sessions; o && s->id; o = o->next)
			if (o->id == s->id)
				break;
		if (s->id && !o)
			break;
	}
	s->next = st->sessions;
	st->sessions = s;
	st->nsessions++;
	pthread_mutex_unlock(&st->lock);
	*id = s->id;
	memcpy(key, s->key, FM_SESSION_KEY_LEN);
	*out = s;
	return 0;
fail:
	pthread_mutex_destroy(&s->alloc_lock);
	free(s);
	return ret;
}

int memd_session_join(struct memd_store *st, uint64_t id,
		      const uint8_t key[FM_SESSION_KEY_LEN], struct memd_session **out)
{
	struct memd_session *s;
	int ret = -EACCES;

	pthread_mutex_lock(&st->lock);
	for (s = st->sessions; s; s = s->next) {
		if (s->id != id)
			continue;
		if (key_equal(s->key, key)) {
			s->conns++;
			*out = s;
			ret = 0;
		}
		break;
	}
	pthread_mutex_unlock(&st->lock);
	return ret;
}

/* ---- spaces ----------------------------------------------------------- */

static void space_destroy(struct memd_space *sp)
{
	if (sp->map && sp->map != MAP_FAILED)
		munmap(sp->map, sp->map_len);
	if (sp->known && (void *)sp->known != MAP_FAILED)
		munmap(sp->known, sp->known_len);
	if (sp->fd >= 0)
		close(sp->fd);
	pthread_rwlock_destroy(&sp->rw);
	free(sp);
}

/* Mark a space closed and give its pages back; waits for running operations. */
static void space_kill(struct memd_store *st, struct memd_space *sp)
{
	uint64_t n = 0;

	pthread_rwlock_wrlock(&sp->rw);
	if (!sp->dead) {
		sp->dead = true;
		if (!sp->mapped) {
			n = sp->present;
			sp->present = 0;
		}
	}
	/* Unpinned now, not when the last reference goes: a QP still using the rkey fails. */
	for (uint64_t c = 0; sp->rdma_chunks && c < sp->rdma_nchunks; c++) {
		if (!sp->rdma_chunks[c].data_mr)
			continue;
		st->rdma->dereg(sp->rdma_chunks[c].data_mr);
		st->rdma->dereg(sp->rdma_chunks[c].meta_mr);
	}
	free(sp->rdma_chunks);
	sp->rdma_chunks = NULL;
	n += sp->rdma_pinned;
	sp->rdma_pinned = 0;
	pthread_rwlock_unlock(&sp->rw);
	unreserve(st, sp->sess, n);
}

void memd_space_put(struct memd_store *st, struct memd_space *sp)
{
	bool last;

	if (!sp)
		return;
	pthread_mutex_lock(&st->lock);
	last = --sp->refs == 0;
	if (last)
		st->va_used -= sp->map_len;
	pthread_mutex_unlock(&st->lock);
	if (last)
		space_destroy(sp);
}

void memd_session_put(struct memd_store *st, struct memd_session *s)
{
	struct memd_session **pp;
	struct memd_space *sp, *next;

	if (!s)
		return;
	pthread_mutex_lock(&st->lock);
	if (--s->conns > 0) {
		pthread_mutex_unlock(&st->lock);
		return;
	}
	/* Unlinked under the lock, so no JOIN can find it from now on. */
	for (pp = &st->sessions; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	st->nsessions--;
	st->nspaces -= s->nspaces;
	sp = s->spaces;
	s->spaces = NULL;
	s->nspaces = 0;
	pthread_mutex_unlock(&st->lock);

	for (; sp; sp = next) {
		next = sp->next;
		space_kill(st, sp);
		memd_space_put(st, sp);
	}
	pthread_mutex_lock(&st->lock);
	st->used -= s->grant;
	pthread_mutex_unlock(&st->lock);
	/* Its QPs held references, so they are gone; its regions went with its spaces. */
	if (s->rdma_pd)
		st->rdma->pd_free(s->rdma_pd);
	fm_debug("session %016llx ended", (unsigned long long)s->id);
	pthread_mutex_destroy(&s->alloc_lock);
	free(s);
}

void memd_store_fini(struct memd_store *st)
{
	/* Connections are gone; drop whatever sessions they left. */
	while (st->sessions) {
		struct memd_session *s = st->sessions;

		s->conns = 1;
		memd_session_put(st, s);
	}
	pthread_mutex_destroy(&st->lock);
}

/*
 * Identity-mapped (VA == PA) memory for a space: zeroed and allocated whole
 * by the module, so every meta page exists (meta_exists) and nothing is ever
 * punched. The module falls back to an ordinary address when PA..PA+len is
 * taken here; the log says how much of the space got the identity.
 */
static int space_map_idmap(struct memd_store *st, struct memd_space *sp)
{
	struct swapva_idmap_query q = { 0 };

	sp->map = mmap(NULL, sp->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, st->idmap_fd,
		       SWAPVA_IDMAP_FALLBACK);
	if (sp->map == MAP_FAILED) {
		int e = errno;

		fm_warn("--idmap: cannot map %llu bytes from %s: %s",
			(unsigned long long)sp->map_len, SWAPVA_DEVICE, strerror(e));
		return -e;
	}
	sp->idmap = true;
	q.addr = (uint64_t)(uintptr_t)sp->map;
	q.len = sp->map_len;
	if (ioctl(st->idmap_fd, SWAPVA_IOC_IDMAP_QUERY, &q) == 0)
		fm_info("--idmap: a space of %llu bytes at %p: %llu of %llu pages identity-mapped",
			(unsigned long long)sp->map_len, (void *)sp->map,
			(unsigned long long)q.identity, (unsigned long long)q.pages);
	return 0;
}

int memd_space_open(struct memd_store *st, struct memd_session *s, uint64_t npages,
		    uint32_t *id)
{
	struct memd_space *sp;
	uint64_t nmeta, meta_len, map_len;
	int ret;

	if (npages == 0 || npages > FM_MAX_SPACE_PAGES)
		return -ERANGE;
	nmeta = (npages + MEMD_META_PER_PAGE - 1) / MEMD_META_PER_PAGE;
	meta_len = nmeta * FM_PAGE_SIZE;
	map_len = npages * FM_PAGE_SIZE + meta_len;

	/* Reserve the address space first so that a failure leaves nothing to undo. */
	pthread_mutex_lock(&st->lock);
	if (s->nspaces >= MEMD_MAX_SPACES_PER_SESSION) {
		pthread_mutex_unlock(&st->lock);
		return -EMFILE;
	}
	if (map_len > st->va_budget - st->va_used) {
		pthread_mutex_unlock(&st->lock);
		return -ENOMEM;
	}
	st->va_used += map_len;
	pthread_mutex_unlock(&st->lock);

	sp = calloc(1, sizeof(*sp));
	if (!sp) {
		ret = -ENOMEM;
		goto unbudget;
	}
	sp->fd = -1;
	sp->sess = s;
	sp->refs = 1;
	sp->npages = npages;
	sp->meta_offset = npages * FM_PAGE_SIZE;
	sp->map_len = map_len;
	ret = -pthread_rwlock_init(&sp->rw, NULL);
	if (ret) {
		free(sp);
		goto unbudget;
	}

	if (st->idmap_fd >= 0) {
		ret = space_map_idmap(st, sp);
		if (ret)
			goto destroy;
		goto mapped;
	}
	/*
	 * Sealed against shrinking: a client holding the fd could otherwise
	 * truncate it and make memd's own accesses fault with SIGBUS.
	 */
	sp->fd = memfd_create("farmem-space", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (sp->fd < 0) {
		ret = -errno;
		goto destroy;
	}
	if (ftruncate(sp->fd, (off_t)map_len) < 0 ||
	    fcntl(sp->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		ret = -errno;
		goto destroy;
	}
	sp->map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
		       sp->fd, 0);
	if (sp->map == MAP_FAILED) {
		ret = -errno;
		goto destroy;
	}
	if (st->numa_node >= 0) {
		/*
		 * On shmem, mbind sets the object's shared policy: it places the
		 * pages a one-sided client allocates by writing too, not only ours.
		 */
		unsigned long mask[1024 / (8 * sizeof(unsigned long))] = { 0 };
		mask[st->numa_node / (8 * sizeof(unsigned long))] |= 1ul << (st->numa_node % (8 * sizeof(unsigned long)));
		if (mbind(sp->map, map_len, MPOL_BIND, mask, 1024, 0) < 0) {
			ret = -errno;
			fm_err("cannot bind a space to NUMA node %d: %s", st->numa_node, strerror(errno));
			goto destroy;
		}
	}
mapped:
	sp->meta = (struct fm_shm_meta *)(sp->map + sp->meta_offset);
	sp->known_len = round_up((nmeta + 63) / 64 * sizeof(uint64_t), FM_PAGE_SIZE);
	sp->known = mmap(NULL, sp->known_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (sp->known == MAP_FAILED) {
		ret = -errno;
		goto destroy;
	}

	pthread_mutex_lock(&st->lock);
	if (s->nspaces >= MEMD_MAX_SPACES_PER_SESSION || s->next_space_id == UINT32_MAX) {
		pthread_mutex_unlock(&st->lock);
		ret = -EMFILE;
		goto destroy;
	}
	/* Ids are never reused within a session: a stale id cannot hit a new space. */
	sp->id = ++s->next_space_id;
	sp->next = s->spaces;
	s->spaces = sp;
	s->nspaces++;
	st->nspaces++;
	pthread_mutex_unlock(&st->lock);
	*id = sp->id;
	fm_debug("space %u opened: %llu pages", sp->id, (unsigned long long)npages);
	return 0;

destroy:
	/* space_destroy does not touch the budget; give it back below. */
	space_destroy(sp);
unbudget:
	pthread_mutex_lock(&st->lock);
	st->va_used -= map_len;
	pthread_mutex_unlock(&st->lock);
	return ret;
}

int memd_space_close(struct memd_store *st, struct memd_session *s, uint32_t id)
{
	struct memd_space **pp, *sp = NULL;

	pthread_mutex_lock(&st->lock);
	for (pp = &s->spaces; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == id) {
			sp = *pp;
			*pp = sp->next;
			s->nspaces--;
			st->nspaces--;
			break;
		}
	}
	pthread_mutex_unlock(&st->lock);
	if (!sp)
		return -ENOENT;
	space_kill(st, sp);
	memd_space_put(st, sp);
	return 0;
}

struct memd_space *memd_space_get(struct memd_store *st, struct memd_session *s,
				  uint32_t id)
{
	struct memd_space *sp;

	pthread_mutex_lock(&st->lock);
	for (sp = s->spaces; sp; sp = sp->next) {
		if (sp->id == id) {
			sp->refs++;
			break;
		}
	}
	pthread_mutex_unlock(&st->lock);
	return sp;
}

/* ---- pages ------------------------------------------------------------ */

static bool known_test(struct memd_space *sp, uint64_t mp)
{
	return __atomic_load_n(&sp->known[mp / 64], __ATOMIC_RELAXED) & (1ull << (mp % 64));
}

static void known_set(struct memd_space *sp, uint64_t mp)
{
	if (!known_test(sp, mp))
		__atomic_fetch_or(&sp->known[mp / 64], 1ull << (mp % 64), __ATOMIC_RELAXED);
}

static void known_clear(struct memd_space *sp, uint64_t mp)
{
	__atomic_fetch_and(&sp->known[mp / 64], ~(1ull << (mp % 64)), __ATOMIC_RELAXED);
}

/*
 * Does meta page mp exist in the memfd, so that reading it allocates
 * nothing? memd knows every page it wrote itself; in a mapped space the
 * client may have written more, which lseek(SEEK_DATA) reveals (it also
 * counts swapped-out pages, unlike mincore).
 */
static bool meta_exists(struct memd_space *sp, uint64_t mp)
{
	off_t want, got;

	if (sp->idmap || known_test(sp, mp))
		return true;
	if (!sp->mapped)
		return false;
	want = (off_t)(sp->meta_offset + mp * FM_PAGE_SIZE);
	got = lseek(sp->fd, want, SEEK_DATA);
	if (got != want)
		return false;
	known_set(sp, mp);
	return true;
}

static inline struct fm_shm_meta *meta_of(struct memd_space *sp, uint64_t page)
{
	return &sp->meta[page];
}

/*
 * In an RDMA space memd writes a page only in a chunk registered (pinned,
 * counted against capacity): anywhere else it would allocate memory no one
 * accounted for. Caller holds rw.
 */
static bool rdma_unpinned(const struct memd_space *sp, uint64_t page)
{
	return sp->rdma_chunks && !sp->rdma_chunks[page / sp->rdma_chunk_pages].data_mr;
}

static bool page_present(struct memd_space *sp, uint64_t page)
{
	if (!meta_exists(sp, page / MEMD_META_PER_PAGE))
		return false;
	return __atomic_load_n(&meta_of(sp, page)->flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT;
}

int memd_space_read(struct memd_store *st, struct memd_space *sp,
		    const uint8_t *pages, uint32_t n,
		    struct fm_page_status *status, uint8_t *data)
{
	uint64_t ok = 0;

	pthread_rwlock_rdlock(&sp->rw);
	if (sp->dead) {
		pthread_rwlock_unlock(&sp->rw);
		return -ENOENT;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *dst = data + (size_t)i * FM_PAGE_SIZE;
		struct fm_shm_meta *m;
		uint64_t page;

		memcpy(&page, pages + (size_t)i * sizeof(uint64_t), sizeof(page));
		status[i].crc = 0;
		if (page >= sp->npages) {
			status[i].status = FM_E_RANGE;
		} else if (!page_present(sp, page)) {
			status[i].status = FM_E_ABSENT;
		} else {
			/* page_present acquired the flags: crc and data are published. */
			m = meta_of(sp, page);
			status[i].status = FM_OK;
			status[i].crc = __atomic_load_n(&m->crc, __ATOMIC_RELAXED);
			memcpy(dst, sp->map + page * FM_PAGE_SIZE, FM_PAGE_SIZE);
			ok++;
			continue;
		}
		memset(dst, 0, FM_PAGE_SIZE);
	}
	pthread_rwlock_unlock(&sp->rw);
	__atomic_fetch_add(&st->reads, ok, __ATOMIC_RELAXED);
	return 0;
}

/*
 * A page's bytes are in place at m: publish it with its crc (a shared-memory
 * reader that sees PRESENT sees data and crc), and charge a page new to sp to
 * its session, from *held (reserved for the batch) or now. FM_E_FULL when the
 * page was present when checked but discarded by a concurrent request since,
 * and no room is left: it is taken back.
 */
static uint32_t publish(struct memd_store *st, struct memd_space *sp, struct fm_shm_meta *m,
			uint32_t crc, bool counted, uint64_t *held)
{
	uint32_t old;

	__atomic_store_n(&m->crc, crc, __ATOMIC_RELAXED);
	old = __atomic_exchange_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	if (!counted || (old & FM_SHM_PRESENT))
		return FM_OK;
	if (!*held && !reserve(st, sp->sess, 1)) {
		__atomic_store_n(&m->flags, 0, __ATOMIC_RELEASE);
		return FM_E_FULL;
	}
	if (*held)
		(*held)--;
	__atomic_fetch_add(&sp->present, 1, __ATOMIC_RELAXED);
	return FM_OK;
}

int memd_space_write(struct memd_store *st, struct memd_space *sp,
		     const struct fm_write_ent *ents, const uint8_t *data,
		     uint32_t n, uint8_t *status_out)
{
	uint32_t status[FM_MAX_BATCH];
	uint64_t want = 0, held, ok = 0, full = 0;
	bool counted;

	if (n > FM_MAX_BATCH)
		return -E2BIG;
	pthread_rwlock_rdlock(&sp->rw);
	if (sp->dead) {
		pthread_rwlock_unlock(&sp->rw);
		return -ENOENT;
	}
	counted = !sp->mapped;

	/* First pass: validate, and count the new pages to reserve in one go. */
	for (uint32_t i = 0; i < n; i++) {
		struct fm_write_ent e;

		memcpy(&e, &ents[i], sizeof(e));
		if (e.page >= sp->npages)
			status[i] = FM_E_RANGE;
		else if (fm_crc32c(data + (size_t)i * FM_PAGE_SIZE, FM_PAGE_SIZE) != e.crc)
			status[i] = FM_E_CRC;
		else if (rdma_unpinned(sp, e.page))
			status[i] = FM_E_FULL;
		else
			status[i] = FM_OK;
		if (status[i] == FM_E_FULL)
			full++;
		if (status[i] == FM_OK && counted && !page_present(sp, e.page))
			want++;
	}
	held = counted ? reserve(st, sp->sess, want) : 0;

	for (uint32_t i = 0; i < n; i++) {
		struct fm_write_ent e;
		struct fm_shm_meta *m;

		if (status[i] != FM_OK)
			continue;
		memcpy(&e, &ents[i], sizeof(e));
		if (counted && !held && !page_present(sp, e.page)) {
			/* The client keeps this page: memd or the session is full. */
			status[i] = FM_E_FULL;
			full++;
			continue;
		}
		m = meta_of(sp, e.page);
		known_set(sp, e.page / MEMD_META_PER_PAGE);
		memcpy(sp->map + e.page * FM_PAGE_SIZE, data + (size_t)i * FM_PAGE_SIZE,
		       FM_PAGE_SIZE);
		status[i] = publish(st, sp, m, e.crc, counted, &held);
		if (status[i] == FM_OK)
			ok++;
		else
			full++;
	}
	unreserve(st, sp->sess, held);
	pthread_rwlock_unlock(&sp->rw);
	/* The reply buffer may be unaligned. */
	memcpy(status_out, status, (size_t)n * sizeof(uint32_t));
	__atomic_fetch_add(&st->writes, ok, __ATOMIC_RELAXED);
	__atomic_fetch_add(&st->full_rejects, full, __ATOMIC_RELAXED);
	return 0;
}

int memd_space_copy(struct memd_store *st, struct memd_space *src, struct memd_space *dst,
		    const struct fm_copy_ent *ents, uint32_t n, uint8_t *status_out)
{
	uint32_t status[FM_MAX_BATCH];
	struct memd_space *lo = src, *hi = dst;
	uint64_t want = 0, held, ok = 0, full = 0;
	bool counted;

	if (n > FM_MAX_BATCH)
		return -E2BIG;
	/*
	 * Two spaces are locked in address order: with a writer queued on each
	 * (a SPACE_CLOSE), two COPYs taking them in opposite orders could wait
	 * on each other for ever.
	 */
	if ((uintptr_t)dst < (uintptr_t)src) {
		lo = dst;
		hi = src;
	}
	pthread_rwlock_rdlock(&lo->rw);
	if (hi != lo)
		pthread_rwlock_rdlock(&hi->rw);
	if (src->dead || dst->dead) {
		if (hi != lo)
			pthread_rwlock_unlock(&hi->rw);
		pthread_rwlock_unlock(&lo->rw);
		return -ENOENT;
	}
	counted = !dst->mapped;

	/* As WRITE: validate, and reserve room for the new destination pages in one go. */
	for (uint32_t i = 0; i < n; i++) {
		struct fm_copy_ent e;

		memcpy(&e, &ents[i], sizeof(e));
		status[i] = e.src_page >= src->npages || e.dst_page >= dst->npages ? FM_E_RANGE : FM_OK;
		if (status[i] == FM_OK && rdma_unpinned(dst, e.dst_page)) {
			status[i] = FM_E_FULL;
			full++;
		}
		if (status[i] == FM_OK && counted && page_present(src, e.src_page) &&
		    !page_present(dst, e.dst_page))
			want++;
	}
	held = counted ? reserve(st, dst->sess, want) : 0;

	for (uint32_t i = 0; i < n; i++) {
		struct fm_copy_ent e;
		struct fm_shm_meta *m;
		uint32_t crc;

		if (status[i] != FM_OK)
			continue;
		memcpy(&e, &ents[i], sizeof(e));
		/* In order: an earlier entry of this batch may have made this source present. */
		if (!page_present(src, e.src_page)) {
			status[i] = FM_E_ABSENT;
			continue;
		}
		if (src == dst && e.src_page == e.dst_page) {
			ok++;  /* the page onto itself: already there */
			continue;
		}
		/* Not reserved above when an earlier entry made this source present: reserve now. */
		if (counted && !held && !page_present(dst, e.dst_page) &&
		    !(held = reserve(st, dst->sess, 1))) {
			status[i] = FM_E_FULL;
			full++;
			continue;
		}
		/* page_present acquired the source's flags: its crc and data are published. */
		crc = __atomic_load_n(&meta_of(src, e.src_page)->crc, __ATOMIC_RELAXED);
		m = meta_of(dst, e.dst_page);
		known_set(dst, e.dst_page / MEMD_META_PER_PAGE);
		/*
		 * The stored crc travels with the bytes unchecked: a page damaged
		 * in memd's memory stays detectable where it is read, as with READ.
		 */
		memcpy(dst->map + e.dst_page * FM_PAGE_SIZE, src->map + e.src_page * FM_PAGE_SIZE,
		       FM_PAGE_SIZE);
		status[i] = publish(st, dst, m, crc, counted, &held);
		if (status[i] == FM_OK)
			ok++;
		else
			full++;
	}
	unreserve(st, dst->sess, held);
	if (hi != lo)
		pthread_rwlock_unlock(&hi->rw);
	pthread_rwlock_unlock(&lo->rw);
	memcpy(status_out, status, (size_t)n * sizeof(uint32_t));
	/* A copied page is a page stored, as by WRITE. */
	__atomic_fetch_add(&st->writes, ok, __ATOMIC_RELAXED);
	__atomic_fetch_add(&st->full_rejects, full, __ATOMIC_RELAXED);
	return 0;
}

/* ---- EDIT ------------------------------------------------------------ */

struct edit_page {
	uint64_t page;
	bool present;      /* at the start */
	bool written;
	bool available;    /* readable now: present, or written by an earlier entry */
};

struct edit_pages {
	struct edit_page p[FM_MAX_EDIT_PAGES];
	uint16_t slot[2 * FM_MAX_EDIT_PAGES];  /* page -> 1 + index, open addressing; 0 empty */
	unsigned n;
};

/* The request's entry for page, made if new; NULL past FM_MAX_EDIT_PAGES. */
static struct edit_page *edit_page(struct edit_pages *ep, struct memd_space *sp, uint64_t page)
{
	unsigned s = (unsigned)(page * 0x9e3779b97f4a7c15ull >> 55) & (2 * FM_MAX_EDIT_PAGES - 1);

	for (;; s = (s + 1) & (2 * FM_MAX_EDIT_PAGES - 1)) {
		unsigned k = ep->slot[s];
		if (!k)
			break;
		if (ep->p[k - 1].page == page)
			return &ep->p[k - 1];
	}
	if (ep->n == FM_MAX_EDIT_PAGES)
		return NULL;
	ep->p[ep->n] = (struct edit_page){ .page = page, .present = page_present(sp, page) };
	ep->p[ep->n].available = ep->p[ep->n].present;
	ep->slot[s] = (uint16_t)(++ep->n);
	return &ep->p[ep->n - 1];
}

/* One side of an entry: inside the space and inside one page. */
static bool edit_side_ok(const struct memd_space *sp, uint64_t off, uint32_t len)
{
	return off / FM_PAGE_SIZE < sp->npages && (off % FM_PAGE_SIZE) + len <= FM_PAGE_SIZE;
}

long memd_space_edit(struct memd_store *st, struct memd_space *sp, const struct fm_edit_ent *ents, uint32_t n,
		     const uint8_t *put, size_t put_len, uint8_t *get, size_t get_cap)
{
	struct edit_pages *ep = calloc(1, sizeof(*ep));
	uint64_t want = 0, held = 0, ok = 0;
	size_t puts = 0, gets = 0;
	long ret = 0;
	bool counted;

	if (!ep)
		return -FM_E_INTERNAL;
	pthread_rwlock_rdlock(&sp->rw);
	if (sp->dead) {
		ret = -FM_E_NOSPACE;
		goto out;
	}
	counted = !sp->mapped;

	/* Check every entry, in order, as if applying it: what it reads must be there by then. */
	for (uint32_t i = 0; i < n; i++) {
		struct fm_edit_ent e;
		struct edit_page *s = NULL, *d = NULL;

		memcpy(&e, &ents[i], sizeof(e));
		if (e.len == 0 || e.len > FM_PAGE_SIZE || e.reserved ||
		    (e.kind != FM_EDIT_MOVE && e.kind != FM_EDIT_PUT && e.kind != FM_EDIT_GET) ||
		    (e.kind != FM_EDIT_PUT && !edit_side_ok(sp, e.src, e.len)) ||
		    (e.kind != FM_EDIT_GET && !edit_side_ok(sp, e.dst, e.len))) {
			ret = -FM_E_RANGE;
			goto out;
		}
		if (e.kind == FM_EDIT_PUT)
			puts += e.len;
		if (e.kind == FM_EDIT_GET)
			gets += e.len;
		if ((e.kind != FM_EDIT_PUT && !(s = edit_page(ep, sp, e.src / FM_PAGE_SIZE))) ||
		    (e.kind != FM_EDIT_GET && !(d = edit_page(ep, sp, e.dst / FM_PAGE_SIZE)))) {
			ret = -FM_E_TOOBIG;
			goto out;
		}
		if (s && !s->available) {
			ret = -FM_E_ABSENT;
			goto out;
		}
		if (d) {
			d->written = d->available = true;
		}
	}
	if (puts != put_len) {
		ret = -FM_E_RANGE;
		goto out;
	}
	if (gets > get_cap) {
		ret = -FM_E_TOOBIG;
		goto out;
	}
	/* Every page it holds is checked before anything changes: a damaged page is never built on. */
	for (unsigned k = 0; k < ep->n; k++) {
		struct edit_page *p = &ep->p[k];
		if (p->present && fm_crc32c(sp->map + p->page * FM_PAGE_SIZE, FM_PAGE_SIZE) !=
				      __atomic_load_n(&meta_of(sp, p->page)->crc, __ATOMIC_RELAXED)) {
			ret = -FM_E_CRC;
			goto out;
		}
		if (p->written && !p->present)
			want++;
		if (p->written && rdma_unpinned(sp, p->page)) {
			ret = -FM_E_FULL;
			goto out;
		}
	}
	if (counted && want) {
		held = reserve(st, sp->sess, want);
		if (held < want) {
			unreserve(st, sp->sess, held);
			held = 0;
			ret = -FM_E_FULL;
			goto out;
		}
	}
	for (unsigned k = 0; k < ep->n; k++) {
		struct edit_page *p = &ep->p[k];
		if (p->written && !p->present) {
			known_set(sp, p->page / MEMD_META_PER_PAGE);
			memset(sp->map + p->page * FM_PAGE_SIZE, 0, FM_PAGE_SIZE);
		}
	}
	puts = gets = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct fm_edit_ent e;

		memcpy(&e, &ents[i], sizeof(e));
		if (e.kind == FM_EDIT_MOVE) {
			memmove(sp->map + e.dst, sp->map + e.src, e.len);
		} else if (e.kind == FM_EDIT_PUT) {
			memcpy(sp->map + e.dst, put + puts, e.len);
			puts += e.len;
		} else {
			memcpy(get + gets, sp->map + e.src, e.len);
			gets += e.len;
		}
	}
	for (unsigned k = 0; k < ep->n; k++) {
		struct edit_page *p = &ep->p[k];
		if (!p->written)
			continue;
		/* A page new to the space takes a page of what was held for it. */
		publish(st, sp, meta_of(sp, p->page), fm_crc32c(sp->map + p->page * FM_PAGE_SIZE, FM_PAGE_SIZE),
			counted && !p->present, &held);
		ok++;
	}
	ret = (long)gets;
out:
	if (held)
		unreserve(st, sp->sess, held);
	pthread_rwlock_unlock(&sp->rw);
	free(ep);
	if (ok)
		__atomic_fetch_add(&st->writes, ok, __ATOMIC_RELAXED);
	return ret;
}

/* Clear the present pages of [first, end) that lie in existing meta pages. */
static uint64_t clear_range(struct memd_space *sp, uint64_t first, uint64_t end)
{
	uint64_t mp = first / MEMD_META_PER_PAGE, last_mp = (end - 1) / MEMD_META_PER_PAGE;
	uint64_t cleared = 0;

	while (mp <= last_mp) {
		/* Skip holes in O(log) rather than walking up to 2^27 meta pages. */
		off_t want = (off_t)(sp->meta_offset + mp * FM_PAGE_SIZE);
		off_t got = sp->idmap ? want : lseek(sp->fd, want, SEEK_DATA);
		uint64_t lo, hi;

		if (got < 0)
			break;
		mp = ((uint64_t)got - sp->meta_offset) / FM_PAGE_SIZE;
		if (mp > last_mp)
			break;
		known_set(sp, mp);
		lo = mp * MEMD_META_PER_PAGE;
		hi = lo + MEMD_META_PER_PAGE;
		if (lo < first)
			lo = first;
		if (hi > end)
			hi = end;
		for (uint64_t p = lo; p < hi; p++) {
			struct fm_shm_meta *m = meta_of(sp, p);

			/* Only store where needed: a clean page stays clean. */
			if (!__atomic_load_n(&m->flags, __ATOMIC_RELAXED))
				continue;
			if (__atomic_exchange_n(&m->flags, 0, __ATOMIC_RELEASE) & FM_SHM_PRESENT)
				cleared++;
		}
		mp++;
	}
	return cleared;
}

int memd_space_discard(struct memd_store *st, struct memd_space *sp,
		       const struct fm_range *r, uint32_t n)
{
	uint64_t cleared = 0, dropped = 0;

	pthread_rwlock_rdlock(&sp->rw);
	if (sp->dead) {
		pthread_rwlock_unlock(&sp->rw);
		return -ENOENT;
	}
	/* All or nothing: check every range before touching any page. */
	for (uint32_t i = 0; i < n; i++) {
		struct fm_range x;

		memcpy(&x, &r[i], sizeof(x));
		if (x.first > sp->npages || x.npages > sp->npages - x.first) {
			pthread_rwlock_unlock(&sp->rw);
			return -ERANGE;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		struct fm_range x;
		uint64_t c;

		memcpy(&x, &r[i], sizeof(x));
		if (!x.npages)
			continue;
		/* Flags first: a reader never finds PRESENT over punched data for long. */
		c = clear_range(sp, x.first, x.first + x.npages);
		cleared += c;
		/* Not in an RDMA space: a hole would part memd's mapping from the registered pages. */
		if (!sp->idmap && !sp->rdma_chunks && fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)(x.first * FM_PAGE_SIZE),
			      (off_t)(x.npages * FM_PAGE_SIZE)) < 0)
			fm_warn("space %u: punching pages %llu+%llu: %s", sp->id,
				(unsigned long long)x.first, (unsigned long long)x.npages,
				strerror(errno));
	}
	if (!sp->mapped) {
		dropped = cleared;
		__atomic_fetch_sub(&sp->present, dropped, __ATOMIC_RELAXED);
	}
	pthread_rwlock_unlock(&sp->rw);
	unreserve(st, sp->sess, dropped);
	__atomic_fetch_add(&st->discards, cleared, __ATOMIC_RELAXED);
	return 0;
}

/* Caller holds sp->rw for writing. */
static void to_grant(struct memd_store *st, struct memd_space *sp)
{
	if (sp->mapped)
		return;
	/*
	 * From now on the client writes pages memd never sees: the pages the
	 * space holds become part of the session's grant, and capacity is
	 * accounted by QUOTA alone.
	 */
	pthread_mutex_lock(&st->lock);
	sp->sess->pages -= sp->present;
	sp->sess->grant += sp->present;
	pthread_mutex_unlock(&st->lock);
	sp->present = 0;
	sp->mapped = true;
}

/* Chunks of at least 2 MiB (a meta page each), at most MEMD_RDMA_MAX_CHUNKS a space: the device's MRs are few. */
#define MEMD_RDMA_MIN_CHUNK_PAGES 512u
#define MEMD_RDMA_MAX_CHUNKS 1024u

int memd_space_rdma(struct memd_store *st, struct memd_space *sp, struct fm_rdma_map_rep *rep)
{
	int ret = 0;

	pthread_rwlock_wrlock(&sp->rw);
	if (sp->dead) {
		ret = -ENOENT;
		goto out;
	}
	if (sp->idmap) {  /* device memory from /dev/swapva: not registered for RDMA (untested) */
		ret = -EPROTONOSUPPORT;
		goto out;
	}
	if (!st->rdma) {
		ret = -EOPNOTSUPP; /* no listener */
		goto out;
	}
	if (sp->mapped && !sp->rdma_chunks) {
		ret = -EBUSY; /* shared with a Unix-socket client by SHM_MAP */
		goto out;
	}
	if (!sp->rdma_chunks) {
		uint64_t cp = MEMD_RDMA_MIN_CHUNK_PAGES;

		while ((sp->npages + cp - 1) / cp > MEMD_RDMA_MAX_CHUNKS)
			cp *= 2;
		sp->rdma_chunks = calloc((sp->npages + cp - 1) / cp, sizeof(*sp->rdma_chunks));
		if (!sp->rdma_chunks) {
			ret = -ENOMEM;
			goto out;
		}
		sp->rdma_chunk_pages = cp;
		sp->rdma_nchunks = (sp->npages + cp - 1) / cp;
	}
	to_grant(st, sp);
	*rep = (struct fm_rdma_map_rep){
		.npages = sp->npages, .data_offset = 0, .meta_offset = sp->meta_offset,
		.map_len = sp->map_len, .addr = (uint64_t)(uintptr_t)sp->map,
		.chunk_pages = (uint32_t)sp->rdma_chunk_pages,
	};
out:
	pthread_rwlock_unlock(&sp->rw);
	return ret;
}

/* Chunk c's first page and pages (the last chunk is shorter); returns what it costs pinned, data and meta. */
static uint64_t rdma_chunk_span(const struct memd_space *sp, uint64_t c, uint64_t *first, uint64_t *n)
{
	*first = c * sp->rdma_chunk_pages;
	*n = sp->npages - *first;
	if (*n > sp->rdma_chunk_pages)
		*n = sp->rdma_chunk_pages;
	return *n + (*n * sizeof(struct fm_shm_meta) + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE;
}

/* rw taken for writing: 0, or -ENOENT (closed) or -EPERM (not RDMA_MAP'd). */
static int rdma_space_wrlock(struct memd_space *sp)
{
	pthread_rwlock_wrlock(&sp->rw);
	return sp->dead ? -ENOENT : !sp->rdma_chunks ? -EPERM : 0;
}

/* Register chunk c of an RDMA space (rw held for writing): its data and its meta, counted against capacity. */
static uint32_t rdma_reg_chunk(struct memd_store *st, struct memd_space *sp, uint64_t c)
{
	struct memd_rdma_chunk *ch = &sp->rdma_chunks[c];
	uint64_t first, n, cost, got;
	void **pd = memd_session_rdma_pd(sp->sess);

	if (ch->data_mr)
		return FM_OK;
	cost = rdma_chunk_span(sp, c, &first, &n);
	got = reserve(st, sp->sess, cost);
	if (got < cost) {
		unreserve(st, sp->sess, got);
		return FM_E_FULL;
	}
	if (st->rdma->reg(pd, sp->map + first * FM_PAGE_SIZE, n * FM_PAGE_SIZE, &ch->data_mr,
			  &ch->data_rkey)) {
		ch->data_mr = NULL;
		unreserve(st, sp->sess, cost);
		return FM_E_FULL;
	}
	if (st->rdma->reg(pd, sp->meta + first, n * sizeof(struct fm_shm_meta), &ch->meta_mr,
			  &ch->meta_rkey)) {
		st->rdma->dereg(ch->data_mr);
		ch->data_mr = NULL;
		unreserve(st, sp->sess, cost);
		return FM_E_FULL;
	}
	/* Registration faulted the meta pages in: reading them allocates nothing more. */
	for (uint64_t mp = first / MEMD_META_PER_PAGE; mp <= (first + n - 1) / MEMD_META_PER_PAGE; mp++)
		known_set(sp, mp);
	sp->rdma_pinned += cost;
	return FM_OK;
}

int memd_space_rdma_reg(struct memd_store *st, struct memd_space *sp, const uint64_t *chunks, uint32_t n,
			struct fm_rdma_reg_ent *out)
{
	int ret = rdma_space_wrlock(sp);

	for (uint32_t i = 0; !ret && i < n; i++) {
		uint64_t c;
		struct fm_rdma_reg_ent e = { .status = FM_E_RANGE };

		memcpy(&c, &chunks[i], sizeof(c));
		if (c < sp->rdma_nchunks) {
			e.status = rdma_reg_chunk(st, sp, c);
			if (e.status == FM_OK) {
				e.data_rkey = sp->rdma_chunks[c].data_rkey;
				e.meta_rkey = sp->rdma_chunks[c].meta_rkey;
			}
		}
		memcpy(&out[i], &e, sizeof(e));
	}
	pthread_rwlock_unlock(&sp->rw);
	return ret;
}

/*
 * Deregister chunk c (rw held for writing) and give its memory back: the
 * client holds no page in it any more (it discarded them all) and has no
 * work request in flight there (its own rule: a QP that used the rkey now
 * would fail).
 */
static void rdma_unreg_chunk(struct memd_store *st, struct memd_space *sp, uint64_t c)
{
	struct memd_rdma_chunk *ch = &sp->rdma_chunks[c];
	uint64_t first, n, cost;

	if (!ch->data_mr)
		return;
	cost = rdma_chunk_span(sp, c, &first, &n);
	st->rdma->dereg(ch->data_mr);
	st->rdma->dereg(ch->meta_mr);
	memset(ch, 0, sizeof(*ch));
	/* Chunks are whole meta pages (chunk_pages is a multiple of MEMD_META_PER_PAGE). */
	if (fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(first * FM_PAGE_SIZE),
		      (off_t)(n * FM_PAGE_SIZE)) < 0 ||
	    fallocate(sp->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)(sp->meta_offset + first * sizeof(struct fm_shm_meta)),
		      (off_t)((n * sizeof(struct fm_shm_meta) + FM_PAGE_SIZE - 1) & ~(uint64_t)(FM_PAGE_SIZE - 1))) < 0)
		fm_warn("space %u: freeing RDMA chunk %llu: %s", sp->id, (unsigned long long)c, strerror(errno));
	for (uint64_t mp = first / MEMD_META_PER_PAGE; mp <= (first + n - 1) / MEMD_META_PER_PAGE; mp++)
		known_clear(sp, mp);
	sp->rdma_pinned -= cost;
	unreserve(st, sp->sess, cost);
}

int memd_space_rdma_unreg(struct memd_store *st, struct memd_space *sp, const uint64_t *chunks, uint32_t n)
{
	int ret = rdma_space_wrlock(sp);

	/* All or nothing: every chunk checked before any is freed. */
	for (uint32_t i = 0; !ret && i < n; i++) {
		uint64_t c;

		memcpy(&c, &chunks[i], sizeof(c));
		if (c >= sp->rdma_nchunks)
			ret = -ERANGE;
	}
	for (uint32_t i = 0; !ret && i < n; i++) {
		uint64_t c;

		memcpy(&c, &chunks[i], sizeof(c));
		rdma_unreg_chunk(st, sp, c);
	}
	pthread_rwlock_unlock(&sp->rw);
	return ret;
}

int memd_space_shm(struct memd_store *st, struct memd_space *sp,
		   struct fm_shm_map_rep *rep, int *fd)
{
	int ret = 0;

	pthread_rwlock_wrlock(&sp->rw);
	if (sp->dead) {
		ret = -ENOENT;
		goto out;
	}
	if (sp->idmap) {  /* not a file: a client cannot map it */
		ret = -EOPNOTSUPP;
		goto out;
	}
	if (sp->rdma_chunks) {  /* its client writes only into registered chunks; this one would not */
		ret = -EBUSY;
		goto out;
	}
	*fd = fcntl(sp->fd, F_DUPFD_CLOEXEC, 3);
	if (*fd < 0) {
		ret = -errno;
		goto out;
	}
	to_grant(st, sp);
	rep->npages = sp->npages;
	rep->data_offset = 0;
	rep->meta_offset = sp->meta_offset;
	rep->map_len = sp->map_len;
out:
	pthread_rwlock_unlock(&sp->rw);
	return ret;
}

/*
 * May memd allocate more pages in the session's memfds? What they may hold:
 * its grant and the pages memd wrote itself, plus every space's meta. A slot
 * the client asks for holds a page of the grant (protocol.h), so an honest
 * client never meets the bound. What they hold is counted from the files
 * (st_blocks, data and meta) only when the running bound of what SHM_ALLOC
 * gave does not leave room: a stat per space per request was most of a
 * request's cost with many spaces. Caller holds s->alloc_lock.
 */
static bool session_may_allocate(struct memd_store *st, struct memd_session *s, uint64_t more)
{
	uint64_t held = 0, allowed;
	struct stat sb;
	bool ok;

	pthread_mutex_lock(&st->lock);
	allowed = s->grant + s->pages;
	if (s->alloc_bound + more <= allowed) {
		pthread_mutex_unlock(&st->lock);
		s->alloc_bound += more;
		return true;
	}
	for (struct memd_space *x = s->spaces; x; x = x->next) {
		if (x->fd < 0)
			continue;
		allowed += (x->map_len - x->meta_offset) / FM_PAGE_SIZE;
		if (fstat(x->fd, &sb) == 0)
			held += (uint64_t)sb.st_blocks / (FM_PAGE_SIZE / 512);
	}
	pthread_mutex_unlock(&st->lock);
	ok = held + more <= allowed;
	/* What the files hold counts meta too: an upper bound of the data SHM_ALLOC gave. */
	s->alloc_bound = held + (ok ? more : 0);
	return ok;
}

int memd_space_shm_alloc(struct memd_store *st, struct memd_space *sp, const struct fm_range *r, uint32_t n)
{
	uint64_t want = 0;
	int ret = 0;

	pthread_rwlock_rdlock(&sp->rw);
	if (sp->dead) {
		ret = -ENOENT;
		goto out;
	}
	if (sp->idmap || !sp->mapped || sp->rdma_chunks) {
		ret = -EPERM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct fm_range x;

		memcpy(&x, &r[i], sizeof(x));
		if (x.first > sp->npages || x.npages > sp->npages - x.first) {
			ret = -ERANGE;
			goto out;
		}
		want += x.npages;
	}
	/*
	 * From the count of room to the allocation, one request of the session
	 * at a time (alloc_lock): two cannot both pass on the same room, and
	 * st->lock is not held across a fallocate.
	 */
	pthread_mutex_lock(&sp->sess->alloc_lock);
	if (!session_may_allocate(st, sp->sess, want))
		ret = -ENOSPC;
	for (uint32_t i = 0; i < n && !ret; i++) {
		struct fm_range x;
		uint64_t mp, last_mp;

		memcpy(&x, &r[i], sizeof(x));
		if (!x.npages)
			continue;
		if (fallocate(sp->fd, FALLOC_FL_KEEP_SIZE, (off_t)(x.first * FM_PAGE_SIZE),
			      (off_t)(x.npages * FM_PAGE_SIZE)) < 0) {
			ret = -errno;
			break;
		}
		/* The client writes the slot's checksum and flag into its meta: that page is memd's too. */
		last_mp = (x.first + x.npages - 1) / MEMD_META_PER_PAGE;
		for (mp = x.first / MEMD_META_PER_PAGE; mp <= last_mp; mp++) {
			if (known_test(sp, mp))
				continue;
			if (fallocate(sp->fd, FALLOC_FL_KEEP_SIZE, (off_t)(sp->meta_offset + mp * FM_PAGE_SIZE),
				      FM_PAGE_SIZE) < 0) {
				ret = -errno;
				break;
			}
			known_set(sp, mp);
		}
	}
	pthread_mutex_unlock(&sp->sess->alloc_lock);
out:
	pthread_rwlock_unlock(&sp->rw);
	return ret;
}
