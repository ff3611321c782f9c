/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Calls a loaded library makes to another one's functions, sent through ours
 * instead: its GOT slots for a symbol (the import table the dynamic linker
 * filled in) are pointed at our function. HotSpot commits and uncommits its
 * heap with mmap(MAP_FIXED) from libjvm.so; the agent sees those calls before
 * the kernel does (heap.c). async-profiler hooks libjvm the same way.
 */
#ifndef FARMEM_AGENT_GOT_H
#define FARMEM_AGENT_GOT_H

/*
 * Point every GOT slot of library `lib` (the basename of a loaded object,
 * "libjvm.so") for `sym` at fn; *orig gets the function they pointed to (what
 * fn must call). Returns the slots changed (>= 1), 0 if the library does not
 * import sym, -ENOENT if no such library is loaded, or a -errno of mprotect.
 * Threads calling through a slot meanwhile see the old function or fn.
 */
int fm_got_interpose(const char *lib, const char *sym, void *fn, void **orig);

#endif
