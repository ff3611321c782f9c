// SPDX-License-Identifier: Apache-2.0
/*
 * libfarmem_agent.so: puts a HotSpot JVM's Java heap under the farmem pager.
 *
 *   java -agentpath:libfarmem_agent.so=memd=unix:/run/m.sock,local=25% ...
 *   jcmd PID JVMTI.agent_load /path/libfarmem_agent.so local=2g,secret_file=F,memd=...
 *   jcmd PID JVMTI.agent_load /path/libfarmem_agent.so detach
 *
 * OPTIONS is one comma-separated list of key=value (docs/jvm.md is the full
 * table; this comment is the spec):
 *
 *   memd=ADDR[;ADDR...]  memory servers (';' separates them, ',' separates options);
 *                        default $FARMEM_MEMD
 *   secret=S             memd secret; default: secret_file=, else $FARMEM_SECRET
 *   secret_file=PATH     read the secret from PATH (trailing newline stripped)
 *   local=SIZE|PCT       local budget: bytes, or a percentage of the Java heap (-Xmx)
 *   fill_threads, evict_high, evict_low, evict_batch, prefetch, epoch_pct,
 *   gc_aware, transport, log, control      pager knobs (uffd/config.c, docs/knobs.md)
 *   discard=1|all|0      at the end of every GC pause, discard the collector's free
 *                        space (G1's free regions; Parallel's unused space above top)
 *                        so that garbage is not read back from memd nor written to it
 *                        (gcfree.c; default 1: all but resident dirty pages, see
 *                        discard_range; all: those too)
 *   onerror=exit|continue  a JVM farmem cannot serve, or a memd it cannot reach: at
 *                        start, exit (default: the JVM does not start) or run without
 *                        farmem; on attach the JVM always goes on untouched
 *   msgfile=PATH         also write the error message there (farmem attach reads it)
 *   detach               (attach only) bring every page home and stop the pager
 *
 * An unknown key or a bad value is always an error (the JVM does not start;
 * on attach the load fails): a typo never runs a JVM the user thinks is paged.
 *
 * Life cycle: Agent_OnLoad checks the options and the JVM's configuration
 * (GC, heap commitment) from its flags and starts the pager; VMInit, the
 * first moment the heap exists, registers the heap's anonymous mappings.
 * Agent_OnAttach does both at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <jvmti.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "fm_util.h"
#include "gcfree.h"
#include "pager.h"
#include "resmap.h"
#include "swapva_move.h"
#include "vmstructs.h"

#define EXPORT __attribute__((visibility("default")))
#define EXIT_CONFIG 78 /* as the preload shim: a configuration farmem refuses */
#define MAX_HEAP_VMAS 64

struct agent_opts {
	struct fm_pager_cfg cfg;
	unsigned local_pct;       /* of the heap, converted to bytes once its size is known */
	int onerror_continue;
	int discard;              /* discard=1|all|0: free space after each GC pause */
	int detach;
	char msgfile[256];
};

static struct agent_opts opts;
static jvmtiEnv *jvmti;
static _Atomic(struct fm_pager *) live;  /* NULL when idle */
static atomic_int gc_users;              /* GC callbacks inside the pager right now */
static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uintptr_t addr; size_t len; uint32_t flags; } vmas[MAX_HEAP_VMAS];
static int nvmas;
/* -XX:AllocateHeapAt on tmpfs: the heap file's device (the file itself is unlinked at once). */
static int heap_on_shm;
static dev_t heap_shm_dev;
static atomic_int discard_on;            /* the free-space walk is set up and enabled */

/* --- messages -------------------------------------------------------------------- */

static void say(const char *level, const char *msg)
{
	fprintf(stderr, "farmem: %s: %s\n", level, msg);
	fflush(stderr);
	if (opts.msgfile[0]) {
		int fd = open(opts.msgfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd >= 0) {
			dprintf(fd, "%s\n", msg);
			close(fd);
		}
	}
}

/* --- GC threads ---------------------------------------------------------------- */

/*
 * HotSpot 17 names its threads (/proc/self/task/TID/comm, cut at 15 bytes):
 * "GC Thread#N" (G1 and Parallel workers), "G1 Conc#N", "G1 Main Marker",
 * "G1 Refine#N", "G1 Service", "VM Thread" (runs the pauses' serial parts).
 * Older JDKs said "ParGC Thread#N" and "G1 Young RemSet".
 */
static const char *const gc_names[] = {
	"GC Thread#", "G1 Conc#", "G1 Main Marker", "G1 Refine#", "G1 Service", "VM Thread",
	"ParGC Thread#", "G1 Young RemSet", "GC Thread",
};

#define TID_SLOTS 4096 /* power of two */
static _Atomic uint64_t tid_cache[TID_SLOTS]; /* tid << 1 | is_gc; 0 = empty */

static int name_is_gc(const char *n)
{
	for (size_t i = 0; i < sizeof(gc_names) / sizeof(gc_names[0]); i++)
		if (!strncmp(n, gc_names[i], strlen(gc_names[i])))
			return 1;
	return 0;
}

/*
 * Called by the pager's fault handlers with the faulting thread's id. A tid
 * is looked up once; tids are reused only after a thread exits, and HotSpot
 * keeps its GC threads for the JVM's life, so a stale entry can only
 * misattribute faults of an application thread that reused a GC tid.
 */
static int is_gc_thread(pid_t tid)
{
	unsigned h = ((unsigned)tid * 2654435761u) & (TID_SLOTS - 1);
	char path[64], name[32] = "";
	int fd, gc;
	ssize_t n;

	for (unsigned k = 0; k < 16; k++) {
		uint64_t e = atomic_load_explicit(&tid_cache[(h + k) & (TID_SLOTS - 1)], memory_order_relaxed);
		if (!e)
			break;
		if ((pid_t)(e >> 1) == tid)
			return (int)(e & 1);
	}
	/* comm is read under the task lock only: safe while the thread sits in a fault. */
	snprintf(path, sizeof(path), "/proc/self/task/%d/comm", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, name, sizeof(name) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	name[n] = '\0';
	gc = name_is_gc(name);
	for (unsigned k = 0; k < 16; k++) {
		uint64_t zero = 0;
		if (atomic_compare_exchange_strong(&tid_cache[(h + k) & (TID_SLOTS - 1)], &zero,
						   ((uint64_t)tid << 1) | (uint64_t)gc))
			break;
	}
	return gc;
}

/* --- options ------------------------------------------------------------------- */

static int read_secret_file(struct fm_pager_cfg *cfg, const char *path, char *err, size_t errlen)
{
	char buf[sizeof(cfg->secret) + 1];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0) {
		snprintf(err, errlen, "secret_file=%s: %s", path, strerror(errno));
		return -EINVAL;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n <= 0 || (size_t)n >= sizeof(cfg->secret)) {
		snprintf(err, errlen, "secret_file=%s: empty, unreadable or longer than %zu bytes", path,
			 sizeof(cfg->secret) - 1);
		return -EINVAL;
	}
	buf[n] = '\0';
	return fm_pager_cfg_set(cfg, "secret", buf, err, errlen);
}

/* Parse OPTIONS into o. Returns 0, or -EINVAL with err naming the key. */
static int parse_options(const char *options, struct agent_opts *o, char *err, size_t errlen)
{
	char *copy, *save = NULL, *tok;
	const char *env;
	int rc = 0;

	memset(o, 0, sizeof(*o));
	fm_pager_cfg_defaults(&o->cfg);
	o->local_pct = o->cfg.local_pct;
	o->discard = 1;
	if ((env = getenv("FARMEM_MEMD")) && *env)
		snprintf(o->cfg.memd, sizeof(o->cfg.memd), "%s", env);
	if ((env = getenv("FARMEM_SECRET")) && *env)
		fm_pager_cfg_set(&o->cfg, "secret", env, err, errlen);
	if ((env = getenv("FARMEM_CONTROL")) && *env)
		snprintf(o->cfg.control, sizeof(o->cfg.control), "%s", env);
	/* knobs.md's variable; the gc_aware option, below, wins over it. */
	if ((env = getenv("FARMEM_GC_AWARE")) && *env &&
	    fm_pager_cfg_set(&o->cfg, "gc_aware", env, err, errlen)) {
		char msg[512];
		snprintf(msg, sizeof(msg), "FARMEM_GC_AWARE: %s", err);
		snprintf(err, errlen, "%s", msg);
		return -EINVAL;
	}
	/* The same for memd_copy (fm_pager_move: COPY or read+write); the option wins too. */
	if ((env = getenv("FARMEM_MEMD_COPY")) && *env &&
	    fm_pager_cfg_set(&o->cfg, "memd_copy", env, err, errlen)) {
		char msg[512];
		snprintf(msg, sizeof(msg), "FARMEM_MEMD_COPY: %s", err);
		snprintf(err, errlen, "%s", msg);
		return -EINVAL;
	}
	copy = strdup(options ? options : "");
	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *val = strchr(tok, '=');
		if (val)
			*val++ = '\0';
		if (!*tok) {
			snprintf(err, errlen, "empty option name in '%s'", options);
			rc = -EINVAL;
			break;
		}
		if (!strcasecmp(tok, "detach")) {
			if (val) {
				snprintf(err, errlen, "detach takes no value (detach=%s)", val);
				rc = -EINVAL;
				break;
			}
			o->detach = 1;
			continue;
		}
		if (!val) {
			snprintf(err, errlen, "option '%s' needs a value (%s=...)", tok, tok);
			rc = -EINVAL;
			break;
		}
		if (!strcasecmp(tok, "onerror")) {
			if (!strcasecmp(val, "exit"))
				o->onerror_continue = 0;
			else if (!strcasecmp(val, "continue"))
				o->onerror_continue = 1;
			else {
				snprintf(err, errlen, "onerror=%s: expected exit or continue", val);
				rc = -EINVAL;
				break;
			}
		} else if (!strcasecmp(tok, "discard")) {
			if (!strcmp(val, "1"))
				o->discard = 1;
			else if (!strcmp(val, "0"))
				o->discard = 0;
			else {
				snprintf(err, errlen, "discard=%s: expected 1 or 0", val);
				rc = -EINVAL;
				break;
			}
		} else if (!strcasecmp(tok, "msgfile")) {
			if (!*val || strlen(val) >= sizeof(o->msgfile)) {
				snprintf(err, errlen, "msgfile=%s: bad path", val);
				rc = -EINVAL;
				break;
			}
			snprintf(o->msgfile, sizeof(o->msgfile), "%s", val);
		} else if (!strcasecmp(tok, "secret_file")) {
			rc = read_secret_file(&o->cfg, val, err, errlen);
			if (rc)
				break;
		} else if (!strcasecmp(tok, "memd")) {
			for (char *c = val; *c; c++)
				if (*c == ';')
					*c = ',';
			rc = fm_pager_cfg_set(&o->cfg, tok, val, err, errlen);
			if (rc)
				break;
		} else if (!strcasecmp(tok, "threshold")) {
			snprintf(err, errlen, "threshold is a knob of the preload shim, not of the agent "
				 "(the agent pages the Java heap)");
			rc = -EINVAL;
			break;
		} else {
			rc = fm_pager_cfg_set(&o->cfg, tok, val, err, errlen);
			if (rc) {
				if (rc == -ENOENT)
					snprintf(err, errlen, "unknown option '%s' (docs/jvm.md lists them)", tok);
				rc = -EINVAL;
				break;
			}
		}
	}
	free(copy);
	if (rc)
		return rc;
	if (o->cfg.evict_low >= o->cfg.evict_high) {
		snprintf(err, errlen, "evict_low=%u must be below evict_high=%u", o->cfg.evict_low, o->cfg.evict_high);
		return -EINVAL;
	}
	o->local_pct = o->cfg.local_bytes ? 0 : o->cfg.local_pct;
	o->cfg.threshold = 4096;
	o->cfg.is_gc_thread = is_gc_thread;
	return 0;
}

/* --- what this JVM is ------------------------------------------------------------ */

#define TMPFS_MAGIC_ 0x01021994 /* <linux/magic.h> */

/* Refuse what the pager cannot serve. heap_bytes: -Xmx, 0 if unknown. */
static int check_jvm(uint64_t *heap_bytes, char *err, size_t errlen)
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

/* The budget in bytes: a percentage is of the heap, and no budget may exceed it. */
static int settle_budget(struct agent_opts *o, uint64_t heap_bytes, char *err, size_t errlen)
{
	if (!heap_bytes)
		return 0; /* unknown: the pager takes the percentage of what is registered */
	if (o->local_pct) {
		o->cfg.local_bytes = heap_bytes * o->local_pct / 100;
		if (o->cfg.local_bytes < (1u << 20))
			o->cfg.local_bytes = 1u << 20;
		o->cfg.local_pct = 0;
	} else if (o->cfg.local_bytes > heap_bytes) {
		snprintf(err, errlen, "local=%llu MiB is larger than the Java heap (%llu MiB): nothing would "
			 "ever be remote", (unsigned long long)(o->cfg.local_bytes >> 20),
			 (unsigned long long)(heap_bytes >> 20));
		return -EINVAL;
	}
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

/* --- start, register, detach --------------------------------------------------- */

static void stop_pager(struct fm_pager *p, int registered)
{
	for (int i = 0; i < registered; i++)
		fm_pager_unregister(p, (void *)vmas[i].addr, vmas[i].len);
	fm_pager_stop(p);
}

/*
 * discard=1: resolve the collector's structures now (the walk in the GC
 * callback may only read memory). Any name missing: say so, page without it.
 */
static void setup_discard(uintptr_t start, uint64_t bytes)
{
	char why[300];
	int kind;

	atomic_store(&discard_on, 0);
	if (!opts.discard) {
		fm_info("discard=0: the collector's free space is paged like live data");
		return;
	}
	kind = fm_gcfree_init(start, bytes, why, sizeof(why));
	if (kind == FM_GCFREE_NONE) {
		fm_warn("discard disabled: %s; free heap space is paged like live data", why);
		return;
	}
	fm_info("discard: %s's free space is dropped at the end of every pause (G1: %llu KiB regions)",
		fm_gcfree_kind_name(kind), (unsigned long long)(fm_gcfree_granule() >> 10));
	atomic_store(&discard_on, 1);
}

/* Register the heap with a started pager; all or nothing. Caller holds life_lock. */
static int register_heap(struct fm_pager *p, char *err, size_t errlen)
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
	setup_discard(start, bytes);
	return 0;
}

/*
 * Count remote or in-flight pages of our regions in the residency map. A
 * zero-fill in flight (FILLING, nothing in memd) does not count: no byte of
 * it is remote, and unregistering waits for it to finish.
 */
static uint64_t pages_not_home(struct fm_pager *p)
{
	struct fm_resmap_hdr *h = fm_pager_map(p);
	uint64_t n = 0;

	for (uint32_t r = 0; r < h->nregions && r < FM_RESMAP_MAX_REGIONS; r++) {
		const uint8_t *pg = (const uint8_t *)h + h->regions[r].map_offset;
		if (!(h->regions[r].flags & 1u))
			continue;
		for (uint64_t i = 0; i < h->regions[r].npages; i++) {
			unsigned s = fm_pg_state(pg[i]);
			if (s == FM_PG_REMOTE || s == FM_PG_LEAVING ||
			    (s == FM_PG_FILLING && (pg[i] & FM_PGF_HAS_REMOTE))) {
				if (!n++)
					fm_warn("heap page %#llx is not home (state byte %#x)",
						(unsigned long long)(h->regions[r].base + (i << h->page_shift)), pg[i]);
			}
		}
	}
	return n;
}

static int detach(char *err, size_t errlen)
{
	struct fm_pager *p;
	uint64_t left;

	pthread_mutex_lock(&life_lock);
	p = atomic_load(&live);
	if (!p) {
		pthread_mutex_unlock(&life_lock);
		snprintf(err, errlen, "farmem is not paging this JVM (nothing to detach)");
		return -ENOENT;
	}
	atomic_store(&live, NULL);
	while (atomic_load(&gc_users))
		sched_yield();
	/*
	 * fetch_all pins each region first, so the evictor takes nothing more
	 * from it; the second pass picks up a page an eviction in flight at the
	 * moment of pinning sent away after the first pass had gone by.
	 */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < nvmas; i++)
			fm_pager_fetch_all(p, (void *)vmas[i].addr, vmas[i].len);
	left = pages_not_home(p);
	if (left) {
		/* Never unregister a range with a page still in memd: it would read as zeros. */
		atomic_store(&live, p);
		pthread_mutex_unlock(&life_lock);
		snprintf(err, errlen, "%llu heap pages could not be brought home; still paging",
			 (unsigned long long)left);
		return -EBUSY;
	}
	stop_pager(p, nvmas);
	nvmas = 0;
	pthread_mutex_unlock(&life_lock);
	fprintf(stderr, "farmem: detached: every heap page is local, the pager is stopped\n");
	return 0;
}

static int start_pager(struct fm_pager **out, char *err, size_t errlen)
{
	fm_log_prefix = "farmem";
	fm_log_level = opts.cfg.log_level;
	if (!opts.cfg.memd[0]) {
		snprintf(err, errlen, "no memd address: give memd=ADDR (or set FARMEM_MEMD)");
		return -EINVAL;
	}
	if (!opts.cfg.secret_len) {
		snprintf(err, errlen, "no memd secret: give secret_file=PATH (or set FARMEM_SECRET)");
		return -EINVAL;
	}
	return fm_pager_start(&opts.cfg, out, err, errlen);
}

/* --- JVMTI --------------------------------------------------------------------------- */

static void JNICALL on_gc_start(jvmtiEnv *env)
{
	struct fm_pager *p;
	atomic_fetch_add(&gc_users, 1);
	if ((p = atomic_load(&live)))
		fm_pager_gc_event(p, 1);
	atomic_fetch_sub(&gc_users, 1);
}

/*
 * The free space a pause leaves: the pager drops its resident pages with no
 * write-back and forgets its remote copies. The program's next allocation
 * there is a local zero-fill, which the prefetcher installs in runs of pages
 * as allocation streams through a region, so reuse costs about one fault per
 * run instead of a write-back now and a fetch later.
 */
#define MAX_FREE_RANGES 4096
static struct { uintptr_t addr; size_t len; } free_ranges[MAX_FREE_RANGES];
static int nfree_ranges;

static void collect_range(uintptr_t addr, size_t len, void *arg)
{
	if (nfree_ranges == MAX_FREE_RANGES) {
		/* More ranges than G1's usual 2048 regions can make: discard the rest in full. */
		fm_pager_discard((struct fm_pager *)arg, (void *)addr, len);
		return;
	}
	free_ranges[nfree_ranges].addr = addr;
	free_ranges[nfree_ranges].len = len;
	nfree_ranges++;
}

/* The free ranges the walk listed. */
static void discard_listed(struct fm_pager *p)
{
	for (int i = 0; i < nfree_ranges; i++)
		fm_pager_discard(p, (void *)free_ranges[i].addr, free_ranges[i].len);
}

/*
 * GarbageCollectionFinish is posted while the VM is still at the pause's
 * safepoint (gcfree.c says where, in JDK 17): nothing but this thread touches
 * the free space now. Only plain C here: no JNI, no JVMTI.
 */
static void JNICALL on_gc_finish(jvmtiEnv *env)
{
	struct fm_pager *p;
	atomic_fetch_add(&gc_users, 1);
	if ((p = atomic_load(&live))) {
		if (atomic_load_explicit(&discard_on, memory_order_relaxed)) {
			char why[300];
			nfree_ranges = 0;
			if (fm_gcfree_walk(collect_range, p, why, sizeof(why)) >= 0) {
				discard_listed(p);
			} else {
				atomic_store(&discard_on, 0);
				fm_warn("discard disabled: %s; free heap space is paged like live data from now on",
					why);
			}
		}
		fm_pager_gc_event(p, 0);
	}
	atomic_fetch_sub(&gc_users, 1);
}

static struct fm_pager *pending; /* started at OnLoad, heap registered at VMInit */

/* farmem_swapva_move runs in GC workers: held like a GC callback (swapva_move.h). */
struct fm_pager *fm_agent_pager_enter(void)
{
	atomic_fetch_add(&gc_users, 1);
	return atomic_load(&live);
}

void fm_agent_pager_leave(void)
{
	atomic_fetch_sub(&gc_users, 1);
}

int fm_agent_pager_expected(void)
{
	int yes;
	pthread_mutex_lock(&life_lock);
	yes = pending || atomic_load(&live);
	pthread_mutex_unlock(&life_lock);
	return yes;
}

static void JNICALL on_vm_init(jvmtiEnv *env, JNIEnv *jni, jthread thread)
{
	char err[512];
	int rc;

	pthread_mutex_lock(&life_lock);
	if (!pending) {
		pthread_mutex_unlock(&life_lock);
		return;
	}
	rc = register_heap(pending, err, sizeof(err));
	if (rc) {
		fm_pager_stop(pending);
		pending = NULL;
		pthread_mutex_unlock(&life_lock);
		if (!opts.onerror_continue) {
			char msg[600];
			snprintf(msg, sizeof(msg), "%s; stopping the JVM (onerror=exit)", err);
			say("error", msg);
			_exit(EXIT_CONFIG);
		}
		{
			char msg[600];
			snprintf(msg, sizeof(msg), "%s; the JVM runs without farmem (onerror=continue)", err);
			say("warning", msg);
		}
		return;
	}
	atomic_store(&live, pending);
	pending = NULL;
	pthread_mutex_unlock(&life_lock);
}

static int setup_jvmti(JavaVM *vm, int at_start, char *err, size_t errlen)
{
	jvmtiCapabilities caps = { 0 };
	jvmtiEventCallbacks cb = { 0 };
	jvmtiError e;

	if (jvmti)
		return 0; /* loaded before (attach after a detach): events are already on */
	if ((*vm)->GetEnv(vm, (void **)&jvmti, JVMTI_VERSION_1_2) != JNI_OK || !jvmti) {
		snprintf(err, errlen, "this JVM offers no JVMTI 1.2 environment");
		jvmti = NULL;
		return -ENOTSUP;
	}
	caps.can_generate_garbage_collection_events = 1;
	e = (*jvmti)->AddCapabilities(jvmti, &caps);
	if (e != JVMTI_ERROR_NONE) {
		snprintf(err, errlen, "JVMTI refused the GC-event capability (error %d)", (int)e);
		return -ENOTSUP;
	}
	cb.VMInit = on_vm_init;
	cb.GarbageCollectionStart = on_gc_start;
	cb.GarbageCollectionFinish = on_gc_finish;
	(*jvmti)->SetEventCallbacks(jvmti, &cb, sizeof(cb));
	if (at_start)
		(*jvmti)->SetEventNotificationMode(jvmti, JVMTI_ENABLE, JVMTI_EVENT_VM_INIT, NULL);
	(*jvmti)->SetEventNotificationMode(jvmti, JVMTI_ENABLE, JVMTI_EVENT_GARBAGE_COLLECTION_START, NULL);
	(*jvmti)->SetEventNotificationMode(jvmti, JVMTI_ENABLE, JVMTI_EVENT_GARBAGE_COLLECTION_FINISH, NULL);
	return 0;
}

EXPORT jint JNICALL Agent_OnLoad(JavaVM *vm, char *options, void *reserved)
{
	char err[512], msg[600];
	uint64_t heap = 0;
	int rc;

	if (parse_options(options, &opts, err, sizeof(err))) {
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM does not start", err);
		say("error", msg);
		return JNI_ERR;
	}
	fm_swapva_export(); /* for a farmem JDK's -XX:+UseFarmemSwapVA */
	if (opts.detach) {
		say("error", "detach is for a running JVM (farmem detach PID); the JVM does not start");
		return JNI_ERR;
	}
	rc = check_jvm(&heap, err, sizeof(err));
	if (!rc)
		rc = settle_budget(&opts, heap, err, sizeof(err));
	if (rc == -EINVAL) {
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM does not start", err);
		say("error", msg);
		return JNI_ERR;
	}
	if (!rc)
		rc = setup_jvmti(vm, 1, err, sizeof(err));
	if (!rc)
		rc = start_pager(&pending, err, sizeof(err));
	if (rc) {
		pending = NULL;
		if (!opts.onerror_continue) {
			snprintf(msg, sizeof(msg), "%s; the JVM does not start (onerror=exit)", err);
			say("error", msg);
			return JNI_ERR;
		}
		snprintf(msg, sizeof(msg), "%s; the JVM runs without farmem (onerror=continue)", err);
		say("warning", msg);
	}
	return JNI_OK;
}

EXPORT jint JNICALL Agent_OnAttach(JavaVM *vm, char *options, void *reserved)
{
	struct agent_opts o;
	struct fm_pager *p = NULL;
	char err[512], msg[600];
	uint64_t heap = 0;
	int rc;

	if (parse_options(options, &o, err, sizeof(err))) {
		snprintf(opts.msgfile, sizeof(opts.msgfile), "%s", o.msgfile);
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM goes on without farmem", err);
		say("error", msg);
		return JNI_ERR;
	}
	if (o.detach) {
		snprintf(opts.msgfile, sizeof(opts.msgfile), "%s", o.msgfile);
		rc = detach(err, sizeof(err));
		if (rc)
			say("error", err);
		return rc ? JNI_ERR : JNI_OK;
	}
	pthread_mutex_lock(&life_lock);
	if (atomic_load(&live) || pending) {
		pthread_mutex_unlock(&life_lock);
		snprintf(opts.msgfile, sizeof(opts.msgfile), "%s", o.msgfile);
		say("error", "farmem is already paging this JVM (farmem detach PID first)");
		return JNI_ERR;
	}
	opts = o;
	rc = check_jvm(&heap, err, sizeof(err));
	if (!rc)
		rc = settle_budget(&opts, heap, err, sizeof(err));
	if (!rc)
		rc = setup_jvmti(vm, 0, err, sizeof(err));
	if (!rc)
		rc = start_pager(&p, err, sizeof(err));
	if (!rc) {
		rc = register_heap(p, err, sizeof(err));
		if (rc)
			fm_pager_stop(p);
	}
	if (rc) {
		pthread_mutex_unlock(&life_lock);
		snprintf(msg, sizeof(msg), "%s; the JVM goes on without farmem", err);
		say("error", msg);
		return JNI_ERR;
	}
	atomic_store(&live, p);
	pthread_mutex_unlock(&life_lock);
	fm_info("attached");
	return JNI_OK;
}

EXPORT void JNICALL Agent_OnUnload(JavaVM *vm)
{
	/* The JVM is exiting: the process takes the pager with it, memd sees the session close. */
	fm_swapva_report();
}
