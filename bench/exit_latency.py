#!/usr/bin/env python3
"""How long a command takes to end after its program says it is done: from the first stdout line
that holds a marker to the command's exit, each run in turn, commands interleaved.

    python3 bench/exit_latency.py --marker 'gcchurn: ok' --reps 3 \\
        --cmd 'java -Xmx1g -Xms1g -cp build/java GcChurn --live-mb 600 --steps 300000' \\
        --cmd './farmem run --local 50% -- java -Xmx1g -Xms1g -cp build/java GcChurn --live-mb 600 --steps 300000'

What it times is the program's own last work after the line, its exit, and whatever waits after it
(farmem run: memd giving back its store, the summary). Prints each run and each command's median;
exit status 1 if a run failed or never printed the marker.
"""
import argparse
import shlex
import statistics
import subprocess
import sys
import time


def latency(cmd: list, marker: str) -> tuple[float | None, float, int]:
    """(seconds from the marker's line to the exit or None if it never came, seconds in all, status)."""
    t0 = time.monotonic()
    seen = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as p:
        for line in p.stdout:
            if seen is None and marker in line:
                seen = time.monotonic()
        rc = p.wait()
    end = time.monotonic()
    return (None if seen is None else end - seen), end - t0, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--marker", required=True, help="text of the program's last line (or any line) to time from")
    ap.add_argument("--cmd", action="append", required=True, help="a command line (shell words), repeatable")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    cmds = [shlex.split(c) for c in a.cmd]
    got: dict = {c: [] for c in a.cmd}
    bad = 0
    for rep in range(a.reps):
        for text, cmd in zip(a.cmd, cmds):
            after, total, rc = latency(cmd, a.marker)
            if rc != 0 or after is None:
                bad += 1
                print(f"run {rep + 1}: {text}: status {rc}, marker {'seen' if after is not None else 'never seen'}")
                continue
            got[text].append(after)
            print(f"run {rep + 1}: {after:.3f} s after the marker ({total:.2f} s in all): {text}")
    for text, v in got.items():
        if v:
            print(f"median {statistics.median(v):.3f} s after the marker over {len(v)} runs: {text}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
