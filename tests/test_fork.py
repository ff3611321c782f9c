# SPDX-License-Identifier: Apache-2.0
"""fork() of a paged process (issue 19, uffd/fork.c): the child sees the paged memory exactly as
it was at the fork, while the parent rewrites it and evicts; a grandchild sees the child's bytes;
fork+exec works; a raw clone(), which runs no fork handlers, gets no paged range at all (it dies
of SIGSEGV rather than read a zero). In both fault modes. Programs from Debian that fork (Redis's
BGSAVE, a multiprocessing pool) are in test_compat.py."""

import json
import os
import subprocess

import pytest

pytestmark = [pytest.mark.pager, pytest.mark.memd]


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_fork_child_sees_the_memory_as_it_was(built, farmem_cmd, tmp_path, fault):
    prog = built("build/tests/forktest")
    built("build/lib/libfarmem_preload.so")
    summary = tmp_path / "s.json"
    env = dict(os.environ, FARMEM_FAULT=fault, FARMEM_LOG="info")
    r = subprocess.run([*farmem_cmd, "run", "--local", "32M", "--summary-json", str(summary), "--",
                        str(prog), "96"], capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for part in ("fork", "exec", "raw clone", "all"):
        assert f"forktest: {part} ok" in out, out[-3000:]
    s = json.loads(summary.read_text())
    # One fork for the child, three for fork+exec; the raw clone is not one of them.
    assert s["forks"] == 4 and s["forks_without_paged"] == 0, s
    # At the first fork most of the 96 MiB (24576 pages, 8192 local) was in memd and came home
    # first; how much the later ones find depends on how far the parent got back under its budget.
    assert s["fork_pages_fetched"] > 12000, s
    assert s["evictions"] > 20000, s
    if fault == "signal":
        # Eviction captured dirty pages (uffd/capture.h) until the fork shared them with the child:
        # a write then goes to a copy, not to the page a capture holds, so it write-protects again.
        assert s["evictions_captured"] > 0, s
        assert "write-protects dirty pages from now on: a fork shares" in out, out[-3000:]
    else:
        assert s["evictions_captured"] == 0, s
