# SPDX-License-Identifier: Apache-2.0
"""The compatibility matrix (issue 19, docs/compatibility.md): programs from Debian's packages
under `farmem run` with a quarter of their paged memory local, each on small data and each
checking its own results byte for byte. bench/bench_compat.py runs the same programs on large
data, side by side with Linux swap.

Programs that fork (Redis's BGSAVE, a multiprocessing pool) are written as they should pass: the
child sees every byte of the parent's paged memory as it was at fork. They are strict xfails
until farmem supports fork (paged ranges are MADV_DONTFORK, so a child that touches one dies of
SIGSEGV), and flip to failures the day it does.
"""

import json
import subprocess

import pytest

pytestmark = [pytest.mark.memd, pytest.mark.pager]

FORK_XFAIL = pytest.mark.xfail(
    strict=True, reason="fork: paged ranges are MADV_DONTFORK, a child that reads one dies of SIGSEGV "
                        "(issue 19, fork support)")


@pytest.fixture(scope="module")
def shim(built):
    built("build/lib/libfarmem_preload.so")
    built("build/bin/farmem-memd")


def farmem_run(farmem_cmd, summary, *args, timeout=600, **kw):
    """`farmem run --summary-json summary ARGS` to completion; (CompletedProcess, summary dict)."""
    r = subprocess.run([*farmem_cmd, "run", "--summary-json", str(summary), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout, **kw)
    return r, (json.loads(summary.read_text()) if summary.exists() else None)


def assert_paged(s, what):
    """The run really paged: pages left for memd and came back."""
    assert s is not None, f"{what}: no summary"
    assert s["processes"] >= 1, f"{what}: no pager started: {s}"
    assert s["evictions"] > 0 and s["remote_reads"] > 0, f"{what}: nothing left the process: {s}"
    assert s["crc_errors"] == 0 and s["transport_errors"] == 0, s


# --- the shim under a program with its own allocator -------------------------------------------

def test_jemalloc_program_starts_and_keeps_its_allocator(shim, built, tmp_path, farmem_cmd):
    """Linked with Debian's libjemalloc, whose constructor maps memory before the shim's runs:
    the program starts, jemalloc serves its blocks (farmem allocates nothing through it), and
    every byte survives paging while four threads churn blocks of every size."""
    prog = built("build/tests/jemalloc_prog")
    r, s = farmem_run(farmem_cmd, tmp_path / "s.json", "--local", "25%", "--threshold", "1M", "--",
                      prog, "--size", 128, "--threads", 4, "--rounds", 2, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "jemalloc ok", r.stdout + r.stderr
    assert_paged(s, "jemalloc_prog")


# --- system calls into and out of evicted paged memory -----------------------------------------

def test_syscalls_into_evicted_buffers(shim, built, tmp_path, farmem_cmd):
    """read, pread, preadv, readv, recv, io_uring READ/READV/RECV into buffers that were evicted
    just before each call (the program checks with mincore), write and send out of them, at odd
    offsets that leave partly written pages: every byte checked. io_uring fixed buffers are paged
    memory's one refusal: the kernel writes them behind the pager's back."""
    prog = built("build/tests/sysio")
    r, s = farmem_run(farmem_cmd, tmp_path / "s.json", "--local", "25%", "--threshold", "8M", "--",
                      prog, "--dir", tmp_path, "--size", 32, "--expect-evicted", 90, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "sysio ok", r.stdout
    for method in ("read", "pread", "preadv", "readv (8 iovecs a call)", "recv", "io_uring READ",
                   "io_uring READV", "io_uring RECV", "write", "send"):
        assert any(line.startswith(f"{method}: ok (evicted") for line in lines), (method, r.stdout)
    assert "io_uring READ_FIXED: registration refused (Operation not supported)" in lines, r.stdout
    assert "io_uring buffer registration refused: the buffer is paged by farmem" in r.stderr
    assert_paged(s, "sysio")


def test_memory_locking_is_refused_not_run_on(shim, tmp_path, farmem_cmd):
    """mlockall, and mlock of paged memory, fail as under a low RLIMIT_MEMLOCK, with farmem's
    warning: the kernel cannot drop a locked page, and MCL_FUTURE would fault in every later
    mapping whole. The program goes on, paged and correct."""
    script = r"""
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
n = 128 << 20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, n, 4096):
    m[off] = (off >> 12) % 251
rc_all = libc.mlockall(3)  # MCL_CURRENT | MCL_FUTURE
err_all = ctypes.get_errno()
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
rc_one = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(1 << 20))
err_one = ctypes.get_errno()
bad = sum(m[off] != (off >> 12) % 251 for off in range(0, n, 4096))
print(rc_all, os.strerror(err_all), rc_one, os.strerror(err_one), bad)
"""
    r, s = farmem_run(farmem_cmd, tmp_path / "s.json", "--local", "32M", "--", "/usr/bin/python3", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["-1", "Operation", "not", "permitted", "-1", "Resource", "temporarily",
                                "unavailable", "0"], r.stdout
    assert "mlockall refused: this program's memory is paged by farmem" in r.stderr
    assert "mlock of paged memory refused" in r.stderr
    assert_paged(s, "python3 (mlock)")
