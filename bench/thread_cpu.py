#!/usr/bin/env python3
"""A JVM's CPU time by thread kind: user and system seconds, and seconds waiting for a CPU.

    .venv/bin/python bench/thread_cpu.py [--interval S] [--json F] -- \\
        ./farmem run --local 50% --gc farmem -- java -Xmx1g -cp build/java GcChurn --live-mb 600

Runs the command, reads /proc/PID/task/*/{stat,schedstat} of its first java process every
--interval seconds while it runs, keeps each thread's last reading (a thread that ended keeps what
it had), and sums them by kind (`java`, `GC Thread`, `G1 Conc`, `C2 CompilerThre`, ...,
bench/gc_profile.py's names). Beside the same command without farmem it says which threads pay for
paging and how: the main thread's system time is its faults' (bench/RESULTS.md, session 67: GcChurn
at 50% local, 1.13 s of system time against 0.05 s all local). Time a thread spent after the last
reading is lost, so the figures are lower bounds by at most --interval a thread. The exit status is
the command's.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # run by a Python without the CLI: use its sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import jvmcmd  # noqa: E402
from gc_profile import thread_kind  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def read_threads(pid: int) -> dict:
    """tid -> (comm, user s, system s, on-CPU s, waiting-for-a-CPU s); threads gone meanwhile left out."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/schedstat") as f:
                run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
        except (OSError, ValueError):
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3, state
        out[tid] = (comm, int(fields[11]) / TICK, int(fields[12]) / TICK, run_ns / 1e9, wait_ns / 1e9)
    return out


def by_kind(threads: dict) -> dict:
    kinds: dict = {}
    for comm, user, system, run, wait in threads.values():
        k = kinds.setdefault(thread_kind(comm), {"threads": 0, "user_s": 0.0, "system_s": 0.0, "run_s": 0.0,
                                                 "wait_s": 0.0})
        k["threads"] += 1
        k["user_s"] += user
        k["system_s"] += system
        k["run_s"] += run
        k["wait_s"] += wait
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["run_s"]))


def report(kinds: dict, wall: float) -> str:
    out = [f"wall {wall:.2f} s", f"{'kind':<18} {'threads':>7} {'user s':>8} {'system s':>9} {'on CPU s':>9} "
           f"{'waiting s':>10}"]
    for name, k in kinds.items():
        if k["run_s"] < 0.005:
            continue  # idle threads (the JSON keeps them)
        out.append(f"{name:<18} {k['threads']:>7} {k['user_s']:>8.2f} {k['system_s']:>9.2f} {k['run_s']:>9.2f} "
                   f"{k['wait_s']:>10.2f}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between readings")
    ap.add_argument("--json", metavar="F", help="also write the sums as JSON to F")
    jvmcmd.add_command(ap)
    a = ap.parse_args()
    cmd = jvmcmd.command(ap, a)
    if a.interval <= 0:
        ap.error("--interval must be > 0")
    t0 = time.monotonic()
    last: dict = {}

    def watch(pid, proc):
        while proc.poll() is None:
            last.update(read_threads(pid))
            time.sleep(a.interval)

    rc, _ = jvmcmd.watch_jvm(cmd, "thread_cpu", watch)
    wall = time.monotonic() - t0
    if not last:
        return rc or 1
    kinds = by_kind(last)
    print(report(kinds, wall))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"wall_s": wall, "kinds": kinds}, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
