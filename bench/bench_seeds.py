#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The seeds' workloads at far memory (issue 18): Spark, Neo4j, H2 and GcChurn, each all local,
under Linux swap, under farmem with stock G1 and under farmem with MemLiner marking, at 50% and
25% of the heap local, interleaved in one sitting.

Workloads (every one checks its own answers and prints an ok line; docs/seeds.md):

  spark    Apache Spark 3.5 in local[2] mode: PageRank over a generated graph (build/java/spark)
  neo4j    Neo4j 5 embedded: a generated graph, point, two-hop and whole-graph Cypher (build/java/neo4j)
  h2       the H2 database in memory through JDBC (tests/java/H2Workload.java)
  gcchurn  a random GC-heavy heap of long[] (tests/java/GcChurn.java)

Configurations, per workload and budget (PCT of -Xmx local):

  local     java alone, -Xms = -Xmx: the reference (ratio 1.00)
  kswap     `farmem run --mode kswap --local BYTES`: Linux swap (zram) under a memory cgroup of PCT of
            the heap plus the workload's non-heap allowance (metaspace, code, GC structures, threads,
            Neo4j's page cache: the memory farmem leaves unpaged), so both page the same heap. The
            allowance is measured: the most the JVM held resident outside its heap in the warm-up run
            below (/proc/PID/smaps every second, every 0.1 s in the first; the heap's range from its
            exit log; the timed runs are not sampled, a sample costs tens of ms of CPU); --overhead
            sets it, and the presets below serve when that run failed
  farmem    `farmem run --local PCT%`: the pager, the system's JDK 17 (stock G1)
  memliner  `farmem run --gc memliner --local PCT%`: the farmem JDK (`make jdk`), MemLiner marking
  fjdk      `farmem run --gc farmem --local PCT%`: the farmem JDK, everything it does for far memory
            (MemLiner marking; a full GC's moves and headers, and promotions of primitive arrays
            under pressure, done in memd's store; regions mostly in memd and mostly live left
            where they lie by full GCs and mixed collections)
  script    `farmem run --local PCT% -- sh -c 'exec "$@"' sh java ...`: the JVM a script starts,
            paged by the agent from JAVA_TOOL_OPTIONS, its young generation sized by the agent
  scriptb   the same with --local in bytes (PCT of -Xmx)

Every run logs -Xlog:gc,gc+heap+exit to a file: bytes allocated (occupancy before each pause minus
after the previous one, bench/lib/gclog.py), pause time and the count of full and mixed
collections come from it. The table shows the median over --repeats of wall time, its ratio to
all-local, the pager's fault split (GC threads, of which zero fills, and application threads),
remote reads and writes, and paged MB per GB allocated (farmem: bytes read from and written to
memd; kswap: pages swapped in and out, x 4 KiB).
Configurations rotate every repeat, so slow drift of the machine spreads over all of them. Before
the timed runs each workload runs all local once, untimed: a sitting's first large JVM ran slow,
and the rotation puts an all-local run, the reference, first.

    .venv/bin/python bench/bench_seeds.py [--workloads spark,neo4j,h2,gcchurn] [--budgets 50,25]
        [--configs local,kswap,farmem,memliner,fjdk] [--repeats 3] [--size bench|smoke] [--heap SIZE]
        [--overhead SIZE] [--args NAME=FLAGS] [--jvm JVMFLAGS] [--variant NAME=CONFIG[@JDK]:JVMFLAGS]
        [--build NAME=DIR] [--run-args NAME=ARGS] [--env NAME=VAR=VALUE]
        [--out bench/RESULTS.md] [--json raw.json]

--jvm gives every configuration more JVM flags (another collector: --jvm=-XX:+UseShenandoahGC
--configs local,kswap,farmem). --variant adds a configuration to compare in the same sitting: CONFIG with more JVM flags, e.g.
--variant "slide=fjdk:-XX:FarmemRemoteDeadRatio=0" --configs local,fjdk,slide; CONFIG@JDK runs
another farmem JDK home (an older build in ~/.cache/farmem-jdk17), e.g.
--variant "before=fjdk@$HOME/.cache/farmem-jdk17/17.0.19+10-8d790dbb4cd5/jdk:"; local@JDK and farmem@JDK
run that Java home's java (another release: make build/jdks/25/bin/java), a farmem@JDK row's ratio
taken to the local@JDK row of the same home, e.g. --variant "l25=local@build/jdks/25:" --variant
"f25=farmem@build/jdks/25:" --configs local,farmem,l25,f25. --build NAME=DIR runs
variant NAME with the farmem libraries and memd of another build directory (FARMEM_BUILD), e.g. a
worktree of the commit before: git worktree add /tmp/before HEAD~1 && make -C /tmp/before c, then
--variant "before=fjdk:" --build before=/tmp/before/build. --run-args NAME=ARGS gives variant NAME's
`farmem run` more options, e.g. --variant "ev=farmem:" --run-args "ev=--evict-threads 1"; --env
NAME=VAR=VALUE sets an environment variable for its runs, e.g. a knob that has no `farmem run` flag
(--variant "eb=farmem:" --env eb=FARMEM_EVICT_BATCH=32) or an experiment an env-gated build reads.

Needs `make all seeds` (done here) and, for memliner and fjdk, `make jdk` (not done here: ~15 min the first
time); kswap needs root and zram. --size smoke runs each workload at its smoke-test size.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "lib"))
import gclog  # noqa: E402

if importlib.util.find_spec("farmem") is None:  # run by a Python without the CLI: use its sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import swap  # noqa: E402
from farmem.gcmode import farmem_jdk_home  # noqa: E402

JAVA = os.path.join(ROOT, "build", "java")
SPARK_JAR = os.path.join(JAVA, "spark", "spark-workload.jar")
NEO4J_JAR = os.path.join(JAVA, "neo4j", "neo4j-workload.jar")
H2_CP = os.pathsep.join([JAVA, os.path.join(JAVA, "thirdparty", "h2.jar")])
MIB = 1 << 20


@dataclasses.dataclass
class Workload:
    heap: str          # -Xmx
    prog: list         # what java runs: -jar JAR, or -cp CP CLASS
    args: list         # the program's flags (its size)
    ok: str            # the line a run that checked its answers prints
    overhead: int      # non-heap allowance of the kswap cgroup, bytes


SPARK = ["-jar", SPARK_JAR]
NEO4J = ["-jar", NEO4J_JAR]
H2 = ["-cp", H2_CP, "H2Workload"]
CHURN = ["-cp", JAVA, "GcChurn"]
# Sizes: "bench" for the timing runs (all-local 25-95 s each beside a HotSpot build), "smoke" as
# tests/test_seeds.py runs Spark and Neo4j (a check of the driver). The preset non-heap allowances
# (used only without an all-local run) are what NMT reported committed outside the heap at the
# bench sizes, rounded up (GC structures grow with the heap; Neo4j's adds its 64 MiB page cache,
# which NMT does not see).
SIZES = {
    "bench": {
        "spark": Workload("1g", SPARK, ["--nodes", "600000", "--iters", "5"], "spark: ok", 256 * MIB),
        "neo4j": Workload("1g", NEO4J, ["--nodes", "150000", "--rounds", "3000"], "neo4j: ok", 384 * MIB),
        "h2": Workload("512m", H2, ["--rows", "400000", "--rounds", "1000"], "h2: ok", 96 * MIB),
        # issue 18's GC-heavy heap "as a new user would": 600 MB live in -Xmx1g
        "gcchurn": Workload("1g", CHURN, ["--live-mb", "600", "--steps", "600000"], "gcchurn: ok", 128 * MIB),
    },
    "smoke": {
        "spark": Workload("512m", SPARK, ["--nodes", "100000", "--iters", "3"], "spark: ok", 256 * MIB),
        "neo4j": Workload("256m", NEO4J, ["--nodes", "10000", "--rounds", "100", "--batch", "5000"],
                          "neo4j: ok", 384 * MIB),
        "h2": Workload("256m", H2, ["--rows", "50000", "--rounds", "100"], "h2: ok", 96 * MIB),
        "gcchurn": Workload("256m", CHURN, ["--live-mb", "64", "--steps", "20000"], "gcchurn: ok", 64 * MIB),
    },
}
LABEL = {"local": "all local", "kswap": "Linux swap (kswap, zram)", "farmem": "farmem, stock G1",
         "memliner": "farmem --gc memliner", "fjdk": "farmem --gc farmem",
         "script": "farmem, stock G1, java started by a shell (agent in JAVA_TOOL_OPTIONS)",
         "scriptb": "the same, --local in bytes"}
PATCHED = ("memliner", "fjdk")  # the configurations that run the farmem JDK
VARIANTS: dict[str, tuple[str, list[str], str | None]] = {}  # --variant: name -> (configuration, more JVM flags, JDK)
BUILDS: dict[str, str] = {}  # --build: variant name -> FARMEM_BUILD
RUN_ARGS: dict[str, list[str]] = {}  # --run-args: variant name -> more `farmem run` options
ENVS: dict[str, dict[str, str]] = {}  # --env: variant name -> more environment for its runs
FIGURES = ("gc_faults", "gc_zero_fills", "gc_conc_faults", "app_faults", "remote_reads", "remote_writes",
           "evictions", "remote_read_bytes", "remote_write_bytes", "cgroup_limit_bytes", "peak_resident_bytes",
           "compact_moves", "compact_bytes")
# Issue 18's targets: (workload, config, budget) -> the largest ratio to all-local.
TARGETS = {("spark", 25): 1.5, ("spark", 50): 1.15, ("gcchurn", 50): 2.0, ("gcchurn", 25): 3.0}
SWAP_TARGET = 3.0  # every workload this many times faster than Linux swap at the same limit
FIT_TARGET = 1.03  # a JVM whose whole heap is local (--budgets 100), discard on


def base_config(config: str) -> str:
    return VARIANTS[config][0] if config in VARIANTS else config


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def size_bytes(text: str) -> int:
    return swap.parse_size(text)


class RssSampler(threading.Thread):
    """Every second while a JVM runs, every tenth of a second in its first second (a young JVM's
    smaps is small, and a smoke run of 0.4 s sampled once at 0.2 s saw its non-heap memory before
    it had grown: Linux swap's cgroup, sized from it, killed GcChurn): the resident bytes of each of
    its mappings. Only in a run that is not timed (Bench.warm_up): a read of a large JVM's smaps
    costs 25-55 ms of CPU.
    Afterwards, with the heap's range from its log, the most it held outside the heap: what a
    memory cgroup must allow beyond the heap's share for Linux swap to page the same heap."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.stop, self.samples = pid, threading.Event(), []

    def run(self) -> None:
        while not self.stop.wait(1.0 if len(self.samples) >= 10 else 0.1):
            sample, start, end = [], 0, 0
            try:
                with open(f"/proc/{self.pid}/smaps") as f:
                    for line in f:
                        head = line.split(" ", 1)[0]
                        if "-" in head and line[0] in "0123456789abcdef":
                            lo, hi = head.split("-")
                            start, end = int(lo, 16), int(hi, 16)
                        elif line.startswith("Rss:") and line.split()[1] != "0":
                            sample.append((start, end, int(line.split()[1]) << 10))
            except (OSError, ValueError):
                return
            self.samples.append(sample)

    def outside(self, heap: tuple[int, int]) -> int | None:
        """Peak resident bytes of the mappings that do not overlap the heap."""
        lo, hi = heap
        peaks = [sum(rss for a, b, rss in s if b <= lo or a >= hi) for s in self.samples]
        return max(peaks) if peaks else None


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.workloads = {w: dataclasses.replace(SIZES[a.size][w]) for w in a.workloads}
        if a.heap:
            for w in self.workloads.values():
                w.heap = a.heap
        for name, args in a.args.items():
            self.workloads[name].args = shlex.split(args)
        self.workdir = tempfile.mkdtemp(prefix="fm-seeds-")
        self.farmem = os.path.join(ROOT, "farmem")
        self.jdk = None
        self.unavailable: dict[str, str] = {}
        self.records: list[dict] = []
        self.non_heap: dict[str, int] = {}  # per workload, measured in an untimed all-local run
        self.warm_ups: list[dict] = []  # untimed all-local runs before the timed ones

    def check_available(self) -> None:
        if "kswap" in self.a.configs and os.geteuid() != 0:
            self.unavailable["kswap"] = "Linux swap under a cgroup needs root"
        if any(base_config(c) in PATCHED for c in self.a.configs):
            home = farmem_jdk_home()
            if home is None or not os.access(os.path.join(home, "bin", "java"), os.X_OK):
                for c in self.a.configs:
                    if base_config(c) in PATCHED and not (c in VARIANTS and VARIANTS[c][2]):
                        self.unavailable[c] = "the farmem JDK is not built for this checkout: make jdk"
            else:
                self.jdk = str(home)

    def allowance(self, name: str) -> int:
        """Non-heap bytes the kswap cgroup allows: --overhead, else measured in the warm-up run,
        else the preset."""
        if self.a.overhead:
            return size_bytes(self.a.overhead)
        return self.non_heap.get(name, self.workloads[name].overhead)

    def kswap_limit(self, name: str, pct: int) -> int:
        return size_bytes(self.workloads[name].heap) * pct // 100 + self.allowance(name)

    def command(self, name: str, config: str, pct: int, tag: str) -> tuple[list, str, str | None]:
        """(argv, gc log path, summary path or None) of one run."""
        w = self.workloads[name]
        more = VARIANTS[config][1] if config in VARIANTS else []
        jdk = VARIANTS[config][2] if config in VARIANTS else None
        run_args = RUN_ARGS.get(config, [])  # the variant's own name, before it gives way to its base
        config = base_config(config)
        gcl = os.path.join(self.workdir, f"gc-{tag}.log")
        tmp = os.path.join(self.workdir, "tmp")  # Spark's shuffle files, Neo4j's store
        os.makedirs(tmp, exist_ok=True)
        # A stock configuration @JDK runs that JDK's java; memliner and fjdk get theirs from farmem run.
        binary = os.path.join(jdk, "bin", "java") if jdk and config not in PATCHED else "java"
        java = [binary, f"-Xmx{w.heap}", f"-Xms{w.heap}", f"-Xlog:gc,gc+heap+exit:file={gcl}",
                f"-Djava.io.tmpdir={tmp}", *self.a.jvm, *more, *w.prog, *w.args]
        if config == "local":
            return java, gcl, None
        summary = os.path.join(self.workdir, f"s-{tag}.json")
        run = [self.farmem, "run", "--summary-json", summary, *run_args]
        if config == "kswap":
            run += ["--mode", "kswap", "--local", str(self.kswap_limit(name, pct))]
        elif config in ("script", "scriptb"):
            # farmem run never sees this java's command line: the agent does what it would have.
            run += ["--local", f"{pct}%" if config == "script" else str(size_bytes(w.heap) * pct // 100)]
            java = ["sh", "-c", 'exec "$@"', "sh", *java]
        else:
            gc = {"memliner": "memliner", "fjdk": "farmem"}.get(config)
            run += ["--local", f"{pct}%"] + (["--gc", gc] if gc else [])
        return run + ["--", *java], gcl, summary

    def needs_allowance(self) -> bool:
        """Linux swap runs here with no --overhead: its cgroup's non-heap allowance is measured."""
        return not self.a.overhead and any(base_config(c) == "kswap" and c not in self.unavailable
                                           for c in self.a.configs)

    def warm_up(self, name: str) -> dict:
        """One all-local run of the workload before the timed ones, untimed. The first large JVM of
        a sitting ran slow (GcChurn at -Xmx8g, session 86: 11.7 and 8.7 s against 5.8-6.2 s after),
        and the rotation of configurations makes every sitting's first run an all-local one, the
        reference every ratio divides by. Where Linux swap runs without --overhead this run is also
        the one whose smaps are sampled for the non-heap allowance: not a timed run, since a sample
        of a large JVM's smaps costs 25-55 ms of CPU, ten of them in the first second. Its record is
        kept apart (--json lists it first) and counts in no median."""
        sample = self.needs_allowance()
        rec = self.run_one(name, "local", 100, -1, sample=sample)
        rec["purpose"] = "warm-up (untimed)" + (", non-heap allowance" if sample else "")
        self.warm_ups.append(rec)
        if not rec["ok"]:
            log(f"[warm-up] {name}: FAILED: {rec.get('error')}")
        elif sample and name in self.non_heap:
            log(f"[warm-up] {name}: {rec['wall_s']:.1f} s, {self.non_heap[name] / MIB:.0f} MiB resident "
                "outside the heap (Linux swap's non-heap allowance)")
        else:
            log(f"[warm-up] {name}: {rec['wall_s']:.1f} s")
        return rec

    def run_one(self, name: str, config: str, pct: int, rep: int, sample: bool = False) -> dict:
        rec: dict = {"workload": name, "config": config, "pct": pct, "repeat": rep, "ok": False}
        if config in self.unavailable:
            rec["error"] = self.unavailable[config]
            return rec
        tag = f"{name}-{config}-{pct}-{rep}" if rep >= 0 else f"{name}-{config}-warm-up"
        argv, gcl, summary = self.command(name, config, pct, tag)
        rec["argv"] = argv
        jdk = VARIANTS[config][2] if config in VARIANTS and VARIANTS[config][2] else self.jdk
        if base_config(config) not in PATCHED:
            jdk = None
        env = dict(os.environ, **({"FARMEM_JDK": jdk} if jdk else {}), **({"FARMEM_BUILD": BUILDS[config]} if config in BUILDS else {}))
        env.update(ENVS.get(config, {}))  # last: an --env of the same name wins
        if config in ENVS:
            rec["env"] = ENVS[config]
        t0 = time.monotonic()
        # A session of its own: a run that times out is killed with its JVM, not just farmem run.
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                             start_new_session=True)
        sampler = RssSampler(p.pid) if sample and base_config(config) == "local" else None  # local's argv is the JVM itself
        if sampler:
            sampler.start()
        try:
            out, err = p.communicate(timeout=self.a.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)  # farmem run then stops its memd and cleans up
            try:
                out, _ = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
            rc, err = None, f"timed out after {self.a.timeout:.0f} s"
        rec["wall_s"] = round(time.monotonic() - t0, 3)
        rec["status"] = rc
        if sampler:
            sampler.stop.set()
            sampler.join()
        verdict = [ln for ln in out.splitlines() if ln.startswith(self.workloads[name].ok)]
        if rc == 0 and verdict:
            rec["ok"] = True
            rec["verdict"] = verdict[-1]
        else:
            tail = (out + "\n" + err).strip().splitlines()[-4:]
            rec["error"] = (f"exit {rc}: " if rc is not None else "") + " / ".join(tail)
            if rc in (137, -9):
                rec["error"] = "killed (SIGKILL: out of memory?): " + rec["error"]
                # Linux swap's own OOM killer ending the baseline is a measurement of it (the
                # tables say "killed"), not a failure of this driver.
                rec["baseline_killed"] = base_config(config) == "kswap"
        text = gclog.read(gcl)
        rec["alloc_bytes"] = gclog.allocated_bytes(text)
        rec["pause_s"] = round(gclog.pause_seconds(text), 3)
        rec["full_pause_s"] = round(gclog.full_pause_seconds(text), 3)
        gcs = gclog.collections(text)
        rec["full_gcs"], rec["mixed_gcs"] = gcs["full"], gcs["mixed"]
        heap = gclog.heap_range(text)
        if sampler and rec["ok"] and heap and sampler.outside(heap):
            rec["non_heap_bytes"] = sampler.outside(heap)
            self.non_heap[name] = max(self.non_heap.get(name, 0), rec["non_heap_bytes"])
        if base_config(config) == "kswap":
            rec["non_heap_allowance"] = self.allowance(name)
        if summary and os.path.exists(summary):
            with open(summary) as f:
                s = json.load(f)
            rec.update({k: s[k] for k in FIGURES if k in s})
            if base_config(config) == "kswap":  # a swapped page crosses to zram once each way
                rec["remote_writes"] = s.get("evictions", 0)
                rec["paged_bytes"] = (s.get("remote_reads", 0) + s.get("evictions", 0)) * 4096
            else:
                rec["paged_bytes"] = s.get("remote_read_bytes", 0) + s.get("remote_write_bytes", 0)
        for f in (gcl, summary):
            if f and os.path.exists(f):
                os.unlink(f)
        return rec

    def plan(self) -> list[tuple[str, int]]:
        out = [(c, 100) for c in self.a.configs if base_config(c) == "local"]
        for pct in self.a.budgets:
            out += [(c, pct) for c in self.a.configs if base_config(c) != "local"]
        return out

    def reference(self, name: str, config: str) -> float | None:
        """The all-local wall time a configuration's ratio is taken to: the local run of its own
        JDK (a local@JDK variant) when it runs another JDK's java, else plain local."""
        jdk = VARIANTS[config][2] if config in VARIANTS else None
        ref = next((c for c in self.a.configs if base_config(c) == "local" and c in VARIANTS
                    and VARIANTS[c][2] == jdk), "local") if jdk and base_config(config) not in PATCHED else "local"
        return self.medians(name, ref, 100).get("wall_s")

    def run(self) -> None:
        self.check_available()
        plan = self.plan()
        total = self.a.repeats * len(self.workloads) * len(plan)
        n = 0
        for name in self.workloads:
            self.warm_up(name)
        for rep in range(self.a.repeats):
            for name in self.workloads:
                k = rep % len(plan)
                for config, pct in plan[k:] + plan[:k]:
                    n += 1
                    rec = self.run_one(name, config, pct, rep)
                    self.records.append(rec)
                    what = f"[{n}/{total}] {name:7} {config:8} {pct:3}% #{rep + 1}"
                    if rec["ok"]:
                        log(f"{what}: {rec['wall_s']:.1f} s, {rec['verdict']}")
                    else:
                        log(f"{what}: FAILED: {rec['error']}")

    # -- report -------------------------------------------------------------------------------------

    def medians(self, name: str, config: str, pct: int) -> dict:
        recs = [r for r in self.records if (r["workload"], r["config"], r["pct"]) == (name, config, pct)]
        ok = [r for r in recs if r["ok"]]
        m: dict = {"runs": len(ok), "tried": len(recs)}
        if not ok:
            m["error"] = recs[-1].get("error", "not run") if recs else "not run"
            return m
        for key in ("wall_s", "pause_s", "full_pause_s", "full_gcs", "mixed_gcs", "alloc_bytes", "paged_bytes",
                    *FIGURES):
            vals = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            if vals:
                m[key] = statistics.median(vals)
        return m

    def report(self, started: str, load0: str) -> str:
        a = self.a
        cmd = shlex.join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT)
                          else sys.executable] + sys.argv)
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
        mem = next((int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.startswith("MemTotal")), 0)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        load1 = " ".join(open("/proc/loadavg").read().split()[:3])
        out = [f"## The seeds' workloads at far memory (bench/bench_seeds.py, issue 18), {started}", "",
               f"- command: `{cmd}`",
               f"- machine: {os.cpu_count()} CPUs ({cpu}), {mem / (1 << 20):.0f} GiB, kernel {platform.release()}, "
               f"load average {load0} at start, {load1} at end" + (f", commit {commit}" if commit else ""),
               f"- JDKs: stock {java[1] if len(java) > 1 else '?'}; farmem JDK "
               f"{self.jdk or 'not built (' + self.unavailable.get('memliner', 'not asked for') + ')'}",
               f"- median of {a.repeats} interleaved repeat(s); local = share of -Xmx; Linux swap's cgroup "
               "limit = that share of the heap + the workload's non-heap allowance below (measured: the most "
               "the JVM held resident outside its heap in the untimed warm-up run, from /proc/PID/smaps every "
               "second, every 0.1 s in the first; the timed runs are not sampled); each workload's first run, "
               "all local, is an untimed warm-up",
               "- paged MB / GB alloc: farmem, bytes read from and written to memd; kswap, pages swapped in "
               "and out x 4 KiB; per GB the program allocated (-Xlog:gc occupancy)"]
        out.append("- workloads:")
        for name, w in self.workloads.items():
            args = " ".join(os.path.relpath(x, ROOT) if x.startswith(ROOT) else x for x in w.prog + w.args)
            how = ("--overhead" if self.a.overhead else "measured" if name in self.non_heap else "preset")
            out.append(f"  - {name}: `java -Xmx{w.heap} {args}`, non-heap allowance "
                       f"{self.allowance(name) / MIB:.0f} MiB ({how})")
        out += ["", "| workload | config | local | runs | wall s | × all-local | GC faults: pause workers "
                "| of them zero fills | GC faults: concurrent (marking) | app faults | remote reads | remote writes "
                "| paged MB / GB alloc | GC faults / GB alloc | moved in memd MB | GC pause s | of them full GCs s "
                "| full / mixed GCs | alloc GB |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in self.workloads:
            for config, pct in self.plan():
                base = self.reference(name, config)
                m = self.medians(name, config, pct)
                head = f"| {name} | {LABEL[config]} | {pct}% | {m['runs']}/{m['tried']}"
                if not m["runs"]:
                    err = m["error"].replace("|", "/")
                    out.append(f"{head} | failed: {err[:160]} |  |  |  |  |  |  |  |  |  |  |  |  |  |  |")
                    continue
                gb = m.get("alloc_bytes", 0) / (1 << 30)

                def num(key, fmt="{:.0f}"):
                    return fmt.format(m[key]) if key in m and base_config(config) != "local" else ""

                ratio = f"{m['wall_s'] / base:.2f}×" if base else "n/a"
                paged = f"{m['paged_bytes'] / MIB / gb:.0f}" if "paged_bytes" in m and gb else ""
                gcpg = f"{m['gc_faults'] / gb:.0f}" if m.get("gc_faults") and gb else ""
                pause = (f"{m['gc_faults'] - m.get('gc_conc_faults', 0):.0f}"
                         if "gc_faults" in m and base_config(config) != "local" else "")
                conc = num("gc_conc_faults") if base_config(config) not in ("local", "kswap") else ""
                inmemd = f"{m['compact_bytes'] / MIB:.0f}" if m.get("compact_bytes") else ""
                gcs = f"{m.get('full_gcs', 0):.0f} / {m.get('mixed_gcs', 0):.0f}"
                out.append(f"{head} | {m['wall_s']:.1f} | {ratio} | {pause} | {num('gc_zero_fills')} | {conc} "
                           f"| {num('app_faults')} | {num('remote_reads')} | {num('remote_writes')} | {paged} "
                           f"| {gcpg} | {inmemd} | {m.get('pause_s', 0):.2f} | {m.get('full_pause_s', 0):.2f} "
                           f"| {gcs} | {gb:.2f} |")
        out += ["", "Under Linux swap the fault columns come from kswap mode's eBPF tracer (farmem-trace): GC and "
                "app faults are major faults by thread (all GC threads under pause workers), remote reads swap-ins, "
                "remote writes pages swapped out. Under farmem, pause workers are HotSpot's `GC Thread#` and "
                "`VM Thread`, concurrent ones `G1 Conc#`, `G1 Main Marker`, `G1 Refine#` and `G1 Service`, and "
                "Shenandoah's workers and control thread (jvmti-agent/gcthreads.c); moved in memd = bytes the collector had moved inside memd's store "
                "(uffd/compact.c: `--gc farmem`'s full-GC object moves and promotions of primitive arrays, and a "
                "stock JVM's full-GC moves and stock G1's promotions of primitive arrays through the agent's gc_moves, docs/jvm.md); full / "
                "mixed GCs = G1's full collections and its mixed pauses (young pauses that also evacuate old "
                "regions: a concurrent cycle that finished before the heap filled).", ""]
        out += self.targets()
        return "\n".join(out) + "\n"

    def targets(self) -> list[str]:
        lines = ["Targets (issue 18):", ""]

        def verdict(ok: bool) -> str:
            return "met" if ok else "NOT met"

        # Swap is judged by its best showing: under swap Serial beats G1 on some workloads and
        # G1 beats Serial on others (RESULTS, 2026-12-04).
        swaps = [c for c in self.a.configs if base_config(c) == "kswap"]

        for name in self.workloads:
            base = self.medians(name, "local", 100).get("wall_s")
            for pct in self.a.budgets:
                for config in ("farmem", *PATCHED):
                    if config not in self.a.configs:
                        continue
                    m = self.medians(name, config, pct)
                    if not (base and m.get("wall_s")):
                        continue
                    ratio = m["wall_s"] / base
                    parts = [f"{ratio:.2f}× all-local"]
                    want = FIT_TARGET if pct == 100 else TARGETS.get((name, pct))
                    if want:
                        parts[0] += f" (target ≤ {want}×: {verdict(ratio <= want)})"
                    swap_wall = {c: self.medians(name, c, pct).get("wall_s") for c in swaps}
                    timed = sorted((w, c) for c, w in swap_wall.items() if w)
                    if timed:
                        sw, fastest = timed[0]
                        speed = sw / m["wall_s"]
                        against = f" ({LABEL[fastest]}, the fastest of {len(swaps)})" if len(swaps) > 1 else ""
                        parts.append(f"{speed:.2f}× faster than Linux swap{against} (target ≥ {SWAP_TARGET}×: "
                                     f"{verdict(speed >= SWAP_TARGET)})")
                        failed = [LABEL[c] for c, w in swap_wall.items() if not w]
                        if failed:
                            parts.append("failed at this limit: " + ", ".join(failed))
                    elif swaps:
                        parts.append("Linux swap failed at this limit")
                    lines.append(f"- {name} at {pct}%, {LABEL[config]}: " + "; ".join(parts))
        return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="spark,neo4j,h2,gcchurn")
    ap.add_argument("--configs", default="local,kswap,farmem,memliner,fjdk")
    ap.add_argument("--budgets", default="50,25",
                    help="percent of -Xmx local (default 50,25); 100: the whole heap local, a JVM that fits")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="bench",
                    help="bench (default) or smoke: the sizes of tests/test_seeds.py")
    ap.add_argument("--heap", help="-Xmx of every workload (default: each workload's own)")
    ap.add_argument("--overhead", help="non-heap allowance of the kswap cgroup for every workload "
                                       "(default: measured in the untimed warm-up run)")
    ap.add_argument("--args", action="append", default=[], metavar="NAME=FLAGS",
                    help='a workload\'s own flags instead of the preset, e.g. --args "gcchurn=--live-mb 200 --steps 150000"')
    ap.add_argument("--jvm", default="", metavar="JVMFLAGS",
                    help='JVM flags for every configuration, all local included, e.g. --jvm=-XX:+UseShenandoahGC (with the =)')
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=CONFIG[@JDK]:JVMFLAGS",
                    help='another configuration: CONFIG with more JVM flags, or with another Java home '
                         '(a farmem JDK for memliner and fjdk), e.g. --variant "slide=fjdk:-XX:FarmemRemoteDeadRatio=0" '
                         'or "l25=local@build/jdks/25:"; name it in --configs')
    ap.add_argument("--build", action="append", default=[], metavar="NAME=DIR",
                    help="run variant NAME with the farmem build in DIR (FARMEM_BUILD: its lib/ and bin/), "
                         "e.g. another worktree's build/")
    ap.add_argument("--run-args", action="append", default=[], metavar="NAME=ARGS",
                    help='more `farmem run` options for variant NAME, e.g. --run-args "ev=--evict-threads 1"')
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VAR=VALUE",
                    help='an environment variable for variant NAME\'s runs, e.g. --env "eb=FARMEM_EVICT_BATCH=32"')
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per run (default 3600)")
    ap.add_argument("--out", help="append the markdown section to this file (e.g. bench/RESULTS.md)")
    ap.add_argument("--json", dest="json_out", help="write every run's record here")
    a = ap.parse_args()
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.jvm = shlex.split(a.jvm)
    if a.jvm:
        LABEL["farmem"] = "farmem, stock JDK"
    a.configs = [c for c in a.configs.split(",") if c]
    for b in a.build:
        name, _, d = b.partition("=")
        if not name or not all(os.path.isfile(os.path.join(d, f)) for f in
                                ("lib/libfarmem_preload.so", "lib/libfarmem_agent.so", "bin/farmem-memd")):
            ap.error(f"bad --build {b!r}: NAME=DIR, DIR a build directory with lib/libfarmem_preload.so, "
                     "lib/libfarmem_agent.so and bin/farmem-memd")
        BUILDS[name] = os.path.abspath(d)
    for r in a.run_args:
        name, _, args = r.partition("=")
        if not name or not args.strip():
            ap.error(f"bad --run-args {r!r}: NAME=ARGS")
        RUN_ARGS[name] = shlex.split(args)
    for e in a.env:
        name, _, kv = e.partition("=")
        var, eq, val = kv.partition("=")
        if not name or not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
            ap.error(f"bad --env {e!r}: NAME=VAR=VALUE")
        ENVS.setdefault(name, {})[var] = val
    for v in a.variant:
        name, _, rest = v.partition("=")
        base, _, flags = rest.partition(":")
        base, _, jdk = base.partition("@")
        if (not name or name in LABEL or base not in LABEL or (base == "local" and (flags.strip() or not jdk))
                or not (flags.strip() or jdk or name in BUILDS or name in RUN_ARGS or name in ENVS)
                or ((name in RUN_ARGS or name in ENVS) and base in ("local", "kswap"))
                or (jdk and not os.access(os.path.join(jdk, "bin", "java"), os.X_OK))):
            ap.error(f"bad --variant {v!r}: NAME=CONFIG[@JDK]:JVMFLAGS, a new name, CONFIG one of "
                     f"{','.join(LABEL)} (local only @JDK), JDK a Java home: a farmem JDK for memliner or "
                     "fjdk, any for the others")
        VARIANTS[name] = (base, shlex.split(flags), jdk or None)
        LABEL[name] = f"{LABEL[base]}" + (f", {flags.strip()}" if flags.strip() else "") + (f", JDK {jdk}" if jdk else "") + \
            (f", build {BUILDS[name]}" if name in BUILDS else "") + \
            (f", farmem run {' '.join(RUN_ARGS[name])}" if name in RUN_ARGS else "") + \
            "".join(f", {k}={v}" for k, v in ENVS.get(name, {}).items())
    if [n for n in BUILDS if n not in VARIANTS]:
        ap.error(f"--build names no --variant: {','.join(n for n in BUILDS if n not in VARIANTS)}")
    if [n for n in RUN_ARGS if n not in VARIANTS]:
        ap.error(f"--run-args names no --variant: {','.join(n for n in RUN_ARGS if n not in VARIANTS)}")
    if [n for n in ENVS if n not in VARIANTS]:
        ap.error(f"--env names no --variant: {','.join(n for n in ENVS if n not in VARIANTS)}")
    a.budgets = [int(b) for b in a.budgets.split(",") if b]
    a.args = dict(x.split("=", 1) for x in a.args if "=" in x)
    bad = [w for w in a.workloads if w not in SIZES["bench"]] + [c for c in a.configs if c not in LABEL] + \
        [w for w in a.args if w not in a.workloads]
    if bad or not a.workloads or not a.configs or a.repeats < 1 or any(not 0 < b <= 100 for b in a.budgets):
        ap.error(f"bad --workloads/--configs/--budgets/--repeats {' '.join(bad)}")
    r = subprocess.run(["make", "-s", "all", "seeds"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench_seeds: make all seeds failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    # kswap splits faults by thread and counts swap-ins only with its eBPF tracer; without it the
    # runs still work, with those columns at 0.
    if "kswap" in a.configs and subprocess.run(["make", "-s", "build/bin/farmem-trace"], cwd=ROOT,
                                               capture_output=True).returncode:
        log("bench_seeds: farmem-trace does not build: kswap's fault split and swap-ins will read 0")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = " ".join(open("/proc/loadavg").read().split()[:3])
    b = Bench(a)
    try:
        b.run()
    finally:
        subprocess.run(["rm", "-rf", b.workdir])
    text = b.report(started, load0)
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n" + text)
        log(f"bench_seeds: appended to {a.out}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(b.warm_ups + b.records, f, indent=1)
    # A configuration this machine lacks (no root, no farmem JDK) is said in the table, not a failure;
    # nor is Linux swap killed by its cgroup's OOM killer.
    return 0 if all(r["ok"] or r["config"] in b.unavailable or r.get("baseline_killed") for r in b.records) else 1


if __name__ == "__main__":
    sys.exit(main())
