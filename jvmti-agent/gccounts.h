/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A JVM's collection counts: CollectedHeap::_total_collections, which VMStructs
 * lists, and _total_full_collections, declared right after it (JDK 17's
 * collectedHeap.hpp: both unsigned int). Each collection counts itself once it
 * has begun, after GarbageCollectionStart: a full count that moved in a pause
 * says a full GC ran in it (Serial's may follow its young collection in the
 * same pause), a total that did not says the pause counted no collection
 * (G1's remark, which ends a concurrent marking; JDK 17's cleanup pause
 * after it counts itself one, unless a full GC aborted that marking since).
 */
#ifndef FARMEM_AGENT_GCCOUNTS_H
#define FARMEM_AGENT_GCCOUNTS_H

#include <stdint.h>

/*
 * {total, full}, once the heap exists; NULL before, and from the first time
 * they do not read as counts (full above total). Read in a pause.
 */
const volatile uint32_t *fm_gc_counts(void);

#endif
