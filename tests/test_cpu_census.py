# SPDX-License-Identifier: Apache-2.0
"""bench/cpu_census.py: every CPU's samples while a JVM ran, placed in the GC span they fell in. One test
places samples whose answer is known; one samples a real JVM under farmem and checks the table against
the run's own length and threads (skipped where perf cannot sample every CPU here)."""

import json
import time

import pytest

from conftest import bench_module, run_jvm_tool
from test_gc_profile import perf_succeeds

cpu_census = bench_module("cpu_census")

# `-Xlog:gc,gc+phases=info:file=F:timenanos`: each span at its end (CLOCK_MONOTONIC ns), with its length.
LOG = """\
[1000000000ns] Using G1
[1100000000ns] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 300M->100M(1024M) 100.000ms
[3400000000ns] GC(1) Phase 4: Compact heap 400.000ms
[3500000000ns] GC(1) Pause Full (G1 Compaction Pause) 1000M->600M(1024M) 800.000ms
"""

# `perf script -F comm,tid,time --ns` of `perf record -a`: the idle task is tid 0.
SCRIPT = """\
            java  4101 0.500000000: 
         swapper     0 0.500500000: 
     GC Thread#0  4110 1.050000000: 
     GC Thread#1  4111 1.060000000: 
            java  4101 2.000000000: 
     GC Thread#0  4110 3.200000000: 
     GC Thread#1  4111 3.450000000: 
     VM Thread    4105 2.800000000: 
            java  4101 3.600000000: 
         swapper     0 3.700000000: 
     farmem-memd  4000 3.800000000: 
"""


def test_places_each_sample_in_the_innermost_span_and_the_time_around_the_gcs_apart():
    samples = cpu_census.parse_samples(SCRIPT)
    assert len(samples) == 11
    assert samples[1] == (0.5005, cpu_census.IDLE) and samples[2] == (1.05, "GC Thread")
    c = cpu_census.census(samples, cpu_census.phase_io.parse_gc_log(LOG))
    assert c == {
        (cpu_census.BEFORE, "java"): 1,
        (cpu_census.BEFORE, cpu_census.IDLE): 1,
        ("young pauses, Normal", "GC Thread"): 2,
        (cpu_census.phase_io.OUTSIDE, "java"): 1,
        # The full GC's pause runs 2.7-3.5 s, its phase 4 3.0-3.4 s.
        ("full GC, outside its phases", "VM Thread"): 1,
        ("full GC, outside its phases", "GC Thread"): 1,
        ("full GC, Phase 4: Compact heap", "GC Thread"): 1,
        (cpu_census.AFTER, "java"): 1,
        (cpu_census.AFTER, cpu_census.IDLE): 1,
        (cpu_census.AFTER, "farmem-memd"): 1,
    }
    # 2 CPUs sampled 10 times a second: a sample is 0.1 CPU seconds and 0.05 s of wall time.
    rows = cpu_census.table(c, 10, 2, 6)
    assert rows[0]["span"] == cpu_census.AFTER and rows[0]["wall_s"] == pytest.approx(0.15)
    assert rows[0]["cpu_s"] == pytest.approx({"java": 0.1, cpu_census.IDLE: 0.1, "farmem-memd": 0.1})
    assert sum(r["wall_s"] for r in rows) == pytest.approx(len(samples) * 0.05)
    text = cpu_census.report(rows)
    assert text.splitlines()[-1].split() == ["all", "0.55"]


@pytest.mark.jvm
@pytest.mark.pager
@pytest.mark.memd
def test_samples_a_jvm_under_farmem_for_as_long_as_it_ran(build, jvm_built, tmp_path, private_tmp):
    if not perf_succeeds("record", "-q", "-a", "-o", "/dev/null", "--", "true"):
        pytest.skip("perf cannot sample every CPU here (linux-perf missing, or perf_event_paranoid)")
    out = tmp_path / "cpu.json"
    t0 = time.monotonic()
    run_jvm_tool("cpu_census", ["--freq", 499, "--json", out], build, private_tmp)
    took = time.monotonic() - t0
    rows = {r["span"]: r for r in json.loads(out.read_text())}
    wall = sum(r["wall_s"] for r in rows.values())
    # Every CPU was sampled for the whole command, which ran inside the time the tool took.
    assert 0.5 * took <= wall <= took * 1.05, (wall, took)
    assert cpu_census.BEFORE in rows and cpu_census.AFTER in rows
    young = [r for s, r in rows.items() if s.startswith("young pauses, ")]
    assert young and sum(r["cpu_s"].get("GC Thread", 0) for r in young) > 0, rows
    outside = [r for s, r in rows.items() if s.startswith("outside pauses")]
    assert outside and sum(r["cpu_s"].get("java", 0) for r in outside) > 0, rows
