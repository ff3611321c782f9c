#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 9: discarding the collector's free space, and G1 sizing for the local budget.

Per workload and local budget (% of -Xmx): farmem with discard on/off and sizing on/off, side by
side with Linux swap (zram under a memory cgroup limited to the same budget plus --jvm-overhead,
farmem.swap) and an all-local run (the reference for slowdowns). Reports wall time,
slowdown, and bytes written to and read from memd per GB the program allocated (allocation from
-Xlog:gc: the heap occupancy before each pause minus after the previous one).

    .venv/bin/python bench/bench_discard.py [--heap 512m] [--budgets 50,25] [--workloads gcchurn]
        [--configs local,d1s1,d0s1,d1s0,d0s0,swap] [--json raw.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # not run from .venv: use this checkout's sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import java as farmem_java, swap  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import gclog as gclog_lib  # noqa: E402

WORKLOADS = {
    "gcchurn": ["GcChurn", "--live-mb", "200", "--steps", "60000"],
    "pagerank": ["PageRank", "--nodes", "2000000", "--iters", "5"],
    "allocrace": ["AllocRace", "--seconds", "10", "--no-full-gc"],
}
CONFIGS = {  # name -> farmem run flags
    "d1s1": ["--discard", "--heap-sizing"],
    "d0s1": ["--no-discard", "--heap-sizing"],
    "d1s0": ["--discard", "--no-heap-sizing"],
    "d0s0": ["--no-discard", "--no-heap-sizing"],
}
LABEL = {"local": "all local", "swap": "Linux swap (zram)", "d1s1": "farmem discard+sizing",
         "d0s1": "farmem sizing only", "d1s0": "farmem discard only", "d0s0": "farmem neither"}


def heap_bytes(text: str) -> int:
    return int(text[:-1]) << {"k": 10, "m": 20, "g": 30}[text[-1].lower()] if text[-1].isalpha() else int(text)


def allocated_mb(gclog: str) -> float | None:
    b = gclog_lib.allocated_bytes(gclog_lib.read(gclog))
    return b / 2**20 if b else None


def run_one(a, config, workload, budget, workdir) -> dict:
    gclog = os.path.join(workdir, f"gc-{workload}-{config}-{budget}.log")
    java = ["java", f"-Xmx{a.heap}", f"-Xms{a.heap}", f"-Xlog:gc:file={gclog}", "-cp",
            os.path.join(ROOT, "build", "java"), *WORKLOADS[workload]]
    rec = {"workload": workload, "config": config, "budget_pct": budget}
    t0 = time.monotonic()
    if config == "local":
        r = subprocess.run(java, capture_output=True, text=True, timeout=a.timeout)
        rc, out = r.returncode, r.stdout + r.stderr
    elif config == "swap":
        limit = heap_bytes(a.heap) * budget // 100 + heap_bytes(a.jvm_overhead)
        # the collector the JVM runs under the pager: in the cgroup HotSpot would pick Serial
        argv, _ = farmem_java.same_heap_as_the_pager(java)
        with swap.SwapEnv(limit, zram_size=max(2 << 30, 2 * heap_bytes(a.heap))) as env:
            sr = env.run(argv, timeout=a.timeout, cwd=ROOT)
        rc, out = sr.returncode, sr.stdout + sr.stderr
    else:
        summary = os.path.join(workdir, f"s-{workload}-{config}-{budget}.json")
        r = subprocess.run([os.path.join(ROOT, "farmem"), "run", "--local", f"{budget}%", *CONFIGS[config],
                            "--summary-json", summary, "--", *java],
                           capture_output=True, text=True, timeout=a.timeout)
        rc, out = r.returncode, r.stdout + r.stderr
        if os.path.exists(summary):
            s = json.load(open(summary))
            rec.update({k: s.get(k) for k in ("remote_read_bytes", "remote_write_bytes", "discards",
                                              "wp_faults", "evictions")})
    rec["wall_s"] = round(time.monotonic() - t0, 2)
    rec["status"] = rc
    rec["alloc_mb"] = allocated_mb(gclog)
    if rc:
        rec["error"] = out.strip().splitlines()[-3:]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heap", default="512m")
    ap.add_argument("--jvm-overhead", default="64m")
    ap.add_argument("--budgets", default="50,25")
    ap.add_argument("--workloads", default="gcchurn,pagerank")
    ap.add_argument("--configs", default="local,d1s1,d0s1,d1s0,d0s0,swap")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "build/lib/libfarmem_agent.so", "build/java/.ok", "build/bin/farmem-memd"],
                   cwd=ROOT, check=True)
    recs = []
    with tempfile.TemporaryDirectory(prefix="fmdisc-bench-") as wd:
        for w in a.workloads.split(","):
            for c in a.configs.split(","):
                for b in ([100] if c == "local" else [int(x) for x in a.budgets.split(",")]):
                    rec = run_one(a, c, w, b, wd)
                    recs.append(rec)
                    print(f"# {json.dumps(rec)}", file=sys.stderr, flush=True)
    if a.json:
        json.dump(recs, open(a.json, "w"), indent=2)
    print("| workload | local | config | wall s | slowdown | MB written to memd / GB alloc | MB read / GB alloc "
          "| discarded pages | status |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in a.workloads.split(","):
        ref = next((r["wall_s"] for r in recs if r["workload"] == w and r["config"] == "local" and not r["status"]), None)
        for r in recs:
            if r["workload"] != w:
                continue
            slow = f"{r['wall_s'] / ref:.2f}x" if ref and not r["status"] else "-"
            gb = (r["alloc_mb"] or 0) / 1024
            wr = f"{r['remote_write_bytes'] / 2**20 / gb:.0f}" if r.get("remote_write_bytes") is not None and gb else "-"
            rd = f"{r['remote_read_bytes'] / 2**20 / gb:.0f}" if r.get("remote_read_bytes") is not None and gb else "-"
            print(f"| {w} | {r['budget_pct']}% | {LABEL[r['config']]} | {r['wall_s']:.1f} | {slow} | {wr} | {rd} "
                  f"| {r.get('discards', '-')} | {r['status']} |")
    return 0 if all(not r["status"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
