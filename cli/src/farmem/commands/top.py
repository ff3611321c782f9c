"""`farmem top`: live faults, residency and GC phases of every process under farmem.

In the manner of bcc's cachetop and bpftop: Sampler collects (residency maps through
farmem/procmap.py, plus farmem-trace's totals when eBPF is available) and the screen code only
draws. A process is "under farmem" when it holds its own farmem-map memfd (pager or kswap mode).

Every rate is over one sampling interval: the residency map's counters between two samples,
farmem-trace's between its two latest reports. Paused, nothing is sampled, so every view stands.

Keys: q quit, < > sort column, r reverse, p pause, up/down select, Enter per-thread view of the
selected process (from farmem-trace), Esc/Enter back.
"""

import curses
import json
import os
import sys
import time
from dataclasses import dataclass

from farmem import procmap, resmap
from farmem.errors import FarmemError

WIDE = 160  # from this many columns on, the wide layout: whole names, no legend


@dataclass(frozen=True)
class Col:
    key: str
    name: str       # wide header
    short: str      # narrow header (the legend spells it out)
    width: int      # wide
    narrow: int     # narrow
    kind: str       # "int", "f1" (one decimal), "text", "left" (text, left-aligned)


FIELDS = (
    Col("pid", "PID", "PID", 7, 7, "text"),
    Col("comm", "COMM", "COMM", 16, 6, "left"),
    Col("local_mb", "LOCAL_MB", "LOC", 9, 4, "f1"),
    Col("remote_mb", "REMOTE_MB", "REM", 9, 4, "f1"),
    Col("uffd_fs", "UFFD/s", "UF/s", 8, 4, "int"),
    Col("maj_fs", "MAJ/s", "MJ/s", 8, 4, "int"),
    Col("min_fs", "MIN/s", "MN/s", 8, 4, "int"),
    Col("p50_us", "P50us", "P50", 8, 4, "f1"),
    Col("p99_us", "P99us", "P99", 8, 4, "f1"),
    Col("stall_pct", "STALL%", "STL%", 7, 4, "f1"),
    Col("gc_share_pct", "GC%", "GC%", 6, 4, "f1"),
    Col("evict_s", "EVICT/s", "EV/s", 8, 4, "int"),
    Col("prefetch_hit_pct", "PFHIT%", "PF%", 7, 4, "f1"),
    Col("swap_epoch", "EPOCH", "EPO", 7, 4, "int"),
    Col("gc_phase", "GC", "GC", 7, 4, "text"),
)
THREAD_FIELDS = (
    Col("tid", "TID", "TID", 7, 7, "text"),
    Col("comm", "COMM", "COMM", 16, 15, "left"),
    Col("kind", "KIND", "KIND", 5, 4, "text"),
    Col("faults_s", "FAULTS/s", "FLT/s", 10, 6, "int"),
    Col("maj_fs", "MAJ/s", "MJ/s", 8, 5, "int"),
    Col("min_fs", "MIN/s", "MN/s", 8, 6, "int"),
    Col("uffd_waits_s", "UWAIT/s", "UW/s", 8, 6, "int"),
    Col("stall_pct", "STALL%", "STL%", 7, 5, "f1"),
    Col("faults", "FAULTS", "FAULTS", 11, 8, "int"),
)
DEFAULT_SORT = "uffd_fs"
# What the narrow layout's short headers stand for, and the line STALL% needs wherever it shows.
LEGEND = "LOC/REM MiB local/in memd  UF MJ MN faults/s  P50 P99 us  EV evicts/s  PF% hits"
STALL_LINE = {
    True: ("STALL% = seconds threads spent waiting in page faults per second, summed over threads: "
           "above 100 when several threads wait at once"),
    False: "STL%: time in faults per second, summed over threads (>100: several waiting)",
}
KEYS = "keys: q quit  < > sort  r reverse  p pause  up/down select  Enter threads"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _lat_sum_ns(hist) -> int:
    return sum(n * resmap.lat_bucket_floor(b) for b, n in enumerate(hist) if n)


def _per_s(now: dict, before: dict, key: str, dt: float) -> float:
    return max(0, now.get(key, 0) - before.get(key, 0)) / dt


class Sampler:
    """Two successive samples make the rates: the residency maps' between this sample and the
    last, farmem-trace's between its latest report and the one before it (each report is one
    interval of its own). Per-thread rows are made with each sample and kept, so a paused
    screen shows the same numbers."""

    def __init__(self, tracer=None):
        self.tracer = tracer
        self.prev = {}          # pid -> (time, figures, lat_sum_ns)
        self.trace_prev = None  # (report time, {pid: proc}) of the last report seen
        self.trace_rates = {}   # pid -> the rates of the last two reports
        self.thread_rows = {}   # pid -> per-thread rows of the last two reports

    def _take_trace(self) -> dict:
        """The tracer's processes by pid; computes their rates when a new report came in."""
        if not self.tracer:
            return {}
        stats, when = self.tracer.snapshot()
        if not stats:
            return {}
        procs = {p["pid"]: p for p in stats.get("procs", [])}
        if self.trace_prev is None or when > self.trace_prev[0]:
            if self.trace_prev is not None:
                dt = max(1e-3, when - self.trace_prev[0])
                before = self.trace_prev[1]
                self.trace_rates = {pid: self._proc_rates(p, before.get(pid), dt) for pid, p in procs.items()}
                self.thread_rows = {pid: self._threads(p, before.get(pid), dt) for pid, p in procs.items()}
            self.trace_prev = (when, procs)
        return procs

    @staticmethod
    def _proc_rates(p: dict, p0, dt: float) -> dict:
        if not p0:
            return {}
        d_pf = p["pf_user"] - p0["pf_user"]
        return {"maj_fs": _per_s(p, p0, "maj", dt), "min_fs": _per_s(p, p0, "min", dt),
                "stall_pct": 100.0 * _per_s(p, p0, "fault_ns", dt) / 1e9,
                "gc_share_pct": 100.0 * (p["gc_faults"] - p0["gc_faults"]) / d_pf if d_pf > 0 else 0.0}

    @staticmethod
    def _threads(p: dict, p0, dt: float) -> list:
        before = {t["tid"]: t for t in (p0 or {}).get("threads", [])}
        rows = []
        for t in p.get("threads", []):
            t0 = before.get(t["tid"], {})  # a thread born in the interval counts from zero
            rows.append({"tid": t["tid"], "comm": t["comm"], "kind": "GC" if t["gc"] else "app",
                         "faults": t["pf_user"], "faults_s": _per_s(t, t0, "pf_user", dt),
                         "maj_fs": _per_s(t, t0, "maj", dt), "min_fs": _per_s(t, t0, "min", dt),
                         "uffd_waits_s": _per_s(t, t0, "uffd_waits", dt),
                         "stall_pct": 100.0 * _per_s(t, t0, "fault_ns", dt) / 1e9})
        return rows

    def sample(self) -> dict:
        now = time.monotonic()
        rows, cur = [], {}
        tprocs = self._take_trace()
        for pid in procmap.farmem_pids():
            try:
                snap = procmap.read_map(pid)
            except FarmemError:
                continue
            if snap.hdr.pid != pid:   # farmem run holding its child's map
                continue
            fig = procmap.stat_figures(pid, snap)
            lat_sum = _lat_sum_ns(list(snap.hdr.stats.lat_hist))
            cur[pid] = (now, fig, lat_sum)
            rows.append(self._row(pid, fig, lat_sum, tprocs.get(pid), self.trace_rates.get(pid),
                                  self.prev.get(pid), now))
        self.prev = cur
        totals = {
            "time": time.strftime("%H:%M:%S"),
            "processes": len(rows),
            "local_mb": sum(r["local_mb"] for r in rows),
            "remote_mb": sum(r["remote_mb"] for r in rows),
            "faults_s": sum(r["uffd_fs"] + r["maj_fs"] for r in rows),
            "memd_mb_s": sum(r["memd_mb_s"] for r in rows),
            "ebpf": bool(self.tracer and self.trace_prev),
        }
        return {"totals": totals, "rows": rows}

    @staticmethod
    def _row(pid, fig, lat_sum, tp, rates, prev, now) -> dict:
        page = fig["page_size"]
        local = sum(r["resident"] for r in fig["regions"]) * page
        remote = sum(r["remote"] for r in fig["regions"]) * page
        row = {"pid": pid, "comm": _comm(pid), "local_mb": local / 2**20, "remote_mb": remote / 2**20,
               "uffd_fs": 0.0, "maj_fs": 0.0, "min_fs": 0.0,
               "p50_us": fig["fault_p50_us"], "p99_us": fig["fault_p99_us"],
               "stall_pct": 0.0, "gc_share_pct": 0.0, "evict_s": 0.0, "prefetch_hit_pct": 0.0,
               "swap_epoch": fig["swap_epoch"], "gc_phase": "-", "memd_mb_s": 0.0,
               "mode": "kswap" if fig["memd"] == "kswap" else "uffd",
               "faults": fig["faults"], "ebpf": tp is not None}
        kswap = row["mode"] == "kswap"
        if fig["prefetch_issued"]:
            row["prefetch_hit_pct"] = 100.0 * fig["prefetch_used"] / fig["prefetch_issued"]
        if fig["gc_active"] or bool(tp and tp["gc"]["active"]):
            row["gc_phase"] = "full" if tp and tp["gc"]["full"] else "GC"
        if rates:
            row.update(rates)
        if not prev:
            return row
        t0, f0, lat0 = prev
        dt = max(1e-3, now - t0)
        if not kswap:  # in kswap mode the map's "faults" are the major faults
            row["uffd_fs"] = _per_s(fig, f0, "faults", dt)
        row["evict_s"] = _per_s(fig, f0, "evictions", dt)
        row["memd_mb_s"] = (_per_s(fig, f0, "remote_read_bytes", dt) + _per_s(fig, f0, "remote_write_bytes", dt)) / 2**20
        if not tp:  # no eBPF: what the map says
            if kswap:
                row["maj_fs"] = _per_s(fig, f0, "faults", dt)
            row["stall_pct"] = 100.0 * max(0, lat_sum - lat0) / (dt * 1e9)
            d_faults = fig["faults"] - f0["faults"]
            if d_faults > 0 and not kswap:
                row["gc_share_pct"] = 100.0 * (fig["gc_faults"] - f0["gc_faults"]) / d_faults
        return row

    def threads(self, pid: int) -> list:
        """Per-thread rows of pid as of the last sample (empty without eBPF)."""
        return self.thread_rows.get(pid, [])


def sort_rows(rows, key, reverse):
    return sorted(rows, key=lambda r: (r.get(key) if r.get(key) is not None else 0), reverse=reverse)


# --- text: one layout for wide terminals, one that fits 80 columns -------------------------------

def compact(x, width: int, kind: str) -> str:
    """x in at most width characters: 12.3, 123, 1.2k, 12k, 1.2M, ..."""
    if kind in ("text", "left"):
        return str(x)
    x = float(x)
    if kind == "f1" and abs(x) < 10 ** (width - 2) and len(f"{x:.1f}") <= width:
        return f"{x:.1f}"
    if len(f"{x:.0f}") <= width:
        return f"{x:.0f}"
    for div, unit in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")):
        for text in (f"{x / div:.1f}{unit}", f"{x / div:.0f}{unit}"):
            if len(text) <= width:
                return text
    return "#" * width


def _cell(c: Col, value, wide: bool) -> str:
    w = c.width if wide else c.narrow
    if c.kind == "left":
        return f"{str(value)[:w]:<{w}}"
    if c.kind == "text":
        text = str(value)
    elif not wide:
        text = compact(value, w, c.kind)
    else:
        text = f"{float(value):.1f}" if c.kind == "f1" else f"{float(value):.0f}"
        if len(text) > w:
            text = compact(value, w, c.kind)
    return f"{text[:w]:>{w}}"


def fmt_row(fields, r, wide: bool) -> str:
    return " ".join(_cell(c, r[c.key], wide) for c in fields)


def fmt_header(fields, wide: bool) -> str:
    out = []
    for c in fields:
        w, name = (c.width, c.name) if wide else (c.narrow, c.short)
        out.append(f"{name:<{w}}" if c.kind == "left" else f"{name:>{w}}")
    return " ".join(out)


def col_name(fields, key: str, wide: bool) -> str:
    c = next(c for c in fields if c.key == key)
    return c.name if wide else c.short


def sort_line(fields, key: str, reverse: bool, wide: bool) -> str:
    return f"sorted by {col_name(fields, key, wide)}, {'largest' if reverse else 'smallest'} first"


def header_lines(totals, interval, paused, wide: bool) -> list:
    first = (f"farmem top  {totals['time']}  every {interval:g}s  eBPF {'on' if totals['ebpf'] else 'off'}"
             f"{'  [paused]' if paused else ''}")
    def n(x, kind="f1"):  # at most 6 characters
        return compact(x, 6, kind)
    second = (f"processes {totals['processes']}  local {n(totals['local_mb'])} MiB  remote "
              f"{n(totals['remote_mb'])} MiB  faults {n(totals['faults_s'], 'int')}/s")
    memd = f"memd {n(totals['memd_mb_s'])} MB/s"
    # Narrow: the totals with every figure at its widest are more than 80 columns on one line.
    return [f"{first}   {second}  {memd}"] if wide else [f"{first}  {memd}", second]


def screen_lines(data, sampler, interval, paused, sort_key, reverse, thread_view, width) -> list:
    """The whole screen as text, for a terminal of width columns: (line, highlight) pairs."""
    wide = width > WIDE - 1
    lines = [(line, None) for line in header_lines(data["totals"], interval, paused, wide)]
    if thread_view is None:
        lines.append((f"{KEYS}   {sort_line(FIELDS, sort_key, reverse, wide)}" if wide else KEYS, None))
        if not wide:
            lines.append((sort_line(FIELDS, sort_key, reverse, wide), None))
            lines.append((LEGEND, None))
        lines.append((STALL_LINE[wide], None))
        lines.append((fmt_header(FIELDS, wide), "header"))
        for r in sort_rows(data["rows"], sort_key, reverse):
            lines.append((fmt_row(FIELDS, r, wide), "row"))
    else:
        lines.append((f"threads of pid {thread_view}  (Enter or Esc: back; q quit)", None))
        lines.append(("per-thread figures need eBPF (farmem-trace)" if not sampler.tracer else
                      STALL_LINE[wide], None))
        lines.append((fmt_header(THREAD_FIELDS, wide), "header"))
        for r in sort_rows(sampler.threads(thread_view), "faults_s", True):
            lines.append((fmt_row(THREAD_FIELDS, r, wide), "row"))
    return lines


# --- the curses view -----------------------------------------------------------------------------

def _follow_resize(scr) -> None:
    """Take the terminal's size now: ncurses hears of a resize only through SIGWINCH, which a
    process can inherit ignored (then the screen would stay at its first size)."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return
    if scr.getmaxyx() != (size.lines, size.columns):
        curses.resizeterm(size.lines, size.columns)


def _loop(scr, sampler, interval):
    curses.curs_set(0)
    scr.nodelay(True)
    sort_idx = [c.key for c in FIELDS].index(DEFAULT_SORT)
    reverse, paused, selected, thread_view = True, False, 0, None
    data = sampler.sample()
    next_t = time.monotonic() + interval
    while True:
        if not paused and time.monotonic() >= next_t:
            data = sampler.sample()
            next_t = time.monotonic() + interval
        _follow_resize(scr)
        scr.erase()
        h, w = scr.getmaxyx()
        key = FIELDS[sort_idx].key
        rows = sort_rows(data["rows"], key, reverse)
        selected = min(selected, max(0, len(rows) - 1))
        lines = screen_lines(data, sampler, interval, paused, key, reverse, thread_view, w)
        first_row = next((y for y, (_l, kind) in enumerate(lines) if kind == "row"), len(lines))
        for y, (line, kind) in enumerate(lines[:h]):
            attr = curses.A_REVERSE if kind == "header" else 0
            if thread_view is None and rows and y == first_row + selected:
                attr = curses.A_BOLD
            try:
                scr.addnstr(y, 0, line, w - 1, attr)
            except curses.error:
                pass
        scr.refresh()
        ch = scr.getch()
        if ch == -1:
            time.sleep(0.05)
            continue
        if ch in (ord("q"), ord("Q")):
            return
        if ch == ord("<"):
            sort_idx = (sort_idx - 1) % len(FIELDS)
        elif ch == ord(">"):
            sort_idx = (sort_idx + 1) % len(FIELDS)
        elif ch == ord("r"):
            reverse = not reverse
        elif ch == ord("p"):
            paused = not paused
        elif ch == curses.KEY_UP:
            selected = max(0, selected - 1)
        elif ch == curses.KEY_DOWN:
            selected += 1
        elif ch in (curses.KEY_ENTER, 10, 13):
            if thread_view is not None:
                thread_view = None
            elif rows:
                thread_view = rows[selected]["pid"]
        elif ch == 27:
            thread_view = None


def add_parser(sub) -> None:
    p = sub.add_parser("top", help="live faults, residency and GC phases of farmem processes",
                       description="A curses view of every process under farmem (pager or kswap).",
                       epilog="keys: q quit, < > sort column, r reverse, p pause, up/down select, "
                              "Enter per-thread view")
    p.add_argument("interval", nargs="?", type=float, default=1.0,
                   help="seconds between updates (default 1)")
    p.add_argument("--once", action="store_true", help="one sample (over one interval), then exit")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.add_argument("--no-bpf", action="store_true", help="do not start farmem-trace")
    p.set_defaults(func=cmd_top, parser=p)


def _start_tracer(interval):
    from farmem.tracer import Tracer
    try:
        return Tracer(interval_ms=int(interval * 1000)).start()
    except FarmemError as e:
        print(f"farmem top: {e}; showing the residency maps only", file=sys.stderr)
        return None


def _wait_stats(tracer, after, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _stats, when = tracer.snapshot()
        if when and when > after:
            return
        time.sleep(0.02)


def cmd_top(args) -> int:
    if not 0.1 <= args.interval <= 3600:
        args.parser.error("interval: give 0.1 to 3600 seconds")
    if args.json and not args.once:
        args.parser.error("--json goes with --once")
    tracer = None if args.no_bpf else _start_tracer(args.interval)
    try:
        sampler = Sampler(tracer)
        if args.once:
            if tracer:
                _wait_stats(tracer, 0, args.interval + 5)
            sampler.sample()
            t0 = time.monotonic()
            time.sleep(args.interval)
            if tracer:
                _wait_stats(tracer, t0, args.interval + 5)
            data = sampler.sample()
            data["rows"] = sort_rows(data["rows"], DEFAULT_SORT, True)
            if args.json:
                for r in data["rows"]:
                    if tracer:
                        r["threads"] = sampler.threads(r["pid"])
                print(json.dumps(data, indent=1))
            else:
                for line, _kind in screen_lines(data, sampler, args.interval, False, DEFAULT_SORT, True, None,
                                                WIDE):
                    print(line)
            return 0
        if not sys.stdout.isatty():
            raise FarmemError("farmem top needs a terminal; use --once [--json] for scripts")
        # The terminal's own size, not $COLUMNS/$LINES: those go stale when a window is resized
        # and are often exported (ncurses would believe them over the terminal).
        curses.use_env(False)
        curses.wrapper(_loop, sampler, args.interval)
        return 0
    finally:
        if tracer:
            tracer.stop()
