"""The residency map (uffd/resmap.h, DESIGN.md interface 2), read from outside the paged process.

The ctypes structures mirror the C header field for field; tests/test_cli.py checks their
sizes and offsets against the compiler's (tests/progs/fm_layout.c). Everything here reads a
snapshot: the pager keeps writing while we look, so figures may be a moment stale.
"""

import ctypes
import mmap
import os

MAGIC = 0x50414D52  # "RMAP"
VERSION = 3
MAX_REGIONS = 64           # slots in regions[], where readers of version 2 before the table grew look
MORE_REGIONS = 448         # the rest, in more_regions[] after the counters
SLOTS = MAX_REGIONS + MORE_REGIONS
MAP_OFFSET = 64 * 1024
LAT_BUCKETS = 256
MEMFD_NAME = "farmem-map"

# enum fm_page_state and the page-byte flags.
PG_UNTOUCHED, PG_FILLING, PG_CLEAN, PG_UPDATING, PG_DIRTY, PG_LEAVING, PG_REMOTE, PG_UNMANAGED = range(8)
PG_STATE_MASK = 0x07
PAGE_STATE_NAMES = ("untouched", "filling", "clean", "updating", "dirty", "leaving", "remote", "unmanaged")

REGION_F_LIVE, REGION_F_HEAP, REGION_F_SHMEM, REGION_F_SPARSE = 1, 2, 4, 8
TRANSPORTS = {0: "none", 1: "stream", 2: "shm", 3: "rdma"}

u32, u64 = ctypes.c_uint32, ctypes.c_uint64


class ResmapRegion(ctypes.Structure):
    _fields_ = [
        ("base", u64),
        ("npages", u64),
        ("map_offset", u64),
        ("flags", u32),
        ("space_id", u32),
    ]


# The counters of struct fm_pager_stats, in order, before lat_hist.
STAT_FIELDS = (
    "faults", "wp_faults", "zero_fills", "remote_reads", "remote_read_bytes", "remote_writes",
    "remote_write_bytes", "evictions_clean", "evictions_dirty", "discards", "prefetch_issued",
    "prefetch_used", "gc_faults", "app_faults", "resident_pages", "peak_resident_pages",
    "local_limit_pages", "registered_pages", "memd_full", "crc_errors", "transport_errors",
    "evict_batches", "evict_syscalls", "direct_evictions",
)
# After lat_hist (uffd/resmap.h): several memd servers (memd/client/multi.c).
MULTI_FIELDS = (
    "memd_failovers", "memd_timeouts", "memd_servers_lost", "memd_servers_live",
    "memd_rereplicated", "memd_degraded_writes",
)
# Then fm_pager_move (uffd/move.c): a farmem JDK's SwapVA compaction.
SWAPVA_FIELDS = (
    "swapva_calls", "swapva_pages_moved", "swapva_pages_fetched", "swapva_pages_untouched",
    "swapva_pages_copied", "swapva_pages_remote",
)
# Carved out of the rest: shared-memory regions (uffd/shmem.c).
SHMEM_FIELDS = ("minor_faults",)
# Then the fault path split of remote demand faults (issue 5; bench/progs/faultlat.c --split).
SPLIT_FIELDS = ("split_faults", "split_handler_ns", "split_transport_ns", "split_copy_ns")
# Then fm_pager_move's remote pages that memd copied itself (COPY; issue 7), and its COPY calls.
SWAPVA_COPY_FIELDS = ("swapva_remote_copied", "swapva_copy_calls")
# Of gc_faults, the zero fills (the rest were read from memd).
GC_FIELDS = ("gc_zero_fills",)
# The fault path (issue 16): the mode (1 in the faulting thread, 2 handler threads) and the
# system calls the shim covered.
FAULT_PATH_FIELDS = ("fault_mode", "io_prefaults", "io_retries")
# Discard (issue 18): free heap kept as garbage, dropped first, or written again.
GARBAGE_FIELDS = ("garbage_marked", "garbage_evicted", "garbage_reused")
# Registration (issue 20): the most resident pages right after an adoption of present pages (a JVM
# at attach), before the registering thread evicted down to the budget, and the pages it evicted.
ADOPT_FIELDS = ("adopt_peak_pages", "adopt_evictions")
# fork() (issue 19): children that got the paged ranges, pages brought home for them, children that did not.
FORK_FIELDS = ("forks", "fork_pages_fetched", "forks_without_paged")
# Eviction (issue 16): dirty pages whose bytes a pipe held across their drop (uffd/capture.h).
EVICT_FIELDS = ("evictions_captured",)
# The block after lat_hist is 32 words (uffd/resmap.h): these, then reserved.
TAIL_FIELDS = (MULTI_FIELDS + SWAPVA_FIELDS + SHMEM_FIELDS + SPLIT_FIELDS + SWAPVA_COPY_FIELDS + GC_FIELDS
               + FAULT_PATH_FIELDS + GARBAGE_FIELDS + ADOPT_FIELDS + FORK_FIELDS + EVICT_FIELDS)
# Version 2's second block of 32 words (the JVM at far memory, issue 18): the concurrent GC threads'
# share of gc_faults, a collector's object moves done in memd's store (uffd/compact.c), and the
# discarded free space whose memory memd keeps for reuse (a gauge) and gives back; of the captured
# evictions, those read straight into their slot in memd's store (shm); remote pages faulted back
# soon after they left (the clock keeps them longer); faults a handler thread served in the malloc
# heaps of a pager that serves the others in the faulting thread; the program's mremaps done by the
# kernel's mremap with the books going along (uffd/remap.c), their resident pages and the pages in memd
# that stayed in their slots; clean pages a collector's move wrote, unprotected by the move; clean
# pages opened with the one a pause worker's write faulted on; the fault handler moved beside a
# faulting thread at idle priority (uffd/follow.h), and put back by its watch, starved there.
JVM_FIELDS = ("gc_conc_faults", "compact_moves", "compact_bytes", "compact_pages", "compact_declined",
              "discard_kept", "discard_released", "evictions_in_place", "refaults_soon", "heap_faults",
              "remaps", "remap_pages_resident", "remap_pages_kept", "compact_opened", "wp_opened_ahead",
              "follows", "follow_stalls")
# After them, gauges: the highest budget in force (a percentage budget falls when the program unmaps).
BUDGET_FIELDS = ("peak_limit_pages",)
# Then counters again: ranges the pager could not take (its region table full, memd refusing the
# space), which stay local memory.
REFUSED_FIELDS = ("refused_ranges", "refused_bytes")
# Then: remote pages faulted back within three budgets of evictions after they left (refaults_soon is
# within one): the summary's estimate of what a larger budget would save.
REFAULT_FIELDS = ("refaults_3budgets",)
# Then a gauge: the most memory ever registered at once (registered_pages falls as the program unmaps).
REGISTERED_FIELDS = ("peak_registered_pages",)
# Then eviction by UFFDIO_MOVE (evict_move, uffd/capture.h): dirty pages moved out, and victims the
# kernel would not move because I/O in flight had them pinned (kept resident).
MOVE_FIELDS = ("evictions_moved", "evict_pinned")
# Then pins (uffd/pins.h: ranges a system call or futex wait is using, kept from eviction): a gauge
# of the most held at once, and pins the table had no room for.
PIN_FIELDS = ("peak_pins", "pins_refused")
# Then requests of other processes' process_vm_readv/writev this one lent its paged pages to (uffd/lend.h).
LEND_FIELDS = ("lend_requests",)
# Then a handler thread's read-on after a fault (fill_spin_us) cut short: a yield gave its CPU to
# another thread for a slice, so it sleeps in poll for a while after each fault (uffd/monitor.c); and
# faults served by a handler past the first on its uffd, called when faults queued behind it (fill_threads).
SPIN_FIELDS = ("spin_crowded", "helped_faults")
# Then pages chosen to leave because a thread's run going round more than the budget had passed them
# (loop_evict, uffd/evict.c).
LOOP_FIELDS = ("loop_evictions", "loop_back_run", "loop_back_random")
# Then pages booked over the budget: fills whose evictions found nothing to take, and pages adopted at a
# registration that its eviction could not bring under the budget. Then pages of an object a program
# thread's fault touched, read with that fault's page (the agent read the object's header: object_end).
OVER_FIELDS = ("over_budget_fills", "over_budget_adopted", "object_reads", "full_gcs", "remark_pauses",
               "referent_reads")


class PagerStats(ctypes.Structure):
    _fields_ = [(name, u64) for name in STAT_FIELDS] + [
        ("lat_hist", u64 * LAT_BUCKETS),
    ] + [(name, u64) for name in TAIL_FIELDS] + [
        ("reserved", u64 * (32 - len(TAIL_FIELDS))),
    ] + [(name, u64) for name in JVM_FIELDS + BUDGET_FIELDS + REFUSED_FIELDS + REFAULT_FIELDS + REGISTERED_FIELDS
         + MOVE_FIELDS + PIN_FIELDS + LEND_FIELDS + SPIN_FIELDS + LOOP_FIELDS] + [
        ("reserved2", u64 * (32 - len(JVM_FIELDS) - len(BUDGET_FIELDS) - len(REFUSED_FIELDS) - len(REFAULT_FIELDS)
                             - len(REGISTERED_FIELDS) - len(MOVE_FIELDS) - len(PIN_FIELDS) - len(LEND_FIELDS)
                             - len(SPIN_FIELDS) - len(LOOP_FIELDS))),
    ] + [(name, u64) for name in OVER_FIELDS] + [
        ("reserved3", u64 * (8 - len(OVER_FIELDS))),
    ]


class ResmapHdr(ctypes.Structure):
    _fields_ = [
        ("magic", u32),
        ("version", u32),
        ("page_shift", u32),
        ("hdr_size", u32),
        ("pid", u64),
        ("start_time_ns", u64),
        ("swap_epoch", u64),
        ("churn_pages", u64),
        ("gc_cycles", u64),
        ("gc_active", u32),
        ("epoch_churn_pct", u32),
        ("nregions", u32),
        ("transport", u32),
        ("map_capacity", u64),
        ("map_used", u64),
        ("memd", ctypes.c_char * 128),
        ("regions", ResmapRegion * MAX_REGIONS),
        ("stats", PagerStats),
        ("more_regions", ResmapRegion * MORE_REGIONS),
    ]

    def slot(self, i: int):
        """Slot i of the region table (uffd/resmap.h, fm_resmap_slot)."""
        return self.regions[i] if i < MAX_REGIONS else self.more_regions[i - MAX_REGIONS]


assert ctypes.sizeof(ResmapHdr) <= MAP_OFFSET


def layout() -> dict:
    """The sizes and offsets that tests/progs/fm_layout.c prints from the C header."""
    return {
        "sizeof_hdr": ctypes.sizeof(ResmapHdr),
        "offsetof_stats": ResmapHdr.stats.offset,
        "offsetof_regions": ResmapHdr.regions.offset,
        "offsetof_more_regions": ResmapHdr.more_regions.offset,
        "offsetof_swap_epoch": ResmapHdr.swap_epoch.offset,
        "offsetof_nregions": ResmapHdr.nregions.offset,
        "offsetof_lat_hist": PagerStats.lat_hist.offset,
        "offsetof_swapva_pages_remote": PagerStats.swapva_pages_remote.offset,
        "offsetof_swapva_remote_copied": PagerStats.swapva_remote_copied.offset,
        "offsetof_swapva_copy_calls": PagerStats.swapva_copy_calls.offset,
        "offsetof_fault_mode": PagerStats.fault_mode.offset,
        "offsetof_garbage_reused": PagerStats.garbage_reused.offset,
        "offsetof_adopt_evictions": PagerStats.adopt_evictions.offset,
        "offsetof_forks_without_paged": PagerStats.forks_without_paged.offset,
        "offsetof_evictions_captured": PagerStats.evictions_captured.offset,
        "offsetof_gc_conc_faults": PagerStats.gc_conc_faults.offset,
        "offsetof_discard_released": PagerStats.discard_released.offset,
        "offsetof_evictions_in_place": PagerStats.evictions_in_place.offset,
        "offsetof_refaults_soon": PagerStats.refaults_soon.offset,
        "offsetof_heap_faults": PagerStats.heap_faults.offset,
        "offsetof_peak_limit_pages": PagerStats.peak_limit_pages.offset,
        "offsetof_refused_bytes": PagerStats.refused_bytes.offset,
        "offsetof_refaults_3budgets": PagerStats.refaults_3budgets.offset,
        "offsetof_peak_registered_pages": PagerStats.peak_registered_pages.offset,
        "offsetof_evict_pinned": PagerStats.evict_pinned.offset,
        "offsetof_pins_refused": PagerStats.pins_refused.offset,
        "offsetof_lend_requests": PagerStats.lend_requests.offset,
        "offsetof_spin_crowded": PagerStats.spin_crowded.offset,
        "offsetof_helped_faults": PagerStats.helped_faults.offset,
        "offsetof_loop_evictions": PagerStats.loop_evictions.offset,
        "offsetof_loop_back_run": PagerStats.loop_back_run.offset,
        "offsetof_loop_back_random": PagerStats.loop_back_random.offset,
        "offsetof_over_budget_adopted": PagerStats.over_budget_adopted.offset,
        "offsetof_object_reads": PagerStats.object_reads.offset,
        "offsetof_remark_pauses": PagerStats.remark_pauses.offset,
        "offsetof_referent_reads": PagerStats.referent_reads.offset,
        "sizeof_region": ctypes.sizeof(ResmapRegion),
        "sizeof_stats": ctypes.sizeof(PagerStats),
    }


# --- latency histogram: a port of fm_lat_bucket() and fm_lat_bucket_floor() -----------------

def lat_bucket(ns: int) -> int:
    """Histogram bucket of a duration: 8 buckets per power of two of nanoseconds."""
    if ns < 8:
        return ns
    lg = ns.bit_length() - 1
    sub = (ns >> (lg - 3)) & 7
    b = (lg - 2) * 8 + sub
    return min(b, LAT_BUCKETS - 1)


def lat_bucket_floor(b: int) -> int:
    """Lower bound in ns of bucket b; the inverse of lat_bucket."""
    if b < 8:
        return b
    lg, sub = b // 8 + 2, b % 8
    return (8 + sub) << (lg - 3)


def percentile_us(hist, pct: int) -> float:
    """The floor of the bucket where the cumulative count reaches pct% of all samples, in µs."""
    total = sum(hist)
    if total == 0:
        return 0.0
    rank = max(1, -(-total * pct // 100))  # ceil without floats
    cum = 0
    for b, count in enumerate(hist):
        cum += count
        if cum >= rank:
            return round(lat_bucket_floor(b) / 1000.0, 2)
    raise AssertionError("unreachable: cumulative count never reached the total")


# --- reading a map ----------------------------------------------------------------------------

class ResmapError(ValueError):
    pass


class Snapshot:
    __slots__ = ("hdr", "regions")

    def __init__(self, hdr: ResmapHdr, regions: list):
        self.hdr = hdr
        self.regions = regions  # live regions with their page counts (read_fd(..., with_regions=True))


def read_fd(fd: int, with_regions: bool = False) -> Snapshot:
    """Map a residency-map memfd read-only; copy out its header and count its pages' states."""
    size = os.fstat(fd).st_size
    if size < ctypes.sizeof(ResmapHdr):
        raise ResmapError(f"the map is {size} bytes, smaller than its header "
                          f"({ctypes.sizeof(ResmapHdr)} bytes)")
    # The memfd is sized for the largest page-state area it may need (gigabytes, sparse):
    # touch only the header and the bytes of live regions.
    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
        hdr = ResmapHdr.from_buffer_copy(mm, 0)
        check_header(hdr)
        regs = _regions(hdr, mm, size) if with_regions else []
    return Snapshot(hdr, regs)


def check_header(hdr: ResmapHdr) -> None:
    if hdr.magic != MAGIC:
        raise ResmapError(f"bad magic {hdr.magic:#x} (a farmem residency map has {MAGIC:#x})")
    if hdr.version != VERSION:
        raise ResmapError(f"map version {hdr.version}; this farmem reads version {VERSION}")
    if not 12 <= hdr.page_shift <= 30:
        raise ResmapError(f"implausible page shift {hdr.page_shift}")


# --- figures ------------------------------------------------------------------------------------

# Counters summed over pagers, reported under their own names.
SUMMED = (
    "faults", "remote_reads", "remote_writes", "evictions_clean", "evictions_dirty", "zero_fills",
    "wp_faults", "prefetch_issued", "prefetch_used", "gc_faults", "app_faults", "memd_full",
    "crc_errors", "transport_errors", "remote_read_bytes", "remote_write_bytes", "discards",
    "evict_batches", "evict_syscalls", "direct_evictions",
    "memd_failovers", "memd_timeouts", "memd_servers_lost", "memd_servers_live",
    "memd_rereplicated", "memd_degraded_writes",
) + SWAPVA_FIELDS + SHMEM_FIELDS + SPLIT_FIELDS + SWAPVA_COPY_FIELDS + GC_FIELDS + FAULT_PATH_FIELDS[1:] \
    + GARBAGE_FIELDS + ("adopt_evictions",) + FORK_FIELDS + EVICT_FIELDS + JVM_FIELDS + REFUSED_FIELDS + REFAULT_FIELDS \
    + MOVE_FIELDS + ("pins_refused",) + LEND_FIELDS + SPIN_FIELDS + LOOP_FIELDS + OVER_FIELDS
FAULT_MODES = {1: "signal", 2: "thread"}
# Page gauges, reported in bytes. Summed over processes; a process that exec'd has a map for each of
# its images: the last one's gauges are the process's, and a peak is the highest of them.
PEAK_GAUGES = ("peak_resident_pages", "adopt_peak_pages", "peak_limit_pages", "peak_registered_pages")
GAUGES = {
    "local_limit_pages": "local_limit_bytes",
    "peak_limit_pages": "peak_limit_bytes",
    "peak_registered_pages": "peak_registered_bytes",
    "peak_resident_pages": "peak_resident_bytes",
    "resident_pages": "resident_bytes",
    "registered_pages": "registered_bytes",
    "adopt_peak_pages": "adopt_peak_bytes",
}


def figures(hdrs) -> dict:
    """The summary of `farmem run` and the body of `farmem stat`, summed over every header."""
    out = {key: 0 for key in SUMMED}
    out.update({key: 0 for key in GAUGES.values()})
    out["peak_pins"] = 0  # the most one process held at once
    hist = [0] * LAT_BUCKETS
    transport = "none"
    modes: set = set()
    latest: dict = {}  # pid: (start_time_ns, gauges) of its last image
    peaks: dict = {}
    for hdr in hdrs:
        st = hdr.stats
        for key in SUMMED:
            out[key] += getattr(st, key)
        out["peak_pins"] = max(out["peak_pins"], st.peak_pins)
        gauges = {field: getattr(st, field) << hdr.page_shift for field in GAUGES}
        peak = peaks.setdefault(hdr.pid, dict.fromkeys(PEAK_GAUGES, 0))
        for field in PEAK_GAUGES:
            peak[field] = max(peak[field], gauges[field])
        if hdr.pid not in latest or hdr.start_time_ns >= latest[hdr.pid][0]:
            latest[hdr.pid] = (hdr.start_time_ns, gauges)
        for b in range(LAT_BUCKETS):
            hist[b] += st.lat_hist[b]
        if transport == "none":
            transport = TRANSPORTS.get(hdr.transport, f"unknown-{hdr.transport}")
        mode = FAULT_MODES.get(st.fault_mode)
        if mode:
            modes.add(mode)
    for pid, (_, gauges) in latest.items():
        gauges.update(peaks[pid])
        for field, key in GAUGES.items():
            out[key] += gauges[field]
    out["evictions"] = out["evictions_clean"] + out["evictions_dirty"]
    out["fault_p50_us"] = percentile_us(hist, 50)
    out["fault_p99_us"] = percentile_us(hist, 99)
    out["transport"] = transport
    out["fault_mode"] = ",".join(sorted(modes)) or "none"
    out["processes"] = len(latest)
    return out


def adopt_note(s: dict) -> str:
    """What registration found over the budget (a JVM at attach: its heap as it was) and brought under
    it at once, for the summary and `farmem stat`; empty when it found nothing over the budget."""
    # Against the highest budget: a percentage budget that fell later was not what the adoption met.
    found = s.get("adopt_peak_bytes", 0)
    limit = max(s.get("local_limit_bytes", 0), s.get("peak_limit_bytes", 0))
    if not limit or found <= limit:
        return ""
    from farmem.units import fmt_bytes
    return (f"{fmt_bytes(found)} resident when registered, over the limit: {s.get('adopt_evictions', 0)} pages "
            f"evicted at once")


_STATE_TABLE = bytes(b & PG_STATE_MASK for b in range(256))
_CHUNK = 8 << 20


def page_counts(mm, start: int, npages: int, size: int) -> dict:
    """Count npages state bytes from offset start of the map by state (chunked: regions of
    terabytes have hundreds of megabytes of state bytes)."""
    counts = dict.fromkeys(PAGE_STATE_NAMES, 0)
    end = min(start + npages, size) if start >= MAP_OFFSET else start
    for off in range(start, end, _CHUNK):
        states = mm[off:min(off + _CHUNK, end)].translate(_STATE_TABLE)
        for i, name in enumerate(PAGE_STATE_NAMES):
            counts[name] += states.count(i)
    counts["resident"] = sum(counts[n] for n in ("clean", "updating", "dirty", "leaving"))
    counts["remote"] = counts["remote"] + counts["filling"]  # fm_pg_is_remote()
    counts["beyond_map"] = npages - max(0, end - start)  # past the end of the memfd: not counted
    return counts


def _regions(hdr: ResmapHdr, mm, size: int) -> list:
    out = []
    for i in range(min(hdr.nregions, SLOTS)):
        r = hdr.slot(i)
        if not r.flags & REGION_F_LIVE:
            continue
        kinds = [name for bit, name in ((REGION_F_HEAP, "heap"), (REGION_F_SHMEM, "shmem"), (REGION_F_SPARSE, "sparse"))
                 if r.flags & bit]
        entry = {"slot": i, "base": r.base, "npages": r.npages, "bytes": r.npages << hdr.page_shift,
                 "space_id": r.space_id, "flags": kinds}
        entry.update(page_counts(mm, r.map_offset, r.npages, size))
        out.append(entry)
    return out
