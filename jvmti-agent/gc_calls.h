/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the farmem JDK's collector asks of the pager in a pause
 * (hotspot/patches/0003-farmem-pause.patch, docs/patched-jdk.md). The JVM
 * finds these by name with dlsym(RTLD_DEFAULT, ...) at each full GC, so
 * their names, signatures and the layouts below are a stable interface:
 *
 *   struct farmem_heap_view { uint64_t base, npages; const volatile uint8_t *states;
 *                             uint32_t page_shift, pad;
 *                             const volatile uint64_t *resident, *limit, *evict_batches; };
 *   int farmem_heap_view(struct farmem_heap_view *v);
 *       0: v describes the heap's pages (one residency byte each,
 *       uffd/resmap.h), the pager's resident pages and budget (gauges) and
 *       its eviction batches (a counter: it is paging when that moves),
 *       and the pager is held (a detach waits) until farmem_heap_view_end;
 *       -ENOENT: no pager pages this heap (nothing held).
 *   void farmem_heap_view_end(void);
 *   struct farmem_byte_move { uint64_t src, dst, len, first_word; uint32_t set_first_word, pad; };
 *   long farmem_move_bytes(const struct farmem_byte_move *m, unsigned n);
 *       fm_pager_move_bytes (uffd/pager.h): the moves done, in order,
 *       where their pages lie; the collector copies move [return] itself.
 *       -EOPNOTSUPP: this pager cannot (memd's store is not mapped here);
 *       -ENOENT: no pager.
 *   int farmem_read_words(const void *addr, void *out, size_t len);
 *       fm_pager_read_words: an object's header read from wherever its page
 *       lies, without bringing the page here.
 *   int farmem_write_words(void *addr, const void *data, size_t len);
 *       fm_pager_write_words: a header word stored where its page lies.
 *
 * Called by parallel GC workers (and the VM thread) in a pause.
 */
#ifndef FARMEM_AGENT_GC_CALLS_H
#define FARMEM_AGENT_GC_CALLS_H

#include "pager_ref.h"

/* Take the pager reference and make the functions visible to dlsym(RTLD_DEFAULT). */
void fm_gc_calls_export(const struct fm_pager_ref *ref);

#endif
