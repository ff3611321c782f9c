// SPDX-License-Identifier: GPL-2.0
/*
 * swapva - batched page-table swaps in the caller's own address space
 * (SVAGC's SwapVA as a loadable module), exposed as /dev/swapva.
 * The ABI is swapva.h; the design and its limits are docs/swapva.md.
 *
 * What it does per segment {src, dst, len}, under mmap_read_lock:
 *   1. checks both ranges: page aligned, disjoint, each inside one anonymous
 *      private read-write VMA, same protection and mlock state, neither
 *      registered with userfaultfd nor VM_MERGEABLE; the mm has no MMU
 *      notifiers (their range callbacks are not exported to modules on 6.1);
 *   2. makes sure every PMD of both ranges is a PTE table (a read fault
 *      through fixup_user_fault() maps the zero page where a table is
 *      missing: __pte_alloc is not exported), and that both VMAs have an
 *      anon_vma; a huge PMD is refused with EOPNOTSUPP;
 *   3. takes the anon_vma write lock(s) (fixed order), then per pair of PTE
 *      tables the two PTE locks (fixed order, once if shared), validates
 *      every PTE of the chunk and trylocks its folio, and only then swaps:
 *      ptep_get_and_clear() both, set_pte_at() crossed (dirty/accessed/
 *      soft-dirty bits travel), and for every anonymous page moves its rmap:
 *      folio->mapping to the destination VMA's anon_vma, folio->index to
 *      linear_page_index() at the new address (what UFFDIO_MOVE's
 *      move_present_pte does);
 *   4. a refused chunk undoes the chunks before it (their folios are still
 *      locked by us), so a segment is all or nothing.
 * After the batch, one TLB shootdown: an IPI to every online CPU that flushes
 * everything (__flush_tlb_all, all PCIDs). flush_tlb_mm_range() is not
 * exported; this is blunt but correct. Every moved folio holds an extra
 * reference until after that flush, so no page can be freed while a stale
 * TLB entry might still map it.
 *
 * Refused, never half-moved (errno in swapva.h): pages shared after fork,
 * KSM, maybe-pinned, in the swap cache, lazily freed, large folios, folios
 * locked by someone else (EBUSY); huge PMDs, swap/migration/device entries,
 * special PTEs, secondary MMUs (EOPNOTSUPP).
 */
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/highmem.h>
#include <linux/list.h>
#include <linux/mman.h>
#include <linux/mmzone.h>
#include <linux/mutex.h>
#include <linux/hugetlb.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/rmap.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>
#include <linux/userfaultfd_k.h>
#include <asm/tlbflush.h>

#include "swapva.h"

static unsigned int breakeven_pages = 4;
module_param(breakeven_pages, uint, 0644);
MODULE_PARM_DESC(breakeven_pages, "segment size (pages) suggested to user space as the break-even");

/* Moved folios are held until the TLB flush; flush early past this many. */
#define HOLD_MAX 16384

struct sv_hold {
	struct folio **f;
	unsigned long n, cap;
	bool dirty;  /* PTEs changed since the last flush */
};

struct sv_seg_state {
	struct vm_area_struct *vs, *vd;
	struct folio **locked;  /* folios we hold locked in this segment */
	unsigned int nlocked, caplocked;
	struct folio *contended;  /* a folio someone else had locked (referenced) */
};

/* Times a segment waits for a folio lock held elsewhere before EBUSY. */
#define SV_LOCK_RETRIES 8

static void sv_flush_ipi(void *unused)
{
	__flush_tlb_all();
}

static void sv_flush_all(void)
{
	on_each_cpu(sv_flush_ipi, NULL, 1);
}

static void sv_release(struct sv_hold *h)
{
	unsigned int i;

	if (!h->dirty)
		return;
	sv_flush_all();
	h->dirty = false;
	for (i = 0; i < h->n; i++)
		folio_put(h->f[i]);
	h->n = 0;
}

/* Is [addr, addr+len) inside one VMA we can move pages of? */
static int sv_vma(struct mm_struct *mm, unsigned long addr, unsigned long len,
		  struct vm_area_struct **out)
{
	struct vm_area_struct *vma = find_vma(mm, addr), *next;

	if (!vma || vma->vm_start > addr)
		return -EFAULT;
	if (addr + len > vma->vm_end) {
		next = find_vma(mm, vma->vm_end);
		return (!next || next->vm_start != vma->vm_end) ? -EFAULT : -EINVAL;
	}
	if (!vma_is_anonymous(vma) ||
	    (vma->vm_flags & (VM_SHARED | VM_HUGETLB | VM_PFNMAP | VM_IO | VM_MIXEDMAP)) ||
	    (vma->vm_flags & (VM_READ | VM_WRITE)) != (VM_READ | VM_WRITE))
		return -EINVAL;
	if (userfaultfd_armed(vma) || (vma->vm_flags & VM_MERGEABLE))
		return -EBUSY;
	*out = vma;
	return 0;
}

/* pmd of addr if it is a PTE table; NULL if none; ERR_PTR if huge/bad. */
static pmd_t *sv_pmd(struct mm_struct *mm, unsigned long addr)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;
	pmd_t *pmd, v;

	if (pgd_none(*pgd) || pgd_bad(*pgd))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(*p4d) || p4d_bad(*p4d))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (pud_none(*pud))
		return NULL;
	if (pud_trans_huge(*pud) || pud_devmap(*pud) || pud_bad(*pud))
		return ERR_PTR(-EOPNOTSUPP);
	pmd = pmd_offset(pud, addr);
	v = READ_ONCE(*pmd);
	if (pmd_none(v))
		return NULL;
	if (!pmd_present(v) || pmd_trans_huge(v) || pmd_devmap(v) || pmd_bad(v))
		return ERR_PTR(-EOPNOTSUPP);
	return pmd;
}

/* Every PMD of the range a PTE table; the VMA has an anon_vma. */
static int sv_prepare(struct mm_struct *mm, struct vm_area_struct *vma, unsigned long addr,
		      unsigned long len)
{
	unsigned long a, end = addr + len;
	pmd_t *pmd;
	int ret;

	if (!vma->anon_vma) {  /* a write fault allocates it (and one zero page) */
		ret = fixup_user_fault(mm, addr, FAULT_FLAG_WRITE, NULL);
		if (ret)
			return ret;
		if (!vma->anon_vma)
			return -EOPNOTSUPP;
	}
	for (a = addr; a < end; a = (a & PMD_MASK) + PMD_SIZE) {
		pmd = sv_pmd(mm, a);
		if (IS_ERR(pmd))
			return PTR_ERR(pmd);
		if (pmd)
			continue;
		ret = fixup_user_fault(mm, a, 0, NULL);
		if (ret)
			return ret;
		pmd = sv_pmd(mm, a);
		if (IS_ERR(pmd))
			return PTR_ERR(pmd);
		if (!pmd)
			return -EAGAIN;
	}
	return 0;
}

static inline struct anon_vma *sv_folio_anon_vma(struct folio *folio)
{
	return (struct anon_vma *)((unsigned long)folio->mapping - PAGE_MAPPING_ANON);
}

/* Check one PTE; *fp = its anonymous folio, or NULL for none / zero page. */
static int sv_check_pte(pte_t pte, struct vm_area_struct *vma, struct folio **fp)
{
	unsigned long pfn;
	struct page *page;
	struct folio *folio;

	*fp = NULL;
	if (pte_none(pte))
		return 0;
	if (!pte_present(pte))
		return -EOPNOTSUPP;  /* swap, migration, device, marker */
	pfn = pte_pfn(pte);
	if (is_zero_pfn(pfn))
		return 0;
	if (pte_special(pte) || pte_devmap(pte) || !pfn_valid(pfn))
		return -EOPNOTSUPP;
	page = pfn_to_page(pfn);
	folio = page_folio(page);
	if (!folio_test_anon(folio) || folio_test_ksm(folio) || folio_test_large(folio) ||
	    !PageAnonExclusive(page) || folio_maybe_dma_pinned(folio) ||
	    folio_test_swapcache(folio) || !folio_test_swapbacked(folio) ||
	    sv_folio_anon_vma(folio) != vma->anon_vma)
		return -EBUSY;
	*fp = folio;
	return 0;
}

static void sv_unlock_folios(struct sv_seg_state *st, unsigned int from)
{
	while (st->nlocked > from)
		folio_unlock(st->locked[--st->nlocked]);
}

/* -EDEADLK: locked by someone else; st->contended holds a reference to it. */
static int sv_lock_folio(struct sv_seg_state *st, struct folio *f)
{
	if (!f)
		return 0;
	if (!folio_trylock(f)) {
		folio_get(f);
		st->contended = f;
		return -EDEADLK;
	}
	st->locked[st->nlocked++] = f;
	return 0;
}

static void sv_rmap_move(struct folio *f, struct vm_area_struct *vma, unsigned long addr)
{
	if (!f)
		return;
	WRITE_ONCE(f->mapping, (struct address_space *)((unsigned long)vma->anon_vma +
							 PAGE_MAPPING_ANON));
	f->index = linear_page_index(vma, addr);
}

/*
 * Swap n PTEs at s/d (each run inside one PTE table), under both PTE locks.
 * undo = false: validate every pair and trylock its folios first, then swap
 * them all (or none). undo = true: swap back a chunk moved before (its folios
 * are still locked by us).
 */
static int sv_chunk(struct mm_struct *mm, struct sv_seg_state *st, unsigned long s,
		    unsigned long d, unsigned int n, bool undo)
{
	pmd_t *ps = sv_pmd(mm, s), *pd = sv_pmd(mm, d);
	spinlock_t *ls, *ld;
	pte_t *ts, *td;
	unsigned int i, mark = st->nlocked;
	int ret = 0;

	if (IS_ERR_OR_NULL(ps) || IS_ERR_OR_NULL(pd))
		return ps && pd ? -EOPNOTSUPP : -EAGAIN;
	ts = pte_offset_map(ps, s);
	td = pte_offset_map(pd, d);
	ls = pte_lockptr(mm, ps);
	ld = pte_lockptr(mm, pd);
	if (ls == ld) {
		spin_lock(ls);
	} else if (ls < ld) {
		spin_lock(ls);
		spin_lock_nested(ld, SINGLE_DEPTH_NESTING);
	} else {
		spin_lock(ld);
		spin_lock_nested(ls, SINGLE_DEPTH_NESTING);
	}
	for (i = 0; i < n && !undo; i++) {
		struct folio *fs, *fd;

		ret = sv_check_pte(ptep_get(ts + i), st->vs, &fs);
		if (!ret)
			ret = sv_check_pte(ptep_get(td + i), st->vd, &fd);
		if (!ret)
			ret = sv_lock_folio(st, fs);
		if (!ret)
			ret = sv_lock_folio(st, fd);
		if (ret) {
			sv_unlock_folios(st, mark);
			goto unlock;
		}
	}
	for (i = 0; i < n; i++) {
		unsigned long sa = s + i * PAGE_SIZE, da = d + i * PAGE_SIZE;
		pte_t vs, vd;
		struct folio *fs, *fd;

		if (pte_none(ptep_get(ts + i)) && pte_none(ptep_get(td + i)))
			continue;
		vs = ptep_get_and_clear(mm, sa, ts + i);
		vd = ptep_get_and_clear(mm, da, td + i);
		fs = pte_present(vs) && !is_zero_pfn(pte_pfn(vs)) ? page_folio(pte_page(vs)) : NULL;
		fd = pte_present(vd) && !is_zero_pfn(pte_pfn(vd)) ? page_folio(pte_page(vd)) : NULL;
		set_pte_at(mm, da, td + i, vs);
		set_pte_at(mm, sa, ts + i, vd);
		sv_rmap_move(fs, st->vd, da);
		sv_rmap_move(fd, st->vs, sa);
	}
unlock:
	spin_unlock(ls);
	if (ls != ld)
		spin_unlock(ld);
	pte_unmap(ts);
	pte_unmap(td);
	return ret;
}

/* Walk the segment in chunks that stay inside one PTE table on both sides.
 * *upto: in, where to stop (undo); out, how far it got. */
static int sv_walk(struct mm_struct *mm, struct sv_seg_state *st, unsigned long src,
		   unsigned long dst, unsigned long len, bool undo, unsigned long *upto)
{
	unsigned long off = 0;
	int ret = 0;

	while (off < len && (!undo || off < *upto)) {
		unsigned long s = src + off, d = dst + off;
		unsigned long n = min3(len - off, ((s & PMD_MASK) + PMD_SIZE) - s,
				       ((d & PMD_MASK) + PMD_SIZE) - d);

		ret = sv_chunk(mm, st, s, d, n >> PAGE_SHIFT, undo);
		if (ret)
			break;
		off += n;
	}
	*upto = off;
	return ret;
}

static void sv_lock_anon(struct anon_vma *a, struct anon_vma *b)
{
	struct anon_vma *ra = a->root, *rb = b->root;

	if (ra == rb) {
		down_write(&ra->rwsem);
	} else if (ra < rb) {
		down_write(&ra->rwsem);
		down_write_nested(&rb->rwsem, SINGLE_DEPTH_NESTING);
	} else {
		down_write(&rb->rwsem);
		down_write_nested(&ra->rwsem, SINGLE_DEPTH_NESTING);
	}
}

static void sv_unlock_anon(struct anon_vma *a, struct anon_vma *b)
{
	up_write(&a->root->rwsem);
	if (b->root != a->root)
		up_write(&b->root->rwsem);
}

static int sv_segment(struct mm_struct *mm, const struct swapva_seg *sg, struct sv_hold *h)
{
	unsigned long src = sg->src, dst = sg->dst, len = sg->len, npages, done;
	struct sv_seg_state st = { };
	unsigned int i, tries;
	int ret;

	if (!len || ((src | dst | len) & ~PAGE_MASK) || src + len < src || dst + len < dst ||
	    src + len > TASK_SIZE || dst + len > TASK_SIZE)
		return -EINVAL;
	if (src < dst + len && dst < src + len)
		return -EINVAL;
	ret = sv_vma(mm, src, len, &st.vs);
	if (!ret)
		ret = sv_vma(mm, dst, len, &st.vd);
	if (ret)
		return ret;
	if ((st.vs->vm_flags ^ st.vd->vm_flags) & (VM_READ | VM_WRITE | VM_EXEC | VM_LOCKED) ||
	    pgprot_val(st.vs->vm_page_prot) != pgprot_val(st.vd->vm_page_prot))
		return -EINVAL;
	ret = sv_prepare(mm, st.vs, src, len);
	if (!ret)
		ret = sv_prepare(mm, st.vd, dst, len);
	if (ret)
		return ret;

	npages = len >> PAGE_SHIFT;
	st.caplocked = 2 * npages;
	st.locked = kvmalloc_array(st.caplocked, sizeof(*st.locked), GFP_KERNEL);
	if (!st.locked)
		return -ENOMEM;
	for (tries = 0;; tries++) {
		sv_lock_anon(st.vs->anon_vma, st.vd->anon_vma);
		done = 0;
		ret = sv_walk(mm, &st, src, dst, len, false, &done);
		if (ret && done)  /* undo the chunks that moved: swapping again restores them */
			sv_walk(mm, &st, src, dst, len, true, &done);
		if (!ret) {  /* hold every moved folio until the TLB flush */
			h->dirty = true;
			for (i = 0; i < st.nlocked; i++) {
				folio_get(st.locked[i]);
				h->f[h->n++] = st.locked[i];
			}
		}
		/*
		 * Folios before the anon_vma: the next caller on this anon_vma
		 * must not find them still locked by us (it would see EBUSY).
		 */
		sv_unlock_folios(&st, 0);
		sv_unlock_anon(st.vs->anon_vma, st.vd->anon_vma);
		if (ret != -EDEADLK)
			break;
		/* someone else (reclaim, migration, a fault) holds a folio lock: wait for it */
		if (tries >= SV_LOCK_RETRIES || fatal_signal_pending(current)) {
			folio_put(st.contended);
			ret = -EBUSY;
			break;
		}
		folio_lock(st.contended);
		folio_unlock(st.contended);
		folio_put(st.contended);
		st.contended = NULL;
		cond_resched();
	}
	kvfree(st.locked);
	return ret;
}

struct sv_ival {
	u64 a, b;
	u32 idx;
};

static int sv_ival_cmp(const void *x, const void *y)
{
	const struct sv_ival *p = x, *q = y;

	return p->a < q->a ? -1 : p->a > q->a;
}

static bool sv_overlap_upto(const struct sv_ival *iv, unsigned int n, u32 k)
{
	u64 end = 0;
	unsigned int i;

	for (i = 0; i < n; i++) {
		if (iv[i].idx > k)
			continue;
		if (iv[i].a < end)
			return true;
		end = max(end, iv[i].b);
	}
	return false;
}

/* First segment index at which segments start to overlap one another (nr if never). */
static u32 sv_first_overlap(const struct swapva_seg *s, u32 nr)
{
	struct sv_ival *iv;
	u32 i, lo = 1, hi = nr - 1;

	if (nr < 2)
		return nr;
	iv = kvmalloc_array(2 * nr, sizeof(*iv), GFP_KERNEL);
	if (!iv)
		return 0;
	for (i = 0; i < nr; i++) {
		iv[2 * i] = (struct sv_ival){ s[i].src, s[i].src + s[i].len, i };
		iv[2 * i + 1] = (struct sv_ival){ s[i].dst, s[i].dst + s[i].len, i };
	}
	sort(iv, 2 * nr, sizeof(*iv), sv_ival_cmp, NULL);
	if (!sv_overlap_upto(iv, 2 * nr, nr - 1)) {
		kvfree(iv);
		return nr;
	}
	while (lo < hi) {
		u32 mid = lo + (hi - lo) / 2;

		if (sv_overlap_upto(iv, 2 * nr, mid))
			hi = mid;
		else
			lo = mid + 1;
	}
	kvfree(iv);
	return lo;
}

static long sv_ioc_batch(struct swapva_batch __user *ub)
{
	struct mm_struct *mm = current->mm;
	struct swapva_batch b;
	struct swapva_seg *segs = NULL;
	struct sv_hold h = { };
	u32 i, limit;
	int ret = 0;

	if (copy_from_user(&b, ub, sizeof(b)))
		return -EFAULT;
	b.done = 0;
	b.pages = 0;
	if ((b.flags & ~SWAPVA_FLAGS_ALL) ||
	    ((b.flags & SWAPVA_OP_MASK) != SWAPVA_OP_MOVE && (b.flags & SWAPVA_OP_MASK) != SWAPVA_OP_SWAP)) {
		ret = -EINVAL;
		goto out;
	}
	if (b.nr > SWAPVA_MAX_SEGS) {
		ret = -E2BIG;
		goto out;
	}
	if (!b.nr)
		goto out;
	if (!mm || mm_has_notifiers(mm)) {
		ret = -EOPNOTSUPP;
		goto out;
	}
	segs = kvmalloc_array(b.nr, sizeof(*segs), GFP_KERNEL);
	h.cap = HOLD_MAX;
	h.f = kvmalloc_array(h.cap, sizeof(*h.f), GFP_KERNEL);
	if (!segs || !h.f) {
		ret = -ENOMEM;
		goto out;
	}
	if (copy_from_user(segs, u64_to_user_ptr(b.segs), b.nr * sizeof(*segs))) {
		ret = -EFAULT;
		goto out;
	}
	limit = sv_first_overlap(segs, b.nr);
	if (mmap_read_lock_killable(mm)) {
		ret = -EINTR;
		goto out;
	}
	/* MOVE is a swap here: dst gets src's pages, src gets dst's old ones */
	for (i = 0; i < limit; i++) {
		unsigned long need = 2 * (segs[i].len >> PAGE_SHIFT);

		if (fatal_signal_pending(current) ||
		    ((b.flags & SWAPVA_F_INTR) && signal_pending(current))) {
			ret = -EINTR;
			break;
		}
		if (h.n + need > h.cap)  /* flush early: the hold list is full */
			sv_release(&h);
		if (need > h.cap && need <= 2UL * (TASK_SIZE >> PAGE_SHIFT)) {
			kvfree(h.f);
			h.cap = need;
			h.f = kvmalloc_array(h.cap, sizeof(*h.f), GFP_KERNEL);
			if (!h.f) {
				h.cap = 0;
				ret = -ENOMEM;
				break;
			}
		}
		ret = sv_segment(mm, &segs[i], &h);
		if (ret)
			break;
		b.done++;
		b.pages += segs[i].len >> PAGE_SHIFT;
		cond_resched();
	}
	sv_release(&h);
	mmap_read_unlock(mm);
	if (!ret && limit < b.nr)
		ret = -EINVAL;
out:
	b.err = ret;
	kvfree(segs);
	kvfree(h.f);
	if (copy_to_user(ub, &b, sizeof(b)))
		return -EFAULT;
	return ret;
}

/* ---- identity-mapped allocation (DVM) ---------------------------------------- */

/*
 * Why vm_insert_pages and not remap_pfn_range: inserted pages stay ordinary
 * refcounted pages, so the core mm frees each one when its last mapping goes
 * (partial munmap, fork, exit need no bookkeeping here), and GUP/pinning works
 * (an RDMA NIC can register them). remap_pfn_range makes a VM_PFNMAP|VM_IO
 * mapping that no one refcounts (the module would have to track every split
 * VMA to know when to free) and that GUP refuses. The pages are never on the
 * LRU, so reclaim, compaction and migration leave them where they are: the
 * identity stays true while they are mapped.
 *
 * The address is chosen in get_unmapped_area (mmap_lock held for write, so
 * at most one decision per mm is pending) and the block is inserted in
 * ->mmap under the same lock hold.
 */
struct sv_pending {
	struct list_head node;
	struct mm_struct *mm;
	unsigned long addr, len;
	struct page **pages;
};

struct sv_file {
	struct mutex lock;
	struct list_head pending;
};

static unsigned int idmap_contig_tries = 64;
module_param(idmap_contig_tries, uint, 0644);
MODULE_PARM_DESC(idmap_contig_tries, "alloc_contig_range attempts per mapping above MAX_ORDER");

static void sv_free_pages(struct page **pages, unsigned long n)
{
	unsigned long i;

	for (i = 0; i < n; i++)
		if (pages[i])
			put_page(pages[i]);
	kvfree(pages);
}

static void sv_pending_free(struct sv_pending *p)
{
	list_del(&p->node);
	sv_free_pages(p->pages, p->len >> PAGE_SHIFT);
	kfree(p);
}

/* Could [pfn, pfn+n) be taken by alloc_contig_range? A cheap pre-check. */
static unsigned long sv_contig_bad(struct zone *zone, unsigned long pfn, unsigned long n)
{
	unsigned long i;

	for (i = 0; i < n; i++) {
		struct page *p = pfn_to_online_page(pfn + i);

		if (!p || page_zone(p) != zone || PageReserved(p) || PageHuge(p))
			return i + 1;
	}
	return 0;
}

/* n physically contiguous pages (each with its own reference), or NULL. */
static struct page *sv_alloc_contig(unsigned long n)
{
	unsigned int order = get_order(n << PAGE_SHIFT), tries = idmap_contig_tries;
	unsigned long i, pfn, bad, align = pageblock_nr_pages;
	struct page *page;
	int nid, z;

	if (order < MAX_ORDER) {
		/* unmovable on purpose: it must not migrate */
		page = alloc_pages(GFP_HIGHUSER | __GFP_ZERO | __GFP_NOWARN | __GFP_RETRY_MAYFAIL, order);
		if (!page)
			return NULL;
		split_page(page, order);
		for (i = n; i < (1UL << order); i++)
			__free_page(page + i);
		return page;
	}
	/* alloc_contig_pages is not exported: scan the zones, highest first */
	for_each_online_node(nid) {
		for (z = MAX_NR_ZONES - 1; z >= 0; z--) {
			struct zone *zone = &NODE_DATA(nid)->node_zones[z];

			if (!populated_zone(zone))
				continue;
			pfn = ALIGN(zone->zone_start_pfn, align);
			while (tries && pfn + n <= zone_end_pfn(zone)) {
				bad = sv_contig_bad(zone, pfn, n);
				if (bad) {
					pfn = ALIGN(pfn + bad, align);
					continue;
				}
				tries--;
				if (!alloc_contig_range(pfn, pfn + n, MIGRATE_MOVABLE,
							GFP_KERNEL | __GFP_NOWARN)) {
					page = pfn_to_page(pfn);
					for (i = 0; i < n; i++)
						clear_highpage(page + i);
					return page;
				}
				pfn += align;
				cond_resched();
			}
		}
	}
	return NULL;
}

static void sv_free_block(struct page *first, unsigned long n)
{
	unsigned long i;

	for (i = 0; first && i < n; i++)
		__free_page(first + i);
}

static struct page **sv_page_array(struct page *first, unsigned long n)
{
	struct page **pages = kvcalloc(n, sizeof(*pages), GFP_KERNEL);
	unsigned long i;

	if (!pages) {
		sv_free_block(first, n);
		return NULL;
	}
	for (i = 0; i < n; i++) {
		/* RETRY_MAYFAIL: too big a request is ENOMEM, never the OOM killer */
		pages[i] = first ? first + i :
			   alloc_page(GFP_HIGHUSER | __GFP_ZERO | __GFP_NOWARN | __GFP_RETRY_MAYFAIL);
		if (!pages[i]) {
			sv_free_pages(pages, n);
			return NULL;
		}
	}
	return pages;
}

static int sv_mode(unsigned long pgoff, bool *strict)
{
	if (pgoff > (SWAPVA_IDMAP_STRICT >> PAGE_SHIFT) || (pgoff && pgoff != 1))
		return -EINVAL;
	*strict = pgoff == (SWAPVA_IDMAP_STRICT >> PAGE_SHIFT);
	return 0;
}

static unsigned long sv_get_unmapped_area(struct file *file, unsigned long addr,
					  unsigned long len, unsigned long pgoff,
					  unsigned long flags)
{
	struct sv_file *sf = file->private_data;
	struct mm_struct *mm = current->mm;
	struct sv_pending *p, *tmp;
	unsigned long n = len >> PAGE_SHIFT, pa, got;
	struct page *first;
	bool strict;
	int ret;

	ret = sv_mode(pgoff, &strict);
	if (ret)
		return ret;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if ((flags & MAP_TYPE) == MAP_PRIVATE)
		return -EINVAL;
	if (!n || (len & ~PAGE_MASK))
		return -EINVAL;
	/* MAP_FIXED (also mremap): the caller chose; ->mmap allocates and checks */
	if (flags & MAP_FIXED)
		return addr;

	mutex_lock(&sf->lock);
	/* a decision left by an mmap that failed after us (same mm, lock held) */
	list_for_each_entry_safe(p, tmp, &sf->pending, node)
		if (p->mm == mm)
			sv_pending_free(p);
	mutex_unlock(&sf->lock);

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	first = sv_alloc_contig(n);
	if (!first && strict) {
		kfree(p);
		return -ENOMEM;
	}
	got = -ENOMEM;
	if (first) {
		pa = PFN_PHYS(page_to_pfn(first));
		/* the arch allocator returns a free hint unchanged: MAP_FIXED_NOREPLACE */
		if (pa >= SWAPVA_IDMAP_MIN_VA && pa <= TASK_SIZE - len)
			got = mm->get_unmapped_area(file, pa, len, 0, flags);
		if (got != pa) {
			if (strict) {
				sv_free_block(first, n);
				kfree(p);
				return -EEXIST;
			}
			got = mm->get_unmapped_area(file, addr, len, 0, flags);
		}
	} else {
		got = mm->get_unmapped_area(file, addr, len, 0, flags);
	}
	if (IS_ERR_VALUE(got)) {
		sv_free_block(first, n);
		kfree(p);
		return got;
	}
	p->pages = sv_page_array(first, n);
	if (!p->pages) {
		kfree(p);
		return -ENOMEM;
	}
	p->mm = mm;
	p->addr = got;
	p->len = len;
	mutex_lock(&sf->lock);
	list_add(&p->node, &sf->pending);
	mutex_unlock(&sf->lock);
	return got;
}

/*
 * Every page is inserted at mmap time; a fault means the page was dropped
 * (MADV_DONTNEED) and is gone. Having vm_ops also keeps the core mm from
 * taking this mapping for an anonymous one (vma_is_anonymous).
 */
static vm_fault_t sv_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct sv_vm_ops = {
	.fault = sv_fault,
};

static int sv_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct sv_file *sf = file->private_data;
	unsigned long len = vma->vm_end - vma->vm_start, n = len >> PAGE_SHIFT, i;
	struct sv_pending *p, *found = NULL;
	struct page **pages = NULL, *first;
	bool strict;
	int ret;

	ret = sv_mode(vma->vm_pgoff, &strict);
	if (ret)
		return ret;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	mutex_lock(&sf->lock);
	list_for_each_entry(p, &sf->pending, node) {
		if (p->mm == vma->vm_mm && p->addr == vma->vm_start && p->len == len) {
			found = p;
			list_del(&p->node);
			break;
		}
	}
	mutex_unlock(&sf->lock);
	if (found) {
		pages = found->pages;
		kfree(found);
	} else {  /* MAP_FIXED: the address is given; identity only by chance */
		first = sv_alloc_contig(n);
		if (strict && (!first || PFN_PHYS(page_to_pfn(first)) != vma->vm_start)) {
			sv_free_block(first, n);
			return first ? -EEXIST : -ENOMEM;
		}
		pages = sv_page_array(first, n);
		if (!pages)
			return -ENOMEM;
	}
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	vma->vm_ops = &sv_vm_ops;
	i = n;
	ret = vm_insert_pages(vma, vma->vm_start, pages, &i);
	/* the mapping holds its own references now; on error mmap_region zaps it */
	sv_free_pages(pages, n);
	return ret;
}

static long sv_ioc_idmap_query(struct swapva_idmap_query __user *uq)
{
	struct mm_struct *mm = current->mm;
	struct swapva_idmap_query q;
	unsigned long a, end;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (copy_from_user(&q, uq, sizeof(q)))
		return -EFAULT;
	end = q.addr + q.len;
	if (!q.len || ((q.addr | q.len) & ~PAGE_MASK) || end < q.addr || end > TASK_SIZE || !mm)
		return -EINVAL;
	q.pages = q.len >> PAGE_SHIFT;
	q.present = 0;
	q.identity = 0;
	if (mmap_read_lock_killable(mm))
		return -EINTR;
	/* page tables are not freed under mmap_read_lock; the values are a snapshot */
	for (a = q.addr; a < end; a += PAGE_SIZE) {
		pgd_t *pgd = pgd_offset(mm, a);
		p4d_t *p4d;
		pud_t *pud;
		pmd_t *pmd, pv;
		pte_t *pte, v;
		unsigned long pfn;

		if (pgd_none(*pgd) || pgd_bad(*pgd))
			continue;
		p4d = p4d_offset(pgd, a);
		if (p4d_none(*p4d) || p4d_bad(*p4d))
			continue;
		pud = pud_offset(p4d, a);
		if (pud_none(*pud) || pud_bad(*pud) || !pud_present(*pud))
			continue;
		if (pud_leaf(*pud)) {
			pfn = pud_pfn(*pud) + ((a & ~PUD_MASK) >> PAGE_SHIFT);
			goto leaf;
		}
		pmd = pmd_offset(pud, a);
		pv = READ_ONCE(*pmd);
		if (pmd_none(pv) || !pmd_present(pv))
			continue;
		if (pmd_leaf(pv)) {
			pfn = pmd_pfn(pv) + ((a & ~PMD_MASK) >> PAGE_SHIFT);
			goto leaf;
		}
		if (pmd_bad(pv))
			continue;
		pte = pte_offset_map(pmd, a);
		v = ptep_get(pte);
		pte_unmap(pte);
		if (!pte_present(v))
			continue;
		pfn = pte_pfn(v);
leaf:
		q.present++;
		if (PFN_PHYS(pfn) == a)
			q.identity++;
		if (fatal_signal_pending(current))
			break;
	}
	mmap_read_unlock(mm);
	return copy_to_user(uq, &q, sizeof(q)) ? -EFAULT : 0;
}

static int swapva_open(struct inode *inode, struct file *file)
{
	struct sv_file *sf = kzalloc(sizeof(*sf), GFP_KERNEL);

	if (!sf)
		return -ENOMEM;
	mutex_init(&sf->lock);
	INIT_LIST_HEAD(&sf->pending);
	file->private_data = sf;
	return 0;
}

static int swapva_release(struct inode *inode, struct file *file)
{
	struct sv_file *sf = file->private_data;
	struct sv_pending *p, *tmp;

	list_for_each_entry_safe(p, tmp, &sf->pending, node)
		sv_pending_free(p);
	kfree(sf);
	return 0;
}

static long swapva_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct swapva_info in;

	switch (cmd) {
	case SWAPVA_IOC_INFO:
		memset(&in, 0, sizeof(in));
		in.abi_version = SWAPVA_ABI_VERSION;
		in.page_size = PAGE_SIZE;
		in.max_segs = SWAPVA_MAX_SEGS;
		in.breakeven_pages = breakeven_pages;
		in.features = SWAPVA_FEAT_SWAP | SWAPVA_FEAT_MOVE | SWAPVA_FEAT_HOLES |
			      SWAPVA_FEAT_ONE_FLUSH | SWAPVA_FEAT_RMAP | SWAPVA_FEAT_IDMAP;
		return copy_to_user((void __user *)arg, &in, sizeof(in)) ? -EFAULT : 0;
	case SWAPVA_IOC_BATCH:
		return sv_ioc_batch((struct swapva_batch __user *)arg);
	case SWAPVA_IOC_FLUSH:
		sv_flush_all();
		return 0;
	case SWAPVA_IOC_IDMAP_QUERY:
		return sv_ioc_idmap_query((struct swapva_idmap_query __user *)arg);
	}
	return -ENOTTY;
}

static const struct file_operations swapva_fops = {
	.owner = THIS_MODULE,
	.open = swapva_open,
	.release = swapva_release,
	.get_unmapped_area = sv_get_unmapped_area,
	.mmap = sv_mmap,
	.unlocked_ioctl = swapva_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice swapva_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "swapva",
	.fops = &swapva_fops,
	.mode = 0666,
};

static int __init swapva_init(void)
{
	return misc_register(&swapva_dev);
}

static void __exit swapva_exit(void)
{
	misc_deregister(&swapva_dev);
}

module_init(swapva_init);
module_exit(swapva_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("SwapVA: batched page-table swaps in the caller's address space");
MODULE_VERSION("1");
