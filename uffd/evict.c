// SPDX-License-Identifier: Apache-2.0
/*
 * Eviction. A batch is chosen mostly by a clock hand that sweeps addresses
 * and is sorted by address (sort_victims), so its victims are in order and
 * often contiguous: write-protect and drop are
 * one system call per run of pages, and the drop of a whole batch is one
 * process_madvise with one TLB shootdown (Linux 6.16+ batches the flush over
 * its ranges). Cross-CPU TLB shootdowns are what made UMap 15x slower than
 * local memory here (research/anchors.md §7): this file counts its calls.
 *
 * Never lose a write: a dirty page is write-protected before it is copied
 * out, memd acknowledges the copy, and only then is the page dropped. A
 * writer that faults meanwhile waits for the page to settle (fault.c) until it
 * is remote, then faults it back in. In SIGBUS mode a batch's dirty pages
 * are captured instead (capture.h): spliced into a pipe, dropped, read back
 * from the pipe, written to memd; a write before the drop is in what the pipe
 * holds, a write after it waits as above. Pages memd refuses go back in.
 *
 * Garbage first: pages the program discarded and has not written since
 * (CLEAN | FM_PGF_GARBAGE, write-protected) leave before anything else, with
 * no write-back: their bytes are dead, and any write to them would have
 * faulted and made them live again.
 *
 * A batch lives on the evicting thread's stack (FM_EVICT_MAX victims): in
 * fault=signal mode that is a faulting thread, inside its SIGBUS handler.
 */
#include "evict.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "chanpool.h"
#include "fm_util.h"
#include "pager_internal.h"
#include "pins.h"
#include "shmem.h"
#include "uffd_ops.h"
#include "wait.h"

#define FULL_BACKOFF_NS (50ull * 1000 * 1000)
#define PINNED_BACKOFF_NS (2ull * 1000 * 1000)

/*
 * The clock sees a page's use only when it faults (REF): a page read all the
 * time goes at the hand's second pass like any other, and comes straight
 * back. Linux keeps such a page on its active list when it refaults within
 * the reach of its memory. So here: a page's heat byte (beside its state
 * byte, ours alone) holds, while it is remote, when it left, in units of a
 * sixteenth of the budget's evictions (HEAT_LEFT | units, 7 bits); a page
 * that comes back within one budget of evictions is in use, and the hand
 * passes it HEAT_PASSES more times before it goes. A resident page's byte
 * below HEAT_LEFT is the passes it has left. At most three quarters of the
 * budget is kept so (HEAT_KEPT, counted by the hand at each turn): with
 * every page kept, the hand would turn round and round in one batch, and a
 * page just filled would go with it. The byte is advice: whatever it holds,
 * no page is kept or lost by it.
 */
#define HEAT_LEFT 0x80u
#define HEAT_CLOCK 0x7fu
#define HEAT_SPAN 16u /* units: one budget */
#define HEAT_PASSES 3u
/* At most three quarters of the budget kept so; the rest turns over as a plain clock. */
#define HEAT_KEPT(limit) ((limit) / 4 * 3)

/* Relaxed: the clock reads a resident page's byte while its filler or evictor may be done with it. */
static uint8_t heat_get(const struct region *r, uint64_t i)
{
	return __atomic_load_n(&r->heat[i], __ATOMIC_RELAXED);
}

static void heat_set(struct region *r, uint64_t i, uint8_t v)
{
	__atomic_store_n(&r->heat[i], v, __ATOMIC_RELAXED);
}

/* The refault clock, in sixteenths of the budget's evictions. */
static uint8_t heat_now(struct fm_pager *p)
{
	uint64_t unit = atomic_load(&p->limit) / HEAT_SPAN;

	return (uint8_t)((fm_evicted(p) / (unit ? unit : 1)) & HEAT_CLOCK);
}

unsigned fm_heat_filled(struct fm_pager *p, struct region *r, uint64_t i, uint8_t was)
{
	int remote = fm_pg_state(was) == FM_PG_REMOTE, soon;
	unsigned gone, back = remote && (was & FM_PGF_LOOPED) ? FM_BACK_LOOP : 0;
	uint8_t h;

	if (!r->heat)
		return back;
	h = heat_get(r, i);
	gone = remote && (h & HEAT_LEFT) ? (unsigned)((heat_now(p) - h) & HEAT_CLOCK) : ~0u;
	soon = gone <= HEAT_SPAN;
	if (soon)
		STAT_ADD(p, refaults_soon, 1);
	/*
	 * Back within three budgets: what a budget four times as large would
	 * have kept, about (the summary's estimate for the user, not the clock's).
	 * The byte's clock wraps at eight budgets, so a page gone longer may be
	 * counted here too: an estimate that errs high.
	 */
	if (gone <= 3 * HEAT_SPAN)
		STAT_ADD(p, refaults_3budgets, 1);
	if (soon && atomic_load(&p->hot) < HEAT_KEPT(atomic_load(&p->limit))) {
		atomic_fetch_add(&p->hot, 1);
		heat_set(r, i, HEAT_PASSES);
	} else {
		heat_set(r, i, 0);
	}
	return back | (gone <= 3 * HEAT_SPAN ? FM_BACK_SOON : 0) | (soon ? FM_BACK_BUDGET : 0);
}

struct victim {
	uintptr_t addr;
	struct region *r;
	uint64_t i;
	uint8_t old;        /* its byte before LEAVING */
	uint8_t keep;       /* write-back refused: stays resident */
	uint8_t zero;       /* dirty by our books, but all zeros and nothing in memd: no write-back */
	uint8_t same;       /* installed writable on a guess, and memd's copy is still its bytes: clean */
	uint8_t compared;   /* installed on a guess, looked at: it was written */
	const void *bytes;  /* captured: its bytes, read from the pipe after the drop; moved: in the stage */
	uint8_t moved;      /* moved out into a stage: dropped already */
	uint8_t loop;       /* chosen by the loop rule (pick_passed) */
	uint8_t pinned;     /* the kernel would not move it (pinned for I/O): stays resident, untouched */
};

void fm_evict_hint(struct fm_pager *p, int ridx, uint64_t first, uint64_t n)
{
	pthread_mutex_lock(&p->clock_lock);
	/* Full: the clock finds the rest (garbage is never referenced, so it goes at the first pass). */
	if (p->nhints < MAX_HINTS)
		p->hints[(p->hint_head + p->nhints++) % MAX_HINTS] =
			(struct garbage_hint){ .region = ridx, .first = first, .n = n };
	pthread_mutex_unlock(&p->clock_lock);
}

/* Caller holds clock_lock. Full: the oldest goes, the one a loop comes back to first. */
static void push_passed(struct fm_pager *p, struct passed_run run)
{
	p->passed[p->passed_top] = run;
	p->passed_top = (p->passed_top + 1) % MAX_PASSED;
	if (p->npassed < MAX_PASSED)
		p->npassed++;
}

void fm_evict_passed(struct fm_pager *p, int ridx, uint64_t last, int64_t stride, uint64_t n)
{
	pthread_mutex_lock(&p->clock_lock);
	push_passed(p, (struct passed_run){ .region = ridx, .loop = 1, .last = last, .stride = stride, .n = n });
	pthread_mutex_unlock(&p->clock_lock);
}

void fm_evict_done(struct fm_pager *p, int ridx, uint64_t first, uint64_t n)
{
	struct passed_run *h;

	pthread_mutex_lock(&p->clock_lock);
	h = &p->passed[(p->passed_top + MAX_PASSED - 1) % MAX_PASSED];
	/* A worker hands on a page or a few per move: its newest run grows while the other's does not come between. */
	if (p->npassed && !h->loop && h->region == ridx && h->stride == 1 && h->last + 1 == first) {
		h->last += n;
		h->n += n;
	} else {
		push_passed(p, (struct passed_run){ .region = ridx, .loop = 0, .last = first + n - 1, .stride = 1, .n = n });
	}
	pthread_mutex_unlock(&p->clock_lock);
}

static int take(struct region *r, uint64_t i, uint8_t b, struct victim *v)
{
	if (!pg_cas(&r->pg[i], &b, pg_make(FM_PG_LEAVING, b)))
		return 0;
	*v = (struct victim){ .addr = r->base + (i << PG_SHIFT), .r = r, .i = i, .old = b };
	return 1;
}

static int is_garbage(uint8_t b)
{
	return fm_pg_state(b) == FM_PG_CLEAN && (b & FM_PGF_GARBAGE);
}

/*
 * Garbage from the hints, the oldest first: what was freed last is what a
 * collector allocates into next (G1 takes the young regions it frees back
 * first), and evicting it would make that allocation a zero fill, while
 * free space that stayed free since an older cycle was not wanted. Caller
 * holds clock_lock.
 */
static unsigned pick_garbage(struct fm_pager *p, struct victim *v, unsigned want)
{
	unsigned n = 0;

	while (n < want && p->nhints) {
		struct garbage_hint *h = &p->hints[p->hint_head];
		struct region *r = &p->regions[h->region];
		if (!r->live || h->first + h->n > r->npages || atomic_load(&r->pinned)) {
			p->hint_head = (p->hint_head + 1) % MAX_HINTS;
			p->nhints--;
			continue;
		}
		while (n < want && h->n) {
			uint64_t i = h->first++;
			uint8_t b = pg_load(&r->pg[i]);
			h->n--;
			if (is_garbage(b) && take(r, i, b, &v[n]))
				n++;
		}
		if (!h->n) {
			p->hint_head = (p->hint_head + 1) % MAX_HINTS;
			p->nhints--;
		}
	}
	return n;
}

/*
 * What a run over memory larger than the budget went through last (and what
 * a full GC's compaction passed, fm_evict_done): a loop
 * comes back to it last, so it leaves first (the newest range first), and
 * what the run finds resident when it comes round stays so. A clock, as
 * an LRU, takes what the loop needs next: 512 MiB rewritten in order four
 * times and checked once, at 448 MiB local, read 364k pages back where
 * 82k do. Caller holds clock_lock.
 */
static unsigned pick_passed(struct fm_pager *p, struct victim *v, unsigned n, unsigned want)
{
	unsigned looped = 0;

	while (n < want && p->npassed) {
		unsigned top = (p->passed_top + MAX_PASSED - 1) % MAX_PASSED;
		struct passed_run *h = &p->passed[top];
		struct region *r = &p->regions[h->region];

		if (!r->live || atomic_load(&r->pinned))
			h->n = 0;
		while (n < want && h->n) {
			uint64_t i = h->last;
			uint8_t b;
			unsigned st;

			h->last -= (uint64_t)h->stride;
			h->n--;
			if (i >= r->npages)
				continue;
			b = pg_load(&r->pg[i]);
			st = fm_pg_state(b);
			if ((st == FM_PG_CLEAN || st == FM_PG_DIRTY) && take(r, i, b, &v[n])) {
				v[n].loop = (uint8_t)h->loop;
				looped += (unsigned)h->loop;
				n++;
			}
		}
		if (!h->n) {
			p->passed_top = top;
			p->npassed--;
		}
	}
	if (looped)
		STAT_ADD(p, loop_evictions, looped);
	return n;
}

/*
 * Whether any of eight state bytes is CLEAN or DIRTY: a page the hand has
 * to look at. A reservation's window or a sparse heap is mostly pages that
 * are not resident (UNMANAGED where nothing is committed): GHC's 4 GiB
 * windows held 40 MiB, and the hand spent a third of a CPU stepping
 * through the rest a byte at a time.
 */
static int any_resident(uint64_t states)
{
	const uint64_t ones = 0x0101010101010101ull, highs = ones << 7;
	uint64_t s = states & (ones * FM_PG_STATE_MASK);
	uint64_t clean = s ^ (ones * FM_PG_CLEAN), dirty = s ^ (ones * FM_PG_DIRTY);

	/* A byte of clean or dirty is zero just where the state matches. */
	return ((((clean - ones) & ~clean) | ((dirty - ones) & ~dirty)) & highs) != 0;
}

/*
 * Whether 64 state bytes are, word by word, all UNTOUCHED or all UNMANAGED:
 * what most of a sparse region is (glibc's main heap is a region of up to
 * 4 GiB from its first break, mawk's held 3 MiB), seen at a few operations
 * a word rather than any_resident's dozen.
 */
static int block_idle(const uint8_t *pg)
{
	const uint64_t unmanaged = 0x0101010101010101ull * FM_PG_UNMANAGED;
	uint64_t w[8];
	unsigned busy = 0;

	memcpy(w, pg, sizeof(w));
	for (int k = 0; k < 8; k++)
		busy |= (w[k] != 0) & (w[k] != unmanaged);
	return !busy;
}

/*
 * From i, a multiple of 8, the first word of eight state bytes before end
 * with a resident page in it (end, rounded down, if none). Not atomic as a
 * word: a page that settles resident just after the look waits for the
 * hand's next pass, as if the hand had passed it a moment earlier.
 */
static uint64_t next_resident_word(const struct region *r, uint64_t i, uint64_t end)
{
	while (i + 8 <= end) {
		uint64_t states;

		if (!(i & 63) && i + 64 <= end && block_idle(&r->pg[i])) {
			i += 64;
			continue;
		}
		memcpy(&states, &r->pg[i], sizeof(states));
		if (any_resident(states))
			break;
		i += 8;
	}
	return i;
}

/*
 * Choose up to want victims: garbage first, then by a clock hand. Pages
 * filled by GC threads and never touched by the program go at once; others
 * get a second chance if their REF bit is set. Caller holds rlock for reading.
 */
static unsigned pick(struct fm_pager *p, struct victim *v, unsigned want)
{
	unsigned n;
	uint64_t scanned = 0, total = 1;

	/*
	 * Two sweeps of every index the hand visits, so a referenced page gets
	 * its second chance: a sparse region's hand passes its unpaged pages
	 * too, so the bound is the regions' size, not the pages registered.
	 */
	for (int k = 0; k < p->nregions; k++)
		if (p->regions[k].live)
			total += p->regions[k].npages * 2;
	pthread_mutex_lock(&p->clock_lock);
	if (atomic_load(&p->forking)) {
		/* Every page must stay where the child can inherit it (fork.c). */
		pthread_mutex_unlock(&p->clock_lock);
		return 0;
	}
	n = pick_garbage(p, v, want);
	n = pick_passed(p, v, n, want);
	while (n < want && scanned < total) {
		struct region *r;
		uint64_t i;
		uint8_t b, h;
		unsigned s;

		if (p->hand_region >= p->nregions) {
			p->hand_region = 0;
			p->hand_idx = 0;
			atomic_store(&p->hot, p->hot_seen);
			p->hot_seen = 0;
		}
		r = &p->regions[p->hand_region];
		if (!r->live || atomic_load(&r->pinned) || p->hand_idx >= r->npages) {
			p->hand_region++;
			p->hand_idx = 0;
			if (!r->live || atomic_load(&r->pinned))
				scanned++;
			continue;
		}
		if (!(p->hand_idx & 7)) {
			uint64_t end = r->npages, to;

			if (total - scanned < end - p->hand_idx)
				end = p->hand_idx + (total - scanned);
			to = next_resident_word(r, p->hand_idx, end);
			if (to != p->hand_idx) {
				scanned += to - p->hand_idx;
				p->hand_idx = to;
				continue;
			}
		}
		i = p->hand_idx++;
		scanned++;
		b = pg_load(&r->pg[i]);
		s = fm_pg_state(b);
		if (s != FM_PG_CLEAN && s != FM_PG_DIRTY)
			continue;
		h = r->heat && !is_garbage(b) && !(b & FM_PGF_GC) ? heat_get(r, i) : 0;
		if (h >= HEAT_LEFT)
			h = 0;
		if ((b & FM_PGF_REF) && !is_garbage(b) && !(p->cfg.gc_aware && (b & FM_PGF_GC))) {
			uint8_t nb = (uint8_t)(b & ~FM_PGF_REF);
			pg_cas(&r->pg[i], &b, nb);
			p->hot_seen += h > 0;
			continue;
		}
		if (h) {
			heat_set(r, i, (uint8_t)(h - 1));
			p->hot_seen += h > 1;
			continue;
		}
		if (take(r, i, b, &v[n]))
			n++;
	}
	pthread_mutex_unlock(&p->clock_lock);
	return n;
}

static void swap_victims(struct victim *a, struct victim *b)
{
	struct victim t = *a;

	*a = *b;
	*b = t;
}

/*
 * Victims by address, whatever chose them: write-protect, move and drop
 * make one call per run of rising addresses, and the look at the pins is
 * one walk. The hand's come out so; a loop's (pick_passed) are taken newest
 * first, a forward run's in falling order, and cost a call a dirty page
 * where no capture is made (--fault thread: 167,714 calls against 24,116
 * for a 512 MiB loop at 384 MiB, session 61). In place and by hand: libc's
 * qsort may malloc, and this runs inside the program's allocator (a static
 * jemalloc hung, session 61). Falling stretches are turned first, so a
 * loop's share costs no more than a pass; the rest is an insertion sort of
 * at most FM_EVICT_MAX.
 */
static void sort_victims(struct victim *v, unsigned n)
{
	for (unsigned a = 0; a < n;) {
		unsigned z = a + 1;

		while (z < n && v[z].addr < v[z - 1].addr)
			z++;
		for (unsigned x = a, y = z - 1; x < y; x++, y--)
			swap_victims(&v[x], &v[y]);
		a = z;
	}
	for (unsigned k = 1; k < n; k++)
		for (unsigned j = k; j && v[j].addr < v[j - 1].addr; j--)
			swap_victims(&v[j], &v[j - 1]);
}

/*
 * A system call may be using some of them (pins.h): those stay. The claims
 * above were sequentially consistent, and so is this look at the pins.
 * Victims come sorted (sort_victims).
 */
static unsigned unpin_victims(struct fm_pager *p, struct victim *v, unsigned n)
{
	uintptr_t addrs[FM_EVICT_MAX];
	uint8_t held[FM_EVICT_MAX];
	unsigned kept = 0;

	if (!n || !atomic_load(&p->npins))
		return n;
	for (unsigned k = 0; k < n; k++)
		addrs[k] = v[k].addr;
	if (!fm_pins_holding(p, addrs, n, held))
		return n;
	for (unsigned k = 0; k < n; k++) {
		if (held[k]) {
			fm_release(p, &v[k].r->pg[v[k].i], pg_make(FM_PG_LEAVING, v[k].old), v[k].old);
			continue;
		}
		v[kept++] = v[k];
	}
	return kept;
}

/*
 * Victims of shmem regions leave the file itself (MADV_REMOVE punches them
 * out of the page cache, which frees them; MADV_DONTNEED would only unmap
 * them). One call per run of neighbours: process_madvise has no MADV_REMOVE.
 */
static void drop_shared(struct fm_pager *p, struct victim *v, unsigned n)
{
	for (unsigned k = 0; k < n;) {
		unsigned e = k;
		if (v[k].keep || !v[k].r->alias) {
			k++;
			continue;
		}
		while (e + 1 < n && !v[e + 1].keep && v[e + 1].r == v[k].r &&
		       v[e + 1].addr == v[e].addr + PG_SIZE)
			e++;
		fm_shmem_drop(v[k].r, v[k].addr, (size_t)(e - k + 1) * PG_SIZE);
		STAT_ADD(p, evict_syscalls, 1);
		k = e + 1;
	}
}

/* Drop the given pages: one process_madvise for all of them where the kernel allows it. */
static void drop(struct fm_pager *p, struct victim *v, unsigned n)
{
	struct iovec iov[FM_EVICT_MAX];
	unsigned niov = 0, shared = 0;

	for (unsigned k = 0; k < n; k++) {
		if (v[k].keep || v[k].moved)
			continue;
		if (v[k].r->alias) {
			shared++;
			continue;
		}
		if (niov && (uintptr_t)iov[niov - 1].iov_base + iov[niov - 1].iov_len == v[k].addr)
			iov[niov - 1].iov_len += PG_SIZE;
		else
			iov[niov++] = (struct iovec){ (void *)v[k].addr, PG_SIZE };
	}
	if (shared)
		drop_shared(p, v, n);
	if (!niov)
		return;
	if (p->pidfd >= 0) {
		ssize_t rc = syscall(SYS_process_madvise, p->pidfd, iov, niov, MADV_DONTNEED, 0);
		STAT_ADD(p, evict_syscalls, 1);
		if (rc >= 0) {
			size_t want = 0;
			for (unsigned k = 0; k < niov; k++)
				want += iov[k].iov_len;
			if ((size_t)rc == want)
				return;
		}
		/* Before 6.13 process_madvise refuses MADV_DONTNEED even on ourselves. */
		close(p->pidfd);
		p->pidfd = -1;
	}
	for (unsigned k = 0; k < niov; k++) {
		if (fm_sys_madvise(iov[k].iov_base, iov[k].iov_len, MADV_DONTNEED))
			fm_fatal("madvise(DONTNEED) of an evicted page failed: %s", fm_strerror(errno));
		STAT_ADD(p, evict_syscalls, 1);
	}
}

/* The longest stretch of other pages one write-protect call reaches over. */
#define WP_GAP_PAGES 64

/*
 * 1 if one write-protect call may reach over pages [i0, i1) of r, which are
 * not victims: none of them may be writable by our books. Protecting a page
 * that is already protected, or not mapped, does nothing; one that turns
 * writable meanwhile (a fill that lands now) is booked DIRTY while protected,
 * which its next write finds and mends (fault.c, a stale write-protect
 * fault). So a batch of scattered victims costs fewer calls, and fewer TLB
 * shootdowns, than one per victim. Not over a page we do not manage: the
 * program may have taken it out of the uffd's reach (a guard page made
 * PROT_NONE inside V8's code space), and a call that meets a range the uffd
 * does not cover fails whole (ENOENT).
 */
static int gap_is_protectable(struct region *r, uint64_t i0, uint64_t i1)
{
	if (i1 - i0 > WP_GAP_PAGES)
		return 0;
	for (uint64_t i = i0; i < i1; i++) {
		unsigned s = fm_pg_state(pg_load(&r->pg[i]));
		if (s == FM_PG_DIRTY || s == FM_PG_UPDATING || s == FM_PG_FILLING || s == FM_PG_UNMANAGED)
			return 0;
	}
	return 1;
}

/*
 * Write-protect the dirty victims (on), in runs that reach over gaps of pages
 * nobody can write; or open again the ones memd refused (off), exactly.
 */
static void protect_dirty(struct fm_pager *p, struct victim *v, unsigned n, int on)
{
	for (unsigned k = 0; k < n;) {
		unsigned e = k;
		if (fm_pg_state(v[k].old) != FM_PG_DIRTY || (!on && !v[k].keep) || v[k].moved || v[k].pinned) {
			k++;
			continue;
		}
		for (unsigned j = k + 1; j < n; j++) {
			if (v[j].r != v[e].r || v[j].i <= v[e].i || v[j].moved || v[j].pinned)
				break;
			if (fm_pg_state(v[j].old) != FM_PG_DIRTY || (!on && !v[j].keep)) {
				/* A clean victim is protected already: it may sit inside a run. */
				if (on && fm_pg_state(v[j].old) == FM_PG_CLEAN)
					continue;
				break;
			}
			if (on ? !gap_is_protectable(v[e].r, v[e].i + 1, v[j].i) : v[j].i != v[e].i + 1)
				break;
			e = j;
		}
		fm_uffd_wp(v[k].r->uffd, v[k].addr, (size_t)(v[e].i - v[k].i + 1) * PG_SIZE, on);
		STAT_ADD(p, evict_syscalls, 1);
		k = e + 1;
	}
}

/*
 * A page filled with zeros ahead of an allocation that never came (fault.c
 * fills fresh runs) is dirty by our books: it needs no write-back when memd
 * holds nothing for it and its bytes are still zeros. Write-protected by
 * now, so nobody writes it while we look; a written page stops the look at
 * its first non-zero word.
 */
static int zero_page(const void *page)
{
	const uint64_t *w = page;

	for (unsigned k = 0; k < PG_SIZE / 8; k++)
		if (w[k])
			return 0;
	return 1;
}

/*
 * A page installed writable on a guess (FM_PGF_REWRITE) that memd still
 * holds byte for byte was not written: it leaves clean, and the guess ends.
 * Only where looking costs no round trip (shm: memd's store is mapped here,
 * and only this page's eviction writes its slot); elsewhere it is written
 * back, and the guess ends all the same (evict.c's release).
 */
static int guess_held(struct fm_pager *p, struct fm_chan *chan, struct region *r, uint64_t i, const void *bytes,
		      uint8_t *compared)
{
	const void *held;

	if (fm_xport_kind(p->x) != FM_XPORT_SHM || fm_chan_read(chan, r->space, &i, 1, &held))
		return 0;
	*compared = 1;
	return !memcmp(held, bytes, PG_SIZE);
}

/* Copy the dirty victims out to memd; the ones it refuses are kept. */
static unsigned write_back(struct fm_pager *p, struct fm_chan *chan, struct victim *v, unsigned n)
{
	uint64_t pages[FM_EVICT_MAX];
	const void *data[FM_EVICT_MAX];
	uint32_t status[FM_EVICT_MAX];
	unsigned idx[FM_EVICT_MAX], written = 0;

	for (unsigned k = 0; k < n;) {
		unsigned m = 0;
		struct region *r = NULL;
		int rc;
		/* One request per space. */
		for (; k < n; k++) {
			const void *bytes;
			if (fm_pg_state(v[k].old) != FM_PG_DIRTY || v[k].pinned)
				continue;
			if (r && v[k].r != r)
				break;
			/* A shmem page may be in the file but not mapped at addr: read it through the alias. */
			bytes = v[k].bytes ? v[k].bytes
				: v[k].r->alias ? (const void *)(v[k].r->alias + (v[k].i << PG_SHIFT))
						: (const void *)v[k].addr;
			if (!(v[k].old & FM_PGF_HAS_REMOTE) && zero_page(bytes)) {
				v[k].zero = 1;
				continue;
			}
			/* Only against a copy that is still ours: a discard kills it (and clears HAS_REMOTE) before memd hears. */
			if ((v[k].old & FM_PGF_REWRITE) && (v[k].old & FM_PGF_HAS_REMOTE) &&
			    guess_held(p, chan, v[k].r, v[k].i, bytes, &v[k].compared)) {
				v[k].same = 1;
				continue;
			}
			r = v[k].r;
			pages[m] = v[k].i;
			data[m] = bytes;
			idx[m++] = k;
		}
		if (!m)
			continue;
		rc = atomic_load(&p->evict_broken) ? -EPIPE : fm_chan_write(chan, r->space, pages, m, data, status);
		if (rc) {
			if (!atomic_exchange(&p->evict_broken, 1))
				fm_err("cannot write pages to memd at %s (%s): eviction stops and pages stay local, "
				       "over the budget if need be", p->cfg.memd, fm_strerror(-rc));
			STAT_ADD(p, transport_errors, 1);
		}
		for (unsigned j = 0; j < m; j++) {
			if (!rc && status[j] == FM_OK) {
				written++;
				continue;
			}
			v[idx[j]].keep = 1;
			if (!rc) {
				STAT_ADD(p, memd_full, 1);
				atomic_store(&p->kept_give_back, 1); /* memory memd keeps for free space is wanted */
			}
		}
	}
	if (written) {
		STAT_ADD(p, remote_writes, written);
		STAT_ADD(p, remote_write_bytes, (uint64_t)written * PG_SIZE);
	}
	return written;
}

/* 1 if the page at addr is mapped by this process alone (pagemap's exclusive bit). */
static int mapped_here_only(uintptr_t addr)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 1;
	/* Not pread: under the shim that is a cover for the program's calls. */
	if (syscall(SYS_pread64, fd, &e, sizeof(e), (long)(addr >> PG_SHIFT) * (long)sizeof(e)) != (long)sizeof(e))
		e = 1ull << 56;
	close(fd);
	return !!(e & (1ull << 56));
}

/*
 * Pages a fork shared, or shared once (the kernel marks a page exclusive
 * again only when it is written), made this process's own without writing
 * them: a read that pins a page, a process_vm_readv of this process,
 * unshares it (by a copy while another process still maps it). A page
 * pinned for I/O is exclusive already and stays as it is. The n pages from
 * v[0] are resident and held (LEAVING): only a raw madvise of the program's
 * could take one away under the read. 0, or -1.
 */
static int unshare_pages(const struct victim *v, unsigned n)
{
	char b[FM_EVICT_MAX];
	struct iovec l = { b, n }, r[FM_EVICT_MAX];

	for (unsigned k = 0; k < n; k++)
		r[k] = (struct iovec){ (void *)v[k].addr, 1 };
	return syscall(SYS_process_vm_readv, getpid(), &l, 1, r, n, 0) == (long)n ? 0 : -1;
}

/*
 * Move the dirty victims out into s (capture.h's stages), in runs of
 * neighbours: the move is their drop, and their bytes are read in the stage.
 * The kernel refuses (EBUSY) a page that is pinned, and one shared with
 * another process (after a fork, or merged by KSM; never pinned: a pin
 * unshares first), also after the other process let go of it (the page is
 * not marked exclusive again until written). A pinned page stays as it is,
 * since I/O in flight writes it. In a region a fork or KSM may have shared,
 * a refused page is unshared and moved again: refused then, it is pinned
 * (before session 51 it was taken for shared and left write-protected and
 * dropped, and what another process's process_vm_writev wrote into it
 * through its pin was lost: vmrw forked, --fault thread). One the kernel
 * would not move for another reason (not mapped, a mapping of other
 * protections, or unshare failed), leaves the way it did before.
 * Only a move's destination must be registered with the uffd it is made on:
 * the victims of regions where the kernel waits (the second uffd) move too.
 * Returns the stage's slots used.
 */
static unsigned move_dirty(struct fm_pager *p, struct fm_stage *s, struct victim *v, unsigned n)
{
	unsigned used = 0, pinned = 0;

	for (unsigned k = 0; k < n;) {
		unsigned e = k, again = 0;
		unsigned unshared = 0; /* v[k..unshared) were unshared for the move being made again */
		if (fm_pg_state(v[k].old) != FM_PG_DIRTY || v[k].r->alias) {
			k++;
			continue;
		}
		while (e + 1 < n && v[e + 1].r == v[k].r && v[e + 1].addr == v[e].addr + PG_SIZE &&
		       fm_pg_state(v[e + 1].old) == FM_PG_DIRTY)
			e++;
		for (unsigned m = k; m <= e;) {
			int64_t done = 0;
			int rc = fm_uffd_move(p->uffd, (uintptr_t)(s->base + (size_t)used * PG_SIZE), v[m].addr,
					      (size_t)(e - m + 1) * PG_SIZE, 0, &done);
			STAT_ADD(p, evict_syscalls, 1);
			for (int64_t q = 0; q < done >> PG_SHIFT; q++, m++, used++) {
				v[m].moved = 1;
				v[m].bytes = s->base + (size_t)used * PG_SIZE;
			}
			if (!rc)
				break;
			if (rc == -EAGAIN && again++ < 16)
				continue;
			if (rc == -EBUSY && atomic_load(&v[m].r->shared) && m >= unshared &&
			    !unshare_pages(&v[m], e - m + 1)) {
				STAT_ADD(p, evict_syscalls, 1);
				unshared = e + 1;
				continue;
			}
			/* A page shared once stays refused after the sharer let go: unshared above, it is not. */
			if (rc == -EBUSY && (!atomic_load(&v[m].r->shared) || m < unshared) && mapped_here_only(v[m].addr)) {
				v[m].pinned = 1;
				v[m].keep = 1;
				pinned++;
			}
			m++;
			again = 0;
		}
		k = e + 1;
	}
	if (pinned)
		STAT_ADD(p, evict_pinned, pinned);
	return used;
}

/*
 * Splice the dirty victims into c: 0, or -1 to write-protect as before (none
 * dirty, a shmem one, whose drop punches the file, or a page not mapped).
 */
static int capture_dirty(struct fm_pager *p, struct fm_capture *c, struct victim *v, unsigned n, unsigned *nd)
{
	struct iovec iov[FM_EVICT_MAX];
	unsigned niov = 0;

	*nd = 0;
	for (unsigned k = 0; k < n; k++) {
		if (fm_pg_state(v[k].old) != FM_PG_DIRTY)
			continue;
		if (v[k].r->alias)
			return -1;
		if (niov && (uintptr_t)iov[niov - 1].iov_base + iov[niov - 1].iov_len == v[k].addr)
			iov[niov - 1].iov_len += PG_SIZE;
		else
			iov[niov++] = (struct iovec){ (void *)v[k].addr, PG_SIZE };
		(*nd)++;
	}
	if (!*nd)
		return -1;
	STAT_ADD(p, evict_syscalls, 1);
	return fm_capture_splice(c, iov, niov, *nd);
}

/*
 * After the drop: the dirty victims' bytes, from the pipe. A page memd holds
 * goes straight into its slot when memd's store is mapped here (shm), and
 * the write then only checksums it there: one copy of the page instead of
 * two. Not a page whose bytes write_back looks at before it writes (a zero
 * page new to memd, a rewrite guess compared with memd's copy), and not once
 * memd is given up: capture_restore then reinstalls from the slot, which
 * only this eviction writes while the page is LEAVING.
 */
static void capture_collect(struct fm_pager *p, struct fm_chan *chan, struct fm_capture *c, struct victim *v,
			    unsigned n)
{
	struct iovec iov[FM_EVICT_MAX];
	int in_place = fm_xport_kind(p->x) == FM_XPORT_SHM && !atomic_load(&p->evict_broken);
	unsigned j = 0, niov = 0;

	for (unsigned k = 0; k < n; k++) {
		uint8_t *to;
		if (fm_pg_state(v[k].old) != FM_PG_DIRTY)
			continue;
		to = c->bytes + (size_t)j++ * PG_SIZE;
		if (in_place && (v[k].old & FM_PGF_HAS_REMOTE) && !(v[k].old & FM_PGF_REWRITE) &&
		    fm_chan_page_open(chan, v[k].r->space, v[k].i, FM_PAGE_OVERWRITE, &to) == 0)
			STAT_ADD(p, evictions_in_place, 1);
		v[k].bytes = to;
		if (niov && (uint8_t *)iov[niov - 1].iov_base + iov[niov - 1].iov_len == to)
			iov[niov - 1].iov_len += PG_SIZE;
		else
			iov[niov++] = (struct iovec){ to, PG_SIZE };
	}
	fm_capture_collect(c, iov, niov);
	STAT_ADD(p, evict_syscalls, 1);
}

/*
 * Captured (or moved) pages memd refused were dropped already: they go back
 * in, writable, from what the pipe (or the stage) held. Nothing else can have been installed
 * there meanwhile (the page is LEAVING), unless the program unmapped it, and
 * then its bytes are dead anyway.
 */
static void capture_restore(struct fm_pager *p, struct victim *v, unsigned n)
{
	for (unsigned k = 0; k < n; k++) {
		uint64_t skipped;
		if (!v[k].keep || !v[k].bytes)
			continue;
		fm_uffd_install(v[k].r->uffd, v[k].addr, v[k].bytes, 1, 0, v[k].r->kernel_waits, &skipped);
		STAT_ADD(p, evict_syscalls, 1);
	}
}

unsigned fm_evict_batch(struct fm_pager *p, struct fm_chan *chan, unsigned want)
{
	struct victim v[FM_EVICT_MAX];
	struct fm_capture *cap;
	struct fm_stage *stage;
	unsigned n, nd, staged, dropped = 0, clean = 0, dirty = 0, garbage = 0, pinned = 0;
	uint8_t now;

	if (fm_now_ns() < atomic_load(&p->full_until_ns))
		return 0;
	if (want > FM_EVICT_MAX)
		want = FM_EVICT_MAX;
	/*
	 * Once the kernel may pin pages for I/O, a page leaves only by a move:
	 * with every stage busy (more threads evicting at once than stages),
	 * none leaves now, and the fault that asked comes in over the budget.
	 */
	stage = fm_stage_take(p);
	if (!stage && atomic_load(&p->move_out))
		return 0;
	rlock_rd(p);
	n = pick(p, v, want);
	sort_victims(v, n);
	n = unpin_victims(p, v, n);
	if (!n) {
		rlock_un(p);
		if (stage)
			fm_stage_give(p, stage, 0);
		return 0;
	}
	if (stage) {
		staged = move_dirty(p, stage, v, n);
		STAT_ADD(p, evictions_moved, staged);
		/* The rest leave as they would have, write-protected first. */
		protect_dirty(p, v, n, 1);
		write_back(p, chan, v, n);
		protect_dirty(p, v, n, 0);
		drop(p, v, n);
		capture_restore(p, v, n);
		fm_stage_give(p, stage, staged);
		goto books;
	}
	cap = fm_capture_take(p);
	if (cap && capture_dirty(p, cap, v, n, &nd)) {
		fm_capture_give(cap);
		cap = NULL;
	}
	if (cap) {
		drop(p, v, n);
		capture_collect(p, chan, cap, v, n);
		STAT_ADD(p, evictions_captured, nd);
		write_back(p, chan, v, n);
		capture_restore(p, v, n);
		fm_capture_give(cap);
	} else {
		protect_dirty(p, v, n, 1);
		write_back(p, chan, v, n);
		/* Pages memd refused are opened again (the writers retry) and stay resident. */
		protect_dirty(p, v, n, 0);
		drop(p, v, n);
	}
books:
	now = heat_now(p);
	for (unsigned k = 0; k < n; k++) {
		uint8_t b = v[k].old, held = pg_make(FM_PG_LEAVING, b), nb;
		struct region *r = v[k].r;
		if (v[k].keep) {
			pinned += v[k].pinned;
			fm_release(p, &r->pg[v[k].i], held, pg_make(FM_PG_DIRTY, (uint8_t)(b | FM_PGF_REF)));
			continue;
		}
		if (v[k].zero) {
			clean++; /* zeros nobody wrote: untouched again */
		} else if (v[k].same) {
			clean++;
			b &= (uint8_t)~FM_PGF_REWRITE;
		} else if (fm_pg_state(b) == FM_PG_DIRTY) {
			dirty++;
			/* Seen written this stay (not only guessed to be): the next read installs it writable. */
			b = (uint8_t)(!(b & FM_PGF_REWRITE) || v[k].compared ? b | FM_PGF_REWRITE : b & ~FM_PGF_REWRITE);
			b |= FM_PGF_HAS_REMOTE;
			fm_memd_holds(p);
		} else if (b & FM_PGF_GARBAGE) {
			garbage++;
		} else {
			clean++;
		}
		/* A clean page memd never had held only zeros (or garbage): it is untouched again. */
		nb = (b & FM_PGF_HAS_REMOTE) ? pg_make(FM_PG_REMOTE, (uint8_t)(FM_PGF_HAS_REMOTE | (b & FM_PGF_REWRITE) |
									       (v[k].loop ? FM_PGF_LOOPED : 0)))
					     : pg_make(FM_PG_UNTOUCHED, 0);
		if (r->heat)
			heat_set(r, v[k].i, fm_pg_state(nb) == FM_PG_REMOTE ? (uint8_t)(HEAT_LEFT | now) : 0);
		pg_release(&r->pg[v[k].i], held, nb);
		dropped++;
	}
	rlock_un(p);
	/* The writers that met a LEAVING page wait for this. */
	fm_settled(p);
	/*
	 * memd refused everything it was offered: it is full. Trying again at
	 * every fault would write-protect and reopen the same pages for nothing;
	 * keep pages local for a while instead, over the budget. A batch kept
	 * whole because I/O pins it says nothing of memd and the I/O ends soon:
	 * backed off as long, the rest of a large read came in over the budget
	 * (dd iflag=direct, 64 MiB resident at 16 MiB).
	 */
	if (!dropped)
		atomic_store(&p->full_until_ns, fm_now_ns() + (pinned == n ? PINNED_BACKOFF_NS : FULL_BACKOFF_NS));
	STAT_ADD(p, evict_batches, 1);
	STAT_ADD(p, evictions_clean, clean + garbage);
	STAT_ADD(p, evictions_dirty, dirty);
	if (garbage)
		STAT_ADD(p, garbage_evicted, garbage);
	if (dropped) {
		fm_resident_add(p, -(int64_t)dropped);
		fm_churn(p, dropped);
	}
	return dropped;
}

uint64_t fm_evict_to_budget(struct fm_pager *p, int adopted)
{
	uint64_t total = 0, res;
	unsigned empty = 0;

	if (atomic_load(&p->resident) <= atomic_load(&p->limit))
		return 0;
	pthread_mutex_lock(&p->reg_lock);
	while (!atomic_load(&p->evict_broken) && (res = atomic_load(&p->resident)) > atomic_load(&p->limit)) {
		uint64_t over = res - atomic_load(&p->limit);
		unsigned n = fm_evict_batch(p, p->reg_chan, over < p->cfg.evict_batch ? (unsigned)over
										: p->cfg.evict_batch);
		if (!n) {
			/* memd full, or every page busy: the faults that follow evict as usual */
			if (++empty == FM_EVICT_LOOKS)
				break;
			sched_yield();
			continue;
		}
		total += n;
		/* Batch by batch: a GC cycle's garbage quota leaves these out (pager.c). */
		if (adopted)
			STAT_ADD(p, adopt_evictions, n);
	}
	pthread_mutex_unlock(&p->reg_lock);
	return total;
}

/* After a look where nothing could leave: 20 ms, then twice as long each time, at most 200 ms. */
static int longer_rest(int rest_ms)
{
	return !rest_ms ? 20 : rest_ms < 100 ? rest_ms * 2 : 200;
}

static int over_budget(struct fm_pager *p)
{
	return !p->evictor_started && !atomic_load(&p->evict_broken) &&
	       atomic_load(&p->resident) > atomic_load(&p->limit) && !fm_budget_all_fits(p);
}

int fm_budget_watch_ms(struct fm_pager *p, struct fm_budget_watch *w)
{
	uint64_t now;

	if (!over_budget(p)) {
		*w = (struct fm_budget_watch){ 0 };
		return -1;
	}
	now = fm_now_ns();
	if (!w->next_ns) {
		w->rest_ms = longer_rest(0);
		w->next_ns = now + (uint64_t)w->rest_ms * 1000000;
	}
	return now >= w->next_ns ? 0 : (int)((w->next_ns - now + 999999) / 1000000);
}

void fm_budget_watch_look(struct fm_pager *p, struct fm_budget_watch *w, struct fm_borrowed *b)
{
	if (!w->next_ns || fm_now_ns() < w->next_ns)
		return;
	while (over_budget(p) && fm_evict_batch(p, fm_borrow(p, b), p->cfg.evict_batch))
		;
	fm_give_back(p, b);
	if (!over_budget(p)) {
		*w = (struct fm_budget_watch){ 0 };
		return;
	}
	w->rest_ms = longer_rest(w->rest_ms);
	w->next_ns = fm_now_ns() + (uint64_t)w->rest_ms * 1000000;
}

void *fm_evictor_main(void *arg)
{
	struct fm_pager *p = arg;

	/*
	 * Over the budget with nothing that could leave (memd full, pages
	 * pinned for I/O): look again after a rest, longer each time, even if no
	 * fault kicks. A program whose pages are all resident faults no more,
	 * and stayed over its budget for good (dd reading again into its buffer).
	 */
	int rest_ms = 0; /* 0: until a fault kicks */

	pthread_setname_np(pthread_self(), "farmem-evict");
	while (!atomic_load(&p->stopping)) {
		int stuck = 0;
		fm_evictor_sleep(p, rest_ms);
		while (!atomic_load(&p->stopping) && !atomic_load(&p->evict_broken) && !fm_in_gc_pause(p) &&
		       atomic_load(&p->resident) > atomic_load(&p->low) && !fm_budget_all_fits(p)) {
			uint64_t over = atomic_load(&p->resident) - atomic_load(&p->low);
			unsigned want = over < p->cfg.evict_batch ? (unsigned)over : p->cfg.evict_batch;
			if (!fm_evict_batch(p, p->ev_chan, want)) {
				stuck = 1;
				break;
			}
			rest_ms = 0;
		}
		rest_ms = stuck ? longer_rest(rest_ms) : 0;
	}
	return NULL;
}
