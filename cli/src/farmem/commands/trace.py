"""`farmem trace PID --duration 10s --plot out.png [--csv out.csv]`: MemLiner's figure 2 for any run.

Every user page fault of PID (exceptions:page_fault_user, through build/bin/farmem-trace) is
one point: fault sequence number against virtual page index, coloured by the thread that took
it (GC or application, by thread name). Under it, the fault rate over time, with the GC phases
(HotSpot's gc__begin/gc__end USDT probes) shaded.
"""

import csv
import json
import os
import re
import subprocess
import threading

from farmem import procmap
from farmem.errors import FarmemError
from farmem.tracer import Tracer


def parse_duration(text: str) -> float:
    """'10s', '500ms', '2m', '10' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (examples: 10s, 500ms, 2m)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise ValueError(f"{text!r}: give a duration above zero")
    return value


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
    try:
        snap = procmap.read_map(pid)
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


def _import_pyplot():
    """matplotlib.pyplot with the Agg backend, or a FarmemError. Its import takes seconds here:
    cmd_trace runs it in a thread while the trace records."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FarmemError("--plot needs matplotlib (pip install matplotlib; it is a dependency "
                          "of the farmem package)") from None
    return plt


def _import_quietly():
    try:
        _import_pyplot()
    except FarmemError:
        pass  # plot() imports again and says why


def y_label() -> str:
    return "page number (4 KiB pages), 0 = the lowest page faulted"


def plot(path: str, pid: int, data: dict) -> dict:
    plt = _import_pyplot()
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
    # Page numbers from the lowest page touched: the heap of a JVM sits in one range, and
    # absolute indexes of 47-bit addresses make an unreadable axis. The base is printed in full.
    pages = [e["addr"] >> 12 for e in faults]
    base = min(pages) if pages else 0
    app = [(i, p - base) for i, (e, p) in enumerate(zip(faults, pages)) if not e["gc"]]
    gc = [(i, p - base) for i, (e, p) in enumerate(zip(faults, pages)) if e["gc"]]

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [3, 1]})
    for pts, colour, label in ((app, "tab:blue", "application threads"), (gc, "tab:red", "GC threads")):
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=3 if len(faults) > 20000 else 6,
                       c=colour, marker="s", linewidths=0, label=f"{label} ({len(pts)})", rasterized=True)
    # GC phases, as the fault sequence numbers they span; one collection per kind, not a patch
    # per phase (a JVM under pressure has hundreds of pauses in a few seconds)
    times = [e["t"] for e in faults]
    import bisect
    for full, colour in ((False, "gold"), (True, "orange")):
        spans = [(lo, hi - lo) for lo, hi in ((bisect.bisect_left(times, b), bisect.bisect_right(times, e))
                                               for b, e, f in phases if f == full) if hi > lo]
        if spans:
            ax.broken_barh(spans, (0, 1), transform=ax.get_xaxis_transform(), color=colour, alpha=0.25,
                           linewidth=0)
        spans = [(b, e - b) for b, e, f in phases if f == full]
        if spans:
            ax2.broken_barh(spans, (0, 1), transform=ax2.get_xaxis_transform(), color=colour, alpha=0.3,
                            linewidth=0)
    ax.set_xlabel("fault sequence number")
    ax.set_ylabel(y_label())
    ax.text(0.99, 0.01, f"page 0 is at {base << 12:#x}", transform=ax.transAxes, ha="right", va="bottom",
            fontsize=8)
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
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("faults/s")
    ax2.set_xlim(0, end_t)
    ax2.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"faults": len(faults), "app_faults": len(app), "gc_faults": len(gc),
            "gc_phases": len(phases), "ylabel": ax.get_ylabel(), "page0": base << 12}


def cmd_trace(args) -> int:
    if not args.plot and not args.csv and not args.json:
        args.parser.error("give --plot FILE, --csv FILE or --json (what to do with the trace)")
    from farmem import doctor
    doctor.require("bpf-tracepoint")  # the same refusal as every command, pointing to `farmem doctor`
    if args.plot:  # import matplotlib while the trace records: it takes seconds, the trace waits anyway
        importer = threading.Thread(target=_import_quietly, daemon=True)
        importer.start()
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
