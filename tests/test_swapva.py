# SPDX-License-Identifier: Apache-2.0
"""libswapva on the host: the C test program (tests/unit/test_swapva.c, ASan/UBSan) with
every backend available here forced in turn, then the automatic ladder; the backend
override through SWAPVA_BACKEND; and a smoke run of the benchmark driver. The module
backend is tested in the qemu lane (tests/vm/, test_vm_lane.py)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(ROOT, "build", "unit", "test_swapva")
BENCH = os.path.join(ROOT, "build", "bench", "swapva_bench")


def _build(path):
    target = os.path.relpath(path, ROOT)
    r = subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot build {target}: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return path


def _run(argv, env=None, timeout=300):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e)


def test_every_backend_forced_then_ladder():
    r = _run([_build(UNIT)])
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "test_swapva: OK" in out
    assert "memmove,strict: ok" in out
    # this host runs Linux 6.8+: UFFDIO_MOVE must be found and pass on its own
    rel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if rel >= (6, 8) and os.geteuid() == 0:
        assert "uffd" in out.splitlines()[0], out
        assert "uffd>memmove,strict: ok" in out, out


@pytest.mark.parametrize("backend", ["memmove", "uffd"])
def test_one_backend(backend):
    r = _run([_build(UNIT), "--backend", backend])
    if backend == "uffd" and "swapva_open: No such device" in r.stdout:
        pytest.skip("no UFFDIO_MOVE on this kernel")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_swapva: OK" in r.stdout


def test_env_override_picks_memmove():
    r = _run([_build(UNIT), "--backend", "auto"], env={"SWAPVA_BACKEND": "memmove"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("memmove:"), r.stdout


def test_kmod_forced_without_module_is_refused():
    if os.path.exists("/dev/swapva"):
        pytest.skip("/dev/swapva is present")
    r = _run([_build(UNIT), "--backend", "kmod"])
    assert r.returncode != 0
    assert "swapva_open: No such device" in r.stdout


def test_bench_smoke_and_table():
    _build(BENCH)
    r = _run([sys.executable, os.path.join(ROOT, "bench", "bench_swapva.py"), "--sizes", "1,64",
              "--iters", "20", "--json"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| pages | memmove (ns)" in r.stdout
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["stats"], summary
    for s in summary["stats"]:
        assert s["ratio_at_64"] and s["ratio_at_64"] > 0
