// SPDX-License-Identifier: Apache-2.0
/*
 * The pager's fault side: regions, the residency map, fault handlers and
 * the prefetcher. Eviction lives in evict.c.
 *
 * Every page's life is its state byte in the residency map (resmap.h); a
 * state changes only by compare-and-swap, so a handler, the evictor and a
 * program thread that frees memory agree on who owns a page at each moment.
 */
#include "pager_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fm_util.h"
#include "uffd_compat.h"

#define MAP_CAPACITY (1ull << 32) /* state bytes: 16 TiB of registered memory */
#define MSGS_PER_READ 16
#define MIN_LIMIT_PAGES 256

void fm_fatal(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fm_err("%s; stopping the program so that it never runs on with wrong memory", msg);
	_exit(70);
}

/* --- small kernel wrappers ------------------------------------------------ */

int fm_wake_range(struct fm_pager *p, uintptr_t addr, size_t len)
{
	struct uffdio_range r = { .start = addr, .len = len };
	return ioctl(p->uffd, UFFDIO_WAKE, &r) ? -errno : 0;
}

int fm_wp_range(struct fm_pager *p, uintptr_t addr, size_t len, int protect)
{
	struct uffdio_writeprotect wp = {
		.range = { .start = addr, .len = len },
		.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};
	return ioctl(p->uffd, UFFDIO_WRITEPROTECT, &wp) ? -errno : 0;
}

static int uffd_copy(struct fm_pager *p, uintptr_t dst, const void *src, int wp)
{
	struct uffdio_copy c = {
		.dst = dst, .src = (uintptr_t)src, .len = PG_SIZE,
		.mode = wp ? UFFDIO_COPY_MODE_WP : 0,
	};
	if (ioctl(p->uffd, UFFDIO_COPY, &c) == 0)
		return 0;
	return -errno;
}

static int uffd_open(char *err, size_t errlen)
{
	int fd = -1, dev;

	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC);
		close(dev);
	}
	if (fd < 0)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd < 0) {
		/*
		 * UFFD_USER_MODE_ONLY would work unprivileged, but then a
		 * system call that touches a remote page fails with EFAULT
		 * instead of waiting for it: not safe for arbitrary programs.
		 */
		snprintf(err, errlen, "userfaultfd is not available to this process (%s): it needs root, "
			 "access to /dev/userfaultfd, or vm.unprivileged_userfaultfd=1; run `farmem doctor`",
			 strerror(errno));
		return -EPERM;
	}
	return fd;
}

/*
 * The shmem features (minor faults, write-protect on shmem) are optional:
 * without them only FM_REG_SHMEM regions are refused. A uffd takes one
 * UFFDIO_API, so a throwaway one asks what the kernel offers first.
 */
static uint64_t uffd_shmem_features(void)
{
	char e[256];
	int fd = uffd_open(e, sizeof(e));
	struct uffdio_api api = { .api = UFFD_API };
	uint64_t f = 0;

	if (fd < 0)
		return 0;
	if (!ioctl(fd, UFFDIO_API, &api))
		f = api.features & FM_UFFD_SHMEM_FEATURES;
	close(fd);
	return f == FM_UFFD_SHMEM_FEATURES ? f : 0;
}

/* extra: optional features the caller checked (the shmem ones). Returns 1 if
 * the uffd can also move pages (UFFDIO_MOVE, for fm_pager_move), 0 if not,
 * -ENOTSUP if a needed feature is missing. */
static int uffd_api(int fd, uint64_t extra, char *err, size_t errlen)
{
	const uint64_t need = UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_UNMAP |
			      UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	struct uffdio_api api = { .api = UFFD_API, .features = need | extra | UFFD_FEATURE_MOVE };

	/* A kernel without UFFDIO_MOVE (< 6.8) refuses the bit before it sets anything up: ask again. */
	if (ioctl(fd, UFFDIO_API, &api) == 0)
		return 1;
	api = (struct uffdio_api){ .api = UFFD_API, .features = need | extra };
	if (ioctl(fd, UFFDIO_API, &api)) {
		snprintf(err, errlen, "UFFDIO_API refused features 0x%llx (%s): this kernel lacks "
			 "write-protect or thread-id support; run `farmem doctor`",
			 (unsigned long long)need, strerror(errno));
		return -ENOTSUP;
	}
	return 0;
}

/* --- residency map --------------------------------------------------------- */

static int map_create(struct fm_pager *p)
{
	p->map_len = FM_RESMAP_MAP_OFFSET + MAP_CAPACITY;
	p->map_fd = memfd_create("farmem-map", MFD_CLOEXEC);
	if (p->map_fd < 0)
		return -errno;
	if (ftruncate(p->map_fd, (off_t)p->map_len))
		return -errno;
	p->hdr = fm_sys_mmap(NULL, p->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p->map_fd, 0);
	if (p->hdr == MAP_FAILED) {
		p->hdr = NULL;
		return -errno;
	}
	p->map = (uint8_t *)p->hdr + FM_RESMAP_MAP_OFFSET;
	p->st = &p->hdr->stats;
	p->hdr->page_shift = PG_SHIFT;
	p->hdr->hdr_size = FM_RESMAP_MAP_OFFSET;
	p->hdr->pid = (uint64_t)getpid();
	p->hdr->epoch_churn_pct = p->cfg.epoch_pct;
	p->hdr->map_capacity = MAP_CAPACITY;
	{
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		p->hdr->start_time_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}
	/* Tools show the address; a longer one is cut, with its NUL kept. */
	{
		size_t n = strnlen(p->cfg.memd, sizeof(p->hdr->memd) - 1);
		memcpy(p->hdr->memd, p->cfg.memd, n);
		p->hdr->memd[n] = '\0';
	}
	p->hdr->version = FM_RESMAP_VERSION;
	/* Readers check the magic last written. */
	__atomic_store_n(&p->hdr->magic, FM_RESMAP_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/* Hand our map to the launcher that asked for it, so its summary survives our exit. */
static void report_to_launcher(struct fm_pager *p)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } cm;
	char line[64];
	struct iovec v;
	struct msghdr m = { 0 };
	struct cmsghdr *c;
	int fd;

	if (!p->cfg.control[0] || strlen(p->cfg.control) >= sizeof(sa.sun_path))
		return;
	strcpy(sa.sun_path, p->cfg.control);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		fm_warn("cannot reach the farmem launcher at %s: %s", p->cfg.control, strerror(errno));
		close(fd);
		return;
	}
	v.iov_base = line;
	v.iov_len = (size_t)snprintf(line, sizeof(line), "FMCTL1 pid=%d\n", getpid());
	m.msg_iov = &v;
	m.msg_iovlen = 1;
	m.msg_control = cm.buf;
	m.msg_controllen = sizeof(cm.buf);
	c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &p->map_fd, sizeof(int));
	if (sendmsg(fd, &m, MSG_NOSIGNAL) < 0)
		fm_warn("cannot report to the farmem launcher: %s", strerror(errno));
	close(fd);
}

/* --- accounting ------------------------------------------------------------ */

static void resident_changed(struct fm_pager *p, uint64_t now, int grew)
{
	uint64_t peak = __atomic_load_n(&p->st->peak_resident_pages, __ATOMIC_RELAXED);

	__atomic_store_n(&p->st->resident_pages, now, __ATOMIC_RELAXED);
	while (grew && now > peak &&
	       !__atomic_compare_exchange_n(&p->st->peak_resident_pages, &peak, now, 0,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	if (grew && now > atomic_load(&p->high))
		fm_evict_kick(p);
}

void fm_resident_add(struct fm_pager *p, int64_t delta)
{
	uint64_t now = atomic_fetch_add(&p->resident, (uint64_t)delta) + (uint64_t)delta;
	resident_changed(p, now, delta > 0);
}

/*
 * Reserve room for one more resident page if that keeps us at or under cap.
 * The check and the count are one compare-and-swap, so several handler
 * threads together still never pass the budget.
 */
static int try_reserve(struct fm_pager *p, uint64_t cap)
{
	uint_fast64_t cur = atomic_load(&p->resident);

	do {
		if (cur + 1 > cap)
			return 0;
	} while (!atomic_compare_exchange_weak(&p->resident, &cur, cur + 1));
	resident_changed(p, cur + 1, 1);
	return 1;
}

/* MemLiner's epoch: a new one once pages in + out since the last exceed epoch_pct of all pages. */
void fm_churn(struct fm_pager *p, uint64_t pages)
{
	uint64_t c = __atomic_add_fetch(&p->hdr->churn_pages, pages, __ATOMIC_RELAXED);
	uint64_t reg = atomic_load(&p->registered);

	if (reg && c * 100 >= reg * p->cfg.epoch_pct &&
	    __atomic_compare_exchange_n(&p->hdr->churn_pages, &c, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		__atomic_add_fetch(&p->hdr->swap_epoch, 1, __ATOMIC_RELEASE);
}

static void set_budget(struct fm_pager *p)
{
	uint64_t reg = atomic_load(&p->registered);
	uint64_t lim = p->cfg.local_bytes ? p->cfg.local_bytes / PG_SIZE
					  : reg * p->cfg.local_pct / 100;
	if (lim < MIN_LIMIT_PAGES)
		lim = MIN_LIMIT_PAGES;
	atomic_store(&p->limit, lim);
	atomic_store(&p->high, lim * p->cfg.evict_high / 100);
	atomic_store(&p->low, lim * p->cfg.evict_low / 100);
	/*
	 * With nothing registered (before the first mapping, after the last
	 * munmap) the gauges keep the budget that was in force: the summary is
	 * read after the program has exited and unmapped everything.
	 */
	if (reg) {
		__atomic_store_n(&p->st->local_limit_pages, lim, __ATOMIC_RELAXED);
		__atomic_store_n(&p->st->registered_pages, reg, __ATOMIC_RELAXED);
	}
}

/* --- regions --------------------------------------------------------------- */

/*
 * Caller holds rlock (read or write). A page given up by a partial unmap
 * stays in its old region as UNMANAGED; a new mapping at that address is a
 * region of its own, so the lookup passes over unmanaged pages.
 */
static struct region *find_region(struct fm_pager *p, uintptr_t addr, int *idx)
{
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		if (r->live && addr >= r->base && addr < r->end &&
		    fm_pg_state(pg_load(&r->pg[(addr - r->base) >> PG_SHIFT])) != FM_PG_UNMANAGED) {
			if (idx)
				*idx = i;
			return r;
		}
	}
	return NULL;
}

struct region *fm_find_region(struct fm_pager *p, uintptr_t addr, int *idx)
{
	return find_region(p, addr, idx);
}

int fm_pager_owns(struct fm_pager *p, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, e = a + len;
	int hit = 0;

	rlock_rd(p);
	for (int i = 0; i < p->nregions && !hit; i++) {
		struct region *r = &p->regions[i];
		hit = r->live && a < r->end && e > r->base;
	}
	rlock_un(p);
	return hit;
}

/* Mark the pages that are already present: they are resident and, for all we know, dirty. */
static uint64_t adopt_present(struct fm_pager *p, struct region *r)
{
	struct page_region vec[256];
	uint64_t n = 0, start = r->base;
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (pagemap < 0)
		return 0;
	while (start < r->end) {
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = start, .end = r->end,
			.vec = (uintptr_t)vec, .vec_len = 256,
			.category_mask = PAGE_IS_PRESENT, .return_mask = PAGE_IS_PRESENT,
		};
		long got = ioctl(pagemap, PAGEMAP_SCAN, &a);
		if (got < 0) {
			/*
			 * Before 6.7 there is no PAGEMAP_SCAN: ask mincore. Counting
			 * every page as present would make the evictor copy out pages
			 * never touched, and fault on them itself (a deadlock).
			 */
			for (uint64_t i = (start - r->base) >> PG_SHIFT; i < r->npages; i += 4096) {
				unsigned char vv[4096];
				uint64_t m = r->npages - i < 4096 ? r->npages - i : 4096;
				int ok = mincore((void *)(r->base + (i << PG_SHIFT)), m << PG_SHIFT, vv) == 0;
				for (uint64_t j = 0; j < m; j++) {
					if (ok && !(vv[j] & 1))
						continue;
					pg_store(&r->pg[i + j], pg_make(FM_PG_DIRTY, FM_PGF_REF));
					n++;
				}
			}
			break;
		}
		for (long i = 0; i < got; i++)
			for (uint64_t a2 = vec[i].start; a2 < vec[i].end; a2 += PG_SIZE) {
				pg_store(&r->pg[(a2 - r->base) >> PG_SHIFT], pg_make(FM_PG_DIRTY, FM_PGF_REF));
				n++;
			}
		if (a.walk_end <= start)
			break;
		start = a.walk_end;
	}
	close(pagemap);
	return n;
}

int fm_pager_register(struct fm_pager *p, void *addr, size_t len, uint32_t flags)
{
	uintptr_t a = (uintptr_t)addr;
	struct uffdio_register reg = {
		.range = { .start = a, .len = len },
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
	};
	struct region *r = NULL;
	uint64_t npages = len >> PG_SHIFT, present;
	uint32_t space;
	int slot = -1, rc;

	if (!len || (a | len) & (PG_SIZE - 1))
		return -EINVAL;
	if (flags & FM_REG_SHMEM) {
		if (!p->shmem_ok) {
			fm_warn("cannot page the shared-memory mapping %p+%zu MiB: this kernel's userfaultfd lacks "
				"minor faults or write-protection on shmem (5.19+ has both); run `farmem doctor`",
				addr, len >> 20);
			return -ENOTSUP;
		}
		reg.mode |= UFFDIO_REGISTER_MODE_MINOR;
	}
	rlock_wr(p);
	for (int i = 0; i < FM_RESMAP_MAX_REGIONS; i++)
		if (!p->regions[i].live && !p->hdr->regions[i].flags) {
			slot = i;
			break;
		}
	if (slot < 0 || p->hdr->map_used + npages > p->hdr->map_capacity) {
		rlock_un(p);
		fm_warn("cannot page %zu more bytes at %p: region table full", len, addr);
		return -ENOSPC;
	}
	rc = fm_xport_space_open(p->x, npages, &space);
	if (rc) {
		rlock_un(p);
		fm_warn("memd refused a space of %llu pages: %s", (unsigned long long)npages, strerror(-rc));
		return rc;
	}
	/* Page-table entries per 4 KiB: keep the kernel from making huge pages we then split. */
	fm_sys_madvise(addr, len, MADV_NOHUGEPAGE);
	r = &p->regions[slot];
	*r = (struct region){
		.base = a, .end = a + len, .npages = npages, .space = space, .slot = slot,
		.pg = p->map + p->hdr->map_used,
	};
	/* Before UFFDIO_REGISTER: a mapping made from a registered one would inherit its uffd. */
	if ((flags & FM_REG_SHMEM) && (rc = fm_shmem_alias(r))) {
		rlock_un(p);
		fm_xport_space_close(p->x, space);
		fm_warn("cannot map the shared-memory range %p+%zu MiB a second time: %s", addr, len >> 20,
			strerror(-rc));
		return rc;
	}
	if (ioctl(p->uffd, UFFDIO_REGISTER, &reg)) {
		rc = -errno;
		fm_shmem_release(r);
		rlock_un(p);
		fm_xport_space_close(p->x, space);
		fm_warn("UFFDIO_REGISTER of %p+%zu failed: %s", addr, len, strerror(-rc));
		return rc;
	}
	if (!(reg.ioctls & (1ull << _UFFDIO_COPY)) || !(reg.ioctls & (1ull << _UFFDIO_WRITEPROTECT)) ||
	    ((flags & FM_REG_SHMEM) && !(reg.ioctls & (1ull << _UFFDIO_CONTINUE)))) {
		struct uffdio_range ur = { .start = a, .len = len };
		ioctl(p->uffd, UFFDIO_UNREGISTER, &ur);
		fm_shmem_release(r);
		rlock_un(p);
		fm_xport_space_close(p->x, space);
		fm_warn("%p+%zu cannot be paged (no copy, continue or write-protect on this mapping)", addr, len);
		return -ENOTSUP;
	}
	memset(r->pg, 0, npages);
	present = adopt_present(p, r);
	if (r->alias)
		present += fm_shmem_adopt(p, r);
	p->hdr->regions[slot] = (struct fm_resmap_region){
		.base = a, .npages = npages, .map_offset = FM_RESMAP_MAP_OFFSET + p->hdr->map_used,
		.space_id = space,
		.flags = 1u /* FM_REGION_F_LIVE */ | (flags & (FM_REG_HEAP | FM_REG_SHMEM)),
	};
	p->hdr->map_used += (npages + 63) & ~63ull;
	if (slot >= p->nregions)
		p->nregions = slot + 1;
	__atomic_store_n(&p->hdr->nregions, (uint32_t)p->nregions, __ATOMIC_RELEASE);
	r->live = 1;
	atomic_fetch_add(&p->registered, npages);
	set_budget(p);
	rlock_un(p);
	fm_resident_add(p, (int64_t)present);
	fm_info("paging %p+%zu MiB (%llu pages present), budget %llu pages",
		addr, len >> 20, (unsigned long long)present, (unsigned long long)atomic_load(&p->limit));
	return 0;
}

/* Wait out a page's transitional states, then move it to UNTOUCHED. Returns the state it left. */
static unsigned forget_page(struct region *r, uint64_t i, uint8_t *flags_out)
{
	for (;;) {
		uint8_t b = pg_load(&r->pg[i]);
		unsigned s = fm_pg_state(b);
		if (s == FM_PG_FILLING || s == FM_PG_LEAVING || s == FM_PG_UPDATING) {
			sched_yield();
			continue;
		}
		if (s == FM_PG_UNMANAGED) {
			*flags_out = b;
			return s;
		}
		if (pg_cas(&r->pg[i], &b, pg_make(FM_PG_UNTOUCHED, 0))) {
			*flags_out = b;
			return s;
		}
	}
}

/* Forget pages [first, first+n) of r: local copies are the caller's to drop, remote ones die. */
static void forget_pages(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n)
{
	struct fm_range rg[64];
	unsigned nr = 0;
	int64_t res = 0;

	for (uint64_t i = first; i < first + n; i++) {
		uint8_t old;
		unsigned s = forget_page(r, i, &old);
		if (fm_pg_is_resident(pg_make(s, 0)))
			res--;
		if (old & FM_PGF_HAS_REMOTE) {
			if (nr && rg[nr - 1].first + rg[nr - 1].npages == i) {
				rg[nr - 1].npages++;
			} else {
				if (nr == 64) {
					pthread_mutex_lock(&p->misc_lock);
					fm_chan_discard(p->misc_chan, r->space, rg, nr);
					pthread_mutex_unlock(&p->misc_lock);
					nr = 0;
				}
				rg[nr++] = (struct fm_range){ .first = i, .npages = 1 };
			}
		}
	}
	if (nr) {
		pthread_mutex_lock(&p->misc_lock);
		fm_chan_discard(p->misc_chan, r->space, rg, nr);
		pthread_mutex_unlock(&p->misc_lock);
	}
	STAT_ADD(p, discards, (uint64_t)-res);
	if (res)
		fm_resident_add(p, res);
}

int fm_pager_forget(struct fm_pager *p, void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1), e = (uintptr_t)addr + len;

	rlock_rd(p);
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		uintptr_t s, t;
		if (!r->live || a >= r->end || e <= r->base)
			continue;
		s = a > r->base ? a : r->base;
		t = e < r->end ? e : r->end;
		/* Only whole pages are dropped by madvise. */
		t &= ~(uintptr_t)(PG_SIZE - 1);
		if (t > s)
			forget_pages(p, r, (s - r->base) >> PG_SHIFT, (t - s) >> PG_SHIFT);
	}
	rlock_un(p);
	return 0;
}

/* Send the ranges of remote copies that died to memd, in one call per 64 ranges. */
static void discard_remote(struct fm_pager *p, struct region *r, struct fm_range *rg, unsigned *nr,
			   uint64_t i)
{
	if (*nr && rg[*nr - 1].first + rg[*nr - 1].npages == i) {
		rg[*nr - 1].npages++;
		return;
	}
	if (*nr == 64) {
		pthread_mutex_lock(&p->misc_lock);
		fm_chan_discard(p->misc_chan, r->space, rg, *nr);
		pthread_mutex_unlock(&p->misc_lock);
		*nr = 0;
	}
	rg[(*nr)++] = (struct fm_range){ .first = i, .npages = 1 };
}

/* Drop pages [run, end) of r that discard claimed: no write-back, the next touch is a zero-fill. */
static void drop_run(struct fm_pager *p, struct region *r, uint64_t run, uint64_t end)
{
	if (r->alias)
		fm_shmem_drop(r, r->base + (run << PG_SHIFT), (size_t)(end - run) << PG_SHIFT);
	else if (fm_sys_madvise((void *)(r->base + (run << PG_SHIFT)), (size_t)(end - run) << PG_SHIFT, MADV_DONTNEED))
		fm_fatal("madvise(DONTNEED) for a discard failed: %s", strerror(errno));
	for (uint64_t j = run; j < end; j++)
		pg_store(&r->pg[j], pg_make(FM_PG_UNTOUCHED, 0));
	fm_resident_add(p, -(int64_t)(end - run));
}

long fm_pager_discard(struct fm_pager *p, void *addr, size_t len)
{
	uintptr_t a = ((uintptr_t)addr + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len) & ~(uintptr_t)(PG_SIZE - 1);
	long affected = 0;

	if (e <= a)
		return 0;
	rlock_rd(p);
	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		struct fm_range rg[64];
		unsigned nr = 0;
		uint64_t first, last, run = UINT64_MAX;
		if (!r->live || a >= r->end || e <= r->base)
			continue;
		first = ((a > r->base ? a : r->base) - r->base) >> PG_SHIFT;
		last = ((e < r->end ? e : r->end) - r->base) >> PG_SHIFT;
		for (uint64_t i = first; i < last; i++) {
			int claimed = 0;
			for (;;) {
				uint8_t b = pg_load(&r->pg[i]), nb;
				unsigned st = fm_pg_state(b);
				if (st == FM_PG_FILLING || st == FM_PG_LEAVING || st == FM_PG_UPDATING) {
					sched_yield(); /* the evictor or a handler finishes it first */
					continue;
				}
				if (st == FM_PG_REMOTE)
					nb = pg_make(FM_PG_UNTOUCHED, 0); /* the next touch is a zero-fill */
				else if (st == FM_PG_CLEAN || st == FM_PG_DIRTY)
					nb = pg_make(FM_PG_LEAVING, b); /* ours until its run is dropped */
				else
					break;
				if (!pg_cas(&r->pg[i], &b, nb))
					continue;
				/* The page is ours now: only now may its remote copy die. */
				if (b & FM_PGF_HAS_REMOTE)
					discard_remote(p, r, rg, &nr, i);
				claimed = st != FM_PG_REMOTE;
				affected++;
				break;
			}
			if (!claimed && run != UINT64_MAX) {
				drop_run(p, r, run, i);
				run = UINT64_MAX;
			} else if (claimed && run == UINT64_MAX) {
				run = i;
			}
		}
		if (run != UINT64_MAX)
			drop_run(p, r, run, last);
		if (nr) {
			pthread_mutex_lock(&p->misc_lock);
			fm_chan_discard(p->misc_chan, r->space, rg, nr);
			pthread_mutex_unlock(&p->misc_lock);
		}
	}
	rlock_un(p);
	STAT_ADD(p, discards, (uint64_t)affected);
	/* A fault on a dropped page may have been queued behind our LEAVING: release it. */
	fm_wake_waiters(p);
	return affected;
}

int fm_pager_unregister(struct fm_pager *p, void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);

	rlock_wr(p);
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		struct uffdio_range ur;
		uintptr_t s, t;
		if (!r->live || a >= r->end || e <= r->base)
			continue;
		s = a > r->base ? a : r->base;
		t = e < r->end ? e : r->end;
		forget_pages(p, r, (s - r->base) >> PG_SHIFT, (t - s) >> PG_SHIFT);
		ur = (struct uffdio_range){ .start = s, .len = t - s };
		if (ioctl(p->uffd, UFFDIO_UNREGISTER, &ur))
			fm_warn("UFFDIO_UNREGISTER of %#lx+%lu failed: %s", (unsigned long)s,
				(unsigned long)(t - s), strerror(errno));
		if (s == r->base && t == r->end) {
			fm_xport_space_close(p->x, r->space);
			fm_shmem_release(r);
			atomic_fetch_sub(&p->registered, r->npages);
			r->live = 0;
			p->hdr->regions[i].flags = 0;
		} else {
			for (uintptr_t q = s; q < t; q += PG_SIZE)
				pg_store(&r->pg[(q - r->base) >> PG_SHIFT], pg_make(FM_PG_UNMANAGED, 0));
		}
	}
	set_budget(p);
	rlock_un(p);
	return 0;
}

/* --- faults ----------------------------------------------------------------- */

static int is_gc(struct fm_pager *p, pid_t tid)
{
	return p->cfg.is_gc_thread && tid > 0 && p->cfg.is_gc_thread(tid);
}

int fm_is_gc(struct fm_pager *p, pid_t tid)
{
	return is_gc(p, tid);
}

/*
 * Queue the fault at addr (page i of r) until the eviction holding the page
 * LEAVING is over. 0 when the page left LEAVING meanwhile or the queue cannot
 * grow: the caller looks again.
 */
int fm_queue_waiter(struct fm_pager *p, struct region *r, uint64_t i, uintptr_t addr)
{
	int queued = 0;

	pthread_mutex_lock(&p->wait_lock);
	if (fm_pg_state(pg_load(&r->pg[i])) == FM_PG_LEAVING) {
		if (p->nwaiters == p->waiters_cap) {
			size_t cap = p->waiters_cap ? p->waiters_cap * 2 : 64;
			uintptr_t *w = realloc(p->waiters, cap * sizeof(*w));
			if (w) {
				p->waiters = w;
				p->waiters_cap = cap;
			}
		}
		if (p->nwaiters < p->waiters_cap) {
			p->waiters[p->nwaiters++] = addr;
			queued = 1;
		}
	}
	pthread_mutex_unlock(&p->wait_lock);
	return queued;
}

/* Fetch page i of r from memd into *src; dies if memd lost it. */
static const void *fetch_one(struct fm_pager *p, struct fm_chan *chan, struct region *r, uint64_t i)
{
	const void *src;
	int rc = fm_chan_read(chan, r->space, &i, 1, &src);

	if (rc) {
		STAT_ADD(p, transport_errors, 1);
		if (rc == -EIO)
			STAT_ADD(p, crc_errors, 1);
		fm_fatal("page %#lx is in memd but cannot be read back (%s%s)",
			 (unsigned long)(r->base + (i << PG_SHIFT)), strerror(-rc),
			 rc == -EIO ? ": checksum mismatch" : "");
	}
	STAT_ADD(p, remote_reads, 1);
	STAT_ADD(p, remote_read_bytes, PG_SIZE);
	return src;
}

/*
 * Reserve room for a fill: at the limit the handler evicts a batch itself
 * first. Only when nothing can be evicted (memd unusable, or every page busy)
 * does the page come in over the budget.
 */
static void reserve_room(struct fm_pager *p, struct fm_chan *chan)
{
	while (!try_reserve(p, atomic_load(&p->limit))) {
		unsigned n = atomic_load(&p->evict_broken) ? 0 : fm_evict_batch(p, chan, 64);
		STAT_ADD(p, direct_evictions, n);
		if (!n) {
			fm_resident_add(p, 1);
			return;
		}
	}
}

static void prefetch(struct fm_pager *p, struct fm_chan *chan, int ridx, struct region *r,
		     uint64_t idx, pid_t tid, int write, int zero_only);

static void handle_missing(struct fm_pager *p, struct handler *h, uintptr_t addr, int write, pid_t tid,
			   uint64_t t_event)
{
	struct region *r;
	int ridx;
	uint64_t i;
	uint8_t b;

	rlock_rd(p);
	r = find_region(p, addr, &ridx);
	if (!r) {
		/* Unregistered while the fault was queued: it retries on plain memory. */
		rlock_un(p);
		fm_wake_range(p, addr & ~(uintptr_t)(PG_SIZE - 1), PG_SIZE);
		return;
	}
	i = (addr - r->base) >> PG_SHIFT;
	addr = r->base + (i << PG_SHIFT);
	for (;;) {
		unsigned s;
		b = pg_load(&r->pg[i]);
		s = fm_pg_state(b);
		if (s == FM_PG_UNTOUCHED || s == FM_PG_REMOTE) {
			const void *src;
			int gc = is_gc(p, tid), rc;
			uint64_t t_xport = 0, t_copy;
			uint8_t fl;

			reserve_room(p, h->chan);
			if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_FILLING, b))) {
				fm_resident_add(p, -1);
				continue;
			}
			if (s == FM_PG_UNTOUCHED) {
				src = p->zero;
				STAT_ADD(p, zero_fills, 1);
			} else {
				t_xport = fm_now_ns();
				src = fetch_one(p, h->chan, r, i);
				t_xport = fm_now_ns() - t_xport;
				fm_churn(p, 1);
			}
			/*
			 * A read installs the page write-protected: it stays clean
			 * (no write-back) until a write fault tells us otherwise.
			 */
			t_copy = fm_now_ns();
			rc = uffd_copy(p, addr, src, !write);
			if (rc == -EAGAIN) {
				/*
				 * An unmap or remap of a registered range is under way
				 * (behind the shim's back). Nothing was installed: the page
				 * goes back as it was, and its thread faults again once the
				 * event has been read, into whatever is mapped there then.
				 */
				pg_store(&r->pg[i], b);
				fm_resident_add(p, -1);
				fm_wake_range(p, addr, PG_SIZE);
				break;
			}
			if (rc && rc != -EEXIST)
				fm_fatal("UFFDIO_COPY at %#lx failed: %s", (unsigned long)addr, strerror(-rc));
			if (s == FM_PG_REMOTE) {
				uint64_t t_end = fm_now_ns();
				STAT_ADD(p, split_faults, 1);
				STAT_ADD(p, split_handler_ns, t_end - t_event);
				STAT_ADD(p, split_transport_ns, t_xport);
				STAT_ADD(p, split_copy_ns, t_end - t_copy);
			}
			fl = (uint8_t)((b & FM_PGF_HAS_REMOTE) | (gc ? FM_PGF_GC : FM_PGF_REF));
			if (write)
				fl &= (uint8_t)~FM_PGF_GC;
			pg_store(&r->pg[i], pg_make(write ? FM_PG_DIRTY : FM_PG_CLEAN, fl));
			STAT_ADD(p, faults, 1);
			if (!gc) {
				STAT_ADD(p, app_faults, 1);
			} else {
				STAT_ADD(p, gc_faults, 1);
				if (s == FM_PG_UNTOUCHED)
					STAT_ADD(p, gc_zero_fills, 1);
			}
			/*
			 * GC threads get zero runs only: their copying into fresh
			 * regions is sequential, while fetching remote pages ahead of
			 * their tracing evicts what the program is using (MemLiner §1.3).
			 */
			if (p->cfg.prefetch)
				prefetch(p, h->chan, ridx, r, i, tid, write, gc);
			break;
		}
		if (s == FM_PG_LEAVING) {
			/* The evictor dropped it and has not said so yet: wait for it. */
			if (fm_queue_waiter(p, r, i, addr))
				break;
			if (fm_pg_state(pg_load(&r->pg[i])) == FM_PG_LEAVING)
				sched_yield();
			continue;
		}
		if (s == FM_PG_FILLING) {
			/* Another handler's copy wakes every thread waiting on this page. */
			break;
		}
		if (s == FM_PG_UNMANAGED) {
			fm_wake_range(p, addr, PG_SIZE);
			break;
		}
		if (s == FM_PG_UPDATING) {
			sched_yield(); /* another handler holds it; its state is only ours to read after */
			continue;
		}
		/*
		 * Resident by our books. Either this is a stale message (the page
		 * was filled after the fault was queued) or the program dropped
		 * it behind our back, which for private anonymous memory means
		 * zeros. A zero copy tells the two apart: EEXIST for the first.
		 * The page is held (UPDATING) across the copy: unheld, the
		 * evictor could drop it between our look and the copy, which
		 * would then map zeros, writable, over a page memd holds while
		 * the books say REMOTE (a later write there is never written
		 * back, a later read gets zeros or memd's older bytes).
		 */
		if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_UPDATING, b)))
			continue;
		{
			int rc = uffd_copy(p, addr, p->zero, 0);
			if (rc == -EEXIST || rc == -EAGAIN) { /* EAGAIN: see above */
				pg_store(&r->pg[i], b);
				fm_wake_range(p, addr, PG_SIZE);
			} else if (rc == 0) {
				pg_store(&r->pg[i], pg_make(FM_PG_DIRTY, FM_PGF_REF));
				STAT_ADD(p, zero_fills, 1);
			} else {
				fm_fatal("UFFDIO_COPY at %#lx failed: %s", (unsigned long)addr, strerror(-rc));
			}
		}
		break;
	}
	rlock_un(p);
}

static void handle_wp(struct fm_pager *p, uintptr_t addr, pid_t tid)
{
	struct region *r;
	uint64_t i;

	rlock_rd(p);
	r = find_region(p, addr, NULL);
	if (!r) {
		rlock_un(p);
		fm_wp_range(p, addr & ~(uintptr_t)(PG_SIZE - 1), PG_SIZE, 0);
		return;
	}
	i = (addr - r->base) >> PG_SHIFT;
	addr = r->base + (i << PG_SHIFT);
	for (;;) {
		uint8_t b = pg_load(&r->pg[i]);
		unsigned s = fm_pg_state(b);
		if (s == FM_PG_CLEAN) {
			uint8_t fl = (uint8_t)((b | FM_PGF_REF) & ~FM_PGF_PREFETCH);
			if (!is_gc(p, tid))
				fl &= (uint8_t)~FM_PGF_GC;
			if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_UPDATING, fl)))
				continue;
			if (b & FM_PGF_PREFETCH)
				STAT_ADD(p, prefetch_used, 1);
			/* Unprotect before DIRTY is visible: the evictor must not protect a page we then open. */
			if (fm_wp_range(p, addr, PG_SIZE, 0))
				fm_fatal("UFFDIO_WRITEPROTECT at %#lx failed: %s", (unsigned long)addr, strerror(errno));
			pg_store(&r->pg[i], pg_make(FM_PG_DIRTY, fl));
			STAT_ADD(p, wp_faults, 1);
			break;
		}
		if (s == FM_PG_LEAVING) {
			int queued = 0;
			pthread_mutex_lock(&p->wait_lock);
			if (fm_pg_state(pg_load(&r->pg[i])) == FM_PG_LEAVING &&
			    p->nwaiters < p->waiters_cap) {
				p->waiters[p->nwaiters++] = addr;
				queued = 1;
			}
			pthread_mutex_unlock(&p->wait_lock);
			if (queued)
				break;
			sched_yield();
			continue;
		}
		if (s == FM_PG_UPDATING || s == FM_PG_FILLING) {
			sched_yield();
			continue;
		}
		/*
		 * DIRTY: another handler opened it already. UNTOUCHED/UNMANAGED:
		 * the program is freeing it. REMOTE: stale, it refaults as missing.
		 * Unprotecting wakes the writer in every case.
		 */
		if (s == FM_PG_REMOTE) {
			fm_wake_range(p, addr, PG_SIZE);
			break;
		}
		if (s == FM_PG_UNMANAGED) {
			fm_wp_range(p, addr, PG_SIZE, 0);
			break;
		}
		/*
		 * The message is stale, so the page is held while it is opened:
		 * unheld, the evictor could write-protect a DIRTY page and copy it
		 * out between our look and the unprotect (the writer's bytes then
		 * land after the copy and are punched or dropped with the page), or
		 * an UNTOUCHED page could be filled write-protected and CLEAN
		 * meanwhile (opened, it takes writes a clean eviction throws away).
		 * A fault that meets the hold is woken after it.
		 */
		if (!pg_cas(&r->pg[i], &b, pg_make(s == FM_PG_DIRTY ? FM_PG_UPDATING : FM_PG_FILLING, b)))
			continue;
		fm_wp_range(p, addr, PG_SIZE, 0);
		pg_store(&r->pg[i], b);
		fm_wake_range(p, addr, PG_SIZE);
		break;
	}
	rlock_un(p);
}

/*
 * Install pages [j0, j0+n) of r from one contiguous source with a single
 * UFFDIO_COPY. The kernel stops at the first page that is there already
 * (EEXIST for the first, a short copy and EAGAIN for a later one): the rest
 * go one by one. Sets bit k of *there for each page k that was there: its
 * bytes are not ours, so the caller must not book it as the copy we made.
 */
static void copy_run(struct fm_pager *p, struct region *r, uint64_t j0, unsigned n, const void *src, int wp,
		     uint64_t *there)
{
	struct uffdio_copy c = {
		.dst = r->base + (j0 << PG_SHIFT), .src = (uintptr_t)src,
		.len = (uint64_t)n << PG_SHIFT, .mode = wp ? UFFDIO_COPY_MODE_WP : 0,
	};
	unsigned done;

	*there = 0;
	if (ioctl(p->uffd, UFFDIO_COPY, &c) == 0)
		return;
	if (errno != EEXIST && errno != EAGAIN)
		fm_fatal("UFFDIO_COPY of %u pages at %#llx failed: %s", n,
			 (unsigned long long)c.dst, strerror(errno));
	done = c.copy > 0 ? (unsigned)((uint64_t)c.copy >> PG_SHIFT) : 0;
	for (unsigned k = done; k < n; k++) {
		int rc = uffd_copy(p, c.dst + ((uint64_t)k << PG_SHIFT), (const uint8_t *)src + ((size_t)k << PG_SHIFT), wp);
		/* EAGAIN: an unmap of a registered range is under way; the page is not ours either. */
		if (rc == -EEXIST || rc == -EAGAIN) {
			*there |= 1ull << k;
			fm_wake_range(p, c.dst + ((uint64_t)k << PG_SHIFT), PG_SIZE);
		} else if (rc) {
			fm_fatal("UFFDIO_COPY at %#llx failed: %s",
				 (unsigned long long)(c.dst + ((uint64_t)k << PG_SHIFT)), strerror(-rc));
		}
	}
}

/* Pages a stream ran through without faulting were used: clear their marks, count them. */
static unsigned count_used(struct region *r, uint64_t first, int64_t stride, unsigned n)
{
	unsigned used = 0;
	for (unsigned k = 0; k < n; k++) {
		int64_t j = (int64_t)first + stride * (int64_t)k;
		uint8_t b;
		if (j < 0 || (uint64_t)j >= r->npages)
			break;
		b = pg_load(&r->pg[j]);
		while ((b & FM_PGF_PREFETCH) && fm_pg_is_resident(b) &&
		       !pg_cas(&r->pg[j], &b, (uint8_t)(b & ~FM_PGF_PREFETCH)))
			;
		if ((b & FM_PGF_PREFETCH) && fm_pg_is_resident(b))
			used++;
	}
	return used;
}

/*
 * Sequential and strided runs per faulting thread: after two faults with
 * the same stride, fetch the next `prefetch` pages along it. Remote pages
 * come in one batched read and go in write-protected (clean); pages never
 * written go in as zeros, writable, since a stream that touches fresh memory
 * writes it. Contiguous pages share one UFFDIO_COPY.
 */
static void prefetch(struct fm_pager *p, struct fm_chan *chan, int ridx, struct region *r,
		     uint64_t idx, pid_t tid, int write, int zero_only)
{
	struct stream *s;
	uint64_t want[64], remote[64];
	unsigned nw = 0, nr = 0, used = 0, got = 0, zeros = 0;
	int64_t stride;
	const void *src[64];

	pthread_mutex_lock(&p->stream_lock);
	s = &p->streams[(unsigned)tid % NSTREAMS];
	if (s->tid != tid || s->region != ridx) {
		*s = (struct stream){ .tid = tid, .region = ridx, .last = idx };
		pthread_mutex_unlock(&p->stream_lock);
		return;
	}
	stride = (int64_t)idx - (int64_t)s->last;
	if (s->pf_count && idx == s->pf_next)
		used = count_used(r, s->pf_next - (uint64_t)((int64_t)s->pf_count * s->stride),
				  s->stride, s->pf_count);
	s->pf_count = 0;
	if (stride != 0 && stride == s->stride && stride >= -16 && stride <= 16)
		s->hits++;
	else
		s->hits = 0;
	s->stride = stride;
	s->last = idx;
	if (s->hits >= 1) {
		for (unsigned k = 1; k <= p->cfg.prefetch && nw < 64; k++) {
			int64_t j = (int64_t)idx + stride * (int64_t)k;
			if (j < 0 || (uint64_t)j >= r->npages)
				break;
			want[nw++] = (uint64_t)j;
		}
	}
	pthread_mutex_unlock(&p->stream_lock);
	if (used)
		STAT_ADD(p, prefetch_used, used);
	if (!nw)
		return;

	/* Claim the pages that are not resident, stopping at the first that is. */
	for (unsigned k = 0; k < nw; k++) {
		uint8_t b = pg_load(&r->pg[want[k]]);
		unsigned st = fm_pg_state(b);
		if ((st != FM_PG_REMOTE && st != FM_PG_UNTOUCHED) || (zero_only && st == FM_PG_REMOTE) ||
		    !try_reserve(p, atomic_load(&p->high))) {
			nw = k;
			break;
		}
		if (!pg_cas(&r->pg[want[k]], &b, pg_make(FM_PG_FILLING, b))) {
			fm_resident_add(p, -1);
			nw = k;
			break;
		}
		if (st == FM_PG_REMOTE)
			remote[nr++] = want[k];
	}
	if (!nw)
		return;
	if (nr) {
		int rc = fm_chan_read(chan, r->space, remote, nr, src);
		if (rc)
			fm_fatal("prefetch of %u pages from memd failed: %s", nr, strerror(-rc));
		STAT_ADD(p, remote_reads, nr);
		STAT_ADD(p, remote_read_bytes, (uint64_t)nr * PG_SIZE);
		fm_churn(p, nr);
	}
	for (unsigned k = 0, ri = 0; k < nw;) {
		/* A run: consecutive pages of one kind whose sources are consecutive too. */
		int is_remote = ri < nr && remote[ri] == want[k];
		const uint8_t *from = is_remote ? src[ri] : p->zero_run;
		unsigned n = 1;
		uint64_t there;
		while (k + n < nw && want[k + n] == want[k] + n &&
		       (is_remote ? (ri + n < nr && remote[ri + n] == want[k + n] &&
				     (const uint8_t *)src[ri + n] == from + ((size_t)n << PG_SHIFT))
				  : (fm_pg_state(pg_load(&r->pg[want[k + n]])) == FM_PG_FILLING &&
				     !(pg_load(&r->pg[want[k + n]]) & FM_PGF_HAS_REMOTE) &&
				     !(ri < nr && remote[ri] == want[k + n]) && n < ZERO_RUN_PAGES)))
			n++;
		copy_run(p, r, want[k], n, from, is_remote || !write, &there);
		for (unsigned q = 0; q < n; q++) {
			uint64_t j = want[k + q];
			uint8_t b = pg_load(&r->pg[j]);
			/*
			 * A page that was there already holds bytes we did not put
			 * there: booking it as our copy (CLEAN) would let a clean
			 * eviction throw them away. It goes back as it was; its own
			 * fault sorts it out (a shmem page in the file raises a minor
			 * fault, which adopts or punches it).
			 */
			if (there & (1ull << q)) {
				pg_store(&r->pg[j], pg_make(is_remote ? FM_PG_REMOTE : FM_PG_UNTOUCHED, b));
				fm_resident_add(p, -1);
			} else
				pg_store(&r->pg[j], is_remote
				 ? pg_make(FM_PG_CLEAN, (uint8_t)((b & FM_PGF_HAS_REMOTE) | FM_PGF_PREFETCH | FM_PGF_REF))
				 : pg_make(write ? FM_PG_DIRTY : FM_PG_CLEAN, FM_PGF_REF));
		}
		if (is_remote) {
			got += n;
			ri += n;
		} else {
			zeros += n;
		}
		k += n;
	}
	if (got)
		STAT_ADD(p, prefetch_issued, got);
	if (zeros)
		STAT_ADD(p, zero_fills, zeros);
	pthread_mutex_lock(&p->stream_lock);
	if (s->tid == tid) {
		s->pf_count = nw;
		s->pf_next = (uint64_t)((int64_t)idx + stride * (int64_t)(nw + 1));
	}
	pthread_mutex_unlock(&p->stream_lock);
}

/* The program unmapped part of a region without telling us (munmap through a raw syscall). */
static void handle_unmap(struct fm_pager *p, uintptr_t start, uintptr_t end)
{
	rlock_rd(p);
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		uintptr_t s, t;
		if (!r->live || start >= r->end || end <= r->base)
			continue;
		s = start > r->base ? start : r->base;
		t = end < r->end ? end : r->end;
		forget_pages(p, r, (s - r->base) >> PG_SHIFT, (t - s) >> PG_SHIFT);
		for (uintptr_t q = s; q < t; q += PG_SIZE)
			pg_store(&r->pg[(q - r->base) >> PG_SHIFT], pg_make(FM_PG_UNMANAGED, 0));
	}
	rlock_un(p);
}

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct fm_pager *p = h->p;
	struct uffd_msg msgs[MSGS_PER_READ];
	char name[16];

	snprintf(name, sizeof(name), "farmem-fault%d", h->idx);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		ssize_t n = read(p->uffd, msgs, sizeof(msgs));
		uint64_t t0;
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			fm_fatal("reading userfaultfd failed: %s", strerror(errno));
		}
		t0 = fm_now_ns();
		for (ssize_t k = 0; k < n / (ssize_t)sizeof(msgs[0]); k++) {
			struct uffd_msg *m = &msgs[k];
			/* An event queued behind others in this read waited for them: that is delivery, not handling. */
			uint64_t t_event = k ? fm_now_ns() : t0;
			switch (m->event) {
			case UFFD_EVENT_PAGEFAULT: {
				uintptr_t a = (uintptr_t)m->arg.pagefault.address;
				uint64_t fl = m->arg.pagefault.flags;
				pid_t tid = (pid_t)m->arg.pagefault.feat.ptid;
				if (a >= (uintptr_t)p->doorbell &&
				    a < (uintptr_t)p->doorbell + (size_t)MAX_HANDLERS * PG_SIZE) {
					struct uffdio_zeropage z = {
						.range = { .start = a & ~(uintptr_t)(PG_SIZE - 1), .len = PG_SIZE } };
					ioctl(p->uffd, UFFDIO_ZEROPAGE, &z);
					if (atomic_load(&p->stopping))
						return NULL;
					break;
				}
				if (fl & UFFD_PAGEFAULT_FLAG_WP)
					handle_wp(p, a, tid);
				else if (fl & UFFD_PAGEFAULT_FLAG_MINOR)
					fm_shmem_minor(p, a, !!(fl & UFFD_PAGEFAULT_FLAG_WRITE), tid);
				else
					handle_missing(p, h, a, !!(fl & UFFD_PAGEFAULT_FLAG_WRITE), tid, t_event);
				__atomic_fetch_add(&p->st->lat_hist[fm_lat_bucket(fm_now_ns() - t0)], 1,
						   __ATOMIC_RELAXED);
				break;
			}
			case UFFD_EVENT_UNMAP:
				handle_unmap(p, (uintptr_t)m->arg.remove.start, (uintptr_t)m->arg.remove.end);
				break;
			case UFFD_EVENT_REMAP:
				/*
				 * mremap of a paged range behind the shim's back: the
				 * pages now live at an address we do not track, so
				 * remote pages there could never come back right.
				 */
				fm_fatal("a paged range at %#llx was moved with mremap outside farmem's control",
					 (unsigned long long)m->arg.remap.from);
			default:
				fm_warn("ignoring userfaultfd event %u", m->event);
			}
		}
	}
	return NULL;
}

/* --- start and stop ---------------------------------------------------------- */

int fm_pager_start(const struct fm_pager_cfg *cfg, struct fm_pager **out, char *err, size_t errlen)
{
	struct fm_xport_cfg xc = {
		.addr = cfg->memd, .secret = cfg->secret, .secret_len = cfg->secret_len,
		.pref = cfg->xport_pref,
		.replicas = (int)cfg->replicas, .timeout_ms = (int)cfg->memd_timeout_ms, /* issue 8 */
	};
	struct fm_pager *p;
	struct uffdio_register reg;
	int rc;

	if (!cfg->memd[0]) {
		snprintf(err, errlen, "no memd address (FARMEM_MEMD or memd=)");
		return -EINVAL;
	}
	if (!cfg->secret_len) {
		snprintf(err, errlen, "no memd secret (FARMEM_SECRET or secret=)");
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->uffd = p->pidfd = p->map_fd = -1;
	fm_log_level = cfg->log_level;
	pthread_rwlock_init(&p->rlock, NULL);
	pthread_mutex_init(&p->ev_lock, NULL);
	pthread_cond_init(&p->ev_cond, NULL);
	pthread_mutex_init(&p->clock_lock, NULL);
	pthread_mutex_init(&p->wait_lock, NULL);
	pthread_mutex_init(&p->misc_lock, NULL);
	pthread_mutex_init(&p->stream_lock, NULL);
	p->waiters_cap = 256;
	p->waiters = calloc(p->waiters_cap, sizeof(*p->waiters));
	p->zero = aligned_alloc(PG_SIZE, PG_SIZE);
	p->zero_run = aligned_alloc(PG_SIZE, (size_t)ZERO_RUN_PAGES * PG_SIZE);
	p->bounce = aligned_alloc(PG_SIZE, (size_t)FM_MAX_BATCH * PG_SIZE);
	if (!p->waiters || !p->zero || !p->zero_run || !p->bounce) {
		rc = -ENOMEM;
		goto fail;
	}
	memset(p->zero, 0, PG_SIZE);
	memset(p->zero_run, 0, (size_t)ZERO_RUN_PAGES * PG_SIZE);

	rc = uffd_open(err, errlen);
	if (rc < 0)
		goto fail;
	p->uffd = rc;
	{
		uint64_t shm = uffd_shmem_features();

		rc = uffd_api(p->uffd, shm, err, errlen);
		if (rc < 0)
			goto fail;
		p->can_move = rc;
		p->shmem_ok = shm != 0;
	}
	p->pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);

	rc = fm_xport_connect(&xc, &p->x, err, errlen);
	if (rc)
		goto fail;
	rc = map_create(p);
	if (rc) {
		snprintf(err, errlen, "cannot create the residency map: %s", strerror(-rc));
		goto fail;
	}
	p->hdr->transport = (uint32_t)fm_xport_kind(p->x);
	atomic_store(&p->memd_copy, cfg->memd_copy ? 1 : 0);
	fm_xport_set_counters(p->x, FM_MEMD_COUNTERS(&p->hdr->stats)); /* several memds count failovers there */
	set_budget(p);

	rc = fm_chan_open(p->x, &p->misc_chan);
	if (!rc)
		rc = fm_chan_open(p->x, &p->ev_chan);
	if (rc) {
		snprintf(err, errlen, "cannot open a channel to memd: %s", strerror(-rc));
		goto fail;
	}

	p->doorbell = fm_sys_mmap(NULL, (size_t)MAX_HANDLERS * PG_SIZE, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p->doorbell == MAP_FAILED) {
		p->doorbell = NULL;
		rc = -errno;
		goto fail;
	}
	reg = (struct uffdio_register){
		.range = { .start = (uintptr_t)p->doorbell, .len = (size_t)MAX_HANDLERS * PG_SIZE },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(p->uffd, UFFDIO_REGISTER, &reg)) {
		rc = -errno;
		snprintf(err, errlen, "UFFDIO_REGISTER failed: %s", strerror(errno));
		goto fail;
	}

	p->nhandlers = cfg->fill_threads < 1 ? 1 : cfg->fill_threads > MAX_HANDLERS ? MAX_HANDLERS : cfg->fill_threads;
	for (unsigned i = 0; i < p->nhandlers; i++) {
		struct handler *h = &p->handlers[i];
		h->p = p;
		h->idx = (int)i;
		rc = fm_chan_open(p->x, &h->chan);
		if (rc) {
			snprintf(err, errlen, "cannot open a channel to memd: %s", strerror(-rc));
			p->nhandlers = i;
			goto fail;
		}
		rc = -pthread_create(&h->th, NULL, handler_main, h);
		if (rc) {
			fm_chan_close(h->chan);
			p->nhandlers = i;
			snprintf(err, errlen, "cannot start a fault handler: %s", strerror(-rc));
			goto fail;
		}
	}
	rc = -pthread_create(&p->evictor, NULL, fm_evictor_main, p);
	if (rc) {
		snprintf(err, errlen, "cannot start the evictor: %s", strerror(-rc));
		goto fail;
	}
	p->evictor_started = 1;
	report_to_launcher(p);
	fm_info("pager up: memd %s (%s), %u fault threads", cfg->memd,
		fm_xport_kind(p->x) == FM_XPORT_SHM ? "shared memory" :
		fm_xport_kind(p->x) == FM_XPORT_RDMA ? "rdma" : "stream", p->nhandlers);
	*out = p;
	return 0;
fail:
	fm_pager_stop(p);
	return rc < 0 ? rc : -EIO;
}

int fm_pager_fetch_all(struct fm_pager *p, void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, e = a + len;

	rlock_rd(p);
	for (int k = 0; k < p->nregions; k++) {
		struct region *r = &p->regions[k];
		if (!r->live || a >= r->end || e <= r->base)
			continue;
		/* Until the caller unregisters it, nothing of it may leave again. */
		atomic_store(&r->pinned, 1);
		for (uint64_t i = 0; i < r->npages; i++) {
			uintptr_t pa = r->base + (i << PG_SHIFT);
			uint8_t b;
			if (pa < a || pa >= e)
				continue;
			b = pg_load(&r->pg[i]);
			while (fm_pg_state(b) == FM_PG_LEAVING || fm_pg_state(b) == FM_PG_FILLING) {
				sched_yield();
				b = pg_load(&r->pg[i]);
			}
			if (fm_pg_state(b) != FM_PG_REMOTE || !pg_cas(&r->pg[i], &b, pg_make(FM_PG_FILLING, b)))
				continue;
			pthread_mutex_lock(&p->misc_lock);
			{
				const void *src = fetch_one(p, p->misc_chan, r, i);
				int rc;
				/* EAGAIN: an event is pending; a handler thread reads it. */
				while ((rc = uffd_copy(p, pa, src, 0)) == -EAGAIN)
					sched_yield();
				if (rc && rc != -EEXIST)
					fm_fatal("UFFDIO_COPY at %#lx failed: %s", (unsigned long)pa, strerror(-rc));
			}
			pthread_mutex_unlock(&p->misc_lock);
			pg_store(&r->pg[i], pg_make(FM_PG_DIRTY, (uint8_t)(b & FM_PGF_HAS_REMOTE)));
			fm_resident_add(p, 1);
		}
	}
	rlock_un(p);
	return 0;
}

int fm_pager_stop(struct fm_pager *p)
{
	if (!p)
		return 0;
	atomic_store(&p->stopping, 1);
	if (p->evictor_started) {
		pthread_mutex_lock(&p->ev_lock);
		p->ev_kick = 1;
		pthread_cond_broadcast(&p->ev_cond);
		pthread_mutex_unlock(&p->ev_lock);
		pthread_join(p->evictor, NULL);
	}
	/* Each touch of a doorbell page is served by one handler, which then exits. */
	for (unsigned i = 0; i < p->nhandlers; i++)
		(void)*(volatile uint8_t *)(p->doorbell + (size_t)i * PG_SIZE);
	for (unsigned i = 0; i < p->nhandlers; i++) {
		pthread_join(p->handlers[i].th, NULL);
		fm_chan_close(p->handlers[i].chan);
	}
	fm_chan_close(p->ev_chan);
	fm_chan_close(p->misc_chan);
	/*
	 * Close the uffd before unmapping the doorbell: with EVENT_UNMAP, the
	 * munmap of a registered range waits until a handler reads its event,
	 * and the handlers are gone (a stop while the program runs on hung here).
	 */
	if (p->uffd >= 0)
		close(p->uffd);
	if (p->doorbell)
		fm_sys_munmap(p->doorbell, (size_t)MAX_HANDLERS * PG_SIZE);
	/* A shmem alias left mapped would keep its file, and so its memory, alive. */
	for (int i = 0; i < p->nregions; i++)
		fm_shmem_release(&p->regions[i]);
	fm_xport_close(p->x);
	if (p->pidfd >= 0)
		close(p->pidfd);
	if (p->hdr)
		fm_sys_munmap(p->hdr, p->map_len);
	if (p->map_fd >= 0)
		close(p->map_fd);
	free(p->waiters);
	free(p->zero);
	free(p->zero_run);
	free(p->bounce);
	free(p);
	return 0;
}

void fm_pager_gc_event(struct fm_pager *p, int start)
{
	__atomic_store_n(&p->hdr->gc_active, start ? 1u : 0u, __ATOMIC_RELEASE);
	if (!start)
		__atomic_add_fetch(&p->hdr->gc_cycles, 1, __ATOMIC_RELEASE);
}

int fm_pager_map_fd(const struct fm_pager *p) { return p->map_fd; }
struct fm_resmap_hdr *fm_pager_map(const struct fm_pager *p) { return p->hdr; }
