// SPDX-License-Identifier: Apache-2.0
/* An object's class and its layout, read where the JVM keeps them (klass.h). */
#include "klass.h"

#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fm_util.h"
#include "vmstructs.h"

static int64_t klass_off = -1, lh_off = -1;
static const uintptr_t *narrow_klass_base;
static const int32_t *narrow_klass_shift;
static int compressed_klass;
static uint32_t lh_type_array; /* a layout helper at or above it is a primitive array's */
static int klass_unreadable;
static pid_t self;
/* An array klass's layout helper: where its header's bytes and log2 of its element's sit. */
static int32_t lh_hsize_shift, lh_hsize_mask, lh_esize_shift, lh_esize_mask;
static atomic_int arrays_known; /* those fields read, with compressed class pointers */
static uintptr_t page_size;
/* How a reference is stored: narrow (4 bytes, base + (n << shift)) or a plain address. */
static int compressed_oops;
static const uintptr_t *narrow_oop_base;
static const int32_t *narrow_oop_shift;
static atomic_int references_known;

/*
 * Layout helpers by narrow klass, the pair in one word so that readers need
 * no lock: (nk << 32) | lh. Few classes have their arrays copied or read so.
 */
#define LH_CACHE 64u
static _Atomic uint64_t lh_cache[LH_CACHE];
/* Without compressed class pointers: klass pointers seen, bit 0 set for a primitive array's. */
#define KLASS_CACHE 32u
static _Atomic uintptr_t klass_cache[KLASS_CACHE];
static atomic_uint klass_cache_next;

/* Where a narrow reference's base and shift are: JDK 17's _narrow_oop, JDK 21's and 25's _base and _shift. */
static void references_setup(void)
{
	uintptr_t base_addr, shift_addr;

	compressed_oops = fm_vms_flag_bool("UseCompressedOops");
	if (compressed_oops &&
	    ((fm_vms_field("CompressedOops", "_narrow_oop._base", NULL, &base_addr) &&
	      fm_vms_field("CompressedOops", "_base", NULL, &base_addr)) ||
	     (fm_vms_field("CompressedOops", "_narrow_oop._shift", NULL, &shift_addr) &&
	      fm_vms_field("CompressedOops", "_shift", NULL, &shift_addr))))
		return;
	if (compressed_oops) {
		narrow_oop_base = (const uintptr_t *)base_addr;
		narrow_oop_shift = (const int32_t *)shift_addr;
	}
	atomic_store_explicit(&references_known, 1, memory_order_release);
}

int fm_klass_setup(void)
{
	int32_t type_value, shift;
	uintptr_t base_addr, shift_addr;
	int compact_headers;

	if (lh_off >= 0 || klass_unreadable)
		return lh_off >= 0;
	compressed_klass = fm_vms_flag_bool("UseCompressedClassPointers");
	compact_headers = fm_vms_flag_bool("UseCompactObjectHeaders");
	/*
	 * JDK 25's compact headers keep the klass in the mark word, not where
	 * _metadata says. Its compressed klass base and shift are _base and
	 * _shift; JDK 17's and 21's _narrow_klass._base and _narrow_klass._shift.
	 */
	if (compact_headers ||
	    fm_vms_field("oopDesc", compressed_klass ? "_metadata._compressed_klass" : "_metadata._klass", &klass_off,
			 NULL) ||
	    (compressed_klass &&
	     ((fm_vms_field("CompressedKlassPointers", "_narrow_klass._base", NULL, &base_addr) &&
	       fm_vms_field("CompressedKlassPointers", "_base", NULL, &base_addr)) ||
	      (fm_vms_field("CompressedKlassPointers", "_narrow_klass._shift", NULL, &shift_addr) &&
	       fm_vms_field("CompressedKlassPointers", "_shift", NULL, &shift_addr)))) ||
	    fm_vms_int_constant("Klass::_lh_array_tag_type_value", &type_value) ||
	    fm_vms_int_constant("Klass::_lh_array_tag_shift", &shift) || shift <= 0 || shift >= 32 ||
	    fm_vms_field("Klass", "_layout_helper", &lh_off, NULL)) {
		klass_unreadable = 1;
		lh_off = -1;
		fm_info("gc_moves, object_reads: %s: arrays are promoted through local memory and read a page at a time",
			compact_headers ? "compact object headers keep an object's class in its mark word"
					: "this JVM does not describe its classes' layout");
		return 0;
	}
	if (compressed_klass) {
		narrow_klass_base = (const uintptr_t *)base_addr;
		narrow_klass_shift = (const int32_t *)shift_addr;
	}
	lh_type_array = (uint32_t)type_value << shift;
	references_setup();
	self = getpid();
	page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
	if (compressed_klass && !fm_vms_int_constant("Klass::_lh_header_size_shift", &lh_hsize_shift) &&
	    !fm_vms_int_constant("Klass::_lh_header_size_mask", &lh_hsize_mask) &&
	    !fm_vms_int_constant("Klass::_lh_log2_element_size_shift", &lh_esize_shift) &&
	    !fm_vms_int_constant("Klass::_lh_log2_element_size_mask", &lh_esize_mask) && lh_hsize_shift >= 0 &&
	    lh_hsize_shift < 32 && lh_esize_shift >= 0 && lh_esize_shift < 32)
		atomic_store_explicit(&arrays_known, 1, memory_order_release);
	return 1;
}

/* The klass word of the object at obj: its narrow klass (compressed) and the klass; 0 if it is none. */
static uintptr_t klass_at(uintptr_t obj, uint32_t *nk)
{
	uintptr_t k;

	*nk = 0;
	if (compressed_klass) {
		int32_t shift = *narrow_klass_shift;

		*nk = *(const uint32_t *)(obj + (uintptr_t)klass_off);
		if (!*nk || shift < 0 || shift > 8)
			return 0;
		k = *narrow_klass_base + ((uintptr_t)*nk << shift);
	} else {
		k = *(const uintptr_t *)(obj + (uintptr_t)klass_off);
	}
	return k && !(k & 7) ? k : 0;
}

static int lh_cached(uint32_t nk, int32_t *lh)
{
	uint64_t c = atomic_load_explicit(&lh_cache[nk % LH_CACHE], memory_order_relaxed);

	if (!nk || (uint32_t)(c >> 32) != nk)
		return 0;
	*lh = (int32_t)(uint32_t)c;
	return 1;
}

/* Klass k's layout helper through process_vm_readv (k may be no klass at all), remembered by nk. */
static int lh_read(uint32_t nk, uintptr_t k, int32_t *lh)
{
	struct iovec local = { lh, sizeof(*lh) }, remote = { (void *)(k + (uintptr_t)lh_off), sizeof(*lh) };

	if (lh_cached(nk, lh))
		return 1;
	if (syscall(SYS_process_vm_readv, self, &local, 1UL, &remote, 1UL, 0UL) != (long)sizeof(*lh))
		return 0;
	if (nk)
		atomic_store_explicit(&lh_cache[nk % LH_CACHE], (uint64_t)nk << 32 | (uint32_t)*lh,
				      memory_order_relaxed);
	return 1;
}

int fm_klass_type_array_at(uintptr_t obj)
{
	uint32_t nk;
	uintptr_t k = klass_at(obj, &nk);
	int32_t lh;

	if (!k)
		return 0;
	if (!nk) {
		for (unsigned i = 0; i < KLASS_CACHE; i++) {
			uintptr_t c = atomic_load_explicit(&klass_cache[i], memory_order_relaxed);
			if ((c & ~(uintptr_t)1) == k)
				return (int)(c & 1);
		}
	}
	if (!lh_read(nk, k, &lh))
		return 0;
	if (!nk)
		atomic_store_explicit(&klass_cache[atomic_fetch_add(&klass_cache_next, 1) % KLASS_CACHE],
				      k | ((uint32_t)lh >= lh_type_array), memory_order_relaxed);
	return (uint32_t)lh >= lh_type_array;
}

/*
 * Whether obj starts an array (its length at obj + len_off): its mark word
 * is an unlocked object's (no hash bits past 31, lock bits 01), its klass an
 * array klass. exact: the thread read that length, and an unknown klass is
 * looked up (a system call, remembered); otherwise only klasses looked up
 * before count, so that a walk over an array's elements calls nothing and
 * takes no word pair in them for a header. *end: the array's end.
 */
static int array_at(uintptr_t obj, uintptr_t len_off, int exact, uintptr_t *end)
{
	uint64_t mark = *(const uint64_t *)obj;
	uint32_t nk;
	uintptr_t k;
	int32_t lh, len;

	if ((mark & 3) != 1 || (mark >> 39))
		return 0;
	if (exact) {
		if (!(k = klass_at(obj, &nk)) || !lh_read(nk, k, &lh))
			return 0;
	} else if (!lh_cached(*(const uint32_t *)(obj + (uintptr_t)klass_off), &lh)) {
		return 0;
	}
	len = *(const int32_t *)(obj + len_off);
	if (lh >= 0 || len <= 0)
		return 0; /* no array, or an empty one */
	*end = obj + (uintptr_t)((lh >> lh_hsize_shift) & lh_hsize_mask) +
	       ((uintptr_t)(uint32_t)len << ((lh >> lh_esize_shift) & lh_esize_mask));
	return 1;
}

uintptr_t fm_klass_array_end(uintptr_t addr, uintptr_t from)
{
	/* An array's length follows its mark word and its narrow klass. */
	uintptr_t len_off = (uintptr_t)klass_off + 4, end;

	if (!atomic_load_explicit(&arrays_known, memory_order_acquire) || addr < from + len_off)
		return 0;
	/* The thread read the length: the array's header is just before it. */
	if (!(addr & 3) && !((addr - len_off) & 7) && array_at(addr - len_off, len_off, 1, &end))
		return end > addr ? end : 0;
	/*
	 * An element. Only where the thread walked in from the page before
	 * (from is on it): an element read anywhere else may be one of a few
	 * read at random, and the array's other pages no use. The nearest
	 * header below is the array's, unless the object it starts ends first.
	 */
	if (addr - from < page_size)
		return 0;
	for (uintptr_t obj = (addr - len_off) & ~(uintptr_t)7;; obj -= 8) {
		if (array_at(obj, len_off, 0, &end))
			return end > addr ? end : 0;
		if (obj < from + 8)
			return 0;
	}
}

/* The reference stored at slot (aligned, mapped): the object's address, 0 for null. */
static uintptr_t reference_at(uintptr_t slot)
{
	uint32_t n;
	int32_t shift;

	if (!compressed_oops)
		return *(const uintptr_t *)slot;
	n = *(const uint32_t *)slot;
	shift = *narrow_oop_shift;
	return n && shift >= 0 && shift <= 8 ? *narrow_oop_base + ((uintptr_t)n << shift) : 0;
}

unsigned fm_klass_referents(uintptr_t addr, uintptr_t slot, uintptr_t end, uintptr_t *out, unsigned max)
{
	uintptr_t width = compressed_oops ? 4 : 8, obj;
	unsigned n = 0;

	if (!atomic_load_explicit(&references_known, memory_order_acquire) || (slot & (width - 1)) ||
	    end - slot < width)
		return 0;
	/*
	 * The slot holds the object whose header the thread touched (a mark
	 * word, a class, a length), or the slot before it does: a loop that
	 * moved on to its next slot before it called what reads the object
	 * (JDK 21's full GC marking, whose mark_and_push is a call).
	 */
	obj = reference_at(slot);
	if (!obj || addr < obj || addr - obj >= (uintptr_t)klass_off + 12) {
		if ((slot & (page_size - 1)) < width)
			return 0;
		obj = reference_at(slot - width);
		if (!obj || addr < obj || addr - obj >= (uintptr_t)klass_off + 12)
			return 0;
		slot -= width;
	}
	/*
	 * The loop's own end is not known: an object array's slots run on to
	 * its end, an instance's few fields stop at the next object's header,
	 * whose mark word is no reference (its low bits are set). So read up to
	 * the first word that is none; the pager stops at one outside the heap.
	 */
	for (slot += width; slot + width <= end && n < max; slot += width) {
		if (!(obj = reference_at(slot)))
			continue;
		if (obj & 7)
			break;
		out[n++] = obj;
	}
	return n;
}
