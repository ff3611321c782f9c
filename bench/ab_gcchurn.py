#!/usr/bin/env python3
"""Quick A/B of farmem variants on GcChurn: all local and each variant in turn, repeat after repeat,
then each one's median wall time and its ratio to all local's, and the median of each repeat's own
ratio (paired: a host that drifts between repeats moves both sides of it).

    python3 bench/ab_gcchurn.py [--reps 5] [--local 50%] [--steps 300000] \
        --variant 'base=' --variant 'eb32=FARMEM_EVICT_BATCH=32' --variant 'pf2=:--prefetch 2' \
        --variant 'prev=FARMEM_BUILD=/tmp/prev/build'
    python3 bench/ab_gcchurn.py --reps 8 --local 100% --fixed 10 [--java-opt=-XX:+AlwaysPreTouch] --variant 'fits='

A variant is NAME=[VAR=VALUE[,VAR=VALUE...]][:--FARMEM RUN OPTIONS]: environment for its runs (a knob
without a `farmem run` flag, an env-gated experiment, another build's FARMEM_BUILD) and more `farmem
run` options. Lighter than bench_seeds.py (no GC log, no fault columns, no table), for a first look;
what goes into bench/RESULTS.md as a result is measured with bench_seeds.py, which takes the same
variants (--variant, --env, --run-args, --build). Every run must print GcChurn's own "ok".

--java-opt adds a JVM option to every run (-XX:+AlwaysPreTouch: the heap's pages are all touched at
start, so no run takes a first-touch fault later). --fixed N also times N runs of `java -version`,
the same heap and options, under each configuration, interleaved: what the configuration costs a
JVM that does nothing (farmem run's start, the agent, memd, the exit), and each ratio again with
that fixed cost taken out of both sides ("less fixed").
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variant(spec: str):
    name, eq, rest = spec.partition("=")
    # OPTIONS start at ":--", so an environment value may hold colons (JAVA_TOOL_OPTIONS=-XX:...).
    env_part, sep, opts = rest.partition(":--")
    opts = "--" + opts if sep else ""
    if not name or not eq or name == "local":
        raise argparse.ArgumentTypeError(f"bad --variant {spec!r}: NAME=[VAR=VALUE,...][:OPTIONS]")
    env = {}
    for kv in filter(None, env_part.split(",")):
        var, eq, val = kv.partition("=")
        if not var or not eq:
            raise argparse.ArgumentTypeError(f"bad --variant {spec!r}: {kv!r} is no VAR=VALUE")
        env[var] = val
    return name, env, shlex.split(opts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--local", default="50%", help="farmem run --local (default 50%%)")
    ap.add_argument("--live-mb", type=int, default=600)
    ap.add_argument("--steps", type=int, default=300000)
    ap.add_argument("--heap", default="1g", help="-Xmx and -Xms (default 1g)")
    ap.add_argument("--java", default="java", help="the java command (default: java on PATH, Debian's 17)")
    ap.add_argument("--java-opt", action="append", default=[], metavar="OPT",
                    help="a JVM option for every run, given as --java-opt=-XX:+AlwaysPreTouch (repeatable)")
    ap.add_argument("--fixed", type=int, default=0, metavar="N",
                    help="also time N runs of `java -version` under each configuration: its fixed cost")
    ap.add_argument("--variant", action="append", type=parse_variant, required=True,
                    metavar="NAME=[VAR=VALUE,...][:OPTIONS]")
    a = ap.parse_args()
    jvm = [a.java, f"-Xmx{a.heap}", f"-Xms{a.heap}", *a.java_opt]
    java = [*jvm, "-cp", "build/java", "GcChurn", "--live-mb", str(a.live_mb), "--steps", str(a.steps)]
    runs = {"local": (dict(os.environ), java)}
    for name, env, opts in a.variant:
        if name in runs:
            ap.error(f"--variant {name} given twice")
        runs[name] = (dict(os.environ, **env), ["./farmem", "run", "--local", a.local, *opts, "--", *java])
    walls: dict = {name: [] for name in runs}
    # Untimed first: a sitting's first large JVM ran slow (bench_seeds.py's warm-up says more).
    env, argv = runs["local"]
    if subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        print("the all-local warm-up run failed", file=sys.stderr)
        return 1
    names = list(runs)
    for rep in range(a.reps):
        # Each repeat in another order: a configuration always run right after another paid for its state.
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            env, argv = runs[name]
            t0 = time.monotonic()
            p = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            walls[name].append(time.monotonic() - t0)
            if p.returncode or "gcchurn: ok" not in p.stdout:
                print(f"{name} failed (status {p.returncode}):\n{p.stdout[-2000:]}", file=sys.stderr)
                return 1
    fixed: dict = {name: [] for name in runs}
    for _ in range(a.fixed):
        for name, (env, argv) in runs.items():
            # The same command with `-version` for the program: everything but GcChurn's own work.
            argv = argv[:len(argv) - len(java)] + jvm + ["-version"]
            t0 = time.monotonic()
            p = subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            fixed[name].append(time.monotonic() - t0)
            if p.returncode:
                print(f"{name} -version failed (status {p.returncode}):\n{p.stderr[-2000:]}", file=sys.stderr)
                return 1
    local = statistics.median(walls["local"])
    local_fixed = statistics.median(fixed["local"]) if a.fixed else 0.0
    for name, w in walls.items():
        m = statistics.median(w)
        # Each repeat's ratio to its own all-local run, then their median: drift between repeats cancels.
        paired = statistics.median(x / y for x, y in zip(w, walls["local"]))
        line = f"{name:12s} median {m:.2f} s  {m / local:.3f}x all local (paired {paired:.3f}x)"
        if a.fixed:
            f = statistics.median(fixed[name])
            line += f"  fixed {f * 1000:.0f} ms, less fixed {(m - f) / (local - local_fixed):.3f}x"
        print(f"{line}  runs {' '.join(f'{x:.2f}' for x in w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
