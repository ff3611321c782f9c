/* SPDX-License-Identifier: Apache-2.0 */
/* Inside the preload shim: preload.c (mappings, malloc) and preload_io.c (system calls, SIGBUS). */
#ifndef FARMEM_PRELOAD_H
#define FARMEM_PRELOAD_H

struct fm_pager;

/* The pager, once it runs; NULL before, in a forked child, or when the shim stays out of the way. */
struct fm_pager *fm_preload_pager(void);

#endif
