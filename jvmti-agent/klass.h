/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An object's class and what its layout says, read from the heap and the
 * JVM's own description of itself (VMStructs: where an object keeps its
 * klass, a klass its layout helper). Two users: gc_moves, which asks whether
 * a copy is of a primitive array (gcmove.c), and the pager's object_end,
 * which asks where the array a program thread touched ends (pager.h).
 * JDK 17 and 21 headers (mark word, klass, an array's length); JDK 25's
 * compact headers keep the klass in the mark word: unreadable here.
 */
#ifndef FARMEM_AGENT_KLASS_H
#define FARMEM_AGENT_KLASS_H

#include <stdint.h>

/*
 * Read the layout from VMStructs, once (it says why not, once, at info
 * level). 1 if objects' classes can be read. Call it after VMInit, from one
 * thread (the agent calls it at each pause's start).
 */
int fm_klass_setup(void);
/*
 * Whether the object at obj is a primitive array. Its klass word is read
 * from the heap (the caller knows obj's header is mapped); the klass's
 * layout helper through process_vm_readv, which fails on an address that is
 * not mapped instead of faulting: a word that is no klass answers 0.
 */
int fm_klass_type_array_at(uintptr_t obj);
/*
 * The pager's object_end (pager.h): the end of the array that holds addr,
 * found by its header in [from, addr): where addr is an array's length (read
 * before its elements, as every loop over one does), or, when from lies a
 * page or more below addr (the thread walked into addr's page from there),
 * where the nearest header below the element at addr is an array's that
 * reaches past addr. 0 otherwise (an element read elsewhere may be one of a
 * few read at random), before fm_klass_setup has read the layout, or without
 * compressed class pointers. [from, addr] must be mapped.
 */
uintptr_t fm_klass_array_end(uintptr_t addr, uintptr_t from);
/*
 * The pager's referents (pager.h): whether slot holds a reference to the
 * object whose header addr lies in (a collector following references, its
 * loop at slot); if so, the objects the slots after it in [slot, end)
 * refer to, up to max, nulls left out. 0 otherwise, or before
 * fm_klass_setup has read how references are stored. [slot, end) must be
 * mapped.
 */
unsigned fm_klass_referents(uintptr_t addr, uintptr_t slot, uintptr_t end, uintptr_t *out, unsigned max);

#endif
