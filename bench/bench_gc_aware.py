#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What GC-aware eviction changes (issue 3): each Java workload under `farmem run` at each local
budget with gc_aware=1 (the default: pages that only GC threads touched lose their second chance
in uffd/evict.c's pick()) and gc_aware=0, interleaved (1, 0, 1, 0, ...) so that drift on a shared
machine hits both alike. The knob reaches the agent through FARMEM_GC_AWARE (docs/knobs.md).

Prints a markdown table of medians over --repeats: wall time, remote reads, GC-thread and
application-thread faults (the summary JSON), with the command line and the date.

    .venv/bin/python bench/bench_gc_aware.py [--workloads gcchurn,h2] [--budgets 50,25] [--repeats 3]
        [--heap 512m] [--json raw.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSPATH = os.pathsep.join([os.path.join(ROOT, "build", "java"),
                             os.path.join(ROOT, "build", "java", "thirdparty", "h2.jar")])
WORKLOADS = {
    "gcchurn": (["GcChurn", "--live-mb", "200", "--steps", "100000"], "gcchurn: ok"),
    "h2": (["H2Workload", "--rows", "300000", "--rounds", "500"], "h2: ok"),
}
FIELDS = ("remote_reads", "gc_faults", "app_faults", "evictions")


def run_one(args, workload: str, budget: int, gc_aware: int, workdir: str) -> dict:
    wargs, ok = WORKLOADS[workload]
    summary = os.path.join(workdir, f"s-{workload}-{budget}-{gc_aware}.json")
    if os.path.exists(summary):
        os.unlink(summary)
    cmd = [os.path.join(ROOT, "farmem"), "run", "--local", f"{budget}%", "--summary-json", summary, "--",
           "java", f"-Xmx{args.heap}", f"-Xms{args.heap}", "-cp", CLASSPATH, *wargs]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                       env=dict(os.environ, FARMEM_GC_AWARE=str(gc_aware)))
    rec = {"workload": workload, "budget_pct": budget, "gc_aware": gc_aware,
           "wall_s": round(time.monotonic() - t0, 3), "status": r.returncode, "checked": ok in r.stdout}
    if os.path.exists(summary):
        s = json.load(open(summary))
        rec.update({k: s.get(k) for k in FIELDS})
    if r.returncode != 0 or not rec["checked"]:
        rec["error"] = (r.stdout + r.stderr).strip().splitlines()[-3:]
    print(f"# {workload} {budget}% gc_aware={gc_aware}: {rec['wall_s']} s, status {rec['status']}, "
          f"reads {rec.get('remote_reads')}", file=sys.stderr, flush=True)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="gcchurn,h2")
    ap.add_argument("--budgets", default="50,25")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--heap", default="512m")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write every run's record here")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "build/lib/libfarmem_agent.so", "build/java/.ok", "build/java/thirdparty/.ok",
                    "build/bin/farmem-memd"], cwd=ROOT, check=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    workloads, budgets = a.workloads.split(","), [int(b) for b in a.budgets.split(",")]
    records = []
    with tempfile.TemporaryDirectory(prefix="fmgcaware-") as workdir:
        for workload in workloads:
            for budget in budgets:
                for rep in range(a.repeats):
                    for gc_aware in ((1, 0) if rep % 2 == 0 else (0, 1)):
                        rec = run_one(a, workload, budget, gc_aware, workdir)
                        rec["repeat"] = rep
                        records.append(rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=2)
    print(f"`{' '.join(['bench/bench_gc_aware.py'] + sys.argv[1:])}`, {started}, heap -Xmx{a.heap}, "
          f"median of {a.repeats} (interleaved); {os.cpu_count()} CPUs\n")
    print("| workload | local | gc_aware | wall s (min–max) | remote reads | GC faults | app faults | evictions | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload in workloads:
        for budget in budgets:
            for gc_aware in (1, 0):
                rs = [r for r in records if (r["workload"], r["budget_pct"], r["gc_aware"]) == (workload, budget, gc_aware)]
                walls = [r["wall_s"] for r in rs]
                med = {k: int(statistics.median(r.get(k) or 0 for r in rs)) for k in FIELDS}
                ok = f"{sum(1 for r in rs if r['status'] == 0 and r['checked'])}/{len(rs)}"
                print(f"| {workload} | {budget}% | {gc_aware} | {statistics.median(walls):.2f} "
                      f"({min(walls):.2f}–{max(walls):.2f}) | {med['remote_reads']} | {med['gc_faults']} | "
                      f"{med['app_faults']} | {med['evictions']} | {ok} |")
    return 0 if all(r["status"] == 0 and r["checked"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
