"""The kswap monitor: a residency map with the pager's layout (uffd/resmap.h) for a process
that Linux swap pages (`farmem run --mode kswap`, commands/run_kswap.py), so that `farmem stat`,
`farmem top` and the patched collector read the same thing in both modes:

- the map is a memfd named "farmem-map" that the process inherits (fd number in
  $FARMEM_RESMAP_FD), so `farmem stat PID` finds it in /proc/PID/fd as it finds the pager's;
- PAGEMAP_SCAN (PAGE_IS_PRESENT | PAGE_IS_SWAPPED) on /proc/PID/pagemap sets each page's byte:
  present -> dirty (resident; the kernel does not tell us whether swap holds a copy), swapped ->
  remote, neither -> untouched;
- a major fault seen by eBPF marks its page resident before the next scan (on_major);
- the swap epoch advances when pages that changed residency since the last advance exceed
  the epoch churn percentage of the registered pages (MemLiner's epoch).
"""

import ctypes
import logging
import mmap
import os
import threading
import time

from farmem import resmap

log = logging.getLogger("farmem.kswap")

DEFAULT_THRESHOLD = 64 << 20     # mappings of at least this size are tracked (the pager's default)
STATE_CAPACITY = 1 << 36         # bytes of page-state area in the memfd (sparse)

PAGE_SHIFT = 12
PAGE = 1 << PAGE_SHIFT

# <linux/fs.h> 6.7+ (Debian 12's UAPI headers are 6.1: defined here, as uffd/uffd_compat.h does)
PAGE_IS_PRESENT = 1 << 3
PAGE_IS_SWAPPED = 1 << 4
PM_SCAN_ARG_SIZE = 96
PAGEMAP_SCAN = (3 << 30) | (PM_SCAN_ARG_SIZE << 16) | (ord("f") << 8) | 16

RESIDENT_BYTE = resmap.PG_DIRTY
REMOTE_BYTE = resmap.PG_REMOTE | 0x08  # FM_PGF_HAS_REMOTE: swap holds it
_RESIDENT_CLASS = bytes(1 if resmap.PG_CLEAN <= (b & 7) <= resmap.PG_LEAVING else 0 for b in range(256))


# --- PAGEMAP_SCAN ------------------------------------------------------------------------------

class _PageRegion(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


class _PmScanArg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


assert ctypes.sizeof(_PmScanArg) == PM_SCAN_ARG_SIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)


def pagemap_scan(fd: int, start: int, end: int, vec_len: int = 4096):
    """Yield (start, end, categories) runs of pages in [start, end) that are present or swapped."""
    vec = (_PageRegion * vec_len)()
    arg = _PmScanArg(size=PM_SCAN_ARG_SIZE, start=start, end=end, vec=ctypes.addressof(vec),
                     vec_len=vec_len, category_anyof_mask=PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                     return_mask=PAGE_IS_PRESENT | PAGE_IS_SWAPPED)
    while arg.start < end:
        n = _libc.ioctl(fd, PAGEMAP_SCAN, ctypes.byref(arg))
        if n < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"PAGEMAP_SCAN: {os.strerror(e)}")
        for i in range(n):
            yield vec[i].start, vec[i].end, vec[i].categories
        if arg.walk_end <= arg.start:
            break
        arg.start = arg.walk_end


def anon_mappings(pid: int, threshold: int) -> list:
    """[(start, end)] of private anonymous read-write mappings of at least threshold bytes,
    adjacent ones merged (a growing JVM heap is several VMAs). The break's heap ([heap]) counts:
    the pager pages it (glibc's main heap, tcmalloc's), and a share of the rest alone gave Linux
    swap a budget that left it out (yrmcds: 70 MiB for 546 MiB, farmem 130 MiB)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5 or parts[1][:2] != "rw" or parts[1][3] != "p" or parts[4] != "0":
                continue
            if len(parts) == 6 and parts[5].strip() not in ("", "[heap]"):  # a file, [stack]...
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return [(lo, hi) for lo, hi in out if hi - lo >= threshold]


# --- the monitor -----------------------------------------------------------------------------

class KswapMonitor:
    """Owns the residency map of one process under Linux swap."""

    def __init__(self, epoch_churn_pct: int, threshold: int = DEFAULT_THRESHOLD):
        self.fd = os.memfd_create(resmap.MEMFD_NAME, 0)  # inherited by CMD: no CLOEXEC
        os.ftruncate(self.fd, resmap.MAP_OFFSET + STATE_CAPACITY)
        self.mm = mmap.mmap(self.fd, resmap.MAP_OFFSET + STATE_CAPACITY, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self.hdr = resmap.ResmapHdr.from_buffer(self.mm, 0)
        self.threshold = threshold
        self.lock = threading.Lock()
        self.pid = 0
        self.pagemap_fd = -1
        self.regions = []      # [(base, npages, map_offset, slot)]
        self.next_offset = resmap.MAP_OFFSET
        self.wake = threading.Event()
        h = self.hdr
        h.version = resmap.VERSION
        h.page_shift = PAGE_SHIFT
        h.hdr_size = resmap.MAP_OFFSET
        h.start_time_ns = time.time_ns()
        h.epoch_churn_pct = epoch_churn_pct
        h.transport = 0
        h.map_capacity = STATE_CAPACITY
        h.memd = b"kswap"
        h.magic = resmap.MAGIC  # last: a reader that sees it sees an initialised header

    def attach(self, pid: int) -> None:
        self.pid = pid
        self.hdr.pid = pid

    # regions -----------------------------------------------------------------------------
    def refresh_regions(self) -> None:
        try:
            maps = anon_mappings(self.pid, self.threshold)
        except OSError:
            return
        h = self.hdr
        for lo, hi in maps:
            npages = (hi - lo) >> PAGE_SHIFT
            if any(r[0] == lo and r[1] == npages for r in self.regions):
                continue
            # a new mapping, or one that grew: a new slot; retire the slots it covers
            for r in [r for r in self.regions if r[0] < hi and lo < r[0] + (r[1] << PAGE_SHIFT)]:
                h.slot(r[3]).flags = 0
                self.regions.remove(r)
            if self.next_offset + npages > resmap.MAP_OFFSET + STATE_CAPACITY:
                log.warning("residency map full: mapping %#x-%#x not tracked", lo, hi)
                continue
            slot = next((i for i in range(resmap.SLOTS) if not h.slot(i).flags), None)
            if slot is None:
                log.warning("more than %d mappings: %#x-%#x not tracked", resmap.SLOTS, lo, hi)
                continue
            r = h.slot(slot)
            r.base, r.npages, r.map_offset, r.space_id = lo, npages, self.next_offset, 0
            r.flags = resmap.REGION_F_LIVE
            h.nregions = max(h.nregions, slot + 1)
            self.regions.append((lo, npages, self.next_offset, slot))
            self.next_offset += npages
            h.map_used = self.next_offset - resmap.MAP_OFFSET
        h.stats.registered_pages = sum(r[1] for r in self.regions)

    # scanning ------------------------------------------------------------------------------
    def scan(self) -> int:
        """PAGEMAP_SCAN every region; rewrite its bytes; returns the pages whose residency changed."""
        churn = resident = remote = 0
        # Opened afresh each time: a pagemap fd stays bound to the mm it was opened on, and CMD
        # starts as the cgroup wrapper shell, then execs.
        try:
            self.pagemap_fd = os.open(f"/proc/{self.pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            return self._scan()
        finally:
            os.close(self.pagemap_fd)
            self.pagemap_fd = -1

    def _scan(self) -> int:
        churn = resident = remote = 0
        for base, npages, off, _slot in list(self.regions):
            new = bytearray(npages)
            try:
                for lo, hi, cat in pagemap_scan(self.pagemap_fd, base, base + (npages << PAGE_SHIFT)):
                    a, b = (lo - base) >> PAGE_SHIFT, (hi - base) >> PAGE_SHIFT
                    byte = RESIDENT_BYTE if cat & PAGE_IS_PRESENT else REMOTE_BYTE
                    new[a:b] = bytes([byte]) * (b - a)
            except OSError as e:
                log.debug("pagemap scan of %#x: %s", base, e)
                continue
            with self.lock:
                old = self.mm[off:off + npages]
                was = int.from_bytes(old.translate(_RESIDENT_CLASS), "little")
                now = int.from_bytes(bytes(new).translate(_RESIDENT_CLASS), "little")
                changed = was ^ now
                went_in = (changed & now).bit_count()
                went_out = (changed & was).bit_count()
                self.mm[off:off + npages] = bytes(new)
            st = self.hdr.stats
            st.evictions_dirty += went_out
            st.remote_writes += went_out
            st.remote_write_bytes += went_out << PAGE_SHIFT
            churn += went_in + went_out
            r_count = bytes(new).count(RESIDENT_BYTE)
            resident += r_count
            remote += bytes(new).count(REMOTE_BYTE)
        st = self.hdr.stats
        st.resident_pages = resident
        st.peak_resident_pages = max(st.peak_resident_pages, resident)
        self.add_churn(churn)
        return churn

    def add_churn(self, pages: int) -> None:
        h = self.hdr
        h.churn_pages += pages
        total = h.stats.registered_pages
        if total and h.churn_pages * 100 >= h.epoch_churn_pct * total:
            h.swap_epoch += 1
            h.churn_pages = 0

    def on_major(self, addr: int) -> None:
        """A major fault (eBPF): the page is resident now, before the next scan sees it."""
        for base, npages, off, _slot in self.regions:
            if base <= addr < base + (npages << PAGE_SHIFT):
                i = off + ((addr - base) >> PAGE_SHIFT)
                with self.lock:
                    was = self.mm[i]
                    self.mm[i] = RESIDENT_BYTE
                st = self.hdr.stats
                st.remote_reads += 1
                st.remote_read_bytes += PAGE
                if not _RESIDENT_CLASS[was]:
                    st.resident_pages += 1
                    self.add_churn(1)
                return

    def update_counters(self, limit_bytes: int, trace_proc, budget: bool = True) -> None:
        """BUDGET false: LIMIT_BYTES is a stand-in until the paged mappings are seen (a percentage
        of them), not a budget the program ran under, so it is no one's highest."""
        st = self.hdr.stats
        st.local_limit_pages = limit_bytes >> PAGE_SHIFT
        if budget:
            st.peak_limit_pages = max(st.peak_limit_pages, st.local_limit_pages)
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            st.faults = int(fields[9])   # majflt: every swap-in the process waited for
            st.zero_fills = int(fields[7])  # minflt
        except (OSError, IndexError, ValueError):
            pass
        if trace_proc:
            st.gc_faults = trace_proc.get("gc_faults", 0)
            st.app_faults = trace_proc.get("app_faults", 0)
            gc = trace_proc.get("gc", {})
            self.hdr.gc_cycles = gc.get("ends", 0)
            self.hdr.gc_active = 1 if gc.get("active") else 0
            hist = [0] * resmap.LAT_BUCKETS
            for s, n in enumerate(trace_proc.get("lat_hist", [])):
                if n:
                    hist[resmap.lat_bucket(3 << s >> 1)] += n
            for b in range(resmap.LAT_BUCKETS):
                st.lat_hist[b] = hist[b]

    def close(self) -> None:
        if self.pagemap_fd >= 0:
            os.close(self.pagemap_fd)
            self.pagemap_fd = -1
        del self.hdr
        self.mm.close()
        os.close(self.fd)
