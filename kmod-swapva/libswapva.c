// SPDX-License-Identifier: Apache-2.0
/*
 * libswapva: batched move/swap of page runs, over /dev/swapva, UFFDIO_MOVE
 * or memmove. See libswapva.h for the contract and swapva.h for the ABI.
 */
#include "libswapva.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
/* Debian 12's linux-libc-dev is 6.1: UFFDIO_MOVE (6.8) comes from the project header. */
#include "uffd_compat.h"
#include "uffd_move.h"

#define USER_TOP (1ULL << 47)
/* Measured by bench/bench_swapva.py (docs/swapva.md), host 6.18: into an
 * empty destination (a discarded free region) UFFDIO_MOVE beats memmove
 * from 1-2 pages; into a populated one (MOVE becomes a swap) it never does,
 * so a caller that knows its destination is populated should copy. */
#define UFFD_BREAKEVEN_PAGES 2
#define SWAP_BOUNCE (64 * 1024)

static const char *const names[SWAPVA_NBACKENDS] = { "auto", "kmod", "uffd", "memmove" };

const char *swapva_backend_name(enum swapva_backend b)
{
	return (unsigned)b < SWAPVA_NBACKENDS ? names[b] : "?";
}

/* ---- process-wide userfaultfd state (one uffd owns a VMA) --------------- */

struct range { uint64_t start, end; };

static struct {
	pthread_mutex_t lock;
	int refs;
	int fd;              /* -1: not opened yet; -2: unavailable */
	int stopfd;          /* eventfd that stops the handler */
	int thread_up;
	pthread_t thread;
	struct range *regs;  /* ranges registered by us, unsorted */
	size_t nregs, capregs;
} U = { .lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .stopfd = -1 };

static long page_size(void)
{
	static long ps;

	if (!ps)
		ps = sysconf(_SC_PAGESIZE);
	return ps;
}

static int uffd_create(void)
{
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MOVE };
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);

		if (dev >= 0) {
			fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
			close(dev);
		}
	}
	if (fd < 0)
		return -errno;
	if (ioctl(fd, UFFDIO_API, &api) < 0 || !(api.features & UFFD_FEATURE_MOVE) ||
	    !(api.ioctls & (1ULL << _UFFDIO_REGISTER))) {
		int e = errno ? errno : ENOSYS;

		close(fd);
		return -e;
	}
	return fd;
}

/* Fault handler for holes in ranges we registered: zero-fill, as plain
 * anonymous memory would. */
static void *uffd_thread(void *arg)
{
	long ps = page_size();

	(void)arg;
	for (;;) {
		struct pollfd p[2] = { { U.fd, POLLIN, 0 }, { U.stopfd, POLLIN, 0 } };
		struct uffd_msg msg[16];
		ssize_t n;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		n = read(U.fd, msg, sizeof(msg));
		if (n < 0)
			continue;
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msg[0]); i++) {
			struct uffdio_zeropage z;
			struct uffdio_range w;

			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			z.range.start = msg[i].arg.pagefault.address & ~(uint64_t)(ps - 1);
			z.range.len = ps;
			z.mode = 0;
			if (ioctl(U.fd, UFFDIO_ZEROPAGE, &z) < 0) {
				w = z.range;
				ioctl(U.fd, UFFDIO_WAKE, &w);
			}
		}
	}
	return NULL;
}

/* Call with U.lock held. */
static int uffd_get_locked(void)
{
	if (U.fd == -1) {
		int fd = uffd_create();

		U.fd = fd < 0 ? -2 : fd;
	}
	return U.fd >= 0 ? U.fd : -1;
}

unsigned swapva_available(void)
{
	unsigned m = 1u << SWAPVA_BACKEND_MEMMOVE;
	int fd = open(SWAPVA_DEVICE, O_RDWR | O_CLOEXEC);

	if (fd >= 0) {
		struct swapva_info in = { 0 };

		if (ioctl(fd, SWAPVA_IOC_INFO, &in) == 0 && in.abi_version == SWAPVA_ABI_VERSION)
			m |= 1u << SWAPVA_BACKEND_KMOD;
		close(fd);
	}
	pthread_mutex_lock(&U.lock);
	if (uffd_get_locked() >= 0)
		m |= 1u << SWAPVA_BACKEND_UFFD;
	pthread_mutex_unlock(&U.lock);
	return m;
}

/* ---- /proc/self/maps: which ranges are anonymous private rw ----------- */

struct vmae { uint64_t start, end; int ok; };

static int read_maps(struct vmae **out, size_t *n)
{
	FILE *f = fopen("/proc/self/maps", "re");
	struct vmae *v = NULL;
	size_t cap = 0, k = 0;
	char line[4096];

	if (!f)
		return errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s, e, off;
		char perms[8], dev[16], path[4096] = "";
		unsigned long ino;
		int got = sscanf(line, "%llx-%llx %7s %llx %15s %lu %4095[^\n]", &s, &e, perms, &off,
				 dev, &ino, path);

		if (got < 6)
			continue;
		if (k == cap) {
			struct vmae *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(*v));

			if (!nv) {
				free(v);
				fclose(f);
				return ENOMEM;
			}
			v = nv;
		}
		char *p = path;

		while (*p == ' ')
			p++;
		v[k].start = s;
		v[k].end = e;
		v[k].ok = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 'p' && ino == 0 &&
			  (*p == 0 || !strcmp(p, "[heap]") || !strncmp(p, "[anon:", 6));
		k++;
	}
	fclose(f);
	*out = v;
	*n = k;
	return 0;
}

/* [a, b) inside a run of contiguous anonymous private rw mappings?
 * 0, EINVAL (some other mapping) or EFAULT (a gap). *ext gets the run. */
static int maps_check(const struct vmae *v, size_t n, uint64_t a, uint64_t b, struct range *ext)
{
	size_t i = 0;

	while (i < n && v[i].end <= a)
		i++;
	if (i == n || v[i].start > a)
		return EFAULT;
	if (!v[i].ok)
		return EINVAL;
	size_t lo = i;

	while (lo > 0 && v[lo - 1].end == v[lo].start && v[lo - 1].ok)
		lo--;
	while (v[i].end < b) {
		if (i + 1 == n || v[i + 1].start != v[i].end)
			return EFAULT;
		i++;
		if (!v[i].ok)
			return EINVAL;
	}
	while (i + 1 < n && v[i + 1].start == v[i].end && v[i + 1].ok)
		i++;
	if (ext) {
		ext->start = v[lo].start;
		ext->end = v[i].end;
	}
	return 0;
}

/* ---- the context ------------------------------------------------------- */

struct swapva_ctx {
	int ladder[SWAPVA_NBACKENDS];  /* rungs in order, terminated by 0 */
	int kfd;
	struct swapva_info kinfo;
	int uffd;                      /* fd used for UFFDIO_MOVE, or -1 */
	int own_uffd;                  /* the process-wide one (we register) */
	int strict;
	void *scratch;
	size_t scratch_len;
	int pagemap;                   /* /proc/self/pagemap of pagemap_pid, or -1 */
	pid_t pagemap_pid;
	char desc[64];
	unsigned char *bounce;
};

static void ctx_describe(struct swapva_ctx *c)
{
	size_t o = 0;

	c->desc[0] = 0;
	for (int i = 0; c->ladder[i]; i++)
		o += snprintf(c->desc + o, sizeof(c->desc) - o, "%s%s", i ? ">" : "",
			      names[c->ladder[i]]);
}

int swapva_open(struct swapva_ctx **out, enum swapva_backend want)
{
	struct swapva_ctx *c;
	const char *env = getenv("SWAPVA_BACKEND");
	int k = 0;

	*out = NULL;
	if (want == SWAPVA_BACKEND_AUTO && env && *env) {
		for (int b = 1; b < SWAPVA_NBACKENDS; b++)
			if (!strcmp(env, names[b]))
				want = b;
		if (want == SWAPVA_BACKEND_AUTO && strcmp(env, "auto"))
			return EINVAL;
	}
	if ((unsigned)want >= SWAPVA_NBACKENDS)
		return EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ENOMEM;
	c->kfd = -1;
	c->uffd = -1;
	c->pagemap = -1;
	c->bounce = malloc(SWAP_BOUNCE);
	if (!c->bounce) {
		free(c);
		return ENOMEM;
	}

	if (want == SWAPVA_BACKEND_AUTO || want == SWAPVA_BACKEND_KMOD) {
		c->kfd = open(SWAPVA_DEVICE, O_RDWR | O_CLOEXEC);
		if (c->kfd >= 0 && (ioctl(c->kfd, SWAPVA_IOC_INFO, &c->kinfo) < 0 ||
				    c->kinfo.abi_version != SWAPVA_ABI_VERSION)) {
			close(c->kfd);
			c->kfd = -1;
		}
		if (c->kfd >= 0)
			c->ladder[k++] = SWAPVA_BACKEND_KMOD;
		else if (want == SWAPVA_BACKEND_KMOD)
			goto nodev;
	}
	if (want != SWAPVA_BACKEND_MEMMOVE) {
		pthread_mutex_lock(&U.lock);
		int fd = uffd_get_locked();

		if (fd >= 0) {
			U.refs++;
			c->uffd = fd;
			c->own_uffd = 1;
			c->ladder[k++] = SWAPVA_BACKEND_UFFD;
		}
		pthread_mutex_unlock(&U.lock);
		if (fd < 0 && want == SWAPVA_BACKEND_UFFD)
			goto nodev;
	}
	c->ladder[k++] = SWAPVA_BACKEND_MEMMOVE;
	ctx_describe(c);
	*out = c;
	return 0;
nodev:
	if (c->kfd >= 0)
		close(c->kfd);
	free(c->bounce);
	free(c);
	return ENODEV;
}

static void regs_drop(uint64_t a, uint64_t b);

void swapva_close(struct swapva_ctx *c)
{
	if (!c)
		return;
	if (c->kfd >= 0)
		close(c->kfd);
	if (c->pagemap >= 0)
		close(c->pagemap);
	if (c->scratch) {
		if (c->uffd >= 0) {
			struct uffdio_range r = { (uint64_t)c->scratch, c->scratch_len };

			ioctl(c->uffd, UFFDIO_UNREGISTER, &r);
		}
		munmap(c->scratch, c->scratch_len);
		if (c->own_uffd) {
			pthread_mutex_lock(&U.lock);
			regs_drop((uint64_t)c->scratch, (uint64_t)c->scratch + c->scratch_len);
			pthread_mutex_unlock(&U.lock);
		}
	}
	if (c->own_uffd) {
		pthread_mutex_lock(&U.lock);
		if (--U.refs == 0) {  /* the last context: give the memory back as it was */
			for (size_t i = 0; i < U.nregs; i++) {
				struct uffdio_range r = { U.regs[i].start, U.regs[i].end - U.regs[i].start };

				ioctl(U.fd, UFFDIO_UNREGISTER, &r);
			}
			U.nregs = 0;
		}
		pthread_mutex_unlock(&U.lock);
	}
	free(c->bounce);
	free(c);
}

enum swapva_backend swapva_backend(const struct swapva_ctx *c)
{
	return c->ladder[0];
}

const char *swapva_describe(const struct swapva_ctx *c)
{
	return c->desc;
}

unsigned swapva_breakeven_pages(const struct swapva_ctx *c)
{
	switch (c->ladder[0]) {
	case SWAPVA_BACKEND_KMOD:
		return c->kinfo.breakeven_pages ? c->kinfo.breakeven_pages : 1;
	case SWAPVA_BACKEND_UFFD:
		return UFFD_BREAKEVEN_PAGES;
	default:
		return ~0u;
	}
}

void swapva_set_strict(struct swapva_ctx *c, int strict)
{
	c->strict = strict;
}

/* ---- registration bookkeeping (U.lock held) ------------------------------ */

static int regs_covered(uint64_t a, uint64_t b)
{
	for (size_t i = 0; i < U.nregs; i++)
		if (U.regs[i].start <= a && b <= U.regs[i].end)
			return 1;
	return 0;
}

static int regs_add(uint64_t a, uint64_t b)
{
	if (U.nregs == U.capregs) {
		size_t cap = U.capregs ? 2 * U.capregs : 16;
		struct range *r = realloc(U.regs, cap * sizeof(*r));

		if (!r)
			return ENOMEM;
		U.regs = r;
		U.capregs = cap;
	}
	U.regs[U.nregs++] = (struct range){ a, b };
	return 0;
}

static void regs_drop(uint64_t a, uint64_t b)
{
	for (size_t i = 0; i < U.nregs;)
		if (U.regs[i].start < b && a < U.regs[i].end)
			U.regs[i] = U.regs[--U.nregs];
		else
			i++;
}

static int register_range(int fd, uint64_t a, uint64_t b)
{
	struct uffdio_register r = { .range = { a, b - a }, .mode = UFFDIO_REGISTER_MODE_MISSING };

	if (ioctl(fd, UFFDIO_REGISTER, &r) < 0)
		return errno;
	if (!(r.ioctls & (1ULL << _UFFDIO_MOVE)))
		return EOPNOTSUPP;
	return 0;
}

/* Make sure [a, b) is registered with our uffd. Only the range asked for:
 * registering neighbours would put memory we were never given (a malloc
 * arena, say) under our fault handler. swapva_register() covers a whole
 * region (a heap) once, so that later segments hit the cache. */
static int ensure_registered(struct swapva_ctx *c, uint64_t a, uint64_t b)
{
	struct vmae *v;
	size_t n;
	int e;

	if (!c->own_uffd)
		return 0;
	pthread_mutex_lock(&U.lock);
	if (regs_covered(a, b)) {
		pthread_mutex_unlock(&U.lock);
		return 0;
	}
	e = read_maps(&v, &n);
	if (!e) {
		e = maps_check(v, n, a, b, NULL);
		free(v);
	}
	if (!e) {
		e = register_range(U.fd, a, b);
		if (e == EBUSY)  /* another uffd owns (part of) it */
			e = EOPNOTSUPP;
	}
	if (!e)
		e = regs_add(a, b);
	if (!e && !U.thread_up) {
		U.stopfd = eventfd(0, EFD_CLOEXEC);
		if (U.stopfd < 0 || pthread_create(&U.thread, NULL, uffd_thread, NULL))
			e = EAGAIN;
		else
			U.thread_up = 1;
	}
	pthread_mutex_unlock(&U.lock);
	return e;
}

int swapva_register(struct swapva_ctx *c, void *addr, size_t len)
{
	uint64_t a = (uint64_t)addr, m = (uint64_t)page_size() - 1;

	if (!len || ((a | len) & m))
		return EINVAL;
	if (!c->own_uffd)
		return 0;
	/*
	 * The caller says this is a fresh region: a cached range over the same
	 * addresses may belong to a mapping that was unmapped without
	 * swapva_release(). Trusting it would leave the new mapping
	 * unregistered, and every call would then pay a failed move, a
	 * /proc/self/maps read and a registration (~80 µs here).
	 */
	pthread_mutex_lock(&U.lock);
	regs_drop(a, a + len);
	pthread_mutex_unlock(&U.lock);
	return ensure_registered(c, a, a + len);
}

int swapva_release(struct swapva_ctx *c, void *addr, size_t len)
{
	struct uffdio_range r = { (uint64_t)addr, len };
	int e = 0;

	if (!c->own_uffd)
		return 0;
	pthread_mutex_lock(&U.lock);
	if (ioctl(U.fd, UFFDIO_UNREGISTER, &r) < 0)
		e = errno;
	/* keep it simple: forget every cached range that touches it */
	regs_drop(r.start, r.start + r.len);
	pthread_mutex_unlock(&U.lock);
	return e;
}

int swapva_use_uffd(struct swapva_ctx *c, int fd)
{
	int has = 0;

	for (int i = 0; c->ladder[i]; i++)
		has |= c->ladder[i] == SWAPVA_BACKEND_UFFD;
	if (c->scratch) {
		struct uffdio_range r = { (uint64_t)c->scratch, c->scratch_len };

		if (c->uffd >= 0)
			ioctl(c->uffd, UFFDIO_UNREGISTER, &r);
		munmap(c->scratch, c->scratch_len);
		if (c->own_uffd) {
			pthread_mutex_lock(&U.lock);
			regs_drop(r.start, r.start + r.len);
			pthread_mutex_unlock(&U.lock);
		}
		c->scratch = NULL;
		c->scratch_len = 0;
	}
	if (fd < 0) {
		pthread_mutex_lock(&U.lock);
		c->uffd = uffd_get_locked();
		pthread_mutex_unlock(&U.lock);
		c->own_uffd = c->uffd >= 0;
	} else {
		c->uffd = fd;
		c->own_uffd = 0;
	}
	if (!has && c->uffd >= 0) {  /* insert uffd before memmove */
		int k = 0;

		while (c->ladder[k] && c->ladder[k] != SWAPVA_BACKEND_MEMMOVE)
			k++;
		c->ladder[k] = SWAPVA_BACKEND_UFFD;
		c->ladder[k + 1] = SWAPVA_BACKEND_MEMMOVE;
		ctx_describe(c);
	}
	return 0;
}

/* ---- uffd backend -------------------------------------------------------- */

/* Move [src, src+len) to the empty dst; holes stay holes. Returns 0 or errno;
 * *moved is how far it got (the prefix that moved). */
static int umove(int fd, uint64_t dst, uint64_t src, uint64_t len, uint64_t *moved)
{
	uint64_t done = 0;
	int spins = 0;

	while (done < len) {
		uint64_t m = 0;
		int e = -fm_move_to_empty(fd, dst + done, src + done, len - done,
					  UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, &m, NULL);

		done += m;
		if (!e)
			break;
		if (e == EAGAIN && m > 0)
			continue;
		if (e == EAGAIN && ++spins < 64) /* nothing moved: page busy, retry */
			continue;
		*moved = done;
		return e;
	}
	*moved = done;
	return 0;
}

/* Where the first mapped page of [a, b) is (b: none), or a if that cannot be told. */
static uint64_t first_mapped(struct swapva_ctx *c, uint64_t a, uint64_t b)
{
	pid_t me = getpid();
	int64_t f;

	if (c->pagemap >= 0 && c->pagemap_pid != me) {  /* opened before a fork: the parent's */
		close(c->pagemap);
		c->pagemap = -1;
	}
	if (c->pagemap < 0) {
		c->pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		c->pagemap_pid = me;
	}
	f = c->pagemap < 0 ? -1 : fm_pagemap_first(c->pagemap, a, b, 1);
	return f < 0 ? a : (uint64_t)f;
}

static int ensure_registered(struct swapva_ctx *c, uint64_t a, uint64_t b);

/* umove, and if the destination turns out not to be registered (our cache
 * went stale: munmap + mmap at the same place), register it and retry. */
static int umove_c(struct swapva_ctx *c, uint64_t dst, uint64_t src, uint64_t len,
		   uint64_t *moved)
{
	int e = umove(c->uffd, dst, src, len, moved);

	if (e == EINVAL && *moved == 0 && c->own_uffd) {
		pthread_mutex_lock(&U.lock);
		regs_drop(dst, dst + len);
		pthread_mutex_unlock(&U.lock);
		e = ensure_registered(c, dst, dst + len);
		if (!e)
			e = umove(c->uffd, dst, src, len, moved);
	}
	return e;
}

static int scratch_get(struct swapva_ctx *c, size_t len)
{
	if (c->scratch_len >= len)
		return 0;
	if (c->scratch) {
		struct uffdio_range r = { (uint64_t)c->scratch, c->scratch_len };

		ioctl(c->uffd, UFFDIO_UNREGISTER, &r);
		munmap(c->scratch, c->scratch_len);
		if (c->own_uffd) {
			pthread_mutex_lock(&U.lock);
			regs_drop(r.start, r.start + r.len);
			pthread_mutex_unlock(&U.lock);
		}
		c->scratch = NULL;
		c->scratch_len = 0;
	}
	size_t sz = len < (1u << 20) ? (1u << 20) : len;
	void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);

	if (p == MAP_FAILED)
		return errno;
	madvise(p, sz, MADV_NOHUGEPAGE);
	int e = register_range(c->uffd, (uint64_t)p, (uint64_t)p + sz);

	if (e) {
		munmap(p, sz);
		return e;
	}
	if (c->own_uffd) {
		pthread_mutex_lock(&U.lock);
		regs_add((uint64_t)p, (uint64_t)p + sz);
		pthread_mutex_unlock(&U.lock);
	}
	c->scratch = p;
	c->scratch_len = sz;
	return 0;
}

/* The rollback moves only pages that just moved the other way; a failure
 * there would leave the segment split, which we report as EIO. */
#define ROLLBACK(d, s, l)                                                        \
	do {                                                                     \
		uint64_t _m;                                                     \
		if ((l) && umove_c(c, (d), (s), (l), &_m))                   \
			return EIO;                                              \
	} while (0)

static int uffd_one(struct swapva_ctx *c, unsigned op, const struct swapva_seg *s)
{
	uint64_t a = s->src, b = s->dst, len = s->len, head = 0, m1, m2, m3;
	int e;

	e = ensure_registered(c, b, b + len);
	if (!e)
		e = ensure_registered(c, a, a + len);
	if (e)
		return e;
	if (op == SWAPVA_OP_MOVE) {
		/*
		 * Straight into dst as far as it is empty. A collector moves into
		 * space that held garbage, though, and UFFDIO_MOVE stops at the
		 * first mapped dst page: the rest is swapped, which costs two more
		 * moves, where freeing dst's pages costs more (64 pages: 22 µs vs
		 * 51 µs here), and what is left at src is unspecified for MOVE
		 * anyway. The page tables say how far dst is empty, beforehand:
		 * after a failed move, the kernel's count may be short (uffd_move.h).
		 */
		head = first_mapped(c, b, b + len) - b;
		if (head) {
			e = umove_c(c, b, a, head, &m1);
			if (e) {
				ROLLBACK(a, b, m1);
				return e;
			}
			if (head == len)
				return 0;
		}
		a += head;
		b += head;
		len -= head;
	}
	{
		uint64_t t;

		e = scratch_get(c, len);
		if (e)
			return e == EINVAL ? EOPNOTSUPP : e;
		t = (uint64_t)c->scratch;
		e = umove_c(c, t, a, len, &m1);       /* A -> tmp */
		if (e) {
			ROLLBACK(a, t, m1);
			goto out;
		}
		e = umove_c(c, a, b, len, &m2);       /* B -> A */
		if (e) {
			ROLLBACK(b, a, m2);
			ROLLBACK(a, t, len);
			goto out;
		}
		e = umove_c(c, b, t, len, &m3);       /* tmp -> B */
		if (e) {
			ROLLBACK(t, b, m3);
			ROLLBACK(b, a, len);
			ROLLBACK(a, t, len);
		}
	}
out:
	if (e)  /* a MOVE that went straight in for its first pages */
		ROLLBACK(s->src, s->dst, head);
	return e;
}

/* ---- memmove backend ----------------------------------------------------- */

static int memmove_one(struct swapva_ctx *c, unsigned op, const struct swapva_seg *s)
{
	unsigned char *a = (unsigned char *)s->src, *b = (unsigned char *)s->dst;

	if (op == SWAPVA_OP_MOVE) {
		memmove(b, a, s->len);
		return 0;
	}
	for (uint64_t off = 0; off < s->len; off += SWAP_BOUNCE) {
		size_t n = s->len - off < SWAP_BOUNCE ? s->len - off : SWAP_BOUNCE;

		memcpy(c->bounce, a + off, n);
		memcpy(a + off, b + off, n);
		memcpy(b + off, c->bounce, n);
	}
	return 0;
}

/* ---- the batch --------------------------------------------------------- */

static int seg_valid(const struct swapva_seg *s)
{
	uint64_t m = (uint64_t)page_size() - 1;

	if (!s->len || ((s->src | s->dst | s->len) & m))
		return EINVAL;
	if (s->src + s->len < s->src || s->dst + s->len < s->dst || s->src + s->len > USER_TOP ||
	    s->dst + s->len > USER_TOP || s->src == 0 || s->dst == 0)
		return EINVAL;
	if (s->src < s->dst + s->len && s->dst < s->src + s->len)
		return EINVAL;
	return 0;
}

struct ival { uint64_t a, b; unsigned idx; };

static int ival_cmp(const void *x, const void *y)
{
	const struct ival *p = x, *q = y;

	return p->a < q->a ? -1 : p->a > q->a;
}

/* Do segments [0, k] (only those with idx <= k) overlap one another? */
static int overlaps_upto(struct ival *iv, size_t n, unsigned k)
{
	uint64_t end = 0;

	for (size_t i = 0; i < n; i++) {
		if (iv[i].idx > k)
			continue;
		if (iv[i].a < end)
			return 1;
		if (iv[i].b > end)
			end = iv[i].b;
	}
	return 0;
}

/* First index at which the batch becomes invalid (nr if none), and why. */
static unsigned first_invalid(const struct swapva_seg *s, unsigned nr, int *why)
{
	unsigned k = nr;
	struct ival *iv;

	for (unsigned i = 0; i < nr; i++)
		if ((*why = seg_valid(&s[i]))) {
			k = i;
			break;
		}
	if (k <= 1)
		return k;
	iv = malloc(2 * (size_t)k * sizeof(*iv));
	if (!iv) {
		*why = ENOMEM;
		return 0;
	}
	for (unsigned i = 0; i < k; i++) {
		iv[2 * i] = (struct ival){ s[i].src, s[i].src + s[i].len, i };
		iv[2 * i + 1] = (struct ival){ s[i].dst, s[i].dst + s[i].len, i };
	}
	qsort(iv, 2 * (size_t)k, sizeof(*iv), ival_cmp);
	if (overlaps_upto(iv, 2 * (size_t)k, k - 1)) {
		unsigned lo = 1, hi = k - 1;  /* smallest j with overlap in [0, j] */

		while (lo < hi) {
			unsigned mid = lo + (hi - lo) / 2;

			if (overlaps_upto(iv, 2 * (size_t)k, mid))
				hi = mid;
			else
				lo = mid + 1;
		}
		k = lo;
		*why = EINVAL;
	}
	free(iv);
	return k;
}

static int falls_through(int backend, int e)
{
	if (e == EBUSY || e == EOPNOTSUPP || e == EAGAIN)
		return 1;
	return backend == SWAPVA_BACKEND_UFFD && (e == ENOENT || e == EEXIST || e == ENOSYS);
}

/* Run one segment from ladder rung r on. */
static int run_one(struct swapva_ctx *c, int r, unsigned op, const struct swapva_seg *s,
		   struct swapva_result *res)
{
	int e = 0;

	for (; c->ladder[r]; r++) {
		int b = c->ladder[r];

		if (b == SWAPVA_BACKEND_KMOD) {
			struct swapva_batch kb = { .segs = (uint64_t)s, .nr = 1, .flags = op };

			e = ioctl(c->kfd, SWAPVA_IOC_BATCH, &kb) ? (kb.err ? -kb.err : errno) : 0;
		} else if (b == SWAPVA_BACKEND_UFFD) {
			e = uffd_one(c, op, s);
		} else {
			e = memmove_one(c, op, s);
		}
		if (!e) {
			res->segs_by[b]++;
			res->bytes_by[b] += s->len;
			return 0;
		}
		if (c->strict || !falls_through(b, e))
			return e;
	}
	return e;
}

int swapva_batch(struct swapva_ctx *c, unsigned op, const struct swapva_seg *segs, unsigned nr,
		 struct swapva_result *out)
{
	struct swapva_result tmp, *res = out ? out : &tmp;
	int why = 0, e = 0;
	unsigned k, i = 0;

	memset(res, 0, sizeof(*res));
	if (op != SWAPVA_OP_MOVE && op != SWAPVA_OP_SWAP)
		return res->err = EINVAL;
	k = first_invalid(segs, nr, &why);

	/* memmove first: nothing in the kernel checks the mappings, so we do. */
	if (c->ladder[0] == SWAPVA_BACKEND_MEMMOVE && k > 0) {
		struct vmae *v;
		size_t n;
		int me = read_maps(&v, &n);

		if (me) {
			k = 0;
			why = me;
		} else {
			for (unsigned j = 0; j < k; j++) {
				me = maps_check(v, n, segs[j].src, segs[j].src + segs[j].len, NULL);
				if (!me)
					me = maps_check(v, n, segs[j].dst, segs[j].dst + segs[j].len, NULL);
				if (me) {
					k = j;
					why = me;
					break;
				}
			}
			free(v);
		}
	}

	while (i < k) {
		if (c->ladder[0] == SWAPVA_BACKEND_KMOD) {
			unsigned n = k - i > SWAPVA_MAX_SEGS ? SWAPVA_MAX_SEGS : k - i;
			struct swapva_batch kb = { .segs = (uint64_t)(segs + i), .nr = n, .flags = op };

			if (ioctl(c->kfd, SWAPVA_IOC_BATCH, &kb) == 0) {
				kb.done = n;
				kb.err = 0;
			} else if (!kb.err) {
				kb.err = -errno;
				kb.done = 0;
			}
			for (unsigned j = i; j < i + kb.done; j++) {
				res->segs_by[SWAPVA_BACKEND_KMOD]++;
				res->bytes_by[SWAPVA_BACKEND_KMOD] += segs[j].len;
			}
			i += kb.done;
			if (!kb.err)
				continue;
			e = -kb.err;
			if (c->strict || !falls_through(SWAPVA_BACKEND_KMOD, e))
				break;
			e = run_one(c, 1, op, &segs[i], res);
		} else {
			e = run_one(c, 0, op, &segs[i], res);
		}
		if (e)
			break;
		i++;
	}
	res->done = i;
	if (!e && i == k && k < nr)
		e = why;
	res->err = e;
	return e;
}

int swapva_move(struct swapva_ctx *c, void *dst, void *src, size_t len)
{
	struct swapva_seg s = { (uint64_t)src, (uint64_t)dst, len };

	return swapva_batch(c, SWAPVA_OP_MOVE, &s, 1, NULL);
}

int swapva_swap(struct swapva_ctx *c, void *a, void *b, size_t len)
{
	struct swapva_seg s = { (uint64_t)a, (uint64_t)b, len };

	return swapva_batch(c, SWAPVA_OP_SWAP, &s, 1, NULL);
}
