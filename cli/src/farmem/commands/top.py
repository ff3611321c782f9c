"""`farmem top`: live faults, residency and GC phases of every process under farmem.

In the manner of bcc's cachetop and bpftop: get_rows() collects (residency maps through the
code of `farmem stat`, plus farmem-trace's totals when eBPF is available) and draw() only draws.
A process is "under farmem" when it holds its own farmem-map memfd (pager or kswap mode).

Keys: q quit, < > sort column, r reverse, p pause, up/down select, Enter per-thread view of the
selected process (from farmem-trace), Esc/Enter back.
"""

import curses
import json
import sys
import time

from farmem import procmap, resmap
from farmem.errors import FarmemError

# (key, header, width, format): drives the header, the rows and the sort.
FIELDS = (
    ("pid", "PID", 7, "{:>7}"),
    ("comm", "COMM", 15, "{:<15.15}"),
    ("local_mb", "LOCAL_MB", 9, "{:>9.1f}"),
    ("remote_mb", "REMOTE_MB", 9, "{:>9.1f}"),
    ("uffd_fs", "UFFD/s", 8, "{:>8.0f}"),
    ("maj_fs", "MAJ/s", 7, "{:>7.0f}"),
    ("min_fs", "MIN/s", 8, "{:>8.0f}"),
    ("p50_us", "P50us", 7, "{:>7.1f}"),
    ("p99_us", "P99us", 7, "{:>7.1f}"),
    ("stall_pct", "STALL%", 6, "{:>6.1f}"),
    ("gc_share_pct", "GC%", 5, "{:>5.1f}"),
    ("evict_s", "EVICT/s", 8, "{:>8.0f}"),
    ("prefetch_hit_pct", "PFHIT%", 6, "{:>6.1f}"),
    ("swap_epoch", "EPOCH", 6, "{:>6}"),
    ("gc_phase", "GC", 7, "{:>7}"),
)
THREAD_FIELDS = (
    ("tid", "TID", 7, "{:>7}"),
    ("comm", "COMM", 16, "{:<16.16}"),
    ("kind", "KIND", 4, "{:>4}"),
    ("faults_s", "FAULTS/s", 9, "{:>9.0f}"),
    ("maj_fs", "MAJ/s", 7, "{:>7.0f}"),
    ("min_fs", "MIN/s", 8, "{:>8.0f}"),
    ("uffd_waits_s", "UWAIT/s", 8, "{:>8.0f}"),
    ("stall_pct", "STALL%", 6, "{:>6.1f}"),
    ("faults", "FAULTS", 10, "{:>10}"),
)
DEFAULT_SORT = "uffd_fs"


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _lat_sum_ns(hist) -> int:
    return sum(n * resmap.lat_bucket_floor(b) for b, n in enumerate(hist) if n)


class Sampler:
    """Two successive samples make the rates. Keeps the previous one per pid."""

    def __init__(self, tracer=None):
        self.tracer = tracer
        self.prev = {}       # pid -> (time, figures, lat_sum_ns, trace proc)
        self.prev_threads = {}

    def sample(self) -> dict:
        now = time.monotonic()
        rows, cur = [], {}
        tstats = self.tracer.latest() if self.tracer else None
        tprocs = {p["pid"]: p for p in (tstats or {}).get("procs", [])}
        for pid in procmap.farmem_pids():
            try:
                snap = procmap.read_map(pid)
            except FarmemError:
                continue
            if snap.hdr.pid != pid:   # farmem run holding its child's map
                continue
            fig = procmap.stat_figures(pid, snap)
            lat_sum = _lat_sum_ns(list(snap.hdr.stats.lat_hist))
            tp = tprocs.get(pid)
            cur[pid] = (now, fig, lat_sum, tp)
            rows.append(self._row(pid, fig, lat_sum, tp, self.prev.get(pid), now))
        self.prev = cur
        totals = {
            "time": time.strftime("%H:%M:%S"),
            "processes": len(rows),
            "local_mb": sum(r["local_mb"] for r in rows),
            "remote_mb": sum(r["remote_mb"] for r in rows),
            "faults_s": sum(r["uffd_fs"] + r["maj_fs"] for r in rows),
            "memd_mb_s": sum(r["memd_mb_s"] for r in rows),
            "ebpf": bool(self.tracer and tstats),
        }
        return {"totals": totals, "rows": rows}

    @staticmethod
    def _row(pid, fig, lat_sum, tp, prev, now) -> dict:
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
        gc_active = fig["gc_active"] or bool(tp and tp["gc"]["active"])
        if gc_active:
            row["gc_phase"] = "fullGC" if tp and tp["gc"]["full"] else "GC"
        if not prev:
            return row
        t0, f0, lat0, tp0 = prev
        dt = max(1e-3, now - t0)
        if not kswap:  # in kswap mode the map's "faults" are the major faults
            row["uffd_fs"] = (fig["faults"] - f0["faults"]) / dt
        row["evict_s"] = (fig["evictions"] - f0["evictions"]) / dt
        row["memd_mb_s"] = ((fig["remote_read_bytes"] + fig["remote_write_bytes"])
                            - (f0["remote_read_bytes"] + f0["remote_write_bytes"])) / dt / 2**20
        d_faults = fig["faults"] - f0["faults"]
        d_gc = fig["gc_faults"] - f0["gc_faults"]
        if tp and tp0:
            row["maj_fs"] = (tp["maj"] - tp0["maj"]) / dt
            row["min_fs"] = (tp["min"] - tp0["min"]) / dt
            row["stall_pct"] = 100.0 * (tp["fault_ns"] - tp0["fault_ns"]) / (dt * 1e9)
            d_pf = tp["pf_user"] - tp0["pf_user"]
            if d_pf:
                row["gc_share_pct"] = 100.0 * (tp["gc_faults"] - tp0["gc_faults"]) / d_pf
        else:
            if kswap:
                row["maj_fs"] = (fig["faults"] - f0["faults"]) / dt
            row["stall_pct"] = 100.0 * (lat_sum - lat0) / (dt * 1e9)
            if d_faults and not kswap:
                row["gc_share_pct"] = 100.0 * d_gc / d_faults
        return row

    def threads(self, pid: int) -> list:
        """Per-thread rows of pid from farmem-trace (empty without eBPF)."""
        if not self.tracer:
            return []
        tp = self.tracer.proc_stats(pid)
        if not tp:
            return []
        now = self.tracer.stats_time or time.monotonic()
        prev_t, prev = self.prev_threads.get(pid, (None, {}))
        rows, cur = [], {}
        for t in tp.get("threads", []):
            cur[t["tid"]] = t
            p = prev.get(t["tid"])
            dt = (now - prev_t) if prev_t and now > prev_t else None
            r = {"tid": t["tid"], "comm": t["comm"], "kind": "GC" if t["gc"] else "app",
                 "faults": t["pf_user"], "faults_s": 0.0, "maj_fs": 0.0, "min_fs": 0.0,
                 "uffd_waits_s": 0.0, "stall_pct": 0.0}
            if p and dt:
                r["faults_s"] = (t["pf_user"] - p["pf_user"]) / dt
                r["maj_fs"] = (t["maj"] - p["maj"]) / dt
                r["min_fs"] = (t["min"] - p["min"]) / dt
                r["uffd_waits_s"] = (t["uffd_waits"] - p["uffd_waits"]) / dt
                r["stall_pct"] = 100.0 * (t["fault_ns"] - p["fault_ns"]) / (dt * 1e9)
            rows.append(r)
        if now != prev_t:
            self.prev_threads[pid] = (now, cur)
        return rows


def sort_rows(rows, key, reverse):
    return sorted(rows, key=lambda r: (r.get(key) if r.get(key) is not None else 0), reverse=reverse)


def _fmt_row(fields, r) -> str:
    return " ".join(fmt.format(r[k]) for k, _h, _w, fmt in fields)


def _fmt_header(fields, sort_key, reverse) -> str:
    out = []
    for k, h, w, _f in fields:
        if k == sort_key:
            h = h + ("v" if reverse else "^")
        out.append(h.rjust(w) if k != "comm" else h.ljust(w))
    return " ".join(out)


def header_line(totals, interval, paused) -> str:
    return (f"farmem top  {totals['time']}  every {interval:g}s  eBPF {'on' if totals['ebpf'] else 'off'}"
            f"{'  [paused]' if paused else ''}   processes {totals['processes']}  local "
            f"{totals['local_mb']:.1f} MB  remote {totals['remote_mb']:.1f} MB  faults "
            f"{totals['faults_s']:.0f}/s  memd {totals['memd_mb_s']:.1f} MB/s")


# --- the curses view -----------------------------------------------------------------------------

def _loop(scr, sampler, interval):
    curses.curs_set(0)
    scr.nodelay(True)
    sort_idx = [k for k, *_ in FIELDS].index(DEFAULT_SORT)
    reverse, paused, selected, thread_view = True, False, 0, None
    data = sampler.sample()
    next_t = time.monotonic() + interval
    while True:
        if not paused and time.monotonic() >= next_t:
            data = sampler.sample()
            next_t = time.monotonic() + interval
        scr.erase()
        h, w = scr.getmaxyx()
        key = FIELDS[sort_idx][0]
        rows = sort_rows(data["rows"], key, reverse)
        selected = min(selected, max(0, len(rows) - 1))
        lines = [header_line(data["totals"], interval, paused)]
        if thread_view is None:
            lines.append("keys: q quit  < > sort  r reverse  p pause  up/down select  Enter threads")
            lines.append("")
            lines.append(_fmt_header(FIELDS, key, reverse))
            for i, r in enumerate(rows):
                lines.append(_fmt_row(FIELDS, r))
        else:
            tr = sort_rows(sampler.threads(thread_view), "faults_s", True)
            lines.append(f"threads of pid {thread_view}  (Enter or Esc: back; q quit)")
            lines.append("" if sampler.tracer else "per-thread figures need eBPF (farmem-trace)")
            lines.append(_fmt_header(THREAD_FIELDS, "faults_s", True))
            lines += [_fmt_row(THREAD_FIELDS, r) for r in tr]
        for y, line in enumerate(lines[:h]):
            attr = curses.A_REVERSE if (thread_view is None and y == 3) else 0
            if thread_view is None and rows and y == 4 + selected:
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
        if tracer.stats_time and tracer.stats_time > after:
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
                print(header_line(data["totals"], args.interval, False))
                print(_fmt_header(FIELDS, DEFAULT_SORT, True))
                for r in data["rows"]:
                    print(_fmt_row(FIELDS, r))
            return 0
        if not sys.stdout.isatty():
            raise FarmemError("farmem top needs a terminal; use --once [--json] for scripts")
        curses.wrapper(_loop, sampler, args.interval)
        return 0
    finally:
        if tracer:
            tracer.stop()
