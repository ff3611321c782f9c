"""`farmem trace PID --duration 10s --plot out.png [--csv out.csv]`: MemLiner's figure 2 for any run.

Every user page fault of PID (exceptions:page_fault_user, through build/bin/farmem-trace) is
one point: fault sequence number against virtual page index, coloured by the thread that took
it (GC or application, by thread name). Under it, the fault rate over time, with the GC phases
(HotSpot's gc__begin/gc__end USDT probes) shaded.

This module also holds Tracer, the one place that starts farmem-trace and reads its JSON lines;
`farmem top` and `farmem run --mode kswap` use it too.
"""

import csv
import json
import logging
import os
import re
import subprocess
import threading
import time

from farmem import paths
from farmem.errors import FarmemError, Unavailable

log = logging.getLogger("farmem.trace")

EXIT_NOBPF = 3  # farmem-trace: eBPF not permitted or not supported here


def trace_binary():
    return paths.build_dir() / "bin" / "farmem-trace"


def parse_duration(text: str) -> float:
    """'10s', '500ms', '2m', '10' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (examples: 10s, 500ms, 2m)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise ValueError(f"{text!r}: give a duration above zero")
    return value


class Tracer:
    """farmem-trace as a child process. JSON lines are read by a thread: `stats` keeps the
    latest totals line, `on_event` (if given) gets every event dict, `events` collects them
    when keep_events is set. Start failures raise Unavailable with farmem-trace's reason."""

    def __init__(self, pids=(), interval_ms=1000, events=(), duration_s=None, threads=True,
                 on_event=None, keep_events=False):
        self.argv = [str(trace_binary()), "-i", str(int(interval_ms))]
        for pid in pids:
            self.argv += ["-p", str(pid)]
        if events:
            self.argv += ["-e", ",".join(events)]
        if duration_s:
            self.argv += ["-d", str(max(1, int(round(duration_s))))]
        if not threads:
            self.argv.append("-T")
        self.on_event = on_event
        self.keep_events = keep_events
        self.events = []
        self.start_info = None
        self.stats = None
        self.stats_time = None
        self.proc = None
        self._reader = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.stderr = ""

    def start(self, timeout: float = 20.0) -> "Tracer":
        binary = trace_binary()
        if not binary.exists():
            raise Unavailable("eBPF tracing", f"{binary} is not built (run `make`)")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1 << 16)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_err, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(1)
                if self._ready.is_set():
                    break
                time.sleep(0.1)  # let the stderr reader catch the message
                msg = self.stderr.strip().splitlines()
                reason = msg[-1].removeprefix("farmem-trace: ") if msg else f"exit {self.proc.returncode}"
                raise Unavailable("eBPF tracing", reason)
            if time.monotonic() > deadline:
                self.stop()
                raise FarmemError(f"farmem-trace did not start within {timeout:.0f} s")
        return self

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr += line

    def _read(self):
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                log.debug("farmem-trace: unparsable line %r", line[:200])
                continue
            kind = d.get("type")
            if kind == "start":
                self.start_info = d
                self._ready.set()
            elif kind == "stats":
                with self._lock:
                    self.stats = d
                    self.stats_time = time.monotonic()
            elif kind == "end":
                continue
            else:
                if self.keep_events:
                    self.events.append(d)
                if self.on_event:
                    self.on_event(d)

    @property
    def features(self) -> dict:
        return (self.start_info or {}).get("features", {})

    def latest(self):
        with self._lock:
            return self.stats

    def proc_stats(self, pid: int):
        s = self.latest()
        if not s:
            return None
        for p in s.get("procs", []):
            if p["pid"] == pid:
                return p
        return None

    def wait(self, timeout=None) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: farmem-trace prints its final totals and exits 0
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader:
            self._reader.join(5)


def lat_percentile_us(hist, pct: float) -> float:
    """farmem-trace's log2 histogram (slot s = [2^s, 2^(s+1)) ns): the slot's midpoint, in µs."""
    total = sum(hist)
    if not total:
        return 0.0
    rank = max(1, -(-total * pct // 100))
    cum = 0
    for s, n in enumerate(hist):
        cum += n
        if cum >= rank:
            return round(1.5 * (1 << s) / 1000.0, 2)
    return 0.0


# --- farmem trace -------------------------------------------------------------------------------

def collect(pid: int, duration_s: float) -> dict:
    if not os.path.exists(f"/proc/{pid}"):
        raise FarmemError(f"no process with pid {pid}")
    regions = _paged_regions(pid)
    t = Tracer(pids=[pid], interval_ms=1000, events=("fault", "gc"), duration_s=duration_s,
               keep_events=True).start()
    try:
        rc = t.wait(duration_s + 30)
    except subprocess.TimeoutExpired:
        t.stop()
        rc = t.proc.returncode
    except KeyboardInterrupt:
        t.stop()
        rc = 0
    if rc not in (0, None):
        raise FarmemError(f"farmem-trace failed (exit {rc}): {t.stderr.strip()}")
    faults = [e for e in t.events if e["type"] == "fault"]
    gcs = [e for e in t.events if e["type"] in ("gc_begin", "gc_end")]
    return {"faults": faults, "gc": gcs, "stats": t.latest(), "features": t.features,
            "duration_s": duration_s, "regions": regions}


def _paged_regions(pid: int) -> list:
    """[(base, end)] of the process's paged regions (its residency map), or [] when it has none."""
    from farmem.commands import stat as statcmd
    try:
        snap = statcmd.read_map(pid)
    except FarmemError:
        return []
    return [(r["base"], r["base"] + r["bytes"]) for r in snap.regions]


def write_csv(path: str, faults: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seq", "t_s", "tid", "comm", "thread", "addr", "page", "write", "err"])
        for i, e in enumerate(faults):
            w.writerow([i, f"{e['t']:.6f}", e["tid"], e["comm"], "gc" if e["gc"] else "app",
                        hex(e["addr"]), e["addr"] >> 12, int(bool(e["err"] & 2)), e["err"]])


def gc_phases(gcs: list, end_t: float) -> list:
    """[(begin_s, end_s, full)] from gc_begin/gc_end events (an open phase ends at end_t)."""
    out, begin, full = [], None, False
    for e in sorted(gcs, key=lambda e: e["t"]):
        if e["type"] == "gc_begin":
            begin, full = e["t"], e.get("full", False)
        elif begin is not None:
            out.append((begin, e["t"], full))
            begin = None
    if begin is not None:
        out.append((begin, end_t, full))
    return out


def plot(path: str, pid: int, data: dict) -> dict:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FarmemError("--plot needs matplotlib (pip install matplotlib; it is a dependency "
                          "of the farmem package)") from None
    faults = data["faults"]
    regions = data.get("regions") or []
    if regions:  # the paged memory (the heap): faults on code, stacks and libraries are noise here
        faults = [e for e in faults if any(lo <= e["addr"] < hi for lo, hi in regions)]
    elif len(faults) > 100:  # no map: the bulk of the addresses, without the far outliers
        addrs = sorted(e["addr"] for e in faults)
        lo, hi = addrs[len(addrs) // 100], addrs[-len(addrs) // 100 - 1]
        faults = [e for e in faults if lo <= e["addr"] <= hi]
    end_t = max([data["duration_s"]] + [e["t"] for e in faults if e["t"] < 10 * data["duration_s"]])
    phases = gc_phases(data["gc"], end_t)
    # Page index relative to the lowest page touched: the heap of a JVM sits in one range, and
    # absolute indexes of 47-bit addresses make an unreadable axis.
    pages = [e["addr"] >> 12 for e in faults]
    base = min(pages) if pages else 0
    app = [(i, p - base) for i, (e, p) in enumerate(zip(faults, pages)) if not e["gc"]]
    gc = [(i, p - base) for i, (e, p) in enumerate(zip(faults, pages)) if e["gc"]]

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [3, 1]})
    for pts, colour, label in ((app, "tab:blue", "application threads"), (gc, "tab:red", "GC threads")):
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=3 if len(faults) > 20000 else 6,
                       c=colour, marker="s", linewidths=0, label=f"{label} ({len(pts)})", rasterized=True)
    # GC phases, as the fault sequence numbers they span
    times = [e["t"] for e in faults]
    import bisect
    for b, e, full in phases:
        lo, hi = bisect.bisect_left(times, b), bisect.bisect_right(times, e)
        if hi > lo:
            ax.axvspan(lo, hi, color="orange" if full else "gold", alpha=0.25, linewidth=0)
    ax.set_xlabel("fault sequence number")
    ax.set_ylabel(f"virtual page index (- {base:#x})")
    where = "in its paged regions" if regions else "(1st-99th percentile of addresses)"
    ax.set_title(f"page faults of pid {pid} {where}: {len(faults)} in {data['duration_s']:.0f} s, "
                 f"{len(phases)} GC phases (shaded)")
    if app or gc:
        ax.legend(loc="upper left", markerscale=8)

    bin_s = max(0.05, end_t / 200)
    nb = int(end_t / bin_s) + 1
    rate_app, rate_gc = [0] * nb, [0] * nb
    for e in faults:
        (rate_gc if e["gc"] else rate_app)[min(nb - 1, int(e["t"] / bin_s))] += 1
    xs = [i * bin_s for i in range(nb)]
    ax2.stackplot(xs, [r / bin_s for r in rate_app], [r / bin_s for r in rate_gc],
                  colors=["tab:blue", "tab:red"], labels=["application", "GC"], step="post")
    for b, e, full in phases:
        ax2.axvspan(b, e, color="orange" if full else "gold", alpha=0.3, linewidth=0)
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("faults/s")
    ax2.set_xlim(0, end_t)
    ax2.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"faults": len(faults), "app_faults": len(app), "gc_faults": len(gc),
            "gc_phases": len(phases)}


def cmd_trace(args) -> int:
    if not args.plot and not args.csv and not args.json:
        args.parser.error("give --plot FILE, --csv FILE or --json (what to do with the trace)")
    from farmem import doctor
    doctor.require("bpf-tracepoint")  # the same refusal as every command, pointing to `farmem doctor`
    data = collect(args.pid, args.duration)
    n_gc = sum(1 for e in data["faults"] if e["gc"])
    summary = {"pid": args.pid, "faults": len(data["faults"]),
               "gc_faults": n_gc, "app_faults": len(data["faults"]) - n_gc,
               "gc_phases": len(gc_phases(data["gc"], data["duration_s"])),
               "features": data["features"]}
    if args.csv:
        write_csv(args.csv, data["faults"])
    if args.plot:
        # the plot leaves far outliers out: its counts go under plotted_*, the totals stay
        shown = plot(args.plot, args.pid, data)
        summary.update({"plotted_faults": shown["faults"], "plotted_app_faults": shown["app_faults"],
                        "plotted_gc_faults": shown["gc_faults"], "gc_phases": shown["gc_phases"]})
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"farmem trace: pid {args.pid}: {summary['faults']} faults "
              f"({summary['gc_faults']} by GC threads), {summary['gc_phases']} GC phases"
              + (f"; plot {args.plot}" if args.plot else "") + (f"; csv {args.csv}" if args.csv else ""))
    return 0
