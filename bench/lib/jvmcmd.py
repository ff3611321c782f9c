# SPDX-License-Identifier: Apache-2.0
"""The part the JVM-watching tools share (gc_profile.py, gc_phase_io.py, thread_cpu.py): their
`-- CMD ...` argument, and running CMD while watching its first java process. Needs farmem's CLI
sources on sys.path (its procmap), as each of those tools puts them there."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from farmem import procmap


def add_command(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command (java ..., or farmem run ... -- java ...)")


def command(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list:
    """The command after `--`; an argparse error without one."""
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error(f"no command: {ap.prog} [options] -- CMD ...")
    return cmd


def watch_jvm(cmd: list, tool: str, watch, wait_s: float = 30.0):
    """Run cmd in a session of its own; once a java process is under it (cmd itself included),
    watch(pid, proc) while it runs. Returns (cmd's exit status, what watch returned), or (status,
    None) when no JVM came within wait_s seconds or before cmd ended (said on stderr). cmd is
    stopped if this is interrupted."""
    p = subprocess.Popen(cmd, start_new_session=True)
    deadline = time.monotonic() + wait_s
    try:
        pid = None
        while not pid and p.poll() is None and time.monotonic() < deadline:
            pid = procmap.descendant_named(p.pid, "java")
            if not pid:
                time.sleep(0.01)
        if not pid:
            print(f"{tool}: no java process under the command", file=sys.stderr)
            return p.wait() or 1, None
        out = watch(pid, p)
        return p.wait(), out
    except BaseException:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait()
        raise
