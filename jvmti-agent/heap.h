/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Java heap: whether the pager can serve it, and its mappings under the
 * pager. Read through VMStructs (vmstructs.h); docs/jvm.md ("Heap discovery")
 * says what is read when. Callers serialise these (the agent's life lock).
 */
#ifndef FARMEM_AGENT_HEAP_H
#define FARMEM_AGENT_HEAP_H

#include <stddef.h>
#include <stdint.h>

struct fm_pager;

/*
 * From the JVM's flags, before the heap exists: refuse a collector, heap file
 * or heap sizing the pager cannot serve (-ENOTSUP with err). *heap_bytes:
 * -Xmx, 0 if unknown.
 */
int fm_heap_check_jvm(uint64_t *heap_bytes, char *err, size_t errlen);

/*
 * Once the heap exists (VMInit, or on attach): register each of its anonymous
 * (or, with AllocateHeapAt on tmpfs, shared-memory) mappings with p, all or
 * nothing. [*start, *start + *bytes) is the reserved heap.
 */
int fm_heap_register(struct fm_pager *p, uintptr_t *start, uint64_t *bytes, char *err, size_t errlen);

/* Unregister what fm_heap_register registered. */
void fm_heap_unregister(struct fm_pager *p);

/* Bring every page of the registered heap home and pin it there (fm_pager_fetch_all). */
void fm_heap_fetch_all(struct fm_pager *p);

#endif
