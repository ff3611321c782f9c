#!/usr/bin/env python3
"""Every page a JVM's faults filled, by what the JVM was doing, which thread, and how: a census.

    .venv/bin/python bench/fill_census.py [--json F] -- \\
        ./farmem run --local 50% -- java -Xmx1g -Xms1g -cp build/java GcChurn --live-mb 600

Puts a uprobe on the pager's `fill` (uffd/fault.c: the page a fault, or a system call's buffer,
brings in, with the page's state before: REMOTE is a read from memd, UNTOUCHED a zero fill; the
pages fetched ahead with it are not counted), records it with perf on CLOCK_MONOTONIC beside the
JVM's `-Xlog:gc,gc+phases:timenanos` (the same clock, added after the word `java`), and gives each fill to the
innermost span it happened in: a full GC's phase, a pause by G1's kind, a concurrent mark cycle,
or neither. Unlike gc_phase_io.py, which splits counters read every few milliseconds by time, each
fill is placed by its own timestamp, so the marking threads' reads, which stop while a pause runs,
are not given to the pauses they straddle (gc_phase_io put 83k of GcChurn's remote reads at 50%
into its young pauses; their threads took 2k there: bench/RESULTS.md, session 83).

Needs perf (linux-perf), root, and the agent's debug information (the build's -g) for the
probe's arguments. The probe is removed at the end. The exit status is the command's.
"""
import argparse
import bisect
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


phase_io = load("gc_phase_io")  # its GC log spans, their nesting and the `-Xlog` it adds
profile = load("gc_profile")    # its thread kinds

EVENT = "fm_census_fill"
STATES = {0: "zero fill", 6: "remote read"}  # uffd/resmap.h: FM_PG_UNTOUCHED, FM_PG_REMOTE
LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<t>\d+\.\d+):\s+\S+:\s+\(\w+\) addr=\w+ b=(?P<b>\d+)")


def parse_fills(text: str) -> list:
    """`perf script -F comm,time,event,trace --ns` into [(seconds, thread kind, how)]."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m.group("t")), profile.thread_kind(m.group("comm")),
                        STATES.get(int(m.group("b")) & 7, "other")))
    return out


def census(fills: list, spans: list) -> collections.Counter:
    """{(span, thread kind, how): fills}: each fill in the innermost span over its time. Spans of one
    nesting rank (phases, pauses, mark cycles) do not overlap: each rank is searched by bisection."""
    ranks: dict = {}
    for s in spans:
        ranks.setdefault(phase_io.RANK[s[2]], []).append(s)
    levels = [sorted(ranks[r]) for r in sorted(ranks)]
    starts = [[s[0] for s in lv] for lv in levels]
    out: collections.Counter = collections.Counter()
    for t, kind, how in fills:
        label = phase_io.OUTSIDE
        for lv, st in zip(levels, starts):
            i = bisect.bisect_right(st, t) - 1
            if i >= 0 and t < lv[i][1]:
                label = lv[i][3]
                break
        out[(label, kind, how)] += 1
    return out


def report(c: collections.Counter, top: int) -> str:
    total = sum(c.values()) or 1
    by_span: collections.Counter = collections.Counter()
    for (span, _, _), n in c.items():
        by_span[span] += n
    out = [f"{sum(c.values())} fills"]
    for span, n in by_span.most_common():
        out.append(f"{n:9d} {100 * n / total:3.0f}%  {span}")
        rows = sorted(((k, v) for k, v in c.items() if k[0] == span), key=lambda kv: -kv[1])
        for (_, kind, how), v in rows[:top]:
            out.append(f"{v:19d}  {kind}, {how}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libfarmem_agent.so"),
                    help="the agent whose `fill` is probed (default: this build's)")
    ap.add_argument("--top", type=int, default=4, help="thread kinds and fill kinds shown per span")
    ap.add_argument("--json", metavar="F", help="also write the census as JSON to F")
    phase_io.jvmcmd.add_command(ap)
    a = ap.parse_args()
    cmd = phase_io.jvmcmd.command(ap, a)
    if not os.path.exists(a.lib):
        ap.error(f"no {a.lib}: build it (make) or name one with --lib")
    group = "probe_" + re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(a.lib).split(".")[0])
    add = subprocess.run(["perf", "probe", "-q", "-x", a.lib, "--add", f"{EVENT}=fill addr=f->addr:x64 b=b:u8"],
                         capture_output=True, text=True)
    if add.returncode:
        print(f"fill_census: perf probe on {a.lib}'s fill failed:\n{add.stderr}", file=sys.stderr)
        return 1
    try:
        with tempfile.TemporaryDirectory(prefix="fill-census-") as work:
            log, data = os.path.join(work, "gc.log"), os.path.join(work, "perf.data")
            try:
                cmd = phase_io.with_gc_log(cmd, log, "timenanos")
            except ValueError as e:
                ap.error(str(e))
            # 4 MiB of ring a CPU (the default is 512 KiB): room for bursts of faults while perf drains it.
            rc = subprocess.run(["perf", "record", "-q", "-m", "1024", "-k", "CLOCK_MONOTONIC", "-e",
                                 f"{group}:{EVENT}", "-o", data, "--", *cmd]).returncode
            script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,time,event,trace", "--ns"],
                                    capture_output=True, text=True)
            if not os.path.exists(log):
                print("fill_census: the JVM wrote no GC log (it did not start?)", file=sys.stderr)
                return rc or 1
            with open(log) as f:
                spans = phase_io.parse_gc_log(f.read())
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", f"{group}:{EVENT}"], capture_output=True)
    fills = parse_fills(script.stdout)
    if not fills:
        print("fill_census: no fill recorded (not under farmem, or nothing paged?)", file=sys.stderr)
        return rc or 1
    c = census(fills, spans)
    print(report(c, a.top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"span": s, "thread": k, "how": h, "fills": n} for (s, k, h), n in c.items()], f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
