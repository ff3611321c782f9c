#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One program of the sweep (bench/bench_sweep.py), under farmem and under Linux swap, at limits
given for each: `farmem run --threshold 1M --local L` and the same command in a memory cgroup at
limit S with zram swap (farmem.swap.SwapEnv, as bench_fault.py's swap). Alternated, every run's
output compared with the all-local run's; a run Linux kills (the OOM killer at its limit) says so.

    .venv/bin/python bench/bench_vs_swap.py --program perl --scale 0.5 \\
        --farmem 25%,50%,75%,400M --swap 126M,300M,400M,450M [--repeats 2]

Note that farmem's --local counts only the memory it pages (here glibc's heaps above 1 MiB),
the cgroup's limit the whole process. Each swap line says the memory cgroup's version: under v1
(this project's machines) a run that thrashes may end in the cgroup's OOM killer within seconds,
with zram swap nearly empty (bench/RESULTS.md, session 41; docs/compatibility.md on xz).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "cli" / "src"))

import bench_sweep  # noqa: E402
from farmem import swap  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", default="perl", help="a name from bench_sweep.PROGRAMS")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--farmem", default="25%,50%,75%", help="farmem run --local values")
    ap.add_argument("--swap", default="", help="cgroup limits for Linux swap (K/M/G)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    cmd = next((c for n, _, c in bench_sweep.PROGRAMS if n == args.program), None)
    if cmd is None:
        raise SystemExit(f"bench_vs_swap: no program {args.program!r} in bench_sweep.PROGRAMS")
    with tempfile.TemporaryDirectory(prefix="farmem-vs-swap-") as work:
        return compare(args, cmd, Path(work))


def compare(args, cmd: str, work: Path) -> int:
    bench_sweep.make_inputs(work, args.scale)
    argv = ["bash", "-c", cmd]
    t0 = time.monotonic()
    ref = subprocess.run(argv, cwd=work, capture_output=True, timeout=args.timeout)
    print(f"{args.program} all local: {time.monotonic() - t0:.2f} s, exit {ref.returncode}", flush=True)
    if ref.returncode:
        return 1
    bad = 0
    for rep in range(args.repeats):
        for loc in filter(None, args.farmem.split(",")):
            summary = work / "summary.json"
            t0 = time.monotonic()
            r = subprocess.run([str(REPO / "farmem"), "run", "--threshold", "1M", "--local", loc,
                                "--summary-json", str(summary), "--"] + argv,
                               cwd=work, capture_output=True, timeout=args.timeout)
            wall = time.monotonic() - t0
            s = json.loads(summary.read_text()) if summary.exists() else {}
            same = r.returncode == 0 and r.stdout == ref.stdout
            bad += not same
            print(f"farmem --local {loc}: {wall:.2f} s, {'right' if same else 'WRONG or failed'}, "
                  f"limit {(s.get('peak_limit_bytes') or s.get('local_limit_bytes', 0)) >> 20} MiB at its highest, {s.get('faults', 0)} faults, "
                  f"{s.get('refaults_soon', 0)} refaults within a budget", flush=True)
        for lim in filter(None, args.swap.split(",")):
            t0 = time.monotonic()
            with swap.SwapEnv(limit_bytes=lim) as env:
                r = env.run(["bash", "-c", f"cd {shlex.quote(str(work))} && {cmd}"], timeout=args.timeout)
                cgroup = env.cgroup_version
            wall = time.monotonic() - t0
            out = r.stdout.encode() if isinstance(r.stdout, str) else r.stdout
            what = ("right" if out == ref.stdout else "WRONG") if r.returncode == 0 else \
                f"killed (status {r.returncode})"
            bad += r.returncode == 0 and out != ref.stdout
            print(f"Linux swap at {lim} (memory cgroup v{cgroup}): {wall:.2f} s, {what}, "
                  f"{r.cg_pgmajfault or r.majflt} major faults", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
