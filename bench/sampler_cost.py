#!/usr/bin/env python3
"""What bench_seeds.py's smaps sampler (RssSampler) costs the JVM it samples: all-local GcChurn with
the sampler beside it and without, interleaved, each pair in alternating order.

    .venv/bin/python bench/sampler_cost.py [--heap 1g] [--live-mb 600] [--steps 300000] [--reps 4]

bench_seeds.py samples only its untimed warm-up run since session 86; this is the measurement that
moved it there (bench/RESULTS.md, session 86). Every run must print GcChurn's own "ok".
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench_seeds import RssSampler  # this script's directory, bench/, is first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heap", default="1g")
    ap.add_argument("--live-mb", default="600")
    ap.add_argument("--steps", default="300000")
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args()
    argv = ["java", f"-Xmx{a.heap}", f"-Xms{a.heap}", "-cp", os.path.join(ROOT, "build", "java"), "GcChurn",
            "--live-mb", a.live_mb, "--steps", a.steps]
    walls: dict = {"plain": [], "sampled": []}
    for rep in range(a.reps):
        for kind in ("plain", "sampled") if rep % 2 == 0 else ("sampled", "plain"):
            t0 = time.monotonic()
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            s = RssSampler(p.pid) if kind == "sampled" else None
            if s:
                s.start()
            out, _ = p.communicate()
            walls[kind].append(time.monotonic() - t0)
            if s:
                s.stop.set()
                s.join()
            if p.returncode or "gcchurn: ok" not in out:
                print(f"{kind} run failed (status {p.returncode}):\n{out[-2000:]}", file=sys.stderr)
                return 1
    for kind, w in walls.items():
        print(f"{kind:8s} median {statistics.median(w):.2f} s  runs {' '.join(f'{x:.2f}' for x in w)}")
    print(f"sampled / plain {statistics.median(walls['sampled']) / statistics.median(walls['plain']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
