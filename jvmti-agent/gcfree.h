/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The collector's free space at the end of a GC pause, found through
 * HotSpot's VMStructs (by name; see vmstructs.h), so that the agent can tell
 * the pager to discard it (fm_pager_discard): garbage never crosses the
 * network.
 *
 *   G1:       every region whose HeapRegionType::_tag is FreeTag, [bottom, end)
 *             G1CollectedHeap::_hrm -> HeapRegionManager::_regions
 *             -> G1HeapRegionTable::_base[0 .. _length) -> HeapRegion*
 *   Parallel: the unused tail [top, end) of eden, both survivor spaces and
 *             the old generation (ParallelScavengeHeap::_young_gen/_old_gen ->
 *             MutableSpace::_bottom/_top/_end); not with -XX:+UseNUMA.
 *   Serial:   the same four tails (GenCollectedHeap::_young_gen -> DefNewGeneration::
 *             _eden_space/_from_space/_to_space, _old_gen -> TenuredGeneration::
 *             _the_space; Space::_bottom/_end, ContiguousSpace::_top).
 *   Shenandoah: every region whose _state is _empty_committed, [bottom, end)
 *             ShenandoahHeap::_regions[0 .. _num_regions) -> ShenandoahHeapRegion*.
 *             Not _trash: its dead objects are recycled only after the
 *             concurrent weak-root and class-unloading phases that follow
 *             final mark; the next pause finds them empty.
 *
 * fm_gcfree_init resolves every name once (at VMInit); a name missing from
 * this JVM disables the feature, with the name in the reason. The walk is
 * plain loads and stores (no JNI, no JVMTI, no allocation, no locks), made
 * for a GarbageCollectionFinish callback, while the VM is at a safepoint.
 */
#ifndef FARMEM_GCFREE_H
#define FARMEM_GCFREE_H

#include <stddef.h>
#include <stdint.h>

enum fm_gcfree_kind {
	FM_GCFREE_NONE = 0,
	FM_GCFREE_G1 = 1,
	FM_GCFREE_PARALLEL = 2,
	FM_GCFREE_SHENANDOAH = 3,
	FM_GCFREE_SERIAL = 4,
};

/*
 * heap_start/heap_bytes: the reserved heap (every range found must lie in it).
 * Returns the collector's kind, or FM_GCFREE_NONE with why set.
 */
int fm_gcfree_init(uintptr_t heap_start, uint64_t heap_bytes, char *why, size_t whylen);

/* The kind fm_gcfree_init found; a name for a kind ("G1", "Parallel", "Shenandoah", "Serial"); granule: the region size, or 0. */
int fm_gcfree_kind(void);
const char *fm_gcfree_kind_name(int kind);
uint64_t fm_gcfree_granule(void);

typedef void (*fm_gcfree_fn)(uintptr_t addr, size_t len, void *arg);

/*
 * Call fn for each free range, adjacent free space coalesced, in address
 * order. Returns the number of ranges, or -1 if what the structures say
 * fails a sanity check (a region outside the heap, of the wrong size): then
 * nothing was reported, and why says what was wrong.
 */
long fm_gcfree_walk(fm_gcfree_fn fn, void *arg, char *why, size_t whylen);

/*
 * Whether addr lies in one of G1's young regions (eden or survivor): 1, 0,
 * or -1 when it is not known (not G1, outside the heap). Plain loads, for a
 * pause's GC threads (gcmove.c's promotions: a copy into a survivor region
 * is read again by the next young pause).
 */
int fm_gcfree_in_young(uintptr_t addr);
/*
 * G1 takes the regions it allocates in from the two ends of its free list,
 * which is in address order (HeapRegionManager::allocate_free_region, JDK
 * 17): young regions from the top, old ones from the bottom. So the free
 * space written again soonest is at its two ends: the next eden and
 * survivors at the top, the next pause's old regions at the bottom.
 * fm_gcfree_pause_begins, at a pause's start, notes its young regions and
 * which regions are free; fm_gcfree_reused_soon, at its end, gives about how
 * many bytes of the free space's top (the young regions counted at the
 * start) and bottom (the regions this pause took from the free list for old
 * objects) are written again before or in the next pause. Zeros where not
 * known (not G1, no pause noted). Plain loads, at a safepoint.
 */
void fm_gcfree_pause_begins(void);
void fm_gcfree_reused_soon(uint64_t *top, uint64_t *bottom);

#endif
