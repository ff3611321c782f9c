#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MemLiner marking vs stock G1 at 25% local (issue 7; docs/patched-jdk.md).

Each workload runs under `./farmem run --local PCT` in these configurations:

  stock          the system JDK 17 (stock HotSpot), G1
  patched-off    the farmem JDK without -XX:+UseFarmemMemLiner (the same VM build, stock marking)
  memliner       `--gc memliner` (-XX:FarmemMarkWaitMillis=0, the default): marking postpones remote
                 objects and forces them when a task has nothing else left
  memliner+wait  `--gc memliner -XX:FarmemMarkWaitMillis=--wait-ms` (waiting on): a task with only
                 remote work left sleeps between marking steps until the program faults pages in

and the table shows, side by side, the faults taken by GC threads (the pager's gc_faults: the
agent tells GC threads by name; of them gc_zero_fills were zero fills), application-thread faults,
remote reads, marking cycles, postponements and waits (from -Xlog:gc+farmem) and end-to-end wall
time. Targets from the issue: at least 60% fewer GC-thread faults and 1.3x faster than stock. Each
figure is the median of --repeats; the configurations alternate within each repeat.

--threads also runs build/bin/farmem-trace -p on each JVM (`make build/bin/farmem-trace`, root) and
splits the pager's faults by thread kind: G1 Conc# + G1 Main Marker (concurrent marking), GC Thread#
(pause workers), VM Thread, G1 Refine#, G1 Service, the rest (the program). Its probes cost time:
do not read wall times from a --threads run.

    .venv/bin/python bench/bench_memliner.py [--workloads objgraph,gcchurn] [--local 25] [--heap 512m]
        [--repeats 1] [--configs stock,patched-off,memliner,memliner+wait] [--wait-ms MS]
        [--wait-args=-XX:FarmemEpochDelta=8] [--threads] [--jdk HOME] [--json raw.json]

Needs `make all` and `make jdk` (it runs hotspot/build.sh, a cache hit, to find the farmem JDK).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # run by a Python without the CLI: use its sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import procmap  # noqa: E402

CLASSES = os.path.join(ROOT, "build", "bench-java")
WORKLOADS = {
    "objgraph": (["ObjGraph", "--live-mb", "150", "--sweeps", "30"], "objgraph: ok"),
    "gcchurn": (["GcChurn", "--live-mb", "200", "--steps", "150000"], "gcchurn: ok"),
}
TRACE = os.path.join(ROOT, "build", "bin", "farmem-trace")
# HotSpot 17's GC thread names (/proc/.../comm), by what they run.
KINDS = (("G1 Conc#", "conc"), ("G1 Main Marker", "conc"), ("GC Thread#", "pause"), ("VM Thread", "vm"),
         ("G1 Refine#", "refine"), ("G1 Service", "service"))
CYCLE_END = re.compile(r"MemLiner: cycle end.*?: postponed (\d+) .*?released: resident (\d+)")
WAITS = re.compile(r"MemLiner: cycle end.*; waited (\d+) times, ([\d.]+) ms .*?came in while waiting (\d+)")


def farmem_jdk() -> str:
    r = subprocess.run(["bash", os.path.join(ROOT, "hotspot", "build.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bench_memliner: the farmem JDK does not build (make jdk):\n" + r.stderr[-2000:])
    return r.stdout.strip().splitlines()[-1]


def compile_java() -> None:
    os.makedirs(CLASSES, exist_ok=True)
    srcs = [os.path.join(ROOT, "bench", "java", "ObjGraph.java"), os.path.join(ROOT, "tests", "java", "GcChurn.java")]
    subprocess.run(["javac", "-nowarn", "-d", CLASSES, *srcs], check=True)


def trace_threads(pid: int, out: dict) -> None:
    """farmem-trace -p PID until it exits: pager faults (uffd waits) per thread kind.

    Totals come every 200 ms; a thread's name is readable only while the JVM lives, so each
    thread's last figures seen alive are kept (the last 200 ms of a run are not attributed)."""
    r = subprocess.run([TRACE, "-p", str(pid), "-i", "200"], capture_output=True, text=True)
    last = {}
    for x in r.stdout.splitlines():
        if not x.startswith('{"type":"stats"'):
            continue
        for proc in json.loads(x)["procs"]:
            if not proc.get("alive"):
                continue
            for t in proc.get("threads", []):
                last[t["tid"]] = (t["comm"], t["uffd_waits"])
            last["total"] = ("", proc["uffd_waits"])
    if not last:
        out["trace_error"] = r.stderr.strip()[-300:]
        return
    kinds = {}
    for tid, (comm, n) in last.items():
        if tid == "total":
            continue
        kind = next((k for pfx, k in KINDS if comm.startswith(pfx)), "app")
        kinds[kind] = kinds.get(kind, 0) + n
    out["kinds"] = kinds


def run_one(args, config: str, workload: str, jdk: str, workdir: str, rep: int) -> dict:
    argv_w, ok_line = WORKLOADS[workload]
    summary = os.path.join(workdir, f"s-{workload}-{config}-{rep}.json")
    gclog = os.path.join(workdir, f"gc-{workload}-{config}-{rep}.log")
    java = "java" if config in ("stock", "memliner", "memliner+wait") else os.path.join(jdk, "bin", "java")
    gc = ["--gc", "memliner"] if config.startswith("memliner") else []
    extra = {"memliner": ["-XX:FarmemMarkWaitMillis=0"],
             "memliner+wait": [f"-XX:FarmemMarkWaitMillis={args.wait_ms}"] +
                              args.wait_args.split()}.get(config, [])
    logsel = "gc,gc+farmem" if config != "stock" else "gc"
    cmd = [os.path.join(ROOT, "farmem"), "run", "--local", f"{args.local}%", "--summary-json", summary, *gc, "--",
           java, f"-Xmx{args.heap}", *extra, f"-Xlog:{logsel}:file={gclog}", "-cp", CLASSES, *argv_w]
    env = dict(os.environ, FARMEM_JDK=jdk)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    traced, tr = {}, None
    if args.threads:
        jp = procmap.wait_descendant_named(p.pid, "java", time.monotonic() + 30)
        if jp:
            tr = threading.Thread(target=trace_threads, args=(jp, traced))
            tr.start()
    try:
        stdout, stderr = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
    if tr:
        tr.join(60)
    r = subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
    rec = {"workload": workload, "config": config, "status": r.returncode, **traced}
    if r.returncode != 0 or ok_line not in r.stdout:
        rec["error"] = (r.stdout + r.stderr).strip().splitlines()[-4:]
        return rec
    s = json.load(open(summary))
    rec.update({k: s.get(k) for k in ("elapsed_s", "gc_faults", "app_faults", "remote_reads", "faults",
                                      "zero_fills", "gc_zero_fills")})
    log = open(gclog).read() if os.path.exists(gclog) else ""
    rec["cycles"] = len(re.findall(r"Concurrent Mark Cycle \d", log)) or log.count("Concurrent Mark Cycle\n")
    ends = [tuple(map(int, m.groups())) for m in CYCLE_END.finditer(log)]
    rec["postponed"] = sum(e[0] for e in ends)
    rec["came_local"] = sum(e[1] for e in ends)
    waits = [m.groups() for m in WAITS.finditer(log)]
    rec["waits"] = sum(int(w[0]) for w in waits)
    rec["wait_ms"] = sum(float(w[1]) for w in waits)
    rec["came_in_waiting"] = sum(int(w[2]) for w in waits)
    return rec


def median(recs, key):
    vals = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="objgraph,gcchurn")
    ap.add_argument("--configs", default="stock,patched-off,memliner,memliner+wait")
    ap.add_argument("--wait-ms", default="1000", help="-XX:FarmemMarkWaitMillis of memliner+wait (the JVM's default is 0: off)")
    ap.add_argument("--wait-args", default="", help="more JVM flags for memliner+wait, e.g. -XX:FarmemEpochDelta=8")
    ap.add_argument("--local", type=int, default=25)
    ap.add_argument("--heap", default="512m")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json")
    ap.add_argument("--threads", action="store_true",
                    help="attribute pager faults to thread kinds with farmem-trace (its probes cost time)")
    ap.add_argument("--jdk", help="farmem JDK home (default: hotspot/build.sh's)")
    args = ap.parse_args()
    jdk = args.jdk or farmem_jdk()
    compile_java()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fm-memliner-") as wd:
        for w in args.workloads.split(","):
            for rep in range(args.repeats):
                for c in args.configs.split(","):
                    rec = run_one(args, c, w, jdk, wd, rep)
                    print(f"bench_memliner: {w} {c} #{rep}: {json.dumps(rec)}", file=sys.stderr, flush=True)
                    rows.append(rec)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    keys = ("elapsed_s", "gc_faults", "gc_zero_fills", "app_faults", "remote_reads", "cycles", "postponed",
            "came_local", "waits", "wait_ms", "came_in_waiting")
    print(f"\nMemLiner vs stock G1, --local {args.local}%, -Xmx{args.heap}, median of {args.repeats}")
    hdr = f"{'workload':9} {'config':14} {'wall s':>7} {'GC faults':>10} {'GC zero':>8} {'app faults':>10} " \
          f"{'remote rd':>10} {'cycles':>6} {'postponed':>9} {'came in':>8} {'waits':>6} {'wait ms':>8} {'in waiting':>10}"
    print(hdr)
    print("-" * len(hdr))
    summary = {}
    num = lambda v, f: format(v, f) if v is not None else "-"
    for w in args.workloads.split(","):
        for c in args.configs.split(","):
            recs = [r for r in rows if r["workload"] == w and r["config"] == c and r["status"] == 0 and "error" not in r]
            if not recs:
                print(f"{w:9} {c:14} FAILED: {[r.get('error') for r in rows if r['workload'] == w and r['config'] == c][:1]}")
                continue
            m = {k: median(recs, k) for k in keys}
            summary[(w, c)] = m
            print(f"{w:9} {c:14} {m['elapsed_s']:7.1f} {m['gc_faults']:10.0f} {num(m['gc_zero_fills'], '8.0f')} "
                  f"{m['app_faults']:10.0f} {m['remote_reads']:10.0f} {m['cycles']:6.0f} {m['postponed']:9.0f} "
                  f"{m['came_local']:8.0f} {m['waits']:6.0f} {m['wait_ms']:8.0f} {m['came_in_waiting']:10.0f}")
        base = summary.get((w, "stock"))
        for c in args.configs.split(","):
            ml = summary.get((w, c))
            if base and ml and c != "stock":
                red = 100.0 * (1 - ml["gc_faults"] / base["gc_faults"]) if base["gc_faults"] else 0.0
                print(f"{w:9} {c} vs stock: GC-thread faults {red:.0f}% fewer (target >= 60%), "
                      f"speed-up {base['elapsed_s'] / ml['elapsed_s']:.2f}x (target >= 1.3x)")
    if args.threads:
        print("\nPager faults (uffd waits: remote reads, zero fills and write-protect faults) by thread kind, median")
        kinds = ("app", "pause", "vm", "conc", "refine", "service")
        print(f"{'workload':9} {'config':14} " + " ".join(f"{k:>9}" for k in kinds) + f" {'conc share of GC':>17}")
        for w in args.workloads.split(","):
            for c in args.configs.split(","):
                recs = [r for r in rows if r["workload"] == w and r["config"] == c and "kinds" in r]
                if not recs:
                    continue
                med = {k: statistics.median([r["kinds"].get(k, 0) for r in recs]) for k in kinds}
                gc = sum(med[k] for k in kinds if k != "app")
                print(f"{w:9} {c:14} " + " ".join(f"{med[k]:9.0f}" for k in kinds) +
                      f" {100.0 * med['conc'] / gc if gc else 0:16.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
