#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What starting a program costs a process with much of its memory in memd (issue 19): wall time
per spawn of posix_spawn against fork+exec, from a process holding a 512 MiB buffer (every page
written), under farmem at 64 MiB local and without farmem.

    python3 bench/bench_spawn.py [--mib 512] [--local 64M] [--times 21] [--fault signal]
                                 [--json out.json]

The workload is build/tests/spawntest (make first): per method it starts --times children
running /bin/false and prints the median time in the spawning call (call: fork() includes
farmem's bring-home of everything in memd, uffd/fork.c) and until the child was reaped (total).
Under farmem it waits for the pager to be back at its budget before every spawn, so each one
finds the buffer mostly in memd, and counts the forks and the pages each brought home. Without
farmem the buffer is all resident and fork() copies its page tables. Prints the commands, one
line per run, then a markdown table. Timings belong on a quiet machine.
"""

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROG = REPO / "build/tests/spawntest"
METHODS = ("posix_spawn", "fork_exec")


def run(cmd: list) -> dict:
    print("$", shlex.join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or "spawntest: all ok" not in r.stdout:
        sys.exit(f"bench: {cmd[0]} failed (status {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    got = {d["method"]: d for d in (json.loads(x) for x in r.stdout.splitlines() if x.startswith("{"))}
    for m in METHODS:
        print(f"  {m}: {json.dumps(got[m])}", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512, help="the buffer, MiB")
    ap.add_argument("--local", default="64M", help="farmem's local budget")
    ap.add_argument("--times", type=int, default=21, help="spawns per method (the median is reported)")
    ap.add_argument("--fault", default="signal", choices=("signal", "thread"))
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    if not PROG.is_file():
        sys.exit(f"bench: no {PROG}: run make first")
    prog = [str(PROG), "--mib", str(a.mib), "--times", str(a.times), *METHODS]
    res = {
        "without farmem": run(prog),
        "farmem": run([str(REPO / "farmem"), "run", "--local", a.local, "--fault", a.fault, "--", *prog]),
    }
    print(f"\nspawn of /bin/false from a process with {a.mib} MiB written; farmem at --local {a.local}, "
          f"--fault {a.fault}; median of {a.times} spawns (ms)\n")
    print("| method | without farmem: call | total | farmem: call | total | forks | pages brought home per spawn |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in METHODS:
        b, f = res["without farmem"][m], res["farmem"][m]
        print(f"| {m} | {b['call_us'] / 1e3:.2f} | {b['total_us'] / 1e3:.2f} | {f['call_us'] / 1e3:.2f} "
              f"| {f['total_us'] / 1e3:.2f} | {f['forks']} | {f['fork_pages_fetched'] / f['spawns']:.0f} |")
    print(f"\ncommand: python3 bench/bench_spawn.py {shlex.join(sys.argv[1:])}".rstrip())
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
