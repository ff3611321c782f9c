#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""memd polling for requests beside the program (farmem memd --spin-us, docs/protocol.md): a
standalone `farmem memd` on a Unix socket with each --spin-us in turn, and the random rewrite
(build/bench/rewrite --size 512M, 64 MiB local, as bench_fault.py's rewriteN) run over it with
`--transport stream` on 1 and 2 threads (--tcp: memd on 127.0.0.1 over TCP instead, as a memd on
another host is reached); --memd-spin sets the pager's reply polling for every run.
Interleaved: every repeat runs each setting once. Prints wall seconds, median per setting.

    .venv/bin/python bench/bench_memd_spin.py [--spins 0,50] [--threads 1,2] [--repeats 2]
        [--memd-spin 50] [--tcp]

Take it on an idle machine: what it measures is the cost of waking CPUs that halted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FARMEM = os.path.join(ROOT, "farmem")


def wait_socket(path: str, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"farmem memd did not start (exit {proc.poll()})")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_sitting(spin: int, threads: list[int], tmp: str, memd_spin: int | None, tcp: bool) -> dict:
    sock, secret = os.path.join(tmp, "memd.sock"), os.path.join(tmp, "secret")
    port = free_port() if tcp else 0
    memd = subprocess.Popen([FARMEM, "memd", "--unix", sock, "--capacity", "2G", "--secret-file", secret,
                             "--spin-us", str(spin)] + (["--listen", f"127.0.0.1:{port}"] if tcp else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    addr = f"tcp:127.0.0.1:{port}" if tcp else f"unix:{sock}"
    out = {}
    try:
        wait_socket(sock, memd)
        for t in threads:
            argv = [FARMEM, "run", "--memd", addr, "--secret-file", secret, "--transport", "stream",
                    "--local", "64M"] + (["--memd-spin", str(memd_spin)] if memd_spin is not None else []) + \
                   ["--", os.path.join(ROOT, "build/bench/rewrite"), "--size", "512M", "--threads", str(t)]
            t0 = time.monotonic()
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"rewrite failed: {r.stderr[-2000:]}")
            out[t] = time.monotonic() - t0
    finally:
        memd.terminate()
        memd.wait(30)
        if os.path.exists(sock):
            os.unlink(sock)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spins", default="0,50", help="memd --spin-us values (default 0,50)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memd-spin", type=int, help="the pager's --memd-spin for every run (default: its own)")
    ap.add_argument("--tcp", action="store_true", help="reach memd over TCP on 127.0.0.1, not its Unix socket")
    a = ap.parse_args()
    spins = [int(s) for s in a.spins.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    times: dict = {(s, t): [] for s in spins for t in threads}
    with tempfile.TemporaryDirectory(prefix="fm-memd-spin-") as tmp:
        with open(os.path.join(tmp, "secret"), "w") as f:
            f.write(os.urandom(16).hex())
        for rep in range(a.repeats):
            for s in (spins if rep % 2 == 0 else spins[::-1]):
                for t, sec in one_sitting(s, threads, tmp, a.memd_spin, a.tcp).items():
                    times[(s, t)].append(sec)
                    print(f"[{rep + 1}] memd --spin-us {s}, {t} thread(s): {sec:.2f} s", file=sys.stderr)
    print(f"| memd --spin-us | " + " | ".join(f"rewrite, {t} thread(s)" for t in threads) + " |")
    print("|---:|" + "---:|" * len(threads))
    for s in spins:
        print(f"| {s} | " + " | ".join(f"{statistics.median(times[(s, t)]):.2f} s "
                                       f"({', '.join(f'{x:.2f}' for x in times[(s, t)])})" for t in threads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
