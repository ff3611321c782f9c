# SPDX-License-Identifier: Apache-2.0
"""Starting a program from a paged process (issue 19): fork() brings every page that is in memd
home first (uffd/fork.c); the ways programs are usually started — posix_spawn, posix_spawnp,
system(), popen(), vfork+exec, Python's subprocess and os.system, the JVM's ProcessBuilder — must
not. Each workload holds a 256 MiB buffer, most of it in memd at every spawn, reads its own pager's
counters around each spawn (tests/progs/spawntest.c, tests/progs/spawn_py.py) or is judged by the
run's summary (tests/java/SpawnHolder.java), and checks its whole buffer after. A real fork of the
same process (fork+exec, a preexec_fn, the JVM's FORK launch mechanism) is the contrast: it must
count one fork and bring the buffer home, or the zeros asserted for the others would prove nothing.
In both fault modes. bench/bench_spawn.py times posix_spawn against fork+exec."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.pager, pytest.mark.memd]

MIB = 256
PAGES = MIB << 8
LOCAL_PAGES = 32 << 8  # --local 32M
TIMES = 3
REAL_FORKS = ("fork_exec", "subprocess_preexec")


def run(farmem_cmd, tmp_path, fault, local, cmd, timeout=600):
    summary = tmp_path / f"s-{fault}.json"
    r = subprocess.run([*farmem_cmd, "run", "--fault", fault, "--local", local, "--summary-json", str(summary),
                        "--", *cmd], capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    s = json.loads(summary.read_text())
    assert s["fault_mode"] == fault, s
    return r.stdout, out, s


def per_method(stdout: str) -> dict:
    return {d["method"]: d for d in (json.loads(x) for x in stdout.splitlines() if x.startswith("{"))}


def check_methods(got: dict, methods, s: dict) -> None:
    for m in methods:
        d = got[m]
        assert d["spawns"] == TIMES, d
        # Every spawn found the buffer mostly in memd: a bring-home would have had ~224 MiB to read.
        assert d["resident_before"] <= LOCAL_PAGES + 256, d
        if m in REAL_FORKS:
            assert d["forks"] == TIMES and d["forks_without_paged"] == 0, d
            # Each fork brought home what was in memd: the buffer less the budget, every time
            # (the program waits for the pager to evict back down between spawns).
            assert d["fork_pages_fetched"] >= TIMES * (PAGES - LOCAL_PAGES - 1024), d
            assert d["remote_reads"] >= d["fork_pages_fetched"], d
        else:
            assert d["forks"] == 0 and d["fork_pages_fetched"] == 0 and d["forks_without_paged"] == 0, d
            # The spawn read nothing back from memd. A few pages of slack: a prefetch the check's
            # last faults issued may land during the first spawn; a bring-home is ~57000.
            assert d["remote_reads"] < 256, d
    # The run's own totals agree: the real forks were the only ones.
    assert s["forks"] == sum(got[m]["forks"] for m in REAL_FORKS if m in got), s
    assert s["fork_pages_fetched"] == sum(got[m]["fork_pages_fetched"] for m in REAL_FORKS if m in got), s
    assert s["evictions"] > PAGES - LOCAL_PAGES, s


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_c_spawn_paths_bring_nothing_home(built, farmem_cmd, tmp_path, fault):
    prog = built("build/tests/spawntest")
    built("build/lib/libfarmem_preload.so")
    stdout, out, s = run(farmem_cmd, tmp_path, fault, "32M",
                         [str(prog), "--mib", str(MIB), "--times", str(TIMES)])
    methods = ("posix_spawn", "posix_spawnp", "system", "popen", "vfork", "fork_exec")
    for m in methods:
        assert f"spawntest: {m} ok" in out, out[-3000:]
    assert "spawntest: all ok" in out, out[-3000:]
    check_methods(per_method(stdout), methods, s)


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_python_subprocess_brings_nothing_home(repo, built, farmem_cmd, tmp_path, fault):
    """Python 3.11's subprocess.run starts the child with vfork (_posixsubprocess), with
    close_fds=False with posix_spawn; os.system is glibc's system(), a posix_spawn. A preexec_fn
    makes it fork. The buffer is a bytearray: one malloc block, above the shim's threshold."""
    built("build/lib/libfarmem_preload.so")
    stdout, out, s = run(farmem_cmd, tmp_path, fault, "32M",
                         [sys.executable, str(repo / "tests/progs/spawn_py.py"), "--mib", str(MIB),
                          "--times", str(TIMES)])
    methods = ("subprocess", "subprocess_posix_spawn", "os_system", "os_posix_spawn", "subprocess_preexec")
    for m in methods:
        assert f"spawn_py: {m} ok" in out, out[-3000:]
    assert "spawn_py: all ok" in out, out[-3000:]
    check_methods(per_method(stdout), methods, s)


@pytest.mark.jvm
@pytest.mark.parametrize("fault", ["signal", "thread"])
@pytest.mark.parametrize("mechanism", ["default", "FORK"])
def test_jvm_processbuilder_brings_nothing_home(build, jvm_built, farmem_cmd, tmp_path, private_tmp, fault,
                                                mechanism):
    """JDK 17's ProcessBuilder posix_spawns jspawnhelper, which execs the program: no fork, nothing
    brought home. -Djdk.lang.Process.launchMechanism=FORK makes the JVM fork() instead: then each
    child costs the bring-home. The JVM's paged memory is its heap (the agent), 512 MiB of which
    the array takes 256; the budget is 64 MiB (G1 needs room for its young generation)."""
    props = [] if mechanism == "default" else [f"-Djdk.lang.Process.launchMechanism={mechanism}"]
    cmd = ["java", "-Xmx512m", *props, "-cp", str(build / "java"), "SpawnHolder", "--mb", str(MIB),
           "--times", str(TIMES)]
    summary = tmp_path / "s.json"
    r = subprocess.run([*farmem_cmd, "run", "--fault", fault, "--local", "64M", "--summary-json", str(summary),
                        "--", *cmd], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TMPDIR=private_tmp))  # what farmem run makes lands there
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert f"spawnholder: ok {TIMES} children, launch mechanism {mechanism}" in r.stdout, out[-3000:]
    s = json.loads(summary.read_text())
    assert s["fault_mode"] == fault, s
    # The array was mostly in memd: reading it back for the check took at least its share outside the budget.
    assert s["remote_reads"] > PAGES - (64 << 8), s
    if mechanism == "default":
        assert s["forks"] == 0 and s["fork_pages_fetched"] == 0 and s["forks_without_paged"] == 0, s
        # One read of the array for the check, and little else: a bring-home would add ~192 MiB more.
        assert s["remote_reads"] < PAGES + PAGES // 4, s
    else:
        assert s["forks"] == TIMES and s["forks_without_paged"] == 0, s
        # At least the first fork found the array outside the budget in memd.
        assert s["fork_pages_fetched"] > PAGES - (64 << 8) - 1024, s
