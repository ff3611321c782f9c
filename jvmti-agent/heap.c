// SPDX-License-Identifier: Apache-2.0
/*
 * The Java heap (heap.h): what HotSpot says about it, and its mappings under
 * the pager.
 *
 * An anonymous heap is one sparse region over the reserved range (pager.h,
 * FM_REG_SPARSE): HotSpot reserves the range PROT_NONE, commits parts with
 * mmap(MAP_FIXED, PROT_READ | PROT_WRITE) and uncommits them with
 * mmap(MAP_FIXED, PROT_NONE); -Xms below -Xmx, G1 growing and shrinking the
 * heap, Parallel resizing its generations. Each such call replaces the
 * mapping, and with it the userfaultfd registration. The agent interposes on
 * libjvm's mmap and munmap (got.h): before HotSpot replaces a paged part the
 * pager lets it go, after HotSpot commits a part the pager takes it, both
 * before the call returns to HotSpot. So the pager never meets a mapping
 * replaced behind its back (an unmap event, during which every userfaultfd
 * ioctl fails with EAGAIN), and no page of the heap is ever unpaged memory
 * the budget does not see. One region whatever the heap does, so the
 * pager's 64 region slots never run short.
 *
 * The maps are also read at registration, and anything committed that the
 * pager does not page yet is committed with it; again at the end of the
 * first GC pause after that (a call that was inside mmap at the moment the
 * hooks went in), and at the end of every pause if libjvm could not be
 * hooked. Reading them costs some 0.2 ms: not for every pause when the hooks
 * see every change.
 */
#include "heap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>

#include "fm_util.h"
#include "got.h"
#include "pager.h"
#include "vmstructs.h"

#define MAX_HEAP_VMAS 64

/* The shared-memory heap's mappings, each a region of its own (a heap in a file does not grow). */
static struct { uintptr_t addr; size_t len; uint32_t flags; } vmas[MAX_HEAP_VMAS];
static int nvmas;
/* -XX:AllocateHeapAt on tmpfs: the heap file's device (the file itself is unlinked at once). */
static int heap_on_shm;
static dev_t heap_shm_dev;

/*
 * An anonymous heap: its reservation, and the pager that pages it. follow_lock
 * is held across every change to what the pager pages of it, including
 * HotSpot's own mmap calls through the hooks, so a commit never races an
 * uncommit of the same range.
 */
static pthread_mutex_t follow_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fm_pager *following;
static _Atomic uintptr_t heap_lo, heap_hi;
static int hooked;           /* hook_libjvm ran (its hooks are never undone) */
static int maps_hooked;      /* libjvm's mmap comes through here: no need to read the maps at every pause */
static int maps_unread;      /* read the maps at the next pause (the first after registration, or a failed call) */
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);

#define TMPFS_MAGIC_ 0x01021994 /* <linux/magic.h> */

int fm_heap_check_jvm(uint64_t *heap_bytes, char *err, size_t errlen)
{
	const void *a;
	uint64_t xmx = 0;
	int rc = fm_vms_init(err, errlen);

	if (rc)
		return rc;
	if (fm_vms_flag_bool("UseZGC")) {
		snprintf(err, errlen, "ZGC is not supported: its heap is multi-mapped; use G1 (the default), "
			 "-XX:+UseParallelGC or -XX:+UseShenandoahGC");
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
	if (!fm_vms_flag_addr("MaxHeapSize", &a))
		xmx = *(const uint64_t *)a;
	/* -Xms below -Xmx is served: the pager follows the heap as HotSpot commits and uncommits it. */
	*heap_bytes = xmx;
	return 0;
}

int fm_heap_size_young(uint64_t heap_bytes, uint64_t budget, char *msg, size_t msglen)
{
	static const char *const own[] = { "NewSize", "MaxNewSize", "NewRatio", "G1NewSizePercent",
					   "G1MaxNewSizePercent" };
	const void *bound;
	int g1 = fm_vms_flag_bool("UseG1GC"), rc;
	/*
	 * The young generation fills to its bound at every cycle: each MiB of it
	 * is a MiB the old generation's hot part does not get. A quarter: H2 at
	 * 50% local reads nothing back where half read 38k pages, GcChurn (whose
	 * young objects survive) within 3% either way (bench/RESULTS.md, session 68).
	 */
	uint64_t young = budget / 4 >> 20 << 20, gc_max, pct = 0;
	const char *gc = g1 ? "G1" : "Serial";
	char alone[128];

	if ((!g1 && !fm_vms_flag_bool("UseSerialGC")) || !heap_bytes || budget >= heap_bytes || young < (4u << 20))
		return 0;
	/* A heap in hugetlbfs pages runs unpaged (register_sparse): no budget to fit it to. */
	if (fm_vms_flag_bool("UseLargePages") && !fm_vms_flag_bool("UseTransparentHugePages"))
		return 0;
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
		rc = fm_vms_flag_user_set(own[i]);
		if (rc)
			return rc < 0 ? rc : 0;
	}
	/* The collector's own bound: G1's a percentage of the heap, Serial's a ratio to the old generation. */
	if (fm_vms_flag_addr(g1 ? "G1MaxNewSizePercent" : "NewRatio", &bound))
		return -ENOENT;
	/*
	 * Four bytes, whatever the flag's type: G1MaxNewSizePercent is a uintx
	 * in JDK 17 and 21 and a uint in JDK 25 (eight bytes read there took in
	 * the next flag's: "grow to 439804641894 MiB"); the low half of a small
	 * uintx or intx is its value on this little-endian machine.
	 */
	if (g1) {
		pct = *(const uint32_t *)bound;
		gc_max = heap_bytes / 100 * pct;
	} else {
		gc_max = heap_bytes / ((uint64_t)*(const uint32_t *)bound + 1);
	}
	/*
	 * G1's young generation may grow to its bound: more than a quarter of
	 * the budget is too much. Serial's is its bound: where it fits the budget
	 * it is local already, and a smaller one only brings more pauses (GcChurn
	 * at 50%: 7% slower held to half, bench/RESULTS.md, session 56).
	 */
	if (g1 ? young >= gc_max : gc_max <= budget)
		return 0;
	/* G1YoungGenSizer and Serial's GenArguments take MaxNewSize as the command line's: as if it came from there. */
	rc = fm_vms_flag_set_as_cmdline("MaxNewSize", young);
	if (rc)
		return rc;
	if (g1)
		snprintf(alone, sizeof(alone), "G1 alone would let it grow to %llu MiB, %llu%% of the %llu MiB heap",
			 (unsigned long long)(gc_max >> 20), (unsigned long long)pct,
			 (unsigned long long)(heap_bytes >> 20));
	else
		snprintf(alone, sizeof(alone), "NewRatio alone would make it %llu MiB of the %llu MiB heap, more "
			 "than the budget", (unsigned long long)(gc_max >> 20), (unsigned long long)(heap_bytes >> 20));
	snprintf(msg, msglen, "%s sizing: MaxNewSize=%llum (a quarter of the local budget of %llu MiB: the young "
		 "generation, which every pause rewrites, stays local, and the rest holds the old "
		 "generation's hot part; %s). --no-heap-sizing (heap_sizing=0) keeps %s's defaults", gc,
		 (unsigned long long)(young >> 20), (unsigned long long)(budget >> 20), alone, gc);
	return 1;
}

/*
 * A heap in shared memory (-XX:AllocateHeapAt on tmpfs): its mappings, per
 * /proc/self/maps. The heap is a shared mapping of an unlinked file on that
 * file system ("/dev/shm/#2 (deleted)"), mapped in full whatever -Xms says,
 * recognised by its device and paged in minor-fault mode; any other shared
 * piece is refused. File-backed pieces inside the range (the CDS archive's
 * heap regions, classes.jsa) are left alone.
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
			snprintf(err, errlen, "part of the shared-memory heap (%#lx-%#lx, %s) is not "
				 "committed memory", lo, hi, perms);
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

/* --- an anonymous heap, followed as it is committed --------------------------------------- */

/* 1 if [a, a+len) reaches into the reserved heap. */
static int touches_heap(uintptr_t a, size_t len)
{
	uintptr_t lo = atomic_load_explicit(&heap_lo, memory_order_acquire);

	return lo && a < atomic_load_explicit(&heap_hi, memory_order_acquire) && a + len > lo;
}

/* [a, a+len) clipped to the reserved heap, page-aligned outward as the kernel would. */
static void clip(uintptr_t *a, size_t *len)
{
	uintptr_t s = *a & ~(uintptr_t)4095, e = (*a + *len + 4095) & ~(uintptr_t)4095;
	uintptr_t lo = atomic_load(&heap_lo), hi = atomic_load(&heap_hi);

	s = s < lo ? lo : s;
	e = e > hi ? hi : e;
	*a = s;
	*len = e > s ? e - s : 0;
}

/*
 * Commit with the pager every anonymous private read-write mapping of the
 * reserved heap that it does not page yet (file-backed pieces, the CDS
 * archive's, and PROT_NONE ones stay unmanaged). Caller holds follow_lock.
 * Returns the pages newly paged.
 */
static long commit_mapped(struct fm_pager *p)
{
	uintptr_t start = atomic_load(&heap_lo), end = atomic_load(&heap_hi);
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	long added = 0;

	if (!f) {
		fm_warn("cannot read /proc/self/maps to follow the heap: %s", strerror(errno));
		return 0;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi, ino;
		char perms[8], path[64] = "";
		long n;
		if (sscanf(line, "%lx-%lx %7s %*s %*s %lu %63s", &lo, &hi, perms, &ino, path) < 4)
			continue;
		if (hi <= start || lo >= end || ino || (path[0] && strncmp(path, "[anon:", 6)) ||
		    strncmp(perms, "rw-p", 4))
			continue;
		lo = lo < start ? start : lo;
		hi = hi > end ? end : hi;
		n = fm_pager_commit(p, (void *)lo, hi - lo);
		if (n < 0)
			fm_warn("cannot page the committed heap %#lx+%lu KiB: %s", lo, (hi - lo) >> 10, strerror((int)-n));
		else
			added += n;
	}
	fclose(f);
	return added;
}

/*
 * HotSpot maps over part of the heap (MAP_FIXED: a commit, an uncommit), or
 * unmaps it. The pager lets the paged part go first, so the kernel never
 * replaces a registered mapping behind its back; a new read-write mapping is
 * paged before HotSpot sees it.
 */
static void *heap_map(void *(*real)(void *, size_t, int, int, int, off_t), void *addr, size_t len, int prot,
		      int flags, int fd, off_t off)
{
	uintptr_t a = (uintptr_t)addr;
	size_t n = len;
	void *r;
	int e;

	if (!(flags & MAP_FIXED) || !touches_heap(a, len))
		return real(addr, len, prot, flags, fd, off);
	clip(&a, &n);
	pthread_mutex_lock(&follow_lock);
	if (following && n)
		fm_pager_unregister(following, (void *)a, n);
	r = real(addr, len, prot, flags, fd, off);
	e = errno;
	/* Failed, the old mapping may still be there, now unpaged: the next pause's look at the maps takes it back. */
	if (r == MAP_FAILED)
		maps_unread = 1;
	if (following && n && r != MAP_FAILED && prot == (PROT_READ | PROT_WRITE) && fd == -1 &&
	    (flags & (MAP_PRIVATE | MAP_ANONYMOUS)) == (MAP_PRIVATE | MAP_ANONYMOUS)) {
		long k = fm_pager_commit(following, (void *)a, n);
		if (k < 0)
			fm_warn("cannot page the heap HotSpot committed at %#lx+%zu KiB: %s", (unsigned long)a,
				n >> 10, strerror((int)-k));
	}
	pthread_mutex_unlock(&follow_lock);
	errno = e;
	return r;
}

static void *hook_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return heap_map(real_mmap, addr, len, prot, flags, fd, off);
}

static void *hook_mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return heap_map(real_mmap64, addr, len, prot, flags, fd, off);
}

static int hook_munmap(void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr;
	size_t n = len;
	int r, e;

	if (!touches_heap(a, len))
		return real_munmap(addr, len);
	clip(&a, &n);
	pthread_mutex_lock(&follow_lock);
	if (following && n)
		fm_pager_unregister(following, (void *)a, n);
	r = real_munmap(addr, len);
	e = errno;
	if (r)
		maps_unread = 1;
	pthread_mutex_unlock(&follow_lock);
	errno = e;
	return r;
}

/* Send libjvm's mmap, mmap64 and munmap through the hooks (once per process). Caller holds follow_lock. */
static void hook_libjvm(void)
{
	int maps = 0, unmaps;

	if (hooked)
		return;
	maps += fm_got_interpose("libjvm.so", "mmap", (void *)hook_mmap, (void **)&real_mmap) > 0;
	maps += fm_got_interpose("libjvm.so", "mmap64", (void *)hook_mmap64, (void **)&real_mmap64) > 0;
	unmaps = fm_got_interpose("libjvm.so", "munmap", (void *)hook_munmap, (void **)&real_munmap) > 0;
	hooked = 1;
	maps_hooked = maps > 0;
	if (!maps)
		fm_warn("libjvm.so's mmap could not be interposed on: the heap is followed at the end of GC "
			"pauses only, and a part HotSpot uncommits leaves the pager by an unmap event");
	else
		fm_debug("interposed on libjvm.so's mmap%s", unmaps ? " and munmap" : "");
}

/* Whether the mapping at addr is hugetlbfs memory (MAP_HUGETLB shows as "/anon_hugepage"). */
static int in_huge_pages(uintptr_t addr)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int huge = 0;

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && addr >= lo && addr < hi) {
			huge = strstr(line, "anon_hugepage") != NULL;
			break;
		}
	}
	if (f)
		fclose(f);
	return huge;
}

static int register_sparse(struct fm_pager *p, uintptr_t start, uint64_t bytes, char *err, size_t errlen)
{
	long added;
	int rc;

	pthread_mutex_lock(&follow_lock);
	rc = fm_pager_register(p, (void *)start, bytes, FM_REG_HEAP | FM_REG_SPARSE);
	if (rc) {
		pthread_mutex_unlock(&follow_lock);
		snprintf(err, errlen, "cannot page the heap %#lx+%llu MiB: %s", (unsigned long)start,
			 (unsigned long long)(bytes >> 20), strerror(-rc));
		return rc;
	}
	atomic_store(&heap_lo, start);
	atomic_store(&heap_hi, start + bytes);
	following = p;
	/* Hooks first, then the maps: a commit after the read comes through a hook, which waits for the lock. */
	hook_libjvm();
	added = commit_mapped(p);
	maps_unread = 1;
	pthread_mutex_unlock(&follow_lock);
	if (!added) {
		fm_heap_unregister(p);
		if (in_huge_pages(start))
			snprintf(err, errlen, "the heap is in huge pages (-XX:+UseLargePages found hugetlbfs pages "
				 "for it): the pager pages 4 KiB pages; drop the flag to page the heap");
		else
			snprintf(err, errlen, "no committed anonymous memory found in the heap range %#lx+%llu MiB",
				 (unsigned long)start, (unsigned long long)(bytes >> 20));
		return -ENOENT;
	}
	fm_info("paging the Java heap %#lx+%llu MiB as HotSpot commits it (%llu MiB committed now)",
		(unsigned long)start, (unsigned long long)(bytes >> 20), (unsigned long long)((uint64_t)added >> 8));
	return 0;
}

void fm_heap_follow(struct fm_pager *p)
{
	long added;

	pthread_mutex_lock(&follow_lock);
	added = following == p && (maps_unread || !maps_hooked) ? commit_mapped(p) : 0;
	maps_unread = 0;
	pthread_mutex_unlock(&follow_lock);
	if (added)
		fm_info("found %ld committed heap pages the pager did not page yet: paged now", added);
}

/* --- registration ------------------------------------------------------------------------------ */

int fm_heap_register(struct fm_pager *p, uintptr_t *heap_start, uint64_t *heap_bytes, char *err, size_t errlen)
{
	uintptr_t start;
	uint64_t bytes;
	int rc = fm_vms_heap(&start, &bytes, err, errlen);

	if (rc)
		return rc;
	if (!heap_on_shm) {
		rc = register_sparse(p, start, bytes, err, errlen);
		if (!rc) {
			*heap_start = start;
			*heap_bytes = bytes;
		}
		return rc;
	}
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
			nvmas = 0;
			return rc;
		}
	}
	fm_info("paging the Java heap %#lx+%llu MiB in %d mappings (shared memory: minor-fault mode)",
		(unsigned long)start, (unsigned long long)(bytes >> 20), nvmas);
	*heap_start = start;
	*heap_bytes = bytes;
	return 0;
}

void fm_heap_unregister(struct fm_pager *p)
{
	pthread_mutex_lock(&follow_lock);
	if (following == p) {
		uintptr_t lo = atomic_load(&heap_lo);
		fm_pager_unregister(p, (void *)lo, atomic_load(&heap_hi) - lo);
		following = NULL;
	}
	pthread_mutex_unlock(&follow_lock);
	for (int i = 0; i < nvmas; i++)
		fm_pager_unregister(p, (void *)vmas[i].addr, vmas[i].len);
	nvmas = 0;
}

void fm_heap_fetch_all(struct fm_pager *p)
{
	pthread_mutex_lock(&follow_lock);
	if (following == p) {
		uintptr_t lo = atomic_load(&heap_lo);
		fm_pager_fetch_all(p, (void *)lo, atomic_load(&heap_hi) - lo);
	}
	pthread_mutex_unlock(&follow_lock);
	for (int i = 0; i < nvmas; i++)
		fm_pager_fetch_all(p, (void *)vmas[i].addr, vmas[i].len);
}
