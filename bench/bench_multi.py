#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Scale-out (issue 8): paging throughput with 1, 2 and 4 memd servers, and what R=2 costs
against R=1, as ratios to one memd.

Every configuration runs build/tests/pagetest (--size SIZE --threads 8 --rounds 1) under
`./farmem run --local 25% --memd A[,B...] --replicas R`, with the memd servers started here
on 127.0.0.1 (TCP over loopback, stream transport in every configuration, a single memd
included, so that the only difference is the number of servers and of copies). Throughput
is pages moved to and from memd per second of the run: (remote reads + remote writes) /
elapsed, from the run's summary. Configurations rotate every repeat; each figure is the
median over the repeats. On one machine the servers share its CPUs with the workload: the
figures say what spreading and copying cost the client, not what more hosts would add.

    .venv/bin/python bench/bench_multi.py [--size 256M] [--repeats 3] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEMD = REPO / "build" / "bin" / "farmem-memd"
PAGETEST = REPO / "build" / "tests" / "pagetest"
CONFIGS = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2)]  # (servers, replicas)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_memds(n: int, secret_file: Path, logdir: Path) -> list:
    procs = []
    for i in range(n):
        port = free_port()
        log = open(logdir / f"memd{i}.log", "w")
        p = subprocess.Popen([str(MEMD), "--listen", f"127.0.0.1:{port}", "--secret-file", str(secret_file),
                              "--capacity", "2G"], stdout=log, stderr=subprocess.STDOUT)
        p.addr = f"127.0.0.1:{port}"
        procs.append(p)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise SystemExit(f"memd on port {port} did not start")
                time.sleep(0.05)
    return procs


def run_one(size: str, memds: list, replicas: int, secret_file: Path, tmp: Path) -> dict:
    summary = tmp / "summary.json"
    argv = [str(REPO / "farmem"), "run", "--local", "25%", "--transport", "stream",
            "--memd", ",".join(p.addr for p in memds), "--secret-file", str(secret_file),
            "--replicas", str(replicas), "--summary-json", str(summary), "--",
            str(PAGETEST), "--size", size, "--threads", "8", "--rounds", "1"]
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - t
    if r.returncode != 0 or "pagetest: OK" not in r.stdout + r.stderr:
        raise SystemExit(f"run failed ({r.returncode}):\n{r.stderr[-2000:]}")
    s = json.loads(summary.read_text())
    moved = s["remote_reads"] + s["remote_writes"]
    return {"elapsed": elapsed, "moved": moved, "pages_per_s": moved / s["elapsed_s"],
            "p99_us": s["fault_p99_us"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="append the table to this file (bench/RESULTS.md)")
    args = ap.parse_args()
    for f in (MEMD, PAGETEST):
        if not f.exists():
            raise SystemExit(f"{f} is missing: run make first")
    results = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="fm-bench-multi-") as td:
        tmp = Path(td)
        secret_file = tmp / "secret"
        secret_file.write_text("bench-multi-secret\n")
        for rep in range(args.repeats):
            order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
            for servers, replicas in order:
                memds = start_memds(servers, secret_file, tmp)
                try:
                    res = run_one(args.size, memds, replicas, secret_file, tmp)
                finally:
                    for p in memds:
                        p.terminate()
                        p.wait(timeout=10)
                results[(servers, replicas)].append(res)
                print(f"  rep {rep}: {servers} memd R={replicas}: {res['pages_per_s']:.0f} pages/s, "
                      f"{res['elapsed']:.1f} s", file=sys.stderr)
    med = {c: statistics.median(r["pages_per_s"] for r in results[c]) for c in CONFIGS}
    p99 = {c: statistics.median(r["p99_us"] for r in results[c]) for c in CONFIGS}
    base = med[(1, 1)]
    lines = [
        f"pagetest --size {args.size} --threads 8 --rounds 1 under farmem run --local 25% "
        f"--transport stream, memd on 127.0.0.1; median of {args.repeats}",
        "",
        "| memd servers | R=1 pages/s | R=1 vs 1 memd | R=2 pages/s | R=2 vs 1 memd | R=2 / R=1 | fault p99 us (R=1 / R=2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in (1, 2, 4):
        r1 = med[(n, 1)]
        r2 = med.get((n, 2))
        lines.append(
            f"| {n} | {r1:.0f} | {r1 / base:.2f} | "
            + (f"{r2:.0f} | {r2 / base:.2f} | {r2 / r1:.2f} | {p99[(n, 1)]:.0f} / {p99[(n, 2)]:.0f} |"
               if r2 else f"- | - | - | {p99[(n, 1)]:.0f} / - |"))
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(f"\n## Scale-out: several memd servers, R=1 and R=2 (bench/bench_multi.py)\n\n"
                    f"`{' '.join(sys.argv)}` on {os.uname().nodename}, {os.cpu_count()} CPUs, "
                    f"{datetime.date.today()}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
