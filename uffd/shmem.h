/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared-memory regions (FM_REG_SHMEM): MAP_SHARED mappings of a tmpfs file
 * or memfd, paged in minor-fault mode. shmem.c says how they differ from
 * anonymous memory; their minor faults are handled in fault.c.
 */
#ifndef FARMEM_SHMEM_H
#define FARMEM_SHMEM_H

#include <stddef.h>
#include <stdint.h>

struct fm_pager;
struct region;

/* Map the region's pages a second time, where the uffd does not reach (r->alias). */
int fm_shmem_alias(struct region *r);
/* After registration: adopt the file's pages with data, punch out the zeros. Returns pages adopted. */
uint64_t fm_shmem_adopt(struct fm_pager *p, struct region *r);
/* Punch [addr, addr+len) out of the file: that frees the memory. */
void fm_shmem_drop(struct region *r, uintptr_t addr, size_t len);
void fm_shmem_release(struct region *r);

#endif
