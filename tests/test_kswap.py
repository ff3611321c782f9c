# SPDX-License-Identifier: Apache-2.0
"""farmem run --mode kswap: Linux swap under a memory cgroup, with the pager's residency map
kept by the kswap monitor (PAGEMAP_SCAN + eBPF major faults). Needs root (zram, cgroups)."""

import errno
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

import pytest

from farmem import resmap
from farmem import procmap

pytestmark = [pytest.mark.root, pytest.mark.bpf]

# Fills 256 MiB of private anonymous memory, says so, then sleeps: under a 96 MiB limit most
# of it sits in swap while the test compares the map with /proc/PID/pagemap.
FILLER = r"""
import mmap, sys, time
n = 256 << 20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, n, 4096):
    m[off] = 1 + (off >> 12) % 251
print("ready", flush=True)
time.sleep(60)
"""

CHECK_JAVA = r"""
public class Check {
    public static void main(String[] a) {
        int n = Integer.parseInt(a[0]), rounds = Integer.parseInt(a[1]);
        long[][] live = new long[n][];
        for (int i = 0; i < n; i++) { live[i] = new long[8192]; java.util.Arrays.fill(live[i], i); }
        java.util.Random r = new java.util.Random(7);
        for (int k = 0; k < rounds; k++)
            for (int j = 0; j < n / 4; j++) {
                int i = r.nextInt(n);
                live[i] = new long[8192]; java.util.Arrays.fill(live[i], i);
                byte[] g = new byte[1 << 16]; g[1] = 1;
            }
        for (int i = 0; i < n; i++) for (long v : live[i]) if (v != i) { System.out.println("BAD " + i); System.exit(1); }
        System.out.println("CHECK OK");
    }
}
"""


def _pagemap_bits(pid, base, npages):
    """(present, swapped) flags of each page from /proc/PID/pagemap (bits 63 and 62)."""
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek((base >> 12) * 8)
        raw = f.read(npages * 8)
    return [((e >> 63) & 1, (e >> 62) & 1) for (e,) in struct.iter_unpack("<Q", raw)]


def _map_bytes(pid, region):
    path = procmap.find_maps(pid)[0]
    with open(path, "rb") as f:
        f.seek(region["map_offset"])
        return f.read(region["npages"])


def test_map_matches_pagemap(farmem_cmd, built):
    built("build/bin/farmem-trace")
    p = subprocess.Popen(farmem_cmd + ["run", "--mode", "kswap", "--local", "96M", "--",
                                       "python3", "-c", FILLER],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        child = int(subprocess.check_output(["pgrep", "-P", str(p.pid)], text=True).split()[0])
        time.sleep(1.5)  # a few scans after the fill
        snap = procmap.read_map(child)
        assert snap.hdr.pid == child and snap.hdr.memd == b"kswap"
        regions = [r for r in snap.regions if r["npages"] >= (256 << 20) >> 12]
        assert len(regions) == 1, snap.regions
        hdr_region = next(snap.hdr.slot(i) for i in range(resmap.SLOTS)
                          if snap.hdr.slot(i).base == regions[0]["base"])
        region = {"map_offset": hdr_region.map_offset, "npages": hdr_region.npages}
        states = _map_bytes(child, region)
        bits = _pagemap_bits(child, hdr_region.base, hdr_region.npages)
        agree = swapped = 0
        for b, (present, swp) in zip(states, bits):
            st = b & resmap.PG_STATE_MASK
            want = resmap.PG_DIRTY if present else resmap.PG_REMOTE if swp else resmap.PG_UNTOUCHED
            agree += st == want
            swapped += swp
        n = len(bits)
        assert swapped > n // 2, f"only {swapped} of {n} pages swapped out: is the limit applied?"
        assert agree >= n * 0.99, f"map agrees with pagemap on {agree} of {n} pages"
        fig = procmap.stat_figures(child, snap)
        assert fig["evictions"] > 0 and fig["registered_bytes"] >= 256 << 20
    finally:
        p.send_signal(signal.SIGTERM)  # forwarded to the child
        out, err = p.communicate(timeout=60)
    assert "farmem: kswap:" in err


def test_java_selfcheck_under_kswap(farmem_cmd, built, tmp_path):
    built("build/bin/farmem-trace")
    (tmp_path / "Check.java").write_text(CHECK_JAVA)
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "Check.java")], check=True)
    summary = tmp_path / "s.json"
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--local", "25%", "--summary-json",
                                     str(summary), "--", "java", "-Xms256m", "-Xmx256m",
                                     "-XX:+AlwaysPreTouch", "-cp", str(tmp_path), "Check", "500", "8"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr
    assert "CHECK OK" in r.stdout
    s = json.loads(summary.read_text())
    assert s["mode"] == "kswap" and s["bpf"] is True
    assert s["cgroup_limit_bytes"] == (256 << 20) // 4 + (64 << 20)
    assert s["evictions"] > 0 and s["faults"] > 0  # pages went to swap and came back
    # G1 (what the JVM runs under the pager, and so here too since session 57) maps the archived
    # heap objects of CDS over its heap's top region: 254 of its 256 MiB are anonymous memory
    assert s["registered_bytes"] >= 254 << 20
    assert s["gc_faults"] + s["app_faults"] > 0


def _jvm_init_lines(err: str) -> tuple[str, str]:
    gc = re.search(r"\[gc\s*\] Using (\w+)", err)
    cap = re.search(r"Heap Max Capacity: (\w+)", err)
    return (gc.group(1) if gc else None, cap.group(1) if cap else None)


def test_a_jvm_under_kswap_keeps_the_collector_and_heap_it_has_under_the_pager(farmem_cmd, tmp_path):
    """In a memory cgroup of less than 1792 MiB HotSpot picks Serial and sizes its heap from the limit;
    under the pager (no cgroup) the same command runs G1 with a share of the machine. Before session
    57 every Linux swap row of bench_seeds.py compared a Serial JVM with farmem's G1."""
    outside = subprocess.run(["java", "-Xlog:gc*:stderr", "-version"], capture_output=True, text=True, timeout=60)
    gc_outside, cap_outside = _jvm_init_lines(outside.stderr)
    assert gc_outside and cap_outside, outside.stderr
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--no-bpf", "--local", "256M", "--", "java",
                                     "-Xlog:gc*:stderr", "-version"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr
    assert _jvm_init_lines(r.stderr) == (gc_outside, cap_outside), r.stderr
    assert f"farmem: kswap: adding -XX:+Use{gc_outside}GC -Xmx" in r.stderr
    # given, they are kept: Serial stays Serial, and a given -Xmx and -Xms are not touched
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--no-bpf", "--local", "256M", "--", "java",
                                     "-XX:+UseSerialGC", "-Xms64m", "-Xmx200m", "-Xlog:gc*:stderr", "-version"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0, r.stderr
    assert _jvm_init_lines(r.stderr) == ("Serial", "200M"), r.stderr
    assert "adding" not in r.stderr, r.stderr


def test_a_percentage_budget_at_its_highest_is_not_the_machine(farmem_cmd, built, tmp_path):
    """`--mode kswap --local 25%` for a program that is not a JVM: the cgroup holds the whole machine
    until the first paged mapping is seen. Before session 36 the summary's highest budget
    (peak_limit_bytes) was that stand-in, 23.5 GiB here, for a program whose budget never passed
    a few hundred MiB."""
    built("build/bin/farmem-trace")
    summary = tmp_path / "s.json"
    # The mapping outlives a few of the monitor's scans (every 200 ms). The limit comes while its
    # pages are freshly written: v1 answered EBUSY at every scan (run_kswap._set_limit says why),
    # and two clean-clone runs ended with the stand-in.
    script = "import time; time.sleep(1.5); b = bytearray(200 << 20); print(sum(b[::4096])); time.sleep(1)"
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--local", "25%", "--summary-json", str(summary),
                                     "--", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr
    s = json.loads(summary.read_text())
    assert s["cgroup_limit_bytes"] < 1 << 30, (s, r.stderr[-2000:])
    assert 0 < s["peak_limit_bytes"] <= s["cgroup_limit_bytes"], s


def test_the_limit_follows_a_program_that_ends_before_ebpf_has_loaded(farmem_cmd, built, tmp_path):
    """The kswap monitor started only once farmem-trace was ready: a program that mapped, used and
    freed its memory while the eBPF programs loaded (slower under load) ran with the whole machine
    as its limit, one of the two ways a run could end with the stand-in (the other: _set_limit).
    Here farmem-trace starts only once the program has done its work (a file it writes last): with a
    fixed 3 s the program, slow to start under the suite's load, was still alive with its 200 MiB
    when the limit came down to 114.6 MiB, and was killed for memory (once, session 52)."""
    trace = built("build/bin/farmem-trace")
    slow = tmp_path / "build"
    (slow / "bin").mkdir(parents=True)
    for f in (trace.parent).iterdir():
        if f.name != "farmem-trace":
            (slow / "bin" / f.name).symlink_to(f)
    (slow / "lib").symlink_to(trace.parent.parent / "lib")
    done = tmp_path / "done"
    (slow / "bin" / "farmem-trace").write_text(
        f'#!/bin/sh\nn=0\nwhile [ ! -e {done} ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done\n'
        f'sleep 1\nexec {trace} "$@"\n')
    (slow / "bin" / "farmem-trace").chmod(0o755)
    summary = tmp_path / "s.json"
    script = (f"import time; time.sleep(0.5); b = bytearray(200 << 20); print(sum(b[::4096])); time.sleep(1); "
              f"open({str(done)!r}, 'w').close()")
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--local", "25%", "--summary-json", str(summary),
                                     "--", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=110, env=dict(os.environ, FARMEM_BUILD=str(slow)))
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr
    s = json.loads(summary.read_text())
    assert s["bpf"] is True, r.stderr  # the slow farmem-trace did start, after the program's work
    # a quarter of the paged mappings (the 200 MiB and any other large one) and 64 MiB of slack
    assert (200 << 20) // 4 + (64 << 20) <= s["cgroup_limit_bytes"] < 200 << 20, (s, r.stderr[-2000:])
    assert s["peak_resident_bytes"] > 0, s  # the program's mapping was seen while it lived


def test_a_limit_the_kernel_refuses_is_said(tmp_path, monkeypatch, capsys):
    """Every write of the lowered limit refused: the program runs on under the stand-in, and the
    run says so at its end instead of leaving a 23 GiB limit in the summary unexplained."""
    from farmem import main
    from farmem.commands import run_kswap

    def refuse(swapenv, limit):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
    monkeypatch.setattr(run_kswap, "_set_limit", refuse)
    summary = tmp_path / "s.json"
    script = "import time; b = bytearray(200 << 20); print(sum(b[::4096])); time.sleep(1)"
    status = main.cli(["run", "--mode", "kswap", "--no-bpf", "--local", "25%", "--summary-json", str(summary),
                       "--", sys.executable, "-c", script])
    err = capsys.readouterr().err
    assert status == 0, err
    assert re.search(r"the cgroup limit was never set to [\d.]+ MiB \(Device or resource busy\)", err), err
    assert json.loads(summary.read_text())["cgroup_limit_bytes"] > 1 << 30


def test_a_percentage_of_nothing_is_said(farmem_cmd):
    """A program with no private anonymous mapping as large as the threshold (Node's heap is 256 KiB
    reservations) gives a percentage budget nothing to be a share of: it runs under the machine's
    memory, and the run says so (bench_compat's Node under kswap ran so, unsaid, until session 43)."""
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--no-bpf", "--local", "25%", "--",
                                     sys.executable, "-c", "b = bytearray(8 << 20); print(len(b))"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and r.stdout.strip() == str(8 << 20), r.stderr
    assert "no private anonymous mapping of 64.0 MiB or more appeared, so --local 25% had nothing" in r.stderr, r.stderr
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--no-bpf", "--local", "25%", "--threshold", "4M", "--",
                                     sys.executable, "-c", "b = bytearray(8 << 20); import time; time.sleep(1); print(len(b))"],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and r.stdout.strip() == str(8 << 20), r.stderr
    assert "had nothing to be a share of" not in r.stderr, r.stderr


def test_the_summary_counts_every_process_of_the_run(farmem_cmd, built, tmp_path):
    """The kswap monitor follows CMD's own pid: for a program whose work is done by its children
    (stress-ng's workers; here a shell's python) its figures stayed 0 and its peak 0 B while the
    cgroup swapped hard (660,990 major faults in 5 s of stress-ng's vm stressor at 192 MiB). The
    summary gives the cgroup's own figures beside them: every process of the run."""
    built("build/bin/farmem-trace")
    summary = tmp_path / "s.json"
    script = ("b = bytearray(256 << 20)\n"
              "for i in range(0, len(b), 4096): b[i] = 1\n"
              "print(sum(b[::4096]))\n")
    r = subprocess.run(farmem_cmd + ["run", "--mode", "kswap", "--local", "96M", "--summary-json", str(summary),
                                     "--", "/bin/bash", "-c", f'{sys.executable} -c "$0"; true', script],
                       capture_output=True, text=True, timeout=110)
    assert r.returncode == 0 and r.stdout.strip() == str(65536), r.stderr
    s = json.loads(summary.read_text())
    assert s["cgroup_major_faults"] > 1000, s  # the child's pages came back from swap
    assert 64 << 20 < s["cgroup_peak_bytes"] <= 96 << 20, s
    assert "every process of the run (the cgroup)" in r.stderr, r.stderr[-2000:]
