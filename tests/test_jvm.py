# SPDX-License-Identifier: Apache-2.0
"""The JVM side (issue 3): a real JVM, the real agent and pager, a real memd.

Every test runs java from the JDK on PATH (JDK 17 here) on the workloads in tests/java/, built
into build/java by `make c`. The whole file takes about two minutes on two CPUs.
"""

import json
import mmap
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from farmem import procmap, resmap

pytestmark = [pytest.mark.memd, pytest.mark.pager]

HEAP = "-Xmx512m"




@pytest.fixture
def java_cp(build, jvm_built) -> list:
    return ["java", HEAP, "-cp", str(build / "java")]


def memds_using(path: str) -> list:
    """farmem-memd processes whose command line names path (other engineers run memds too)."""
    r = subprocess.run(["pgrep", "-af", "farmem-memd"], capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if path in line]


def shm_files() -> set:
    return {n for n in os.listdir("/dev/shm") if "farmem" in n}


def farmem(farmem_cmd, *args, timeout=120, **kw):
    return subprocess.run(farmem_cmd + list(args), capture_output=True, text=True, timeout=timeout, **kw)


def stat_json(farmem_cmd, pid: int) -> dict:
    r = farmem(farmem_cmd, "stat", str(pid), "--json", timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- farmem run -- java ---------------------------------------------------------------------------

def fd_table(stdout: str) -> int:
    return int(re.search(r"^FDSize:\s+(\d+)$", stdout, re.M).group(1))


def test_programs_start_with_the_descriptor_table_grown(farmem_cmd, private_tmp):
    """The agent keeps its descriptors from 512 up. Grown to hold them by the agent itself, with the JVM's
    threads sharing the table, the kernel waited out an RCU grace period first (14-29 ms of each JVM's
    start). farmem run grows it in CMD's child before exec, and the shim in each process it is loaded into
    (a script's JVM), while one thread runs; exec keeps a table. Seen from a static busybox, which the shim
    cannot reach: run by farmem run, and exec'd by a shell (with the shim) that a shell forked, whose
    table fork sized to the descriptors open."""
    status = ["busybox", "grep", "FDSize", "/proc/self/status"]
    script = ["sh", "-c", 'sh -c "exec busybox grep FDSize /proc/self/status"; true']
    plain = subprocess.run(script, capture_output=True, text=True, timeout=30)
    assert plain.returncode == 0, plain.stderr
    if fd_table(plain.stdout) >= 1024:
        pytest.skip(f"a table of {fd_table(plain.stdout)} already without farmem: nothing to tell apart")
    for cmd in (status, script):
        r = farmem(farmem_cmd, "run", "--local", "50%", "--", *cmd, env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0, r.stderr
        assert fd_table(r.stdout) >= 1024, (cmd, r.stdout, fd_table(plain.stdout))


@pytest.mark.parametrize("gc", ["-XX:+UseG1GC", "-XX:+UseParallelGC", "-XX:+UseShenandoahGC"])
def test_heap_integrity_at_25_percent(farmem_cmd, java_cp, tmp_path, private_tmp, gc):
    summary = tmp_path / "s.json"
    shm = shm_files()
    cmd = java_cp[:1] + [gc] + java_cp[1:] + ["GcChurn", "--live-mb", "200", "--seconds", "6"]
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", *cmd,
               env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "adding -Xms512m" in r.stderr  # -Xms set to -Xmx, and said so
    s = json.loads(summary.read_text())
    assert s["remote_reads"] > 0 and s["evictions"] > 0, s
    assert s["gc_faults"] > 0 and s["app_faults"] > 0, s
    assert 0 < s["gc_zero_fills"] < s["gc_faults"], s  # GC threads evacuate into fresh pages and read remote ones
    assert s["local_limit_bytes"] == 128 << 20
    # The JVM's exit leaves nothing behind: no memd, no shared memory, no private directory.
    assert not memds_using(private_tmp)
    assert not os.listdir(private_tmp)
    assert shm_files() <= shm


def test_shenandoah_free_regions_are_discarded(farmem_cmd, java_cp, tmp_path, private_tmp):
    """Shenandoah at 25% local under its own verifier: its empty regions are discarded at every pause
    (read through VMStructs), its workers' faults count as concurrent, and the summary does not point
    a Shenandoah user at --gc farmem, which changes G1."""
    summary = tmp_path / "s.json"
    cmd = java_cp[:1] + ["-XX:+UseShenandoahGC", "-XX:+UnlockDiagnosticVMOptions", "-XX:+ShenandoahVerify"] + \
        java_cp[1:] + ["GcChurn", "--live-mb", "200", "--steps", "60000"]
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", *cmd,
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "discard disabled" not in r.stderr and "--gc farmem" not in r.stderr, r.stderr
    s = json.loads(summary.read_text())
    assert s["discards"] > 0 and s["remote_reads"] > 0, s
    assert s["gc_conc_faults"] > s["gc_faults"] // 2, s  # the workers; the VM thread runs the pauses (and the verifier)
    assert s["peak_resident_bytes"] <= 128 << 20, s


def test_gc_window_and_gc_writable_cut_full_gc_faults(farmem_cmd, java_cp, tmp_path, private_tmp):
    """A full GC's compaction reads the old generation in address order and writes each page it read
    soon after: with gc_window GC threads fetch their runs of remote pages ahead, and with
    gc_writable what they read goes in writable (no write-protect fault when the compaction writes
    it). Both runs check every word of the heap; the defaults take far fewer faults."""
    cmd = java_cp + ["GcChurn", "--live-mb", "300", "--steps", "60000"]  # 300 of 512 MiB live: full GCs
    stats = {}
    for name, flags, env in [("on", [], {}), ("off", ["--gc-window", "0"], {"FARMEM_GC_WRITABLE": "0"})]:
        summary = tmp_path / f"{name}.json"
        # --no-gc-moves: the compaction's pages come here (test_full_gcs_move_objects_inside_memd)
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--no-gc-moves", *flags,
                   "--", *cmd,
                   env=dict(os.environ, TMPDIR=private_tmp, **env))
        assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
        stats[name] = json.loads(summary.read_text())
    on, off = stats["on"], stats["off"]
    assert on["prefetch_issued"] > 4 * off["prefetch_issued"], (on, off)
    assert on["gc_faults"] < 0.7 * off["gc_faults"], (on, off)
    assert on["wp_faults"] < off["wp_faults"] / 4, (on, off)


def test_summary_counts_full_gcs_and_remark_pauses(farmem_cmd, java_cp, tmp_path, private_tmp):
    """The agent tells a pause's kind from the JVM's collection counts (jvmti-agent/gccounts.c): the
    summary's full_gcs and remark_pauses (G1's remarks, which end a concurrent marking that no full GC
    cut short) must match what the JVM's own GC log says it did. A cleanup pause counts itself a
    collection unless a full GC aborted its marking after the remark: such a one counts with the
    remarks (JDK 17's G1ConcurrentMark::cleanup returns first; seen once in 14 runs beside two busy
    loops, and in a clean-clone CI). GcChurn with 300 of 512 MiB live has
    full GCs and remarks."""
    summary = tmp_path / "s.json"
    cmd = java_cp[:1] + ["-Xlog:gc:stdout"] + java_cp[1:] + ["GcChurn", "--live-mb", "300", "--steps", "60000"]
    r = farmem(farmem_cmd, "run", "--local", "50%", "--summary-json", str(summary), "--", *cmd,
               timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
    s = json.loads(summary.read_text())
    full, remark_at, aborted = 0, {}, 0
    for m in re.finditer(r"\] GC\((\d+)\) Pause (Full|Remark|Cleanup) ", r.stdout):
        if m[2] == "Full":
            full += 1
        elif m[2] == "Remark":
            remark_at[m[1]] = full
        elif m[1] in remark_at and remark_at[m[1]] != full:
            aborted += 1  # a full GC between this cycle's remark and its cleanup
    assert full > 0 and remark_at, r.stdout
    assert s["full_gcs"] == full, (s["full_gcs"], r.stdout)
    assert s["remark_pauses"] == len(remark_at) + aborted, (s["remark_pauses"], aborted, r.stdout)


def churn_on_off_wide(farmem_cmd, java_cp, tmp_path, private_tmp, off_flag, wide_jvm_flag) -> dict:
    """GcChurn, 300 MiB live, at 25% local three ways: as is ("on"), with farmem's off_flag ("off"), and
    with the JVM's wide_jvm_flag ("wide"); each run must pass its own check of every word. Their
    summaries by name."""
    stats = {}
    for name, flags, jvm in [("on", [], []), ("off", [off_flag], []), ("wide", [], [wide_jvm_flag])]:
        summary = tmp_path / f"{name}.json"
        cmd = java_cp[:1] + jvm + java_cp[1:] + ["GcChurn", "--live-mb", "300", "--steps", "60000"]
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), *flags, "--", *cmd,
                   timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
        stats[name] = json.loads(summary.read_text())
    return stats


def test_object_reads_bring_an_array_with_its_first_fault(farmem_cmd, java_cp, tmp_path, private_tmp):
    """GcChurn's checks read whole arrays of 2-32 KiB at random, most of them in memd at 25% local. With
    object_reads (the default) the program's fault where it reads an array's length, or walks into a
    page from the array's header, brings the array's other remote pages in the same read
    (jvmti-agent/klass.c, uffd/prefetch.c): far fewer faults by the program than without. Without
    compressed class pointers the agent does not read arrays' headers: none read so. Every run checks
    every word of its arrays."""
    stats = churn_on_off_wide(farmem_cmd, java_cp, tmp_path, private_tmp, "--no-object-reads",
                              "-XX:-UseCompressedClassPointers")
    on, off, wide = stats["on"], stats["off"], stats["wide"]
    assert on["object_reads"] > 10000 and on["crc_errors"] == 0, on
    assert off["object_reads"] == 0 and wide["object_reads"] == 0, (off, wide)
    assert on["app_faults"] < 0.75 * off["app_faults"], (on, off)


def test_gc_referents_bring_the_next_references_objects(farmem_cmd, java_cp, tmp_path, private_tmp):
    """A full GC's marking and its pointer adjustment read the header of each array GcChurn's big
    array refers to: at 25% local most of them in memd, a fault each. With gc_referents (the default)
    such a fault, taken in the collector's loop over the references, brings the arrays the next
    references refer to in the same read (jvmti-agent/klass.c reads them, uffd/fault.c): fewer
    faults by the pause workers (here about 115k against 150k), about the same pages read, with
    narrow references and with full-width ones (-XX:-UseCompressedOops). Every run checks every word
    of its arrays."""
    stats = churn_on_off_wide(farmem_cmd, java_cp, tmp_path, private_tmp, "--no-gc-referents",
                              "-XX:-UseCompressedOops")
    on, off, wide = stats["on"], stats["off"], stats["wide"]
    assert on["referent_reads"] > 10000 and wide["referent_reads"] > 10000, (on, wide)
    assert off["referent_reads"] == 0, off
    assert all(s["crc_errors"] == 0 for s in stats.values()), stats
    pause_faults = {name: s["gc_faults"] - s["gc_conc_faults"] for name, s in stats.items()}
    assert pause_faults["on"] < 0.9 * pause_faults["off"], pause_faults
    assert on["remote_reads"] < 1.1 * off["remote_reads"], (on, off)


@pytest.mark.parametrize("gc,verify", [
    ("-XX:+UseG1GC", ["-XX:VerifyGCType=full"]),
    ("-XX:+UseSerialGC", []),
    ("-XX:+UseParallelGC", []),
])
def test_full_gcs_move_objects_inside_memd(farmem_cmd, java_cp, tmp_path, private_tmp, gc, verify):
    """A stock collector's full GC slides each live object down with libjvm's memmove. With gc_moves
    (the default) a pause's move that touches pages memd holds is done inside memd's store
    (jvmti-agent/gcmove.c). HotSpot verifies the heap before and after every full GC (G1) or every
    GC (Serial, Parallel), and GcChurn checks every word at the end. For G1, whose verifier reads
    the heap only at full GCs, --no-gc-moves beside it: nothing moved in memd, more pages read back,
    and the GC threads' read-ahead (gc_window) on in full GCs too."""
    cmd = java_cp[:1] + [gc, "-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC",
                         *verify] + java_cp[1:] + ["GcChurn", "--live-mb", "300", "--steps", "40000"]
    stats = {}
    for name, flags in [("on", []), ("off", ["--no-gc-moves"])][:2 if verify else 1]:
        summary = tmp_path / f"{name}.json"
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), *flags, "--", *cmd,
                   timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
        stats[name] = json.loads(summary.read_text())
    on = stats["on"]
    assert on["compact_moves"] > 1000 and on["compact_pages"] > 0 and on["crc_errors"] == 0, on
    if verify:
        off = stats["off"]
        assert off["compact_moves"] == 0, off
        assert on["remote_reads"] < 0.8 * off["remote_reads"], (on, off)
        # and in a full GC whose moves memd does, GC threads do not read ahead (gcmove.h)
        assert on["prefetch_issued"] < off["prefetch_issued"] / 2, (on, off)


def test_young_pauses_promote_primitive_arrays_inside_memd(farmem_cmd, java_cp, tmp_path, private_tmp):
    """G1 copies a surviving object with libjvm's memcpy. With gc_moves (the default), a primitive
    array copied into an old region whose pages are not resident has the whole pages between its
    header's and its last written straight into memd's store (jvmti-agent/gcmove.c). HotSpot
    verifies the heap before and after every young and mixed pause, and GcChurn checks every word
    at the end. Beside it --no-gc-moves: nothing moved, more pages zero-filled and written back."""
    # 200 MiB live in 1 GiB (no full GC, verified or not), 128 MiB of it local
    cmd = java_cp[:2] + ["-Xmx1g", "-XX:+UseG1GC", "-Xlog:gc", "-XX:+UnlockDiagnosticVMOptions",
                         "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC", "-XX:VerifyGCType=young-normal,mixed"] + \
        java_cp[2:] + ["GcChurn", "--live-mb", "200", "--steps", "40000"]
    stats = {}
    for name, flags in [("on", []), ("off", ["--no-gc-moves"])]:
        summary = tmp_path / f"{name}.json"
        r = farmem(farmem_cmd, "run", "--local", "128M", "--summary-json", str(summary), *flags, "--", *cmd,
                   timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
        # No full GC: every move counted below is a young or mixed pause's promotion.
        assert "Pause Young" in r.stdout and "Pause Full" not in r.stdout, r.stdout
        stats[name] = json.loads(summary.read_text())
    on, off = stats["on"], stats["off"]
    # (by hand, 2026-12-05: 30.7k moves of 101k pages; zero fills 325k against 442k, writes 314k against 430k)
    assert on["compact_moves"] > 5000 and on["compact_pages"] > 20000 and on["crc_errors"] == 0, on
    assert off["compact_moves"] == 0, off
    assert on["zero_fills"] < 0.9 * off["zero_fills"], (on, off)
    assert on["remote_writes"] < 0.9 * off["remote_writes"], (on, off)


def test_promotions_held_where_the_program_reads_them_back(farmem_cmd, java_cp, tmp_path, private_tmp):
    """AllocRace checks nearly every array once more soon after its promotion: written in memd, each
    would be fetched back page by page. The agent looks at the pages it promoted at the next pause
    and, finding them read back, promotes through local memory (jvmti-agent/gcmove.c). So its reads
    per MiB allocated stay near those without gc_moves; the log says why."""
    cmd = java_cp[:2] + ["-Xmx256m", "-XX:+UseG1GC"] + java_cp[2:] + ["AllocRace", "--seconds", "6", "--no-full-gc"]
    runs = {}
    for name, flags in [("on", ["--log", "info"]), ("off", ["--no-gc-moves"])]:
        summary = tmp_path / f"{name}.json"
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), *flags, "--", *cmd,
                   timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0 and "allocrace: ok" in r.stdout, r.stdout + r.stderr
        mb = int(r.stdout.split("allocated_mb=")[1].split()[0])
        runs[name] = (json.loads(summary.read_text()), r.stderr, mb)
    (on, on_err, on_mb), (off, _, off_mb) = runs["on"], runs["off"]
    assert "reads its promoted arrays back soon" in on_err, on_err
    # (by hand, 2026-12-06: 0.55 reads per MiB, the looks' pauses that promote again; 0.15 without gc_moves;
    # 30 with every promotion in memd, session 70's build)
    assert on["remote_reads"] / on_mb < 2 * off["remote_reads"] / off_mb + 2, (on, off, on_mb, off_mb)


def test_mixed_pauses_copy_from_memd_verified(farmem_cmd, java_cp, tmp_path, private_tmp):
    """Safety of gc_moves' copies from memd's store into resident pages (jvmti-agent/gcmove.c): G1's
    mixed pauses at 50% local evacuate old regions whose pages left for memd, and HotSpot verifies
    the heap around every one of them; GcChurn checks every word of its live set at the end. (That
    those copies save reads is measured, not tested: bench/RESULTS.md, session 72.)"""
    summary = tmp_path / "s.json"
    cmd = java_cp[:1] + ["-Xmx256m", "-XX:+UseG1GC", "-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC",
                         "-XX:+VerifyAfterGC", "-XX:VerifyGCType=mixed", "-Xlog:gc"] + java_cp[2:] + \
        ["GcChurn", "--live-mb", "150", "--steps", "100000"]
    r = farmem(farmem_cmd, "run", "--local", "50%", "--summary-json", str(summary), "--", *cmd,
               timeout=300, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-3000:] + r.stderr
    assert r.stdout.count("Pause Young (Mixed)") >= 5, r.stdout[-3000:]
    s = json.loads(summary.read_text())
    assert s["compact_moves"] > 0 and s["remote_reads"] > 0, s  # gc_moves at work, the old regions in memd


class HeapFileSampler(threading.Thread):
    """Samples the size of a JVM's -XX:AllocateHeapAt heap file (unlinked at once by HotSpot; reached
    through /proc/PID/map_files, which needs root) while it runs: the memory the heap really takes."""

    def __init__(self, marker: str):
        super().__init__(daemon=True)
        self.marker, self.samples, self.done = marker.encode(), [], threading.Event()

    def _java(self):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if os.path.basename(argv[0]) == b"java" and self.marker in argv:
                    return pid
            except OSError:
                pass
        return None

    def run(self):
        pid = None
        while not self.done.wait(0.05):
            pid = pid or self._java()
            try:
                with open(f"/proc/{pid}/maps") as f:
                    ranges = [l.split()[0] for l in f if " rw-s " in l and "/dev/shm/" in l]
                # One file: its size is the same through any of its mappings.
                self.samples.append(os.stat(f"/proc/{pid}/map_files/{ranges[0]}").st_blocks * 512)
            except (OSError, IndexError, TypeError):
                pass


@pytest.mark.parametrize("gc", ["-XX:+UseG1GC", "-XX:+UseParallelGC"])
def test_shared_memory_heap_at_25_percent(farmem_cmd, java_cp, tmp_path, private_tmp, gc):
    """-XX:AllocateHeapAt=/dev/shm: the heap is a shared-memory file, paged in minor-fault mode.
    HotSpot preallocates the whole file; the pager punches pages out of it, so what the file holds
    (the memory the heap takes) must stay within the budget, not just the pager's count."""
    summary = tmp_path / "s.json"
    before = set(os.listdir("/dev/shm"))
    marker = f"-Dfarmem.test={tmp_path.name}"
    cmd = java_cp[:1] + [gc, "-XX:AllocateHeapAt=/dev/shm", marker] + java_cp[1:] + \
        ["GcChurn", "--live-mb", "200", "--seconds", "6"]
    sampler = HeapFileSampler(marker)
    sampler.start()
    try:
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", *cmd,
                   env=dict(os.environ, TMPDIR=private_tmp))
    finally:
        sampler.done.set()
        sampler.join()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "minor-fault mode" in r.stderr
    s = json.loads(summary.read_text())
    assert s["remote_reads"] > 0 and s["evictions"] > 0 and s["discards"] > 0, s
    assert s["gc_faults"] > 0 and s["app_faults"] > 0, s
    assert s["local_limit_bytes"] == 128 << 20 and s["peak_resident_bytes"] <= 128 << 20, s
    if os.geteuid() == 0:
        # Preallocated in full (512 MiB) until the agent registers the heap, then within the budget
        # (plus the few pages CDS maps over the heap range, which are not the pager's).
        after = sampler.samples[next(i for i, v in enumerate(sampler.samples) if v <= 128 << 20):]
        assert len(after) > 20 and max(after) <= (128 + 2) << 20, sampler.samples
    assert not memds_using(private_tmp)
    assert not os.listdir(private_tmp)
    left = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("#") or "farmem" in n}
    assert not left


# A JVM started small that grows its heap to hold 300 MiB of live data, then drops to 20 MiB and runs
# System.gc(): with these ratios G1 gives most of the heap back (the workload prints the committed heap).
GROW_SHRINK = ["-Xmx512m", "-Xms16m", "-XX:MaxHeapFreeRatio=30", "-XX:MinHeapFreeRatio=10"]
GROW_SHRINK_ARGS = ["GcChurn", "--live-mb", "16", "--grow-mb", "300", "--shrink-mb", "20"]


def shrunk_figures(out: str) -> tuple:
    """The committed heap (MiB) after and before the workload's shrink, from its own line."""
    m = re.search(r"^gcchurn: shrunk slots=\d+ committed=(\d+) MiB \(was (\d+) MiB\)", out, re.M)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def test_run_pages_a_heap_that_grows_and_shrinks(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """-Xms below -Xmx is kept (farmem run adds -Xms only when there is none), and the heap is paged as
    G1 commits it and uncommits it: every word checked, the budget held."""
    summary = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", "java", *GROW_SHRINK,
               "-cp", str(build / "java"), *GROW_SHRINK_ARGS, "--seconds", "10",
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "adding -Xms" not in r.stderr
    after, before = shrunk_figures(r.stdout)
    assert after * 2 < before, r.stdout  # the heap really shrank
    s = json.loads(summary.read_text())
    assert s["local_limit_bytes"] == 128 << 20 and s["peak_resident_bytes"] <= 128 << 20, s
    assert s["remote_reads"] > 0 and s["evictions"] > 0 and s["discards"] > 0, s
    assert not memds_using(private_tmp)


def test_heap_file_off_tmpfs_is_refused(farmem_cmd, jvm_built, private_tmp, build):
    """A heap on a DAX/NVDIMM or disk file system cannot be paged: refused before the JVM starts."""
    from farmem.java import fs_type
    if fs_type(str(build)) == "tmpfs":
        pytest.skip(f"{build} is on tmpfs here")
    r = farmem(farmem_cmd, "run", "--", "java", f"-XX:AllocateHeapAt={build}", HEAP, "-version", timeout=30,
               env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 1, r.stderr
    assert "not tmpfs" in r.stderr and "DAX/NVDIMM" in r.stderr
    assert "openjdk version" not in r.stderr
    assert not os.listdir(private_tmp)


def test_pagerank_matches_unpaged_run(farmem_cmd, java_cp, tmp_path):
    args = ["PageRank", "--nodes", "1500000", "--iters", "5"]
    plain = subprocess.run(java_cp + args, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    summary = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--local", "10%", "--summary-json", str(summary), "--", *java_cp, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    digest = re.compile(r"digest=([0-9a-f]+)")
    assert digest.search(r.stdout).group(1) == digest.search(plain.stdout).group(1)
    assert json.loads(summary.read_text())["remote_reads"] > 0


def test_h2_database_at_15_percent(farmem_cmd, build, built, jvm_built, tmp_path, private_tmp):
    """The third-party workload: H2 (Maven Central, fetched by make) in memory, every answer checked.
    At 15%: at 25% its 200,000 rows fit the budget beside a young generation of a quarter of it
    (session 68) and nothing is read back."""
    built("build/java/thirdparty/.ok")
    summary = tmp_path / "s.json"
    cp = f"{build / 'java'}:{build / 'java' / 'thirdparty' / 'h2.jar'}"
    r = farmem(farmem_cmd, "run", "--local", "15%", "--summary-json", str(summary), "--",
               "java", HEAP, "-cp", cp, "H2Workload", "--rows", "200000", "--rounds", "300",
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^h2: ok rows=200000 queries=3000 ", r.stdout, re.M), r.stdout
    s = json.loads(summary.read_text())
    assert s["remote_reads"] > 0 and s["gc_faults"] > 0 and s["app_faults"] > 0, s


@pytest.mark.parametrize("jvm_args, message", [
    (["-XX:+UseZGC", HEAP], "ZGC is not supported"),
    (["-XX:AllocateHeapAt=/nonexistent-farmem-dir", HEAP], "no such directory"),
])
def test_run_refuses_what_it_cannot_serve(farmem_cmd, jvm_built, private_tmp, jvm_args, message):
    r = farmem(farmem_cmd, "run", "--", "java", *jvm_args, "-version", timeout=30,
               env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 1, r.stderr
    assert message in r.stderr
    assert "openjdk version" not in r.stderr  # refused before the JVM started
    assert not os.listdir(private_tmp)  # nor was memd started


def test_run_without_xmx_takes_hotspots_own_maximum(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """`java -cp ... Main` as a new user types it: farmem asks the JVM for the maximum it would pick
    (here with -XX:MaxRAMPercentage), gives it as -Xmx and -Xms, and --local 25% is a quarter of it."""
    summary = tmp_path / "s.json"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    pct = (512 << 20) * 100 / ram  # about 512 MiB on any machine
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", "java",
               f"-XX:MaxRAMPercentage={pct:.4f}", "-cp", str(build / "java"), "GcChurn", "--live-mb", "200",
               "--steps", "20000", timeout=180, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    m = re.search(r"adding -Xmx(\d+)([kmg]?):", r.stderr)
    assert m, r.stderr
    xmx = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2)]
    assert abs(xmx - (512 << 20)) < 64 << 20, (xmx, ram)  # that share of this machine, as HotSpot aligns it
    s = json.loads(summary.read_text())
    assert s["local_limit_bytes"] == xmx // 4 and s["remote_reads"] > 0, s


def test_a_jvm_started_by_a_script_is_paged_by_the_agent(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """`farmem run -- SCRIPT` whose script starts java (spark-submit, a service's start script): every
    JVM gets the agent in JAVA_TOOL_OPTIONS, the preload shim stands aside in it, and the heap is
    paged with the agent's discard and GC-thread accounting. A JVM the agent cannot serve (ZGC) runs
    unpaged with a warning instead of failing inside the script."""
    summary = tmp_path / "s.json"
    cp = str(build / "java")
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--", "sh", "-c",
               f"java -Xmx512m -cp {cp} GcChurn --live-mb 200 --steps 60000 && "
               f"java -XX:+UseZGC -Xmx128m -cp {cp} GcChurn --live-mb 20 --steps 1000",
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("gcchurn: ok") == 2, r.stdout
    picked = [line for line in r.stderr.splitlines() if line.startswith("Picked up JAVA_TOOL_OPTIONS: ")]
    assert len(picked) == 2 and all("-agentpath:" in line for line in picked), r.stderr
    assert "ZGC is not supported" in r.stderr and "runs without farmem (onerror=continue)" in r.stderr
    s = json.loads(summary.read_text())
    assert s["processes"] == 1, s  # the G1 JVM, paged by its agent; sh and the ZGC JVM are not
    assert s["gc_faults"] > 0 and s["discards"] > 0 and s["remote_reads"] > 0, s
    assert s["local_limit_bytes"] == 128 << 20 and s["peak_resident_bytes"] <= 128 << 20, s
    assert not memds_using(private_tmp)


@pytest.fixture
def huge_pages():
    """400 huge pages reserved for the test (800 MiB with 2 MiB pages), the old count put back."""
    knob = Path("/proc/sys/vm/nr_hugepages")
    if os.geteuid() != 0:
        pytest.skip("reserving huge pages needs root")
    old = knob.read_text().strip()
    knob.write_text("400\n")
    try:
        if int(knob.read_text()) < 400:
            pytest.skip("the kernel could not reserve 400 huge pages")
        yield
    finally:
        knob.write_text(old + "\n")


def test_a_heap_in_huge_pages_runs_unpaged(farmem_cmd, build, jvm_built, private_tmp, huge_pages):
    """A script's JVM with -XX:+UseLargePages whose heap got hugetlbfs pages (farmem run -- java
    refuses the flag; a script's JVM is the agent's to judge): the pager pages 4 KiB pages, so the
    JVM runs without farmem, saying why, and its workload is correct."""
    cp = str(build / "java")
    r = farmem(farmem_cmd, "run", "--local", "25%", "--", "sh", "-c",
               f"java -XX:+UseLargePages -Xmx256m -cp {cp} GcChurn --live-mb 60 --steps 20000",
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
    assert "the heap is in huge pages" in r.stderr and "runs without farmem (onerror=continue)" in r.stderr, r.stderr
    assert "G1 sizing" not in r.stderr, r.stderr  # no budget to fit an unpaged heap to


def test_the_jvms_a_jvm_starts_are_paged(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """`farmem run -- java ... ChildJvm java ...`: the first JVM has the agent on its command line, and
    hands it to the JVMs it starts through their JAVA_TOOL_OPTIONS (the launcher gave it the value in
    FARMEM_CHILD_JAVA_TOOL_OPTIONS). Both are paged and counted; the parent prints no "Picked up"
    line, the child does."""
    summary = tmp_path / "s.json"
    cp = str(build / "java")
    r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), "--",
               "java", "-Xmx64m", "-cp", cp, "ChildJvm",
               "java", "-Xmx512m", "-cp", cp, "GcChurn", "--live-mb", "200", "--steps", "60000",
               timeout=240, env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout and "childjvm: child exited 0" in r.stdout, r.stdout
    assert r.stderr.count("Picked up JAVA_TOOL_OPTIONS") == 1, r.stderr
    s = json.loads(summary.read_text())
    assert s["processes"] == 2, s
    assert s["remote_reads"] > 0 and s["gc_faults"] > 0 and s["discards"] > 0, s


def test_maven_started_by_its_script_is_paged(farmem_cmd, jvm_built, tmp_path, private_tmp):
    """Debian's Maven (/usr/bin/mvn, a shell script that starts java) resolving and copying Neo4j's 235
    jars offline, with MAVEN_OPTS=-Xmx256m and 32 MiB of that local (with 64 MiB it fits since session
    68): its JVM is paged through JAVA_TOOL_OPTIONS, and it copies the same jars, byte for byte, as
    without farmem."""
    import hashlib
    import shutil
    if not shutil.which("mvn"):
        pytest.skip("no mvn")
    pom = Path(__file__).parent / "java" / "neo4j" / "pom.xml"
    env = dict(os.environ, TMPDIR=private_tmp, MAVEN_OPTS="-Xmx256m")

    def copy(out, *pre):
        r = subprocess.run([*pre, "mvn", "-o", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                            f"-DoutputDirectory={out}", "-DincludeTypes=jar"],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}, r

    plain, r0 = copy(tmp_path / "plain")
    if "BUILD FAILURE" in r0.stdout or len(plain) < 100:
        pytest.skip("Neo4j's jars are not in ~/.m2 (make seeds fetches them)")
    summary = tmp_path / "s.json"
    paged, r = copy(tmp_path / "paged", *farmem_cmd, "run", "--local", "32M", "--summary-json", str(summary), "--")
    assert paged == plain
    s = json.loads(summary.read_text())
    assert s["processes"] == 1 and s["local_limit_bytes"] == 32 << 20, s
    assert s["evictions"] > 0 and s["remote_reads"] > 0 and s["gc_faults"] > 0, s


def test_run_refuses_a_budget_larger_than_the_heap(farmem_cmd, jvm_built):
    r = farmem(farmem_cmd, "run", "--local", "1g", "--", "java", HEAP, "-version", timeout=30)
    assert r.returncode == 1
    assert "larger than the heap" in r.stderr


# --- the agent's options ----------------------------------------------------------------------------

@pytest.mark.parametrize("opts, message", [
    ("memd=unix:/nonexistent,bogus=1", "unknown option 'bogus'"),
    ("memd=unix:/nonexistent,prefetch=999", "prefetch=999"),
    ("memd=unix:/nonexistent,local=200%", "local=200%"),
    ("memd=unix:/nonexistent,onerror=maybe", "onerror=maybe"),
    ("memd=unix:/nonexistent,threshold=1m", "threshold"),
])
def test_bad_agent_option_stops_the_jvm(build, jvm_built, opts, message):
    """Documented in docs/jvm.md: an unknown key or bad value means the JVM does not start."""
    r = subprocess.run(["java", "-Xmx64m", f"-agentpath:{build}/lib/libfarmem_agent.so={opts}", "-version"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert message in r.stderr and "the JVM does not start" in r.stderr
    assert "openjdk version" not in r.stderr


def test_gc_aware_comes_from_the_environment_too(build, jvm_built):
    """knobs.md's FARMEM_GC_AWARE reaches the agent (bench/bench_gc_aware.py turns the knob off with it)."""
    r = subprocess.run(["java", "-Xmx64m", f"-agentpath:{build}/lib/libfarmem_agent.so=memd=unix:/nonexistent",
                        "-version"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, FARMEM_GC_AWARE="7"))
    assert r.returncode != 0
    assert "FARMEM_GC_AWARE" in r.stderr and "the JVM does not start" in r.stderr


def test_unreachable_memd_follows_onerror(build, jvm_built):
    agent = f"-agentpath:{build}/lib/libfarmem_agent.so=memd=unix:/nonexistent"
    env = dict(os.environ, FARMEM_SECRET="x" * 16)
    r = subprocess.run(["java", "-Xmx64m", agent, "-version"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode != 0 and "the JVM does not start (onerror=exit)" in r.stderr
    r = subprocess.run(["java", "-Xmx64m", agent + ",onerror=continue", "-version"], capture_output=True,
                       text=True, env=env, timeout=30)
    assert r.returncode == 0 and "runs without farmem" in r.stderr and "openjdk version" in r.stderr


# --- attach and detach -----------------------------------------------------------------------------

def start_churn(java_cp, seconds: int, extra: tuple = (), until_eof: bool = False) -> subprocess.Popen:
    """GcChurn for `seconds`; until_eof: until its stdin closes too (communicate() closes it)."""
    p = subprocess.Popen(java_cp[:1] + ["-Xms512m", *extra] + java_cp[1:] +
                         ["GcChurn", "--live-mb", "200", "--seconds", str(seconds)] + (["--until-eof"] if until_eof else []),
                         stdin=subprocess.PIPE if until_eof else None,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("gcchurn: ready"), line
    return p


@pytest.mark.parametrize("heap", [(), ("-XX:AllocateHeapAt=/dev/shm",)], ids=["anon", "shm"])
def test_attach_pages_a_running_jvm_and_detach_brings_it_home(farmem_cmd, java_cp, heap):
    # It churns until the test is done with it (a fixed 22 s once ended under a loaded CI's detach).
    jvm = start_churn(java_cp, 300, heap, until_eof=True)
    try:
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "50%", timeout=60)
        assert r.returncode == 0, r.stderr
        assert "attached to pid" in r.stderr
        first = stat_json(farmem_cmd, jvm.pid)
        assert first["registered_bytes"] > 0 and first["local_limit_bytes"] == 256 << 20
        # A shared-memory heap is paged in minor-fault mode: its regions say so.
        assert all(("shmem" in r["flags"]) == bool(heap) for r in first["regions"]), first["regions"]
        deadline = time.monotonic() + 30  # ~3 s alone; a loaded machine runs the churn slower
        while True:
            second = stat_json(farmem_cmd, jvm.pid)
            ok = second["evictions"] > first["evictions"] > 0 and second["gc_faults"] > 0 and second["gc_cycles"] > 0
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert second["evictions"] > first["evictions"] > 0, (first, second)
        assert second["gc_faults"] > 0 and second["gc_cycles"] > 0
        again = farmem(farmem_cmd, "attach", str(jvm.pid), timeout=30)
        assert again.returncode == 1 and "already paged" in again.stderr

        r = farmem(farmem_cmd, "detach", str(jvm.pid), timeout=120)
        assert r.returncode == 0, r.stderr
        # The agent counted no page left in memd before it let go of the heap (it refuses
        # otherwise), and the pager, its map and its memd are gone.
        s = farmem(farmem_cmd, "stat", str(jvm.pid), timeout=30)
        assert s.returncode == 1 and "not running under farmem" in s.stderr
        assert not Path(f"/tmp/farmem-attach-{jvm.pid}").exists()
        assert not memds_using(f"/tmp/farmem-attach-{jvm.pid}/")
        out, err = jvm.communicate(timeout=120)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0, out + err
    assert "gcchurn: ok" in out
    assert "detached: every heap page is local" in err


class StatSampler(threading.Thread):
    """The figures `farmem stat PID --json` shows, read every few tenths of a second while the JVM runs,
    every sample kept. With `old` (the heap's page indices paged at attach, as a byte mask), also the
    most pages seen remote in memd among those the JVM committed later."""

    def __init__(self, pid: int, old: bytes = b""):
        super().__init__(daemon=True)
        self.pid, self.old, self.samples, self.remote_new, self.done = pid, old, [], 0, threading.Event()

    def run(self):
        while not self.done.wait(0.2):
            try:
                self.samples.append(procmap.stat_figures(self.pid, procmap.read_map(self.pid)))
                if self.old:
                    states = heap_states(self.pid)
                    self.remote_new = max(self.remote_new, sum(
                        1 for st, old in zip(states, self.old) if st == resmap.PG_REMOTE and not old))
            except Exception:  # the JVM exited, or its map is not there yet
                pass

    def stop(self) -> list:
        self.done.set()
        self.join()
        return self.samples


def heap_states(pid: int) -> bytes:
    """The page states (low three bits of each byte) of the JVM's sparse heap region."""
    fd = os.open(procmap.find_maps(pid)[0], os.O_RDONLY | os.O_CLOEXEC)
    try:
        with mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
            hdr = resmap.ResmapHdr.from_buffer_copy(mm, 0)
            for r in hdr.regions[:hdr.nregions]:
                if r.flags & resmap.REGION_F_LIVE and r.flags & resmap.REGION_F_SPARSE:
                    return mm[r.map_offset:r.map_offset + r.npages].translate(resmap._STATE_TABLE)
    finally:
        os.close(fd)
    raise AssertionError(f"pid {pid} has no sparse heap region")


def committed_bytes(pid: int, region: dict) -> int:
    """Bytes of anonymous private read-write memory in a region's range, per /proc/PID/maps: what HotSpot
    has committed of its heap (its reserved rest is PROT_NONE, the CDS archive's pieces are a file)."""
    lo, hi, n = region["base"], region["base"] + region["bytes"], 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            a, b = (int(x, 16) for x in fields[0].split("-"))
            if fields[1] == "rw-p" and fields[4] == "0" and len(fields) == 5:
                n += max(0, min(b, hi) - max(a, lo))
    return n


class AttachedJvm:
    """A JVM running java_cmd (GcChurn: it prints `gcchurn: ready` first) and attached with `--local`:

        with AttachedJvm(farmem_cmd, java_cmd, "25%") as a:
            a.sample()      # start a StatSampler
            a.go()          # a line on the JVM's stdin (GcChurn --wait)
            out, err, samples = a.finish()

    The JVM is killed on the way out if the test failed before it finished."""

    def __init__(self, farmem_cmd: list, java_cmd: list, local: str):
        self.farmem_cmd, self.java_cmd, self.local, self.sampler = farmem_cmd, java_cmd, local, None

    def __enter__(self):
        self.jvm = subprocess.Popen(self.java_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        self.pid = self.jvm.pid
        try:
            line = self.jvm.stdout.readline()
            assert line.startswith("gcchurn: ready"), line or self.jvm.stderr.read()
            r = farmem(self.farmem_cmd, "attach", str(self.pid), "--local", self.local, timeout=60)
            assert r.returncode == 0, r.stderr
        except BaseException:
            self.__exit__()
            raise
        return self

    def sample(self, old: bytes = b"") -> StatSampler:
        self.sampler = StatSampler(self.pid, old)
        self.sampler.start()
        return self.sampler

    def go(self) -> None:
        self.jvm.stdin.write("go\n")
        self.jvm.stdin.flush()

    def finish(self, timeout: int = 180) -> tuple:
        """The JVM's output once it exited (status 0 and `gcchurn: ok` checked), and the samples."""
        out, err = self.jvm.communicate(timeout=timeout)
        samples = self.sampler.stop() if self.sampler else []
        assert self.jvm.returncode == 0 and "gcchurn: ok" in out, out + err
        return out, err, samples

    def __exit__(self, *exc):
        if self.sampler:
            self.sampler.stop()
        if self.jvm.poll() is None:
            self.jvm.kill()
            self.jvm.wait()


@pytest.mark.parametrize("heap, local, limit", [
    (["-Xmx512m"], "50%", 256 << 20),  # the case: -Xmx only, the budget a share of it
    ([], "128M", 128 << 20),           # no heap flags at all: HotSpot's own sizes
], ids=["xmx-only", "no-flags"])
def test_attach_to_a_jvm_started_the_ordinary_way(farmem_cmd, build, jvm_built, heap, local, limit):
    """No -Xms: the heap is committed in part and grows. Attach pages it, brings what it finds under the
    budget at once, and from then on the peak never passes the budget; every word is checked."""
    with AttachedJvm(farmem_cmd, ["java", *heap, "-cp", str(build / "java"), "GcChurn", "--live-mb", "200",
                                  "--seconds", "12"], local) as a:
        a.sample()
        _, _, samples = a.finish()
    assert len(samples) > 10, samples
    last = samples[-1]
    assert last["local_limit_bytes"] == limit
    assert [r["flags"] for r in last["regions"]] == [["heap", "sparse"]]
    assert last["evictions"] > 0 and last["remote_reads"] > 0 and last["gc_cycles"] > 0, last
    # What attach found resident is said, and none of it counts as a peak: the pager evicted it first.
    assert last["adopt_peak_bytes"] > 0
    if last["adopt_peak_bytes"] > limit:
        assert last["adopt_evictions"] > 0
    over = [k for k, s in enumerate(samples) if max(s["peak_resident_bytes"], s["resident_bytes"]) > limit]
    # One page over the budget, now and then in a whole `make test` only (sessions 77 and 78; never in 77
    # runs of this test alone): what could explain it goes with the failure, in full (a str message is
    # not cut short), at the first sample over and at the end.
    why = ("peak_resident_bytes", "resident_bytes", "adopt_peak_bytes", "adopt_evictions", "memd_full",
           "evict_pinned", "pins_refused", "peak_pins", "transport_errors", "evict_batches", "direct_evictions",
           "faults", "evictions", "compact_moves", "compact_declined", "gc_cycles", "over_budget_fills",
           "over_budget_adopted")
    assert not over, (f"over the budget of {limit} from sample {over[0]} of {len(samples)}: "
                      f"{ {k: samples[over[0]].get(k) for k in why} }; at the end { {k: last.get(k) for k in why} }")


@pytest.mark.parametrize("gc", ["-XX:+UseG1GC", "-XX:+UseParallelGC", "-XX:+UseShenandoahGC"])
def test_attached_heap_grows_and_shrinks(farmem_cmd, build, jvm_built, gc):
    """A JVM attached while its heap is small: the regions it commits afterwards are registered and
    paged (pages there go to memd), and what it uncommits leaves the pager; every word is checked."""
    with AttachedJvm(farmem_cmd, ["java", gc, *GROW_SHRINK, "-cp", str(build / "java"), *GROW_SHRINK_ARGS,
                                  "--seconds", "8", "--wait"], "25%") as a:
        first = stat_json(farmem_cmd, a.pid)
        at_attach = bytes(st != resmap.PG_UNMANAGED for st in heap_states(a.pid))
        assert first["registered_bytes"] == sum(at_attach) << 12 < 100 << 20, first
        sampler = a.sample(at_attach)
        a.go()
        line = ""
        while not line.startswith("gcchurn: shrunk"):
            line = a.jvm.stdout.readline()
            assert line, a.jvm.stderr.read()
        # Grown: the heap HotSpot committed after the attach was registered, and its pages went to memd.
        grown = max(s["registered_bytes"] for s in sampler.samples)
        assert grown > first["registered_bytes"] + (250 << 20), (first, grown)
        assert sampler.remote_new > 0
        # Shrunk (the JVM waits): the pager pages exactly what is committed now, as the kernel shows it;
        # G1 uncommits in the background, shortly after the pause, and Shenandoah's control thread
        # after an explicit GC, beside the program.
        after, before = shrunk_figures(line)
        background = gc != "-XX:+UseParallelGC"
        if background:
            assert after * 2 < before, line  # G1 (with these ratios) and Shenandoah give heap back at System.gc()
        deadline = time.monotonic() + 15
        while True:
            heap = stat_json(farmem_cmd, a.pid)
            committed = committed_bytes(a.pid, heap["regions"][0])
            # G1 and Shenandoah uncommit in steps: the two can agree halfway through (a CI run broke off
            # at 386 of 536 MB committed), so wait for the whole of it too.
            done = not background or committed * 2 < grown
            if (heap["registered_bytes"] == committed and done) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert heap["registered_bytes"] == committed, (line, heap["registered_bytes"], committed)
        if background:
            assert committed * 2 < grown
        a.go()
        _, _, samples = a.finish()
    assert all(s["peak_resident_bytes"] <= 128 << 20 for s in samples), samples[-1]
    assert samples[-1]["evictions"] > 0 and samples[-1]["remote_reads"] > 0


def test_heap_committed_between_pauses_is_paged_at_once(farmem_cmd, build, jvm_built):
    """A humongous array makes G1 expand the heap in the allocating thread, between GC pauses. The
    expansion is paged before HotSpot writes the array (libjvm's mmap is interposed on): nothing of
    the heap is ever unpaged, so the budget holds while 300 MiB are written under a 64 MiB budget."""
    with AttachedJvm(farmem_cmd, ["java", "-Xmx512m", "-Xms16m", "-cp", str(build / "java"), "GcChurn",
                                  "--live-mb", "16", "--big-mb", "300", "--seconds", "2", "--wait"], "64M") as a:
        first = stat_json(farmem_cmd, a.pid)
        a.sample()
        a.go()
        line = a.jvm.stdout.readline()
        assert line.startswith("gcchurn: big 300 MiB"), line + a.jvm.stderr.read()
        heap = stat_json(farmem_cmd, a.pid)
        committed = committed_bytes(a.pid, heap["regions"][0])
        assert heap["registered_bytes"] == committed > first["registered_bytes"] + (200 << 20), (first, heap)
        assert heap["evictions"] > 0 and heap["peak_resident_bytes"] <= 64 << 20, heap
        a.go()
        _, _, samples = a.finish()
    assert samples and all(s["peak_resident_bytes"] <= 64 << 20 for s in samples), samples[-1:]


def test_attached_jvm_exit_leaves_nothing_behind(farmem_cmd, java_cp):
    shm = shm_files()
    jvm = start_churn(java_cp, 6)
    try:
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "25%", timeout=60)
        assert r.returncode == 0, r.stderr
        assert Path(f"/tmp/farmem-attach-{jvm.pid}").is_dir()
        out, err = jvm.communicate(timeout=120)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0, out + err
    state = f"/tmp/farmem-attach-{jvm.pid}"
    deadline = time.monotonic() + 10  # the keeper notices the exit within a second
    while (memds_using(state + "/") or Path(state).exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not memds_using(state + "/")
    assert not Path(state).exists()
    assert shm_files() <= shm


def test_attach_to_a_jvm_of_another_user(farmem_cmd, java_cp, build):
    """A service's JVM runs as its own user, and root attaches to it: the state directory, memd's
    socket and its secret are handed to the JVM's user, so the agent inside reads the secret and
    reaches memd as that user; it pages with a user-mode-only userfaultfd, every word checked, and
    the keeper (root's) removes it all when the JVM exits."""
    if os.geteuid() != 0:
        pytest.skip("attaching to another user's JVM needs root")
    if any(not p.stat().st_mode & 0o005 for p in [build, *build.parents]):
        pytest.skip(f"{build} is not readable by other users")
    jvm = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *java_cp[:1],
                            "-Xms512m", *java_cp[1:], "GcChurn", "--live-mb", "200", "--seconds", "8"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    try:
        line = jvm.stdout.readline()
        assert line.startswith("gcchurn: ready"), line + jvm.stderr.read()
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "25%", timeout=60)
        assert r.returncode == 0, r.stderr
        state = Path(f"/tmp/farmem-attach-{jvm.pid}")
        assert state.stat().st_uid == 65534
        first = stat_json(farmem_cmd, jvm.pid)
        assert first["registered_bytes"] > 0 and first["local_limit_bytes"] == 128 << 20, first
        out, err = jvm.communicate(timeout=120)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0 and "gcchurn: ok" in out, out + err
    deadline = time.monotonic() + 10  # the keeper notices the exit within a second
    while state.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not state.exists() and not memds_using(f"{state}/")


def test_attach_refuses_a_process_that_is_not_a_jvm(farmem_cmd, jvm_built):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        r = farmem(farmem_cmd, "attach", str(sleeper.pid), timeout=30)
        assert r.returncode == 1 and "not a HotSpot JVM" in r.stderr
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


def test_attach_refuses_a_jvm_that_turned_attach_off(farmem_cmd, java_cp):
    """A JVM started with -XX:+DisableAttachMechanism (here through JAVA_TOOL_OPTIONS) never answers
    jcmd: farmem says so at once, instead of jcmd's timeout and its last stack frame, and the JVM
    runs on untouched."""
    env = dict(os.environ, JAVA_TOOL_OPTIONS="-XX:+DisableAttachMechanism")
    jvm = subprocess.Popen(java_cp[:1] + ["-Xms512m"] + java_cp[1:] + ["GcChurn", "--live-mb", "100", "--seconds", "4"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert jvm.stdout.readline().startswith("gcchurn: ready")
        t0 = time.monotonic()
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "50%", timeout=60)
        assert r.returncode == 1 and "-XX:+DisableAttachMechanism" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 15  # jcmd alone waits 20 s, twice, for an answer that never comes
        out, err = jvm.communicate(timeout=60)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0 and "gcchurn: ok" in out, out[-2000:] + err[-2000:]


def test_jcmd_failure_names_the_exception():
    """A jcmd that could not reach its JVM prints an exception and a stack trace; the error farmem
    gives is the exception's line, not the trace's last frame (`at ...JCmd.main`), which was all a
    failed detach in CI said."""
    from farmem.commands.attach import jcmd_failure
    out = ("29792:\ncom.sun.tools.attach.AttachNotSupportedException: Unable to open socket file "
           "/proc/29792/root/tmp/.java_pid29792: target process 29792 doesn't respond within 10500ms or "
           "HotSpot VM not loaded\n\tat jdk.attach/sun.tools.attach.VirtualMachineImpl.<init>"
           "(VirtualMachineImpl.java:100)\n\tat jdk.jcmd/sun.tools.jcmd.JCmd.main(JCmd.java:97)\n")
    assert jcmd_failure(out).startswith("com.sun.tools.attach.AttachNotSupportedException: Unable to open")
    assert jcmd_failure("29792:\nCommand executed successfully\nreturn code: -1") == \
        "Command executed successfully; return code: -1"


def test_attach_bad_budget_leaves_the_jvm_untouched(farmem_cmd, java_cp):
    jvm = start_churn(java_cp, 4)
    try:
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "2g", timeout=60)
        assert r.returncode == 1 and "larger than the Java heap" in r.stderr, r.stderr
        assert not Path(f"/tmp/farmem-attach-{jvm.pid}").exists()
        assert not memds_using(f"/tmp/farmem-attach-{jvm.pid}/")
        out, err = jvm.communicate(timeout=60)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0 and "gcchurn: ok" in out
