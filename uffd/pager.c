// SPDX-License-Identifier: Apache-2.0
/*
 * Start and stop: the residency map, the memd transport, the fault monitor,
 * the evictor thread. pager_internal.h says which room does what.
 */
#include "pager_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "chanpool.h"
#include "evict.h"
#include "fm_fds.h"
#include "fm_util.h"
#include "fork.h"
#include "lend.h"
#include "monitor.h"
#include "shmem.h"
#include "uffd_ops.h"

#define MAP_CAPACITY (1ull << 32) /* state bytes: 16 TiB of registered memory */

/*
 * The state bytes (and as many heat bytes) this process can use: no more
 * pages than its address space may hold. Both maps are NORESERVE and cost
 * nothing untouched, but they count against RLIMIT_AS, and 8 GiB of them
 * made `ulimit -v 2000000` refuse every pager.
 */
static size_t map_capacity(void)
{
	struct rlimit as;
	uint64_t cap = MAP_CAPACITY;

	/* Registered ranges may be reserved, not all mapped (a sparse heap's 4 GiB): room for more than fits. */
	if (!getrlimit(RLIMIT_AS, &as) && as.rlim_cur != RLIM_INFINITY && 4 * (as.rlim_cur / PG_SIZE) + (8u << 20) < cap)
		cap = (4 * (as.rlim_cur / PG_SIZE) + (8u << 20) + PG_SIZE - 1) & ~(uint64_t)(PG_SIZE - 1);
	return (size_t)cap;
}

/* --- residency map --------------------------------------------------------- */

static int map_create(struct fm_pager *p)
{
	p->map_cap = map_capacity();
	p->map_len = FM_RESMAP_MAP_OFFSET + p->map_cap;
	p->map_fd = memfd_create("farmem-map", MFD_CLOEXEC);
	if (p->map_fd < 0)
		return -errno;
	p->map_fd = fm_fd_keep(p->map_fd);
	if (ftruncate(p->map_fd, (off_t)p->map_len))
		return -errno;
	p->hdr = fm_sys_mmap(NULL, p->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, p->map_fd, 0);
	if (p->hdr == MAP_FAILED) {
		p->hdr = NULL;
		return -errno;
	}
	p->map = (uint8_t *)p->hdr + FM_RESMAP_MAP_OFFSET;
	/* Only what regions use is ever touched; without it eviction is a plain clock. */
	p->heat = fm_sys_mmap(NULL, p->map_cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			      -1, 0);
	if (p->heat == MAP_FAILED)
		p->heat = NULL;
	p->st = &p->hdr->stats;
	p->hdr->page_shift = PG_SHIFT;
	p->hdr->hdr_size = FM_RESMAP_MAP_OFFSET;
	p->hdr->pid = (uint64_t)getpid();
	p->hdr->epoch_churn_pct = p->cfg.epoch_pct;
	p->hdr->map_capacity = p->map_cap;
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
	char line[160];
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
	/* A process that gave up root shows the run's key: its uid alone does not say it is the run's. */
	if (p->cfg.control_key[0])
		v.iov_len = (size_t)snprintf(line, sizeof(line), "FMCTL1 pid=%d key=%s\n", getpid(), p->cfg.control_key);
	else
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
	if (fm_sys_sendmsg(fd, &m, MSG_NOSIGNAL) < 0)
		fm_warn("cannot report to the farmem launcher: %s", strerror(errno));
	close(fd);
}

/* --- start and stop ---------------------------------------------------------- */

static const char *mode_name(const struct fm_pager *p)
{
	return p->in_thread ? "in the faulting thread" : "by handler threads";
}

/* Faulting threads borrow a channel only for remote pages; a few per CPU cover them. */
static unsigned pool_size(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	n = n < 1 ? 1 : n;
	return n * 2 + 2 > 16 ? 16 : (unsigned)(n * 2 + 2);
}

int fm_pager_start(const struct fm_pager_cfg *cfg, struct fm_pager **out, char *err, size_t errlen)
{
	struct fm_xport_cfg xc = {
		.addr = cfg->memd, .secret = cfg->secret, .secret_len = cfg->secret_len,
		.pref = cfg->xport_pref,
		.replicas = (int)cfg->replicas, .timeout_ms = (int)cfg->memd_timeout_ms,
		.spin_us = cfg->memd_spin_us,
	};
	uint64_t want = UFFD_FEATURE_MOVE | FM_UFFD_SHMEM;
	struct fm_pager *p;
	int rc, evict_thread;

	if (errlen)
		err[0] = '\0'; /* a failure that says nothing still says why (below) */
	if (!cfg->memd[0]) {
		snprintf(err, errlen, "no memd address (FARMEM_MEMD or memd=)");
		return -EINVAL;
	}
	if (!cfg->secret_len) {
		snprintf(err, errlen, "no memd secret (FARMEM_SECRET or secret=)");
		return -EINVAL;
	}
	/* Its channel slots are a cache line each (pager_internal.h): so is the pager. */
	p = aligned_alloc(_Alignof(struct fm_pager), (sizeof(*p) + _Alignof(struct fm_pager) - 1) &
						      ~(_Alignof(struct fm_pager) - 1));
	if (!p) {
		snprintf(err, errlen, "cannot start the pager: %s", strerror(ENOMEM));
		return -ENOMEM;
	}
	memset(p, 0, sizeof(*p));
	p->cfg = *cfg;
	p->uffd = p->uffd_waits = p->uffd_waits_spare = p->pidfd = p->map_fd = p->stop_fd = p->helpers_fd = -1;
	for (int k = 0; k < MAX_HANDLERS; k++)
		p->handler_epfd[k] = -1;
	p->lend_listen = p->lend_stop = -1;
	for (int k = 0; k < LEND_CONNS; k++)
		p->lend_conn[k] = -1;
	fm_log_level = cfg->log_level;
	pthread_rwlock_init(&p->rlock, NULL);
	pthread_mutex_init(&p->clock_lock, NULL);
	pthread_mutex_init(&p->misc_lock, NULL);
	pthread_mutex_init(&p->reg_lock, NULL);
	pthread_mutex_init(&p->stream_lock, NULL);
	pthread_mutex_init(&p->waits_lock, NULL);
	p->zero_run = aligned_alloc(PG_SIZE, (size_t)ZERO_RUN_PAGES * PG_SIZE);
	p->bounce = aligned_alloc(PG_SIZE, (size_t)FM_MAX_BATCH * PG_SIZE);
	if (!p->zero_run || !p->bounce) {
		rc = -ENOMEM;
		goto fail;
	}
	memset(p->zero_run, 0, (size_t)ZERO_RUN_PAGES * PG_SIZE);

	if (cfg->fault_mode != FM_FAULT_THREAD)
		want |= UFFD_FEATURE_SIGBUS;
	rc = fm_uffd_open(want, &p->features, err, errlen);
	if (rc < 0)
		goto fail;
	p->uffd = rc;
	p->in_thread = !!(p->features & UFFD_FEATURE_SIGBUS);
	if (cfg->fault_mode == FM_FAULT_SIGNAL && !p->in_thread) {
		snprintf(err, errlen, "fault=signal: this kernel's userfaultfd has no UFFD_FEATURE_SIGBUS (4.14+)");
		rc = -ENOTSUP;
		goto fail;
	}
	p->can_move = !!(p->features & UFFD_FEATURE_MOVE);
	p->shmem_ok = (p->features & FM_UFFD_SHMEM) == FM_UFFD_SHMEM;
	p->pidfd = fm_fd_keep((int)syscall(SYS_pidfd_open, getpid(), 0));

	rc = fm_xport_connect(&xc, &p->x, err, errlen);
	if (rc)
		goto fail;
	rc = map_create(p);
	if (rc) {
		snprintf(err, errlen, "cannot create the residency map: %s", strerror(-rc));
		goto fail;
	}
	p->hdr->transport = (uint32_t)fm_xport_kind(p->x);
	p->st->fault_mode = p->in_thread ? 1 : 2;
	atomic_store(&p->memd_copy, cfg->memd_copy ? 1 : 0);
	fm_xport_set_counters(p->x, FM_MEMD_COUNTERS(&p->hdr->stats)); /* several memds count failovers there */
	fm_budget_set(p);
	atomic_store(&p->garbage_quota, INT64_MAX); /* until a collector says when its cycles start */

	rc = fm_chan_open(p->x, &p->misc_chan);
	if (!rc)
		rc = fm_chan_open(p->x, &p->ev_chan);
	if (!rc)
		rc = fm_chan_open(p->x, &p->reg_chan);
	if (!rc && p->in_thread)
		rc = fm_pool_open(p, pool_size());
	if (!rc && p->in_thread && cfg->evict_capture)
		fm_captures_open(p, pool_size() + 2); /* the pool's threads, the evictor, fm_evict_to_budget */
	if (!rc && cfg->evict_move != 1) {
		fm_stages_open(p);
		if (cfg->evict_move == 2 && !fm_pager_move_out(p, "evict_move=1"))
			fm_warn("evict_move=1: this userfaultfd cannot move pages (UFFD_FEATURE_MOVE, Linux 6.8): "
				"eviction drops pages, also those pinned for I/O in flight");
		/*
		 * With handler threads no cover pins a system call's buffer (the
		 * kernel waits for its pages instead), so an O_DIRECT read's pages,
		 * pinned while the device writes them, could be dropped mid-call
		 * (dd iflag=direct lost blocks): moves cost about what
		 * write-protecting costs there (bench/RESULTS.md, session 47).
		 */
		if (cfg->evict_move == 0 && !p->in_thread)
			fm_pager_move_out(p, "faults are served by handler threads");
	}
	if (rc) {
		snprintf(err, errlen, "cannot open a channel to memd: %s", strerror(-rc));
		goto fail;
	}
	rc = fm_monitor_start(p, err, errlen);
	if (rc)
		goto fail;
	/*
	 * An evictor thread on another CPU makes every write-protect and drop a
	 * cross-CPU TLB shootdown; faulting threads that evict for themselves
	 * at the limit pay local flushes. So with faults served in the faulting
	 * thread there is none unless asked for.
	 */
	/* auto|0|1; auto: with a handler that follows, it evicts faster itself than a thread beside it. */
	evict_thread = cfg->evict_threads ? cfg->evict_threads - 1 : !p->in_thread && !cfg->fill_follow;
	if (evict_thread) {
		rc = -fm_thread_create(&p->evictor, NULL, fm_evictor_main, p);
		if (rc) {
			snprintf(err, errlen, "cannot start the evictor: %s", strerror(-rc));
			goto fail;
		}
		p->evictor_started = 1;
	}
	/* Where faults raise SIGBUS, another process's process_vm_readv of this one's pages needs a lender. */
	if (p->in_thread) {
		rc = fm_lend_start(p);
		if (rc)
			fm_debug("no lender of pages to other processes' calls: %s", fm_strerror(-rc));
		rc = 0;
	}
	fm_fork_add(p);
	report_to_launcher(p);
	fm_info("pager up: memd %s (%s), faults served %s, %s", cfg->memd,
		fm_xport_kind(p->x) == FM_XPORT_SHM ? "shared memory" :
		fm_xport_kind(p->x) == FM_XPORT_RDMA ? "rdma" : "stream", mode_name(p),
		evict_thread ? "an evictor thread" : "faulting threads evict");
	*out = p;
	return 0;
fail:
	if (!err[0])
		snprintf(err, errlen, "cannot start the pager: %s", strerror(rc < 0 ? -rc : EIO));
	fm_pager_stop(p);
	return rc < 0 ? rc : -EIO;
}

int fm_pager_open_kernel_waits(struct fm_pager *p, char *err, size_t errlen)
{
	int fd = fm_monitor_waits_fd(p, err, errlen);

	return fd < 0 ? fd : 0;
}

int fm_pager_kernel_waits_possible(void)
{
	int fd = fm_uffd_open_full_raw();

	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

int fm_pager_kernel_waits_reserve(void)
{
	return fm_uffd_open_full_raw();
}

void fm_pager_kernel_waits_give(struct fm_pager *p, int fd)
{
	pthread_mutex_lock(&p->waits_lock);
	if (p->uffd_waits < 0 && p->uffd_waits_spare < 0 && p->in_thread)
		p->uffd_waits_spare = fd;
	else
		close(fd);
	pthread_mutex_unlock(&p->waits_lock);
}

int fm_pager_stop(struct fm_pager *p)
{
	if (!p)
		return 0;
	fm_fork_remove(p);
	atomic_store(&p->stopping, 1);
	fm_lend_stop(p);
	if (p->evictor_started) {
		fm_evictor_kick(p);
		pthread_join(p->evictor, NULL);
	}
	fm_monitor_stop(p);
	fm_chan_close(p->ev_chan);
	fm_chan_close(p->misc_chan);
	fm_chan_close(p->reg_chan);
	fm_pool_close(p);
	fm_captures_close(p);
	/*
	 * Close the uffd before anything unmaps a registered range: with
	 * EVENT_UNMAP, that munmap waits until someone reads its event, and the
	 * handler threads are gone.
	 */
	if (p->uffd >= 0)
		close(p->uffd);
	if (p->uffd_waits >= 0)
		close(p->uffd_waits);
	if (p->uffd_waits_spare >= 0)
		close(p->uffd_waits_spare);
	fm_stages_close(p); /* after the uffd: its munmap would wait for a reader of its event */
	/* A shmem alias left mapped would keep its file, and so its memory, alive. */
	for (int i = 0; i < p->nregions; i++)
		fm_shmem_release(&p->regions[i]);
	fm_xport_close(p->x);
	if (p->pidfd >= 0)
		close(p->pidfd);
	if (p->hdr)
		fm_sys_munmap(p->hdr, p->map_len);
	if (p->heat)
		fm_sys_munmap(p->heat, p->map_cap);
	if (p->map_fd >= 0)
		close(p->map_fd);
	free(p->zero_run);
	free(p->bounce);
	free(p);
	return 0;
}

/*
 * Garbage a cycle may make: twice what the last cycle evicted, at least 16 MiB, at most half the budget.
 * What a registration evicted to bring the pages it found under the budget (a heap at attach) says
 * nothing of a cycle's pressure: it is left out. Its counter trails the batch's by a moment, so a
 * count that went back is taken as none.
 * (While every registered page fits the budget there is no pressure, budget.h, and no garbage.)
 */
static void garbage_quota(struct fm_pager *p)
{
	uint64_t ev = fm_evicted(p) - __atomic_load_n(&p->st->adopt_evictions, __ATOMIC_RELAXED);
	uint64_t q = ev > p->evictions_at_gc ? 2 * (ev - p->evictions_at_gc) : 0;
	uint64_t lim = atomic_load(&p->limit) / 2;

	p->evictions_at_gc = ev;
	q = q < 4096 ? 4096 : q;
	atomic_store(&p->garbage_quota, (int_fast64_t)(q > lim ? lim : q));
}

/*
 * Short of room: at least half of the program's faults on remote pages since
 * the last verdict were on pages that had left at most a budget of
 * evictions before. Evicted pages that come back so soon were in use: the
 * budget holds less than the program works on. A verdict wants 64 such
 * faults; until there are, the last one stands (cycles that fault little
 * say little).
 */
#define SHORT_MIN_FAULTS 64u
static void judge_room(struct fm_pager *p)
{
	uint64_t remote = atomic_load_explicit(&p->app_remote_faults, memory_order_relaxed);
	uint64_t soon = atomic_load_explicit(&p->app_back_soon, memory_order_relaxed);
	uint64_t dr = remote - p->app_remote_at_gc, ds = soon - p->app_soon_at_gc;

	if (dr < SHORT_MIN_FAULTS)
		return;
	p->app_remote_at_gc = remote;
	p->app_soon_at_gc = soon;
	atomic_store(&p->short_of_room, 2 * ds >= dr);
}

void fm_pager_gc_pause_was(struct fm_pager *p, int full_gc, int collected)
{
	if (full_gc)
		STAT_ADD(p, full_gcs, 1);
	else if (!collected)
		STAT_ADD(p, remark_pauses, 1);
}

int fm_pager_short_of_room(struct fm_pager *p)
{
	return atomic_load(&p->short_of_room);
}

void fm_pager_gc_event(struct fm_pager *p, int start)
{
	if (start) {
		garbage_quota(p);
		judge_room(p);
	}
	__atomic_store_n(&p->hdr->gc_active, start ? 1u : 0u, __ATOMIC_RELEASE);
	if (!start)
		__atomic_add_fetch(&p->hdr->gc_cycles, 1, __ATOMIC_RELEASE);
	if (!start && p->evictor_started)
		fm_evictor_kick(p);
}

void fm_pager_pause(struct fm_pager *p, int begin)
{
	fm_xport_pause(p->x, begin);
}

int fm_pager_map_fd(const struct fm_pager *p) { return p->map_fd; }
struct fm_resmap_hdr *fm_pager_map(const struct fm_pager *p) { return p->hdr; }
