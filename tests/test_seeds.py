# SPDX-License-Identifier: Apache-2.0
"""The seeds' workloads (issue 18), small: Apache Spark (PageRank in local[2] mode) and Neo4j
embedded, both real code from Maven Central (`make seeds`), each run under
`farmem run --local 25% -- java ...` with the system's JDK. A run passes when the workload's own
verdict is ok (it checked every answer against a plain-Java computation of the same data), its
digest is the one an unpaged run prints, and the summary shows that the heap really went to memd
and came back. Each workload's checker is also shown to catch a wrong answer.

About 70 s on two quiet CPUs: Spark 22 s and Neo4j 19 s at 25% local (the JVMs start slowly:
each loads thousands of classes), the driver's check 13 s; four times that beside a HotSpot
build.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.memd, pytest.mark.pager, pytest.mark.jvm]

# The smoke sizes; bench/bench_seeds.py --size smoke runs the same.
SPARK = ["-Xmx512m", "-jar", "build/java/spark/spark-workload.jar", "--nodes", "100000", "--iters", "3"]
NEO4J = ["-Xmx256m", "-jar", "build/java/neo4j/neo4j-workload.jar", "--nodes", "10000", "--rounds", "100",
         "--batch", "5000"]
# What an unpaged run of those prints: a function of the flags alone (the generator is seeded and
# the digest comes from exact or plain-Java figures, not from Spark's summation order).
SPARK_DIGEST = "digest=9fc578859b6d4b10"
NEO4J_CHECKSUM = "checksum=5db1c82ac1d74ceb"


@pytest.fixture(scope="module")
def seeds_built(built, jvm_built):
    built("build/java/spark/spark-workload.jar")
    built("build/java/neo4j/neo4j-workload.jar")


def run(prefix, java_args, private_tmp):
    """prefix + java JAVA_ARGS from the checkout, with java.io.tmpdir (where Spark's shuffle files
    and Neo4j's store go) and TMPDIR in our own directory."""
    return subprocess.run([*prefix, "java", f"-Djava.io.tmpdir={private_tmp}", *java_args],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, TMPDIR=private_tmp))


def paged(farmem_cmd, tmp_path, private_tmp, java_args):
    summary = tmp_path / "summary.json"
    r = run([*farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--"], java_args, private_tmp)
    s = json.loads(summary.read_text()) if summary.exists() else {}
    return r, s


def leftovers(private_tmp):
    """What Neo4j (its store) or Spark (shuffle and block-manager directories) left behind."""
    return [n for n in os.listdir(private_tmp) if n.startswith(("farmem-neo4j-", "blockmgr-", "spark-"))]


def assert_paged(s):
    """The heap went to memd and came back, and both kinds of thread faulted."""
    assert s.get("evictions", 0) > 0 and s.get("remote_writes", 0) > 0, s
    assert s.get("remote_reads", 0) > 0, s
    assert s.get("gc_faults", 0) > 0 and s.get("app_faults", 0) > 0, s
    assert s.get("crc_errors", 0) == 0, s


@pytest.mark.parametrize("java_args,verdict,digest", [(SPARK, "spark: ok", SPARK_DIGEST),
                                                      (NEO4J, "neo4j: ok", NEO4J_CHECKSUM)],
                         ids=["spark", "neo4j"])
def test_at_25_percent(farmem_cmd, seeds_built, tmp_path, private_tmp, java_args, verdict, digest):
    r, s = paged(farmem_cmd, tmp_path, private_tmp, java_args)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert verdict in r.stdout and digest in r.stdout, r.stdout
    assert_paged(s)
    assert not leftovers(private_tmp)


@pytest.mark.parametrize("java_args,mismatch", [
    (["-Xmx512m", "-jar", "build/java/spark/spark-workload.jar", "--nodes", "5000", "--iters", "2"],
     "spark: MISMATCH rank of node 2500"),
    (["-Xmx256m", "-jar", "build/java/neo4j/neo4j-workload.jar", "--nodes", "2000", "--rounds", "10"],
     "neo4j: MISMATCH edges of group 0"),
], ids=["spark", "neo4j"])
def test_a_wrong_answer_fails(seeds_built, private_tmp, java_args, mismatch):
    """--self-test-corrupt alters one figure of the reference: the workload must say so and fail."""
    r = run([], [*java_args, "--self-test-corrupt"], private_tmp)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert mismatch in r.stdout, r.stdout
    assert " ok " not in r.stdout
    assert not leftovers(private_tmp), "a failed run must still clean up"


# ---- bench/bench_seeds.py ---------------------------------------------------------------------

@pytest.mark.parametrize("gc, exit_line", [("-XX:+UseG1GC", "garbage-first heap"),
                                           ("-XX:+UseShenandoahGC", "Shenandoah Heap")])
def test_gclog_reads_allocation_and_pauses(jvm_built, tmp_path, gc, exit_line):
    """bench/lib/gclog.py on a real G1 or Shenandoah log: GcChurn allocates its 64 MiB live set, then
    replaces 20,000 arrays of 2-32 KiB (about 340 MB more), besides its short-lived garbage."""
    sys.path.insert(0, os.path.join(REPO, "bench", "lib"))
    import gclog

    log = tmp_path / "gc.log"
    r = subprocess.run(["java", gc, "-Xmx256m", "-Xms256m", f"-Xlog:gc,gc+heap+exit:file={log}", "-cp",
                        os.path.join(REPO, "build", "java"), "GcChurn", "--live-mb", "64", "--steps", "20000"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
    text = log.read_text()
    alloc = gclog.allocated_bytes(text)
    assert alloc is not None and 300 << 20 <= alloc <= 8 << 30, alloc
    assert 0 < gclog.pause_seconds(text) < 60
    # GcChurn's 64 MiB live set in 256 MiB: young pauses, and whatever full GCs there were are among them.
    assert 0 <= gclog.full_pause_seconds(text) < gclog.pause_seconds(text)
    full = ("[1.539s][info][gc] GC(37) Pause Full (G1 Compaction Pause) 1022M->662M(1024M) 114.521ms\n"
            "[1.600s][info][gc] GC(38) Pause Young (Normal) (G1 Evacuation Pause) 700M->662M(1024M) 9.479ms\n")
    assert gclog.full_pause_seconds(full) == pytest.approx(0.114521)
    assert gclog.pause_seconds(full) == pytest.approx(0.124)
    mixed = full + ("[1.650s][info][gc] GC(39) Pause Young (Prepare Mixed) (G1 Evacuation Pause) 710M->700M(1024M) 9.1ms\n"
                    "[1.700s][info][gc] GC(40) Pause Young (Mixed) (G1 Evacuation Pause) 740M->690M(1024M) 12.0ms\n"
                    "[1.701s][info][gc] GC(41) Pause Remark 690M->690M(1024M) 0.7ms\n")
    assert gclog.collections(mixed) == {"young": 2, "mixed": 1, "full": 1}
    gcs = gclog.collections(text)
    if gc == "-XX:+UseG1GC":
        assert gcs["young"] > 0 and (gcs["full"] > 0) == (gclog.full_pause_seconds(text) > 0), gcs
    else:  # Shenandoah logs its pauses by its own names
        assert gcs == {"young": 0, "mixed": 0, "full": 0}, gcs
    assert exit_line in text  # the exit line closes the last interval
    lo, hi = gclog.heap_range(text)
    assert hi - lo == 256 << 20, (lo, hi)
    assert gclog.allocated_bytes("") is None


def test_bench_seeds_driver(jvm_built, tmp_path):
    """The driver end to end on its smallest workload: all-local, farmem (and Linux swap where this
    machine has it) at 25%, a variant run with a build directory given, the markdown table appended
    to --out, every run's record in --json, a variant's own `farmem run` options. Linux swap's cgroup gets a fixed non-heap allowance: the
    one measured in a 1-s all-local run can fall short of what the swapping JVM holds outside its
    heap, and the cgroup then kills it (CI, 2026-11-27: 47 MiB measured, killed at 111 MiB)."""
    configs = "local,farmem,memliner"
    if os.geteuid() == 0 and (os.path.isdir("/sys/block/zram0") or os.path.isdir("/sys/class/zram-control")):
        configs += ",kswap"
    out, raw = tmp_path / "results.md", tmp_path / "raw.json"
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "python"), os.path.join(REPO, "bench", "bench_seeds.py"),
                        "--size", "smoke", "--workloads", "gcchurn", "--budgets", "25", "--repeats", "1",
                        "--configs", configs + ",again", "--variant", "again=farmem:",
                        "--build", f"again={os.path.join(REPO, 'build')}", "--run-args", "again=--evict-threads 1",
                        "--env", "again=FARMEM_EVICT_BATCH=32",
                        "--overhead", "128M",
                        "--out", str(out), "--json", str(raw)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    text = out.read_text()
    assert "## The seeds' workloads at far memory" in text and "--workloads gcchurn" in text
    assert "| gcchurn | all local | 100% | 1/1 |" in text and "| gcchurn | farmem, stock G1 | 25% | 1/1 |" in text
    recs = {x["config"]: x for x in json.loads(raw.read_text())}
    assert recs["local"]["ok"] and recs["farmem"]["ok"], recs
    # a variant with a build directory of its own (here this checkout's): FARMEM_BUILD reaches farmem run
    assert recs["again"]["ok"] and recs["again"]["remote_reads"] > 0, recs["again"]
    assert f"| gcchurn | farmem, stock G1, build {os.path.join(REPO, 'build')}, farmem run --evict-threads 1, " \
           "FARMEM_EVICT_BATCH=32 | 25% | 1/1 |" in text
    # --run-args reach that variant's farmem run, and only its (session 76 looked them up by the base name)
    argv = recs["again"]["argv"]
    opts = argv[:argv.index("--")]
    assert "--evict-threads" in opts and opts[opts.index("--evict-threads") + 1] == "1", argv
    assert "--evict-threads" not in recs["farmem"]["argv"][:recs["farmem"]["argv"].index("--")]
    # --env reaches that variant's runs too, and only its
    assert recs["again"]["env"] == {"FARMEM_EVICT_BATCH": "32"} and "env" not in recs["farmem"], recs["again"]
    f = recs["farmem"]
    assert f["alloc_bytes"] > 0 and f["gc_faults"] > 0 and f["paged_bytes"] > 0 and f["remote_reads"] > 0, f
    # the farmem JDK is built by `make jdk`, not here: without it the row says why, and that is no failure
    assert recs["memliner"]["ok"] or "make jdk" in recs["memliner"]["error"]
    if "kswap" in recs:
        # Linux swap itself can be OOM-killed at its limit on this kernel (CI, 2026-11-27: at 192 MiB
        # with 28,599 pages swapped out, in 2 s); the driver says so in the table and goes on.
        k = recs["kswap"]
        if k.get("baseline_killed"):
            assert "| gcchurn | Linux swap (kswap, zram) | 25% | 0/1 | failed: killed (SIGKILL" in text, text
        else:
            assert k["ok"] and k["remote_writes"] > 0, k


def test_bench_seeds_times_unsampled_runs(jvm_built, tmp_path):
    """The timed all-local runs, the reference of every ratio, are not sampled (a read of a large
    JVM's smaps costs tens of ms of CPU, ten of them in its first second); each workload's untimed
    warm-up run is, and only when Linux swap runs without --overhead: its non-heap allowance."""
    import argparse
    bs = _bench_seeds_module()
    a = argparse.Namespace(size="smoke", workloads=["gcchurn"], heap=None, args={}, budgets=[25],
                           configs=["local", "farmem"], overhead=None, jvm=[], timeout=300)
    b = bs.Bench(a)
    try:
        assert not b.needs_allowance()
        w = b.warm_up("gcchurn")
        assert w["ok"] and "non_heap_bytes" not in w and w["purpose"] == "warm-up (untimed)", w
        rec = b.run_one("gcchurn", "local", 100, 0)
        assert rec["ok"], rec
        assert "non_heap_bytes" not in rec and "gcchurn" not in b.non_heap, rec
        b.a.configs = ["local", "kswap", "farmem"]
        assert b.needs_allowance()
        b.a.overhead = "128M"
        assert not b.needs_allowance()
        b.a.overhead = None
        m = b.warm_up("gcchurn")
        assert m["ok"] and m["non_heap_bytes"] > 0 and m["purpose"].endswith("non-heap allowance"), m
        assert b.non_heap["gcchurn"] == m["non_heap_bytes"] == b.allowance("gcchurn")
        assert b.warm_ups == [w, m] and b.records == []
        assert b.medians("gcchurn", "local", 100)["runs"] == 0  # warm-ups count in no median
    finally:
        shutil.rmtree(b.workdir, ignore_errors=True)


def _bench_seeds_module():
    """bench/bench_seeds.py as a module of its own (a fresh one: tests change its tables)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_seeds", os.path.join(REPO, "bench", "bench_seeds.py"))
    bs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bs  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bs)
    finally:
        del sys.modules[spec.name]
    return bs


def test_bench_seeds_judges_swap_by_its_fastest_collector(tmp_path):
    """The speed-up over Linux swap is taken against the fastest swap configuration that ran (under
    swap Serial beats G1 on some workloads, G1 beats Serial on others), and a swap configuration
    that failed is named, not passed over."""
    import argparse
    bs = _bench_seeds_module()
    bs.VARIANTS["kserial"] = ("kswap", ["-XX:+UseSerialGC"], None)
    bs.LABEL["kserial"] = bs.LABEL["kswap"] + ", -XX:+UseSerialGC"
    a = argparse.Namespace(size="bench", workloads=["gcchurn", "h2"], heap=None, args={}, budgets=[25],
                           configs=["local", "kswap", "kserial", "farmem"], overhead=None)
    b = bs.Bench(a)
    os.rmdir(b.workdir)

    def rec(name, config, pct, wall):
        return {"workload": name, "config": config, "pct": pct, "ok": wall is not None, "wall_s": wall,
                "error": "killed (SIGKILL)"}
    b.records = [rec("gcchurn", "local", 100, 4.0), rec("gcchurn", "kswap", 25, 90.0),
                 rec("gcchurn", "kserial", 25, 30.0), rec("gcchurn", "farmem", 25, 10.0),
                 rec("h2", "local", 100, 10.0), rec("h2", "kswap", 25, None),
                 rec("h2", "kserial", 25, None), rec("h2", "farmem", 25, 14.0)]
    lines = b.targets()
    churn = next(x for x in lines if x.startswith("- gcchurn at 25%"))
    assert "2.50× all-local (target ≤ 3.0×: met)" in churn, churn
    assert "3.00× faster than Linux swap (Linux swap (kswap, zram), -XX:+UseSerialGC, the fastest of 2)" \
        " (target ≥ 3.0×: met)" in churn, churn
    h2 = next(x for x in lines if x.startswith("- h2 at 25%"))
    assert h2.endswith("1.40× all-local; Linux swap failed at this limit"), h2
    b.records[1] = rec("gcchurn", "kswap", 25, None)
    b.records[2] = rec("gcchurn", "kserial", 25, 45.0)
    churn = next(x for x in b.targets() if x.startswith("- gcchurn at 25%"))
    assert "4.50× faster than Linux swap" in churn and "(target ≥ 3.0×: met)" in churn, churn
    assert churn.endswith("failed at this limit: Linux swap (kswap, zram)"), churn


def test_bench_seeds_judges_a_wholly_local_heap_as_one_that_fits(tmp_path):
    """--budgets 100 (the whole heap local) is judged by issue 18's target for a JVM that fits its
    budget, ≤ 1.03× all-local, with any workload; a budget over 100 is refused."""
    import argparse
    bs = _bench_seeds_module()
    a = argparse.Namespace(size="bench", workloads=["gcchurn", "h2"], heap=None, args={}, budgets=[100],
                           configs=["local", "farmem"], overhead=None)
    b = bs.Bench(a)
    os.rmdir(b.workdir)
    b.records = [{"workload": n, "config": c, "pct": 100, "ok": True, "wall_s": w}
                 for n, c, w in (("gcchurn", "local", 3.0), ("gcchurn", "farmem", 3.06),
                                 ("h2", "local", 5.0), ("h2", "farmem", 5.5))]
    lines = b.targets()
    churn = next(x for x in lines if x.startswith("- gcchurn at 100%"))
    assert churn.endswith("1.02× all-local (target ≤ 1.03×: met)"), churn
    h2 = next(x for x in lines if x.startswith("- h2 at 100%"))
    assert h2.endswith("1.10× all-local (target ≤ 1.03×: NOT met)"), h2
    r = subprocess.run([os.path.join(REPO, ".venv", "bin", "python"), os.path.join(REPO, "bench", "bench_seeds.py"),
                        "--budgets", "101", "--workloads", "gcchurn"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad --workloads/--configs/--budgets" in r.stderr, r.stderr
