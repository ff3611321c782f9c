// SPDX-License-Identifier: Apache-2.0
/* A JVM's collection counts, through VMStructs (gccounts.h). */
#include "gccounts.h"

#include "fm_util.h"
#include "vmstructs.h"

static const volatile uint32_t *counts;
static int unreadable;

const volatile uint32_t *fm_gc_counts(void)
{
	int64_t off;
	uintptr_t heap_ptr_addr, heap;

	if (unreadable)
		return NULL;
	if (!counts) {
		if (fm_vms_field("CollectedHeap", "_total_collections", &off, NULL) ||
		    fm_vms_field("Universe", "_collectedHeap", NULL, &heap_ptr_addr) ||
		    !(heap = *(const uintptr_t *)heap_ptr_addr))
			return NULL;
		counts = (const volatile uint32_t *)(heap + (uintptr_t)off);
	}
	if (counts[1] > counts[0]) {
		fm_warn("this JVM's collection counts are not where JDK 17 keeps them: full GCs are not told apart "
			"(gc_moves: its GC threads read ahead in full GCs too)");
		counts = NULL;
		unreadable = 1;
	}
	return counts;
}
