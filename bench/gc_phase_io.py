#!/usr/bin/env python3
"""Where a JVM's paging happens: its pager's counters split by GC pause and full-GC phase.

    .venv/bin/python bench/gc_phase_io.py [--interval S] [--json F] -- \\
        ./farmem run --local 50% -- java -Xmx1g -cp build/java GcChurn --live-mb 600

Adds `-Xlog:gc,gc+phases:file=TMP:time` to the java command (right after the word `java`), reads
the JVM's residency-map counters (its pager's, as `farmem stat` does) every --interval seconds
while it runs, and gives each counter's growth to what the JVM was doing meanwhile: a full GC's
phases (`Phase 1: Mark live objects` ... `Phase 4: Compact heap`, as G1, Serial and Parallel log
them), the rest of a full GC, young pauses by G1's kind (Normal, Mixed, ...), the other pauses (remark, cleanup), and, outside
pauses, the time in and out of G1's concurrent mark cycles (the program and the marking threads
beside it). The log prints each span at its end with its length, so a span is [end - length,
end]; the counters grow between two reads, and a growth whose interval straddles a span's edge
is split by time, so spans much shorter than the interval (most young pauses at 10 ms) are
approximate one by one and right in sum. The split that found a stock G1's full GCs spending
nine tenths of their time in phase 4 (bench/RESULTS.md, session 59). The exit status is the
command's.
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # run by a Python without the CLI: use its sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import procmap, resmap  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import jvmcmd  # noqa: E402

COUNTERS = ("faults", "gc_faults", "app_faults", "zero_fills", "remote_reads", "prefetch_issued",
            "remote_writes", "evictions_clean")
OUTSIDE = "outside pauses, no mark cycle"
MARKING = "outside pauses, in a mark cycle"
# Innermost first: a phase of a full GC is inside its pause, a pause inside a mark cycle.
RANK = {"phase": 0, "full": 1, "young": 1, "pause": 1, "cycle": 2}

# `time` (the wall clock) or `timenanos` (the JVM's System.nanoTime, CLOCK_MONOTONIC on Linux).
LINE = re.compile(r"^\[(?:(?P<t>\d{4}-\d\d-\d\dT[\d:.]+[+-]\d{4})|(?P<ns>\d+)ns)\]"
                  r".*?GC\(\d+\) (?P<what>.*?) (?P<ms>[\d.]+)ms\s*$")


def log_time(stamp: str) -> float:
    """`-Xlog:...:time`'s stamp (2026-12-04T06:48:30.967+0000) as seconds since the epoch."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def parse_gc_log(text: str) -> list:
    """[(start, end, kind, label)] of the spans the log ends with a length."""
    spans = []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        end = log_time(m.group("t")) if m.group("t") else int(m.group("ns")) / 1e9
        what = m.group("what")
        start = end - float(m.group("ms")) / 1000
        ph = re.match(r"(Phase \d: [A-Za-z ]+?)$", what)
        if ph:
            spans.append((start, end, "phase", "full GC, " + ph.group(1)))
        elif what.startswith("Pause Full"):
            spans.append((start, end, "full", "full GC, outside its phases"))
        elif what.startswith("Pause Young"):
            # G1's kinds (Normal, Concurrent Start, Prepare Mixed, Mixed) apart: a mixed pause copies old data.
            kind = re.match(r"Pause Young \(([A-Za-z ]+)\)", what)
            spans.append((start, end, "young", "young pauses" + (f", {kind.group(1)}" if kind else "")))
        elif what.startswith("Pause"):
            spans.append((start, end, "pause", "other pauses (remark, cleanup)"))
        elif what.startswith("Concurrent Mark Cycle"):
            spans.append((start, end, "cycle", MARKING))
    return spans


def attribute(samples: list, spans: list) -> dict:
    """Each growth between two samples [(time, {counter: value})] given to the innermost span
    over it, by the share of the interval each covers; time in no span is OUTSIDE.
    {label: {"seconds": s, counter: growth}}."""
    spans = sorted(spans, key=lambda s: (RANK[s[2]], s[0]))
    out: dict = {}

    def give(label, seconds, share, delta):
        d = out.setdefault(label, {"seconds": 0.0, **{k: 0.0 for k in delta}})
        d["seconds"] += seconds
        for k, v in delta.items():
            d[k] += v * share

    for (ta, ca), (tb, cb) in zip(samples, samples[1:]):
        if tb <= ta:
            continue
        delta = {k: cb[k] - ca[k] for k in cb}
        # Cut [ta, tb] at every span edge inside it; each piece goes to the innermost span over it.
        cuts = sorted({ta, tb, *(x for s in spans for x in s[:2] if ta < x < tb)})
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            over = next((s for s in spans if s[0] <= mid < s[1]), None)
            give(over[3] if over else OUTSIDE, b - a, (b - a) / (tb - ta), delta)
    return out


def with_gc_log(cmd: list, path: str, clock: str = "time") -> list:
    """cmd with -Xlog for the pause and phase spans after its `java`, stamped with clock (an -Xlog
    decorator: time or timenanos)."""
    for i, arg in enumerate(cmd):
        if os.path.basename(arg) == "java":
            return cmd[:i + 1] + [f"-Xlog:gc,gc+phases=info:file={path}:{clock}"] + cmd[i + 1:]
    raise ValueError("no `java` in the command: gc_phase_io splits a JVM's paging")


def read_counters(fd: int, names=COUNTERS) -> dict:
    st = resmap.read_fd(fd).hdr.stats
    return {k: getattr(st, k) for k in names}


def sample(pid: int, proc: subprocess.Popen, interval: float, names=COUNTERS) -> list:
    """[(time, counters)] of the JVM's own residency map, until the command ends."""
    # The pager's counters start at zero with the JVM: what it did before the map was found is there.
    rows, fd = [(time.time(), dict.fromkeys(names, 0))], None
    try:
        while proc.poll() is None:
            if fd is None:
                fd = procmap.own_map_fd(pid)
            if fd is not None:
                rows.append((time.time(), read_counters(fd, names)))
            time.sleep(interval)
        if fd is not None:  # the map outlives the JVM while we hold it: its last figures
            rows.append((time.time(), read_counters(fd, names)))
    finally:
        if fd is not None:
            os.close(fd)
    return rows


def report(split: dict, names=COUNTERS) -> str:
    cols = ("seconds",) + tuple(names)
    total = {c: sum(d[c] for d in split.values()) for c in cols}
    width = max(len(k) for k in split) + 2
    out = [" " * width + "".join(f"{c:>16s}" for c in cols)]
    order = sorted(split, key=lambda k: -split[k]["seconds"])
    for label in order + ["all"]:
        d = split.get(label, total)
        cells = []
        for c in cols:
            v = d[c]
            share = f" {100 * v / total[c]:3.0f}%" if total[c] and label != "all" else ""
            cells.append(f"{v:.2f}{share}" if c == "seconds" else f"{v:.0f}{share}")
        out.append(f"{label:{width}s}" + "".join(f"{c:>16s}" for c in cells))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.01, help="seconds between two reads of the counters")
    ap.add_argument("--json", metavar="F", help="also write the split as JSON to F")
    ap.add_argument("--counter", action="append", default=[], metavar="NAME",
                    help="one more of the residency map's counters as a column (gc_zero_fills, wp_faults, "
                         "io_prefaults, evict_batches, ...); may be repeated")
    jvmcmd.add_command(ap)
    a = ap.parse_args()
    cmd = jvmcmd.command(ap, a)
    if a.interval <= 0:
        ap.error("--interval must be > 0")
    known = {f[0] for f in resmap.PagerStats._fields_ if f[0] not in ("lat_hist", "reserved", "reserved2", "reserved3")}
    bad = [c for c in a.counter if c not in known]
    if bad:
        ap.error(f"no such counter in the residency map: {', '.join(bad)}")
    a.names = COUNTERS + tuple(c for c in a.counter if c not in COUNTERS)
    with tempfile.TemporaryDirectory(prefix="gc-phase-io-") as work:
        log = os.path.join(work, "gc.log")
        try:
            cmd = with_gc_log(cmd, log)
        except ValueError as e:
            ap.error(str(e))
        return run(cmd, log, a)


def run(cmd: list, log: str, a: argparse.Namespace) -> int:
    rc, rows = jvmcmd.watch_jvm(cmd, "gc_phase_io", lambda pid, proc: sample(pid, proc, a.interval, a.names))
    if rows is None:
        return rc
    if len(rows) < 2:
        print("gc_phase_io: the JVM's residency map could not be read (not under farmem?)", file=sys.stderr)
        return rc or 1
    with open(log) as f:
        split = attribute(rows, parse_gc_log(f.read()))
    print(report(split, a.names))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(split, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
