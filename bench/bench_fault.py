#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a fault costs the machine (issue 16): wall time and, system-wide, the
cross-CPU IPIs, context switches, system calls and TLB flushes that go with it,
for the same workload all local, under Linux swap (zram, a memory cgroup at the
same limit) and under farmem (this checkout, and optionally another one:
--before DIR, the farmem of an older checkout, built). Interleaved: every
repeat runs each configuration once, in a rotating order.

Workloads (--workloads):
  rewrite1, rewrite2, rewrite8   build/bench/rewrite --size SIZE --threads N: random pages
                                 checked and half of them rewritten, then a full check,
                                 at LOCAL (default 1/8 of SIZE)
  rewrite1-heap, rewrite8-heap   the same in 1 MiB malloc blocks: glibc's heap, whose faults
                                 a handler thread serves (the kernel waits for them)
  faultlat                       build/bench/faultlat --pattern random (read-only: every
                                 access a fault); its p50 beside uffd_floor --pin same
  loop1, loop8                   build/bench/rewrite --mode fit --size SIZE --threads N: every
                                 page checked and rewritten in order, four rounds and a full
                                 check, at 3/4 of SIZE local (a loop a third larger than its
                                 budget: Linux swap reads every page back every round)
  fitc                           build/bench/rewrite --mode fit: a C program whose memory
                                 fits the budget (256 MiB at a 512 MiB budget)
  fitjvm                         the H2 workload, -Xmx1g, 50% local: a JVM whose heap fits
                                 its budget, with the default discard

Configurations (--configs): local, swap, farmem, farmem-thread (fault=thread), before
and before-thread (the checkout of --before, fault=signal and fault=thread). Every figure is the median over the repeats; counts are per fault
(faults: farmem's own count of faults it served, missing plus write-protect; for swap
and local the kernel's major faults of the run), TLB flushes per evicted page.

    .venv/bin/python bench/bench_fault.py [--repeats 3] [--workloads rewrite1,rewrite8]
        [--configs local,swap,farmem] [--before /work/base] [--out bench/RESULTS.md]

Take it on an idle machine: load keeps both CPUs awake and hides the cross-CPU
cost this measures.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # not run from .venv: use this checkout's sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import swap  # noqa: E402

EVENTS = {
    "ipi_single": "irq_vectors:call_function_single_entry",
    "ipi_multi": "irq_vectors:call_function_entry",
    "cs": "context-switches",
    "syscalls": "raw_syscalls:sys_enter",
    "tlb": "tlb:tlb_flush",
    "pf": "page-faults",
}
MiB = 1 << 20


def workload(name: str, size: int) -> dict:
    """argv (relative to a checkout), the local budget, and what to parse."""
    if name.startswith("rewrite"):
        rest = name[len("rewrite"):]
        heap = ["--heap"] if rest.endswith("-heap") else []
        threads = int(rest.removesuffix("-heap") or "1")
        return {"argv": ["build/bench/rewrite", "--size", f"{size // MiB}M", "--threads", str(threads), "--json"] + heap,
                "local": size // 8, "kind": "rewrite"}
    if name.startswith("loop"):
        threads = int(name[len("loop"):] or "1")
        return {"argv": ["build/bench/rewrite", "--mode", "fit", "--size", f"{size // MiB}M", "--threads", str(threads),
                         "--rounds", str(4 * size // 4096), "--json"],
                "local": size // 4 * 3, "kind": "rewrite"}
    if name == "faultlat":
        return {"argv": ["build/bench/faultlat", "--size", f"{size // MiB}M", "--pattern", "random", "--json"],
                "local": size // 8, "kind": "faultlat"}
    if name == "fitc":
        return {"argv": ["build/bench/rewrite", "--mode", "fit", "--size", "256M", "--rounds", "400000", "--json"],
                "local": 512 * MiB, "kind": "rewrite"}
    if name == "fitjvm":
        cp = "build/java:build/java/thirdparty/h2.jar"
        return {"argv": ["java", "-Xmx1g", "-cp", cp, "H2Workload", "--rows", "600000", "--rounds", "3000"],
                "local": "50%", "kind": "jvm", "swap_local": 512 * MiB}
    raise SystemExit(f"bench_fault: unknown workload {name}")


def perf_argv(out: str) -> list[str]:
    argv = ["perf", "stat", "-a", "-x,", "-o", out]
    for ev in EVENTS.values():
        argv += ["-e", ev]
    return argv + ["--"]


def read_perf(path: str) -> dict:
    got = {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 3 or not parts[0].replace(".", "").isdigit():
                continue
            for key, ev in EVENTS.items():
                if parts[2] == ev:
                    got[key] = float(parts[0])
    return got


def farmem_cmd(checkout: str, local, argv: list[str], summary: str, fault: str | None) -> tuple[list[str], dict]:
    env = dict(os.environ)
    env.pop("FARMEM_FAULT", None)
    if fault:
        env["FARMEM_FAULT"] = fault
    loc = local if isinstance(local, str) else f"{local // MiB}M"
    return [os.path.join(checkout, "farmem"), "run", "--local", loc, "--summary-json", summary, "--"] + argv, env


def run_one(cfg: str, wl: dict, args, tmp: str) -> dict:
    perf_out = os.path.join(tmp, "perf.txt")
    summary = os.path.join(tmp, "summary.json")
    for f in (perf_out, summary):
        if os.path.exists(f):
            os.unlink(f)
    checkout = args.before if cfg.startswith("before") else ROOT
    argv = [os.path.join(checkout, a) if a.startswith("build/") else a for a in wl["argv"]]
    argv = [a.replace("build/java", os.path.join(checkout, "build/java")) if "build/java" in a and not a.startswith("/") else a
            for a in argv]
    res: dict = {}
    t0 = time.monotonic()
    if cfg == "swap":
        limit = wl.get("swap_local", wl["local"])
        with swap.SwapEnv(limit_bytes=limit) as env:
            r = env.run(perf_argv(perf_out) + argv, timeout=args.timeout)
        out, status = r.stdout, r.returncode
        res["faults"] = r.cg_pgmajfault or r.majflt
    else:
        if cfg == "local":
            cmd, env = perf_argv(perf_out) + argv, None
        else:
            fcmd, env = farmem_cmd(checkout, wl["local"], argv, summary, "thread" if cfg.endswith("-thread") else None)
            cmd = perf_argv(perf_out) + fcmd
        p = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=args.timeout)
        out, status = p.stdout, p.returncode
        if status:
            sys.stderr.write(p.stderr[-2000:])
    res["wall_s"] = time.monotonic() - t0
    res["status"] = status
    if status != 0:
        raise SystemExit(f"bench_fault: {cfg} failed with status {status}")
    res.update(read_perf(perf_out))
    if os.path.exists(summary):
        with open(summary) as f:
            s = json.load(f)
        res["faults"] = s.get("faults", 0) + s.get("wp_faults", 0)
        res["evictions"] = s.get("evictions", 0)
        res["fault_p50_us"] = s.get("fault_p50_us")
    if wl["kind"] in ("rewrite", "faultlat"):
        for line in out.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                res["work_s"] = j.get("total_s") or j.get("pass_wall_s")
                if "fault_p50_us" in j:
                    res["p50_us"] = j["fault_p50_us"]
    return res


def floor_p50(size: int) -> float | None:
    p = subprocess.run([os.path.join(ROOT, "build/bench/uffd_floor"), "--size", f"{size // MiB}M", "--pattern", "random",
                        "--pin", "same", "--json"], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line).get("fault_p50_us")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="rewrite1,rewrite2,rewrite8,faultlat,fitc,fitjvm")
    ap.add_argument("--configs", default="local,swap,farmem")
    ap.add_argument("--before", help="another checkout (built) whose farmem runs as config 'before'")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", help="append the table to this file")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    size = swap.parse_size(args.size)
    configs = args.configs.split(",")
    if args.before and not any(c.startswith("before") for c in configs):
        configs.append("before")
    if not shutil.which("perf"):
        raise SystemExit("bench_fault: needs perf (linux-perf)")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name in args.workloads.split(","):
                wl = workload(name, size)
                order = configs[rep % len(configs):] + configs[:rep % len(configs)]
                for cfg in order:
                    r = run_one(cfg, wl, args, tmp)
                    results.setdefault(name, {}).setdefault(cfg, []).append(r)
                    print(f"# {name} {cfg} rep {rep}: {json.dumps(r)}", file=sys.stderr, flush=True)
        floor = floor_p50(size) if "faultlat" in args.workloads else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    lines = [f"`{' '.join(sys.argv)}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{platform.node()}, {os.cpu_count()} CPUs, load before: {os.getloadavg()[0]:.2f})", "",
             "| workload | config | wall s | × local | × swap | faults | IPIs/fault | cs/fault | syscalls/fault | TLB flushes/evicted page | p50 µs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, by_cfg in results.items():
        med = {c: {k: statistics.median([r[k] for r in runs if r.get(k) is not None] or [0]) for k in
                   ("wall_s", "faults", "ipi_single", "ipi_multi", "cs", "syscalls", "tlb", "evictions", "p50_us", "work_s")}
               for c, runs in by_cfg.items()}
        for c, m in med.items():
            per = m["faults"] or 0
            ipis = m["ipi_single"] + m["ipi_multi"]
            f = (lambda v: f"{v / per:.3f}" if per else "–")
            xl = f"{m['wall_s'] / med['local']['wall_s']:.2f}" if "local" in med else "–"
            xs = f"{m['wall_s'] / med['swap']['wall_s']:.2f}" if "swap" in med else "–"
            tlb = f"{m['tlb'] / m['evictions']:.3f}" if m.get("evictions") else "–"
            p50 = f"{m['p50_us']:.2f}" if m.get("p50_us") else "–"
            lines.append(f"| {name} | {c} | {m['wall_s']:.2f} | {xl} | {xs} | {per:.0f} | {f(ipis)} | {f(m['cs'])} | "
                         f"{f(m['syscalls'])} | {tlb} | {p50} |")
    if floor:
        lines.append(f"\nuffd floor (handler on the same CPU, `uffd_floor --pin same`): p50 {floor:.2f} µs")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
