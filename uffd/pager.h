/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-process pager: userfaultfd fault handlers, an evictor and a
 * prefetcher that keep a process's registered memory within a local budget,
 * with the rest in memd. Used by the preload shim and the JVMTI agent.
 *
 * Knobs (DESIGN.md interface 4) keep UMap's names where users know them;
 * knobs.h lists them (names, variables, defaults, ranges), docs/knobs.md is
 * the table made from that list.
 */
#ifndef FARMEM_PAGER_H
#define FARMEM_PAGER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fm_pager;

/* fault: where a fault is served (monitor.h). */
enum fm_fault_mode { FM_FAULT_AUTO = 0, FM_FAULT_SIGNAL = 1, FM_FAULT_THREAD = 2 };

/* Each field but the last is a knob of knobs.h, which says what it means. */
struct fm_pager_cfg {
	char memd[256];          /* memd: addresses, ',' between them */
	char secret[256];        /* secret */
	size_t secret_len;
	uint64_t local_bytes;    /* local as bytes, or 0 when given as a percentage */
	unsigned local_pct;      /* local as a percentage of registered memory */
	unsigned fill_threads;
	unsigned fill_spin_us;
	int fill_follow;
	int fault_mode;          /* fault: enum fm_fault_mode (0 auto, 1 signal, 2 thread) */
	int evict_threads;       /* evict_threads: 0 auto (an evictor thread with fault=thread and no fill_follow only), 1 none, 2 one */
	unsigned evict_high;
	unsigned evict_low;
	unsigned evict_batch;
	int evict_capture;
	int evict_move;          /* evict_move: 0 auto (the shim decides), 1 off, 2 on */
	unsigned prefetch;
	unsigned gc_window;
	int gc_writable;
	int loop_evict;
	unsigned epoch_pct;
	uint64_t threshold;
	int reservations;        /* the shim pages PROT_NONE reservations as they are made writable */
	int xport_pref;          /* transport: enum fm_xport_pref */
	int gc_aware;
	int log_level;           /* log: enum fm_log_level */
	char control[256];
	char launch_uid[16];     /* the launcher's uid, "" when not started by farmem run */
	char control_key[80];    /* shown to the launcher by a process of another uid than its own */
	unsigned replicas;
	unsigned memd_timeout_ms;/* 0: unset, the pager picks by the number of memds */
	unsigned memd_spin_us;   /* memd's reply (stream) or completion (rdma) is polled for this long before sleeping */
	unsigned memd_copy;
	/*
	 * Called with the faulting thread's id (the agent sets it): 0 for the
	 * program's threads, FM_GC_PAUSE for a collector's pause workers,
	 * FM_GC_CONC for its concurrent threads (Shenandoah's, which evacuate),
	 * FM_GC_SCAN for concurrent threads that read the heap and write none
	 * of it (G1's marking, refinement and service threads): gc_writable's
	 * guess is not made for them.
	 */
	int (*is_gc_thread)(pid_t tid);
	/*
	 * 1 while a full GC whose object moves memd does is under way
	 * (jvmti-agent/gcmove.h); NULL: never. What such a collector reads
	 * itself is each live object's header, again in each phase: its GC
	 * threads fetch nothing ahead (prefetch.c: read-ahead brought in the
	 * bodies between the headers), and what they read is kept a pass of the
	 * clock instead of leaving first (fault.c).
	 */
	int (*full_gc_in_memd)(void);
	/*
	 * Called in a program thread's fault on a remote page of the heap, once
	 * it is filled, with the address it touched (exact under fault=signal):
	 * the end of the array that holds addr, if its header lies in
	 * [from, addr), else 0. from is the faulted page's start, or the page
	 * before's when the access is at the page's start and that page is
	 * resident (a loop walked in). The pager keeps [from, addr] mapped
	 * meanwhile (held: the faulted page, and the page before).
	 * The array's other remote pages are read with the fault's (prefetch.h,
	 * fm_prefetch_object). NULL: never (jvmti-agent/klass.h).
	 */
	uintptr_t (*object_end)(uintptr_t addr, uintptr_t from);
	/*
	 * Called in a fault of a full GC's workers (full_gc_in_memd says one is
	 * under way) on a remote page of the heap, once it is filled and held, with the
	 * address touched and a register's value, slot: whether slot holds a
	 * reference to the object whose header addr lies in (the collector's
	 * loop over an object's references is at slot); if so, the objects
	 * that the slots after it up to end (slot's page's end) refer to, up
	 * to max, in out. The pager keeps [slot, end) mapped meanwhile. Their
	 * remote pages are read with the fault's (prefetch.h,
	 * fm_prefetch_referents). NULL: never (jvmti-agent/klass.h).
	 */
	unsigned (*referents)(uintptr_t addr, uintptr_t slot, uintptr_t end, uintptr_t *out, unsigned max);
};

enum { FM_GC_PAUSE = 1, FM_GC_CONC = 2, FM_GC_SCAN = 3 };

/* Defaults, then FARMEM_* from the environment. Returns 0, or -EINVAL with err set. */
int fm_pager_cfg_from_env(struct fm_pager_cfg *cfg, char *err, size_t errlen);
void fm_pager_cfg_defaults(struct fm_pager_cfg *cfg);
/*
 * Apply the FARMEM_* variables that are set, of the knobs whose scope shares a
 * bit with scope (0: every knob that has a variable). -EINVAL naming the variable.
 */
int fm_pager_cfg_env(struct fm_pager_cfg *cfg, unsigned scope, char *err, size_t errlen);
/* Apply one knob by its name (knobs.h; case does not matter). -ENOENT if it is not a pager knob. */
int fm_pager_cfg_set(struct fm_pager_cfg *cfg, const char *key, const char *val, char *err, size_t errlen);

/* Connect to memd, create the residency map, start the threads. */
int fm_pager_start(const struct fm_pager_cfg *cfg, struct fm_pager **out, char *err, size_t errlen);
/* Bring every page back, stop the threads, unregister everything. */
int fm_pager_stop(struct fm_pager *p);

#define FM_REG_HEAP 2u  /* FM_REGION_F_HEAP */
#define FM_REG_SHMEM 4u /* FM_REGION_F_SHMEM: a MAP_SHARED mapping of a shmem file */
#define FM_REG_SPARSE 8u /* FM_REGION_F_SPARSE: a reserved range, paged as it is committed */
#define FM_REG_NO_SETTLE 16u /* pages present join the books, but the caller evicts down to the budget: fm_pager_settle */
#define FM_REG_KERNEL_WAITS 32u /* its faults are served by a handler thread, whatever the fault mode */

/*
 * Put [addr, addr+len) (page-aligned, anonymous private) under the pager.
 * Pages already present stay resident and count as dirty; if they are more
 * than the budget holds, the calling thread evicts down to the budget before
 * it returns (the stats' adopt_peak_pages and adopt_evictions say so).
 *
 * With FM_REG_SPARSE the range is address space reserved for memory that
 * comes and goes (a JVM heap that grows and shrinks): one region, nothing of
 * it paged (UNMANAGED) until fm_pager_commit puts parts of it under the
 * pager. fm_pager_unregister of a part lets that part go again.
 *
 * With FM_REG_SHMEM the range is a shared mapping of a tmpfs file or memfd
 * (a JVM heap made with -XX:AllocateHeapAt=/dev/shm), paged in minor-fault
 * mode: pages leave by punching them out of the file, come back by
 * UFFDIO_COPY, and a page still in the file but not mapped comes back by
 * UFFDIO_CONTINUE. Pages of the file that are not mapped and hold only zeros
 * (a preallocated file) are punched out at registration. -ENOTSUP when the
 * kernel lacks minor faults or write-protection for shmem.
 *
 * With FM_REG_KERNEL_WAITS a fault there, the kernel's own (a system call's
 * copy from the program) as well as the program's, sleeps until a handler
 * thread installs the page, also in fault=signal mode: memory that holds
 * what a program hands the kernel in small pieces (malloc heaps), which no
 * cover could make resident before each call. Such regions are registered
 * with a second userfaultfd, without UFFD_FEATURE_SIGBUS: open it first with
 * fm_pager_open_kernel_waits (-ENOTCONN otherwise).
 */
int fm_pager_register(struct fm_pager *p, void *addr, size_t len, uint32_t flags);
/*
 * Make FM_REG_KERNEL_WAITS registrations possible: with fault=signal, open
 * the second userfaultfd and start its handler thread (once; later calls
 * return at once). A negative errno and err when this process cannot have a
 * userfaultfd for faults taken inside system calls (not root, no access to
 * /dev/userfaultfd, vm.unprivileged_userfaultfd=0).
 */
int fm_pager_open_kernel_waits(struct fm_pager *p, char *err, size_t errlen);
/* Before any pager: 1 when fm_pager_open_kernel_waits can succeed in this process. */
int fm_pager_kernel_waits_possible(void);
/*
 * A process that may give up root before its heaps grow (memcached -u, a
 * server's workers) opens the userfaultfd of FM_REG_KERNEL_WAITS while it
 * still may: fm_pager_kernel_waits_reserve (an fd, or -errno), handed to
 * its pager later with fm_pager_kernel_waits_give, which owns it from then
 * on. The fd serves only this process's memory: a forked child closes it.
 */
int fm_pager_kernel_waits_reserve(void);
void fm_pager_kernel_waits_give(struct fm_pager *p, int fd);
/*
 * [addr, addr+len), inside a region registered FM_REG_SPARSE, is memory now
 * (anonymous private, read-write: the program committed it). Its pages that
 * are not paged yet are registered: present ones as resident (and evicted
 * down to the budget, as at registration), the others untouched. Pages
 * already paged are left as they are, so calling it again for a range costs
 * a look at its state bytes. Returns the pages it put under the pager, or
 * -ENOENT (no sparse region holds the range), -EINVAL, or the error of
 * UFFDIO_REGISTER. Before the program replaces a paged part (mmap over it,
 * munmap), fm_pager_unregister it: a mapping replaced behind the pager's
 * back is only learnt of by an unmap event.
 */
long fm_pager_commit(struct fm_pager *p, void *addr, size_t len);
/*
 * Evict down to the budget what registrations with FM_REG_NO_SETTLE found
 * present, in the calling thread (a forked child's pager: its registrations
 * end the wait of the program's hooks, this does not).
 */
void fm_pager_settle(struct fm_pager *p);
/*
 * The program is about to unmap or remap [addr, addr+len): forget its
 * pages (local and remote) and unregister it. The caller then unmaps.
 */
int fm_pager_unregister(struct fm_pager *p, void *addr, size_t len);
/*
 * Make every page of the regions overlapping [addr, addr+len) resident and
 * keep them resident (the evictor skips them) until they are unregistered:
 * the preload shim calls it before it lets the kernel move the range.
 */
int fm_pager_fetch_all(struct fm_pager *p, void *addr, size_t len);
/*
 * The program drops [addr, addr+len) (MADV_DONTNEED and friends): the
 * pager forgets the pages' remote copies and makes madvise(addr, len,
 * advice) itself, every page of the range held across the call, so that
 * no fill or eviction takes one in between (ranges.c). 0, or -errno of the
 * call.
 */
int fm_pager_forget(struct fm_pager *p, void *addr, size_t len, int advice);
/*
 * Pages may be shared copy-on-write from now on (a fork, KSM): eviction
 * write-protects (capture.h), and in the regions there are now a refused
 * move is taken for sharing, not a pin (evict_move).
 */
void fm_pager_no_capture(struct fm_pager *p, const char *why);
/*
 * The kernel may pin pages for I/O from now on (why: what the program set
 * up): eviction moves dirty pages out where it can and keeps pinned ones
 * (evict_move, capture.h). 1 if it does.
 */
int fm_pager_move_out(struct fm_pager *p, const char *why);
/*
 * The program freed [addr, addr+len) but keeps it mapped (a collector's free
 * regions): its contents no longer matter, and read as garbage (not zeros)
 * until written. Remote copies die. Resident pages stay: when the budget is
 * pressed they become garbage, write-protected, that the evictor drops first
 * with no write-back; a write makes a page (and its run) live again. Without
 * pressure they stay as they are, so a heap that fits its budget pays
 * nothing. Call it only while no thread can use the range (the JVM calls it
 * inside a GC pause). Returns the pages affected.
 */
long fm_pager_discard(struct fm_pager *p, void *addr, size_t len);
/*
 * The same for free space the program writes again in a moment (G1's next
 * eden, the old regions its next pause fills): its dirty pages stay dirty
 * and writable even when the budget is pressed, the evictor is not pointed
 * at it, and the clock passes its dirty pages once more (evicted before
 * they are written again, their dead bytes would go to memd and back).
 * Protected, each run of them cost a write-protect fault and an unprotect
 * when written again, and the protection itself, in the pause
 * (bench/RESULTS.md, session 72).
 */
long fm_pager_discard_reused(struct fm_pager *p, void *addr, size_t len);
/*
 * Whether, since the last GC cycle's start, at least half of the program's
 * faults on pages memd held were on pages that had left shortly before:
 * the budget holds less than the program works on, and free space the
 * program writes again soon is still the cheapest room there is until it
 * does (its dirty pages are better made garbage, fm_pager_discard). 1 or 0.
 */
int fm_pager_short_of_room(struct fm_pager *p);

/*
 * A collector moves [src, src+len) to [dst, dst+len) (SwapVA compaction):
 * page-aligned, disjoint, dst inside one registered region, src inside one
 * or several end to end (the shim's mremap of a range grown in parts).
 * Afterwards dst holds src's bytes and src reads as zeros. Resident pages
 * move with UFFDIO_MOVE (no copy), remote pages stay remote (memd copies them to dst's
 * slot; when memd is full they come from memd straight to dst),
 * untouched ones stay untouched; dst's old contents are dropped. Call it only
 * while no other thread uses either range (a GC pause). Returns 0, -EINVAL
 * (misaligned, overlapping, unmanaged pages), -ENOENT (not registered) or
 * -EOPNOTSUPP (a shared-memory region, or one registered FM_REG_KERNEL_WAITS:
 * the caller copies). Nothing has moved when it fails. The preload shim also
 * moves with it: an mremap that grows a paged range.
 */
int fm_pager_move(struct fm_pager *p, void *dst, const void *src, size_t len);

/*
 * The program's mremap of paged memory, done by the kernel's mremap
 * (uffd/remap.c): [old, old+len) is whole regions end to end, private
 * anonymous, every page paged. With MREMAP_MAYMOVE it moves, grown to
 * new_len (>= len), to `at` (MREMAP_FIXED) or to a place of the pager's
 * choosing (with MREMAP_DONTUNMAP too, at the same size: the old range
 * stays paged, empty, with new memd spaces); without, it grows where it
 * is. Each region's books and memd space go with its pages: nothing is
 * read, written or copied. A growth takes up room its range's last region
 * has (its cap), or is a region of its own with room for more. Resident
 * pages count as dirty afterwards (the move drops their write protection).
 * Returns 0 with the new address in *out, or, with nothing changed:
 *   -EOPNOTSUPP  not a call for it (a shrink, other flags, a range that is
 *                not whole regions or is more than 32 of them, paged
 *                memory at the new place): the caller moves it another way;
 *   -ENOSPC      its books, memd or its own memory are full: the same;
 *   -errno       the kernel's refusal (-ENOMEM, also without asking the
 *                kernel when something is mapped in the way of a growth
 *                in place).
 */
int fm_pager_remap(struct fm_pager *p, void *old, size_t len, size_t new_len, int flags, void *at, void **out);

/*
 * A collector's object move: len bytes from src to dst, as memmove; then, with
 * set_first_word, the first word at dst becomes first_word (a moved object's
 * header gets its mark word back).
 */
struct fm_byte_move {
	uintptr_t src, dst;
	size_t len;
	uint64_t first_word;
	int set_first_word;
};
/*
 * Do the moves m[0..n), in order, where their pages lie (uffd/compact.c): a
 * resident page through the heap, a page only memd holds in memd's store,
 * never fetched (shm: a same-host memd's store is mapped here; stream: memd
 * does it, EDIT requests); a clean page it writes is unprotected by the call
 * (in runs, not by a fault each) and left dirty. Stops at the first move it
 * cannot do that way (a page another thread holds, memd full) and
 * returns how many it did; the caller does the next one itself, with faults
 * as usual, and may hand the rest back. Every page of one move lies in one
 * registered region, and no move reads bytes an earlier move of the call
 * writes (a compaction's destinations never reach a later source; over the
 * wire such a move only costs a request of its own). Call it only while no
 * other thread uses those pages (a GC pause). -EINVAL: an empty or wrapping
 * move; -EOPNOTSUPP: this transport cannot (rdma, several memds, a memd
 * that predates EDIT), nothing done.
 */
long fm_pager_move_bytes(struct fm_pager *p, const struct fm_byte_move *m, unsigned n);
/*
 * A collector is done with the whole pages of [addr, addr+len) for the rest
 * of its pause (a full GC's compaction wrote them and moves on to higher
 * addresses): when room is needed they leave before the clock's choice,
 * which would take pages the compaction has still to read.
 */
void fm_pager_passed(struct fm_pager *p, const void *addr, size_t len);
/*
 * Read len bytes at addr (inside one page) from wherever the page lies,
 * without bringing it here: a collector reads the header of an object it is
 * about to move that way. 0, -EBUSY (another thread holds the page: read it
 * as usual), -EOPNOTSUPP (as fm_pager_move_bytes) or -EINVAL.
 */
int fm_pager_read_words(struct fm_pager *p, const void *addr, void *out, size_t len);
/*
 * Write len bytes at addr (inside one page) where the page lies: a collector
 * stores a forwarding pointer in the header of an object on a page memd
 * holds, without bringing the page here. A resident page must be writable
 * (dirty). 0, -EBUSY (the page is busy, or clean: write it as usual),
 * -EOPNOTSUPP, -ENOSPC (memd full, for a page it does not hold yet) or -EINVAL.
 */
int fm_pager_write_words(struct fm_pager *p, void *addr, const void *data, size_t len);

/*
 * A system call is about to read (write=0) or write (write=1) the program's
 * [addr, addr+len). In fault=signal mode the kernel cannot wait for a page
 * there: make the range resident (and writable) and pin it until
 * fm_pager_io_end. Returns the pin to hand back (-1: nothing to hand
 * back). The agent calls it too, for the page a collector writes right
 * after a move memd did (jvmti-agent/gcmove.c): a fault's work without
 * its signal.
 * A call that still fails with EFAULT (the pin table was full) is retried by
 * the caller after another fm_pager_io_begin.
 */
int fm_pager_io_begin(struct fm_pager *p, const void *addr, size_t len, int write);
/*
 * fm_pager_io_begin's answer when the pin table had no room: the range was
 * made resident but not pinned, and may leave under the call, which may then
 * move less than it was asked for.
 */
#define FM_IO_UNPINNED (-2)
/* 1 when the pin table is nearly full: the next calls may get FM_IO_UNPINNED. */
int fm_pager_pins_scarce(struct fm_pager *p);
/*
 * fm_pager_io_begin for a read from fd into [addr, addr+len). Besides, where
 * the kernel waits, a buffer shaped for O_DIRECT (512-byte aligned) read from
 * an fd opened O_DIRECT is pinned only: the device writes it past the page
 * table.
 */
int fm_pager_read_begin(struct fm_pager *p, void *addr, size_t len, int fd);
/*
 * Pin [addr, addr+len) where it is paged, resident or not, for a write the
 * kernel makes past the page table (DMA, another process's
 * process_vm_writev): eviction leaves it alone until fm_pager_io_end, and
 * pages a batch had chosen before are gone first. -1 when it is not paged.
 */
int fm_pager_pin_in_place(struct fm_pager *p, const void *addr, size_t len);
void fm_pager_io_end(struct fm_pager *p, int pin);
/*
 * 1 when a system call on [addr, addr+len) needs fm_pager_io_begin: faults
 * served in the faulting thread, and the range paged, but not with
 * FM_REG_KERNEL_WAITS (where the kernel waits anyway).
 */
int fm_pager_io_needed(struct fm_pager *p, const void *addr, size_t len);
/*
 * 1 when faults are served by handler threads: the kernel waits for a page
 * that any system call touches, covered or not.
 */
int fm_pager_kernel_waits(const struct fm_pager *p);
/* The caller made a system call again after EFAULT on paged memory (counted). */
void fm_pager_io_retried(struct fm_pager *p);

/* 1 if addr lies in a registered region. */
int fm_pager_owns(struct fm_pager *p, const void *addr, size_t len);
/*
 * The same without the region lock, for the shim's covers of glibc's locks
 * (preload_sync.c, through fm_pager_io_needed), which the pager's own lock
 * goes through: its answer may
 * be stale while a region comes or goes, and the pager's own memory is never
 * in one.
 */
int fm_pager_owns_nolock(struct fm_pager *p, const void *addr, size_t len);

/* GC cycle boundaries, from the agent. */
void fm_pager_gc_event(struct fm_pager *p, int start);
/*
 * What a pause that ended was, from the agent's reading of the JVM's counts
 * (jvmti-agent/gccounts.h): a full collection, or one that counted no
 * collection (G1's remark). Counted in the map (resmap.h, full_gcs and
 * remark_pauses) for the summary's hint on G1's concurrent marking.
 */
void fm_pager_gc_pause_was(struct fm_pager *p, int full_gc, int collected);
/*
 * A collector's pause begins (begin=1) or ends: until it ends only its
 * workers touch the heap, and a page in memd's store checked once is not
 * checked again (fm_xport_pause, transport.h). Pauses may nest.
 */
void fm_pager_pause(struct fm_pager *p, int begin);

/* The residency map memfd (for the launcher and for farmem stat). */
int fm_pager_map_fd(const struct fm_pager *p);
struct fm_resmap_hdr *fm_pager_map(const struct fm_pager *p);

#endif /* FARMEM_PAGER_H */
