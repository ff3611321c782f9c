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
