#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whose memory cgroup pays for memd's store (docs/compatibility.md, protocol.md SHM_ALLOC): a
standalone `farmem memd` on a Unix socket, outside a memory cgroup made for the paged program
(cgroup v1 or v2, as the swap mode makes its own, with no limit that binds), and the program run
in that cgroup over `--transport shm` (memd allocates the slots), over `--transport stream`, and
over shm from memd's own cgroup (`shm-same`: no SHM_ALLOC, the cost it adds). Interleaved: every
repeat runs each configuration once. Prints wall seconds and the cgroup's peak (MiB) of each run.

    .venv/bin/python bench/bench_cgroup_charge.py [--configs shm,stream,shm-same] [--repeats 3]
        [--local 256M] [--build NAME=DIR ...] [-- COMMAND ...]

COMMAND defaults to build/tests/pagetest --size 1G --rewrites 2. --build NAME=DIR adds the
configuration NAME: shm in the cgroup with the farmem build in DIR (FARMEM_BUILD), e.g. the
build before a change. Needs root (cgroups); the page cache is dropped before each run in the
cgroup so that the peak counts this run's pages only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FARMEM = os.path.join(ROOT, "farmem")
sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem.swap import _Cgroup  # noqa: E402


def run_one(config: str, builds: dict, cg: _Cgroup, addr: str, secret: str, local: str,
            command: list) -> tuple[float, int | None]:
    transport = "stream" if config == "stream" else "shm"
    env = dict(os.environ)
    if config in builds:
        env["FARMEM_BUILD"] = builds[config]
    argv = [FARMEM, "run", "--local", local, "--transport", transport, "--memd", addr,
            "--secret-file", secret, "--", *command]
    inside = config != "shm-same"
    if inside:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        cg.reset_peak()
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs, *argv]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{config}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return wall, (cg.peak() if inside else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="shm,stream,shm-same")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--local", default="256M")
    ap.add_argument("--build", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("command", nargs="*")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.build)
    configs = a.configs.split(",") + [n for n in builds if n not in a.configs.split(",")]
    command = a.command or [os.path.join(ROOT, "build/tests/pagetest"), "--size", "1G", "--rewrites", "2"]
    cg = _Cgroup(64 << 30, f"farmem-bench-charge-{os.getpid()}")
    tmp = tempfile.mkdtemp(prefix="fmcharge-")
    sock, secret = os.path.join(tmp, "memd.sock"), os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("bench-cgroup-charge\n")
    memd = subprocess.Popen([FARMEM, "memd", "--unix", sock, "--capacity", "16G", "--secret-file", secret],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    results: dict[str, list] = {c: [] for c in configs}
    try:
        end = time.monotonic() + 10
        while not os.path.exists(sock):
            if memd.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"farmem memd did not start: {memd.stderr.read()}")
            time.sleep(0.05)
        for rep in range(a.repeats):
            for c in configs:
                wall, peak = run_one(c, builds, cg, f"unix:{sock}", secret, a.local, command)
                results[c].append((wall, peak))
                print(f"{c:12s} {wall:7.2f} s" + (f"  peak {peak >> 20} MiB" if peak is not None else ""),
                      flush=True)
    finally:
        memd.terminate()
        memd.wait()
        cg.remove()
    print("\nmedian")
    for c, rs in results.items():
        peaks = [p for _, p in rs if p is not None]
        print(f"{c:12s} {statistics.median(w for w, _ in rs):7.2f} s" +
              (f"  peak {statistics.median(peaks) / (1 << 20):.0f} MiB" if peaks else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
