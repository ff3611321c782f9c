# SPDX-License-Identifier: Apache-2.0
"""bench/exit_latency.py: the time from a program's marker line to its command's exit, and a run that
fails or never prints the marker is said and makes the exit status 1."""

import subprocess
import sys

from conftest import REPO

TOOL = [sys.executable, str(REPO / "bench" / "exit_latency.py")]


def test_the_time_after_the_marker_is_what_the_command_does_after_it():
    r = subprocess.run(TOOL + ["--marker", "done", "--reps", "2",
                               "--cmd", "sh -c 'echo start; sleep 0.2; echo done; sleep 0.4'"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [float(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("run ")]
    assert len(runs) == 2 and all(0.35 <= t < 3 for t in runs), r.stdout
    assert "median" in r.stdout


def test_a_failed_run_or_a_missing_marker_fails_the_tool():
    r = subprocess.run(TOOL + ["--marker", "done", "--reps", "1", "--cmd", "sh -c 'echo done; exit 3'",
                               "--cmd", "echo nothing"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "status 3" in r.stdout and "never seen" in r.stdout
