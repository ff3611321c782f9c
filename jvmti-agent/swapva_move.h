/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The page-move function the farmem JDK's SwapVA compaction calls
 * (hotspot/patches/0002-farmem-swapva.patch, docs/swapva.md). The JVM finds
 * these by name with dlsym(RTLD_DEFAULT, ...), so their names and signatures
 * are a stable interface:
 *
 *   int farmem_swapva_move(void *dst, const void *src, size_t len);
 *       page-aligned, disjoint; 0, or a negative errno with nothing moved
 *       (the collector then copies). Called by parallel GC workers in a pause.
 *   size_t farmem_swapva_min_bytes(void);   smallest object worth moving
 *   const char *farmem_swapva_describe(void);  what moves pages, for the GC log
 *
 * With a pager the heap belongs to the pager's userfaultfd: fm_pager_move.
 * Without one (onerror=continue after a failure), libswapva's ladder.
 */
#ifndef FARMEM_AGENT_SWAPVA_MOVE_H
#define FARMEM_AGENT_SWAPVA_MOVE_H

#include <stddef.h>

#include "pager_ref.h"

/*
 * Take the hooks, and make the three functions visible to dlsym(RTLD_DEFAULT):
 * the JVM loads agents RTLD_LOCAL.
 */
void fm_swapva_export(const struct fm_pager_ref *ref);
/*
 * At JVM exit, when libswapva moved pages (no pager): one stderr line with the pages each
 * backend moved, so a run can show that the module (or UFFDIO_MOVE) did the work, not memmove.
 */
void fm_swapva_report(void);


#endif
