# SPDX-License-Identifier: Apache-2.0
"""`farmem doctor`: every line true to what this test can observe by itself, here as root and
as an unprivileged user (features hidden), and the shared refusal of commands that need a
missing piece."""

import ctypes
import json
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from farmem import doctor, main

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
UFFD_NR = {"x86_64": 323, "aarch64": 282}
BPF_NR = {"x86_64": 321, "aarch64": 280}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def kernel() -> tuple:
    return tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])


def uffd_syscall_works(flags: int) -> bool:
    fd = libc.syscall(ctypes.c_long(UFFD_NR[platform.machine()]), ctypes.c_long(os.O_CLOEXEC | flags))
    if fd < 0:
        return False
    os.close(fd)
    return True


def device_opens(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDWR))
        return True
    except OSError:
        return False


def bpf_socket_filter_loads() -> bool:
    """BPF_PROG_LOAD of `r0 = 0; exit` as a socket filter, written out independently of farmem."""
    insns = ctypes.create_string_buffer(bytes.fromhex("b700000000000000" "9500000000000000"), 16)
    lic = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(struct.pack("<IIQQ", 1, 2, ctypes.addressof(insns),
                                                   ctypes.addressof(lic)), 128)
    fd = libc.syscall(ctypes.c_long(BPF_NR[platform.machine()]), ctypes.c_long(5),
                      ctypes.c_void_p(ctypes.addressof(attr)), ctypes.c_long(128))
    if fd < 0:
        return False
    os.close(fd)
    return True


def read(path: str) -> str:
    return Path(path).read_text()


def run_doctor(argv: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def by_name(results: list) -> dict:
    return {r["name"]: r for r in results}


@pytest.fixture(scope="module")
def here(farmem_cmd):
    """doctor --json as this (root) user, with /proc/swaps before and after it ran."""
    swaps_before = read("/proc/swaps")
    r = run_doctor([*farmem_cmd, "doctor", "--json"])
    assert r.returncode == 0, r.stderr
    return by_name(json.loads(r.stdout)), swaps_before, read("/proc/swaps")


def python_for_nobody() -> str:
    """An interpreter that user nobody may run (pyenv under /root is not one)."""
    for candidate in ("/usr/bin/python3", sys.executable):
        r = subprocess.run([*NOBODY, candidate, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                           capture_output=True)
        if r.returncode == 0:
            return candidate
    pytest.fail("no Python 3.11+ that user nobody can run (tried /usr/bin/python3, " + sys.executable + ")")


@pytest.fixture(scope="module")
def as_nobody(repo):
    if os.geteuid() != 0:
        pytest.fail("this test drops to user nobody with setpriv and so needs root (make test runs as root)")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing: run `make deps`")
    python = python_for_nobody()

    def run(*args):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
               "PYTHONPATH": str(repo / "cli" / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
        return run_doctor([*NOBODY, python, "-m", "farmem", *args], env=env, cwd="/")
    return run


# --- as root, here -------------------------------------------------------------------------------

def test_every_line_is_complete(here):
    lines, _, _ = here
    assert list(lines) == list(doctor.CHECKS)
    for name, line in lines.items():
        assert isinstance(line["available"], bool), name
        assert line["detail"] and line["without"], name
        assert "the check failed" not in line["detail"], f"{name}: {line['detail']}"


def test_userfaultfd_lines(here):
    lines, _, _ = here
    dev = device_opens("/dev/userfaultfd")
    full = uffd_syscall_works(0)
    user_only = uffd_syscall_works(1)
    assert lines["userfaultfd-device"]["available"] == dev
    assert lines["userfaultfd-syscall"]["available"] == full
    assert lines["userfaultfd-user-mode-only"]["available"] == user_only
    # For fault=signal the pager takes a user-mode-only descriptor when it has nothing else
    # (uffd/uffd_ops.c open_raw): a fault inside a system call fails with EFAULT either way.
    assert lines["userfaultfd"]["available"] == (dev or full or user_only)
    sysctl = read("/proc/sys/vm/unprivileged_userfaultfd").strip()
    assert lines["vm.unprivileged_userfaultfd"]["available"] == (sysctl == "1")
    assert lines["vm.unprivileged_userfaultfd"]["data"]["value"] == int(sysctl)


def test_userfaultfd_features_follow_the_kernel(here):
    lines, _, _ = here
    k = kernel()
    features = set(lines["userfaultfd"]["data"]["features"])
    assert {"PAGEFAULT_FLAG_WP", "MISSING_SHMEM", "MINOR_SHMEM", "THREAD_ID", "EVENT_REMOVE"} <= features
    assert ("POISON" in features) == (k >= (6, 6))
    assert ("WP_ASYNC" in features) == (k >= (6, 7))
    assert ("MOVE" in features) == (k >= (6, 8))
    assert lines["uffd-move"]["available"] == (k >= (6, 8))
    assert lines["uffd-wp-async"]["available"] == (k >= (6, 7))
    assert lines["pagemap-scan"]["available"] == (k >= (6, 7))
    # The fault path of issue 16: faults in the faulting thread, one drop call per eviction batch.
    assert lines["process-madvise"]["available"] == (k >= (6, 13))
    for name in ("uffd-wp", "uffd-minor-shmem", "uffd-thread-id", "uffd-events", "uffd-sigbus"):
        assert lines[name]["available"], lines[name]
    assert "WRITEPROTECT" in lines["userfaultfd"]["detail"]


@pytest.mark.bpf
def test_bpf_lines(here):
    lines, _, _ = here
    bpf = bpf_socket_filter_loads()
    assert lines["bpf"]["available"] == bpf
    assert lines["bpf-btf"]["available"] == os.path.exists("/sys/kernel/btf/vmlinux")
    # The kernel's BPF glue for the tracepoint (CONFIG_BPF_EVENTS) is a text symbol.
    tracepoint = " __bpf_trace_sched_switch\n" in read("/proc/kallsyms")
    assert lines["bpf-tracepoint"]["available"] == (bpf and tracepoint)
    kprobes = os.path.exists("/sys/bus/event_source/devices/kprobe") or any(
        os.path.exists(f"{d}/kprobe_events") for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"))
    if not kprobes:
        assert not lines["kprobes"]["available"]
    if lines["kprobes"]["available"]:
        assert kprobes
    assert lines["uprobes"]["available"] == (bpf and os.path.exists("/sys/bus/event_source/devices/uprobe"))
    if lines["fentry"]["available"]:
        assert bpf and lines["bpf-btf"]["available"]
    else:
        assert any(s in lines["fentry"]["detail"] for s in ("load failed", "attach failed", "BTF"))


def test_devices_and_system_lines(here, build):
    lines, swaps_before, swaps_after = here
    assert lines["swapva"]["available"] == device_opens("/dev/swapva")
    ib = Path("/sys/class/infiniband")
    assert lines["rdma"]["available"] == (ib.is_dir() and any(ib.iterdir()))
    if swaps_before == swaps_after:  # a benchmark may add or remove swap meanwhile
        assert lines["swap"]["available"] == (len(swaps_before.strip().splitlines()) > 1)
    assert lines["zram"]["available"] == os.path.isdir("/sys/class/zram-control")
    mounts = [line.split() for line in read("/proc/self/mounts").splitlines()]
    v1 = next((m[1] for m in mounts if m[2] == "cgroup" and "memory" in m[3].split(",")), None)
    assert lines["cgroup-memory"]["data"]["v1_memory"] == v1
    # idle polling: the cpuidle driver, haltpoll's window, and whether this is a VM
    driver_file = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    driver = driver_file.read_text().strip() if driver_file.exists() else "none"
    in_vm = "hypervisor" in read("/proc/cpuinfo").split()
    idle = lines["idle-polling"]
    assert idle["data"]["cpuidle_driver"] == driver and idle["data"]["in_vm"] == in_vm
    if driver == "haltpoll":
        window = int(read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"))
        assert idle["available"] == (window > 0) and idle["data"]["guest_halt_poll_ns"] == window
    else:
        assert idle["available"] == (not in_vm)
    # the handler may follow: more than one CPU, and CAP_SYS_NICE or RLIMIT_NICE 20 (uffd/follow.h)
    import resource
    cap = int(next(x for x in read("/proc/self/status").splitlines() if x.startswith("CapEff:")).split()[1], 16)
    nice = resource.getrlimit(resource.RLIMIT_NICE)[0]
    assert lines["handler-follow"]["available"] == (len(os.sched_getaffinity(0)) > 1 and (
        bool(cap >> 23 & 1) or nice == resource.RLIM_INFINITY or nice >= 20)), lines["handler-follow"]
    assert lines["farmem-memd"]["available"] == os.access(build / "bin" / "farmem-memd", os.X_OK)
    assert lines["farmem-preload"]["available"] == (build / "lib" / "libfarmem_preload.so").is_file()
    # the tracer and the agent: built, and usable here (eBPF; a JVM)
    bpf_ok = all(lines[n]["available"] for n in ("bpf", "bpf-btf", "bpf-tracepoint"))
    assert lines["farmem-trace"]["available"] == (os.access(build / "bin" / "farmem-trace", os.X_OK) and bpf_ok)
    assert lines["farmem-agent"]["available"] == ((build / "lib" / "libfarmem_agent.so").is_file()
                                                  and lines["java"]["available"])


def test_make_builds_what_doctor_lists(repo):
    """`make` (its c target) builds the tracer and the agent that doctor's lines look for."""
    for source, target in (("bpf/farmem_trace.c", "build/bin/farmem-trace"),
                           ("jvmti-agent/agent.c", "build/lib/libfarmem_agent.so")):
        r = subprocess.run(["make", "-n", "-W", source, "c"], cwd=repo, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"-o {target} " in r.stdout, f"make c does not build {target}"


def test_jvm_lines(here):
    lines, _, _ = here
    java = shutil.which("java") is not None and subprocess.run(
        ["java", "-version"], capture_output=True).returncode == 0
    assert lines["java"]["available"] == java
    if java:
        assert "version" in lines["java"]["detail"]
    assert lines["jcmd"]["available"] == (shutil.which("jcmd") is not None)


def test_text_output_has_one_line_per_check(farmem_cmd):
    r = run_doctor([*farmem_cmd, "doctor"])
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == list(doctor.CHECKS)
    for row in rows:
        assert row.split()[1] in ("yes", "no")
        assert ("-> without it:" in row) == (row.split()[1] == "no")


def test_a_broken_check_is_a_no_line_not_a_crash(monkeypatch, capsys):
    def boom():
        raise RuntimeError("boom")
    monkeypatch.setitem(doctor.CHECKS, "swapva", (boom, "whatever"))
    monkeypatch.setitem(doctor.CHECKS, "java", (lambda: (True, "fake java"), "x"))
    assert main.cli(["doctor", "--json"]) == 0
    lines = by_name(json.loads(capsys.readouterr().out))
    assert lines["swapva"]["available"] is False
    assert lines["swapva"]["detail"] == "the check failed: RuntimeError: boom"
    assert lines["java"]["detail"] == "fake java"


# --- refusals ------------------------------------------------------------------------------------

def test_commands_refuse_without_the_build(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FARMEM_BUILD", str(tmp_path))
    marker = tmp_path / "ran"
    assert main.cli(["run", "--", "touch", str(marker)]) == 78
    err = capsys.readouterr().err
    assert err == (f"farmem: farmem-preload is not available here: {tmp_path}/lib/libfarmem_preload.so "
                   "is missing (run `make`). Run `farmem doctor` for details.\n")
    assert not marker.exists()
    assert main.cli(["memd", "--unix", str(tmp_path / "s")]) == 78
    assert capsys.readouterr().err.startswith("farmem: farmem-memd is not available here: ")
    assert main.cli(["doctor", "--json"]) == 0
    lines = by_name(json.loads(capsys.readouterr().out))
    assert not lines["farmem-memd"]["available"] and "missing" in lines["farmem-memd"]["detail"]
    assert not lines["farmem-preload"]["available"]
    for name, path in (("farmem-trace", "bin/farmem-trace"), ("farmem-agent", "lib/libfarmem_agent.so")):
        assert not lines[name]["available"]
        assert lines[name]["detail"] == f"{tmp_path}/{path} is not built (run `make`)"


def test_require(capsys):
    assert main.cli(["doctor", "--require", "userfaultfd,pagemap-scan"]) == 0
    assert main.cli(["doctor", "--require", "no-such-thing"]) == 2
    assert "no such feature" in capsys.readouterr().err
    if os.path.exists("/dev/swapva"):  # the module is loaded only in the qemu lane
        assert doctor.require("swapva").available
        return
    with pytest.raises(doctor.Unavailable) as e:
        doctor.require("swapva")
    assert e.value.render().startswith("farmem: swapva is not available here: no /dev/swapva")
    assert e.value.render().endswith(". Run `farmem doctor` for details.")


# --- as an unprivileged user: features hidden -----------------------------------------------------

@pytest.mark.root
@pytest.mark.bpf
def test_as_nobody_the_lines_change(here, as_nobody):
    root_lines, _, _ = here
    r = as_nobody("doctor", "--json")
    assert r.returncode == 0, r.stderr
    lines = by_name(json.loads(r.stdout))
    assert list(lines) == list(doctor.CHECKS)

    dev_mode = stat.S_IMODE(os.stat("/dev/userfaultfd").st_mode) if os.path.exists("/dev/userfaultfd") else 0
    dev_for_others = dev_mode & 0o006 == 0o006
    sysctl = read("/proc/sys/vm/unprivileged_userfaultfd").strip()
    assert lines["userfaultfd-device"]["available"] == dev_for_others
    if not dev_for_others:
        assert "Permission denied" in lines["userfaultfd-device"]["detail"] or \
            "No such file" in lines["userfaultfd-device"]["detail"]
    assert lines["userfaultfd-syscall"]["available"] == (sysctl == "1")
    assert lines["userfaultfd-user-mode-only"]["available"] == (kernel() >= (5, 11))
    assert lines["userfaultfd"]["available"] == (dev_for_others or sysctl == "1" or kernel() >= (5, 11))
    if not dev_for_others and sysctl != "1":
        assert lines["userfaultfd"]["data"]["method"] == "user-mode-only"
        assert lines["userfaultfd"]["detail"].startswith(
            "only UFFD_USER_MODE_ONLY descriptors here: fault=signal works, fault=thread needs root")
        assert root_lines["userfaultfd"]["available"]

    unpriv_bpf = read("/proc/sys/kernel/unprivileged_bpf_disabled").strip()
    assert lines["bpf"]["available"] == (unpriv_bpf == "0")
    if unpriv_bpf != "0":
        assert "Operation not permitted" in lines["bpf"]["detail"]
        assert root_lines["bpf"]["available"]
    # Tracing programs need CAP_BPF and CAP_PERFMON whatever the sysctl says.
    for name in ("bpf-tracepoint", "bpf-perf-event", "uprobes", "fentry"):
        assert not lines[name]["available"], lines[name]


@pytest.mark.root
@pytest.mark.bpf
def test_as_nobody_commands_refuse_with_the_shared_wording(as_nobody):
    r = as_nobody("doctor", "--require", "bpf-tracepoint")
    assert r.returncode == 78
    assert r.stderr.startswith("farmem: bpf-tracepoint is not available here: raw_tp/sched_switch: ")
    assert r.stderr.rstrip().endswith("Run `farmem doctor` for details.")
    assert len(r.stderr.splitlines()) == 1
    r = as_nobody("doctor", "--require", "pagemap-scan")
    assert r.returncode == 0, r.stderr


@pytest.mark.root
def test_as_nobody_farmem_run_refuses_without_userfaultfd(as_nobody):
    r = as_nobody("doctor", "--json")
    usable = by_name(json.loads(r.stdout))["userfaultfd"]["available"]
    r = as_nobody("run", "--", "true")
    if usable:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 78
        assert r.stderr.startswith("farmem: userfaultfd is not available here: only UFFD_USER_MODE_ONLY")
        assert r.stderr.rstrip().endswith("Run `farmem doctor` for details.")


@pytest.mark.root
@pytest.mark.bpf
def test_as_nobody_trace_and_attach_refuse_with_the_shared_wording(as_nobody):
    """Commands that need a missing piece say so the way doctor --require does."""
    r = as_nobody("trace", "1", "--duration", "1s", "--json")
    assert r.returncode == 78, r.stderr
    assert r.stderr.startswith("farmem: bpf-tracepoint is not available here:"), r.stderr
    assert r.stderr.rstrip().endswith("Run `farmem doctor` for details.")
    usable = by_name(json.loads(as_nobody("doctor", "--json").stdout))["userfaultfd"]["available"]
    if not usable:
        r = as_nobody("attach", "1")
        assert r.returncode == 78 and r.stderr.startswith("farmem: userfaultfd is not available here:"), r.stderr
