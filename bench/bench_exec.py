#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the preload shim costs a process that never pages anything: CPU time of one exec of
/bin/true, bare and with build/lib/libfarmem_preload.so in LD_PRELOAD (as `farmem run` puts it
into every process it starts: shells, launchers, helpers). perf stat's task-clock (CPU time,
which a loaded machine disturbs less than wall time), alternating bare and shim.

    python3 bench/bench_exec.py [--runs 300] [--rounds 3] [--shim PATH]...

--shim may be given several times (e.g. an older build) to compare shims in the same run.
Prints one line per measurement, then the figure as one line of JSON (ms per exec, medians).
"""

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def task_clock_ms(runs: int, preload: str) -> float:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    r = subprocess.run(["perf", "stat", "-r", str(runs), "-x", ",", "-e", "task-clock", "/bin/true"],
                       env=env, capture_output=True, text=True, check=True)
    line = next(x for x in r.stderr.splitlines() if "task-clock" in x)
    return float(line.split(",")[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="execs per perf stat")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shim", action="append", help="preload library (default: this build's)")
    a = ap.parse_args()
    shims = a.shim or [str(REPO / "build/lib/libfarmem_preload.so")]
    for s in shims:
        if not Path(s).is_file():
            raise SystemExit(f"bench: no {s}: run make first")
    got = {"bare": []} | {s: [] for s in shims}
    for rnd in range(a.rounds):
        for name in got:
            ms = task_clock_ms(a.runs, "" if name == "bare" else name)
            got[name].append(ms)
            print(f"round {rnd + 1}: {name}: {ms:.3f} ms per exec", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(json.dumps({"ms_per_exec": med,
                      "shim_overhead_ms": {s: med[s] - med["bare"] for s in shims}}))


if __name__ == "__main__":
    main()
