# SPDX-License-Identifier: Apache-2.0
"""fm_pager_move, the pager's page move for a collector's SwapVA compaction (uffd/move.c): the C
program tests/unit/test_pager_move.c (ASan/UBSan, a real memd, shm and stream transports) moves
resident, remote and untouched pages onto old resident, remote and untouched ones and checks
every byte at both ends, the counters, and that nothing is lost when everything is pushed out to
memd and read back; then once more with a memd that is full, where remote pages come local. The JVM side is in test_patched_jdk.py."""

import os
import re
import subprocess

import pytest

pytestmark = [pytest.mark.memd, pytest.mark.pager]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_move_resident_remote_untouched():
    r = subprocess.run(["make", "-s", "build/bin/farmem-memd", "build/unit/test_pager_move"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([os.path.join(ROOT, "build", "unit", "test_pager_move")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_pager_move: ok" in r.stdout
    runs = re.findall(r"\((shm|stream)\): moved (\d+), remote (\d+), fetched (\d+), untouched (\d+), copied (\d+)",
                      r.stderr)
    assert [x[0] for x in runs] == ["shm", "stream", "shm"], r.stderr
    for k, (transport, *counts) in enumerate(runs):
        moved, remote, fetched, untouched, copied = map(int, counts)
        # every kind of source page was there; resident ones moved without a copy
        assert moved > 0 and untouched == 50 and copied == 0, runs[k]
        if k < 2:  # remote pages moved inside memd, never local
            assert remote > 0 and fetched == 0, runs[k]
        else:      # memd full: they came local instead
            assert fetched > 0, runs[k]
