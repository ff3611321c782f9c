// SPDX-License-Identifier: Apache-2.0
/* The farmem JDK collector's calls into the pager (gc_calls.h). */
#include "gc_calls.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fm_util.h"
#include "pager.h"
#include "resmap.h"

#define EXPORT __attribute__((visibility("default")))

struct farmem_heap_view {
	uint64_t base, npages;
	const volatile uint8_t *states;
	uint32_t page_shift, pad;
	const volatile uint64_t *resident, *limit, *evict_batches;
};

/* The JVM's layout of a move is the pager's. */
struct farmem_byte_move {
	uint64_t src, dst, len, first_word;
	uint32_t set_first_word, pad;
};
_Static_assert(sizeof(struct farmem_byte_move) == sizeof(struct fm_byte_move) &&
	       offsetof(struct farmem_byte_move, src) == offsetof(struct fm_byte_move, src) &&
	       offsetof(struct farmem_byte_move, dst) == offsetof(struct fm_byte_move, dst) &&
	       offsetof(struct farmem_byte_move, len) == offsetof(struct fm_byte_move, len) &&
	       offsetof(struct farmem_byte_move, first_word) == offsetof(struct fm_byte_move, first_word) &&
	       offsetof(struct farmem_byte_move, set_first_word) == offsetof(struct fm_byte_move, set_first_word),
	       "farmem_byte_move is fm_byte_move");

static struct fm_pager *no_pager(void) { return NULL; }
static void no_leave(void) { }
static int not_expected(void) { return 0; }

/* No pager until fm_gc_calls_export, which the agent calls before the JVM can call us. */
static struct fm_pager_ref ref = { no_pager, no_leave, not_expected };
/*
 * The pager a view holds, from farmem_heap_view to farmem_heap_view_end: the
 * collector takes it at a pause's start and gives it back at its end, from
 * the VM thread, one at a time.
 */
static struct fm_pager *viewing;

EXPORT int farmem_heap_view(struct farmem_heap_view *v)
{
	struct fm_pager *p = ref.enter();
	const struct fm_resmap_hdr *h = p ? fm_pager_map(p) : NULL;
	const struct fm_resmap_region *r = h ? fm_resmap_heap(h) : NULL;

	if (r) {
		*v = (struct farmem_heap_view){ .base = r->base, .npages = r->npages,
						.states = (const uint8_t *)h + r->map_offset,
						.page_shift = h->page_shift,
						.resident = &h->stats.resident_pages,
						.limit = &h->stats.local_limit_pages,
						.evict_batches = &h->stats.evict_batches };
		viewing = p;
		fm_pager_pause(p, 1);
		return 0; /* held until farmem_heap_view_end */
	}
	ref.leave();
	return -ENOENT;
}

EXPORT void farmem_heap_view_end(void)
{
	if (viewing)
		fm_pager_pause(viewing, 0);
	viewing = NULL;
	ref.leave();
}

EXPORT long farmem_move_bytes(const struct farmem_byte_move *m, unsigned n)
{
	struct fm_pager *p = ref.enter();
	long rc = p ? fm_pager_move_bytes(p, (const struct fm_byte_move *)m, n) : -ENOENT;

	ref.leave();
	return rc;
}

EXPORT int farmem_read_words(const void *addr, void *out, size_t len)
{
	struct fm_pager *p = ref.enter();
	int rc = p ? fm_pager_read_words(p, addr, out, len) : -ENOENT;

	ref.leave();
	return rc;
}

EXPORT int farmem_write_words(void *addr, const void *data, size_t len)
{
	struct fm_pager *p = ref.enter();
	int rc = p ? fm_pager_write_words(p, addr, data, len) : -ENOENT;

	ref.leave();
	return rc;
}

void fm_gc_calls_export(const struct fm_pager_ref *r)
{
	Dl_info info;

	ref = *r;
	/* Loading ourselves again RTLD_GLOBAL puts our symbols in the global scope (swapva_move.c does too). */
	if (!dladdr((void *)farmem_move_bytes, &info) || !info.dli_fname ||
	    !dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
		fm_warn("cannot export the farmem JDK's collector calls (%s): its full GCs copy as usual", dlerror());
}
