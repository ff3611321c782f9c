// SPDX-License-Identifier: Apache-2.0
/* Regions: registration, lookup and the overlap iterator (region.h). */
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "budget.h"
#include "evict.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "shmem.h"
#include "stacks.h"
#include "uffd_ops.h"
#include "wait.h"

struct region *fm_region_find(struct fm_pager *p, uintptr_t addr, int *idx)
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

int fm_overlap_next(struct fm_pager *p, uintptr_t a, uintptr_t e, struct fm_overlap *o)
{
	a = (a + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);
	e &= ~(uintptr_t)(PG_SIZE - 1);
	while (o->next < p->nregions) {
		struct region *r = &p->regions[o->next++];
		uintptr_t s, t;
		if (!r->live || a >= r->end || e <= r->base)
			continue;
		s = a > r->base ? a : r->base;
		t = e < r->end ? e : r->end;
		if (t <= s)
			continue;
		o->r = r;
		o->first = (s - r->base) >> PG_SHIFT;
		o->n = (t - s) >> PG_SHIFT;
		return 1;
	}
	return 0;
}

/* How long a SIGBUS in a range just unregistered counts as ours: far longer than a fault takes to arrive. */
#define GONE_NS (200ull * 1000 * 1000)

void fm_region_gone(struct fm_pager *p, uintptr_t s, uintptr_t e)
{
	unsigned k = atomic_fetch_add(&p->ngone, 1) % 16;

	atomic_store(&p->gone[k].until_ns, 0);
	atomic_store(&p->gone[k].start, s);
	atomic_store(&p->gone[k].end, e);
	atomic_store(&p->gone[k].until_ns, fm_now_ns() + GONE_NS);
}

int fm_region_gone_recently(struct fm_pager *p, uintptr_t addr)
{
	uint64_t now = fm_now_ns();

	for (unsigned k = 0; k < 16; k++)
		if (atomic_load(&p->gone[k].until_ns) > now && addr >= atomic_load(&p->gone[k].start) &&
		    addr < atomic_load(&p->gone[k].end))
			return 1;
	return 0;
}

int fm_region_maybe(struct fm_pager *p, uintptr_t addr, uintptr_t end)
{
	return end > atomic_load_explicit(&p->lo, memory_order_relaxed) &&
	       addr < atomic_load_explicit(&p->hi, memory_order_relaxed);
}

/* Recompute the bounds of all live regions. Caller holds rlock for writing. */
void fm_region_bounds(struct fm_pager *p)
{
	uintptr_t lo = UINTPTR_MAX, hi = 0;

	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		if (!r->live)
			continue;
		lo = r->base < lo ? r->base : lo;
		hi = r->end > hi ? r->end : hi;
	}
	atomic_store(&p->lo, hi ? lo : 0);
	atomic_store(&p->hi, hi);
}

/* The region whose remote pages are in memd space `space`. Caller holds rlock. */
static struct region *region_of_space(struct fm_pager *p, uint32_t space)
{
	for (int i = 0; i < p->nregions; i++)
		if (p->regions[i].live && p->regions[i].space == space)
			return &p->regions[i];
	return NULL;
}

/*
 * Give memd back the memory of kept range k's slots that are still dead.
 * A slot is written only by whoever holds its page (an eviction, a
 * collector's move), so each page is held while its slot goes: a page that
 * got a copy in memd again since, or that someone holds, keeps its slot.
 * Caller holds rlock and misc_lock.
 */
static void release_kept(struct fm_pager *p, uint32_t space, struct fm_range k)
{
	struct region *r = region_of_space(p, space);
	uint8_t was[512];

	if (!r || k.first + k.npages > r->npages)
		return; /* gone with its space */
	for (uint64_t i = k.first; i < k.first + k.npages;) {
		uint64_t run = i;
		unsigned n = 0;
		while (i < k.first + k.npages && n < 512) {
			uint8_t b = pg_load(&r->pg[i]);
			unsigned s = fm_pg_state(b), hold;
			if ((b & FM_PGF_HAS_REMOTE) || (s != FM_PG_UNTOUCHED && s != FM_PG_CLEAN && s != FM_PG_DIRTY))
				break;
			hold = s == FM_PG_UNTOUCHED ? FM_PG_FILLING : FM_PG_UPDATING;
			if (!pg_cas(&r->pg[i], &b, pg_make(hold, b)))
				break;
			was[n++] = b;
			i++;
		}
		if (n) {
			struct fm_range rg = { .first = run, .npages = n };
			if (fm_chan_release(p->misc_chan, space, &rg, 1))
				STAT_ADD(p, transport_errors, 1);
			for (unsigned j = 0; j < n; j++)
				pg_release_from(&r->pg[run + j], fm_pg_state(was[j]) == FM_PG_UNTOUCHED
							   ? FM_PG_FILLING : FM_PG_UPDATING, was[j]);
			/* A fault on a page we held waits to settle (fault.c), a handler thread's too. */
			fm_settled(p);
		} else {
			i++;
		}
	}
}

/* The oldest kept range leaves the list; with give_back, its slots' memory goes back to the system too. */
static void pop_oldest(struct fm_pager *p, int give_back)
{
	unsigned o = p->kept_head;

	if (give_back)
		release_kept(p, p->kept_space[o], p->kept[o]);
	p->kept_head = (o + 1) % MAX_KEPT;
	p->nkept--;
}

/* Every slot of every region that memd keeps without a page in it: memd refused a page, and wants its memory. */
static void release_everything(struct fm_pager *p)
{
	while (p->nkept)
		pop_oldest(p, 1);
	for (int i = 0; i < p->nregions && fm_xport_kept_pages(p->x); i++)
		if (p->regions[i].live && !p->regions[i].alias)
			release_kept(p, p->regions[i].space, (struct fm_range){ 0, p->regions[i].npages });
}

/* Count what went back since `before`, and what memd keeps now. */
static void count_kept(struct fm_pager *p, uint64_t before)
{
	uint64_t after = fm_xport_kept_pages(p->x);

	if (after < before)
		STAT_ADD(p, discard_released, before - after);
	p->st->discard_kept = after;
}

/*
 * How much free space memd keeps for reuse: half of what is registered, at
 * least 16 MiB, counted exactly by the transport (a slot kept, written again
 * and kept again is one slot; memd never holds more for a region than its
 * size, kept or not). Past it the oldest ranges go back, down to half of
 * that; all of it once memd has refused a page (fm_dead_flush). The list
 * only orders what goes first: a range that falls off its end while the
 * store is under the bound keeps its memory, reclaimed by a later discard
 * of its pages or a give-back.
 */
static void keep(struct fm_pager *p, uint32_t space, const struct fm_range *rg, unsigned n)
{
	uint64_t bound = atomic_load(&p->registered) / 2, before = fm_xport_kept_pages(p->x);

	if (bound < 4096)
		bound = 4096;
	for (unsigned k = 0; k < n; k++) {
		if (p->nkept == MAX_KEPT)
			pop_oldest(p, fm_xport_kept_pages(p->x) > bound);
		unsigned t = (p->kept_head + p->nkept++) % MAX_KEPT;
		p->kept[t] = rg[k];
		p->kept_space[t] = space;
	}
	if (fm_xport_kept_pages(p->x) > bound)
		while (p->nkept && fm_xport_kept_pages(p->x) > bound / 2)
			pop_oldest(p, 1);
	count_kept(p, before);
}

/*
 * Once memd has refused a page, the discard that flushes next gives its own
 * pages' memory back with their copies, and the rest of this discard's
 * too, and everything memd keeps besides (release_everything skips pages
 * held, as the caller's still are).
 */
void fm_dead_flush(struct fm_pager *p, struct fm_dead *d)
{
	int kept = 0;

	if (!d->n)
		return;
	pthread_mutex_lock(&p->misc_lock);
	if (d->keep && atomic_exchange(&p->kept_give_back, 0)) {
		uint64_t before = fm_xport_kept_pages(p->x);

		d->keep = 0;
		fm_chan_discard(p->misc_chan, d->space, d->rg, d->n);
		release_everything(p);
		count_kept(p, before);
	} else if (!d->keep) {
		fm_chan_discard(p->misc_chan, d->space, d->rg, d->n);
	} else if (!fm_chan_forget(p->misc_chan, d->space, d->rg, d->n, &kept) && kept) {
		keep(p, d->space, d->rg, d->n);
	}
	pthread_mutex_unlock(&p->misc_lock);
	d->n = 0;
}

void fm_dead_add(struct fm_pager *p, struct fm_dead *d, uint32_t space, uint64_t i)
{
	if (d->n && d->space == space && d->rg[d->n - 1].first + d->rg[d->n - 1].npages == i) {
		d->rg[d->n - 1].npages++;
		return;
	}
	if (d->n == 64 || (d->n && d->space != space))
		fm_dead_flush(p, d);
	d->space = space;
	d->rg[d->n++] = (struct fm_range){ .first = i, .npages = 1 };
}

void fm_region_forget(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n, unsigned to)
{
	struct fm_dead dead = { .n = 0 };
	int64_t res = 0;
	uint64_t let_go = 0;

	/*
	 * A page that stays ours is held until memd has forgotten its copy: a
	 * write and an eviction in between would put a new copy in the slot,
	 * and the forget would drop it.
	 */
	if (to == FM_PG_UNTOUCHED) {
		fm_region_hold_dropped(p, r, first, n, &dead);
		fm_dead_flush(p, &dead);
		fm_region_release_dropped(p, r, first, n);
		return;
	}
	for (uint64_t i = first; i < first + n;) {
		uint8_t b = fm_settle(p, &r->pg[i]);
		if (fm_pg_state(b) != FM_PG_UNMANAGED) {
			if (!pg_cas(&r->pg[i], &b, pg_make(to, 0)))
				continue; /* changed under us: look again */
			if (fm_pg_is_resident(b))
				res--;
			if (b & FM_PGF_HAS_REMOTE)
				fm_dead_add(p, &dead, r->space, i);
			let_go++;
		}
		i++;
	}
	fm_dead_flush(p, &dead);
	STAT_ADD(p, discards, (uint64_t)-res);
	if (res)
		fm_resident_add(p, res);
	/* A sparse region's uncommitted part is no longer registered memory (a partial munmap elsewhere stays counted). */
	if (let_go && r->sparse) {
		atomic_fetch_sub(&r->managed, let_go);
		atomic_fetch_sub(&p->registered, let_go);
		fm_budget_set(p);
	}
}

void fm_region_hold_dropped(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n, struct fm_dead *dead)
{
	int64_t res = 0;

	for (uint64_t i = first; i < first + n;) {
		uint8_t b = fm_settle(p, &r->pg[i]);

		if (fm_pg_state(b) != FM_PG_UNMANAGED) {
			if (!pg_cas(&r->pg[i], &b, pg_make(fm_pg_is_resident(b) ? FM_PG_UPDATING : FM_PG_FILLING, b)))
				continue; /* changed under us: look again */
			res -= fm_pg_is_resident(b);
			if (b & FM_PGF_HAS_REMOTE)
				fm_dead_add(p, dead, r->space, i);
		}
		i++;
	}
	STAT_ADD(p, discards, (uint64_t)-res);
	if (res)
		fm_resident_add(p, res);
}

void fm_region_release_dropped(struct fm_pager *p, struct region *r, uint64_t first, uint64_t n)
{
	/* Held by us: a managed page of the range is nobody else's, and the rlock keeps the region as it was. */
	for (uint64_t i = first; i < first + n; i++) {
		uint8_t b = pg_load(&r->pg[i]);
		unsigned s = fm_pg_state(b);

		if (s != FM_PG_UNMANAGED)
			pg_release_from(&r->pg[i], s, pg_make(FM_PG_UNTOUCHED, 0));
	}
	fm_settled(p);
}

int fm_pager_owns(struct fm_pager *p, const void *addr, size_t len)
{
	struct fm_overlap o = { 0 };
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	int hit;

	if (!fm_region_maybe(p, a, (uintptr_t)addr + len))
		return 0;
	rlock_rd(p);
	hit = fm_overlap_next(p, a, ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1), &o);
	rlock_un(p);
	return hit;
}

/* Without the lock: [a, e) overlaps a live region (one whose faults raise SIGBUS, with signals_only). */
static int overlaps_live(struct fm_pager *p, uintptr_t a, uintptr_t e, int signals_only)
{
	int n;

	if (!fm_region_maybe(p, a, e))
		return 0;
	n = __atomic_load_n(&p->nregions, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n; i++) {
		struct region *r = &p->regions[i];
		if (__atomic_load_n(&r->live, __ATOMIC_ACQUIRE) && a < __atomic_load_n(&r->end, __ATOMIC_RELAXED) &&
		    e > __atomic_load_n(&r->base, __ATOMIC_RELAXED) &&
		    !(signals_only && __atomic_load_n(&r->kernel_waits, __ATOMIC_RELAXED)))
			return 1;
	}
	return 0;
}

int fm_pager_owns_nolock(struct fm_pager *p, const void *addr, size_t len)
{
	return overlaps_live(p, (uintptr_t)addr, (uintptr_t)addr + len, 0);
}

int fm_region_signals(struct fm_pager *p, uintptr_t a, uintptr_t e)
{
	return overlaps_live(p, a, e, 1);
}

/*
 * Mark pages [first, first+npg) that are already present: they are resident
 * and, for all we know, dirty. The others stay as the caller set them.
 */
static uint64_t adopt_present(struct region *r, uint64_t first, uint64_t npg)
{
	struct page_region vec[256];
	uint64_t n = 0, start = r->base + (first << PG_SHIFT), end = start + (npg << PG_SHIFT);
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (pagemap < 0)
		return 0;
	while (start < end) {
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = start, .end = end,
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
			for (uint64_t i = (start - r->base) >> PG_SHIFT; i < first + npg; i += 4096) {
				unsigned char vv[4096];
				uint64_t m = first + npg - i < 4096 ? first + npg - i : 4096;
				int ok = mincore((void *)(r->base + (i << PG_SHIFT)), m << PG_SHIFT, vv) == 0;
				for (uint64_t j = 0; j < m; j++) {
					if (ok && !(vv[j] & 1))
						continue;
					pg_init(&r->pg[i + j], pg_make(FM_PG_DIRTY, FM_PGF_REF));
					n++;
				}
			}
			break;
		}
		for (long i = 0; i < got; i++)
			for (uint64_t a2 = vec[i].start; a2 < vec[i].end; a2 += PG_SIZE) {
				pg_init(&r->pg[(a2 - r->base) >> PG_SHIFT], pg_make(FM_PG_DIRTY, FM_PGF_REF));
				n++;
			}
		if (a.walk_end <= start)
			break;
		start = a.walk_end;
	}
	close(pagemap);
	return n;
}

/*
 * The entry points below that take the region lock for writing, or evict in
 * this thread, run on the thread's stack of farmem's when the caller's own
 * stack is paged memory. SBCL runs Lisp, and the C it calls, on a control
 * stack it maps itself; a coroutine runs on a malloc'd block. There the
 * call's frames went onto untouched pages below the stack pointer while it
 * held the lock, and their fault, served in this thread or by a handler
 * thread, waited for that lock: "Resource deadlock avoided", or a hang
 * (sessions 38 and 39). Here every caller passes: the mmap family's covers,
 * the malloc family's blocks and heaps, an agent.
 */
#define PAGER_STACK_REACH (64u << 10) /* the pager's frames below the stack pointer: adopt_present's alone are 6 KiB */

int fm_region_off_paged_stack(struct fm_pager *p, void (*fn)(void *), void *arg)
{
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);

	return sp > PAGER_STACK_REACH && overlaps_live(p, sp - PAGER_STACK_REACH, sp, 0) && fm_stack_run(fn, arg);
}

enum off_op { OFF_REGISTER, OFF_COMMIT, OFF_UNREGISTER, OFF_SETTLE };

struct off_call {
	enum off_op op;
	struct fm_pager *p;
	void *addr;
	size_t len;
	uint32_t flags;
	long rc;
};

static void off_run(void *v)
{
	struct off_call *c = v;

	switch (c->op) {
	case OFF_REGISTER:
		c->rc = fm_pager_register(c->p, c->addr, c->len, c->flags);
		break;
	case OFF_COMMIT:
		c->rc = fm_pager_commit(c->p, c->addr, c->len);
		break;
	case OFF_UNREGISTER:
		c->rc = fm_pager_unregister(c->p, c->addr, c->len);
		break;
	case OFF_SETTLE:
		fm_pager_settle(c->p);
		break;
	}
}

/* 1 when c ran there (its result in c->rc); 0 when it is the caller's to run, here. */
static int off_paged_stack(struct off_call *c)
{
	return fm_region_off_paged_stack(c->p, off_run, c);
}

/*
 * Pages present at a registration joined the books as resident: if they pass
 * the budget, evict down to it now, in this thread. Left to the faults that
 * follow, the excess would stay until the first fault at the limit (a JVM's
 * heap at attach: most of it, for as long as the program touches only
 * resident pages).
 */
static void settle(struct fm_pager *p)
{
	uint64_t res, lim;

	fm_evict_to_budget(p, 1);
	fm_resident_settled(p);
	res = atomic_load(&p->resident);
	lim = atomic_load(&p->limit);
	if (res > lim)
		STAT_ADD(p, over_budget_adopted, res - lim);
}

static void settle_adopted(struct fm_pager *p, uint64_t present)
{
	if (!present)
		return;
	fm_resident_adopt(p, present);
	settle(p);
}

void fm_pager_settle(struct fm_pager *p)
{
	struct off_call c = { .op = OFF_SETTLE, .p = p };

	if (off_paged_stack(&c))
		return;
	settle(p);
}

/*
 * UFFDIO_REGISTER [a, a+len) for paging; a range the uffd cannot page is let
 * go again. Page-table entries per 4 KiB (no huge pages for us to split),
 * and no child gets the range but through fork.c, which brings it home first.
 */
int fm_region_uffd_register(const struct region *r, uintptr_t a, size_t len, int minor)
{
	uint64_t ioctls = 0;
	int rc;

	fm_sys_madvise((void *)a, len, MADV_NOHUGEPAGE);
	fm_sys_madvise((void *)a, len, MADV_DONTFORK);
	rc = fm_uffd_register(r->uffd, a, len, 1, 1, minor, &ioctls);

	if (rc || !fm_uffd_can_page(ioctls, minor)) {
		if (!rc)
			fm_uffd_unregister(r->uffd, a, len);
		if (rc)
			fm_warn("UFFDIO_REGISTER of %#lx+%zu failed: %s", (unsigned long)a, len, fm_strerror(-rc));
		else
			fm_warn("%#lx+%zu cannot be paged (no copy, continue or write-protect on this mapping)",
				(unsigned long)a, len);
		return rc ? rc : -ENOTSUP;
	}
	return 0;
}

/* A region's state bytes (and heat bytes) in the residency map: whole pages of it. */
static uint64_t map_extent_len(uint64_t npages)
{
	return (npages + PG_SIZE - 1) & ~(uint64_t)(PG_SIZE - 1);
}

/*
 * Where a region of npages (its cap) puts its state bytes: the lowest place that no
 * live region's extent overlaps, at the start of the map or at the end of
 * a live extent. A program that maps and unmaps big ranges all day would
 * otherwise use up the map (16 TiB registered in all) and hold the state
 * bytes of every range it ever had: 128 MiB of them after 2000 mappings of
 * 256 MiB (session 22). Caller holds rlock for writing.
 */
static uint64_t map_place(struct fm_pager *p, uint64_t npages)
{
	uint64_t need = map_extent_len(npages), best = p->hdr->map_used;

	for (int c = -1; c < p->nregions; c++) {
		uint64_t at;
		int free = 1;

		if (c >= 0 && !p->regions[c].live)
			continue;
		at = c < 0 ? 0 : (uint64_t)(p->regions[c].pg - p->map) + map_extent_len(p->regions[c].cap);
		if (at >= best)
			continue;
		for (int i = 0; i < p->nregions && free; i++) {
			const struct region *r = &p->regions[i];
			uint64_t off = (uint64_t)(r->pg - p->map);
			free = !r->live || off + map_extent_len(r->cap) <= at || at + need <= off;
		}
		if (free)
			best = at;
	}
	return best;
}

/*
 * A freed region's state and heat bytes give their memory back (its
 * extent holds cap of them). The next region there writes its state bytes
 * at registration; its heat bytes it finds zero, as in a fresh map.
 */
static void map_release(struct fm_pager *p, const struct region *r)
{
	uint64_t off = (uint64_t)(r->pg - p->map), len = map_extent_len(r->cap);

	(void)fallocate(p->map_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(FM_RESMAP_MAP_OFFSET + off),
			(off_t)len);
	if (r->heat && fm_sys_madvise(r->heat, len, MADV_DONTNEED))
		memset(r->heat, 0, len);
}

/* The first slot free in the region table and in the map's, or -1. */
static int free_slot(struct fm_pager *p)
{
	for (int i = 0; i < FM_RESMAP_SLOTS; i++)
		if (!p->regions[i].live && !fm_resmap_slot(p->hdr, (unsigned)i)->flags)
			return i;
	return -1;
}

struct region *fm_region_book(struct fm_pager *p, uintptr_t a, uint64_t npages, uint64_t cap, uint32_t space,
			      int uffd)
{
	int slot = free_slot(p);
	uint64_t at = map_place(p, cap);
	struct region *r;

	if (slot < 0 || cap < npages || at + map_extent_len(cap) > p->hdr->map_capacity)
		return NULL;
	r = &p->regions[slot];
	*r = (struct region){
		.base = a, .end = a + (npages << PG_SHIFT), .npages = npages, .cap = cap, .space = space, .slot = slot,
		.pg = p->map + at, .uffd = uffd,
		.kernel_waits = uffd != p->uffd || !p->in_thread,
		.heat = p->heat ? p->heat + at : NULL,
	};
	return r;
}

void fm_region_publish(struct fm_pager *p, struct region *r, uint32_t flags)
{
	uint64_t at = (uint64_t)(r->pg - p->map);

	*fm_resmap_slot(p->hdr, (unsigned)r->slot) = (struct fm_resmap_region){
		.base = r->base, .npages = r->npages, .map_offset = FM_RESMAP_MAP_OFFSET + at,
		.space_id = r->space, .flags = FM_REGION_F_LIVE | flags,
	};
	if (at + map_extent_len(r->cap) > p->hdr->map_used)
		p->hdr->map_used = at + map_extent_len(r->cap);
	if (r->slot >= p->nregions)
		p->nregions = r->slot + 1;
	__atomic_store_n(&p->hdr->nregions, (uint32_t)p->nregions, __ATOMIC_RELEASE);
	__atomic_store_n(&r->live, 1, __ATOMIC_RELEASE);
}

void fm_region_resize(struct fm_pager *p, struct region *r, uint64_t npages)
{
	r->npages = npages;
	r->end = r->base + (npages << PG_SHIFT);
	atomic_store(&r->managed, npages);
	fm_resmap_slot(p->hdr, (unsigned)r->slot)->npages = npages;
}

void fm_region_retire(struct fm_pager *p, struct region *r, int close_space)
{
	if (close_space)
		fm_xport_space_close(p->x, r->space);
	fm_shmem_release(r);
	__atomic_store_n(&r->live, 0, __ATOMIC_RELEASE);
	fm_resmap_slot(p->hdr, (unsigned)r->slot)->flags = 0;
	map_release(p, r);
}

/*
 * A range the pager cannot take is counted; the first few are told, the
 * rest only counted (a runtime that commits in many windows of address
 * space made a warning per window, hundreds of them). Its number, from 0.
 */
#define REFUSALS_TOLD 8u

static uint64_t refusal(struct fm_pager *p, size_t len)
{
	STAT_ADD(p, refused_bytes, len);
	return STAT_ADD(p, refused_ranges, 1);
}

static const char *refusals_left(uint64_t n)
{
	return n + 1 == REFUSALS_TOLD ? " (more such ranges stay local, not told)" : "";
}

int fm_pager_register(struct fm_pager *p, void *addr, size_t len, uint32_t flags)
{
	struct off_call c = { .op = OFF_REGISTER, .p = p, .addr = addr, .len = len, .flags = flags };
	uintptr_t a = (uintptr_t)addr;
	int minor = !!(flags & FM_REG_SHMEM), sparse = !!(flags & FM_REG_SPARSE);
	struct region *r = NULL;
	uint64_t npages = len >> PG_SHIFT, present = 0;
	uint32_t space;
	int rc, fd = p->uffd;

	if (off_paged_stack(&c))
		return (int)c.rc;
	if (!len || (a | len) & (PG_SIZE - 1) || (minor && sparse) || (minor && (flags & FM_REG_KERNEL_WAITS)))
		return -EINVAL;
	/* Its uffd is opened first (fm_pager_open_kernel_waits), above: the monitor is no room of ours. */
	if ((flags & FM_REG_KERNEL_WAITS) && p->in_thread && (fd = p->uffd_waits) < 0)
		return -ENOTCONN;
	if (minor && !p->shmem_ok) {
		fm_warn("cannot page the shared-memory mapping %p+%zu MiB: this kernel's userfaultfd lacks "
			"minor faults or write-protection on shmem (5.19+ has both); run `farmem doctor`",
			addr, len >> 20);
		return -ENOTSUP;
	}
	rlock_wr(p);
	/*
	 * Two regions over one page would give it two sets of books. A sparse
	 * region keeps the address space of a part the program unmapped, and a
	 * mapping the kernel puts there later is not paged (the shim commits
	 * reservations there into the region that holds them).
	 */
	if (fm_overlap_next(p, a, a + len, &(struct fm_overlap){ 0 })) {
		rlock_un(p);
		fm_debug("%p+%zu KiB is not paged: it overlaps a range paged already", addr, len >> 10);
		return -EEXIST;
	}
	r = fm_region_book(p, a, npages, npages, 0, fd);
	if (!r) {
		uint64_t n = refusal(p, len);

		rlock_un(p);
		if (n < REFUSALS_TOLD)
			fm_warn("cannot page %zu more bytes at %p: region table full%s", len, addr, refusals_left(n));
		return -ENOSPC;
	}
	rc = fm_xport_space_open(p->x, npages, &space);
	if (rc) {
		uint64_t n = refusal(p, len);

		rlock_un(p);
		if (n < REFUSALS_TOLD)
			fm_warn("memd refused a space of %llu pages: %s%s", (unsigned long long)npages, fm_strerror(-rc),
				refusals_left(n));
		return rc;
	}
	r->space = space;
	r->sparse = sparse;
	if (sparse) {
		/* Nothing of it is paged yet: fm_pager_commit registers its parts as they become memory. */
		memset(r->pg, FM_PG_UNMANAGED, npages);
		goto books;
	}
	/* Before UFFDIO_REGISTER: a mapping made from a registered one would inherit its uffd. */
	if (minor && (rc = fm_shmem_alias(r))) {
		rlock_un(p);
		fm_xport_space_close(p->x, space);
		fm_warn("cannot map the shared-memory range %p+%zu MiB a second time: %s", addr, len >> 20,
			fm_strerror(-rc));
		return rc;
	}
	/*
	 * The bounds that the SIGBUS handler looks at before it takes the lock
	 * must cover the range from the moment it is registered: a fault there
	 * waits for this lock, then finds the region live.
	 */
	if (!atomic_load(&p->hi) || a < atomic_load(&p->lo))
		atomic_store(&p->lo, a);
	if (a + len > atomic_load(&p->hi))
		atomic_store(&p->hi, a + len);
	rc = fm_region_uffd_register(r, a, len, minor);
	if (rc) {
		fm_region_bounds(p);
		fm_shmem_release(r);
		rlock_un(p);
		fm_xport_space_close(p->x, space);
		return rc;
	}
	memset(r->pg, 0, npages);
	present = adopt_present(r, 0, npages);
	if (r->alias)
		present += fm_shmem_adopt(p, r);
	atomic_store(&r->managed, npages);
	atomic_fetch_add(&p->registered, npages);
books:
	fm_region_publish(p, r, flags & (FM_REG_HEAP | FM_REG_SHMEM | FM_REG_SPARSE));
	fm_region_bounds(p);
	fm_budget_set(p);
	rlock_un(p);
	if (flags & FM_REG_NO_SETTLE)
		fm_resident_adopt(p, present);
	else
		settle_adopted(p, present);
	fm_info("paging %p+%zu MiB%s (%llu pages present), budget %llu pages", addr, len >> 20,
		sparse ? " as it is committed" : "", (unsigned long long)present,
		(unsigned long long)atomic_load(&p->limit));
	return 0;
}

/* The sparse region that holds all of [a, e), or NULL. Caller holds rlock. */
static struct region *sparse_holding(struct fm_pager *p, uintptr_t a, uintptr_t e)
{
	for (int i = 0; i < p->nregions; i++) {
		struct region *r = &p->regions[i];
		if (r->live && r->sparse && a >= r->base && e <= r->end)
			return r;
	}
	return NULL;
}

/* The end of the run of pages from i on that are (want 1) or are not (want 0) UNMANAGED, before end. */
static uint64_t run_end(const struct region *r, uint64_t i, uint64_t end, int want)
{
	while (i < end && (fm_pg_state(pg_load(&r->pg[i])) == FM_PG_UNMANAGED) == want)
		i++;
	return i;
}

long fm_pager_commit(struct fm_pager *p, void *addr, size_t len)
{
	struct off_call c = { .op = OFF_COMMIT, .p = p, .addr = addr, .len = len };
	uintptr_t a = (uintptr_t)addr;
	struct region *r;
	uint64_t first, end, present = 0;
	long added = 0;
	int rc = 0;

	if (off_paged_stack(&c))
		return c.rc;
	if (!len || (a | len) & (PG_SIZE - 1))
		return -EINVAL;
	rlock_wr(p);
	r = sparse_holding(p, a, a + len);
	if (!r) {
		rlock_un(p);
		return -ENOENT;
	}
	first = (a - r->base) >> PG_SHIFT;
	end = first + (len >> PG_SHIFT);
	/*
	 * Under the write lock no fault, eviction or unmap event is inside the
	 * region, so its unmanaged bytes can be set like a new region's. A
	 * thread that touches a page once it is registered waits for the lock
	 * in its fault, then finds it untouched (or adopted).
	 */
	for (uint64_t i = run_end(r, first, end, 0); i < end && !rc;) {
		uint64_t stop = run_end(r, i, end, 1);
		uintptr_t s = r->base + (i << PG_SHIFT);
		size_t n = (size_t)(stop - i) << PG_SHIFT;

		rc = fm_region_uffd_register(r, s, n, 0);
		if (!rc) {
			memset(r->pg + i, 0, stop - i);
			present += adopt_present(r, i, stop - i);
			atomic_fetch_add(&r->managed, stop - i);
			added += (long)(stop - i);
		}
		i = run_end(r, stop, end, 0);
	}
	if (added) {
		atomic_fetch_add(&p->registered, (uint64_t)added);
		fm_budget_set(p);
	}
	rlock_un(p);
	settle_adopted(p, present);
	if (added)
		fm_debug("committed %#lx+%zu KiB: %ld pages paged now (%llu present)", (unsigned long)a, len >> 10,
			 added, (unsigned long long)present);
	return rc && !added ? rc : added;
}

/* UFFDIO_UNREGISTER what of the overlap o is registered. */
static void uffd_let_go(struct fm_pager *p, const struct fm_overlap *o)
{
	struct region *r = o->r;
	uint64_t end = o->first + o->n;

	/*
	 * Only what is registered: the runs not UNMANAGED. A sparse region
	 * registers its runs one by one, and a page let go before (a range
	 * unmapped, then mapped over with MAP_FIXED) is UNMANAGED in any region:
	 * unregistering it again would fail where nothing is mapped now.
	 */
	for (uint64_t i = run_end(r, o->first, end, 1); i < end;) {
		uint64_t stop = run_end(r, i, end, 0);
		uintptr_t s = r->base + (i << PG_SHIFT);
		int rc = fm_uffd_unregister(r->uffd, s, (size_t)(stop - i) << PG_SHIFT);
		/* Plain memory again, which a child of a fork must get (a range made unreadable, then readable). */
		fm_sys_madvise((void *)s, (size_t)(stop - i) << PG_SHIFT, MADV_DOFORK);
		if (rc)
			fm_warn("UFFDIO_UNREGISTER of %#lx+%lu failed: %s", (unsigned long)s,
				(unsigned long)((stop - i) << PG_SHIFT), fm_strerror(-rc));
		i = run_end(r, stop, end, 1);
	}
}

/*
 * A region whose last pages were let go (a munmap of its tail, an mremap
 * that shrank it in place) ends where its mapping ends again: else its
 * books would still hold the address space after it, and a growth there
 * (an mremap in place, a new mapping) would overlap them. Caller holds
 * rlock for writing.
 */
static void shorten(struct fm_pager *p, struct region *r)
{
	uint64_t n = r->npages;

	while (n && fm_pg_state(pg_load(&r->pg[n - 1])) == FM_PG_UNMANAGED)
		n--;
	if (n == r->npages || !n)
		return;
	atomic_fetch_sub(&p->registered, r->npages - n);
	/* Its space and its place in the map stay: it may grow back (remap.c). */
	fm_region_resize(p, r, n);
}

int fm_pager_unregister(struct fm_pager *p, void *addr, size_t len)
{
	struct off_call c = { .op = OFF_UNREGISTER, .p = p, .addr = addr, .len = len };
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(PG_SIZE - 1);
	uintptr_t e = ((uintptr_t)addr + len + PG_SIZE - 1) & ~(uintptr_t)(PG_SIZE - 1);
	struct fm_overlap o = { 0 };

	if (off_paged_stack(&c))
		return (int)c.rc;
	rlock_wr(p);
	while (fm_overlap_next(p, a, e, &o)) {
		struct region *r = o.r;
		uintptr_t s = r->base + (o.first << PG_SHIFT);
		int whole = o.n == r->npages;

		/* Before the books change: they say which runs of a sparse region are registered. */
		uffd_let_go(p, &o);
		fm_region_forget(p, r, o.first, o.n, whole ? FM_PG_UNTOUCHED : FM_PG_UNMANAGED);
		fm_region_gone(p, s, s + ((uintptr_t)o.n << PG_SHIFT));
		/*
		 * The last part of a mapping let go in parts (a munmap of its tail,
		 * then of its head): the region goes too, or its slot and its address
		 * range stay taken, and a new mapping the kernel places there would
		 * not be paged (it overlaps a region). A sparse region waits for
		 * commits with nothing managed, so it stays.
		 */
		if (!whole && !r->sparse && run_end(r, 0, r->npages, 1) == r->npages)
			whole = 1;
		if (whole) {
			atomic_fetch_sub(&p->registered, r->sparse ? atomic_load(&r->managed) : r->npages);
			fm_region_retire(p, r, 1);
		} else {
			/* fm_pager_fetch_all held the region for this range only: the rest may leave again. */
			atomic_store(&r->pinned, 0);
			if (!r->sparse)
				shorten(p, r);
		}
	}
	fm_region_bounds(p);
	fm_budget_set(p);
	rlock_un(p);
	return 0;
}
