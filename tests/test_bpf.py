# SPDX-License-Identifier: Apache-2.0
"""farmem-trace (bpf/) and `farmem trace`: faults, major/minor split, userfaultfd waits, GC
phases from HotSpot's USDT probes, GC/app classification, the plot; and the refusal without
BPF permission."""

import csv
import json
import shutil
import subprocess
import time

import pytest

pytestmark = [pytest.mark.root, pytest.mark.bpf]

CHURN_JAVA = r"""
public class Churn {
    public static void main(String[] a) {
        long end = System.nanoTime() + Long.parseLong(a[0]) * 1_000_000_000L;
        Object[] live = new Object[200_000];
        java.util.Random r = new java.util.Random(1);
        long sum = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 10000; i++) {
                byte[] b = new byte[64 + r.nextInt(512)];
                b[0] = (byte) i;
                live[r.nextInt(live.length)] = b;
            }
            sum += live.length;
            // Fresh memory for the application thread itself: its eden pages were all touched
            // in the first second, and a direct buffer's zeroing faults in this thread.
            sum += java.nio.ByteBuffer.allocateDirect(1 << 20).put(0, (byte) 1).get(0);
        }
        System.out.println("OK " + sum);
    }
}
"""


@pytest.fixture(scope="module")
def trace_bin(built):
    return built("build/bin/farmem-trace")


@pytest.fixture
def churn(tmp_path):
    (tmp_path / "Churn.java").write_text(CHURN_JAVA)
    subprocess.run(["javac", "-d", str(tmp_path), str(tmp_path / "Churn.java")], check=True)
    procs = []

    def start(secs=8, extra=()):
        p = subprocess.Popen(["java", "-Xms128m", "-Xmx128m", *extra, "-cp", str(tmp_path),
                              "Churn", str(secs)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        time.sleep(0.7)  # libjvm.so mapped
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


def _lines(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# Maps, touches and unmaps 32 MiB over and over: a steady stream of minor faults.
TOUCHER = r"""
import mmap
while True:
    m = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, 32 << 20, 4096):
        m[off] = 1
    m.close()
"""


def test_trace_counts_faults_of_a_pid(trace_bin):
    w = subprocess.Popen(["python3", "-c", TOUCHER])
    try:
        r = subprocess.run([str(trace_bin), "-p", str(w.pid), "-i", "500", "-d", "2", "-e", "major"],
                           capture_output=True, text=True, timeout=30)
    finally:
        w.kill()
        w.wait()
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    start = lines[0]
    assert start["type"] == "start" and start["pids"] == [w.pid]
    assert start["features"] == {"page_fault_user": True, "major_minor": True, "uffd_wait": True,
                                 "reclaim": True, "gc": False}
    assert lines[-1]["type"] == "end"
    final = [d for d in lines if d["type"] == "stats"][-1]
    (proc,) = final["procs"]
    assert proc["pid"] == w.pid
    # minor faults, each one closed with a latency
    assert proc["pf_user"] > 0 and proc["min"] > 0
    assert sum(proc["lat_hist"]) > 0
    assert {t["tid"] for t in proc["threads"]} >= {w.pid}


def test_uffd_waits_under_the_pager(trace_bin, built, farmem_cmd, wait_paging):
    built("build/tests/pagetest")
    run = subprocess.Popen(farmem_cmd + ["run", "--local", "25%", "--", "build/tests/pagetest",
                                         "--size", "128M", "--rounds", "400"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = wait_paging(run, "pagetest")
        r = subprocess.run([str(trace_bin), "-p", str(child), "-i", "0", "-d", "2"],
                           capture_output=True, text=True, timeout=30)
    finally:
        run.terminate()
        run.wait(30)
    assert r.returncode == 0, r.stderr
    final = [d for d in _lines(r.stdout) if d["type"] == "stats"][-1]
    (proc,) = final["procs"]
    # userfaultfd faults are minor faults, and the faulting thread blocks in handle_userfault
    assert proc["uffd_waits"] > 100, proc
    assert proc["uffd_wait_ns"] > 0 and proc["maj"] < proc["min"]


def test_system_wide_traces_the_farmem_processes_cheaply(trace_bin, built, farmem_cmd, wait_paging):
    """No -p (as `farmem top`): only farmem processes, uffd waits without stack walks, major/minor
    from /proc, latency of the faults that block."""
    built("build/tests/pagetest")
    other = subprocess.Popen(["python3", "-c", TOUCHER])
    run = subprocess.Popen(farmem_cmd + ["run", "--local", "25%", "--", "build/tests/pagetest",
                                         "--size", "128M", "--rounds", "400"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = wait_paging(run, "pagetest")
        r = subprocess.run([str(trace_bin), "-i", "1000", "-d", "3"], capture_output=True, text=True,
                           timeout=30)
    finally:
        run.terminate()
        run.wait(30)
        other.kill()
        other.wait()
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    assert lines[0]["mode"] == "farmem" and lines[0]["features"]["major_minor"] is True
    assert lines[0]["features"]["uffd_wait"] is True
    final = [d for d in lines if d["type"] == "stats"][-1]
    procs = {p["pid"]: p for p in final["procs"]}
    assert other.pid not in procs  # not a farmem process: filtered out in BPF
    proc = procs[child]
    assert proc["uffd_waits"] > 100 and proc["uffd_wait_ns"] > 0, proc
    assert proc["min"] > 0 and proc["maj"] < proc["min"] and sum(proc["lat_hist"]) > 0
    assert proc["fault_ns"] > 0 and any(t["min"] > 0 for t in proc["threads"])


def test_gc_phases_and_threads(trace_bin, churn, tmp_path, farmem_cmd):
    p = churn(8)
    r = subprocess.run([str(trace_bin), "-p", str(p.pid), "-i", "1000", "-d", "3", "-e", "gc,fault"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    assert lines[0]["features"]["gc"] is True and lines[0]["jvms"]
    begins = [d for d in lines if d["type"] == "gc_begin"]
    ends = [d for d in lines if d["type"] == "gc_end"]
    assert begins and ends and all(d["dur_ns"] > 0 for d in ends[1:])
    faults = [d for d in lines if d["type"] == "fault"]
    assert any(d["gc"] for d in faults) and any(not d["gc"] for d in faults)
    assert {d["comm"] for d in faults if d["gc"]} <= {c for c in (d["comm"] for d in faults)
                                                   if c.startswith(("GC Thread", "G1 ", "VM Thread"))}
    final = [d for d in lines if d["type"] == "stats"][-1]
    (proc,) = final["procs"]
    assert proc["gc"]["begins"] >= len(begins) and 0 < proc["gc_faults"] < proc["pf_user"]


def test_farmem_trace_plot(churn, tmp_path, farmem_cmd):
    p = churn(12)
    png, csvf = tmp_path / "f.png", tmp_path / "f.csv"
    start = time.monotonic()
    r = subprocess.run(farmem_cmd + ["trace", str(p.pid), "--duration", "3s", "--plot", str(png),
                                     "--csv", str(csvf), "--json"],
                       capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    # about the duration: loading the probes and drawing (hundreds of GC pauses) add little
    assert elapsed < 3 + 3.5, f"--duration 3s took {elapsed:.1f} s"
    s = json.loads(r.stdout)
    assert s["gc_faults"] > 0 and s["app_faults"] > 0 and s["gc_phases"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000
    with open(csvf) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == s["faults"] and {r["thread"] for r in rows} == {"gc", "app"}


def test_plot_axis_says_what_it_shows(tmp_path):
    """The y axis is a page number from the lowest page faulted; that page's address is printed in
    full, not as a label that reads like a cut-off address."""
    from farmem.commands import trace
    base = 0x7F3A12345000
    faults = [{"t": i / 100, "addr": base + ((i * 7) % 50) * 4096, "gc": i % 3 == 0, "err": 2}
              for i in range(300)]
    gcs = [{"type": "gc_begin", "t": 0.5, "full": False}, {"type": "gc_end", "t": 0.7}]
    out = trace.plot(str(tmp_path / "p.png"), 1, {"faults": faults, "gc": gcs, "duration_s": 3.0,
                                                   "regions": []})
    assert out["ylabel"] == trace.y_label() and "0x" not in out["ylabel"] and "page" in out["ylabel"]
    assert out["page0"] == base and out["gc_phases"] == 1
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_without_bpf_permission(trace_bin, tmp_path):
    """As an unprivileged user: exit 3 and a sentence, never a traceback."""
    runuser = shutil.which("setpriv") or pytest.fail("setpriv (util-linux) is needed")
    r = subprocess.run([runuser, "--reuid=65534", "--regid=65534", "--clear-groups",
                        str(trace_bin), "-d", "1"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "farmem-trace: cannot load the eBPF programs" in r.stderr
    assert "farmem run and farmem stat work without it" in r.stderr
    assert r.stdout == ""
