// SPDX-License-Identifier: Apache-2.0
/*
 * The collector's free space at the end of a pause (see gcfree.h).
 *
 * Why this is safe to discard: the JVMTI GarbageCollectionFinish event is
 * posted from JvmtiGCMarker's destructor (SvcGCMarker), which in JDK 17 lives
 * only inside VM operations that run at a safepoint: G1's young/mixed pauses
 * (G1CollectedHeap::do_collection_pause_at_safepoint_helper), its full GC
 * (G1FullGCScope), Remark and Cleanup (VM_G1Concurrent::doit), Parallel's
 * scavenge and full GC (psVMOperations.cpp), Serial's (VM_GenCollectForAllocation
 * and VM_GenCollectFull, gcVMOperations.cpp; VM_CollectForMetadataAllocation
 * for any collector), Shenandoah's pauses (ShenandoahGCPauseMark in
 * VM_Shenandoah*::doit). No Java thread runs then, and the GC workers are
 * done or, Shenandoah's concurrent ones, suspended. A free G1 region or an
 * empty committed Shenandoah region holds no object; Parallel's and Serial's
 * spaces hold none above top (the allocation that failed and caused the
 * pause is made inside it, before the event: below top). Shenandoah uncommits empty regions
 * without joining safepoints, but in JDK 17 its control thread does it, and
 * that thread is the one waiting in VMThread::execute for the pause. Were
 * another thread to do it (a later JDK), the uncommit takes the range from
 * the pager first (heap.c's hook) and a discard of a range the pager no
 * longer pages does nothing: either order is safe. Whoever allocates there after the pause writes
 * first (the pager write-protects discarded resident pages, so that write
 * makes them dirty again; a page whose only copy was remote reads as zeros,
 * which is as good as the garbage it held).
 */
#include "gcfree.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "vmstructs.h"

static int kind;
static uintptr_t heap_lo, heap_hi;
static uintptr_t heap_ptr_addr; /* &Universe::_collectedHeap */

/* G1 */
static int64_t o_hrm, o_regions, o_tbl_base, o_tbl_length, o_hr_bottom, o_hr_end, o_hr_type, o_type_tag;
static uint64_t tag_size, grain;
static int32_t free_tag;
static int32_t young_mask; /* G1's YoungMask, or 0 if this JVM does not say */

/* Shenandoah */
static int64_t o_sh_regions, o_sh_num_regions, o_sh_state, o_sh_bottom, o_sh_end;
static uint64_t state_size;
static int32_t sh_empty_committed;

/*
 * Parallel and Serial: four contiguous spaces, each [bottom, top) objects and
 * [top, end) free. Parallel's generations are static fields (young_addr,
 * old_addr); Serial's are fields of the heap (o_young_gen, o_old_gen).
 */
static uintptr_t young_addr, old_addr;
static int64_t o_young_gen, o_old_gen;
static int64_t o_eden, o_from, o_to, o_old_space, o_sp_bottom, o_sp_top, o_sp_end;

/* A field of type, or of alt where a later JDK moved it there (NULL: none). */
struct need {
	const char *type, *name;
	int64_t *offset;
	uintptr_t *address;
	const char *alt;
};

static int resolve(const struct need *n, size_t count, char *why, size_t whylen)
{
	for (size_t i = 0; i < count; i++) {
		if (fm_vms_field(n[i].type, n[i].name, n[i].offset, n[i].address) &&
		    (!n[i].alt || fm_vms_field(n[i].alt, n[i].name, n[i].offset, n[i].address))) {
			snprintf(why, whylen, "this JVM's VMStructs lack %s::%s", n[i].type, n[i].name);
			return -ENOENT;
		}
	}
	return 0;
}

/*
 * What a table of regions needs besides its fields: the int constant of the
 * free state (into *value), the size of the field it is compared with (the
 * first of the type names VMStructs knows), and the region size, a
 * power-of-two number of pages read at grain_addr.
 */
static int region_facts(const char *constant, int32_t *value, const char *const types[2], uint64_t *size,
			const char *grain_name, uintptr_t grain_addr, char *why, size_t whylen)
{
	if (fm_vms_int_constant(constant, value)) {
		snprintf(why, whylen, "this JVM's VMStructs lack the constant %s", constant);
		return -ENOENT;
	}
	if (fm_vms_type_size(types[0], size) && (!types[1] || fm_vms_type_size(types[1], size))) {
		snprintf(why, whylen, "this JVM's VMStructs do not give the size of %s", types[1] ? types[1] : types[0]);
		return -ENOENT;
	}
	if (*size != 1 && *size != 2 && *size != 4) {
		snprintf(why, whylen, "%s is %llu bytes: not a size farmem reads", types[1] ? types[1] : types[0],
			 (unsigned long long)*size);
		return -ENOTSUP;
	}
	grain = *(const uint64_t *)grain_addr;
	if (!grain || grain & 4095 || grain & (grain - 1)) {
		snprintf(why, whylen, "%s reads as %llu: not a power-of-two number of pages", grain_name,
			 (unsigned long long)grain);
		return -EINVAL;
	}
	return 0;
}

/*
 * G1's region types under the names JDK 17 and 21 give them, and those of
 * JDK 25 (HeapRegion became G1HeapRegion, and so on): the same fields.
 */
struct g1_names {
	const char *manager, *region, *type, *tag_types[2], *young_mask, *free_tag, *grain;
};

static const struct g1_names g1_names[] = {
	{ "HeapRegionManager", "HeapRegion", "HeapRegionType",
	  { "HeapRegionType::Tag volatile", "HeapRegionType::Tag" }, "HeapRegionType::YoungMask",
	  "HeapRegionType::FreeTag", "HeapRegion::GrainBytes" },
	{ "G1HeapRegionManager", "G1HeapRegion", "G1HeapRegionType",
	  { "G1HeapRegionType::Tag volatile", "G1HeapRegionType::Tag" }, "G1HeapRegionType::YoungMask",
	  "G1HeapRegionType::FreeTag", "G1HeapRegion::GrainBytes" },
};

static int init_g1(char *why, size_t whylen)
{
	const struct g1_names *g = &g1_names[0];
	uintptr_t grain_addr = 0;
	int64_t probe;

	for (size_t k = 1; k < sizeof(g1_names) / sizeof(g1_names[0]); k++)
		if (fm_vms_field(g->region, "_bottom", &probe, NULL) &&
		    !fm_vms_field(g1_names[k].region, "_bottom", &probe, NULL))
			g = &g1_names[k];
	{
		const struct need n[] = {
			{ "G1CollectedHeap", "_hrm", &o_hrm, NULL, NULL },
			{ g->manager, "_regions", &o_regions, NULL, NULL },
			{ "G1HeapRegionTable", "_base", &o_tbl_base, NULL, NULL },
			{ "G1HeapRegionTable", "_length", &o_tbl_length, NULL, NULL },
			{ g->region, "_bottom", &o_hr_bottom, NULL, NULL },
			{ g->region, "_end", &o_hr_end, NULL, NULL },
			{ g->region, "_type", &o_hr_type, NULL, NULL },
			{ g->type, "_tag", &o_type_tag, NULL, NULL },
			{ g->region, "GrainBytes", NULL, &grain_addr, NULL },
		};

		if (resolve(n, sizeof(n) / sizeof(n[0]), why, whylen))
			return -ENOENT;
	}
	if (fm_vms_int_constant(g->young_mask, &young_mask))
		young_mask = 0;
	return region_facts(g->free_tag, &free_tag, g->tag_types, &tag_size, g->grain, grain_addr, why, whylen);
}

static int init_shenandoah(char *why, size_t whylen)
{
	static const char *const state_types[2] = { "ShenandoahHeapRegion::RegionState", NULL };
	uintptr_t grain_addr = 0;
	const struct need n[] = {
		{ "ShenandoahHeap", "_regions", &o_sh_regions, NULL, NULL },
		{ "ShenandoahHeap", "_num_regions", &o_sh_num_regions, NULL, NULL },
		{ "ShenandoahHeapRegion", "_state", &o_sh_state, NULL, NULL },
		{ "ShenandoahHeapRegion", "_bottom", &o_sh_bottom, NULL, NULL },
		{ "ShenandoahHeapRegion", "_end", &o_sh_end, NULL, NULL },
		{ "ShenandoahHeapRegion", "RegionSizeBytes", NULL, &grain_addr, NULL },
	};

	if (resolve(n, sizeof(n) / sizeof(n[0]), why, whylen))
		return -ENOENT;
	return region_facts("ShenandoahHeapRegion::_empty_committed", &sh_empty_committed, state_types, &state_size,
			    "ShenandoahHeapRegion::RegionSizeBytes", grain_addr, why, whylen);
}

static int init_parallel(char *why, size_t whylen)
{
	const struct need n[] = {
		{ "ParallelScavengeHeap", "_young_gen", NULL, &young_addr, NULL },
		{ "ParallelScavengeHeap", "_old_gen", NULL, &old_addr, NULL },
		{ "PSYoungGen", "_eden_space", &o_eden, NULL, NULL },
		{ "PSYoungGen", "_from_space", &o_from, NULL, NULL },
		{ "PSYoungGen", "_to_space", &o_to, NULL, NULL },
		{ "PSOldGen", "_object_space", &o_old_space, NULL, NULL },
		{ "MutableSpace", "_bottom", &o_sp_bottom, NULL, NULL },
		{ "MutableSpace", "_top", &o_sp_top, NULL, NULL },
		{ "MutableSpace", "_end", &o_sp_end, NULL, NULL },
	};

	if (fm_vms_flag_bool("UseNUMA")) {
		snprintf(why, whylen, "Parallel with -XX:+UseNUMA splits eden into per-node spaces that "
			 "VMStructs do not describe");
		return -ENOTSUP;
	}
	return resolve(n, sizeof(n) / sizeof(n[0]), why, whylen);
}

/* JDK 25 calls Serial's heap SerialHeap, and its spaces' bounds are ContiguousSpace's own. */
static int init_serial(char *why, size_t whylen)
{
	const struct need n[] = {
		{ "GenCollectedHeap", "_young_gen", &o_young_gen, NULL, "SerialHeap" },
		{ "GenCollectedHeap", "_old_gen", &o_old_gen, NULL, "SerialHeap" },
		{ "DefNewGeneration", "_eden_space", &o_eden, NULL, NULL },
		{ "DefNewGeneration", "_from_space", &o_from, NULL, NULL },
		{ "DefNewGeneration", "_to_space", &o_to, NULL, NULL },
		{ "TenuredGeneration", "_the_space", &o_old_space, NULL, NULL },
		{ "Space", "_bottom", &o_sp_bottom, NULL, "ContiguousSpace" },
		{ "ContiguousSpace", "_top", &o_sp_top, NULL, NULL },
		{ "Space", "_end", &o_sp_end, NULL, "ContiguousSpace" },
	};

	return resolve(n, sizeof(n) / sizeof(n[0]), why, whylen);
}

int fm_gcfree_init(uintptr_t heap_start, uint64_t heap_bytes, char *why, size_t whylen)
{
	int rc;

	kind = FM_GCFREE_NONE;
	heap_lo = heap_start;
	heap_hi = heap_start + heap_bytes;
	if (fm_vms_field("Universe", "_collectedHeap", NULL, &heap_ptr_addr)) {
		snprintf(why, whylen, "this JVM's VMStructs lack Universe::_collectedHeap");
		return FM_GCFREE_NONE;
	}
	if (fm_vms_flag_bool("UseG1GC")) {
		rc = init_g1(why, whylen);
		kind = rc ? FM_GCFREE_NONE : FM_GCFREE_G1;
	} else if (fm_vms_flag_bool("UseParallelGC")) {
		rc = init_parallel(why, whylen);
		kind = rc ? FM_GCFREE_NONE : FM_GCFREE_PARALLEL;
	} else if (fm_vms_flag_bool("UseShenandoahGC")) {
		rc = init_shenandoah(why, whylen);
		kind = rc ? FM_GCFREE_NONE : FM_GCFREE_SHENANDOAH;
	} else if (fm_vms_flag_bool("UseSerialGC")) {
		rc = init_serial(why, whylen);
		kind = rc ? FM_GCFREE_NONE : FM_GCFREE_SERIAL;
	} else if (fm_vms_flag_bool("UseEpsilonGC")) {
		snprintf(why, whylen, "Epsilon never frees anything");
	} else {
		snprintf(why, whylen, "this collector's free space is not known to farmem (G1, Parallel, "
			 "Shenandoah and Serial are)");
	}
	return kind;
}

int fm_gcfree_kind(void)
{
	return kind;
}

const char *fm_gcfree_kind_name(int k)
{
	return k == FM_GCFREE_G1 ? "G1" : k == FM_GCFREE_PARALLEL ? "Parallel" :
	       k == FM_GCFREE_SHENANDOAH ? "Shenandoah" : k == FM_GCFREE_SERIAL ? "Serial" : "none";
}

uint64_t fm_gcfree_granule(void)
{
	return kind == FM_GCFREE_G1 || kind == FM_GCFREE_SHENANDOAH ? grain : 0;
}

static inline uintptr_t ld_ptr(uintptr_t base, int64_t off)
{
	return *(const volatile uintptr_t *)(base + (uintptr_t)off);
}

/* A field of 1, 2 or 4 bytes (an enum's or a tag's size, from VMStructs). */
static int32_t ld_sized(uintptr_t addr, uint64_t size)
{
	const volatile void *a = (const volatile void *)addr;

	return size == 4 ? *(const volatile int32_t *)a :
	       size == 2 ? *(const volatile uint16_t *)a : *(const volatile uint8_t *)a;
}

/* G1's region table: its base and length, or 0 when it does not read (or this JVM names no young tag). */
static uint64_t g1_table(uintptr_t *tbl_base)
{
	uintptr_t heap, tbl;

	if (kind != FM_GCFREE_G1 || !young_mask || !(heap = ld_ptr(heap_ptr_addr, 0)))
		return 0;
	tbl = heap + (uintptr_t)o_hrm + (uintptr_t)o_regions;
	*tbl_base = ld_ptr(tbl, o_tbl_base);
	return *tbl_base ? *(const volatile uint64_t *)(tbl + (uintptr_t)o_tbl_length) : 0;
}

static int32_t g1_tag(uintptr_t hr)
{
	return ld_sized(hr + (uintptr_t)o_hr_type + (uintptr_t)o_type_tag, tag_size);
}

/* A free region of a collector's table: 1 with its bounds, 0 if it is not free. */
typedef int (*free_region_fn)(uintptr_t region, uintptr_t *lo, uintptr_t *hi);

static int g1_free(uintptr_t hr, uintptr_t *lo, uintptr_t *hi)
{
	if (g1_tag(hr) != free_tag)
		return 0;
	*lo = ld_ptr(hr, o_hr_bottom);
	*hi = ld_ptr(hr, o_hr_end);
	return 1;
}

static int shenandoah_free(uintptr_t r, uintptr_t *lo, uintptr_t *hi)
{
	if (ld_sized(r + (uintptr_t)o_sh_state, state_size) != sh_empty_committed)
		return 0;
	*lo = ld_ptr(r, o_sh_bottom);
	*hi = ld_ptr(r, o_sh_end);
	return 1;
}

/*
 * A table of len region pointers at base, each region grain bytes. Two
 * passes: the first only checks (so that a structure we misread reports
 * nothing at all), the second reports. Both read the same values: nothing
 * changes them during a safepoint.
 */
static long walk_table(const char *gc, uintptr_t base, uint64_t len, free_region_fn is_free, fm_gcfree_fn fn,
		       void *arg, char *why, size_t whylen)
{
	long ranges = 0;

	if (!base || len > (heap_hi - heap_lo) / grain) {
		snprintf(why, whylen, "%s's region table reads as base %#lx, %llu regions, for a heap of %llu",
			 gc, (unsigned long)base, (unsigned long long)len,
			 (unsigned long long)((heap_hi - heap_lo) / grain));
		return -1;
	}
	for (int pass = 0; pass < 2; pass++) {
		uintptr_t run_lo = 0, run_hi = 0;
		for (uint64_t i = 0; i < len; i++) {
			uintptr_t region = *(const volatile uintptr_t *)(base + i * sizeof(uintptr_t)), lo, hi;
			if (!region)
				continue; /* never committed (G1) */
			if (!is_free(region, &lo, &hi))
				continue;
			if (!pass) {
				if (lo < heap_lo || hi > heap_hi || hi - lo != grain || lo & (grain - 1)) {
					snprintf(why, whylen, "%s region %llu reads as %#lx-%#lx: outside the heap "
						 "%#lx-%#lx or not one region", gc, (unsigned long long)i,
						 (unsigned long)lo, (unsigned long)hi, (unsigned long)heap_lo,
						 (unsigned long)heap_hi);
					return -1;
				}
				continue;
			}
			if (run_hi == lo) {
				run_hi = hi;
				continue;
			}
			if (run_hi > run_lo) {
				fn(run_lo, run_hi - run_lo, arg);
				ranges++;
			}
			run_lo = lo;
			run_hi = hi;
		}
		if (pass && run_hi > run_lo) {
			fn(run_lo, run_hi - run_lo, arg);
			ranges++;
		}
	}
	return ranges;
}

static uintptr_t collected_heap(char *why, size_t whylen)
{
	uintptr_t heap = ld_ptr(heap_ptr_addr, 0);

	if (!heap)
		snprintf(why, whylen, "Universe::_collectedHeap is NULL");
	return heap;
}

static long walk_g1(fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	uintptr_t heap = collected_heap(why, whylen), tbl;

	if (!heap)
		return -1;
	tbl = heap + (uintptr_t)o_hrm + (uintptr_t)o_regions;
	return walk_table("G1", ld_ptr(tbl, o_tbl_base), *(const volatile uint64_t *)(tbl + (uintptr_t)o_tbl_length),
			  g1_free, fn, arg, why, whylen);
}

static long walk_shenandoah(fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	uintptr_t heap = collected_heap(why, whylen);

	if (!heap)
		return -1;
	return walk_table("Shenandoah", ld_ptr(heap, o_sh_regions),
			  *(const volatile uint64_t *)(heap + (uintptr_t)o_sh_num_regions), shenandoah_free, fn, arg,
			  why, whylen);
}

/* Each space's [top, end), adjacent ones coalesced, after checking all four. */
static long walk_spaces(const char *gc, const uintptr_t sp[4], fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	struct { uintptr_t lo, hi; } r[4];
	int n = 0;
	long ranges = 0;

	for (int i = 0; i < 4; i++) {
		uintptr_t b, t, e;
		if (!sp[i]) {
			snprintf(why, whylen, "a %s space pointer reads as NULL", gc);
			return -1;
		}
		b = ld_ptr(sp[i], o_sp_bottom);
		t = ld_ptr(sp[i], o_sp_top);
		e = ld_ptr(sp[i], o_sp_end);
		if (b < heap_lo || e > heap_hi || t < b || t > e) {
			snprintf(why, whylen, "a %s space reads as bottom %#lx top %#lx end %#lx, heap "
				 "%#lx-%#lx", gc, (unsigned long)b, (unsigned long)t, (unsigned long)e,
				 (unsigned long)heap_lo, (unsigned long)heap_hi);
			return -1;
		}
		if (e > t) {
			int j = n++;
			while (j > 0 && r[j - 1].lo > t) { /* insertion sort by address */
				r[j] = r[j - 1];
				j--;
			}
			r[j].lo = t;
			r[j].hi = e;
		}
	}
	for (int i = 0; i < n; i++) {
		if (i && r[i].lo < r[i - 1].hi) {
			snprintf(why, whylen, "%s's spaces overlap (%#lx < %#lx)", gc, (unsigned long)r[i].lo,
				 (unsigned long)r[i - 1].hi);
			return -1;
		}
	}
	for (int i = 0; i < n; i++) {
		uintptr_t lo = r[i].lo, hi = r[i].hi;
		while (i + 1 < n && r[i + 1].lo == hi)
			hi = r[++i].hi;
		fn(lo, hi - lo, arg);
		ranges++;
	}
	return ranges;
}

/* young and old: the generations; their spaces at o_eden, o_from, o_to (young) and o_old_space (old). */
static long walk_generations(const char *gc, uintptr_t young, uintptr_t old, fm_gcfree_fn fn, void *arg,
			     char *why, size_t whylen)
{
	uintptr_t sp[4];

	if (!young || !old) {
		snprintf(why, whylen, "%s's generations read as NULL", gc);
		return -1;
	}
	sp[0] = ld_ptr(young, o_eden);
	sp[1] = ld_ptr(young, o_from);
	sp[2] = ld_ptr(young, o_to);
	sp[3] = ld_ptr(old, o_old_space);
	return walk_spaces(gc, sp, fn, arg, why, whylen);
}

static long walk_parallel(fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	return walk_generations("Parallel", ld_ptr(young_addr, 0), ld_ptr(old_addr, 0), fn, arg, why, whylen);
}

static long walk_serial(fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	uintptr_t heap = collected_heap(why, whylen);

	if (!heap)
		return -1;
	return walk_generations("Serial", ld_ptr(heap, o_young_gen), ld_ptr(heap, o_old_gen), fn, arg, why, whylen);
}

long fm_gcfree_walk(fm_gcfree_fn fn, void *arg, char *why, size_t whylen)
{
	if (kind == FM_GCFREE_G1)
		return walk_g1(fn, arg, why, whylen);
	if (kind == FM_GCFREE_PARALLEL)
		return walk_parallel(fn, arg, why, whylen);
	if (kind == FM_GCFREE_SHENANDOAH)
		return walk_shenandoah(fn, arg, why, whylen);
	if (kind == FM_GCFREE_SERIAL)
		return walk_serial(fn, arg, why, whylen);
	snprintf(why, whylen, "no collector to walk");
	return -1;
}

int fm_gcfree_in_young(uintptr_t addr)
{
	uintptr_t base, hr;
	uint64_t len, i;

	if (addr < heap_lo || addr >= heap_hi || !(len = g1_table(&base)))
		return -1;
	i = (addr - heap_lo) / grain;
	if (i >= len || !(hr = *(const volatile uintptr_t *)(base + i * sizeof(uintptr_t))))
		return -1;
	return (g1_tag(hr) & young_mask) != 0;
}

/*
 * At the last pause's start: its young bytes, and a bit per region that was
 * free (regions past FREE_BITS are not followed: their old allocations are
 * not counted).
 */
#define FREE_BITS 65536u
static uint64_t was_free[FREE_BITS / 64];
static uint64_t young_at_start;
static int noted;

void fm_gcfree_pause_begins(void)
{
	uintptr_t base;
	uint64_t len = g1_table(&base), young = 0;

	noted = 0;
	if (!len || len > (heap_hi - heap_lo) / grain)
		return;
	memset(was_free, 0, sizeof(was_free));
	for (uint64_t i = 0; i < len; i++) {
		uintptr_t hr = *(const volatile uintptr_t *)(base + i * sizeof(uintptr_t));
		int32_t tag;

		if (!hr)
			continue;
		tag = g1_tag(hr);
		if (tag & young_mask)
			young++;
		else if (tag == free_tag && i < FREE_BITS)
			was_free[i / 64] |= 1ull << (i % 64);
	}
	young_at_start = young * grain;
	noted = 1;
}

void fm_gcfree_reused_soon(uint64_t *top, uint64_t *bottom)
{
	uintptr_t base;
	uint64_t len = noted ? g1_table(&base) : 0, old = 0;

	*top = *bottom = 0;
	if (!len || len > (heap_hi - heap_lo) / grain)
		return;
	for (uint64_t i = 0; i < len && i < FREE_BITS; i++) {
		uintptr_t hr = *(const volatile uintptr_t *)(base + i * sizeof(uintptr_t));
		int32_t tag;

		if (!hr || !(was_free[i / 64] & (1ull << (i % 64))))
			continue;
		tag = g1_tag(hr);
		old += tag != free_tag && !(tag & young_mask);
	}
	*top = young_at_start;
	*bottom = old * grain;
	noted = 0;
}
