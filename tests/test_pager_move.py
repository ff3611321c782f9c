# SPDX-License-Identifier: Apache-2.0
"""fm_pager_move, the pager's page move for a collector's SwapVA compaction (uffd/move.c): the C
program tests/unit/test_pager_move.c (ASan/UBSan, a real memd) moves resident, remote and untouched
pages onto old resident, remote and untouched ones and checks every byte at both ends, the
counters, and that nothing is lost when everything is pushed out to memd and read back: over shm,
the stream transport on a Unix socket and on TCP (remote pages copied inside memd by COPY: the
pager reads none of their bytes), on TCP with memd_copy=0 (read and written back, each one), and
over two memds with one and two replicas (COPY goes to every server holding the source; one of two
replicas is killed just before a move, which goes on with the other);
then with a memd that is full, over shm and TCP, where remote pages come local. The JVM side is in
test_patched_jdk.py."""

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
    runs = re.findall(r"\(([A-Za-z _=0-9]+)\): moved (\d+), remote (\d+), fetched (\d+), untouched (\d+), "
                      r"copied (\d+), copied in memd (\d+), remote reads (\d+)", r.stderr)
    assert [x[0] for x in runs] == ["shm", "stream", "stream tcp", "stream tcp memd_copy=0", "two memds R=1",
                                    "two memds R=2", "two memds R=2 one lost", "shm", "stream tcp"], r.stderr
    for k, (label, *counts) in enumerate(runs):
        moved, remote, fetched, untouched, copied, in_memd, reads = map(int, counts)
        # every kind of source page was there; resident ones moved without a copy
        assert moved > 0 and untouched == 50 and copied == 0, runs[k]
        if k in (0, 1, 2, 4, 5, 6):  # remote pages copied inside memd(s): not a byte of them read by the pager
            assert remote > 0 and fetched == 0 and in_memd == remote and reads == 0, runs[k]
        elif k == 3:  # memd_copy=0: read and written back through the pager
            assert remote > 0 and fetched == 0 and in_memd == 0 and reads == remote, runs[k]
        else:       # memd full: what it had no room for came local; what stayed remote was copied inside memd
            assert fetched > 0 and in_memd == remote and reads >= fetched, runs[k]
