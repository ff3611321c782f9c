#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What growing paged memory costs: Python's mmap.resize (mremap with MREMAP_MAYMOVE) growing an
anonymous map whose pages are mostly in memd (--workload resize), and a Python bytearray grown by
appending 1 MiB at a time (--workload bytearray: CPython reallocs it, and the shim's realloc of a
big block), without farmem, under Linux swap at the same budget (`farmem run --mode kswap`), under
farmem, and under an earlier build of farmem given with --before (a build directory, e.g. a
worktree's build/ made with `make c`).

    python3 bench/bench_remap.py [--workload resize|bytearray] [--mib 256] [--grows 4]
                                 [--step-mib 16 | --step-kib 4] [--local 32M] [--times 3]
                                 [--before /tmp/wprev/build] [--json out.json]

resize writes every page of a --mib map, grows it --grows times by --step-mib (or --step-kib), then checks every
page (its number in its first word, zeros in what was added). bytearray appends --mib chunks of
1 MiB, each with its number in its last byte, then checks them. Each reports the time of the
growing alone and the process's peak resident size (ru_maxrss); farmem's summary gives the
pager's own peak resident size and the pages read from and written to memd over the whole run.
Runs interleave, --times rounds; the median is reported. Prints the commands, one line per run,
then a markdown table. Timings belong on a quiet machine.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RESIZE = r"""
import json, mmap, resource, sys, time
n, grows, step = int(sys.argv[1]) << 20, int(sys.argv[2]), int(sys.argv[3]) << 10
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, n, 4096):
    m[i:i + 8] = (i // 4096).to_bytes(8, "little")
t = time.perf_counter()
for k in range(1, grows + 1):
    m.resize(n + k * step)
grow_s = time.perf_counter() - t
if any(int.from_bytes(m[i:i + 8], "little") != i // 4096 for i in range(0, n, 4096)):
    sys.exit("remap workload: a page lost its bytes")
if any(m[i:i + 8] != bytes(8) for i in range(n, len(m), 4096)):
    sys.exit("remap workload: the grown part is not zero")
print(json.dumps({"grow_ms": grow_s * 1e3, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}))
"""

BYTEARRAY = r"""
import json, resource, sys, time
n = int(sys.argv[1])
chunk = bytes(range(256)) * 4096
t = time.perf_counter()
b = bytearray()
for i in range(n):
    b += chunk
    b[-1] = i & 255
grow_s = time.perf_counter() - t
if len(b) != n << 20 or any(b[((i + 1) << 20) - 1] != i & 255 or b[i << 20] != 0 for i in range(n)):
    sys.exit("bytearray workload: a chunk lost its bytes")
print(json.dumps({"grow_ms": grow_s * 1e3, "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}))
"""

WORKLOADS = {"resize": RESIZE, "bytearray": BYTEARRAY}


def run(cmd: list, env: dict | None = None) -> dict:
    print("$", (" ".join(f"{k}={v}" for k, v in (env or {}).items()) + " " if env else "") + shlex.join(cmd),
          flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        sys.exit(f"bench: {cmd[0]} failed (status {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="resize", choices=tuple(WORKLOADS))
    ap.add_argument("--mib", type=int, default=256, help="the map's first size, or the bytearray's, MiB")
    ap.add_argument("--grows", type=int, default=4)
    ap.add_argument("--step-mib", type=int, default=16, help="each growth, MiB")
    ap.add_argument("--step-kib", type=int, help="each growth, KiB (instead of --step-mib)")
    ap.add_argument("--local", default="32M", help="farmem's local budget")
    ap.add_argument("--times", type=int, default=3, help="rounds (the median is reported)")
    ap.add_argument("--before", help="an earlier farmem build directory to compare with")
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    step_kib = a.step_kib if a.step_kib else a.step_mib << 10
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / f"{a.workload}.py"
        work.write_text(WORKLOADS[a.workload])
        prog = [sys.executable, str(work), str(a.mib), str(a.grows), str(step_kib)]
        configs = {"without farmem": None, "Linux swap": "kswap", "farmem": {}}
        if a.before:
            configs["farmem before"] = {"FARMEM_BUILD": a.before}
        res: dict = {name: [] for name in configs}
        for rnd in range(a.times):
            for name, env in configs.items():
                if env is None:
                    res[name].append(run(prog))
                    continue
                if env == "kswap":
                    res[name].append(run([str(REPO / "farmem"), "run", "--mode", "kswap", "--local", a.local, "--",
                                          *prog]))
                    continue
                out = Path(tmp) / f"s{rnd}.json"
                got = run([str(REPO / "farmem"), "run", "--local", a.local, "--summary-json", str(out), "--", *prog],
                          env)
                s = json.loads(out.read_text())
                got.update(peak_resident_mib=s["peak_resident_bytes"] / 2**20, remote_reads=s["remote_reads"],
                           remote_writes=s["remote_writes"])
                res[name].append(got)
                print("  ", json.dumps(got), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    what = (f"mmap.resize of a {a.mib} MiB anonymous map (every page written), {a.grows} grows of {step_kib} KiB"
            if a.workload == "resize" else f"a bytearray grown to {a.mib} MiB, 1 MiB at a time")
    print(f"\n{what}; farmem and Linux swap at --local {a.local}; median of {a.times}\n")
    print("| run | grows, ms | ru_maxrss, MiB | pager's peak resident, MiB | remote reads | remote writes |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in res.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        far = ["-"] * 3
        if "peak_resident_mib" in runs[0]:
            far = [f"{med['peak_resident_mib']:.0f}", str(int(med["remote_reads"])), str(int(med["remote_writes"]))]
        print(f"| {name} | {med['grow_ms']:.1f} | {med['maxrss_mib']:.0f} | {' | '.join(far)} |")


if __name__ == "__main__":
    main()
