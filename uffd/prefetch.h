/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sequential and strided runs of one thread's faults, fetched ahead: remote
 * pages in one batched read, installed write-protected (clean); untouched
 * pages as zeros, in runs of up to ZERO_RUN_PAGES, writable when the stream
 * writes (allocation streams through fresh memory, writing it).
 */
#ifndef FARMEM_PREFETCH_H
#define FARMEM_PREFETCH_H

#include <stdint.h>

struct fm_pager;
struct fm_borrowed;
struct region;

/*
 * After a fault on page idx of region r (slot ridx) by fc->tid: record it,
 * and if it continues a run, fill the run ahead. A thread has two runs: its
 * faults on fresh pages (fresh: the fault was a zero-fill) and on remote
 * ones, which interleave (a collector copies objects it reads here and there
 * into fresh pages in a row; a program allocates while it reads old data),
 * and each alone is a run. A fresh run fills only untouched pages; so does
 * zero_only (GC threads: fetching ahead of their tracing evicts what the
 * program uses, MemLiner §1.3). wake: handler-thread mode. Caller holds rlock.
 */
void fm_prefetch(struct fm_pager *p, struct fm_borrowed *fc, int ridx, struct region *r, uint64_t idx,
		 int write, int fresh, int zero_only, int wake);

#endif
