// SPDX-License-Identifier: Apache-2.0
/*
 * A collector's fault on an object's header, taken in its loop over a
 * reference slots, brings the objects of the slots after it with it, in one
 * read (uffd/fault.c, referent_pages; uffd/prefetch.c,
 * fm_prefetch_referents), against a real memd, with ASan and UBSan.
 *
 * The heap here is a region registered as a Java heap whose "references"
 * are the test's own: a slot page holds the addresses of objects, one on
 * each of pages scattered over the region, most of them in memd. The fault
 * is taken by a load whose slot is in a register (rbx), as a collector's
 * loop keeps it; the pager asks referents (pager.h), which the JVM agent
 * answers from the heap (jvmti-agent/klass.c) and this test from its slots,
 * checking what the pager promises: the slot's page is held meanwhile.
 * Only a full GC's workers get the objects: not a program thread, not a
 * young pause's worker, not G1's concurrent marking, not with a slot that
 * refers to another object, and not past a slot that points out of the heap. A
 * handler thread (fault=thread) sees no registers: nothing. Every page is
 * read back and checked.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "page.h"
#include "pager.h"
#include "resmap.h"
#include "unit.h"
#include "unit_pager.h"

#define PG 4096ul
#define REGION (32ul << 20)
#define NPAGES (REGION / PG)
#define OBJ_AT 200ul     /* an object's header on its page */
#define SLOTS 200u       /* references on a slot page */
#define MAXREF 64u       /* referents read with one fault, at most (prefetch.h, MAX_REFERENTS) */

static uint8_t *heap;
static struct fm_resmap_hdr *map;
static int calls, unheld;
static atomic_int kind;       /* what the test thread is (pager.h: FM_GC_*), 0 a program thread */
static atomic_int full_gc;    /* a full GC is under way */
static atomic_long gc_tid;
static uint64_t outside;      /* an address out of the heap */

static int held(uintptr_t a)
{
	unsigned s = fm_pg_state(*unit_state_byte(map, (a - (uintptr_t)heap) / PG));

	return s == FM_PG_FILLING || s == FM_PG_UPDATING;
}

static int kind_is(pid_t tid)
{
	return tid == atomic_load(&gc_tid) ? atomic_load(&kind) : 0;
}

static int full_gc_now(void)
{
	return atomic_load(&full_gc);
}

/* The agent's referents for this test's slots: full addresses, 8 bytes each. */
static unsigned referents(uintptr_t addr, uintptr_t slot, uintptr_t end, uintptr_t *out, unsigned max)
{
	uintptr_t obj;
	unsigned n = 0;

	__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
	if (slot < (uintptr_t)heap || slot >= (uintptr_t)heap + REGION || (slot & 7))
		return 0;
	if (!held(slot) || !held(end - 1))
		__atomic_fetch_add(&unheld, 1, __ATOMIC_RELAXED);
	obj = *(const uintptr_t *)slot;
	if (!obj || addr < obj || addr - obj >= 16)
		return 0;
	for (slot += 8; slot + 8 <= end && n < max; slot += 8)
		if ((obj = *(const uintptr_t *)slot))
			out[n++] = obj;
	return n;
}

/* A collector's read of the klass word of the object slot refers to, with slot in rbx. */
static uint64_t read_through(const uintptr_t *slot)
{
	uint64_t v;
	const uint8_t *obj = (const uint8_t *)*slot + 8;

	__asm__ volatile("movq (%2), %0" : "=r"(v) : "b"(slot), "r"(obj) : "memory");
	return v;
}

#define FORGOTTEN 512ul /* the region's last pages, forgotten: room for what the cases bring */

static uint64_t target_page(unsigned c, unsigned k)
{
	/* Scattered, away from the slot pages and the forgotten pages, a band of pages for each case c. */
	return 64 + (uint64_t)c * 1000 + (uint64_t)k * 4;
}

static uint64_t stat_of(size_t off)
{
	return __atomic_load_n((const uint64_t *)((const uint8_t *)&map->stats + off), __ATOMIC_RELAXED);
}

#define STAT(f) stat_of(offsetof(struct fm_pager_stats, f))

/* How a case's read finds its slot: in rbx, in rbx but referring to another object, on the stack. */
enum { SLOT_IN_RBX, SLOT_OTHER, SLOT_ON_STACK };

/*
 * The klass word of the object slot refers to, read with slot's address
 * on the top of the stack and in no register (a called function saved the
 * caller's register there and took it: JDK 21's mark_and_push). Every
 * general register but the one read through is zeroed first.
 */
__attribute__((noinline)) static uint64_t read_through_stack(const uintptr_t *slot)
{
	uint64_t v;
	const uint8_t *obj = (const uint8_t *)*slot + 8;

	/* Below the red zone; the signal's frame goes on the alternate stack. */
	__asm__ volatile("sub $128, %%rsp\n\t"
			 "push %%rdi\n\t"
			 "xor %%edi, %%edi\n\t"
			 "xor %%ebx, %%ebx\n\t"
			 "xor %%ecx, %%ecx\n\t"
			 "xor %%edx, %%edx\n\t"
			 "xor %%esi, %%esi\n\t"
			 "xor %%r8d, %%r8d\n\t"
			 "xor %%r9d, %%r9d\n\t"
			 "xor %%r10d, %%r10d\n\t"
			 "xor %%r11d, %%r11d\n\t"
			 "xor %%r12d, %%r12d\n\t"
			 "xor %%r13d, %%r13d\n\t"
			 "xor %%r14d, %%r14d\n\t"
			 "xor %%r15d, %%r15d\n\t"
			 "movq (%%rax), %%rax\n\t"
			 "add $136, %%rsp"
			 : "=a"(v), "+D"(slot)
			 : "a"(obj)
			 : "rbx", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "memory");
	return v;
}

/*
 * Case c: slot page c laid out with SLOTS references (the one at stop, if
 * any, out of the heap), an object's header read through a slot (how) by a
 * thread of kind k (full: in a full GC): slot 0's, or slot 1's with the
 * slot on the stack. want: whether the objects of the slots after it come
 * with the fault. Returns pages read back wrong.
 */
static uint64_t one_case(unsigned c, int k, int full, int stop, int how, int want, int signal_mode)
{
	uintptr_t *slots = (uintptr_t *)(heap + (uint64_t)(c + 1) * PG);
	uint64_t remote_after = 0, reads0, faults0, bad = 0, expect;
	volatile uint64_t sink = 0;
	unsigned at = how == SLOT_ON_STACK ? 1 : 0, last = stop > 0 ? (unsigned)stop : at + MAXREF + 1;
	uintptr_t other = (uintptr_t)heap + target_page(c + 1, 0) * PG + OBJ_AT; /* no object the read touches */

	for (unsigned s = 0; s < SLOTS; s++)
		slots[s] = (uintptr_t)heap + target_page(c, s) * PG + OBJ_AT;
	if (stop > 0)
		slots[stop] = (uintptr_t)&outside;
	if (how == SLOT_OTHER)
		slots[0] = other;
	/* The referents' pages as they are now: those in memd come with the fault, if any do. */
	for (unsigned s = at + 1; s < last && s < SLOTS; s++)
		remote_after += fm_pg_state(*unit_state_byte(map, target_page(c, s))) == FM_PG_REMOTE;
	CHECK(fm_pg_state(*unit_state_byte(map, target_page(c, at))) == FM_PG_REMOTE);
	atomic_store(&kind, k);
	atomic_store(&full_gc, full);
	atomic_store(&gc_tid, (long)syscall(SYS_gettid));
	sink += slots[0] + slots[SLOTS - 1]; /* the slot page resident, referenced */
	reads0 = STAT(referent_reads);
	faults0 = STAT(faults);
	if (how == SLOT_OTHER) {
		const uintptr_t *first = slots;
		uint64_t v;
		const uint8_t *obj = heap + target_page(c, 0) * PG + OBJ_AT + 8;

		__asm__ volatile("movq (%2), %0" : "=r"(v) : "b"(first), "r"(obj) : "memory");
		sink += v;
	} else if (how == SLOT_ON_STACK) {
		sink += read_through_stack(slots + 1);
	} else {
		sink += read_through(slots);
	}
	expect = want && signal_mode ? remote_after : 0;
	fprintf(stderr, "test_pager_referents: case %u: %llu pages read with the fault (want %llu), %llu faults\n", c,
		(unsigned long long)(STAT(referent_reads) - reads0), (unsigned long long)expect,
		(unsigned long long)(STAT(faults) - faults0));
	CHECK(STAT(referent_reads) - reads0 == expect);
	CHECK(STAT(faults) - faults0 == 1);
	if (expect) {
		for (unsigned s = at + 1; s < last && s < SLOTS; s++)
			CHECK(fm_pg_is_resident(*unit_state_byte(map, target_page(c, s))));
		/* Read through each slot in turn: they are all here, no fault. */
		faults0 = STAT(faults);
		for (unsigned s = at + 1; s < last && s < SLOTS; s++)
			sink += read_through(slots + s);
		CHECK(STAT(faults) == faults0);
	}
	atomic_store(&gc_tid, 0);
	for (unsigned s = 0; s < SLOTS; s++)
		bad += slots[s] != (s == (unsigned)stop && stop > 0 ? (uintptr_t)&outside
				     : s == 0 && how == SLOT_OTHER ? other
				     : (uintptr_t)heap + target_page(c, s) * PG + OBJ_AT);
	(void)sink;
	return bad;
}

static void exercise(const char *sock, const char *fault)
{
	char addr[128];
	struct fm_pager *p;
	int signal_mode = !strcmp(fault, "signal");
	uint64_t bad = 0;

	snprintf(addr, sizeof(addr), "unix:%s", sock);
	unit_referents = referents;
	p = unit_pager_gc_ex(fault, addr, "4M",
			     (const char *const[]){ "transport", "shm", "prefetch", "8", "fault", fault, "fill_follow", "0",
						    "evict_threads", "0", NULL },
			     kind_is, full_gc_now);
	unit_referents = NULL;
	if (!p)
		return;
	map = (struct fm_resmap_hdr *)fm_pager_map(p);
	calls = unheld = 0;
	heap = unit_region(p, REGION, FM_REG_HEAP);
	if (!heap)
		goto out;
	for (uint64_t i = 0; i < NPAGES; i++)
		write_page(heap, i, 7);
	CHECK(fm_pager_forget(p, heap + (NPAGES - FORGOTTEN) * PG, FORGOTTEN * PG, MADV_DONTNEED) == 0);
	/* Slot pages 1-8; every case's targets in memd: the region was written past them since. */
	bad += one_case(0, FM_GC_PAUSE, 1, 0, SLOT_IN_RBX, 1, signal_mode);   /* a full GC's worker: MAXREF objects */
	bad += one_case(1, 0, 1, 0, SLOT_IN_RBX, 0, signal_mode);             /* a program thread */
	bad += one_case(2, FM_GC_PAUSE, 0, 0, SLOT_IN_RBX, 0, signal_mode);   /* a young pause's worker */
	bad += one_case(3, FM_GC_SCAN, 1, 0, SLOT_IN_RBX, 0, signal_mode);    /* G1's concurrent marking */
	bad += one_case(4, FM_GC_PAUSE, 1, 20, SLOT_IN_RBX, 1, signal_mode);  /* slot 20 points out of the heap */
	bad += one_case(5, FM_GC_PAUSE, 1, 0, SLOT_OTHER, 0, signal_mode);    /* slot 0 refers to another object */
	bad += one_case(6, FM_GC_PAUSE, 1, 0, SLOT_ON_STACK, 1, signal_mode); /* slot 1's address on the stack */
	CHECK(unheld == 0);
	CHECK(!signal_mode || calls > 0);
	for (uint64_t i = 64; i < NPAGES; i++)
		bad += !page_ok(heap, i, i < NPAGES - FORGOTTEN ? 7 : 0);
	unit_region_end(p, heap, REGION, bad);
out:
	fm_pager_stop(p);
}

int main(void)
{
	return unit_main("test_pager_referents", exercise);
}
