#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MemLiner marking vs stock G1 at 25% local (issue 7; docs/patched-jdk.md).

Each workload runs under `./farmem run --local PCT` in these configurations:

  stock         the system JDK 17 (stock HotSpot), G1
  patched-off   the farmem JDK without -XX:+UseFarmemMemLiner (the same VM build, stock marking)
  memliner      the farmem JDK with `--gc memliner` (G1 marking postpones remote objects)

and the table shows, side by side, the faults taken by GC threads (the pager's gc_faults: the
agent tells GC threads by name), application-thread faults, remote reads, marking cycles,
postponements (from -Xlog:gc+farmem) and end-to-end wall time. Targets from the issue: at least
60% fewer GC-thread faults and 1.3x faster than stock. Each figure is the median of --repeats.

    .venv/bin/python bench/bench_memliner.py [--workloads objgraph,gcchurn] [--local 25] [--heap 512m]
        [--repeats 1] [--configs stock,memliner] [--json raw.json]

Needs `make all` and `make jdk` (it runs hotspot/build.sh, a cache hit, to find the farmem JDK).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = os.path.join(ROOT, "build", "bench-java")
WORKLOADS = {
    "objgraph": (["ObjGraph", "--live-mb", "150", "--sweeps", "30"], "objgraph: ok"),
    "gcchurn": (["GcChurn", "--live-mb", "200", "--steps", "150000"], "gcchurn: ok"),
}
CYCLE_END = re.compile(r"MemLiner: cycle end.*?: postponed (\d+) .*?released: resident (\d+)")


def farmem_jdk() -> str:
    r = subprocess.run(["bash", os.path.join(ROOT, "hotspot", "build.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bench_memliner: the farmem JDK does not build (make jdk):\n" + r.stderr[-2000:])
    return r.stdout.strip().splitlines()[-1]


def compile_java() -> None:
    os.makedirs(CLASSES, exist_ok=True)
    srcs = [os.path.join(ROOT, "bench", "java", "ObjGraph.java"), os.path.join(ROOT, "tests", "java", "GcChurn.java")]
    subprocess.run(["javac", "-nowarn", "-d", CLASSES, *srcs], check=True)


def run_one(args, config: str, workload: str, jdk: str, workdir: str, rep: int) -> dict:
    argv_w, ok_line = WORKLOADS[workload]
    summary = os.path.join(workdir, f"s-{workload}-{config}-{rep}.json")
    gclog = os.path.join(workdir, f"gc-{workload}-{config}-{rep}.log")
    java = {"stock": "java", "patched-off": os.path.join(jdk, "bin", "java"), "memliner": "java"}[config]
    gc = ["--gc", "memliner"] if config == "memliner" else []
    logsel = "gc,gc+farmem" if config != "stock" else "gc"
    cmd = [os.path.join(ROOT, "farmem"), "run", "--local", f"{args.local}%", "--summary-json", summary, *gc, "--",
           java, f"-Xmx{args.heap}", f"-Xlog:{logsel}:file={gclog}", "-cp", CLASSES, *argv_w]
    env = dict(os.environ, FARMEM_JDK=jdk)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    rec = {"workload": workload, "config": config, "status": r.returncode}
    if r.returncode != 0 or ok_line not in r.stdout:
        rec["error"] = (r.stdout + r.stderr).strip().splitlines()[-4:]
        return rec
    s = json.load(open(summary))
    rec.update({k: s.get(k) for k in ("elapsed_s", "gc_faults", "app_faults", "remote_reads", "faults")})
    log = open(gclog).read() if os.path.exists(gclog) else ""
    rec["cycles"] = len(re.findall(r"Concurrent Mark Cycle \d", log)) or log.count("Concurrent Mark Cycle\n")
    ends = [tuple(map(int, m.groups())) for m in CYCLE_END.finditer(log)]
    rec["postponed"] = sum(e[0] for e in ends)
    rec["came_local"] = sum(e[1] for e in ends)
    return rec


def median(recs, key):
    vals = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="objgraph,gcchurn")
    ap.add_argument("--configs", default="stock,memliner")
    ap.add_argument("--local", type=int, default=25)
    ap.add_argument("--heap", default="512m")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json")
    args = ap.parse_args()
    jdk = farmem_jdk()
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
    print(f"\nMemLiner vs stock G1, --local {args.local}%, -Xmx{args.heap}, median of {args.repeats}")
    hdr = f"{'workload':9} {'config':12} {'wall s':>7} {'GC faults':>10} {'app faults':>10} {'remote rd':>10} " \
          f"{'cycles':>6} {'postponed':>10} {'came local':>10}"
    print(hdr)
    print("-" * len(hdr))
    summary = {}
    for w in args.workloads.split(","):
        for c in args.configs.split(","):
            recs = [r for r in rows if r["workload"] == w and r["config"] == c and r["status"] == 0 and "error" not in r]
            if not recs:
                print(f"{w:9} {c:12} FAILED: {[r.get('error') for r in rows if r['workload'] == w and r['config'] == c][:1]}")
                continue
            m = {k: median(recs, k) for k in ("elapsed_s", "gc_faults", "app_faults", "remote_reads", "cycles",
                                                "postponed", "came_local")}
            summary[(w, c)] = m
            print(f"{w:9} {c:12} {m['elapsed_s']:7.1f} {m['gc_faults']:10.0f} {m['app_faults']:10.0f} "
                  f"{m['remote_reads']:10.0f} {m['cycles']:6.0f} {m['postponed']:10.0f} {m['came_local']:10.0f}")
        base, ml = summary.get((w, "stock")), summary.get((w, "memliner"))
        if base and ml:
            red = 100.0 * (1 - ml["gc_faults"] / base["gc_faults"]) if base["gc_faults"] else 0.0
            print(f"{w:9} memliner vs stock: GC-thread faults {red:.0f}% fewer (target >= 60%), "
                  f"speed-up {base['elapsed_s'] / ml['elapsed_s']:.2f}x (target >= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
