#!/usr/bin/env python3
"""Where every CPU's time went while a JVM ran, by what the JVM was doing and which thread ran.

    .venv/bin/python bench/cpu_census.py [--freq 999] [--json F] -- \\
        ./farmem run --local 50% -- java -Xmx1g -Xms1g -cp build/java GcChurn --live-mb 600

Samples every CPU (`perf record -a`, cpu-clock, --freq a second) on CLOCK_MONOTONIC beside the JVM's
`-Xlog:gc,gc+phases:timenanos` (the same clock, added after the word `java`) and gives each sample to
the innermost span it fell in, as fill_census.py gives fills: a full GC's phase, a pause by G1's
kind, a concurrent mark cycle, or neither. Time before the JVM's first GC span and after its last
is apart ("before the first GC": the JVM's start and the program's set-up; "after the last GC": its
last work, its exit, and farmem's after it), and a CPU that ran nothing is "idle". Each span gets
its wall seconds (the samples of all CPUs over it, divided by their number) and, by thread kind, the
CPU seconds that kind ran there. Beside the same command all local it says where farmem's time went:
which spans grew, and whether by more work (a kind's CPU seconds) or by waiting (idle).

Needs perf (linux-perf) allowed to sample every CPU (root, or perf_event_paranoid <= 0). The exit
status is the command's.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fill_census  # noqa: E402  (its innermost-span placement, and the modules it loads)

phase_io = fill_census.phase_io  # the GC log's spans and the `-Xlog` it adds
profile = fill_census.profile    # the thread kinds

BEFORE, AFTER, IDLE = "before the first GC", "after the last GC", "idle"
LINE = re.compile(r"^\s*(?P<comm>.*?)\s+(?P<tid>-?\d+)\s+(?P<t>\d+\.\d+):")


def parse_samples(text: str) -> list:
    """`perf script -F comm,tid,time --ns` into [(seconds, thread kind)]; the idle task (tid 0) is IDLE."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m.group("t")), IDLE if m.group("tid") == "0" else profile.thread_kind(m.group("comm"))))
    return out


def census(samples: list, spans: list) -> collections.Counter:
    """{(span, thread kind): samples}, the time outside every span before the first and after the last apart."""
    if not spans:
        return collections.Counter((BEFORE, kind) for _, kind in samples)
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    out: collections.Counter = collections.Counter()
    placed = fill_census.census([(t, kind, "") for t, kind in samples if first <= t < last], spans)
    for (span, kind, _), n in placed.items():
        out[(span, kind)] += n
    for t, kind in samples:
        if t < first:
            out[(BEFORE, kind)] += 1
        elif t >= last:
            out[(AFTER, kind)] += 1
    return out


def table(c: collections.Counter, freq: float, cpus: int, top: int) -> list:
    """[{span, wall_s, cpu_s: {kind: s}}] in the order of the spans' wall time, longest first."""
    rows: dict = {}
    for (span, kind), n in c.items():
        r = rows.setdefault(span, {"span": span, "wall_s": 0.0, "cpu_s": collections.Counter()})
        r["wall_s"] += n / freq / cpus
        r["cpu_s"][kind] += n / freq
    out = sorted(rows.values(), key=lambda r: -r["wall_s"])
    for r in out:
        r["cpu_s"] = dict(r["cpu_s"].most_common(top))
    return out


def report(rows: list) -> str:
    lines = [f"{'span':40s} {'wall s':>7s}  CPU s by thread kind"]
    for r in rows:
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_s"].items())
        lines.append(f"{r['span'][:40]:40s} {r['wall_s']:7.2f}  {kinds}")
    lines.append(f"{'all':40s} {sum(r['wall_s'] for r in rows):7.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--freq", type=int, default=999, help="samples a second on each CPU (default 999)")
    ap.add_argument("--top", type=int, default=6, help="thread kinds shown per span")
    ap.add_argument("--json", metavar="F", help="also write the table as JSON to F")
    phase_io.jvmcmd.add_command(ap)
    a = ap.parse_args()
    cmd = phase_io.jvmcmd.command(ap, a)
    with tempfile.TemporaryDirectory(prefix="cpu-census-") as work:
        log, data = os.path.join(work, "gc.log"), os.path.join(work, "perf.data")
        try:
            cmd = phase_io.with_gc_log(cmd, log, "timenanos")
        except ValueError as e:
            ap.error(str(e))
        # cpu-clock, not perf's default of cycles where the CPU counts them: a halted CPU counts none,
        # and its idle time would be missing from every span's wall time.
        rc = subprocess.run(["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", str(a.freq), "-k", "CLOCK_MONOTONIC", "-o", data,
                             "--", *cmd]).returncode
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,time", "--ns"],
                                capture_output=True, text=True)
        if not os.path.exists(log):
            print("cpu_census: the JVM wrote no GC log (it did not start?)", file=sys.stderr)
            return rc or 1
        with open(log) as f:
            spans = phase_io.parse_gc_log(f.read())
    samples = parse_samples(script.stdout)
    if not samples:
        print(f"cpu_census: perf recorded no sample:\n{script.stderr[-2000:]}", file=sys.stderr)
        return rc or 1
    rows = table(census(samples, spans), a.freq, os.cpu_count() or 1, a.top)
    print(report(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
