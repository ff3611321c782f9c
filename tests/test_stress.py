# SPDX-License-Identifier: Apache-2.0
"""Hardening (issue 8): 10^7 checked page accesses on 8 threads racing the evictor, 0 bytes
wrong (tests/progs/stress_access.c under `farmem run --local 25%`). Time-bound: if the machine
is too slow for 10^7 in STRESS_SECONDS, the run stops early and the test says how far it got."""

import re
import subprocess

import pytest

pytestmark = [pytest.mark.pager, pytest.mark.memd]

ACCESSES = 10_000_000
STRESS_SECONDS = 150


def test_ten_million_checked_accesses_racing_the_evictor(built, farmem_cmd):
    prog = built("build/tests/stress_access")
    built("build/lib/libfarmem_preload.so")
    r = subprocess.run([*farmem_cmd, "run", "--local", "25%", "--", str(prog), "--size", "128M",
                        "--threads", "8", "--accesses", str(ACCESSES), "--seconds", str(STRESS_SECONDS)],
                       capture_output=True, text=True, timeout=STRESS_SECONDS + 120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = re.search(r"stress: OK accesses=(\d+) .*wrong_words=0", out)
    assert m, out[-3000:]
    evictions = int(re.search(r"(\d+) evictions", out).group(1))
    print(m.group(0), f"evictions={evictions}")
    assert evictions > 100_000, "the evictor must have raced the accesses"
    assert int(m.group(1)) == ACCESSES or "time bound hit" in out
