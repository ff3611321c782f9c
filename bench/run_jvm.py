#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The JVM benchmark (issue 3): each Java workload at several local budgets, farmem side by side
with Linux swap (zram under a memory cgroup, farmem.swap) and with an all-local run.

Configurations, per workload and budget:

  local     java alone, no limit (the reference: slowdown 1.0)
  farmem    ./farmem run --local PCT --summary-json ... -- java ...   (the agent pages the heap)
  local-shm, farmem-shm
            the same two with -XX:AllocateHeapAt=/dev/shm: the heap is a shared-memory file,
            which farmem pages in minor-fault mode (docs/jvm.md)
  swap      java in a memory cgroup limited to PCT of -Xmx plus --jvm-overhead (metaspace, code
            cache, thread stacks: the part of the JVM that farmem does not page but the cgroup
            counts), swapping to zram

Reports wall time, slowdown against local, remote reads, and the split of faults between GC and
application threads (the figure MemLiner starts from). Each figure is the median of --repeats.

    .venv/bin/python bench/run_jvm.py [--heap 512m] [--budgets 100,50,25] [--repeats 1]
        [--configs local,farmem,swap,local-shm,farmem-shm] [--workloads gcchurn,pagerank,h2] [--json raw.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # not run from .venv: use this checkout's sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import java, swap  # noqa: E402

WORKLOADS = {
    "gcchurn": ["GcChurn", "--live-mb", "200", "--steps", "150000"],
    "pagerank": ["PageRank", "--nodes", "4000000", "--iters", "8"],
    # Third-party: the H2 database (Maven Central, build/java/thirdparty, tests/java/thirdparty/pom.xml).
    "h2": ["H2Workload", "--rows", "400000", "--rounds", "1000"],
}
CLASSPATH = os.pathsep.join(os.path.join(ROOT, "build", "java", *p) for p in ((), ("thirdparty", "h2.jar")))
SIZE_SHIFT = {"k": 10, "m": 20, "g": 30}


def heap_bytes(text: str) -> int:
    return int(text[:-1]) << SIZE_SHIFT[text[-1].lower()] if text[-1].isalpha() else int(text)


def java_argv(args, workload: str, config: str = "") -> list:
    shm = ["-XX:AllocateHeapAt=/dev/shm"] if config.endswith("-shm") else []
    return ["java", f"-Xmx{args.heap}", f"-Xms{args.heap}", *shm, "-cp", CLASSPATH,
            *WORKLOADS[workload]]


def run_one(args, config: str, workload: str, budget: int, workdir: str) -> dict:
    argv = java_argv(args, workload, config)
    rec = {"config": config, "workload": workload, "budget_pct": budget}
    t0 = time.monotonic()
    if config in ("local", "local-shm"):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
        rc, out = r.returncode, r.stdout + r.stderr
    elif config in ("farmem", "farmem-shm"):
        summary = os.path.join(workdir, f"s-{workload}-{budget}.json")
        r = subprocess.run([os.path.join(ROOT, "farmem"), "run", "--local", f"{budget}%",
                            "--summary-json", summary, "--", *argv],
                           capture_output=True, text=True, timeout=args.timeout)
        rc, out = r.returncode, r.stdout + r.stderr
        if os.path.exists(summary):
            s = json.load(open(summary))
            rec.update({k: s[k] for k in ("remote_reads", "remote_writes", "gc_faults", "app_faults",
                                          "evictions", "fault_p50_us", "fault_p99_us")})
    else:
        limit = heap_bytes(args.heap) * budget // 100 + heap_bytes(args.jvm_overhead)
        # the collector the JVM runs under the pager: in the cgroup HotSpot would pick Serial
        argv, _ = java.same_heap_as_the_pager(argv)
        with swap.SwapEnv(limit, zram_size=max(2 << 30, 2 * heap_bytes(args.heap))) as env:
            sr = env.run(argv, timeout=args.timeout, cwd=ROOT)
        rc, out = sr.returncode, sr.stdout + sr.stderr
        rec["majflt"] = sr.as_dict().get("majflt")
    rec["wall_s"] = round(time.monotonic() - t0, 3)
    rec["status"] = rc
    if rc != 0:
        rec["error"] = out.strip().splitlines()[-3:]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heap", default="512m")
    ap.add_argument("--jvm-overhead", default="64m", help="added to the swap cgroup's limit (default 64m)")
    ap.add_argument("--budgets", default="100,50,25")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--configs", default="local,farmem,swap")
    ap.add_argument("--workloads", default="gcchurn,pagerank,h2")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", help="write every run's record here")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "build/lib/libfarmem_agent.so", "build/java/.ok", "build/java/thirdparty/.ok",
                    "build/bin/farmem-memd"],
                   cwd=ROOT, check=True)
    budgets = [int(b) for b in a.budgets.split(",")]
    configs = a.configs.split(",")
    records = []
    with tempfile.TemporaryDirectory(prefix="fmjbench-") as workdir:
        for workload in a.workloads.split(","):
            for rep in range(a.repeats):
                for config in configs:
                    for budget in ([100] if config.startswith("local") else budgets):
                        rec = run_one(a, config, workload, budget, workdir)
                        rec["repeat"] = rep
                        records.append(rec)
                        print(f"# {workload} {config} {budget}%: {rec['wall_s']} s, status {rec['status']}",
                              file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=2)
    print("| workload | config | local | wall s | slowdown | remote reads | GC share of faults | status |")
    print("|---|---|---|---|---|---|---|---|")
    for workload in a.workloads.split(","):
        ref = [r["wall_s"] for r in records if r["workload"] == workload and r["config"] == "local" and not r["status"]]
        base = statistics.median(ref) if ref else None
        for config in configs:
            for budget in ([100] if config.startswith("local") else budgets):
                rs = [r for r in records if (r["workload"], r["config"], r["budget_pct"]) == (workload, config, budget)]
                if not rs:
                    continue
                wall = statistics.median(r["wall_s"] for r in rs)
                slow = f"{wall / base:.2f}x" if base else "-"
                paged = config.startswith("farmem")
                reads = statistics.median(r.get("remote_reads", 0) for r in rs) if paged else "-"
                faults = [(r.get("gc_faults", 0), r.get("app_faults", 0)) for r in rs if paged]
                share = (f"{100 * sum(g for g, _ in faults) / max(1, sum(g + p for g, p in faults)):.0f}%"
                         if faults else "-")
                status = ",".join(str(r["status"]) for r in rs)
                print(f"| {workload} | {config} | {budget}% | {wall:.2f} | {slow} | {reads} | {share} | {status} |")
    return 0 if all(r["status"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
