# SPDX-License-Identifier: Apache-2.0
"""bench/gc_phase_io.py: a JVM's pager counters split by GC pause and full-GC phase. One test splits
a GC log and counter samples whose answer is known; one splits a real JVM's paging under farmem and
checks that the split adds up to what farmem run's summary counted."""

import json
import os
import subprocess

import pytest

from conftest import bench_module, run_jvm_tool

gc_phase_io = bench_module("gc_phase_io")

# Lines as `-Xlog:gc,gc+phases=info:file=F:time` writes them: each span at its end, with its length.
LOG = """\
[2026-12-04T06:00:00.000+0000] Using G1
[2026-12-04T06:00:01.100+0000] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 300M->100M(1024M) 100.000ms
[2026-12-04T06:00:03.000+0000] GC(1) Phase 1: Mark live objects 200.000ms
[2026-12-04T06:00:03.000+0000] GC(1) Phase 2: Prepare for compaction 0.000ms
[2026-12-04T06:00:03.000+0000] GC(1) Phase 3: Adjust pointers 0.000ms
[2026-12-04T06:00:03.400+0000] GC(1) Phase 4: Compact heap 400.000ms
[2026-12-04T06:00:03.500+0000] GC(1) Pause Full (G1 Compaction Pause) 1000M->600M(1024M) 800.000ms
[2026-12-04T06:00:04.500+0000] GC(2) Concurrent Mark Cycle
[2026-12-04T06:00:04.100+0000] GC(2) Pause Remark 700M->700M(1024M) 100.000ms
[2026-12-04T06:00:05.000+0000] GC(2) Concurrent Mark Cycle 1000.000ms
"""
T0 = gc_phase_io.log_time("2026-12-04T06:00:00.000+0000")


def counters(n):
    return dict.fromkeys(gc_phase_io.COUNTERS, n)


def test_splits_counters_by_the_innermost_span_over_them():
    spans = gc_phase_io.parse_gc_log(LOG)
    kinds = sorted((round(s[0] - T0, 3), round(s[1] - T0, 3), s[3]) for s in spans)
    assert kinds == [(1.0, 1.1, "young pauses, Normal"),
                     (2.7, 3.5, "full GC, outside its phases"),
                     (2.8, 3.0, "full GC, Phase 1: Mark live objects"),
                     (3.0, 3.0, "full GC, Phase 2: Prepare for compaction"),
                     (3.0, 3.0, "full GC, Phase 3: Adjust pointers"),
                     (3.0, 3.4, "full GC, Phase 4: Compact heap"),
                     (4.0, 4.1, "other pauses (remark, cleanup)"),
                     (4.0, 5.0, gc_phase_io.MARKING)]
    # 100 of each counter a second, read every half second from 0.5 s to 5.5 s: each label gets
    # 100 per second it covers, whichever reads straddle its edges.
    samples = [(T0 + 0.5 + k / 2, counters(100 * (0.5 + k / 2))) for k in range(11)]
    split = gc_phase_io.attribute(samples, spans)
    want = {"young pauses, Normal": 0.1, "full GC, outside its phases": 0.2, "full GC, Phase 1: Mark live objects": 0.2,
            "full GC, Phase 4: Compact heap": 0.4, "other pauses (remark, cleanup)": 0.1,
            gc_phase_io.MARKING: 0.9, gc_phase_io.OUTSIDE: 5.0 - 0.1 - 0.8 - 1.0}
    assert set(split) == set(want)
    for label, seconds in want.items():
        assert split[label]["seconds"] == pytest.approx(seconds), label
        assert split[label]["remote_reads"] == pytest.approx(100 * seconds), label
    assert sum(d["faults"] for d in split.values()) == pytest.approx(500)
    text = gc_phase_io.report(split)
    lines = text.splitlines()
    assert lines[1].startswith(gc_phase_io.OUTSIDE) and lines[-1].startswith("all")  # the longest first
    assert any(ln.startswith("full GC, Phase 4: Compact heap") and "   8%" in ln for ln in lines)  # 0.4 s of 5


def test_adds_its_gc_log_after_java_and_wants_a_jvm():
    cmd = ["./farmem", "run", "--local", "50%", "--", "/usr/bin/java", "-Xmx1g", "Main"]
    assert gc_phase_io.with_gc_log(cmd, "/t/gc.log") == cmd[:6] + [
        "-Xlog:gc,gc+phases=info:file=/t/gc.log:time"] + cmd[6:]
    with pytest.raises(ValueError):
        gc_phase_io.with_gc_log(["./farmem", "run", "--", "python3", "x.py"], "/t/gc.log")


def test_follows_no_map_of_a_process_gone_or_unpaged():
    """The sampler asks again while the JVM starts and until it ends: neither is an error."""
    from farmem import procmap
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert procmap.own_map_fd(gone.pid) is None
    assert procmap.own_map_fd(os.getpid()) is None  # pytest holds no farmem-map


@pytest.mark.jvm
@pytest.mark.pager
@pytest.mark.memd
def test_splits_a_jvm_under_farmem_into_what_its_summary_counted(build, jvm_built, tmp_path, private_tmp):
    out, summary = tmp_path / "split.json", tmp_path / "summary.json"
    r = run_jvm_tool("gc_phase_io", ["--json", out], build, private_tmp, run_args=["--summary-json", summary])
    split, s = json.loads(out.read_text()), json.loads(summary.read_text())
    # Every fault and transfer the pager counted is in some row, once.
    for k in ("faults", "remote_reads", "remote_writes", "zero_fills", "gc_faults"):
        assert sum(d[k] for d in split.values()) == pytest.approx(s[k]), k
    assert s["remote_reads"] > 0 and s["gc_faults"] > 0
    young = [d for label, d in split.items() if label.startswith("young pauses, ")]  # by G1's kind
    assert sum(d["seconds"] for d in young) > 0 and sum(d["gc_faults"] for d in young) > 0
    assert "young pauses, Normal" in r.stdout and "\nall " in r.stdout
