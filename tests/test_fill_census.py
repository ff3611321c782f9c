# SPDX-License-Identifier: Apache-2.0
"""bench/fill_census.py: every page a JVM's faults filled, placed in the GC span it happened in. One
test places fills whose answer is known; one counts a real JVM's fills under farmem with a uprobe and
checks them against what farmem run's summary counted (skipped where perf cannot record here)."""

import json
import subprocess

import pytest

from conftest import bench_module, run_jvm_tool
from test_gc_profile import perf_records, perf_succeeds

fill_census = bench_module("fill_census")

# `-Xlog:gc,gc+phases=info:file=F:timenanos`: each span at its end (CLOCK_MONOTONIC ns), with its length.
LOG = """\
[1000000000ns] Using G1
[1100000000ns] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 300M->100M(1024M) 100.000ms
[3000000000ns] GC(1) Phase 1: Mark live objects 200.000ms
[3400000000ns] GC(1) Phase 4: Compact heap 400.000ms
[3500000000ns] GC(1) Pause Full (G1 Compaction Pause) 1000M->600M(1024M) 800.000ms
[4100000000ns] GC(2) Pause Remark 700M->700M(1024M) 100.000ms
[5000000000ns] GC(2) Concurrent Mark Cycle 1000.000ms
"""

# `perf script -F comm,time,event,trace --ns` of the probe: the page's address and its state byte before.
SCRIPT = """\
            java 0.500000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0000000 b=0
     GC Thread#0 1.050000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0001000 b=0
     GC Thread#1 1.060000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0002000 b=70
     GC Thread#0 2.900000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0003000 b=6
     GC Thread#1 3.200000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0004000 b=0
     GC Thread#0 3.450000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0005000 b=6
        G1 Conc#0 4.050000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0006000 b=6
        G1 Conc#0 4.500000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0007000 b=134
            java 4.600000000:    probe_libfarmem_agent:fm_census_fill: (7f00) addr=0xc0008000 b=6
"""


def test_places_each_fill_in_the_innermost_span_at_its_time():
    fills = fill_census.parse_fills(SCRIPT)
    assert len(fills) == 9
    assert fills[1] == (1.05, "GC Thread", "zero fill") and fills[2][2] == "remote read"  # 70 & 7 == 6
    c = fill_census.census(fills, fill_census.phase_io.parse_gc_log(LOG))
    # A remark inside a mark cycle is the remark's; a fill in a full GC outside its phases is the pause's.
    assert c == {
        (fill_census.phase_io.OUTSIDE, "java", "zero fill"): 1,
        ("young pauses, Normal", "GC Thread", "zero fill"): 1,
        ("young pauses, Normal", "GC Thread", "remote read"): 1,
        ("full GC, Phase 1: Mark live objects", "GC Thread", "remote read"): 1,
        ("full GC, Phase 4: Compact heap", "GC Thread", "zero fill"): 1,
        ("full GC, outside its phases", "GC Thread", "remote read"): 1,
        ("other pauses (remark, cleanup)", "G1 Conc", "remote read"): 1,
        (fill_census.phase_io.MARKING, "G1 Conc", "remote read"): 1,
        (fill_census.phase_io.MARKING, "java", "remote read"): 1,
    }
    text = fill_census.report(c, 4)
    assert text.splitlines()[0] == "9 fills"
    assert any(ln.strip() == "2  22%  young pauses, Normal" for ln in text.splitlines())


def uprobes_work(lib) -> bool:
    """Can perf put a uprobe on the agent's fill here (tracefs, root, the agent's debug information)?"""
    added = perf_succeeds("probe", "-q", "-x", lib, "--add", "fm_census_check=fill")
    perf_succeeds("probe", "-q", "-d", "probe_libfarmem_agent:fm_census_check")
    return added


@pytest.mark.jvm
@pytest.mark.pager
@pytest.mark.memd
def test_counts_a_jvms_fills_as_its_summary_counted_its_faults(build, jvm_built, tmp_path, private_tmp):
    if not perf_records():
        pytest.skip("perf cannot record here (linux-perf missing, or perf_event_paranoid)")
    if not uprobes_work(build / "lib" / "libfarmem_agent.so"):
        pytest.skip("perf cannot place a uprobe on the agent here (no tracefs, or no debug information)")
    out, summary = tmp_path / "census.json", tmp_path / "summary.json"
    run_jvm_tool("fill_census", ["--json", out], build, private_tmp, run_args=["--summary-json", summary])
    rows, s = json.loads(out.read_text()), json.loads(summary.read_text())
    total = sum(x["fills"] for x in rows)
    # Each fault fills its page once; a fill the kernel skipped (the page was there already) is no fault.
    assert s["faults"] <= total <= s["faults"] * 1.02 + 50, (total, s["faults"])
    by_how = {h: sum(x["fills"] for x in rows if x["how"] == h) for h in ("zero fill", "remote read")}
    # The summary's counts include the pages fetched and zero-filled ahead, which the census leaves out.
    assert 0 < by_how["zero fill"] <= s["zero_fills"] and 0 < by_how["remote read"] <= s["remote_reads"]
    assert any(x["span"].startswith("young pauses, ") and x["thread"] == "GC Thread" for x in rows)
    # The probe is gone with the run.
    probes = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    assert "fm_census_fill" not in probes
