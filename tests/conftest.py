# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by every test file: where the checkout and its build are, how to run
./farmem, and a way to build one make target. Keep it small."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"

if importlib.util.find_spec("farmem") is None:  # not installed in this Python: use the sources
    sys.path.insert(0, str(REPO / "cli" / "src"))

from farmem import procmap  # noqa: E402

MARKERS = {
    "root": "needs root (changes user, reads other users' processes)",
    "bpf": "loads eBPF programs",
    "memd": "starts build/bin/farmem-memd",
    "pager": "runs programs under build/lib/libfarmem_preload.so",
    "jvm": "runs a JVM under farmem",
    "vm": "boots Debian's kernel in qemu (tests/vm/): the module and RDMA lane",
    "patched_jdk": "needs the farmem JDK (make jdk, hotspot/); builds it on first use (~15 min)",
}


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def build() -> Path:
    return BUILD


@pytest.fixture(scope="session")
def farmem_cmd() -> list:
    """argv prefix that runs the farmem command of this checkout."""
    return [str(REPO / "farmem")]


@pytest.fixture(scope="session")
def built():
    """built("build/tests/x") -> Path: run `make` for that target (a no-op when up to date)."""
    def make(target: str) -> Path:
        r = subprocess.run(["make", "-s", target], cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"make {target} failed:\n{r.stdout}{r.stderr}")
        return REPO / target
    return make


@pytest.fixture(scope="module")
def jvm_built(built):
    """The agent, memd and the Java workloads, for the tests that run a JVM."""
    built("build/lib/libfarmem_agent.so")
    built("build/bin/farmem-memd")
    built("build/java/.ok")


@pytest.fixture
def private_tmp():
    """A short TMPDIR of our own: what farmem run makes goes there, so leftovers are ours."""
    d = tempfile.mkdtemp(prefix="fmjvm-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def wait_paging(farmem_cmd):
    """wait_paging(proc, comm, seconds=60) -> pid: wait until the process named comm under proc
    (proc itself, or farmem run's child) exists and has evicted pages, and proc still runs. A fixed
    sleep before breaking something is too short on a loaded machine and longer than a small run
    on an idle one."""
    def wait(proc, comm, seconds=60.0, evicted=True):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            pid = procmap.descendant_named(proc.pid, comm)
            if pid is not None:
                if not evicted:
                    return pid
                r = subprocess.run([*farmem_cmd, "stat", str(pid), "--json"], capture_output=True, text=True)
                if r.returncode == 0 and json.loads(r.stdout).get("evictions", 0) > 0:
                    assert proc.poll() is None, f"{comm} ended before the test could act"
                    return pid
            time.sleep(0.05)
        assert proc.poll() is None, f"{comm} ended before the test could act"
        pytest.fail(f"{comm} did not {'start evicting' if evicted else 'start'} within {seconds} s")
    return wait


def run_jvm_tool(tool, tool_args, build, private_tmp, run_args=(), steps=100000):
    """bench/TOOL.py TOOL_ARGS -- farmem run --local 50% RUN_ARGS -- java ... GcChurn (150 MiB live
    in a 256 MiB heap), as the JVM-watching tools' tests run them: the finished process, checked to
    have exited 0 with GcChurn's own "ok"."""
    cmd = [sys.executable, str(REPO / "bench" / f"{tool}.py"), *map(str, tool_args), "--",
           str(REPO / "farmem"), "run", "--local", "50%", *map(str, run_args), "--",
           "java", "-Xmx256m", "-Xms256m", "-cp", str(build / "java"), "GcChurn", "--live-mb", "150",
           "--steps", str(steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "gcchurn: ok" in r.stdout
    return r


def bench_module(name: str):
    """bench/NAME.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_or_show_hang(cmd, timeout, **popen_kw) -> subprocess.CompletedProcess:
    """cmd to its end in a session of its own; past timeout s, the test fails with where each thread of
    the session sleeps (threads_of_session) and what the command said, and the session is killed."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **popen_kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            where = threads_of_session(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{cmd} hung for {timeout} s; its threads:\n{where}\nstdout:\n{out[-3000:]}\n"
                        f"stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def threads_of_session(sid: int) -> str:
    """Each thread of the processes in session sid: pid, tid, name, state, kernel wait channel and
    kernel stack, and each process's user stacks (gdb, where installed). For a
    run that hung, before it is killed: a thread asleep on a page nobody wakes shows up as
    handle_userfault in its kernel stack, one waiting on another as a futex in its backtrace."""
    rows, pids, stuck = [], [], set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[3]) != sid:
                continue
            pids.append(pid)
            for tid in os.listdir(f"/proc/{pid}/task"):
                t = f"/proc/{pid}/task/{tid}"
                state = open(f"{t}/stat").read().rsplit(")", 1)[1].split()[0]
                rows.append(f"{pid} {tid} {open(f'{t}/comm').read().strip()} {state} {open(f'{t}/wchan').read()}")
                if state == "D":
                    stuck.add(pid)
                try:
                    rows += ["    " + line for line in open(f"{t}/stack").read().splitlines()]
                except OSError:
                    pass  # not root: the wait channel alone
        except (OSError, IndexError, ValueError):
            continue
    if shutil.which("gdb"):
        for pid in pids:
            if pid in stuck:  # gdb's attach waits for every thread to stop, and one in D state does not
                rows.append(f"--- gdb, pid {pid}: not attached (a thread in D state)")
                continue
            try:
                g = subprocess.run(["gdb", "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt 20"],
                                   capture_output=True, text=True, timeout=60)
                rows.append(f"--- gdb, pid {pid}:\n" + "\n".join(
                    line for line in g.stdout.splitlines() if line.startswith(("#", "Thread"))))
            except (OSError, subprocess.TimeoutExpired):
                rows.append(f"--- gdb, pid {pid}: no backtrace")
    return "\n".join(rows)


def in_cgroup(cg, argv):
    """argv run inside the memory cgroup cg (farmem.swap's): the shell joins it, then becomes argv."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs, *map(str, argv)]


def start_unix_memd(build, tmp_path, *extra, cgroup=None):
    """A memd of this checkout on a Unix socket in tmp_path (in the memory cgroup cgroup, if given),
    once it says it is ready: (process, address, secret)."""
    secret = tmp_path / "secret"
    secret.write_text("shm-test\n")
    sock = tmp_path / "memd.sock"
    r, w = os.pipe()
    argv = [str(build / "bin/farmem-memd"), "--unix", str(sock), "--secret-file", str(secret),
            "--ready-fd", str(w), *extra]
    p = subprocess.Popen(in_cgroup(cgroup, argv) if cgroup else argv, pass_fds=(w,), stderr=subprocess.PIPE,
                         text=True)
    os.close(w)
    with os.fdopen(r) as ready:
        assert ready.readline() == "ready\n", p.stderr.read() if p.poll() is not None else "no ready line"
    return p, f"unix:{sock}", "shm-test"


@pytest.fixture
def memory_cgroups():
    """Two memory cgroups, memd's and the paged program's (v1 or v2, made as farmem's swap mode
    makes its own), removed afterwards."""
    from farmem.swap import SwapSetupError, _Cgroup
    made = []
    try:
        for name in ("memd", "prog"):
            made.append(_Cgroup(8 << 30, f"farmem-test-{name}-{os.getpid()}"))
    except SwapSetupError as e:
        for cg in made:
            cg.remove()
        pytest.skip(f"no memory cgroup here: {e}")
    yield made
    for cg in made:
        cg.remove()
