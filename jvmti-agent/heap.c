// SPDX-License-Identifier: Apache-2.0
/* The Java heap (heap.h): what HotSpot says about it, and its mappings under the pager. */
#include "heap.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include "fm_util.h"
#include "pager.h"
#include "vmstructs.h"

#define MAX_HEAP_VMAS 64

static struct { uintptr_t addr; size_t len; uint32_t flags; } vmas[MAX_HEAP_VMAS];
static int nvmas;
/* -XX:AllocateHeapAt on tmpfs: the heap file's device (the file itself is unlinked at once). */
static int heap_on_shm;
static dev_t heap_shm_dev;

#define TMPFS_MAGIC_ 0x01021994 /* <linux/magic.h> */

int fm_heap_check_jvm(uint64_t *heap_bytes, char *err, size_t errlen)
{
	const void *a;
	uint64_t xms = 0, xmx = 0;
	int rc = fm_vms_init(err, errlen);

	if (rc)
		return rc;
	if (fm_vms_flag_bool("UseZGC") || fm_vms_flag_bool("UseShenandoahGC")) {
		snprintf(err, errlen, "%s is not supported: its heap is multi-mapped; use G1 (the default) "
			 "or -XX:+UseParallelGC", fm_vms_flag_bool("UseZGC") ? "ZGC" : "Shenandoah");
		return -ENOTSUP;
	}
	heap_on_shm = 0;
	if (!fm_vms_flag_addr("AllocateHeapAt", &a) && *(const char *const *)a) {
		const char *dir = *(const char *const *)a;
		struct statfs sf;
		struct stat st;
		/* tmpfs is shared memory the pager can punch pages out of; DAX/NVDIMM or a disk is not. */
		if (statfs(dir, &sf) || stat(dir, &st)) {
			snprintf(err, errlen, "-XX:AllocateHeapAt=%s: %s", dir, strerror(errno));
			return -ENOTSUP;
		}
		if (sf.f_type != TMPFS_MAGIC_) {
			snprintf(err, errlen, "-XX:AllocateHeapAt=%s is not on tmpfs: farmem pages a heap in shared "
				 "memory (such as /dev/shm), not one on a DAX/NVDIMM or disk file system; use "
				 "-XX:AllocateHeapAt=/dev/shm or drop the flag", dir);
			return -ENOTSUP;
		}
		heap_on_shm = 1;
		heap_shm_dev = st.st_dev;
	}
	if (!fm_vms_flag_addr("InitialHeapSize", &a))
		xms = *(const uint64_t *)a;
	if (!fm_vms_flag_addr("MaxHeapSize", &a))
		xmx = *(const uint64_t *)a;
	if (xms && xmx && xms != xmx) {
		snprintf(err, errlen, "the heap must be committed in full: give -Xms equal to -Xmx "
			 "(here -Xms is %llu MiB, -Xmx %llu MiB)", (unsigned long long)(xms >> 20),
			 (unsigned long long)(xmx >> 20));
		return -ENOTSUP;
	}
	*heap_bytes = xmx;
	return 0;
}

/*
 * The heap's anonymous private mappings, per /proc/self/maps. File-backed
 * pieces inside the range (the CDS archive's heap regions, classes.jsa) are
 * left alone; an uncommitted piece means a heap we cannot serve. With
 * -XX:AllocateHeapAt on tmpfs the heap is instead a shared mapping of an
 * unlinked file on that file system ("/dev/shm/#2 (deleted)"), recognised by
 * its device and paged in minor-fault mode; any other shared piece is refused.
 */
static int find_heap_vmas(uintptr_t start, uint64_t bytes, char *err, size_t errlen)
{
	uintptr_t end = start + bytes;
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int rc = 0;

	nvmas = 0;
	if (!f) {
		snprintf(err, errlen, "cannot read /proc/self/maps: %s", strerror(errno));
		return -errno;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, ino;
		unsigned dmaj, dmin;
		uint32_t kind = 0;
		char perms[8], path[400] = "";
		if (sscanf(line, "%lx-%lx %7s %*s %x:%x %lu %399[^\n]", &lo, &hi, perms, &dmaj, &dmin, &ino,
			   path) < 6)
			continue;
		if (hi <= start || lo >= end)
			continue;
		if (lo < start)
			lo = start;
		if (hi > end)
			hi = end;
		{
			char *p = path;
			while (*p == ' ')
				p++;
			memmove(path, p, strlen(p) + 1);
		}
		if (perms[3] == 's' && heap_on_shm && ino && makedev(dmaj, dmin) == heap_shm_dev) {
			if (strncmp(perms, "rw", 2)) {
				snprintf(err, errlen, "part of the shared-memory heap (%#lx-%#lx, %s) is not "
					 "read-write", lo, hi, perms);
				rc = -ENOTSUP;
				break;
			}
			kind = FM_REG_SHMEM;
		} else if (ino || (path[0] && strncmp(path, "[anon:", 6))) {
			if (perms[3] == 's') {
				snprintf(err, errlen, "the heap is a shared mapping of %s, which farmem cannot page "
					 "(only a heap in shared memory: -XX:AllocateHeapAt=/dev/shm)", path);
				rc = -ENOTSUP;
				break;
			}
			continue; /* CDS archive piece: file-backed, not ours */
		} else if (strncmp(perms, "rw", 2) || perms[3] != 'p') {
			snprintf(err, errlen, "part of the heap (%#lx-%#lx, %s) is not committed memory: "
				 "start the JVM with -Xms equal to -Xmx", lo, hi, perms);
			rc = -ENOTSUP;
			break;
		}
		/* A shared piece stays one mapping: the pager maps it a second time with mremap. */
		if (nvmas && vmas[nvmas - 1].addr + vmas[nvmas - 1].len == lo && !kind && !vmas[nvmas - 1].flags) {
			vmas[nvmas - 1].len += hi - lo;
			continue;
		}
		if (nvmas == MAX_HEAP_VMAS) {
			snprintf(err, errlen, "the heap is split into more than %d mappings", MAX_HEAP_VMAS);
			rc = -ENOSPC;
			break;
		}
		vmas[nvmas].addr = lo;
		vmas[nvmas].len = hi - lo;
		vmas[nvmas].flags = kind;
		nvmas++;
	}
	fclose(f);
	if (!rc && !nvmas) {
		snprintf(err, errlen, "no anonymous or shared memory found in the heap range %#lx+%llu MiB",
			 (unsigned long)start, (unsigned long long)(bytes >> 20));
		rc = -ENOENT;
	}
	return rc;
}

int fm_heap_register(struct fm_pager *p, uintptr_t *heap_start, uint64_t *heap_bytes, char *err, size_t errlen)
{
	uintptr_t start;
	uint64_t bytes;
	int rc = fm_vms_heap(&start, &bytes, err, errlen);

	if (!rc)
		rc = find_heap_vmas(start, bytes, err, errlen);
	if (rc)
		return rc;
	for (int i = 0; i < nvmas; i++) {
		rc = fm_pager_register(p, (void *)vmas[i].addr, vmas[i].len, FM_REG_HEAP | vmas[i].flags);
		if (rc) {
			snprintf(err, errlen, "cannot page the heap mapping %#lx+%zu MiB: %s",
				 (unsigned long)vmas[i].addr, vmas[i].len >> 20, strerror(-rc));
			for (int j = 0; j < i; j++)
				fm_pager_unregister(p, (void *)vmas[j].addr, vmas[j].len);
			return rc;
		}
	}
	fm_info("paging the Java heap %#lx+%llu MiB in %d mappings%s", (unsigned long)start,
		(unsigned long long)(bytes >> 20), nvmas,
		heap_on_shm ? " (shared memory: minor-fault mode)" : "");
	*heap_start = start;
	*heap_bytes = bytes;
	return 0;
}

void fm_heap_unregister(struct fm_pager *p)
{
	for (int i = 0; i < nvmas; i++)
		fm_pager_unregister(p, (void *)vmas[i].addr, vmas[i].len);
	nvmas = 0;
}

void fm_heap_fetch_all(struct fm_pager *p)
{
	for (int i = 0; i < nvmas; i++)
		fm_pager_fetch_all(p, (void *)vmas[i].addr, vmas[i].len);
}
