# SPDX-License-Identifier: Apache-2.0
"""bench/gc_profile.py: a JVM's CPU samples under farmem sorted by thread kind and G1 task, with the
pager's functions on each task's stacks. One test sorts a perf script text whose answer is known;
one samples a real JVM under farmem with perf (skipped where perf cannot record here)."""

import json
import subprocess

import pytest

from conftest import bench_module, run_jvm_tool

gc_profile = bench_module("gc_profile")

# Three samples as `perf script -F comm,tid,ip,sym` prints them: frames leaf first, the root last.
SCRIPT = """\
GC Thread#1  4242
\t    7f01 intact
\t    7f02 shm_page_open
\t    7f03 farmem_read_words
\t    7f04 G1FarmemInPlace::full_gc_size
\t    7f05 G1FullGCPrepareTask::work
\t    7f06 GangWorker::loop
\t    7f07 thread_native_entry

GC Thread#0  4241
\t    7f11 __memcpy_avx512_unaligned_erms (inlined)
\t    7f12 G1ParScanThreadState::trim_queue_to_threshold
\t    7f13 G1EvacuateRegionsBaseTask::work
\t    7f14 GangWorker::loop

java  4200
\t    7f21 fm_uffd_copy
\t    7f22 fm_prefetch
\t    7f23 on_sigbus
\t    7f24 Interpreter

G1 Conc#0  4250
\t    7f31 [unknown]
"""


def test_sorts_samples_by_thread_kind_task_and_pager_function():
    r = gc_profile.sort_samples(gc_profile.parse_script(SCRIPT))
    assert r["samples"] == 4
    assert r["threads"] == {"GC Thread": 2, "java": 1, "G1 Conc": 1}
    t = r["tasks"]
    assert t["GC Thread: G1FullGCPrepareTask"] == {"samples": 1, "pager": {"intact": 1, "shm_page_open": 1,
                                                                           "farmem_read_words": 1}}
    assert t["GC Thread: G1EvacuateRegionsBaseTask"] == {"samples": 1, "pager": {}}  # the outermost task names it
    assert t["java"] == {"samples": 1, "pager": {"fm_uffd_copy": 1, "fm_prefetch": 1, "on_sigbus": 1}}
    assert t["G1 Conc: other"]["samples"] == 1
    assert r["pager"]["on_sigbus"] == 1 and r["pager"]["intact"] == 1
    text = gc_profile.report(r, 10)
    line = next(ln for ln in text.splitlines() if "G1FullGCPrepareTask" in ln)
    assert "4 samples" in text and "25.0%" in line and "intact 100%" in line and "farmem_read_words 100%" in line


def perf_succeeds(*args) -> bool:
    """Does `perf ARGS` exit 0 here (perf installed, and allowed to)?"""
    try:
        r = subprocess.run(["perf", *map(str, args)], capture_output=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def perf_records() -> bool:
    return perf_succeeds("record", "-q", "-o", "/dev/null", "--", "true")


@pytest.mark.jvm
@pytest.mark.pager
@pytest.mark.memd
def test_profiles_a_jvm_under_farmem(build, jvm_built, tmp_path, private_tmp):
    if not perf_records():
        pytest.skip("perf cannot record here (linux-perf missing, or perf_event_paranoid)")
    out = tmp_path / "p.json"
    r = run_jvm_tool("gc_profile", ["--after", "0.5", "--seconds", "1", "--freq", "200", "--json", out], build,
                     private_tmp, steps=200000)
    p = json.loads(out.read_text())
    assert p["samples"] > 20
    assert p["threads"].get("GC Thread", 0) > 0 and p["threads"].get("java", 0) > 0
    # At half the heap local the program's thread and the collector fault: the pager is on their stacks.
    assert p["pager"].get("on_sigbus", 0) > 0
    assert any(t.startswith("GC Thread: G1") for t in p["tasks"]), p["tasks"]
    assert "by thread kind: " in r.stdout
