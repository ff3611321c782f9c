#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Full-GC pause with large objects: SwapVA compaction vs copying (issue 7; docs/patched-jdk.md).

tests/java/LargeArrays.java (arrays of --min-kb..--max-kb, a fraction replaced every round, then
System.gc(), a full GC in G1, then every element checked) runs under `./farmem run --local PCT`
with the farmem JDK in two configurations, alternating, side by side in one run:

  copy     the farmem JDK as it is (G1's full GC copies every object)
  swapva   the same JDK with `--gc swapva` (-XX:+UseFarmemSwapVA: the whole pages of objects of
           the threshold or more move through the pager, fm_pager_move, instead of being copied)
  swapva-rw  swapva with FARMEM_MEMD_COPY=0: the pager reads each moved remote page from memd and
           writes it back, instead of memd copying it (COPY); what it does with an older memd

With --tcp the script starts one farmem-memd on 127.0.0.1 (a port the kernel picks) and every run
uses it over TCP (`--memd tcp:... --transport stream`), where COPY keeps moved remote pages' bytes
off the wire; without it `farmem run` starts its private memd and the pager takes shared memory.

Reported per configuration: the full-GC pauses (-Xlog:gc "Pause Full"), G1's compaction phase
(-Xlog:gc+phases "Phase 4: Compact heap"), the GC threads' faults, remote reads and writes, the
pages fm_pager_move moved by UFFDIO_MOVE and the remote pages it moved inside memd. Figures are medians over rounds, then over --repeats.

    .venv/bin/python bench/bench_swapva_gc.py [--local 25,100] [--repeats 2] [--rounds 6]
        [--heap 1g] [--arrays 250] [--configs copy,swapva] [--tcp] [--json raw.json]

Needs `make all` and `make jdk`.

--direct runs the JVM without farmem run (no memd, no pager: all local), the agent loaded with
onerror=continue only to provide farmem_swapva_move, which then goes through libswapva and its
backend (--backend sets SWAPVA_BACKEND, e.g. kmod for the module). The qemu lane's swapvagc group
runs it in the guest (tests/vm/guest.sh, docs/vm-lane.md); the agent's exit line says how many
pages each libswapva backend moved, and a swapva run whose pages did not all go through the
requested backend counts as failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAUSE_FULL = re.compile(r"Pause Full \(System\.gc\(\)\) \S+->\S+\(\S+\) ([\d.]+)ms")
REFUSED = re.compile(r"copied instead: \d+ overlapping, \d+ unaligned, (\d+) refused")
PHASE4 = re.compile(r"Phase 4: Compact heap ([\d.]+)ms")
DESCRIBE = re.compile(r"SwapVA: full GCs move objects of (\d+) bytes or more by pages \(([^)]*)\)")
LIBSWAPVA = re.compile(r"SwapVA via libswapva \(([^)]*)\): (\d+) calls; pages moved by kmod (\d+), uffd (\d+), memmove (\d+)")
SWAPVA = re.compile(r"SwapVA: (\d+) objects moved by pages \((\d+) pages, (\d+) calls, (\d+) in chunks, ([\d.]+) ms\)")


def farmem_jdk() -> str:
    r = subprocess.run(["bash", os.path.join(ROOT, "hotspot", "build.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bench_swapva_gc: the farmem JDK does not build (make jdk):\n" + r.stderr[-2000:])
    return r.stdout.strip().splitlines()[-1]


def run_direct(args, config: str, jdk: str, workdir: str, rep: int) -> dict:
    gclog = os.path.join(workdir, f"gc-{config}-direct-{rep}.log")
    flag = ["-XX:+UseFarmemSwapVA"] if config == "swapva" else []
    # -XX:+UseG1GC: a 2-CPU guest with less than 2 GiB is not a "server class machine" (Serial GC)
    cmd = [os.path.join(jdk, "bin", "java"), f"-agentpath:{args.agent}=onerror=continue", *flag, "-XX:+UseG1GC",
           f"-Xmx{args.heap}", f"-Xms{args.heap}", "-XX:G1HeapRegionSize=8m",
           f"-Xlog:gc,gc+phases,gc+farmem:file={gclog}", "-cp", args.classes,
           "LargeArrays", "--arrays", str(args.arrays), "--rounds", str(args.rounds), "--min-kb", str(args.min_kb),
           "--max-kb", str(args.max_kb), "--seed", str(rep + 1)]
    env = dict(os.environ)
    if args.backend:
        env["SWAPVA_BACKEND"] = args.backend
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    rec = {"config": config, "local": 100, "rep": rep, "status": r.returncode,
           "elapsed_s": round(time.monotonic() - t0, 2)}
    if r.returncode != 0 or "largearrays: ok" not in r.stdout:
        rec["error"] = (r.stdout + r.stderr).strip().splitlines()[-6:]
        return rec
    log = open(gclog).read()
    parse_gclog(rec, log)
    d = DESCRIBE.search(log)
    rec["backend"] = d.group(2) if d else None
    m = LIBSWAPVA.search(r.stderr)
    if m:
        rec.update({"lib_calls": int(m.group(2)), "pages_kmod": int(m.group(3)), "pages_uffd": int(m.group(4)),
                    "pages_memmove": int(m.group(5))})
    if config == "swapva":
        # the requested backend moved every page the JVM counted, and the JVM copied nothing it meant to move
        want = {"kmod": "pages_kmod", "uffd": "pages_uffd"}.get(args.backend or "")
        if not rec["pages_moved_log"] or (want and rec.get(want) != rec["pages_moved_log"]) or rec["refused"]:
            rec["error"] = [f"backend {rec['backend']}: JVM pages {rec['pages_moved_log']}, refused {rec['refused']}, "
                            f"libswapva {m.group(0) if m else 'no report'}"]
    return rec


def parse_gclog(rec: dict, log: str) -> None:
    pauses = [float(x) for x in PAUSE_FULL.findall(log)]
    phase4 = [float(x) for x in PHASE4.findall(log)]
    sv = [tuple(float(x) for x in m.groups()) for m in SWAPVA.finditer(log)]
    # The first full GC follows the initial fill (nothing to slide yet): the rounds after it are measured.
    rec["full_gcs"] = len(pauses)
    rec["pauses_ms"] = pauses
    rec["pause_ms"] = statistics.median(pauses[1:] or pauses) if pauses else None
    rec["phase4_ms"] = statistics.median(phase4[1:] or phase4) if phase4 else None
    rec["phases4_ms"] = phase4
    rec["moves_ms"] = [x[4] for x in sv]  # time in farmem_swapva_move, per full GC (all workers)
    rec["objects_moved"] = int(sum(x[0] for x in sv))
    rec["pages_moved_log"] = int(sum(x[1] for x in sv))
    rec["refused"] = sum(int(x) for x in REFUSED.findall(log))


def run_one(args, config: str, local: int, jdk: str, workdir: str, rep: int) -> dict:
    summary = os.path.join(workdir, f"s-{config}-{local}-{rep}.json")
    gclog = os.path.join(workdir, f"gc-{config}-{local}-{rep}.log")
    gc = ["--gc", "swapva"] if config.startswith("swapva") else []
    env = dict(os.environ, FARMEM_JDK=jdk)
    if config == "swapva-rw":
        env["FARMEM_MEMD_COPY"] = "0"
    memd = ["--memd", args.memd_addr, "--secret-file", args.memd_secret, "--transport", "stream"] \
        if getattr(args, "memd_addr", None) else []
    cmd = [os.path.join(ROOT, "farmem"), "run", "--local", f"{local}%", "--summary-json", summary, *memd, *gc, "--",
           os.path.join(jdk, "bin", "java"), f"-Xmx{args.heap}", f"-Xms{args.heap}", "-XX:G1HeapRegionSize=8m",
           f"-Xlog:gc,gc+phases,gc+farmem:file={gclog}", "-cp", os.path.join(ROOT, "build", "java"),
           "LargeArrays", "--arrays", str(args.arrays), "--rounds", str(args.rounds), "--min-kb", str(args.min_kb),
           "--max-kb", str(args.max_kb), "--seed", str(rep + 1)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    rec = {"config": config, "local": local, "rep": rep, "status": r.returncode}
    if r.returncode != 0 or "largearrays: ok" not in r.stdout:
        rec["error"] = (r.stdout + r.stderr).strip().splitlines()[-6:]
        return rec
    s = json.load(open(summary))
    rec.update({k: s.get(k) for k in ("elapsed_s", "gc_faults", "app_faults", "remote_reads", "swapva_calls",
                                      "swapva_pages_moved", "swapva_pages_remote", "swapva_pages_fetched",
                                      "swapva_pages_copied", "remote_writes", "evictions",
                                      "swapva_remote_copied", "remote_read_bytes", "remote_write_bytes")})
    parse_gclog(rec, open(gclog).read())
    return rec


def start_memd(args, wd: str) -> subprocess.Popen:
    """A farmem-memd on 127.0.0.1 at a port the kernel picks (its log names it): no fixed port."""
    args.memd_secret = os.path.join(wd, "memd.secret")
    with open(args.memd_secret, "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    log = os.path.join(wd, "memd.log")
    r, w = os.pipe()
    with open(log, "w") as lf:
        p = subprocess.Popen([os.path.join(ROOT, "build", "bin", "farmem-memd"), "--listen", "127.0.0.1:0",
                              "--secret-file", args.memd_secret, "--log", "info", "--ready-fd", str(w)],
                             pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=lf, stderr=lf)
    os.close(w)
    ready = os.read(r, 16)
    os.close(r)
    m = re.search(r"listening on (tcp:127\.0\.0\.1:\d+)", open(log).read())
    if ready != b"ready\n" or not m:
        p.kill()
        sys.exit("bench_swapva_gc: memd did not start:\n" + open(log).read()[-2000:])
    args.memd_addr = m.group(1)
    return p


def med(recs, key):
    vals = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main_direct(args, jdk: str) -> int:
    recs = []
    with tempfile.TemporaryDirectory(prefix="farmem-bench-swapva-") as wd:
        for rep in range(args.repeats):
            for config in ("copy", "swapva"):
                rec = run_direct(args, config, jdk, wd, rep)
                recs.append(rec)
                if "error" in rec:
                    print(f"INFO: run {rep + 1} {config}: FAILED {rec['error']}")
                else:
                    print(f"INFO: run {rep + 1} {config}: full GCs {' '.join(f'{x:.0f}' for x in rec['pauses_ms'])} ms, "
                          f"pages moved {rec['pages_moved_log']} ({rec.get('backend') or 'copying'}; libswapva kmod "
                          f"{rec.get('pages_kmod', 0)}, uffd {rec.get('pages_uffd', 0)}, memmove "
                          f"{rec.get('pages_memmove', 0)}), wall {rec['elapsed_s']:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)
    failed = [r for r in recs if r["status"] != 0 or "error" in r]
    print(f"INFO: LargeArrays --arrays {args.arrays} --rounds {args.rounds} --min-kb {args.min_kb} --max-kb "
          f"{args.max_kb}, -XX:+UseG1GC -Xmx{args.heap} -XX:G1HeapRegionSize=8m, no pager, SWAPVA_BACKEND="
          f"{args.backend or 'auto'}; {args.repeats} runs each, medians of every full GC after a run's first")
    # TCG's noise (JIT threads beside the GC, a loaded host) swamps a median of a few medians: pool
    # every full GC after each run's first, over all repeats
    print("| config | full GCs | full-GC pause (ms) | phase 4 compact (ms) | in move function (ms) | pages moved "
          "| by kmod | by memmove | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda x, d=1: "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))
    row = {}
    for config in ("copy", "swapva"):
        rs = [r for r in recs if r["config"] == config and "error" not in r]
        pool = lambda k: [x for r in rs for x in r.get(k, [])[1:]]
        v = row[config] = {k: med(rs, k) for k in ("pages_moved_log", "pages_kmod", "pages_memmove", "elapsed_s")}
        for k in ("pauses_ms", "phases4_ms", "moves_ms"):
            v[k] = statistics.median(pool(k)) if pool(k) else None
        print(f"| {config} | {len(pool('pauses_ms'))} | {fmt(v['pauses_ms'])} | {fmt(v['phases4_ms'])} "
              f"| {fmt(v['moves_ms'])} | {fmt(v['pages_moved_log'], 0)} | {fmt(v['pages_kmod'], 0)} "
              f"| {fmt(v['pages_memmove'], 0)} | {fmt(v['elapsed_s'])} |")
    c, s = row["copy"], row["swapva"]
    if c["pauses_ms"] and s["pauses_ms"]:
        print(f"| copy/swapva | | {c['pauses_ms'] / s['pauses_ms']:.2f}x | "
              f"{(c['phases4_ms'] or 0) / (s['phases4_ms'] or 1):.2f}x | | | | | |")
    if failed:
        print(f"INFO: {len(failed)} runs failed: " + "; ".join(str(r.get('error')) for r in failed))
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--local", default="25,100", help="local budgets in percent, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--heap", default="1g")
    ap.add_argument("--arrays", type=int, default=250)
    ap.add_argument("--min-kb", type=int, default=300)
    ap.add_argument("--max-kb", type=int, default=2048)
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--configs", default="copy,swapva", help="of copy, swapva, swapva-rw; alternated in this order")
    ap.add_argument("--tcp", action="store_true", help="one memd on 127.0.0.1 over TCP for every run")
    ap.add_argument("--json", help="write the raw records here")
    ap.add_argument("--direct", action="store_true", help="no farmem run, no pager: libswapva's backend (see above)")
    ap.add_argument("--jdk", help="the farmem JDK home (default: hotspot/build.sh's)")
    ap.add_argument("--agent", default=os.path.join(ROOT, "build", "lib", "libfarmem_agent.so"), help="--direct only")
    ap.add_argument("--classes", default=os.path.join(ROOT, "build", "java"), help="--direct only: LargeArrays.class")
    ap.add_argument("--backend", help="--direct only: SWAPVA_BACKEND (kmod, uffd); swapva runs must move by it")
    args = ap.parse_args()
    jdk = args.jdk or farmem_jdk()
    if args.direct:
        return main_direct(args, jdk)
    configs = args.configs.split(",")
    if not configs or any(c not in ("copy", "swapva", "swapva-rw") for c in configs):
        ap.error("--configs: a comma-separated list of copy, swapva, swapva-rw")
    locals_ = [int(x) for x in args.local.split(",")]
    recs = []
    with tempfile.TemporaryDirectory(prefix="farmem-bench-swapva-") as wd:
        memd = start_memd(args, wd) if args.tcp else None
        try:
            for local in locals_:
                for rep in range(args.repeats):
                    for config in configs:
                        rec = run_one(args, config, local, jdk, wd, rep)
                        recs.append(rec)
                        print(json.dumps(rec), file=sys.stderr)
        finally:
            if memd:
                memd.terminate()
                memd.wait(10)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)
    failed = [r for r in recs if r["status"] != 0 or "error" in r]
    print(f"LargeArrays --arrays {args.arrays} --rounds {args.rounds} --min-kb {args.min_kb} --max-kb {args.max_kb}, "
          f"-Xmx{args.heap} -XX:G1HeapRegionSize=8m, medians of {args.repeats} runs (each: median full GC after the first)"
          + (f"; memd over TCP at {args.memd_addr}" if args.tcp else ""))
    print()
    print("| local | config | full-GC pause (ms) | phase 4 compact (ms) | GC-thread faults | remote reads "
          "| remote writes | pages moved (UFFDIO_MOVE) | remote pages moved in memd | of them copied by memd | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for local in locals_:
        row = {}
        for config in configs:
            rs = [r for r in recs if r["local"] == local and r["config"] == config and "error" not in r]
            row[config] = {k: med(rs, k) for k in ("pause_ms", "phase4_ms", "gc_faults", "remote_reads",
                                                   "remote_writes", "swapva_pages_moved", "swapva_pages_remote",
                                                   "swapva_remote_copied", "elapsed_s")}
            v = row[config]
            fmt = lambda x, d=1: "-" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))
            print(f"| {local}% | {config} | {fmt(v['pause_ms'])} | {fmt(v['phase4_ms'])} | {fmt(v['gc_faults'], 0)} "
                  f"| {fmt(v['remote_reads'], 0)} | {fmt(v['remote_writes'], 0)} | {fmt(v['swapva_pages_moved'], 0)} "
                  f"| {fmt(v['swapva_pages_remote'], 0)} | {fmt(v['swapva_remote_copied'], 0)} | {fmt(v['elapsed_s'])} |")
        for a, b in (("copy", "swapva"), ("swapva-rw", "swapva")):
            c, s = row.get(a), row.get(b)
            if c and s and c["pause_ms"] and s["pause_ms"]:
                print(f"| {local}% | {a}/{b} | {c['pause_ms'] / s['pause_ms']:.2f}x | "
                      f"{(c['phase4_ms'] or 0) / (s['phase4_ms'] or 1):.2f}x | | | | | | | |")
    if failed:
        print(f"\n{len(failed)} runs failed: " + "; ".join(str(r.get('error')) for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
