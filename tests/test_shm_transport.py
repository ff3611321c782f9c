# SPDX-License-Identifier: Apache-2.0
"""The one-sided shared-memory transport (issue 11): the embedded default uses it, its store can
be bound to a NUMA node, and a memd that dies while the pager holds its store mapped never costs a
byte. The integrity workloads over it are in test_pager.py (the embedded default is shm)."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import REPO, in_cgroup, start_unix_memd

pytestmark = [pytest.mark.memd, pytest.mark.pager]


@pytest.fixture(scope="module")
def pagetest(built):
    built("build/lib/libfarmem_preload.so")
    built("build/bin/farmem-memd")
    return built("build/tests/pagetest")


def paged_env(build, addr, secret, **knobs):
    env = {**os.environ, "LD_PRELOAD": str(build / "lib/libfarmem_preload.so"), "FARMEM_MEMD": addr,
           "FARMEM_SECRET": secret, "FARMEM_TRANSPORT": "shm"}
    env.update({f"FARMEM_{k.upper()}": str(v) for k, v in knobs.items()})
    return env


def space_mappings(pid):
    """numa_maps lines of the memd spaces a process has mapped."""
    with open(f"/proc/{pid}/numa_maps") as f:
        return [line for line in f if "farmem-space" in line]


def test_numa_node_binds_the_store_for_both_sides(build, tmp_path, pagetest):
    """--numa-node sets a shared (shmem) policy: the pages the pager itself allocates when it
    writes one-sided land on the node too, as both processes' numa_maps show."""
    nodes = sorted(int(m.group(1)) for d in os.listdir("/sys/devices/system/node")
                   if (m := re.fullmatch(r"node(\d+)", d)))
    node = nodes[-1]
    memd, addr, secret = start_unix_memd(build, tmp_path, "--numa-node", str(node))
    try:
        prog = subprocess.Popen([str(pagetest), "--size", "128M", "--rounds", "6"],
                                env=paged_env(build, addr, secret, local="16M"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pages_on_node = 0
        deadline = time.monotonic() + 60
        while prog.poll() is None and time.monotonic() < deadline and not pages_on_node:
            time.sleep(0.3)
            for line in space_mappings(prog.pid):
                assert f"bind:{node}" in line, line
                m = re.search(rf"\bN{node}=(\d+)", line)
                others = [n for n in re.findall(r"\bN(\d+)=", line) if int(n) != node]
                assert not others, f"pages outside node {node}: {line}"
                pages_on_node += int(m.group(1)) if m else 0
        assert pages_on_node > 0, "the pager's one-sided writes should have allocated store pages"
        assert all(f"bind:{node}" in line for line in space_mappings(memd.pid))
        out, err = prog.communicate(timeout=120)
        assert prog.returncode == 0, err
    finally:
        memd.kill()
        memd.wait()


def test_numa_node_that_does_not_exist_is_refused(build, tmp_path):
    r = subprocess.run([str(build / "bin/farmem-memd"), "--unix", str(tmp_path / "s"), "--numa-node", "1023"],
                       env={**os.environ, "FARMEM_SECRET": "x"}, capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "no NUMA node 1023" in r.stderr


@pytest.mark.parametrize("where", ["same-cgroup", "memd-elsewhere"])
def test_memd_death_while_mapped(where, build, tmp_path, pagetest, wait_paging, request):
    """memd dies mid-run. The pager notices (its control socket hangs up), stops evicting, and
    keeps reading back only pages it finished writing, each checked against its crc. memd-elsewhere:
    memd in another memory cgroup, so that it dies while the pager asks it for slots (SHM_ALLOC)."""
    memd_cg, prog_cg = request.getfixturevalue("memory_cgroups") if where == "memd-elsewhere" else (None, None)
    memd, addr, secret = start_unix_memd(build, tmp_path, cgroup=memd_cg)
    argv = [pagetest, "--size", "160M", "--rounds", "4"]
    prog = subprocess.Popen(in_cgroup(prog_cg, argv) if prog_cg else [str(a) for a in argv],
                            env=paged_env(build, addr, secret, local="24M", log="info"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_paging(prog, "pagetest")
    memd.send_signal(signal.SIGKILL)
    memd.wait()
    out, err = prog.communicate(timeout=180)
    assert prog.returncode == 0, err
    assert "lost memd" in err and "evicting stops" in err, err
    assert ("is in another memory cgroup: it allocates" in err) == (where == "memd-elsewhere"), err


def test_memd_in_another_memory_cgroup_pays_for_its_store(build, tmp_path, pagetest, memory_cgroups):
    """The kernel charges a shared-memory page to the cgroup of the task that first touches it: with
    one-sided writes, the paged program. A program whose memory cgroup is not memd's has memd
    allocate each slot before its first write (SHM_ALLOC), so its own cgroup holds its local budget,
    not the 448 MiB it pushed into memd's store (1,301 MiB for a 1 GiB range before, RESULTS), and
    memd's cgroup holds the store."""
    memd_cg, prog_cg = memory_cgroups
    memd, addr, secret = start_unix_memd(build, tmp_path, cgroup=memd_cg)
    try:
        prog = subprocess.run(in_cgroup(prog_cg, [pagetest, "--size", "512M", "--rewrites", "1"]),
                              env=paged_env(build, addr, secret, local="64M", log="info"),
                              capture_output=True, text=True, timeout=300)
        assert prog.returncode == 0, prog.stderr
        assert "is in another memory cgroup: it allocates its store's pages" in prog.stderr, prog.stderr
        prog_peak, memd_peak = prog_cg.peak() >> 20, memd_cg.peak() >> 20
        assert prog_peak < 200, f"the program's cgroup peaked at {prog_peak} MiB with 64 MiB local"
        assert memd_peak > 400, f"memd's cgroup peaked at {memd_peak} MiB for a 448 MiB store"
    finally:
        memd.kill()
        memd.wait()


def test_memd_in_another_memory_cgroup_full_holds_no_more_than_its_capacity(build, tmp_path, pagetest,
                                                                              memory_cgroups):
    """memd allocates no more than it granted (protocol.md, SHM_ALLOC), runs stretched ahead and
    kept slots included: at a capacity of 32 MiB its cgroup stays near 32 MiB while the program
    pages 128 MiB at 32 MiB local, and the pages memd refuses stay with the program, every byte
    checked."""
    memd_cg, prog_cg = memory_cgroups
    memd, addr, secret = start_unix_memd(build, tmp_path, "--capacity", "32M", cgroup=memd_cg)
    try:
        out = tmp_path / "s.json"
        prog = subprocess.run(in_cgroup(prog_cg, [REPO / "farmem", "run", "--local", "32M", "--memd", addr,
                                                  "--secret-file", tmp_path / "secret", "--summary-json", out,
                                                  "--log", "info", "--", pagetest, "--size", "128M",
                                                  "--rewrites", "2"]),
                              capture_output=True, text=True, timeout=300)
        assert prog.returncode == 0, prog.stderr
        assert "is in another memory cgroup: it allocates its store's pages" in prog.stderr, prog.stderr
        s = json.loads(out.read_text())
        assert s["memd_full"] > 0 and s["remote_writes"] > 0, s
        memd_peak = memd_cg.peak() >> 20
        assert memd_peak < 32 + 16, f"memd's cgroup peaked at {memd_peak} MiB with a capacity of 32 MiB"
    finally:
        memd.kill()
        memd.wait()
