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
 * From the JVM's flags, before the heap exists: refuse a collector or heap
 * file the pager cannot serve (-ENOTSUP with err). *heap_bytes: -Xmx (the
 * reserved heap, of which a percentage budget is a share), 0 if unknown.
 */
int fm_heap_check_jvm(uint64_t *heap_bytes, char *err, size_t errlen);

/*
 * heap_sizing, before the heap exists: hold the young generation of G1 or
 * Serial, which every pause rewrites, to a quarter of the local budget of
 * budget bytes of a heap of heap_bytes (MemLiner's setup caps it below the
 * budget too), in every JVM the agent loads into, whoever started it. Through
 * MaxNewSize, which both read when they build the heap, after Agent_OnLoad.
 * A JVM that sizes its young generation itself, another collector, a whole
 * heap local, a quarter of the budget under 4 MiB, a bound above the collector's own
 * (G1MaxNewSizePercent), a Serial young generation (NewRatio's share) that
 * fits the budget whole, or a heap that may be in hugetlbfs
 * pages (-XX:+UseLargePages): nothing. Returns 1 with msg saying what was
 * set, 0 when nothing was, -ENOENT when this JVM's flags cannot be read.
 */
int fm_heap_size_young(uint64_t heap_bytes, uint64_t budget, char *msg, size_t msglen);

/*
 * Once the heap exists (VMInit, or on attach): put it under p, all or
 * nothing. An anonymous heap is paged as HotSpot commits it (heap.c says
 * how): what is committed now, and from then on every part HotSpot commits
 * or uncommits, as it does so. A heap in shared memory (AllocateHeapAt on
 * tmpfs) is mapped in full: each of its mappings is registered.
 * [*start, *start + *bytes) is the reserved heap.
 */
int fm_heap_register(struct fm_pager *p, uintptr_t *start, uint64_t *bytes, char *err, size_t errlen);

/*
 * At the end of a GC pause: page any committed part of the heap the pager
 * does not page yet. The hooks on libjvm's mmap see every commit as it
 * happens, so this reads the maps only at the first pause after
 * registration, or at every pause when libjvm could not be hooked.
 */
void fm_heap_follow(struct fm_pager *p);

/* Unregister what fm_heap_register registered, and stop following the heap. */
void fm_heap_unregister(struct fm_pager *p);

/* Bring every page of the registered heap home and pin it there (fm_pager_fetch_all). */
void fm_heap_fetch_all(struct fm_pager *p);

#endif
