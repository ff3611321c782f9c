#!/usr/bin/env python3
"""Where a JVM's CPU goes under farmem, by thread kind and G1 task.

    .venv/bin/python bench/gc_profile.py [--after S] [--seconds S] [--freq HZ] [--json F] -- \\
        ./farmem run --local 50% --gc farmem -- java -Xmx1g -cp build/java GcChurn --live-mb 600

Runs the command, waits --after seconds, samples its JVM (the first process named java under it)
with `perf record --call-graph dwarf` for --seconds, lets the command finish, and sorts the samples:
by thread kind (`GC Thread`, `G1 Conc`, `java`, ...), then each GC thread's sample by the G1 task on
its stack (`G1FullGCCompactTask`, young pauses' `G1ParScanThreadState`, the concurrent marking's
`G1CMConcurrentMarkingTask`, ...), and in each task the pager's functions on the stack (inclusive):
faults (`on_sigbus`), evictions (`fm_evict_batch`), reads and moves in memd (`farmem_read_words`,
`fm_pager_move_bytes`), the store's checksums (`intact`), unprotects (`fm_uffd_wp`). The split that
found session 25's two changes (bench/RESULTS.md); a flat profile puts memcpy on top and loses
its callers (the agent has no frame pointers: DWARF unwinding, 16 KiB of stack a sample).

Needs perf (linux-perf) and root or perf_event_paranoid <= 1. Symbols of the JVM's own code need a
libjvm.so with a symbol table: the farmem JDK (`make jdk`) has one; a stripped one puts GC samples
under "other". The exit status is the command's.
"""
import argparse
import collections
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # run by a Python without the CLI: use its sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import jvmcmd  # noqa: E402

# Outermost frames that name what a GC thread is doing (G1, JDK 17), checked from the stack's root.
TASKS = ("G1FullGCMarkTask", "G1FullGCPrepareTask", "G1FullGCAdjustTask", "G1FullGCCompactTask",
         "G1ParScanThreadState", "G1EvacuateRegionsBaseTask", "G1MergeHeapRootsTask",
         "G1PostEvacuateCollectionSetCleanupTask", "G1RebuildRemSetTask", "G1CMConcurrentMarkingTask",
         "G1CMRootRegionScanTask", "G1ClearBitMapTask", "G1CMRemarkTask", "G1BatchedGangTask",
         "G1PreEvacuateCollectionSetBatchTask")
TASK_RE = re.compile(r"^(%s)\b" % "|".join(TASKS))
# The pager's functions worth a column (inclusive: on the stack anywhere below the task).
PAGER = ("on_sigbus", "fm_evict_batch", "fm_prefetch", "fm_uffd_copy", "fm_uffd_wp", "open_clean",
         "farmem_read_words", "farmem_write_words", "fm_pager_move_bytes", "intact", "shm_page_open",
         "flush_tlb_mm_range")


def thread_kind(comm: str) -> str:
    """`GC Thread#3` and `G1 Conc#0` by kind; `C2 CompilerThre` as the kernel cut it."""
    return re.sub(r"#?\d+$", "", comm.strip()) or "?"


def parse_script(text: str) -> list:
    """`perf script -F comm,tid,ip,sym` into [(comm, [frames, leaf first])]."""
    samples, cur = [], None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                samples.append(cur)
            cur = None
        elif not line[0].isspace():
            m = re.match(r"(.*?)\s+(\d+)\s*$", line)
            cur = (m.group(1) if m else line.strip(), [])
        elif cur is not None:
            parts = line.split(None, 1)
            cur[1].append(parts[1].strip() if len(parts) > 1 else "?")
    if cur:
        samples.append(cur)
    return samples


def task_of(frames: list) -> str:
    for f in reversed(frames):  # from the root
        m = TASK_RE.match(f)
        if m:
            return m.group(1)
    return "other"


def sort_samples(samples: list) -> dict:
    kinds = collections.Counter(thread_kind(c) for c, _ in samples)
    tasks = collections.Counter()
    pager = collections.defaultdict(collections.Counter)
    overall = collections.Counter()
    for comm, frames in samples:
        kind = thread_kind(comm)
        if kind not in ("GC Thread", "G1 Conc", "G1 Main Marker", "VM Thread", "G1 Refine"):
            task = kind  # the program's threads and the compilers: by thread
        else:
            task = kind + ": " + task_of(frames)
        tasks[task] += 1
        names = {f.split(" ")[0] for f in frames}
        for fn in PAGER:
            if fn in names:
                pager[task][fn] += 1
                overall[fn] += 1
    return {"samples": len(samples), "threads": dict(kinds.most_common()),
            "tasks": {t: {"samples": n, "pager": dict(pager[t].most_common())} for t, n in tasks.most_common()},
            "pager": dict(overall.most_common())}


def report(r: dict, top: int) -> str:
    n = r["samples"] or 1
    out = [f"{r['samples']} samples"]
    out.append("by thread kind: " + ", ".join(f"{k} {v} ({100 * v / n:.0f}%)" for k, v in r["threads"].items()))
    out.append("pager functions on the stack (all threads): "
               + (", ".join(f"{k} {100 * v / n:.1f}%" for k, v in r["pager"].items()) or "none"))
    out.append(f"{'samples':>8} {'share':>6}  task (pager functions on the stack, share of the task's samples)")
    for t, d in list(r["tasks"].items())[:top]:
        s = d["samples"]
        inner = ", ".join(f"{k} {100 * v / s:.0f}%" for k, v in d["pager"].items())
        out.append(f"{s:8d} {100 * s / n:5.1f}%  {t}" + (f" ({inner})" if inner else ""))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--after", type=float, default=1.5, help="seconds from the start to the first sample")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds sampled")
    ap.add_argument("--freq", type=int, default=700, help="samples a second per thread (perf -F)")
    ap.add_argument("--top", type=int, default=20, help="tasks listed")
    ap.add_argument("--json", metavar="F", help="also write the counts as JSON to F")
    ap.add_argument("--keep", metavar="DIR", help="keep perf.data and the perf script output in DIR")
    jvmcmd.add_command(ap)
    a = ap.parse_args()
    cmd = jvmcmd.command(ap, a)
    if a.after < 0 or a.seconds <= 0 or a.freq <= 0:
        ap.error("--after must be >= 0, --seconds and --freq > 0")
    if not shutil.which("perf"):
        print("gc_profile: perf not found (apt-get install linux-perf)", file=sys.stderr)
        return 2
    work = a.keep or tempfile.mkdtemp(prefix="gc-profile-")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "perf.data")

    def record(pid, proc):
        time.sleep(max(0.0, a.after - 0.05))
        return subprocess.run(["perf", "record", "-q", "-o", data, "-F", str(a.freq), "--call-graph", "dwarf,16384",
                               "-p", str(pid), "--", "sleep", str(a.seconds)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    rc, rec = jvmcmd.watch_jvm(cmd, "gc_profile", record, wait_s=a.after + 30)
    if rec is None:
        return rc
    if rec.returncode != 0 or not os.path.exists(data):
        print(f"gc_profile: perf record failed: {rec.stderr.strip()}", file=sys.stderr)
        return rc or 1
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,ip,sym"], capture_output=True, text=True)
    if a.keep:
        with open(os.path.join(work, "script.txt"), "w") as f:
            f.write(script.stdout)
    else:
        shutil.rmtree(work, ignore_errors=True)
    r = sort_samples(parse_script(script.stdout))
    print(report(r, a.top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
