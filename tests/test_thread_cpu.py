# SPDX-License-Identifier: Apache-2.0
"""bench/thread_cpu.py: a JVM's CPU time by thread kind from /proc. One test sums known readings; one
reads a real JVM, paged by farmem, whose threads must all be there and whose seconds must fit the
machine; one passes on the command's exit status."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, bench_module, run_jvm_tool

thread_cpu = bench_module("thread_cpu")


def test_sums_threads_by_kind():
    k = thread_cpu.by_kind({"1": ("GC Thread#0", 1.0, 0.5, 1.6, 0.1), "2": ("GC Thread#1", 2.0, 0.25, 2.3, 0.2),
                            "3": ("java", 0.5, 1.0, 1.5, 0.0), "4": ("Signal Dispatch", 0.0, 0.0, 0.0, 0.0)})
    assert list(k) == ["GC Thread", "java", "Signal Dispatch"]  # most on-CPU time first
    assert k["GC Thread"] == {"threads": 2, "user_s": 3.0, "system_s": 0.75, "run_s": pytest.approx(3.9),
                              "wait_s": pytest.approx(0.3)}
    text = thread_cpu.report(k, 4.0)
    assert "GC Thread" in text and "java" in text and "Signal Dispatch" not in text  # idle kinds left out


@pytest.mark.jvm
@pytest.mark.pager
@pytest.mark.memd
def test_reads_a_jvm_under_farmem(build, jvm_built, tmp_path, private_tmp):
    out = tmp_path / "t.json"
    r = run_jvm_tool("thread_cpu", ["--json", out], build, private_tmp)
    t = json.loads(out.read_text())
    kinds = t["kinds"]
    for kind in ("java", "GC Thread", "VM Thread"):
        assert kind in kinds, kinds
    # The program's thread faulted at half its heap local: faults are system time (SIGBUS, UFFDIO_COPY).
    assert kinds["java"]["run_s"] > 0.1 and kinds["java"]["system_s"] > 0, kinds["java"]
    assert kinds["GC Thread"]["threads"] >= 1 and kinds["GC Thread"]["run_s"] > 0
    on_cpu = sum(k["run_s"] for k in kinds.values())
    assert on_cpu <= t["wall_s"] * os.cpu_count() + 0.5, (on_cpu, t["wall_s"])
    for k in kinds.values():  # the tick-counted split is within a few ticks of the nanosecond total
        assert k["user_s"] + k["system_s"] <= k["run_s"] + 0.05 * k["threads"] + 0.1, k


def test_passes_on_the_commands_status(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "thread_cpu.py"), "--", "sh", "-c", "exit 3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "no java process" in r.stderr
