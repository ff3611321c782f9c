# SPDX-License-Identifier: Apache-2.0
"""Discarding the collector's free space (issue 9) and the G1 sizing of `farmem run`.

The agent discards G1's free regions (Parallel's and Serial's space above top) at the end of every GC pause
(jvmti-agent/gcfree.c). These tests hold it to "exactly safe": self-checking workloads under heavy
churn at 25% local, with HotSpot's own heap verification before and after every GC, and a race
hunter (tests/java/AllocRace.java) that allocates, checks zeros, writes and re-reads patterns
right after pauses. Then: the discard does what it is for (far fewer writes to memd, and no
protection of what G1 writes again at once), the knobs, and the sizing. About three minutes on two CPUs.
"""

import json
import re
import os
import subprocess

import pytest

pytestmark = [pytest.mark.memd, pytest.mark.pager]

VERIFY = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+VerifyBeforeGC", "-XX:+VerifyAfterGC"]
# Shenandoah runs its own verifier too (VERIFY unlocks it): it checks its regions' states and marks.
GCS = {"g1": ["-XX:+UseG1GC"], "parallel": ["-XX:+UseParallelGC"], "serial": ["-XX:+UseSerialGC"],
       "shenandoah": ["-XX:+UseShenandoahGC", "-XX:+ShenandoahVerify"]}




def run_java(farmem_cmd, build, tmp_path, private_tmp, jvm_opts, prog, *flags, local="25%", timeout=300):
    """farmem run ... -- java JVM_OPTS -cp build/java PROG; returns (result, summary dict)."""
    summary = tmp_path / f"s{len(list(tmp_path.iterdir()))}.json"
    cmd = [*farmem_cmd, "run", "--local", local, "--summary-json", str(summary), *flags, "--",
           "java", *jvm_opts, "-cp", str(build / "java"), *prog]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, TMPDIR=private_tmp))
    s = json.loads(summary.read_text()) if summary.exists() else {}
    return r, s


# --- safety -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("gc", sorted(GCS))
def test_churn_verified_at_25_percent(farmem_cmd, build, jvm_built, tmp_path, private_tmp, gc):
    """GcChurn (its live set checked word by word) with HotSpot verifying the heap around every
    pause, a quarter of the heap local, discard on (the default)."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, [*VERIFY, *GCS[gc], "-Xmx256m"],
                    ["GcChurn", "--live-mb", "100", "--seconds", "6"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "discard disabled" not in r.stderr
    assert s["discards"] > 0 and s["evictions"] > 0 and s["remote_reads"] > 0, s


@pytest.mark.parametrize("gc", sorted(GCS))
def test_alloc_race_verified(farmem_cmd, build, jvm_built, tmp_path, private_tmp, gc):
    """Allocation right after a pause, into space that pause discarded: new arrays must read as
    zeros and keep every word written, across young, mixed and full collections."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, [*VERIFY, *GCS[gc], "-Xmx256m"],
                    ["AllocRace", "--seconds", "8", "--threads", "3"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "allocrace: ok" in r.stdout
    gcs = int(r.stdout.split("gcs=")[1].split()[0])
    assert gcs >= 10, r.stdout
    assert s["discards"] > 0 and s["evictions"] > 0, s


def test_alloc_race_small_young_many_pauses(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """The same hunt with a tiny young generation (a pause every few MiB) and no System.gc():
    dozens of pauses, each one followed at once by allocation into discarded regions."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp,
                    ["-Xmx192m", "-XX:MaxNewSize=8m", *VERIFY],
                    ["AllocRace", "--seconds", "8", "--threads", "3", "--no-full-gc"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "allocrace: ok" in r.stdout
    assert int(r.stdout.split("gcs=")[1].split()[0]) >= 40, r.stdout
    assert s["discards"] > 0, s


def test_a_heap_that_fits_is_left_alone(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """The whole heap local (--local 100%): nothing can ever have to leave, so no pause walks its free
    space (nothing is in memd to kill) and no full GC moves an object through memd (what goes there is
    read back); GcChurn checks its live set and HotSpot the heap around every pause all the same."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, [*VERIFY, "-Xmx256m", "-Xms256m", "-Xlog:gc"],
                    ["GcChurn", "--live-mb", "150", "--steps", "60000"], local="100%")
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Pause Young" in r.stdout and "Pause Full" in r.stdout, r.stdout[-2000:]
    assert s["discards"] == 0 and s["garbage_marked"] == 0 and s["compact_moves"] == 0, s
    assert s["evictions"] == 0 and s["remote_writes"] == 0 and s["zero_fills"] > 0, s


# --- what it is for -----------------------------------------------------------------------------------

def test_discard_cuts_memd_traffic(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """AllocRace (mostly short-lived garbage) with and without discard, per MiB it allocated:
    garbage is no longer read back from memd when its region is reused, and less is written.
    Without gc_moves: its promotions of arrays into memd are reads and writes of another kind
    (AllocRace checks each promoted array once more, from memd then: bench/RESULTS.md, session 70)."""
    prog = ["AllocRace", "--seconds", "6", "--no-full-gc"]
    runs = {}
    for flag in ("--discard", "--no-discard"):
        r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-Xmx256m"], prog, flag, "--no-gc-moves")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "allocrace: ok" in r.stdout
        mb = int(r.stdout.split("allocated_mb=")[1].split()[0])
        runs[flag] = (s, s["remote_reads"] / mb, s["remote_writes"] / mb)
    (on, on_r, on_w), (off, off_r, off_w) = runs["--discard"], runs["--no-discard"]
    assert on["discards"] > 0 and off["discards"] == 0, (on, off)
    assert on_r * 2 < off_r, (on_r, off_r)
    assert on_w < off_w, (on_w, off_w)


def test_next_eden_left_writable(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """G1 allocates its next eden from the top of its free space, and its next pause's old regions
    from the bottom: a pause's discard leaves those pages writable (fm_pager_discard_reused) unless
    evicted pages come back soon. Write-protected, most of the garbage it made was written again
    at once, a write-protect fault a run (GcChurn, whose old arrays are rarely read again, at 25%:
    66% of 701k pages before, 22% of 163k after, by hand in session 72)."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-Xmx256m", "-XX:+UseG1GC"],
                    ["GcChurn", "--live-mb", "150", "--steps", "100000"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert s["garbage_marked"] > 0 and s["evictions"] > 0, s
    assert s["garbage_reused"] < s["garbage_marked"] / 2, s


# --- knobs ----------------------------------------------------------------------------------------------

def test_bad_discard_value_refused(build, jvm_built):
    lib = build / "lib" / "libfarmem_agent.so"
    r = subprocess.run(["java", f"-agentpath:{lib}=discard=2,memd=unix:/nonexistent", "-version"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "discard=2: expected 1 or 0" in r.stderr


def test_epsilon_paged_without_discard(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """Epsilon, which never collects: the heap is paged (it outgrows the budget four times over),
    the program checks every word, no warning that it is untested, and a log line says why
    nothing is discarded."""
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp,
                    ["-XX:+UnlockExperimentalVMOptions", "-XX:+UseEpsilonGC", "-Xmx512m"],
                    ["GcChurn", "--live-mb", "200", "--steps", "3000"], local="25%")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gcchurn: ok" in r.stdout
    assert "discard disabled: Epsilon never frees anything" in r.stderr
    assert "untested" not in r.stderr
    assert s["discards"] == 0 and s["evictions"] > 0 and s["remote_reads"] > 0, s


# --- heap sizing ------------------------------------------------------------------------------------

def sizing_line(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if " sizing: " in line)


def test_sizing_chosen_and_said(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    r, _ = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-Xmx512m", "-XX:+PrintFlagsFinal"],
                    ["-version"], local="25%")
    assert r.returncode == 0, r.stderr
    assert "farmem: G1 sizing: MaxNewSize=32m (a quarter of the local budget of 128 MiB" in sizing_line(r.stderr)
    flags = final_flags(r.stdout)
    assert flags["MaxNewSize"] == str(32 << 20), flags


def test_serial_sizing_chosen_and_said(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """Serial (HotSpot's choice on one CPU): its young generation, a third of the heap by NewRatio and
    more than the budget, held to a quarter of the budget as G1's is; the run is a self-checking churn, paged."""
    r, _ = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-XX:+UseSerialGC", "-Xmx512m", "-XX:+PrintFlagsFinal"],
                    ["-version"], local="25%")
    assert r.returncode == 0, r.stderr
    assert "farmem: Serial sizing: MaxNewSize=32m (a quarter of the local budget of 128 MiB" in sizing_line(r.stderr)
    assert "NewRatio alone would make it 170 MiB of the 512 MiB heap, more than the budget" in sizing_line(r.stderr)
    flags = final_flags(r.stdout)
    assert flags["MaxNewSize"] == str(32 << 20) and flags["NewSize"] == str(32 << 20), flags
    r, s = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-XX:+UseSerialGC", "-Xmx512m"],
                    ["GcChurn", "--live-mb", "200", "--steps", "20000"], local="25%")
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout + r.stderr
    assert "Serial sizing: MaxNewSize=32m" in r.stderr and s["discards"] > 0 and s["evictions"] > 0, s


@pytest.mark.parametrize("opts,flags", [
    (["-Xmx512m", "-Xmn100m"], []),                        # the user sized it
    (["-Xmx512m", "-XX:MaxNewSize=200m"], []),
    (["-Xmx512m", "-XX:+UseParallelGC"], []),               # neither G1 nor Serial
    (["-Xmx512m", "-XX:+UseSerialGC", "-XX:NewRatio=8"], []),  # Serial's young generation sized by the user
    (["-Xmx512m", "-XX:+UseSerialGC"], ["--local", "50%"]),  # NewRatio's third (170 MiB) fits the budget (256)
    (["-Xmx512m"], ["--no-heap-sizing"]),                   # turned off
])
def test_sizing_left_alone(farmem_cmd, build, jvm_built, tmp_path, private_tmp, opts, flags):
    r, _ = run_java(farmem_cmd, build, tmp_path, private_tmp, opts, ["-version"], *flags)
    assert r.returncode == 0, r.stderr
    assert sizing_line(r.stderr) == ""


def test_sizing_not_needed_at_full_budget(farmem_cmd, build, jvm_built, tmp_path, private_tmp):
    """With the whole heap local there is nothing to fit."""
    r, _ = run_java(farmem_cmd, build, tmp_path, private_tmp, ["-Xmx512m"], ["-version"], local="100%")
    assert r.returncode == 0, r.stderr
    assert sizing_line(r.stderr) == ""


def script_jvm(farmem_cmd, private_tmp, script: str, *flags, local="25%", env=None):
    """farmem run ... -- sh -c SCRIPT: the JVMs the shell starts get the agent in JAVA_TOOL_OPTIONS."""
    return subprocess.run([*farmem_cmd, "run", "--local", local, *flags, "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TMPDIR=private_tmp, **(env or {})))


def final_flags(stdout: str) -> dict:
    return {line.split()[1]: line.split()[3] for line in stdout.splitlines() if line.count("=") == 1
            and len(line.split()) >= 4}


def test_sizing_for_the_jvms_a_script_starts(farmem_cmd, build, jvm_built, private_tmp):
    """A JVM started by a script (its -Xmx unknown to farmem run) gets a quarter of its heap's local
    budget as G1's young generation bound from the agent, which sets MaxNewSize before the heap exists:
    with a quarter local, eden never plans past 16 of the heap's 256 regions (1 MiB each), and an
    absolute --local is a share of each heap alike. The JVM's own sizing (-Xmn, a young flag in
    JAVA_TOOL_OPTIONS) wins; the whole heap local or --no-heap-sizing sets nothing; a heap smaller than an absolute budget runs without farmem
    instead of failing inside the script."""
    cp = build / "java"
    sized = "farmem: G1 sizing: MaxNewSize="
    flags = "java -Xmx256m -XX:+UnlockExperimentalVMOptions -XX:+PrintFlagsFinal -version"
    r = script_jvm(farmem_cmd, private_tmp,
                   f"java -Xmx256m -Xlog:gc+heap=info -cp {cp} GcChurn --live-mb 60 --steps 20000")
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert sized + "16m (a quarter of the local budget of 64 MiB" in r.stderr, r.stderr[-2000:]
    planned = [int(m) for m in re.findall(r"Eden regions: \d+->\d+\((\d+)\)", r.stdout)]
    assert planned and max(planned) <= 16, planned

    for local in ("25%", "64M"):
        r = script_jvm(farmem_cmd, private_tmp, flags, local=local)
        f = final_flags(r.stdout)
        assert r.returncode == 0 and f["MaxNewSize"] == str(16 << 20), f
        assert f["G1MaxNewSizePercent"] == "60" and f["G1NewSizePercent"] == "5", f
    # 16% of 256 MiB is 40 MiB: 10 MiB young, below G1's default minimum (5%, 12 regions).
    r = script_jvm(farmem_cmd, private_tmp, flags, local="16%")
    f = final_flags(r.stdout)
    assert r.returncode == 0 and f["MaxNewSize"] == str(10 << 20), f
    # 6% is 15 MiB: a quarter is under 4 MiB, too small to hold a young generation to.
    r = script_jvm(farmem_cmd, private_tmp, flags, local="6%")
    f = final_flags(r.stdout)
    assert r.returncode == 0 and int(f["MaxNewSize"]) > 100 << 20 and sized not in r.stderr, f

    r = script_jvm(farmem_cmd, private_tmp, flags.replace("-version", "-Xmn100m -version"))
    assert r.returncode == 0 and final_flags(r.stdout)["MaxNewSize"] == str(100 << 20), r.stderr[-2000:]
    assert sized not in r.stderr
    r = script_jvm(farmem_cmd, private_tmp, flags, env={"JAVA_TOOL_OPTIONS": "-XX:+UnlockExperimentalVMOptions "
                                                         "-XX:G1MaxNewSizePercent=40"})
    assert r.returncode == 0 and final_flags(r.stdout)["G1MaxNewSizePercent"] == "40", r.stderr[-2000:]
    assert sized not in r.stderr
    for local, extra in (("100%", []), ("25%", ["--no-heap-sizing"])):
        r = script_jvm(farmem_cmd, private_tmp, flags, *extra, local=local)
        assert r.returncode == 0 and "Picked up JAVA_TOOL_OPTIONS: -agentpath:" in r.stderr, r.stderr[-2000:]
        f = final_flags(r.stdout)
        assert int(f["MaxNewSize"]) > 100 << 20 and sized not in r.stderr, f

    r = script_jvm(farmem_cmd, private_tmp, f"java -Xmx256m -cp {cp} GcChurn --live-mb 60 --steps 20000",
                   local="1G")
    assert r.returncode == 0 and "gcchurn: ok" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "larger than the Java heap (256 MiB)" in r.stderr and "runs without farmem" in r.stderr, r.stderr