# SPDX-License-Identifier: Apache-2.0
"""The qemu lane (tests/vm/lane.sh, docs/vm-lane.md) as one pytest: boots Debian's 6.1
kernel under TCG, loads kmod-swapva and runs libswapva's tests with the module, runs a
soft-RoCE self-test, runs the farmem JDK's full GC with the module when the JDK is built,
and must report every test passing. About 1-2 minutes once the
kernel is cached under build/vm (a few more on a fresh machine). Selected with `-m vm`;
also part of the default `make test`."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.vm

# every guest test the lane runs; a test that silently disappears is a failure too
EXPECTED = {
    "kmod-swapva-load", "swapva-kmod", "swapva-ladder", "swapva-bench-runs",
    "kmod-swapva-unload", "kernel-log-clean", "rxe-device", "rdma-rc-pingpong",
    "memd-rdma-listen", "rdma-hostile-peer", "tcp-pagetest-64M", "rdma-pagetest-64M",
    "rdma-bench-runs", "fault-split-tcp", "fault-split-rdma", "memd-survived", "memd-rdma-clean",
}


def test_vm_lane_all_pass():
    if os.geteuid() != 0 and not shutil.which("sudo"):
        pytest.skip("the lane installs packages with apt-get: needs root or sudo")
    r = subprocess.run(["make", "-s", "vm-test"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1500)
    out = r.stdout
    passed = set(re.findall(r"^PASS: (\S+)", out, re.M))
    failed = set(re.findall(r"^FAIL: (\S+)", out, re.M))
    summary = re.findall(r"^(\d+) passed, (\d+) failed$", out, re.M)
    detail = out[-6000:] + r.stderr[-3000:]
    assert r.returncode == 0, detail
    assert not failed, detail
    assert summary and summary[-1][1] == "0" and int(summary[-1][0]) == len(passed), detail
    assert EXPECTED <= passed, f"missing: {EXPECTED - passed}\n{detail}"
    # the farmem JDK's full GC with the module: run when the JDK is built (test_patched_jdk.py's
    # fixture builds it earlier in `make test`), else said to be skipped
    jdk = os.environ.get("FARMEM_JDK") or subprocess.run(
        ["bash", os.path.join(ROOT, "hotspot", "build.sh"), "--home"], capture_output=True, text=True).stdout.strip()
    if jdk and os.path.exists(os.path.join(jdk, "bin", "java")):
        assert "swapvagc-verify" in passed, detail
    else:
        assert "INFO: SKIP swapvagc: the farmem JDK is not built" in out, detail
