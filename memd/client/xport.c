// SPDX-License-Identifier: Apache-2.0
/*
 * The transports behind transport.h. The stream transport makes one round
 * trip per call on the channel's own connection. The shm transport maps each
 * space's memfd and touches it directly: the control connection is used for
 * space management and quota only.
 */
#include "conn.h"
#include "rdma.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fm_util.h"
#include "resmap.h"

/* Quota is reserved from memd in chunks so that a write rarely needs the control channel. */
#define SHM_GRANT_CHUNK 4096
/* After memd grants nothing, ask again only after this long (or after a discard frees room). */
#define QUOTA_BACKOFF_NS (50ull * 1000 * 1000)

int fm_xport_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	struct fm_xport *x;
	size_t len;
	uint16_t st;
	int rc;

	if (!cfg->addr || !*cfg->addr) {
		fm_errmsg(err, errlen, "no memd address");
		return -EINVAL;
	}
	if (strchr(cfg->addr, ','))  /* many-memd dispatch: client_multi.c */
		return fm_multi_connect(cfg, out, err, errlen);
	if (cfg->secret_len == 0 || cfg->secret_len > sizeof(x->secret)) {
		fm_errmsg(err, errlen, "the memd secret must be 1 to %zu bytes", sizeof(x->secret));
		return -EINVAL;
	}
	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	snprintf(x->addr, sizeof(x->addr), "%s", cfg->addr);
	memcpy(x->secret, cfg->secret, cfg->secret_len);
	x->cfg = *cfg;
	x->cfg.addr = x->addr;
	x->cfg.secret = x->secret;
	pthread_mutex_init(&x->lock, NULL);
	if (strncmp(cfg->addr, "rdma://", 7) == 0) {  /* rdma: client_rdma.c; control over TCP */
		rc = fm_rdma_init(x, cfg->addr, err, errlen);
		if (rc)
			goto fail;
	}

	rc = fm_conn_open(&x->ctrl, &x->cfg, err, errlen);
	if (rc)
		goto fail;
	rc = fm_conn_call(&x->ctrl, FM_OP_SESSION_NEW, 0, NULL, 0, &x->session,
			  sizeof(x->session), &len, &st, NULL);
	if (!rc && (st || len != sizeof(x->session)))
		rc = -EPROTO;
	if (rc) {
		fm_errmsg(err, errlen, "memd at %s did not open a session: %s", x->addr,
			  rc == -EPROTO ? "protocol error" : strerror(-rc));
		goto fail;
	}
	if (cfg->pref == FM_PREF_SHM && !(x->ctrl.is_unix && (x->ctrl.server_flags & FM_HELLO_F_SHM))) {
		fm_errmsg(err, errlen, "memd at %s cannot share its store (shm needs a Unix socket to a memd on this host)", x->addr);
		rc = -EOPNOTSUPP;
		goto fail;
	}
	x->kind = (cfg->pref != FM_PREF_STREAM && x->ctrl.is_unix &&
		   (x->ctrl.server_flags & FM_HELLO_F_SHM)) ? FM_XPORT_SHM : FM_XPORT_STREAM;
	if (x->rdma)
		x->kind = FM_XPORT_RDMA;
	*out = x;
	return 0;
fail:
	fm_rdma_free(x);
	fm_conn_close(&x->ctrl);
	pthread_mutex_destroy(&x->lock);
	free(x);
	return rc;
}

void fm_xport_close(struct fm_xport *x)
{
	if (!x)
		return;
	if (x->multi) {  /* many-memd dispatch */
		fm_multi_close(x);
		return;
	}
	for (unsigned i = 0; i < x->nspaces; i++) {
		if (x->spaces[i].data)
			fm_sys_munmap(x->spaces[i].data, x->spaces[i].map_len);
		if (x->spaces[i].memfd >= 0)
			close(x->spaces[i].memfd);
	}
	fm_rdma_free(x);
	fm_conn_close(&x->ctrl);
	pthread_mutex_destroy(&x->lock);
	free(x);
}

int fm_xport_kind(const struct fm_xport *x) { return x->kind; }
const char *fm_xport_addr(const struct fm_xport *x) { return x->addr; }

/* memd vanished if its control socket hung up. Checked before we trust it with a write. */
static int ctrl_alive(struct fm_xport *x)
{
	struct pollfd p = { .fd = x->ctrl.fd, .events = POLLIN | POLLRDHUP };

	if (atomic_load(&x->dead))
		return 0;
	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR))) {
		if (!atomic_exchange(&x->dead, 1))
			fm_err("lost memd at %s (its connection closed): evicting stops; pages it held are read back only if their checksums verify",
			       x->addr);
		return 0;
	}
	return 1;
}

static int ctrl_call(struct fm_xport *x, uint16_t op, uint32_t count, const struct fm_iov *iov,
		     unsigned niov, void *rep, size_t cap, size_t *len, uint16_t *st, int *fd)
{
	int rc;

	pthread_mutex_lock(&x->lock);
	rc = fm_conn_call(&x->ctrl, op, count, iov, niov, rep, cap, len, st, fd);
	pthread_mutex_unlock(&x->lock);
	if (rc && !atomic_exchange(&x->dead, 1))
		fm_err("lost memd at %s: %s", x->addr, strerror(-rc));
	return rc;
}

static struct space_map *find_space(struct fm_xport *x, uint32_t id)
{
	for (unsigned i = 0; i < x->nspaces; i++)
		if (x->spaces[i].id == id && x->spaces[i].data)
			return &x->spaces[i];
	return NULL;
}

static int map_space(struct fm_xport *x, uint32_t id, uint64_t npages)
{
	struct fm_space_ref ref = { .space_id = id };
	struct fm_shm_map_rep rep;
	struct space_map *sm = NULL;
	size_t len;
	uint16_t st;
	int fd = -1, rc;
	void *p;

	rc = ctrl_call(x, FM_OP_SHM_MAP, 0, &(struct fm_iov){ &ref, sizeof(ref) }, 1,
		       &rep, sizeof(rep), &len, &st, &fd);
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
	pthread_mutex_lock(&x->lock);
	for (unsigned i = 0; i < x->nspaces; i++)
		if (!x->spaces[i].data)
			sm = &x->spaces[i];
	if (!sm && x->nspaces < 64)
		sm = &x->spaces[x->nspaces++];
	if (sm) {
		sm->id = id;
		sm->npages = npages;
		sm->memfd = fd;
		sm->map_len = rep.map_len;
		sm->meta = (struct fm_shm_meta *)((uint8_t *)p + rep.meta_offset);
		/* Publish data last: find_space() keys on it without the lock. */
		__atomic_store_n(&sm->data, (uint8_t *)p + rep.data_offset, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&x->lock);
	if (!sm) {
		fm_sys_munmap(p, rep.map_len);
		rc = -ENOSPC;
		goto fail;
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return rc;
}

int fm_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	struct fm_space_open_req req = { .npages = npages };
	struct fm_space_open_rep rep;
	size_t len;
	uint16_t st;
	int rc;

	if (x->multi)  /* many-memd dispatch */
		return fm_multi_space_open(x, npages, space_id);
	rc = ctrl_call(x, FM_OP_SPACE_OPEN, 0, &(struct fm_iov){ &req, sizeof(req) }, 1,
		       &rep, sizeof(rep), &len, &st, NULL);
	if (rc)
		return rc;
	if (st == FM_E_FULL || st == FM_E_TOOBIG || st == FM_E_RANGE)
		return -ENOSPC;
	if (st || len != sizeof(rep))
		return -EPROTO;
	if (x->kind == FM_XPORT_SHM || x->kind == FM_XPORT_RDMA) {
		rc = x->kind == FM_XPORT_RDMA ? fm_rdma_space_map(x, rep.space_id, npages)
					      : map_space(x, rep.space_id, npages);
		if (rc) {
			fm_xport_space_close(x, rep.space_id);
			return rc;
		}
	}
	*space_id = rep.space_id;
	return 0;
}

int fm_xport_space_close(struct fm_xport *x, uint32_t space_id)
{
	struct fm_space_ref ref = { .space_id = space_id };
	struct space_map *sm;
	size_t len;
	uint16_t st;

	if (x->multi)  /* many-memd dispatch */
		return fm_multi_space_close(x, space_id);
	if (x->rdma)
		fm_rdma_space_unmap(x, space_id);
	sm = find_space(x, space_id);
	if (sm) {
		pthread_mutex_lock(&x->lock);
		fm_sys_munmap(sm->data - 0, sm->map_len);
		close(sm->memfd);
		sm->data = NULL;
		sm->memfd = -1;
		pthread_mutex_unlock(&x->lock);
	}
	if (atomic_load(&x->dead))
		return -EPIPE;
	return ctrl_call(x, FM_OP_SPACE_CLOSE, 0, &(struct fm_iov){ &ref, sizeof(ref) }, 1,
			 NULL, 0, &len, &st, NULL);
}

int fm_xport_stats(struct fm_xport *x, struct fm_stats *s)
{
	size_t len;
	uint16_t st;
	int rc;

	if (x->multi)  /* many-memd dispatch */
		return fm_multi_stats(x, s);
	rc = ctrl_call(x, FM_OP_STATS, 0, NULL, 0, s, sizeof(*s), &len, &st, NULL);
	if (!rc && (st || len != sizeof(*s)))
		rc = -EPROTO;
	return rc;
}

int fm_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	struct fm_chan *c = calloc(1, sizeof(*c));
	size_t len;
	uint16_t st;
	int rc;

	if (x->multi) {  /* many-memd dispatch */
		free(c);
		return fm_multi_chan_open(x, out);
	}
	if (!c)
		return -ENOMEM;
	c->x = x;
	c->conn.fd = -1;
	if (x->kind == FM_XPORT_RDMA) {
		rc = fm_rdma_chan_open(c);
		if (rc) {
			free(c);
			return rc;
		}
	}
	if (x->kind == FM_XPORT_STREAM) {
		char err[256];
		c->buf = aligned_alloc(FM_PAGE_SIZE, (size_t)FM_MAX_BATCH * FM_PAGE_SIZE);
		if (!c->buf) {
			free(c);
			return -ENOMEM;
		}
		rc = fm_conn_open(&c->conn, &x->cfg, err, sizeof(err));
		if (!rc) {
			rc = fm_conn_call(&c->conn, FM_OP_SESSION_JOIN, 0,
					  &(struct fm_iov){ &x->session, sizeof(x->session) }, 1,
					  NULL, 0, &len, &st, NULL);
			if (!rc && st)
				rc = -EACCES;
		} else {
			fm_err("%s", err);
		}
		if (rc) {
			fm_chan_close(c);
			return rc;
		}
	}
	*out = c;
	return 0;
}

void fm_chan_close(struct fm_chan *c)
{
	if (!c)
		return;
	if (c->mchan) {  /* many-memd dispatch */
		fm_multi_chan_close(c);
		return;
	}
	fm_rdma_chan_close(c);
	fm_conn_close(&c->conn);
	free(c->buf);
	free(c);
}

static int stream_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		       const void **src)
{
	struct fm_space_ref ref = { .space_id = space };
	struct fm_iov req[2] = { { &ref, sizeof(ref) }, { pages, n * sizeof(uint64_t) } };
	/* Statuses into their array, pages straight into the aligned buffer: no extra copy. */
	struct fm_iov rep[2] = { { c->st, n * sizeof(c->st[0]) }, { c->buf, (size_t)n * FM_PAGE_SIZE } };
	size_t len;
	uint16_t st;
	int rc;

	rc = fm_conn_callv(&c->conn, FM_OP_READ, n, req, 2, rep, 2, &len, &st, NULL);
	if (rc)
		return rc;
	if (st == FM_E_RANGE || st == FM_E_NOSPACE)
		return -ERANGE;
	if (st || len != n * (sizeof(c->st[0]) + FM_PAGE_SIZE))
		return -EPROTO;
	for (unsigned i = 0; i < n; i++) {
		const uint8_t *d = c->buf + (size_t)i * FM_PAGE_SIZE;
		if (c->st[i].status == FM_E_ABSENT)
			return -ENOENT;
		if (c->st[i].status != FM_OK)
			return -EPROTO;
		if (fm_crc32c(d, FM_PAGE_SIZE) != c->st[i].crc)
			return -EIO;
		src[i] = d;
	}
	return 0;
}

int fm_chan_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n, const void **src)
{
	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (c->mchan)  /* many-memd dispatch */
		return fm_multi_read(c, space, pages, n, src);
	if (c->rchan)
		return fm_rdma_read(c, space, pages, n, src);
	if (c->x->kind == FM_XPORT_SHM) {
		struct space_map *sm = find_space(c->x, space);
		if (!sm)
			return -ENOENT;
		for (unsigned i = 0; i < n; i++) {
			uint64_t p = pages[i];
			uint32_t fl, crc;
			const uint8_t *d;
			if (p >= sm->npages)
				return -ERANGE;
			fl = __atomic_load_n(&sm->meta[p].flags, __ATOMIC_ACQUIRE);
			if (!(fl & FM_SHM_PRESENT))
				return -ENOENT;
			crc = sm->meta[p].crc;
			d = sm->data + p * FM_PAGE_SIZE;
			if (fm_crc32c(d, FM_PAGE_SIZE) != crc)
				return -EIO;
			src[i] = d;
		}
		return 0;
	}
	return stream_read(c, space, pages, n, src);
}

static int stream_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
			const void *const *data, uint32_t *status)
{
	struct fm_space_ref ref = { .space_id = space };
	struct fm_write_ent ents[FM_MAX_BATCH];
	struct fm_iov req[2 + 6];
	unsigned i, k, niov = 2;
	size_t len;
	uint16_t st;
	int rc;

	for (i = 0; i < n; i++)
		ents[i] = (struct fm_write_ent){ .page = pages[i],
						 .crc = fm_crc32c(data[i], FM_PAGE_SIZE) };
	req[0] = (struct fm_iov){ &ref, sizeof(ref) };
	req[1] = (struct fm_iov){ ents, n * sizeof(ents[0]) };
	/*
	 * Page data goes out from where it lies, no staging copy. Pages that
	 * follow each other in memory share one iovec; when they do not, the
	 * frame is sent in pieces of at most six runs.
	 */
	for (i = 0; i < n;) {
		const uint8_t *start = data[i];
		size_t run = FM_PAGE_SIZE;
		for (k = i + 1; k < n && (const uint8_t *)data[k] == start + run; k++)
			run += FM_PAGE_SIZE;
		if (niov == 8)
			break;
		req[niov++] = (struct fm_iov){ start, run };
		i = k;
	}
	if (i < n) {
		/* Too many runs for one sendmsg: write the whole batch as separate calls. */
		unsigned done = 0;
		while (done < n) {
			unsigned m = 0, j = done;
			niov = 2;
			while (j < n && niov < 8) {
				const uint8_t *start = data[j];
				size_t run = FM_PAGE_SIZE;
				for (k = j + 1; k < n && (const uint8_t *)data[k] == start + run; k++)
					run += FM_PAGE_SIZE;
				req[niov++] = (struct fm_iov){ start, run };
				m += k - j;
				j = k;
			}
			rc = stream_write(c, space, pages + done, m, data + done, status + done);
			if (rc)
				return rc;
			done += m;
		}
		return 0;
	}
	rc = fm_conn_call(&c->conn, FM_OP_WRITE, n, req, niov, status, n * sizeof(uint32_t), &len,
			  &st, NULL);
	if (rc)
		return rc;
	if (st == FM_E_FULL) {
		for (i = 0; i < n; i++)
			status[i] = FM_E_FULL;
		return 0;
	}
	if (st || len != n * sizeof(uint32_t))
		return -EPROTO;
	for (i = 0; i < n; i++)
		if (status[i] != FM_OK && status[i] != FM_E_FULL)
			return -EPROTO;
	return 0;
}

/*
 * A page new to memd takes one page of this session's grant. When the local
 * share runs out, ask memd for another chunk; it grants what its capacity and
 * our quota allow, possibly nothing, and the page then stays with the pager.
 */
static int take_grant(struct fm_xport *x)
{
	struct fm_quota_req q = { .delta_pages = SHM_GRANT_CHUNK };
	struct fm_quota_rep r;
	size_t len;
	uint16_t st;

	if (atomic_fetch_sub(&x->grant_avail, 1) > 0)
		return 1;
	atomic_fetch_add(&x->grant_avail, 1);
	/* memd said it was full a moment ago: do not ask again for every page. */
	if (fm_now_ns() < atomic_load(&x->full_until_ns))
		return 0;
	pthread_mutex_lock(&x->lock);
	if (atomic_load(&x->grant_avail) <= 0 &&
	    fm_conn_call(&x->ctrl, FM_OP_QUOTA, 0, &(struct fm_iov){ &q, sizeof(q) }, 1, &r, sizeof(r),
			 &len, &st, NULL) == 0 && !st && len == sizeof(r) && r.granted_pages > x->granted_total) {
		atomic_fetch_add(&x->grant_avail, (int_fast64_t)(r.granted_pages - x->granted_total));
		x->granted_total = r.granted_pages;
	} else if (atomic_load(&x->grant_avail) <= 0) {
		atomic_store(&x->full_until_ns, fm_now_ns() + QUOTA_BACKOFF_NS);
	}
	pthread_mutex_unlock(&x->lock);
	if (atomic_fetch_sub(&x->grant_avail, 1) > 0)
		return 1;
	atomic_fetch_add(&x->grant_avail, 1);
	return 0;
}

int fm_chan_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		  const void *const *data, uint32_t *status)
{
	struct fm_xport *x = c->x;

	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (c->mchan)  /* many-memd dispatch */
		return fm_multi_write(c, space, pages, n, data, status);
	if (!ctrl_alive(x))
		return -EPIPE;
	if (c->rchan)
		return fm_rdma_write(c, space, pages, n, data, status);
	if (x->kind == FM_XPORT_SHM) {
		struct space_map *sm = find_space(x, space);
		if (!sm)
			return -ENOENT;
		for (unsigned i = 0; i < n; i++) {
			uint64_t p = pages[i];
			struct fm_shm_meta *m;
			if (p >= sm->npages)
				return -ERANGE;
			m = &sm->meta[p];
			if (!(__atomic_load_n(&m->flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT) &&
			    !take_grant(x)) {
				status[i] = FM_E_FULL;
				continue;
			}
			/*
			 * Data and checksum first, then the flag with release order:
			 * a reader that acquires FM_SHM_PRESENT sees both. The store
			 * is in the memfd's page cache when this returns, so the pager
			 * may drop its own copy as soon as we come back.
			 */
			memcpy(sm->data + p * FM_PAGE_SIZE, data[i], FM_PAGE_SIZE);
			m->crc = fm_crc32c(sm->data + p * FM_PAGE_SIZE, FM_PAGE_SIZE);
			__atomic_store_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
			status[i] = FM_OK;
		}
		return 0;
	}
	return stream_write(c, space, pages, n, data, status);
}

/*
 * One COPY request on conn: a stream channel's own connection, or the rdma
 * transport's control connection. A memd that does not announce COPY is not
 * asked (it would answer FM_E_OP, which means the same).
 */
static int copy_call(struct fm_conn *conn, uint32_t src, const uint64_t *spages, uint32_t dst,
		     const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct fm_copy_req req = { .src_space = src, .dst_space = dst };
	struct fm_copy_ent ents[FM_MAX_BATCH];
	struct fm_iov iov[2] = { { &req, sizeof(req) }, { ents, n * sizeof(ents[0]) } };
	size_t len;
	uint16_t st;
	int rc;

	if (!(conn->server_flags & FM_HELLO_F_COPY))
		return -EOPNOTSUPP;
	for (unsigned i = 0; i < n; i++)
		ents[i] = (struct fm_copy_ent){ .src_page = spages[i], .dst_page = dpages[i] };
	rc = fm_conn_call(conn, FM_OP_COPY, n, iov, 2, status, n * sizeof(uint32_t), &len, &st, NULL);
	if (rc)
		return rc;
	if (st == FM_E_OP)
		return -EOPNOTSUPP;
	if (st == FM_E_NOSPACE)
		return -ENOENT;
	if (st || len != n * sizeof(uint32_t))
		return -EPROTO;
	for (unsigned i = 0; i < n; i++)
		if (status[i] != FM_OK && status[i] != FM_E_ABSENT && status[i] != FM_E_FULL &&
		    status[i] != FM_E_RANGE)
			return -EPROTO;
	return 0;
}

/*
 * shm: the same copy as memd's, done here in the shared store, slot to slot
 * with no bounce. A destination page new to the store takes a page of the
 * grant, as a write does.
 */
static int shm_copy(struct fm_xport *x, uint32_t src, const uint64_t *spages, uint32_t dst,
		    const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct space_map *ss = find_space(x, src), *ds = find_space(x, dst);

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
		if (!(__atomic_load_n(&m->flags, __ATOMIC_ACQUIRE) & FM_SHM_PRESENT) && !take_grant(x)) {
			status[i] = FM_E_FULL;
			continue;
		}
		/* The acquire above published the source's crc and bytes; the flag goes last, as in a write. */
		crc = ss->meta[sp].crc;
		memcpy(ds->data + dp * FM_PAGE_SIZE, ss->data + sp * FM_PAGE_SIZE, FM_PAGE_SIZE);
		m->crc = crc;
		__atomic_store_n(&m->flags, FM_SHM_PRESENT, __ATOMIC_RELEASE);
	}
	return 0;
}

int fm_chan_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status)
{
	struct fm_xport *x = c->x;

	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	if (c->mchan)  /* many-memd dispatch */
		return fm_multi_copy(c, src, spages, dst, dpages, n, status);
	/* A copy makes pages that only memd holds: the same rule as a write. */
	if (!ctrl_alive(x))
		return -EPIPE;
	if (c->rchan)
		return fm_rdma_copy(c, src, spages, dst, dpages, n, status);
	if (x->kind == FM_XPORT_SHM)
		return shm_copy(x, src, spages, dst, dpages, n, status);
	return copy_call(&c->conn, src, spages, dst, dpages, n, status);
}

int fm_chan_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	struct fm_xport *x = c->x;

	if (n == 0 || n > FM_MAX_RANGES)
		return -EINVAL;
	if (c->mchan)  /* many-memd dispatch */
		return fm_multi_discard(c, space, r, n);
	if (c->rchan)
		return fm_rdma_discard(c, space, r, n);
	if (x->kind == FM_XPORT_SHM) {
		struct space_map *sm = find_space(x, space);
		if (!sm)
			return -ENOENT;
		for (unsigned i = 0; i < n; i++) {
			uint64_t freed = 0;
			if (r[i].first >= sm->npages || r[i].npages > sm->npages - r[i].first)
				return -ERANGE;
			for (uint64_t p = r[i].first; p < r[i].first + r[i].npages; p++) {
				if (__atomic_exchange_n(&sm->meta[p].flags, 0, __ATOMIC_ACQ_REL) & FM_SHM_PRESENT)
					freed++;
			}
			fallocate(sm->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  (off_t)(r[i].first * FM_PAGE_SIZE), (off_t)(r[i].npages * FM_PAGE_SIZE));
			atomic_fetch_add(&x->grant_avail, (int_fast64_t)freed);
			if (freed)
				atomic_store(&x->full_until_ns, 0);
		}
		return 0;
	}
	{
		struct fm_space_ref ref = { .space_id = space };
		struct fm_iov iov[2] = { { &ref, sizeof(ref) }, { r, n * sizeof(*r) } };
		size_t len;
		uint16_t st;
		int rc = fm_conn_call(&c->conn, FM_OP_DISCARD, n, iov, 2, NULL, 0, &len, &st, NULL);
		if (!rc && st)
			rc = st == FM_E_RANGE ? -ERANGE : -EPROTO;
		return rc;
	}
}

/* ---- helpers for client_rdma.c ---------------------------------------- */
int fm_xport_ctrl_call(struct fm_xport *x, uint16_t op, const void *req, size_t reqlen,
		       void *rep, size_t cap, size_t *len, uint16_t *st)
{
	return ctrl_call(x, op, 0, &(struct fm_iov){ req, reqlen }, 1, rep, cap, len, st, NULL);
}

int fm_xport_ctrl_copy(struct fm_xport *x, uint32_t src, const uint64_t *spages, uint32_t dst,
		       const uint64_t *dpages, unsigned n, uint32_t *status)
{
	int rc;

	pthread_mutex_lock(&x->lock);
	rc = copy_call(&x->ctrl, src, spages, dst, dpages, n, status);
	pthread_mutex_unlock(&x->lock);
	if (rc && rc != -EOPNOTSUPP && rc != -ENOENT && rc != -EPROTO && !atomic_exchange(&x->dead, 1))
		fm_err("lost memd at %s: %s", x->addr, strerror(-rc));
	return rc;
}

int fm_xport_take_grant(struct fm_xport *x) { return take_grant(x); }

void fm_xport_return_grant(struct fm_xport *x, uint64_t pages)
{
	atomic_fetch_add(&x->grant_avail, (int_fast64_t)pages);
}
