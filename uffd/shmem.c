// SPDX-License-Identifier: Apache-2.0
/*
 * Shared-memory regions (FM_REG_SHMEM): a MAP_SHARED mapping of a tmpfs file
 * or memfd, such as the Java heap of -XX:AllocateHeapAt=/dev/shm. The pager
 * keeps the anonymous rules (residency map, write-protect before write-back,
 * nothing dropped before memd acknowledges) with three differences:
 *
 *  - a page leaves by MADV_REMOVE, which punches it out of the file. Only that
 *    frees the memory: MADV_DONTNEED would unmap it and leave it in the page
 *    cache, still charged to the program.
 *  - a page that is in the file but not mapped here (the kernel reclaimed the
 *    mapping, or the file was preallocated) raises a minor fault, answered by
 *    UFFDIO_CONTINUE, which maps the file's own page. Pages not in the file
 *    raise missing faults, answered by UFFDIO_COPY as for anonymous memory.
 *  - dirty pages are read for write-back through an alias, a second mapping
 *    of the same pages the uffd does not cover: reading an unmapped page at
 *    its registered address would fault on the pager's own thread.
 *
 * So that the budget means memory, a region's resident pages are exactly its
 * pages in the file: registration punches out the unmapped pages that hold
 * only zeros (HotSpot preallocates the whole heap file with fallocate).
 */
#include "shmem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fm_util.h"
#include "pager_internal.h"

int fm_shmem_alias(struct region *r)
{
	size_t len = (size_t)(r->end - r->base);
	/* mremap with old size 0 maps the same pages of a shared mapping again, elsewhere. */
	void *a = (void *)syscall(SYS_mremap, (void *)r->base, (size_t)0, len, MREMAP_MAYMOVE);

	if (a == MAP_FAILED)
		return -errno;
	r->alias = a;
	return 0;
}

void fm_shmem_release(struct region *r)
{
	if (r->alias) {
		fm_sys_munmap(r->alias, (size_t)(r->end - r->base));
		r->alias = NULL;
	}
}

void fm_shmem_drop(struct region *r, uintptr_t addr, size_t len)
{
	if (fm_sys_madvise((void *)addr, len, MADV_REMOVE))
		fm_fatal("madvise(REMOVE) of %#lx+%zu pages of a shared-memory region failed: %s",
			 (unsigned long)addr, len >> PG_SHIFT, strerror(errno));
}

static int page_is_zero(const uint8_t *pg)
{
	const uint64_t *w = (const uint64_t *)pg;

	for (unsigned k = 0; k < PG_SIZE / 8; k++)
		if (w[k])
			return 0;
	return 1;
}

/* 1 if a swap device is on: then a page mincore does not see may be in swap, with data. */
static int swap_on(void)
{
	FILE *f = fopen("/proc/swaps", "re");
	char line[256];
	int n = 0;

	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f))
		n++;
	fclose(f);
	return n > 1; /* a header line, then one per device */
}

/*
 * After UFFDIO_REGISTER, with the region table locked for writing (so faults
 * wait) and the mapped pages already adopted as dirty, the rest of the file:
 * a page with data is adopted as dirty, a page of zeros is punched out (the
 * next touch is a zero-fill). mincore sees the pages that are in the page
 * cache and uptodate; those are read through the alias. It does not see a
 * preallocated page (never written: zeros) nor one in swap (data), so with
 * swap on, those are read too; without swap they are punched unread, which
 * is what makes registering a preallocated heap file cheap. No thread can
 * reach such a page meanwhile: touching it is a minor or missing fault,
 * which waits for the table. Runs are punched at least every CHUNK pages,
 * so reading a hole (which allocates a page) never holds more than that.
 * Returns the pages adopted.
 */
uint64_t fm_shmem_adopt(struct fm_pager *p, struct region *r)
{
	enum { CHUNK = 1024 };
	unsigned char vec[CHUNK];
	uint64_t adopted = 0, punched = 0, run = UINT64_MAX;
	int read_all = swap_on();

	for (uint64_t i = 0; i <= r->npages; i++) {
		int zero = 0;

		if (i < r->npages && i % CHUNK == 0) {
			uint64_t m = r->npages - i < CHUNK ? r->npages - i : CHUNK;
			if (mincore((void *)(r->base + (i << PG_SHIFT)), m << PG_SHIFT, vec))
				fm_fatal("mincore of a shared-memory region failed: %s", strerror(errno));
		}
		if (i < r->npages && fm_pg_state(pg_load(&r->pg[i])) == FM_PG_UNTOUCHED) {
			zero = !(vec[i % CHUNK] & 1) && !read_all ? 1 : page_is_zero(r->alias + (i << PG_SHIFT));
			if (!zero) {
				pg_init(&r->pg[i], pg_make(FM_PG_DIRTY, FM_PGF_REF));
				adopted++;
			}
		}
		if (run != UINT64_MAX && (!zero || i - run == CHUNK)) {
			fm_shmem_drop(r, r->base + (run << PG_SHIFT), (size_t)(i - run) << PG_SHIFT);
			punched += i - run;
			run = UINT64_MAX;
		}
		if (zero && run == UINT64_MAX)
			run = i;
	}
	fm_info("shared-memory region %#lx: %llu pages punched out of the file (zeros, not mapped), "
		"%llu unmapped pages with data adopted%s", (unsigned long)r->base, (unsigned long long)punched,
		(unsigned long long)adopted, read_all ? " (swap is on: every page was read)" : "");
	return adopted;
}
