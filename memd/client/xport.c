// SPDX-License-Identifier: Apache-2.0
/*
 * transport.h's functions: fm_xport_connect picks a transport by the
 * address; every other call goes through the transport's table (ops.h).
 */
#include "ops.h"

#include <errno.h>
#include <string.h>

#include "fm_util.h"

#define DEFAULT_TIMEOUT_MS 10000

int fm_xport_connect(const struct fm_xport_cfg *cfg, struct fm_xport **out, char *err, size_t errlen)
{
	struct fm_xport_cfg c = *cfg;
	int rc;

	if (!c.addr || !*c.addr) {
		fm_errmsg(err, errlen, "no memd address");
		return -EINVAL;
	}
	if (strchr(c.addr, ','))
		return fm_multi_connect(&c, out, err, errlen);
	if (c.timeout_ms <= 0)
		c.timeout_ms = DEFAULT_TIMEOUT_MS;
	if (strncmp(c.addr, "rdma://", 7) == 0)
		return fm_rdma_connect(&c, out, err, errlen);
	/* Over a Unix socket memd can share its store: shm, unless the user wants stream. */
	if (strncmp(c.addr, "unix:", 5) == 0 && c.pref != FM_PREF_STREAM) {
		rc = fm_shm_connect(&c, out, err, errlen);
		if (rc != -EOPNOTSUPP || c.pref == FM_PREF_SHM)
			return rc;
	} else if (c.pref == FM_PREF_SHM) {
		fm_errmsg(err, errlen, "memd at %s cannot share its store (shm needs a Unix socket to a memd on this host)",
			  c.addr);
		return -EOPNOTSUPP;
	}
	return fm_stream_connect(&c, 0, out, err, errlen);
}

void fm_xport_close(struct fm_xport *x)
{
	if (x)
		x->ops->close(x);
}

int fm_xport_kind(const struct fm_xport *x) { return x->kind; }
const char *fm_xport_addr(const struct fm_xport *x) { return x->addr; }

void fm_xport_set_counters(struct fm_xport *x, struct fm_xport_counters *c)
{
	if (!x || !c)
		return;
	*c = x->own;
	atomic_store(&x->counters, c);
}

int fm_xport_space_open(struct fm_xport *x, uint64_t npages, uint32_t *space_id)
{
	return x->ops->space_open(x, npages, space_id);
}

int fm_xport_space_close(struct fm_xport *x, uint32_t space_id)
{
	return x->ops->space_close(x, space_id);
}

int fm_xport_stats(struct fm_xport *x, struct fm_stats *st)
{
	return x->ops->stats(x, st);
}

uint64_t fm_xport_kept_pages(struct fm_xport *x)
{
	return x->ops->kept_pages ? x->ops->kept_pages(x) : 0;
}

void fm_xport_pause(struct fm_xport *x, int begin)
{
	if (x->ops->pause)
		x->ops->pause(x, begin);
}

int fm_chan_open(struct fm_xport *x, struct fm_chan **out)
{
	return x->ops->chan_open(x, out);
}

void fm_chan_close(struct fm_chan *c)
{
	if (c)
		c->x->ops->chan_close(c);
}

int fm_chan_read(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n, const void **src)
{
	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	return c->x->ops->read(c, space, pages, n, src);
}

int fm_chan_write(struct fm_chan *c, uint32_t space, const uint64_t *pages, unsigned n,
		  const void *const *data, uint32_t *status)
{
	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	return c->x->ops->write(c, space, pages, n, data, status);
}

int fm_chan_copy(struct fm_chan *c, uint32_t src, const uint64_t *spages, uint32_t dst,
		 const uint64_t *dpages, unsigned n, uint32_t *status)
{
	if (n == 0 || n > FM_MAX_BATCH)
		return -EINVAL;
	return c->x->ops->copy(c, src, spages, dst, dpages, n, status);
}

int fm_chan_discard(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	if (n == 0 || n > FM_MAX_RANGES)
		return -EINVAL;
	return c->x->ops->discard(c, space, r, n);
}

int fm_chan_forget(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n, int *kept)
{
	if (n == 0 || n > FM_MAX_RANGES)
		return -EINVAL;
	*kept = c->x->ops->forget != NULL;
	return *kept ? c->x->ops->forget(c, space, r, n) : c->x->ops->discard(c, space, r, n);
}

int fm_chan_release(struct fm_chan *c, uint32_t space, const struct fm_range *r, unsigned n)
{
	if (n == 0 || n > FM_MAX_RANGES)
		return -EINVAL;
	return c->x->ops->release ? c->x->ops->release(c, space, r, n) : 0;
}

int fm_chan_edit(struct fm_chan *c, uint32_t space, const struct fm_edit_ent *e, unsigned n,
		 const void *put, size_t put_len, size_t get_len, const void **get)
{
	if (n == 0 || n > FM_MAX_EDITS)
		return -EINVAL;
	if (!c->x->ops->edit)
		return -EOPNOTSUPP;
	return c->x->ops->edit(c, space, e, n, put, put_len, get_len, get);
}

int fm_chan_page_open(struct fm_chan *c, uint32_t space, uint64_t page, unsigned flags, uint8_t **bytes)
{
	if (!c->x->ops->page_open)
		return -EOPNOTSUPP;
	return c->x->ops->page_open(c, space, page, flags, bytes);
}

int fm_chan_page_seal(struct fm_chan *c, uint32_t space, uint64_t page)
{
	if (!c->x->ops->page_seal)
		return -EOPNOTSUPP;
	return c->x->ops->page_seal(c, space, page);
}
