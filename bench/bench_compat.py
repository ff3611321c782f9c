#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The compatibility matrix on large data (issue 19, docs/compatibility.md): Redis with
redis-benchmark and its BGSAVE snapshot, memcached with memcslap (its cache in one block, and
memcached-heaps: in glibc's heaps of its threads), NumPy and a multiprocessing
pool, SQLite with a paged page cache (in one block, and sqlite-heap: a small block per page in
glibc's main heap), PostgreSQL as its own user (a sort, a hash aggregate and a
hash join in one backend's work_mem), system calls into evicted buffers, xz's match finder
(random rewrites) and GNU sort (stdio into a paged buffer), each checking its own results (bench/lib/compat.py), under

    farmem   farmem run --local 25%                 (the pager)
    kswap    farmem run --mode kswap --local 25%    (Linux swap, zram, the same share of the same
                                                    mappings as the cgroup limit, plus 64 MiB for
                                                    the rest of the process)
    local    no limit                               (the reference for slowdowns)
    farmem-thread  farmem run --fault thread --local 25%  (every fault served by handler threads)
    farmem-signal  farmem run --fault signal --local 25%  (every fault served in the faulting thread)

side by side, one workload at a time in all modes before the next. Needs root (kswap) and the
packages of tools/deps.sh; a timing run belongs on a quiet machine.

    python3 bench/bench_compat.py [--modes farmem,kswap,local] [--only redis,sqlite] [--scale 1]
                                  [--local 25%] [--json results.json]
                                  [--taskset CPUS] [--farmem-args "--fill-spin 0"]

--taskset runs every `farmem run` (its memd and the program with it) on those CPUs only, to see what
passing faults between CPUs costs; --farmem-args adds flags to every `farmem run`.

--scale multiplies every data size (0.05 runs the whole matrix in a few minutes, as a functional
check). Prints one line per run as it ends, then the table: whether the result was right, wall
seconds, the workload's own figure (redis-benchmark requests per second, memcslap seconds, ...),
page traffic (farmem: evictions and remote reads; kswap: pages swapped out and in) and the limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import compat  # noqa: E402

# Sizes at --scale 1: well past the 25% budget on a 24 GiB, 2-core machine, minutes per run.
SIZES = {
    "redis": lambda s: dict(keys=int(1_000_000 * s), requests=int(1_000_000 * s), keyspace=int(500_000 * s)),
    "redis-bgsave": lambda s: dict(keys=int(1_000_000 * s)),
    "memcached": lambda s: dict(megabytes=max(256, int(4096 * s)), items=int(800_000 * s), slap=int(200_000 * s)),
    "memcached-heaps": lambda s: dict(megabytes=max(256, int(4096 * s)), items=int(800_000 * s), slap=int(200_000 * s)),
    "postgres": lambda s: dict(rows=max(100_000, int(10_000_000 * s))),
    "numpy": lambda s: dict(mib=max(16, int(1024 * s))),
    "numpy-pool": lambda s: dict(mib=max(16, int(1024 * s)), timeout=max(60.0, 600 * s)),
    "openmpi": lambda s: dict(mib=max(16, int(256 * s))),
    "sqlite": lambda s: dict(rows=int(2_000_000 * s)),
    "sqlite-heap": lambda s: dict(rows=int(2_000_000 * s)),
    "sysio": lambda s: dict(mib=max(16, int(512 * s))),
    # Random rewrites over about 10x the input, for every input byte: the slowest to page.
    "xz": lambda s: dict(mib=max(2, int(32 * s))),
    "sort": lambda s: dict(mib=max(8, int(512 * s))),
    "php": lambda s: dict(n=max(100_000, int(6_000_000 * s))),
    "erlang": lambda s: dict(n=max(50_000, int(1_000_000 * s))),
    "sbcl": lambda s: dict(n=max(50_000, int(1_000_000 * s))),
    "yrmcds": lambda s: dict(items=max(20_000, int(400_000 * s))),
    "prolog": lambda s: dict(n=max(50_000, int(300_000 * s))),
    "node": lambda s: dict(n=max(100_000, int(1_000_000 * s))),
    "fio": lambda s: dict(mib=max(64, int(1024 * s))),
    "fio-uring": lambda s: dict(mib=max(64, int(1024 * s))),
    "fio-posixaio": lambda s: dict(mib=max(64, int(1024 * s))),
}
# jemalloc maps its heap in steps from 2 MiB up: below 64 MiB a Redis heap is mostly in small steps.
# The others: so that a small --scale still pages (their big blocks are below 64 MiB there).
THRESHOLD = {"openmpi": "1M", "postgres": "8M", "redis": "4M", "redis-bgsave": "4M", "sysio": "8M", "numpy": "8M", "numpy-pool": "8M", "xz": "1M", "sort": "1M", "php": "1M",
             "erlang": "1M", "sbcl": "1M", "prolog": "1M", "yrmcds": "1M",
             "fio": "1M", "fio-uring": "1M", "fio-posixaio": "1M"}
# Modes beside the three: farmem with every fault served by handler threads, or in the faulting thread
# (fio links libaio, which gets it handler threads by default).
FARMEM_MODES = {"farmem": [], "farmem-thread": ["--fault", "thread"], "farmem-signal": ["--fault", "signal"]}


def figure(name: str, got: dict) -> str:
    if name == "redis":
        return " ".join(f"{k} {v:,.0f}/s" for k, v in got["rps"].items())
    if name == "redis-bgsave":
        return f"BGSAVE {got['save_s']:.1f} s, {got['rdb_bytes'] >> 20} MiB"
    if name.startswith("memcached"):
        return f"memcslap set {got['memcslap_set_s']:.1f} s, get {got['memcslap_get_s']:.1f} s"
    if name == "postgres":
        return "sort {}, aggregate {}, join {} s".format(*got["query_s"])
    if name == "xz":
        return f"archive {got['ratio']:.0%} of the input"
    if name.startswith("sqlite"):
        return f"db {got['db_bytes'] >> 20} MiB, cache overflow {got['pcache_overflow']}"
    return ""


def traffic(mode: str, s: dict | None) -> str:
    if not s:
        return ""
    if mode == "kswap":
        return f"{s.get('evictions', 0):,} out, {s.get('remote_reads', 0):,} in"
    return f"{s.get('evictions', 0):,} evicted, {s.get('remote_reads', 0):,} remote reads"


def limit(s: dict | None) -> str:
    if not s:
        return ""
    b = s.get("cgroup_limit_bytes") or s.get("local_limit_bytes") or 0
    return f"{b / (1 << 20):,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="farmem,kswap,local")
    ap.add_argument("--only", default=",".join(compat.WORKLOADS))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--local", default="25%", help="budget for farmem and kswap (default 25%%)")
    ap.add_argument("--json", help="write every run's record here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--taskset", help="run every command on these CPUs (taskset -c), e.g. 0")
    ap.add_argument("--farmem-args", default="", help="more flags for every farmem run, e.g. '--fill-spin 0'")
    a = ap.parse_args()
    modes = a.modes.split(",")
    names = a.only.split(",")
    unknown = [n for n in names if n not in compat.WORKLOADS] + [m for m in modes if m not in (*FARMEM_MODES, "kswap", "local")]
    if unknown:
        ap.error(f"unknown: {', '.join(unknown)} (workloads: {', '.join(compat.WORKLOADS)})")
    records = []
    for name in names:
        for mode in modes:
            launch = compat.Launch(mode="farmem" if mode in FARMEM_MODES else mode, local=a.local,
                                   threshold=THRESHOLD.get(name),
                                   extra=FARMEM_MODES.get(mode, []) + a.farmem_args.split())
            if a.taskset:
                launch.farmem = ["taskset", "-c", a.taskset, *launch.farmem]
            work = Path(tempfile.mkdtemp(prefix=f"compat-{name}-{mode}-", dir="/tmp"))
            kw = SIZES[name](a.scale)
            if name == "sysio" and mode not in FARMEM_MODES:
                kw["expect_evicted"] = 0  # mincore's figure is printed; only the pager is held to it
            t0 = time.monotonic()
            rec = {"workload": name, "mode": mode, "args": kw}
            try:
                got = compat.WORKLOADS[name](launch, work, **kw)
                rec.update(ok=True, result=got)
            except compat.Failed as e:
                rec.update(ok=False, error=str(e).strip().splitlines()[0][:300])
            except Exception as e:  # a crash of the driver is a result too: the matrix goes on
                rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            rec["wall_s"] = round(time.monotonic() - t0, 2)
            records.append(rec)
            print(f"bench_compat: {name} {mode}: {'ok' if rec['ok'] else 'FAILED: ' + rec['error']} "
                  f"({rec['wall_s']:.1f} s)", flush=True)
            if not a.keep:
                shutil.rmtree(work, ignore_errors=True)
    rows = [("workload", "mode", "result", "wall s", "figure", "pages", "limit")]
    for r in records:
        got = r.get("result") or {}
        s = got.get("summary")
        rows.append((r["workload"], r["mode"], "ok" if r["ok"] else "FAILED", f"{r['wall_s']:.1f}",
                     figure(r["workload"], got) if r["ok"] else r["error"][:80], traffic(r["mode"], s), limit(s)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
