// SPDX-License-Identifier: Apache-2.0
/*
 * libfarmem_agent.so: puts a HotSpot JVM's Java heap under the farmem pager.
 *
 *   java -agentpath:libfarmem_agent.so=memd=unix:/run/m.sock,local=25% ...
 *   jcmd PID JVMTI.agent_load /path/libfarmem_agent.so local=2g,secret_file=F,memd=...
 *   jcmd PID JVMTI.agent_load /path/libfarmem_agent.so detach
 *
 * OPTIONS is one comma-separated list of key=value: options.h parses it,
 * uffd/knobs.h lists the keys, docs/jvm.md is their table.
 *
 * This file is the agent's life cycle: Agent_OnLoad checks the options and
 * the JVM's configuration (GC, heap file; heap.c) from its flags and starts
 * the pager; VMInit, the first moment the heap exists, puts the heap under
 * the pager, which from then on follows it as HotSpot commits and uncommits
 * it (heap.c). Agent_OnAttach does both at once; the option detach brings
 * every page home and stops the pager. The GC events feed the pager and
 * discard the collector's free space (gcfree.c); GC threads are told apart by
 * name (gcthreads.c).
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
#include <unistd.h>

#include "fm_util.h"
#include "gccounts.h"
#include "gcfree.h"
#include "gcthreads.h"
#include "heap.h"
#include "options.h"
#include "pager.h"
#include "preload.h"
#include "resmap.h"
#include "gc_calls.h"
#include "gcmove.h"
#include "klass.h"
#include "swapva_move.h"

#define EXPORT __attribute__((visibility("default")))
#define EXIT_CONFIG 78 /* as the preload shim: a configuration farmem refuses */

static struct fm_agent_opts opts;
static jvmtiEnv *jvmti;
static _Atomic(struct fm_pager *) live;  /* NULL when idle */
static atomic_int gc_users;              /* GC callbacks inside the pager right now */
static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
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

/* --- start, register, detach --------------------------------------------------- */

/*
 * discard=1: resolve the collector's structures now (the walk in the GC
 * callback may only read memory). Any name missing: say so, page without it.
 */
static void setup_discard(uintptr_t start, uint64_t bytes)
{
	char why[300];
	int kind;

	atomic_store(&discard_on, 0);
	/* Read without discard too: gc_moves asks which regions are young (gcfree.h). */
	kind = fm_gcfree_init(start, bytes, why, sizeof(why));
	if (!opts.discard) {
		fm_info("discard=0: the collector's free space is paged like live data");
		return;
	}
	if (kind == FM_GCFREE_NONE) {
		fm_warn("discard disabled: %s; free heap space is paged like live data", why);
		return;
	}
	if (fm_gcfree_granule())
		fm_info("discard: %s's free regions (%llu KiB each) are dropped at the end of every pause",
			fm_gcfree_kind_name(kind), (unsigned long long)(fm_gcfree_granule() >> 10));
	else
		fm_info("discard: %s's free space is dropped at the end of every pause", fm_gcfree_kind_name(kind));
	atomic_store(&discard_on, 1);
}

static const struct fm_pager_ref pager_ref; /* below, with what it calls */

static void setup_gc_moves(void)
{
	int rc = fm_gcmove_setup(&pager_ref, (int)opts.gc_moves);

	if (rc > 0)
		fm_info("gc_moves: a pause's moves of heap bytes that memd holds are done in memd");
	else if (rc < 0)
		fm_warn("gc_moves disabled: libjvm.so's memmove could not be interposed on (%s); full GCs copy "
			"through local memory", strerror(-rc));
}

/* Register the heap with a started pager, all or nothing, and set up discard. Caller holds life_lock. */
static int register_heap(struct fm_pager *p, char *err, size_t errlen)
{
	uintptr_t start;
	uint64_t bytes;
	int rc = fm_heap_register(p, &start, &bytes, err, errlen);

	if (!rc) {
		setup_discard(start, bytes);
		setup_gc_moves();
	}
	return rc;
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

	for (uint32_t k = 0; k < h->nregions && k < FM_RESMAP_SLOTS; k++) {
		const struct fm_resmap_region *r = fm_resmap_slot_ro(h, k);
		const uint8_t *pg = (const uint8_t *)h + r->map_offset;
		if (!(r->flags & FM_REGION_F_LIVE))
			continue;
		for (uint64_t i = 0; i < r->npages; i++) {
			unsigned s = fm_pg_state(pg[i]);
			if (s == FM_PG_REMOTE || s == FM_PG_LEAVING ||
			    (s == FM_PG_FILLING && (pg[i] & FM_PGF_HAS_REMOTE))) {
				if (!n++)
					fm_warn("heap page %#llx is not home (state byte %#x)",
						(unsigned long long)(r->base + (i << h->page_shift)), pg[i]);
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
		fm_heap_fetch_all(p);
	left = pages_not_home(p);
	if (left) {
		/* Never unregister a range with a page still in memd: it would read as zeros. */
		atomic_store(&live, p);
		pthread_mutex_unlock(&life_lock);
		snprintf(err, errlen, "%llu heap pages could not be brought home; still paging",
			 (unsigned long long)left);
		return -EBUSY;
	}
	fm_heap_unregister(p);
	fm_pager_stop(p);
	pthread_mutex_unlock(&life_lock);
	fprintf(stderr, "farmem: detached: every heap page is local, the pager is stopped\n");
	return 0;
}

/*
 * A JVM started under farmem run by a script or another program: the
 * preload shim is in it too, and stands aside for the agent (preload.h).
 * 1 if it pages this process already.
 */
static int shim_pages_here(void)
{
	fm_preload_yield_fn yield = (fm_preload_yield_fn)dlsym(RTLD_DEFAULT, FM_PRELOAD_YIELD_SYMBOL);

	return yield && yield();
}

static int start_pager(struct fm_pager **out, char *err, size_t errlen)
{
	fm_log_prefix = "farmem";
	fm_log_level = opts.cfg.log_level;
	opts.cfg.is_gc_thread = fm_agent_is_gc_thread;
	opts.cfg.full_gc_in_memd = fm_gcmove_full_gc;
	if (opts.object_reads)
		opts.cfg.object_end = fm_klass_array_end;
	if (opts.gc_referents)
		opts.cfg.referents = fm_klass_referents;
	if (!opts.cfg.memd[0]) {
		snprintf(err, errlen, "no memd address: give memd=ADDR (or set FARMEM_MEMD)");
		return -EINVAL;
	}
	if (!opts.cfg.secret_len) {
		snprintf(err, errlen, "no memd secret: give secret_file=PATH (or set FARMEM_SECRET)");
		return -EINVAL;
	}
	if (shim_pages_here()) {
		snprintf(err, errlen, "the preload shim (LD_PRELOAD) already pages this process: one pager per "
			 "process");
		return -EBUSY;
	}
	return fm_pager_start(&opts.cfg, out, err, errlen);
}

/* --- JVMTI --------------------------------------------------------------------------- */

/* The JVM's collection counts at this pause's start (gccounts.h): what it was, seen at its end. */
static uint32_t total_at_start, full_at_start;
static int counts_at_start; /* read at this pause's start (an agent attached in a pause saw none) */

static void JNICALL on_gc_start(jvmtiEnv *env)
{
	struct fm_pager *p;
	const volatile uint32_t *counts;
	atomic_fetch_add(&gc_users, 1);
	if ((p = atomic_load(&live))) {
		fm_pager_gc_event(p, 1);
		counts_at_start = (counts = fm_gc_counts()) != NULL;
		if (counts) {
			total_at_start = counts[0];
			full_at_start = counts[1];
		}
		if (opts.object_reads || opts.cfg.referents)
			fm_klass_setup(); /* the first pause's: the JVM is up, and this thread alone reads the layout */
		fm_gcmove_pause(1);
		if (atomic_load_explicit(&discard_on, memory_order_relaxed))
			fm_gcfree_pause_begins();
	}
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

/*
 * The free ranges the walk listed: those G1 writes again soonest, at the
 * two ends of its free space (gcfree.h), as reused; the rest as garbage.
 */
static void discard_listed(struct fm_pager *p)
{
	uint64_t top, bottom, total = 0, at = 0, middle_end;

	fm_gcfree_reused_soon(&top, &bottom);
	if (fm_pager_short_of_room(p))
		top = 0;
	for (int i = 0; i < nfree_ranges; i++)
		total += free_ranges[i].len;
	bottom = bottom < total ? bottom : total;
	top = top < total - bottom ? top : total - bottom;
	middle_end = total - top;
	for (int i = 0; i < nfree_ranges; i++) {
		uintptr_t a = free_ranges[i].addr;
		uint64_t len = free_ranges[i].len;

		/* [at, at + len) of the free space, cut where the bottom and top parts end and begin. */
		for (uint64_t o = 0; o < len;) {
			uint64_t pos = at + o, cut = pos < bottom ? bottom : pos < middle_end ? middle_end : total;
			uint64_t n = cut - pos < len - o ? cut - pos : len - o;

			if (pos < bottom || pos >= middle_end)
				fm_pager_discard_reused(p, (void *)(a + o), n);
			else
				fm_pager_discard(p, (void *)(a + o), n);
			o += n;
		}
		at += len;
	}
}

/*
 * GarbageCollectionFinish is posted while the VM is still at the pause's
 * safepoint (gcfree.c says where, in JDK 17): nothing but this thread touches
 * the free space now. Only plain C here: no JNI, no JVMTI.
 */
static void JNICALL on_gc_finish(jvmtiEnv *env)
{
	struct fm_pager *p;
	const volatile uint32_t *counts;
	atomic_fetch_add(&gc_users, 1);
	fm_gcmove_pause(0);
	if ((p = atomic_load(&live))) {
		if (counts_at_start && (counts = fm_gc_counts()))
			fm_pager_gc_pause_was(p, counts[1] != full_at_start, counts[0] != total_at_start);
		counts_at_start = 0;
		fm_heap_follow(p);
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

/* What a farmem JDK calls runs in GC workers: held like a GC callback (pager_ref.h). */
static struct fm_pager *pager_enter(void)
{
	atomic_fetch_add(&gc_users, 1);
	return atomic_load(&live);
}

static void pager_leave(void)
{
	atomic_fetch_sub(&gc_users, 1);
}

static int pager_expected(void)
{
	int yes;
	pthread_mutex_lock(&life_lock);
	yes = pending || atomic_load(&live);
	pthread_mutex_unlock(&life_lock);
	return yes;
}

static const struct fm_pager_ref pager_ref = { pager_enter, pager_leave, pager_expected };

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
		if (!opts.onerror) {
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

/*
 * farmem run -- java: the JVMs this one starts get the agent too, through
 * their JAVA_TOOL_OPTIONS. This JVM read its own before it loaded us, so the
 * launcher hands the value over in FARMEM_CHILD_JAVA_TOOL_OPTIONS rather than
 * make this JVM load the agent twice (and print HotSpot's "Picked up" line).
 * Set now, before any Java code has read the environment (ProcessBuilder's
 * copy of it is taken at its first use).
 */
static void hand_agent_to_children(void)
{
	const char *o = getenv("FARMEM_CHILD_JAVA_TOOL_OPTIONS");

	if (!o)
		return;
	setenv("JAVA_TOOL_OPTIONS", o, 1);
	unsetenv("FARMEM_CHILD_JAVA_TOOL_OPTIONS");
}

EXPORT jint JNICALL Agent_OnLoad(JavaVM *vm, char *options, void *reserved)
{
	char err[512], msg[600];
	uint64_t heap = 0;
	int rc;

	hand_agent_to_children();

	if (fm_agent_parse_options(options, &opts, err, sizeof(err))) {
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM does not start", err);
		say("error", msg);
		return JNI_ERR;
	}
	fm_swapva_export(&pager_ref); /* for a farmem JDK's -XX:+UseFarmemSwapVA */
	fm_gc_calls_export(&pager_ref); /* and its far-memory collector (gc_calls.h) */
	if (opts.detach) {
		say("error", "detach is for a running JVM (farmem detach PID); the JVM does not start");
		return JNI_ERR;
	}
	rc = fm_heap_check_jvm(&heap, err, sizeof(err));
	if (!rc)
		rc = fm_agent_settle_budget(&opts, heap, err, sizeof(err));
	/* A heap smaller than its budget is no error to a JVM a script started: it runs all local. */
	if (rc == -EINVAL || (rc == -E2BIG && !opts.onerror)) {
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM does not start", err);
		say("error", msg);
		return JNI_ERR;
	}
	if (!rc)
		rc = setup_jvmti(vm, 1, err, sizeof(err));
	if (!rc)
		rc = start_pager(&pending, err, sizeof(err));
	if (!rc && opts.heap_sizing && fm_heap_size_young(heap, opts.cfg.local_bytes, msg, sizeof(msg)) > 0)
		fm_notice("%s", msg);
	if (rc) {
		pending = NULL;
		if (!opts.onerror) {
			snprintf(msg, sizeof(msg), "%s; the JVM does not start (onerror=exit)", err);
			say("error", msg);
			return JNI_ERR;
		}
		/* Without farmem: the preload shim, if it is here, stands aside too. */
		shim_pages_here();
		snprintf(msg, sizeof(msg), "%s; the JVM runs without farmem (onerror=continue)", err);
		say("warning", msg);
	}
	return JNI_OK;
}

EXPORT jint JNICALL Agent_OnAttach(JavaVM *vm, char *options, void *reserved)
{
	struct fm_agent_opts o;
	struct fm_pager *p = NULL;
	char err[512], msg[600];
	uint64_t heap = 0;
	int rc;

	if (fm_agent_parse_options(options, &o, err, sizeof(err))) {
		snprintf(opts.msgfile, sizeof(opts.msgfile), "%s", o.msgfile);
		snprintf(msg, sizeof(msg), "bad agent option: %s; the JVM goes on without farmem", err);
		say("error", msg);
		return JNI_ERR;
	}
	fm_swapva_export(&pager_ref);
	fm_gc_calls_export(&pager_ref);
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
	rc = fm_heap_check_jvm(&heap, err, sizeof(err));
	if (!rc)
		rc = fm_agent_settle_budget(&opts, heap, err, sizeof(err));
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
