"""`farmem run --mode kswap --local 25% -- CMD`: Linux swap under a memory cgroup instead of the pager.

CMD runs in a memory cgroup limited to the local budget, with swap (a zram device set up here
when the machine has none; bench/lib/swap.py does the setup and the teardown). This process is
the kswap monitor: it owns a residency map with the pager's layout (uffd/resmap.h) for CMD's
large anonymous mappings, so `farmem stat`, `farmem top` and the patched collector read the same
thing in both modes:

- the map is a memfd named "farmem-map" that CMD inherits (fd number in $FARMEM_RESMAP_FD), so
  `farmem stat PID` finds it in /proc/PID/fd as it finds the pager's;
- PAGEMAP_SCAN (PAGE_IS_PRESENT | PAGE_IS_SWAPPED) on /proc/PID/pagemap sets each page's byte:
  present -> dirty (resident; the kernel does not tell us whether swap holds a copy), swapped ->
  remote, neither -> untouched. It runs every --kswap-scan-ms and at once after a reclaim run;
- eBPF (farmem-trace) marks a page resident on its major fault, before the next scan, and
  wakes the scanner on reclaim; without eBPF the periodic scan does it all;
- the swap epoch advances when pages that changed residency since the last advance exceed
  --epoch-churn percent of the registered pages (MemLiner's epoch).

A percentage budget is a share of the paged memory, as with the pager: of -Xmx for a JVM, else
of the large anonymous mappings as they appear (the limit follows them), plus KSWAP_SLACK for
the rest of the process (code, libraries, JVM metadata), which the pager leaves unlimited.
"""

import ctypes
import errno
import importlib.util
import logging
import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time

from farmem import paths, resmap
from farmem.errors import FarmemError, Unavailable
from farmem.units import fmt_bytes, parse_bytes

log = logging.getLogger("farmem.kswap")

KSWAP_SLACK = 64 << 20           # budget for memory outside the paged mappings
DEFAULT_THRESHOLD = 64 << 20     # mappings of at least this size are tracked (the pager's default)
DEFAULT_SCAN_MS = 200
DEFAULT_EPOCH_CHURN = 10
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


def add_mode_args(p) -> None:
    """The kswap flags of `farmem run` (main.py's _add_run calls this)."""
    p.add_argument("--mode", choices=("uffd", "kswap"), default="uffd",
                   help="uffd: the farmem pager (default); kswap: Linux swap under a memory "
                        "cgroup limit, with the same residency map")
    p.add_argument("--epoch-churn", type=int, default=DEFAULT_EPOCH_CHURN, metavar="PCT",
                   help=f"kswap: advance the swap epoch when pages that changed residency exceed "
                        f"PCT%% of the paged pages (default {DEFAULT_EPOCH_CHURN})")
    p.add_argument("--kswap-scan-ms", type=int, default=DEFAULT_SCAN_MS, metavar="MS",
                   help=f"kswap: PAGEMAP_SCAN period (default {DEFAULT_SCAN_MS})")
    p.add_argument("--no-bpf", action="store_true",
                   help="kswap: do not start farmem-trace (pagemap scans only)")
    run_func, run_validate = p.get_default("func"), p.get_default("validate")

    def dispatch(args):
        return cmd_run_kswap(args) if args.mode == "kswap" else run_func(args)

    def validate(args, parser):
        run_validate(args, parser)
        if args.mode != "kswap":
            return
        if args.memd:
            parser.error("--mode kswap pages to Linux swap: --memd does not apply")
        if not 1 <= args.epoch_churn <= 100:
            parser.error("--epoch-churn: give 1 to 100")
        if not 10 <= args.kswap_scan_ms <= 60000:
            parser.error("--kswap-scan-ms: give 10 to 60000")

    p.set_defaults(func=dispatch, validate=validate)


def _swap_module():
    """bench/lib/swap.py: the zram + memory cgroup setup shared with the benchmarks."""
    path = paths.repo_root() / "bench" / "lib" / "swap.py"
    spec = importlib.util.spec_from_file_location("farmem_bench_swap", path)
    if spec is None or not path.exists():
        raise FarmemError(f"{path} is missing: kswap mode needs it")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("farmem_bench_swap", mod)
    spec.loader.exec_module(mod)
    return mod


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
    adjacent ones merged (a growing JVM heap is several VMAs)."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5 or parts[1][:2] != "rw" or parts[1][3] != "p" or parts[4] != "0":
                continue
            if len(parts) == 6 and parts[5].strip():  # a file, [heap], [stack]...
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
    return [(lo, hi) for lo, hi in out if hi - lo >= threshold]


def java_heap_bytes(cmd: list):
    """-Xmx of a java command line, or None."""
    if not cmd or os.path.basename(cmd[0]) != "java":
        return None
    for a in cmd[1:]:
        m = re.fullmatch(r"-Xmx([0-9]+[kKmMgGtT]?)", a)
        if m:
            return parse_bytes(m.group(1))
        if not a.startswith("-"):
            break
    return None


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
                h.regions[r[3]].flags = 0
                self.regions.remove(r)
            if self.next_offset + npages > resmap.MAP_OFFSET + STATE_CAPACITY:
                log.warning("residency map full: mapping %#x-%#x not tracked", lo, hi)
                continue
            slot = next((i for i in range(resmap.MAX_REGIONS) if not h.regions[i].flags), None)
            if slot is None:
                log.warning("more than %d mappings: %#x-%#x not tracked", resmap.MAX_REGIONS, lo, hi)
                continue
            r = h.regions[slot]
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

    def update_counters(self, limit_bytes: int, trace_proc) -> None:
        st = self.hdr.stats
        st.local_limit_pages = limit_bytes >> PAGE_SHIFT
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


def _set_limit(swapenv, limit: int) -> None:
    path = swapenv.cgroup_path
    name = "memory.limit_in_bytes" if swapenv.cgroup_version == 1 else "memory.max"
    with open(os.path.join(path, name), "w") as f:
        f.write(str(limit))


def _phys_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cmd_run_kswap(args) -> int:
    if os.geteuid() != 0:
        raise Unavailable("kswap mode", "it needs root (zram, swapon, memory cgroups)")
    from farmem import doctor
    doctor.require("cgroup-memory")
    if not doctor.run_check("swap").available:
        doctor.require("zram")  # no swap yet: farmem sets up zram, so it must exist
    swap = _swap_module()
    pct = int(args.local[:-1]) if args.local.endswith("%") else None
    heap = java_heap_bytes(args.cmd)
    if pct is None:
        limit = int(args.local)
    elif heap:
        limit = heap * pct // 100 + KSWAP_SLACK
    else:
        limit = _phys_bytes()  # lowered when the paged mappings appear
    threshold = args.threshold or DEFAULT_THRESHOLD
    mon = KswapMonitor(args.epoch_churn, threshold)
    tracer = None
    stop = threading.Event()
    t0 = time.monotonic()
    try:
        with swap.SwapEnv(max(limit, 8 << 20), zram_size=max(2 << 30, 4 * (heap or 0))) as env:
            log.info("kswap: cgroup %s, limit %s, swap %s", env.cgroup_path, fmt_bytes(limit),
                     env.zram_device or "existing")
            child_env = dict(os.environ, FARMEM_RESMAP_FD=str(mon.fd), FARMEM_MODE="kswap")
            wrapper = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
                       os.path.join(env.cgroup_path, "cgroup.procs")] + list(args.cmd)
            try:
                child = subprocess.Popen(wrapper, env=child_env, pass_fds=(mon.fd,))
            except OSError as e:
                raise FarmemError(f"cannot start {args.cmd[0]}: {e.strerror}") from None
            saved = {s: signal.signal(s, lambda signo, _f: child.send_signal(signo))
                     for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
            try:
                mon.attach(child.pid)
                if not args.no_bpf:
                    from farmem.commands.trace import Tracer

                    def on_event(e):
                        if e["type"] == "major":
                            mon.on_major(e["addr"])
                        elif e["type"] == "reclaim":
                            mon.wake.set()
                    try:
                        tracer = Tracer(pids=[child.pid], interval_ms=500, events=("major", "reclaim"),
                                        threads=False, on_event=on_event).start()
                    except FarmemError as e:
                        log.warning("kswap: no eBPF (%s): the map follows pagemap scans only", e)
                        tracer = None

                def monitor():
                    while not stop.is_set():
                        mon.refresh_regions()
                        if pct is not None and not heap and mon.regions:
                            paged = sum(r[1] for r in mon.regions) << PAGE_SHIFT
                            want = paged * pct // 100 + KSWAP_SLACK
                            if want != monitor.limit:
                                try:
                                    _set_limit(env, want)
                                    monitor.limit = want
                                except OSError as e:
                                    # v1 answers EBUSY while it cannot reclaim down to the new
                                    # limit yet: try again at the next scan
                                    (log.debug if e.errno == errno.EBUSY else log.warning)(
                                        "kswap: cannot set the cgroup limit to %s: %s", fmt_bytes(want), e)
                        mon.scan()
                        mon.update_counters(monitor.limit,
                                            tracer.proc_stats(child.pid) if tracer else None)
                        mon.wake.wait(args.kswap_scan_ms / 1000)
                        mon.wake.clear()
                monitor.limit = limit
                th = threading.Thread(target=monitor, daemon=True)
                th.start()
                status = child.wait()
                stop.set()
                mon.wake.set()
                th.join(10)
            finally:
                for s, h in saved.items():
                    signal.signal(s, h)
                if child.poll() is None:
                    child.kill()
                    child.wait()
                if tracer:
                    tracer.stop()
            elapsed = time.monotonic() - t0
            s = resmap.figures([mon.hdr])
            summary = {"mode": "kswap", "exit_status": status, "elapsed_s": round(elapsed, 3),
                       "swap_epoch": mon.hdr.swap_epoch, "cgroup_limit_bytes": monitor.limit,
                       "bpf": tracer is not None, **s}
    except swap.SwapSetupError as e:
        raise Unavailable("kswap mode", str(e)) from None
    finally:
        mon.close()
    status = summary["exit_status"]
    status = 128 - status if status < 0 else status
    print(f"farmem: kswap: {summary['faults']} major faults, {summary['evictions']} pages swapped out, "
          f"{summary['remote_reads']} swapped in (eBPF), swap epoch {summary['swap_epoch']}; limit "
          f"{fmt_bytes(summary['cgroup_limit_bytes'])}, peak resident {fmt_bytes(summary['peak_resident_bytes'])}"
          f"; exit status {status}, {elapsed:.2f} s", file=sys.stderr)
    if args.summary_json:
        from farmem.commands.run import write_json
        write_json(args.summary_json, summary)
    return status
