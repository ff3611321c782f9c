# SPDX-License-Identifier: Apache-2.0
"""The farmem JDK (issue 7, hotspot/, docs/patched-jdk.md): MemLiner marking under the pager.

Every test here needs the patched JDK. The session fixture builds it with hotspot/build.sh (what
`make jdk` runs): a cache hit takes milliseconds, a clean build about 15 minutes on two CPUs.
Select with `-m patched_jdk`, leave out with `-m "not patched_jdk"`.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import in_cgroup, start_unix_memd

pytestmark = [pytest.mark.patched_jdk, pytest.mark.jvm, pytest.mark.memd, pytest.mark.pager]

REPO = Path(__file__).resolve().parent.parent
STOCK_JAVA = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"
CYCLE_END = re.compile(r"MemLiner: cycle end.*?: postponed (\d+) \((\d+) objects, (\d+) references\).*?"
                       r"swap epoch (\d+)->(\d+); GC-thread faults (\d+)")
WAITS = re.compile(r"MemLiner: cycle end.*; waited (\d+) times, ([\d.]+) ms \(longest task ([\d.]+) ms\), "
                   r"came in while waiting (\d+), forced without waiting (\d+)")


@pytest.fixture(scope="session")
def farmem_jdk() -> Path:
    """The farmem JDK home, built if needed (progress goes to the test log)."""
    # a cache hit without the build lock, which another checkout's build may hold for half an hour
    r = subprocess.run(["bash", str(REPO / "hotspot" / "build.sh"), "--home"], capture_output=True, text=True)
    if r.returncode == 0 and (Path(r.stdout.strip()) / "bin" / "java").exists():
        return Path(r.stdout.strip())
    r = subprocess.run(["bash", str(REPO / "hotspot" / "build.sh")], capture_output=True, text=True,
                       timeout=3600, env=dict(os.environ, JOBS=os.environ.get("JOBS", str(os.cpu_count()))))
    if r.returncode != 0:
        pytest.fail(f"hotspot/build.sh failed:\n{r.stderr[-4000:]}")
    home = Path(r.stdout.strip().splitlines()[-1])
    assert (home / "bin" / "java").exists(), r.stdout
    return home


def run(cmd, timeout=600, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


def test_version_and_flags(farmem_jdk):
    r = run([farmem_jdk / "bin" / "java", "-XX:+UseFarmemMemLiner", "-XX:+PrintFlagsFinal", "-version"])
    assert r.returncode == 0, r.stderr
    assert "farmem" in r.stderr  # 17.0.19+10-farmem
    for flag in ("UseFarmemMemLiner", "FarmemResidencyMap", "FarmemMaxPostpone", "FarmemEpochDelta",
                 "FarmemPostponeBufferSize", "FarmemMarkWaitMillis", "FarmemMarkWaitMicros"):
        assert re.search(rf"\b{flag}\b", r.stdout), flag


@pytest.mark.parametrize("gc", ["-XX:+UseParallelGC", "-XX:+UseSerialGC"])
def test_memliner_flag_needs_g1(farmem_jdk, gc):
    r = run([farmem_jdk / "bin" / "java", gc, "-XX:+UseFarmemMemLiner", "-version"])
    assert r.returncode != 0
    assert "-XX:+UseFarmemMemLiner works with the G1 collector only" in r.stdout + r.stderr
    assert "hs_err" not in r.stdout + r.stderr


def test_bad_knob_values_rejected(farmem_jdk):
    r = run([farmem_jdk / "bin" / "java", "-XX:FarmemMaxPostpone=1000", "-version"])
    assert r.returncode != 0 and "FarmemMaxPostpone" in r.stdout + r.stderr
    r = run([farmem_jdk / "bin" / "java", "-XX:FarmemMarkWaitMicros=5", "-version"])
    assert r.returncode != 0 and "FarmemMarkWaitMicros" in r.stdout + r.stderr
    r = run([farmem_jdk / "bin" / "java", "-XX:FarmemMarkWaitMillis=-1", "-version"])
    assert r.returncode != 0 and "FarmemMarkWaitMillis" in r.stdout + r.stderr


def test_memliner_without_pager_is_stock(farmem_jdk, build, jvm_built):
    """No residency map (not under farmem): marking is stock, and the log says so."""
    r = run([farmem_jdk / "bin" / "java", "-Xmx256m", "-XX:+UseFarmemMemLiner", "-Xlog:gc+farmem",
             "-XX:InitiatingHeapOccupancyPercent=20", "-cp", build / "java", "GcChurn", "--live-mb", "100",
             "--seconds", "3"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "gcchurn: ok" in r.stdout
    assert "no residency map" in r.stdout


def test_gcchurn_memliner_at_25pct_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """The acceptance run: GcChurn checks every word of its live set, G1 verifies the heap before
    and after every pause, the pager keeps 25% local, and the log shows postponements."""
    summary = tmp_path / "s.json"
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--local", "25%", "--summary-json", summary, "--",
                          "java", "-Xmx256m", "-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC",
                          "-XX:InitiatingHeapOccupancyPercent=20", "-Xlog:gc+farmem", "-Xlog:gc",
                          "-cp", build / "java", "GcChurn", "--live-mb", "100", "--seconds", "8"], timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout
    assert "hs_err" not in out  # a failed G1 verification is fatal: rc != 0 and an hs_err file
    cycles = [tuple(map(int, m.groups())) for m in CYCLE_END.finditer(r.stdout)]
    assert cycles, "no MemLiner cycle-end lines:\n" + r.stdout[-4000:]
    assert sum(c[0] for c in cycles) > 0, "no postponements:\n" + "\n".join(
        l for l in r.stdout.splitlines() if "MemLiner" in l)
    assert "residency map attached" in r.stdout


def test_marking_waits_for_the_application_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """Waiting mode: marking tasks with only remote work left sleep between steps (two of them, so
    the termination protocol sees a task waiting), the self-checking program exits 0 with G1
    verifying the heap around every pause, and the log shows the waits and what came in. The heap
    has room (384 MiB for 100 MiB live): below 15% free, MemLiner's red zone, nothing waits. The
    budget is 64 MiB, not 25% (96 MiB): with nearly all of the live set resident, a cycle can find
    nothing remote to wait for (a CI run saw 4 such cycles)."""
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--local", "64M", "--",
                          "java", "-Xmx384m", "-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC",
                          "-XX:ConcGCThreads=2", "-XX:-UseDynamicNumberOfGCThreads", "-XX:FarmemMarkWaitMillis=300", "-XX:FarmemMarkWaitMicros=500",
                          "-XX:InitiatingHeapOccupancyPercent=20", "-Xlog:gc+farmem", "-Xlog:gc",
                          "-cp", build / "java", "GcChurn", "--live-mb", "100", "--seconds", "8"], timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    assert "wait budget 300 ms per task, sleeps of 500 us" in r.stdout
    waits = [(int(m[1]), float(m[2]), float(m[3]), int(m[4]), int(m[5])) for m in WAITS.finditer(r.stdout)]
    assert waits, "no cycle-end lines with waits:\n" + r.stdout[-4000:]
    assert sum(w[0] for w in waits) > 0, "marking never waited:\n" + "\n".join(
        l for l in r.stdout.splitlines() if "MemLiner" in l)
    for n, ms, longest, _, _ in waits:
        assert longest <= 300 + 100 and ms <= 2 * (300 + 100)  # the budget bounds each task's sleeps
        assert n == 0 or ms > 0


def test_marking_wait_is_off_by_default(farmem_jdk, farmem_cmd, build, jvm_built):
    """Waiting is opt-in (-XX:FarmemMarkWaitMillis=N): measured, it did not beat postponing alone."""
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--local", "25%", "--",
                          "java", "-Xmx256m", "-XX:InitiatingHeapOccupancyPercent=20",
                          "-Xlog:gc+farmem", "-cp", build / "java", "GcChurn", "--live-mb", "100", "--seconds", "4"],
            timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    waits = [int(m[1]) for m in WAITS.finditer(r.stdout)]
    assert waits and not any(waits)
    assert "wait budget 0 ms per task" in r.stdout


def test_cli_refuses_memliner_with_parallel(farmem_jdk, farmem_cmd, build, jvm_built):
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--", "java", "-Xmx256m", "-XX:+UseParallelGC",
                          "-cp", build / "java", "GcChurn", "--seconds", "1"])
    assert r.returncode == 1
    assert "--gc memliner changes G1's marking: drop -XX:+UseParallelGC" in r.stderr


def test_cli_refuses_memliner_on_stock_jdk(farmem_cmd, build, jvm_built):
    """No patched JDK needed: an explicit stock java is refused, naming the way out."""
    if not os.path.exists(STOCK_JAVA):
        pytest.skip(f"{STOCK_JAVA} is not installed")
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--", STOCK_JAVA, "-Xmx256m",
                          "-cp", build / "java", "GcChurn", "--seconds", "1"])
    assert r.returncode == 1
    assert "is a stock JDK" in r.stderr and "make jdk" in r.stderr


def test_cli_names_make_jdk_when_not_built(farmem_cmd, build, jvm_built, tmp_path):
    env = dict(os.environ, CACHE_DIR=str(tmp_path / "empty-cache"))
    env.pop("FARMEM_JDK", None)
    r = run(farmem_cmd + ["run", "--gc", "memliner", "--", "java", "-Xmx256m",
                          "-cp", build / "java", "GcChurn", "--seconds", "1"], env=env)
    assert r.returncode == 1
    assert "make jdk" in r.stderr and "not built" in r.stderr


# --- SwapVA compaction (-XX:+UseFarmemSwapVA, --gc swapva) ----------------------------------------

SWAPVA_LINE = re.compile(r"SwapVA: (\d+) objects moved by pages \((\d+) pages, (\d+) calls, (\d+) in chunks, "
                         r"([\d.]+) ms\); (\d+) fillers \((\d+) bytes of padding\); copied instead: (\d+) "
                         r"overlapping, (\d+) unaligned, (\d+) refused")
LARGE = ["-Xmx512m", "-XX:G1HeapRegionSize=8m", "-Xlog:gc+farmem", "-Xlog:gc"]
VERIFY = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC"]


def test_swapva_flags(farmem_jdk):
    r = run([farmem_jdk / "bin" / "java", "-XX:+UseFarmemSwapVA", "-XX:+PrintFlagsFinal", "-version"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"\bUseFarmemSwapVA\s+= true", r.stdout)
    assert re.search(r"\bFarmemSwapVAMinBytes\s+= 0\b", r.stdout)


@pytest.mark.parametrize("gc", ["-XX:+UseParallelGC", "-XX:+UseSerialGC"])
def test_swapva_flag_needs_g1(farmem_jdk, gc):
    r = run([farmem_jdk / "bin" / "java", gc, "-XX:+UseFarmemSwapVA", "-version"])
    assert r.returncode == 1
    assert "-XX:+UseFarmemSwapVA works with the G1 collector only" in r.stdout + r.stderr


def test_swapva_without_farmem_is_a_warned_noop(farmem_jdk, build, jvm_built):
    """Without farmem's agent there is no page-move function: the JVM says so once and copies."""
    r = run([farmem_jdk / "bin" / "java", *LARGE, "-XX:+UseFarmemSwapVA", "-cp", build / "java",
             "LargeArrays", "--arrays", "60", "--rounds", "2"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "largearrays: ok" in r.stdout
    assert "farmem_swapva_move not found" in r.stdout
    assert not SWAPVA_LINE.search(r.stdout)


LIBSWAPVA_LINE = re.compile(r"farmem: SwapVA via libswapva \(([^)]*)\): (\d+) calls; pages moved by kmod (\d+), "
                            r"uffd (\d+), memmove (\d+)")


def test_swapva_agent_without_pager_moves_by_libswapva(farmem_jdk, build, jvm_built):
    """The agent without memd (onerror=continue: no pager) still provides farmem_swapva_move, through
    libswapva: what the qemu lane's swapvagc group runs with the module. Here SWAPVA_BACKEND=uffd
    (UFFDIO_MOVE); the agent's exit line says every page the JVM moved went through it."""
    r = run([farmem_jdk / "bin" / "java", f"-agentpath:{build / 'lib' / 'libfarmem_agent.so'}=onerror=continue",
             *LARGE, *VERIFY, "-XX:+UseFarmemSwapVA", "-cp", build / "java", "LargeArrays", "--arrays", "60",
             "--rounds", "3"], env=dict(os.environ, SWAPVA_BACKEND="uffd"))
    if "SwapVA: libswapva cannot open" in r.stderr:
        pytest.skip("no UFFDIO_MOVE on this kernel")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "largearrays: ok" in r.stdout
    assert "the JVM runs without farmem (onerror=continue)" in r.stderr
    assert "by pages (libswapva uffd" in r.stdout, r.stdout[-2000:]
    lines = [tuple(int(x) for x in m.groups()[:2] + m.groups()[5:]) for m in SWAPVA_LINE.finditer(r.stdout)]
    assert len(lines) == 3, r.stdout[-2000:]
    jvm_pages = sum(x[1] for x in lines)
    assert sum(x[-1] for x in lines) == 0, "the JVM copied objects the backend refused"
    m = LIBSWAPVA_LINE.search(r.stderr)
    assert m, r.stderr[-2000:]
    kmod, uffd, memmove = (int(x) for x in m.groups()[2:])
    assert jvm_pages > 0 and uffd == jvm_pages and kmod == 0 and memmove == 0, (jvm_pages, m.group(0))


def swapva_run(farmem_cmd, build, summary, mode, extra, rounds, local="25%"):
    return run(farmem_cmd + ["run", "--gc", mode, "--local", local, "--summary-json", summary, "--",
                             "java", *LARGE, *extra, "-cp", build / "java", "LargeArrays", "--rounds", str(rounds)],
               timeout=900)


def test_largearrays_swapva_at_25pct_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """Many large arrays, a fraction replaced, a full GC, every element checked; HotSpot verifies
    the heap (fillers included) around every GC; pages moved, not copied."""
    import json
    summary = tmp_path / "s.json"
    r = swapva_run(farmem_cmd, build, summary, "swapva", VERIFY, 4)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "largearrays: ok rounds=4" in r.stdout
    assert "SwapVA: full GCs move objects of" in r.stdout and "farmem pager" in r.stdout
    lines = [tuple(float(x) for x in m.groups()) for m in SWAPVA_LINE.finditer(r.stdout)]
    assert len(lines) >= 4, r.stdout[-3000:]
    assert sum(1 for l in lines if l[0] > 0 and l[1] > 0) >= 3, lines
    assert sum(l[5] for l in lines) > 0  # padding became fillers (and VerifyAfterGC parsed them)
    s = json.loads(summary.read_text())
    assert s["swapva_calls"] > 0, s
    moved = s["swapva_pages_moved"] + s["swapva_pages_remote"] + s["swapva_pages_fetched"] + s["swapva_pages_untouched"]
    assert moved == sum(l[1] for l in lines), (s, lines)
    # at 25% local most pages the GC moves are remote: they move inside memd, not through the heap
    assert s["swapva_pages_moved"] > 0 and s["swapva_pages_remote"] > 0, s
    assert s["swapva_pages_copied"] == 0, s
    assert s["evictions"] > 0 and s["remote_reads"] > 0, s
    assert re.search(r"farmem: \d+ page moves \(SwapVA compaction, mremap\): [1-9]\d* pages moved \(UFFDIO_MOVE\)", r.stderr), r.stderr[-2000:]


def test_largearrays_memliner_and_swapva(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    r = swapva_run(farmem_cmd, build, tmp_path / "s.json", "memliner+swapva", ["-XX:+PrintCommandLineFlags"], 2)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "largearrays: ok rounds=2" in r.stdout
    assert any(int(m.group(1)) > 0 for m in SWAPVA_LINE.finditer(r.stdout)), r.stdout[-3000:]
    # marking only runs in concurrent cycles, which System.gc() alone may not start: the flags are on
    assert "-XX:+UseFarmemMemLiner" in r.stdout and "-XX:+UseFarmemSwapVA" in r.stdout


def test_cli_refuses_swapva_with_parallel(farmem_jdk, farmem_cmd, build, jvm_built):
    r = run(farmem_cmd + ["run", "--gc", "swapva", "--", "java", "-Xmx256m", "-XX:+UseParallelGC",
                          "-cp", build / "java", "LargeArrays", "--rounds", "1"])
    assert r.returncode == 1
    assert "--gc swapva changes G1's full-GC compaction: drop -XX:+UseParallelGC" in r.stderr


def test_cli_refuses_swapva_on_stock_jdk(farmem_cmd, build, jvm_built):
    if not os.path.exists(STOCK_JAVA):
        pytest.skip(f"{STOCK_JAVA} is not installed")
    r = run(farmem_cmd + ["run", "--gc", "swapva", "--", STOCK_JAVA, "-Xmx256m",
                          "-cp", build / "java", "LargeArrays", "--rounds", "1"])
    assert r.returncode == 1
    assert "is a stock JDK" in r.stderr and "-XX:+UseFarmemSwapVA" in r.stderr


def test_largearrays_swapva_tight_heap_serial_compaction(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """A full heap: G1's full GC frees no region in parallel and re-forwards each worker's last
    region serially (phase 2c), which voids the gaps SwapVA recorded there. LargeArrays --squeeze
    fills the heap with large fillers until an OutOfMemoryError every round (the full GCs before it
    go serial), lets them go, and checks every array again; G1 verifies the heap around every GC."""
    r = run(farmem_cmd + ["run", "--gc", "swapva", "--local", "25%", "--", "java", "-Xmx216m",
                          "-XX:G1HeapRegionSize=8m", *VERIFY, "-Xlog:gc+phases=debug", "-Xlog:gc+farmem",
                          "-cp", build / "java", "LargeArrays", "--arrays", "100", "--rounds", "2",
                          "--free-pct", "20", "--seed", "3", "--squeeze"], timeout=900)
    out = r.stdout + r.stderr
    assert "largearrays: FAILED" not in out and "fatal error" not in out and "hs_err" not in out, out[-3000:]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "largearrays: ok rounds=2" in r.stdout
    assert r.stdout.count("until the heap was full") == 2
    assert "Prepare Serial Compaction" in r.stdout, "no full GC went serial:\n" + r.stdout[-3000:]
    assert any(int(m.group(1)) > 0 for m in SWAPVA_LINE.finditer(r.stdout))


# --- In place (-XX:+UseFarmemInPlace, FarmemHeadersInPlace, --gc farmem) -----------------

COMPACT_LINE = re.compile(r"remote compaction: (\d+) objects moved where their pages lie \((\d+) KiB, (\d+) calls, "
                          r"[\d.]+ ms; (\d+) headers read there\), (\d+) copied here after the pager declined, "
                          r"(\d+) copied here all resident")
PROMOTE_LINE = re.compile(r"promotion in place since the last full GC: (\d+) primitive arrays \((\d+) KiB\) copied "
                          r"into memd in (\d+) pauses, (\d+) copied here after the pager declined")
IN_PLACE_LINE = re.compile(r"in place: phase 1 marked (\d+) primitive arrays, phase 2 sized (\d+) and forwarded "
                           r"(\d+) objects, phase 3 skipped (\d+) and read (\d+) forwarding pointers, where their "
                           r"pages lie; concurrent marking since: (\d+) primitive arrays; block sizes read there since: (\d+)")
KEPT_LINE = re.compile(r"headers kept from phases 1 and 2: (\d+) objects, (\d+) reads of memd saved by them, "
                       r"(\d+) not kept")
LEFT_LINE = re.compile(r"left in place: (\d+) regions mostly in memd with at most (\d+)% garbage \((\d+) KiB live\); "
                       r"left out of mixed collections since the last full GC: (\d+) regions")


def tight_churn(seconds):
    """A heap too small for its live set's churn: G1 falls back to full GCs every second or two."""
    return ["-Xmx256m", "-cp", "build/java", "GcChurn", "--live-mb", "150", "--seconds", str(seconds)]


def test_in_place_flags(farmem_jdk):
    r = run([farmem_jdk / "bin" / "java", "-XX:+UseFarmemInPlace", "-XX:+PrintFlagsFinal", "-version"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"\bUseFarmemInPlace\s+= true", r.stdout)
    assert re.search(r"\bFarmemCompactBatch\s+= 64\b", r.stdout)
    assert re.search(r"\bFarmemHeadersInPlace\s+= true", r.stdout)
    r = run([farmem_jdk / "bin" / "java", "-XX:+UseParallelGC", "-XX:+UseFarmemInPlace", "-version"])
    assert r.returncode == 1
    assert "-XX:+UseFarmemInPlace works with the G1 collector only" in r.stdout + r.stderr
    r = run([farmem_jdk / "bin" / "java", "-XX:+PrintFlagsFinal", "-version"])
    assert re.search(r"\bFarmemPromoteInPlace\s+= true", r.stdout)
    assert re.search(r"\bFarmemRemoteDeadRatio\s+= 40\b", r.stdout)
    r = run([farmem_jdk / "bin" / "java", "-XX:FarmemCompactBatch=0", "-version"])
    assert r.returncode != 0 and "FarmemCompactBatch" in r.stdout + r.stderr
    r = run([farmem_jdk / "bin" / "java", "-XX:FarmemRemoteDeadRatio=101", "-version"])
    assert r.returncode != 0 and "FarmemRemoteDeadRatio" in r.stdout + r.stderr


def test_in_place_without_farmem_is_stock(farmem_jdk, build, jvm_built):
    """No agent, so no pager to work in: the JVM says so once and collects as usual."""
    r = run([farmem_jdk / "bin" / "java", "-XX:+UseFarmemInPlace", "-XX:+UseFarmemMemLiner",
             "-Xlog:gc+farmem", *tight_churn(4)],
            cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "gcchurn: ok" in r.stdout
    assert "farmem's collector calls not found" in r.stdout
    assert not COMPACT_LINE.search(r.stdout)


def test_gcchurn_gc_farmem_at_25pct_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """The acceptance run of --gc farmem: a heap that churns its live set through full GCs, at 25%
    local, G1 verifying the heap before and after every pause (a wrong header written in memd, a
    move done out of order, or a forwarding pointer read wrong is a failed verification or a
    corrupt word), GcChurn checking every word of its live set and allocating right after each
    pause. The log and the summary show each phase's work done where the pages lie."""
    import json
    summary = tmp_path / "s.json"
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--local", "25%", "--summary-json", summary, "--", "java",
                          *VERIFY, "-Xlog:gc+farmem", "-Xlog:gc", *tight_churn(10)], timeout=900, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    compact = [tuple(int(x) for x in m.groups()) for m in COMPACT_LINE.finditer(r.stdout)]
    in_place = [tuple(int(x) for x in m.groups()) for m in IN_PLACE_LINE.finditer(r.stdout)]
    assert compact and len(compact) == len(in_place), r.stdout[-4000:]
    moved, kib, calls, headers, declined, local = (sum(c[i] for c in compact) for i in range(6))
    assert moved > 1000 and kib > 10 * 1024 and calls > 0, compact
    marked, sized, forwarded, skipped, forwardees = (sum(c[i] for c in in_place) for i in range(5))
    assert marked > 0 and sized > 0 and forwarded > 0 and skipped > 0 and forwardees > 0, in_place
    # what phases 1 and 2 read and wrote there was kept for the phases after, the heap verified
    kept = [tuple(int(x) for x in m.groups()) for m in KEPT_LINE.finditer(r.stdout)]
    assert len(kept) == len(compact) and sum(k[0] for k in kept) > 0 and sum(k[1] for k in kept) > 0, kept
    promoted = [tuple(int(x) for x in m.groups()) for m in PROMOTE_LINE.finditer(r.stdout)]
    assert promoted and sum(p[0] for p in promoted) > 0 and sum(p[2] for p in promoted) > 0, promoted
    # regions mostly in memd and mostly live stayed where they lie, the heap verified around them
    left = [tuple(int(x) for x in m.groups()) for m in LEFT_LINE.finditer(r.stdout)]
    assert len(left) == len(compact) and sum(x[0] for x in left) > 0 and all(x[1] == 40 for x in left), left
    s = json.loads(summary.read_text())
    assert s["compact_moves"] >= moved and s["compact_bytes"] >= kib * 1024, s
    assert s["compact_pages"] > 0 and s["crc_errors"] == 0, s
    assert s["gc_conc_faults"] <= s["gc_faults"], s
    # clean destination pages were opened by the moves (not handed back), the heap verified after
    assert s["compact_opened"] > 0, s
    # and clean pages after one a pause worker's write faulted on were opened with it (fault.c)
    assert s["wp_opened_ahead"] > 0, s


def test_gc_farmem_without_promotion_in_place_leaves_promotion_to_the_agent(farmem_jdk, farmem_cmd, build, jvm_built,
                                                                           tmp_path):
    """-XX:-FarmemPromoteInPlace: the farmem JDK's young pauses promote nothing into memd, so the agent
    does, as it does for a stock JDK (its full GCs still call the pager, which once turned the agent's
    promotions off too, and then nobody promoted there). G1 verifies the heap around every pause and
    GcChurn checks every word."""
    import json
    summary = tmp_path / "s.json"
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--local", "25%", "--summary-json", summary, "--", "java",
                          *VERIFY, "-XX:-FarmemPromoteInPlace", "-Xlog:gc+farmem", *tight_churn(6)],
            timeout=900, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    compact = [tuple(int(x) for x in m.groups()) for m in COMPACT_LINE.finditer(r.stdout)]
    promoted = [tuple(int(x) for x in m.groups()) for m in PROMOTE_LINE.finditer(r.stdout)]
    assert compact, r.stdout[-4000:]
    assert sum(p[0] for p in promoted) == 0, promoted  # the JDK promoted nothing itself
    s = json.loads(summary.read_text())
    full_gc_moves = sum(c[0] for c in compact)
    # the moves past the full GCs' own are the young pauses' promotions, done by the agent
    assert s["compact_moves"] > full_gc_moves + 100 and s["crc_errors"] == 0, (s, full_gc_moves)


def test_gc_farmem_with_memd_in_another_memory_cgroup_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path,
                                                              memory_cgroups):
    """memd in a memory cgroup of its own, as a sidecar: the collector's moves open new pages of
    memd's store a run at a time, memd allocating each run (SHM_ALLOC) so that its cgroup pays, and
    evictions write into slots that kept their memory. G1 verifies the heap around every pause and
    GcChurn checks every word of its live set; the JVM's cgroup holds its budget and the JVM, not the
    store."""
    memd_cg, prog_cg = memory_cgroups
    memd, addr, _ = start_unix_memd(build, tmp_path, cgroup=memd_cg)
    try:
        r = run(in_cgroup(prog_cg, farmem_cmd + ["run", "--gc", "farmem", "--local", "25%", "--memd", addr,
                                                 "--secret-file", tmp_path / "secret", "--log", "info",
                                                 "--summary-json", tmp_path / "s.json", "--", "java", *VERIFY,
                                                 "-Xlog:gc+farmem", *tight_churn(8)]), timeout=900, cwd=REPO)
    finally:
        memd.kill()
        memd.wait()
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    assert "is in another memory cgroup: it allocates its store's pages" in r.stderr, r.stderr[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["compact_moves"] > 1000 and s["compact_pages"] > 0 and s["crc_errors"] == 0, s
    assert memd_cg.peak() > 64 << 20, f"memd's cgroup held {memd_cg.peak() >> 20} MiB"


def test_gc_farmem_marks_primitive_arrays_in_place(farmem_jdk, farmem_cmd, build, jvm_built):
    """Concurrent marking (MemLiner's map) marks primitive arrays on remote pages from their
    headers read in memd: a heap with room for its live set, so G1 marks concurrently and mixes
    instead of collecting in full (regions mostly in memd and mostly live are left out of the
    mixed collections); the one System.gc() at the end reports what marking did."""
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--local", "64M", "--", "java", "-Xmx384m", *VERIFY,
                          "-XX:InitiatingHeapOccupancyPercent=20", "-Xlog:gc+farmem", "-cp", build / "java",
                          "GcChurn", "--live-mb", "100", "--seconds", "6", "--shrink-mb", "100"], timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    conc = [int(m.group(6)) for m in IN_PLACE_LINE.finditer(r.stdout)]
    assert conc and sum(conc) > 0, r.stdout[-4000:]
    # the block offset table's walks (the remembered-set rebuild's chunks, cards) read headers in memd too
    blocks = [int(m.group(7)) for m in IN_PLACE_LINE.finditer(r.stdout)]
    assert sum(blocks) > 0, r.stdout[-4000:]
    # regions mostly in memd and mostly live were left out of the mixed collections, the heap verified
    left = [tuple(int(x) for x in m.groups()) for m in LEFT_LINE.finditer(r.stdout)]
    assert left and sum(x[3] for x in left) > 0, r.stdout[-4000:]


def test_gc_farmem_heap_that_fits_promotes_here(farmem_jdk, farmem_cmd, build, jvm_built):
    """A heap whose live set fits the budget: no pressure, so promotions stay here (a program that
    fits pays nothing); the System.gc()s of --shrink-mb report it."""
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--local", "100%", "--", "java", "-Xmx256m", "-Xlog:gc+farmem",
                          "-cp", build / "java", "GcChurn", "--live-mb", "60", "--seconds", "3", "--shrink-mb", "40"],
            timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout
    promoted = [tuple(int(x) for x in m.groups()) for m in PROMOTE_LINE.finditer(r.stdout)]
    assert promoted and all(p[0] == 0 and p[2] == 0 for p in promoted), r.stdout[-3000:]


def test_gc_farmem_over_the_wire_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """memd's store not mapped here (the stream transport, as a memd on another host would be):
    the moves and header words go to memd as EDIT requests, the heap verified around every GC and
    every word checked (--shrink-mb: System.gc() halfway, so a full GC comes however slowly the
    stream transport and the verification run). -XX:FarmemRemoteDeadRatio=0: every region slides,
    as in stock G1, none is left in place."""
    import json
    summary = tmp_path / "s.json"
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--transport", "stream", "--local", "25%", "--summary-json",
                          summary, "--", "java", *VERIFY, "-XX:FarmemRemoteDeadRatio=0", "-Xlog:gc+farmem", *tight_churn(4),
                          "--shrink-mb", "100"],
            timeout=900, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    assert "no store to work in" not in r.stdout, r.stdout[-3000:]
    compact = [tuple(int(x) for x in m.groups()) for m in COMPACT_LINE.finditer(r.stdout)]
    assert compact and sum(c[0] for c in compact) > 0, r.stdout[-3000:]
    left = [tuple(int(x) for x in m.groups()) for m in LEFT_LINE.finditer(r.stdout)]
    assert left and all(x[0] == 0 and x[1] == 0 and x[3] == 0 for x in left), left
    s = json.loads(summary.read_text())
    assert s["transport"] == "stream" and s["compact_moves"] > 0 and s["compact_pages"] > 0, s


def test_gc_farmem_several_memds_leaves_regions_verified(farmem_jdk, farmem_cmd, build, jvm_built, tmp_path):
    """Several memds (memd/client/multi.c): no store to work in, so G1 moves objects and reads
    headers as usual, and leaves no region in place either (without a store, a full GC faults the
    heap in, and the garbage of regions left in place brings the next one sooner); the heap
    verified around every GC, every word checked. --shrink-mb: System.gc() halfway, so a full GC
    comes however slowly two memds and the verification run (a slow host once did 15 s of churn
    with young pauses of 1-2 s each and no full GC)."""
    import time
    secret = tmp_path / "secret"
    secret.write_text("several-memds-test-secret\n")
    socks = [tmp_path / f"memd{i}.sock" for i in range(2)]
    memds = [subprocess.Popen([build / "bin" / "farmem-memd", "--unix", sock, "--secret-file", secret,
                               "--capacity", "512M"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for sock in socks]
    try:
        deadline = time.monotonic() + 20
        while not all(sock.exists() for sock in socks):
            assert all(m.poll() is None for m in memds) and time.monotonic() < deadline, "a memd never listened"
            time.sleep(0.02)
        r = run(farmem_cmd + ["run", "--gc", "farmem", "--memd", ",".join(f"unix:{sock}" for sock in socks),
                              "--secret-file", secret, "--local", "25%", "--", "java", *VERIFY, "-Xlog:gc+farmem",
                              "-Xlog:gc", *tight_churn(15), "--shrink-mb", "100"], timeout=900, cwd=REPO)
    finally:
        for m in memds:
            m.terminate()
            m.wait(10)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert "gcchurn: ok" in r.stdout and "hs_err" not in out
    assert "no store to work in" in r.stdout, r.stdout[-3000:]
    assert "Pause Full" in r.stdout, r.stdout[-3000:]
    left = [tuple(int(x) for x in m.groups()) for m in LEFT_LINE.finditer(r.stdout)]
    assert all(x[0] == 0 and x[3] == 0 for x in left), left
    compact = [tuple(int(x) for x in m.groups()) for m in COMPACT_LINE.finditer(r.stdout)]
    assert all(c[0] == 0 for c in compact), compact


def test_largearrays_gc_farmem_with_swapva_serial_compaction(farmem_jdk, farmem_cmd, build, jvm_built):
    """In place and SwapVA together on a full heap whose full GCs go serial (the re-prepare path),
    every array checked and G1 verifying the heap around every GC."""
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--local", "25%", "--", "java", "-Xmx216m",
                          "-XX:G1HeapRegionSize=8m", "-XX:+UseFarmemSwapVA", *VERIFY, "-Xlog:gc+phases=debug",
                          "-Xlog:gc+farmem", "-cp", build / "java", "LargeArrays", "--arrays", "100", "--rounds", "2",
                          "--free-pct", "20", "--seed", "3", "--squeeze"], timeout=900)
    out = r.stdout + r.stderr
    assert "largearrays: FAILED" not in out and "fatal error" not in out and "hs_err" not in out, out[-3000:]
    assert r.returncode == 0, out[-3000:]
    assert "largearrays: ok rounds=2" in r.stdout
    assert "Prepare Serial Compaction" in r.stdout, "no full GC went serial:\n" + r.stdout[-3000:]
    assert COMPACT_LINE.search(r.stdout) and SWAPVA_LINE.search(r.stdout), r.stdout[-3000:]


def test_cli_refuses_gc_farmem_with_parallel(farmem_jdk, farmem_cmd, build, jvm_built):
    r = run(farmem_cmd + ["run", "--gc", "farmem", "--", "java", "-Xmx256m", "-XX:+UseParallelGC",
                          "-cp", build / "java", "GcChurn", "--seconds", "1"])
    assert r.returncode == 1
    assert "--gc farmem changes G1's marking and full-GC compaction: drop -XX:+UseParallelGC" in r.stderr
