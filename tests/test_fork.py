# SPDX-License-Identifier: Apache-2.0
"""fork() of a paged process (issue 19, uffd/fork.c): the child sees the paged memory exactly as
it was at the fork, while the parent rewrites it and evicts; the child then pages on its own (a
pager of its own, preload.c): what it holds of the paged buffer comes down to its budget, and
stays there while it writes more than the budget; a grandchild sees the child's bytes and pages
on its own too; fork+exec works; a child whose pager cannot start (no file descriptor left) runs
on unpaged, every byte right; a raw clone(), which runs no fork handlers, gets no paged range at
all (it dies of SIGSEGV rather than read a zero); forks beside another thread's mremaps, mmaps
and munmaps of paged memory leave the parent's mapping whole (its next growing mremap works) and
give no child books for a range it does not have; a fork handler of the program's that runs
after the pager's may map and unmap paged memory. In both fault modes. Programs from Debian that
fork (Redis's BGSAVE, a multiprocessing pool) are in test_compat.py."""

import json
import os
import re
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
                        str(prog), "96", "32"], capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for part in ("fork", "exec", "nofd", "raw clone", "remap", "handler", "all"):
        assert f"forktest: {part} ok" in out, out[-3000:]
    # Forks racing another thread's mremaps ("remap ok": every growth worked, every byte right): no
    # child got books for a range it does not have (its pager would warn that it keeps it unpaged).
    assert "MiB in local memory, unpaged" not in out, out[-3000:]
    # ... nor beside another paged mapping made and unmapped over and over.
    m = re.search(r"forktest: remap ok \(.*, (\d+) mappings made and unmapped\)", out)
    assert m and int(m.group(1)) > 0, out[-3000:]
    # The child and the grandchild each brought what they hold of the buffer down to the budget
    # (forktest waits for it, and fails past 30 s): pagers of their own.
    for who in ("child holds", "grandchild holds"):
        assert f"forktest: {who}" in out, out[-3000:]
    assert "cannot start a pager of its own" in out and "Too many open files" in out, out[-3000:]
    s = json.loads(summary.read_text())
    # The parent: one fork for the child, three for fork+exec, one for the child without a pager,
    # twenty beside the remaps, one whose prepare handler maps and unmaps paged memory; the child's
    # pager: one for the grandchild. The raw clone is not one.
    assert s["forks"] == 27 and s["forks_without_paged"] == 0, s
    assert s["remaps"] > 0, s
    # The parent, the child and the grandchild reported their maps to the launcher; a child that
    # execs or exits at once may have reported before, or not.
    assert 3 <= s["processes"] <= 27, s
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
