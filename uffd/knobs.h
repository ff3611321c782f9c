/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every knob of farmem, in one list. The pager parses its knobs from it
 * (config.c: fm_pager_cfg_set, fm_pager_cfg_from_env), the JVMTI agent its
 * options (jvmti-agent/options.c), and tools/gen_knobs.py, which make runs,
 * writes from it the farmem command's flags (cli/src/farmem/knob_table.py)
 * and the tables of docs/knobs.md and docs/jvm.md. tests/test_knobs.py fails
 * when any of them disagree with this list or with what the parsers do.
 *
 * Adding a knob is one X(...) entry below and the field that holds it
 * (struct fm_pager_cfg in pager.h, or struct fm_agent_opts in
 * jvmti-agent/options.h); `make` regenerates the rest.
 *
 * X(name, type, where, env, default, min, max, choices, scope, flag, metavar, help)
 *
 *   name     the agent option and the fm_pager_cfg_set key
 *   type     FM_KT_*: UINT and PCT (min..max; PCT takes a trailing '%'), BOOL (0 or 1), SIZE
 *            (bytes with k/m/g/t, at least min), LOCAL (SIZE of at least min, or 1%..100%),
 *            ENUM (one of choices, "a|b|c", kept as its index), STR, ADDRS (memd addresses,
 *            ',' or ';' between them), SECRET, PATH (a file name), FLAG (takes no value)
 *   where    CFG(field) of struct fm_pager_cfg, AGENT(field) of struct fm_agent_opts, or CLI
 *            (only the farmem command has it)
 *   env      the environment variable (the preload shim reads it; the agent too when the knob
 *            is one of its options, and the option wins), or NULL
 *   default  as a user writes it; "" when unset, and the help says what unset means
 *   scope    FM_KS_OPT: an agent option; FM_KS_RUN, FM_KS_ATTACH: a flag of `farmem run`,
 *            `farmem attach`
 *   flag     that flag, "--[no-]x" for a pair of flags, "" for none; metavar: its value
 */
#ifndef FARMEM_KNOBS_H
#define FARMEM_KNOBS_H

#include <stddef.h>
#include <stdint.h>

enum fm_knob_type {
	FM_KT_UINT, FM_KT_PCT, FM_KT_BOOL, FM_KT_SIZE, FM_KT_LOCAL, FM_KT_ENUM,
	FM_KT_STR, FM_KT_ADDRS, FM_KT_SECRET, FM_KT_PATH, FM_KT_FLAG,
};
enum fm_knob_where { FM_KW_CFG, FM_KW_AGENT, FM_KW_CLI };
#define FM_KS_OPT    1u
#define FM_KS_RUN    2u
#define FM_KS_ATTACH 4u

/* clang-format off */
#define FM_KNOBS(X) \
X(local, FM_KT_LOCAL, CFG(local_bytes), "FARMEM_LOCAL", "25%", 1 << 20, 0, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--local", "SIZE|PCT", \
  "local-memory budget: bytes, or a share of the paged memory (of the heap, -Xmx, for a JVM). The pager never holds more resident pages than this: it evicts before a fill at the limit") \
X(memd, FM_KT_ADDRS, CFG(memd), "FARMEM_MEMD", "", 0, 0, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--memd", "ADDR[,ADDR...]", \
  "memory servers, ',' between them (';' in an agent option). Unset, farmem run and attach start a private one on a Unix socket") \
X(replicas, FM_KT_UINT, CFG(replicas), "FARMEM_REPLICAS", "1", 1, 8, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--replicas", "R", \
  "with several memds: copies of every evicted page, placed by rendezvous hashing; a write returns once every copy is acknowledged and reads fail over (memd/client/multi.c)") \
X(memd_timeout_ms, FM_KT_UINT, CFG(memd_timeout_ms), "FARMEM_MEMD_TIMEOUT_MS", "", 10, 600000, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--memd-timeout", "MS", \
  "the deadline of every call to memd (connect, send and the whole reply; rdma: the completion), however memd behaves: silent, trickling, or stopped with its connections open. With several memds a request that misses it goes to another replica, and a server that keeps timing out is given up on unless it still answers now and then and holds a page's only copy; a read that no holder answers (one memd, or a page's last copy on a server silent for 3 s or 3 timeouts, whichever is longer) stops the program with status 70. Unset: 1000 with several memds, else 10000") \
X(memd_spin_us, FM_KT_UINT, CFG(memd_spin_us), "FARMEM_MEMD_SPIN_US", "50", 0, 10000, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--memd-spin", "US", \
  "a thread waiting for memd polls this long before it sleeps: over a socket (transport stream) for the reply, while replies come that fast (after a poll that runs out, the next 16 replies are slept on at once); over rdma for the completion. Where idle CPUs halt (farmem doctor's idle-polling line says whether they do here), sleeping costs a wakeup by IPI each round trip. memd's side of it is farmem memd --spin-us. 0: sleep at once") \
X(memd_copy, FM_KT_BOOL, CFG(memd_copy), "FARMEM_MEMD_COPY", "1", 0, 1, "", FM_KS_OPT, "", "", \
  "--gc swapva: memd copies a moved remote page to its new slot itself (COPY, docs/protocol.md); 0 reads it and writes it back through the pager") \
X(secret, FM_KT_SECRET, CFG(secret), "FARMEM_SECRET", "", 0, 0, "", FM_KS_OPT, "", "", \
  "memd's shared secret, 1 to 255 bytes (farmem run makes one for its private memd). An option shows in ps: prefer the variable or secret_file") \
X(secret_file, FM_KT_PATH, AGENT(secret_file), NULL, "", 0, 0, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--secret-file", "FILE", \
  "read memd's secret from FILE (a trailing newline is stripped)") \
X(transport, FM_KT_ENUM, CFG(xport_pref), "FARMEM_TRANSPORT", "auto", 0, 0, "auto|stream|shm", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--transport", "auto|stream|shm", \
  "shm: one-sided access to a same-host memd's store (a memfd passed after authentication); stream: a request and a reply per batch of pages; auto takes shm when memd offers it. With shm and memd in another memory cgroup, memd allocates the store's pages before the program writes them, so that memd's cgroup pays for them, as with stream (docs/compatibility.md)") \
X(fault, FM_KT_ENUM, CFG(fault_mode), "FARMEM_FAULT", "auto", 0, 0, "auto|signal|thread", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--fault", "auto|signal|thread", \
  "where a fault is served: signal, in the faulting thread's SIGBUS handler on its own CPU (UFFD_FEATURE_SIGBUS); thread, by handler threads while the faulting thread sleeps in the kernel (system calls on paged memory then wait for their pages; each fault is passed between two threads, see fill_spin_us). auto: signal, but thread for a program linked with liburing or libaio (docs/pager.md)") \
X(fill_threads, FM_KT_UINT, CFG(fill_threads), "FARMEM_FILL_THREADS", "2", 1, 16, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--fill-threads", "N", \
  "handler threads for the faults a thread sleeps for (every fault with fault=thread, glibc's heaps with fault=signal; UMap's UMAP_PAGE_FILLERS). The first serves alone; the others sleep until one read brings it several faults (threads queued behind it), then serve beside it until none has queued for 10 ms. 1: one handler") \
X(fill_spin_us, FM_KT_UINT, CFG(fill_spin_us), "FARMEM_FILL_SPIN_US", "50", 0, 10000, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--fill-spin", "US", \
  "fault=thread: a handler that served a fault reads on for US microseconds before it sleeps, yielding its CPU to any thread that wants it, so that the next fault need not wake it on another CPU (one cross-CPU wakeup per fault instead of two); two yields within 100 ms that each gave the CPU away for a slice stop it for 100 ms (a thread there that does not fault would hold a fault up a slice at a time). 0: sleep at once") \
X(fill_follow, FM_KT_BOOL, CFG(fill_follow), "FARMEM_FILL_FOLLOW", "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--[no-]fill-follow", "", \
  "the handler thread that serves faults the faulting thread sleeps for (glibc's heaps with fault=signal, every fault with fault=thread) moves to the CPU of the threads it serves, at idle priority, once it served a run of faults from one CPU: the fault then passes between two threads on one CPU, with no wakeup of an idle CPU (uffd/follow.h); a watch puts it back when it is starved there. 0: it stays where the scheduler puts it") \
X(evict_threads, FM_KT_ENUM, CFG(evict_threads), "FARMEM_EVICT_THREADS", "auto", 0, 0, "auto|0|1", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--evict-threads", "auto|0|1", \
  "1: an evictor thread keeps resident pages between the watermarks; 0: a thread that faults at the budget evicts a batch itself, on its own CPU (no cross-CPU TLB shootdowns). auto: 0, but 1 with fault=thread and fill_follow=0") \
X(evict_high, FM_KT_PCT, CFG(evict_high), "FARMEM_EVICT_HIGH", "95", 10, 100, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--evict-high", "PCT", \
  "resident share of the budget that wakes the evictor thread (UMap's high water mark); never while every registered page fits the budget (`--local 100%`)") \
X(evict_low, FM_KT_PCT, CFG(evict_low), "FARMEM_EVICT_LOW", "90", 5, 99, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--evict-low", "PCT", \
  "share of the budget the evictor evicts down to (low water mark); below evict_high") \
X(evict_batch, FM_KT_UINT, CFG(evict_batch), "FARMEM_EVICT_BATCH", "64", 1, 64, "", FM_KS_OPT, "", "", \
  "pages per eviction batch: one write to memd, one drop call, one TLB shootdown. A batch lives on the evicting thread's stack (in a SIGBUS handler with fault=signal)") \
X(evict_capture, FM_KT_BOOL, CFG(evict_capture), "FARMEM_EVICT_CAPTURE", "1", 0, 1, "", FM_KS_OPT, "", "", \
  "fault=signal: eviction takes dirty pages' bytes through a pipe (vmsplice) across their drop instead of write-protecting them first: one TLB shootdown per batch, not one per run of dirty pages (uffd/capture.h); 0 write-protects") \
X(evict_move, FM_KT_ENUM, CFG(evict_move), "FARMEM_EVICT_MOVE", "auto", 0, 0, "auto|0|1", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--evict-move", "auto|0|1", \
  "eviction moves dirty pages out of the program's page table (UFFDIO_MOVE) before it writes them to memd, and the kernel moves no page pinned for I/O in flight: an O_DIRECT read through libaio or io_uring writes its page by DMA after the submission, past the page table, and a page dropped meanwhile would lose those bytes. Such a page stays resident until the I/O is done. auto: 1 with fault=thread (no cover pins a system call's buffer there) and in a process linked with libaio or liburing, or that sets up native AIO or io_uring through syscall(); else 0: a move costs a TLB flush per run of victims where a capture costs one per batch (docs/pager.md)") \
X(prefetch, FM_KT_UINT, CFG(prefetch), "FARMEM_PREFETCH", "8", 0, 64, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--prefetch", "PAGES", \
  "pages fetched ahead of a sequential or strided run of one thread's faults; 0 turns prefetch off (UMap's UMAP_READ_AHEAD)") \
X(loop_evict, FM_KT_BOOL, CFG(loop_evict), "FARMEM_LOOP_EVICT", "1", 0, 1, "", FM_KS_OPT, "", "", \
  "a thread's run of faults on pages back soon after they left (a loop over more memory than the budget) hands what it went through to the evictor, which takes it first: what the loop finds resident when it comes round stays so, and each round reads back about what does not fit, where a clock reads back most of every round. Not in a JVM's heap, whose collector walks what the program went through") \
X(gc_window, FM_KT_UINT, CFG(gc_window), "FARMEM_GC_WINDOW", "64", 0, 64, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--gc-window", "PAGES", \
  "JVM: remote pages fetched ahead of a GC thread's sequential or strided run of faults, installed cold (they leave first unless written); none in a full GC whose moves memd does (gc_moves), where they were the bodies between the headers it reads; 0: GC threads fetch only the page they fault on") \
X(gc_writable, FM_KT_BOOL, CFG(gc_writable), "FARMEM_GC_WRITABLE", "1", 0, 1, "", FM_KS_OPT, "", "", \
  "JVM: a GC thread's read of a remote page installs it writable, booked dirty: a collector in a pause mostly writes what it reads soon after (a compaction moves objects onto pages it read), and a write-protect fault costs a TLB shootdown; the price is a write-back of pages it only read") \
X(epoch_pct, FM_KT_PCT, CFG(epoch_pct), "FARMEM_EPOCH_PCT", "5", 1, 100, "", FM_KS_OPT, "", "", \
  "pages filled plus evicted, as a share of all registered pages, that start a new swap epoch (MemLiner's N%)") \
X(gc_aware, FM_KT_BOOL, CFG(gc_aware), "FARMEM_GC_AWARE", "1", 0, 1, "", FM_KS_OPT, "", "", \
  "JVM: evict pages that only GC threads touched before the others") \
X(discard, FM_KT_BOOL, AGENT(discard), NULL, "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--[no-]discard", "", \
  "JVM: at the end of every GC pause, discard the collector's free space: its remote copies die; resident, it stays (a heap that fits its budget pays nothing) or, when the budget is pressed, becomes garbage that leaves first with no write-back, but for the ends of G1's free space, which it allocates in next (docs/jvm.md)") \
X(heap_sizing, FM_KT_BOOL, AGENT(heap_sizing), NULL, "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN, "--[no-]heap-sizing", "", \
  "JVM with G1 or Serial: hold the young generation to a quarter of the local budget unless the JVM sizes it itself: the agent sets MaxNewSize before the heap exists, in the java farmem run starts and in the JVMs a script or another JVM starts (docs/jvm.md)") \
X(gc_moves, FM_KT_BOOL, AGENT(gc_moves), NULL, "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--[no-]gc-moves", "", \
  "JVM with a stock collector: in a GC pause, libjvm's memmove of heap bytes (the full GCs' compaction of G1, Serial and Parallel) that touches pages memd holds is done where the pages lie, inside memd's store, instead of fetching the source and faulting in the destination; and G1's copy of a primitive array into an old region's pages that are not resident (libjvm's memcpy) writes them in memd's store (docs/jvm.md)") \
X(object_reads, FM_KT_BOOL, AGENT(object_reads), NULL, "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--[no-]object-reads", "", \
  "JVM: a program thread's fault on a heap page memd holds, where it reads an array's length or walks into the page from its array's header, brings the array's other pages in with it, in one read, rather than a fault or a run of faults each (jvmti-agent/klass.h, docs/jvm.md)") \
X(gc_referents, FM_KT_BOOL, AGENT(gc_referents), NULL, "1", 0, 1, "", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--[no-]gc-referents", "", \
  "JVM with a stock collector: a full GC worker's fault on the header of an object memd holds, taken while the collector follows references (its marking, its pointer adjustment), brings the objects of the references after that one with it, in one read, rather than a fault each (jvmti-agent/klass.h, docs/jvm.md)") \
X(threshold, FM_KT_SIZE, CFG(threshold), "FARMEM_THRESHOLD", "64M", 4096, 0, "", FM_KS_RUN, "--threshold", "SIZE", \
  "the preload shim pages private anonymous mappings (and malloc blocks) of at least this size, and glibc's malloc heaps once together they pass it; the agent pages the Java heap whatever its size") \
X(reservations, FM_KT_BOOL, CFG(reservations), "FARMEM_RESERVATIONS", "1", 0, 1, "", FM_KS_RUN, "--[no-]reservations", "", \
  "the preload shim also pages glibc's malloc heaps (the main thread's and the other threads', once together they pass the threshold), and address space the program reserved PROT_NONE (at least the threshold) as it makes parts of it writable, as regions whose faults the kernel waits for (a handler thread serves them, also with fault=signal): small blocks hold what system calls read, most of which no cover sees; needs a userfaultfd for kernel faults (root, /dev/userfaultfd), else they stay local (docs/compatibility.md)") \
X(log, FM_KT_ENUM, CFG(log_level), "FARMEM_LOG", "warn", 0, 0, "error|warn|info|debug", FM_KS_OPT | FM_KS_RUN | FM_KS_ATTACH, "--log", "LEVEL", \
  "what the pager prints to stderr") \
X(control, FM_KT_STR, CFG(control), "FARMEM_CONTROL", "", 0, 0, "", FM_KS_OPT, "", "", \
  "the launcher's socket, set by farmem run: each pager hands it its residency map, so the summary outlives the process") \
X(launch_uid, FM_KT_STR, CFG(launch_uid), "FARMEM_LAUNCH_UID", "", 0, 0, "", FM_KS_OPT, "", "", \
  "the user farmem run ran as, set by it. When that is root, a process that gave up root (a server's workers, memcached -u) still pages, through the run's sockets and control_key; otherwise a process of another user cannot reach the private memd and runs unpaged with a warning instead of stopping") \
X(control_key, FM_KT_STR, CFG(control_key), "FARMEM_CONTROL_KEY", "", 0, 0, "", FM_KS_OPT, "", "", \
  "a token farmem run (as root) sets: a process that gave up root shows it to the launcher's socket, which takes other users' pagers only with it") \
X(onerror, FM_KT_ENUM, AGENT(onerror), NULL, "exit", 0, 0, "exit|continue", FM_KS_OPT, "", "", \
  "a JVM farmem cannot serve, or a memd it cannot reach, at JVM start: exit (the JVM does not start) or continue without farmem. On attach the JVM always goes on untouched") \
X(msgfile, FM_KT_PATH, AGENT(msgfile), NULL, "", 0, 0, "", FM_KS_OPT, "", "", \
  "also write an error message to this file (farmem attach reads it)") \
X(detach, FM_KT_FLAG, AGENT(detach), NULL, "", 0, 0, "", FM_KS_OPT, "", "", \
  "attach only: bring every page home and stop the pager (farmem detach)")
/* clang-format on */

/*
 * What a field of each type holds (0: the type checks the field's size
 * itself), for a _Static_assert(FM_KNOB_FITS(type, sizeof field)) where the
 * list is expanded against a struct; a size of 0 is a knob stored elsewhere.
 */
#define FM_KT_BYTES_FM_KT_UINT 4
#define FM_KT_BYTES_FM_KT_PCT 4
#define FM_KT_BYTES_FM_KT_BOOL 4
#define FM_KT_BYTES_FM_KT_ENUM 4
#define FM_KT_BYTES_FM_KT_FLAG 4
#define FM_KT_BYTES_FM_KT_SIZE 8
#define FM_KT_BYTES_FM_KT_LOCAL 8
#define FM_KT_BYTES_FM_KT_STR 0
#define FM_KT_BYTES_FM_KT_ADDRS 0
#define FM_KT_BYTES_FM_KT_SECRET 0
#define FM_KT_BYTES_FM_KT_PATH 0
#define FM_KNOB_FITS(type, size) ((size) == 0 || FM_KT_BYTES_##type == 0 || (size) == FM_KT_BYTES_##type)

/* One knob, as the parsers see it: off/size locate its field in the struct of its where. */
struct fm_knob {
	const char *name;
	enum fm_knob_type type;
	enum fm_knob_where where;
	size_t off, size;
	const char *env, *def;
	uint64_t min, max;
	const char *choices;
	unsigned scope;
	const char *flag, *metavar, *help;
};

/*
 * To lay the list out over a struct, define CFG(f), AGENT(f) and CLI to give
 * (where, off, size) for it, then FM_KNOBS(FM_KNOB_ENTRY) fills an array of
 * struct fm_knob; with each defined as the field's size alone (0 when not in
 * that struct), FM_KNOBS(FM_KNOB_SIZE_CHECK) checks every field's size.
 */
#define FM_KNOB_ENTRY(name, type, where, env, def, min, max, choices, scope, flag, metavar, help) \
	{ #name, type, where, env, def, min, max, choices, scope, flag, metavar, help },
#define FM_KNOB_SIZE_CHECK(name, type, where, ...) _Static_assert(FM_KNOB_FITS(type, where), #name ": field size");

/*
 * The list with CFG offsets into struct fm_pager_cfg (the others' off is 0),
 * in FM_KNOBS order, and its length.
 */
extern const struct fm_knob fm_knobs[];
extern const size_t fm_nknobs;

const struct fm_knob *fm_knob_find(const char *name);

/*
 * Parse val as knob k and store it in the field at base + k->off (of k->size
 * bytes). For the types every struct can hold: UINT, PCT, BOOL, SIZE, ENUM,
 * STR, ADDRS, PATH. Returns 0, or -EINVAL with err naming the knob.
 */
int fm_knob_parse(const struct fm_knob *k, const char *val, void *base, char *err, size_t errlen);

#endif /* FARMEM_KNOBS_H */
