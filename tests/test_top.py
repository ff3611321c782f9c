# SPDX-License-Identifier: Apache-2.0
"""`farmem top`, tested as a person uses it: in tmux, reading the screen with capture-pane;
and the --once --json path that scripts use."""

import json
import shutil
import subprocess
import time

import pytest

from farmem import procmap

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.pager, pytest.mark.memd]


@pytest.fixture
def workload(farmem_cmd, built):
    """pagetest under the pager, faulting for the length of the test; yields its pid."""
    built("build/tests/pagetest")
    built("build/bin/farmem-trace")
    run = subprocess.Popen(farmem_cmd + ["run", "--local", "25%", "--", "build/tests/pagetest",
                                         "--size", "128M", "--rounds", "1000"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid = None
    for _ in range(100):
        time.sleep(0.1)
        kids = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split()
        pid = next((int(k) for k in kids if open(f"/proc/{k}/comm").read().strip() == "pagetest"), None)
        if pid and pid in procmap.farmem_pids():
            break
    assert pid, "pagetest did not start under farmem run"
    yield pid
    run.terminate()
    try:
        run.wait(30)
    except subprocess.TimeoutExpired:
        run.kill()
        run.wait()


def test_once_json_lists_the_workload(workload, farmem_cmd):
    r = subprocess.run(farmem_cmd + ["top", "--once", "--json", "0.5"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["totals"]["ebpf"] is True and d["totals"]["processes"] >= 1
    (row,) = [x for x in d["rows"] if x["pid"] == workload]
    assert row["comm"] == "pagetest" and row["mode"] == "uffd"
    assert row["uffd_fs"] > 0 and row["min_fs"] > 0 and row["local_mb"] > 0 and row["remote_mb"] > 0
    assert row["p99_us"] >= row["p50_us"] > 0
    # The workload's thread is listed with the most faults (the first row is the busiest of the
    # last interval, which can be the evictor's minor faults on a loaded machine).
    assert row["threads"] and max(row["threads"], key=lambda t: t["faults"])["tid"] == workload


def test_tmux_screen(workload, farmem_cmd):
    tmux = shutil.which("tmux") or pytest.fail("tmux is needed (tools/deps.sh installs it)")
    session = f"fmtop{workload}"
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "200", "-y", "40",
                    " ".join(farmem_cmd + ["top", "0.5"])], check=True)
    # detached sessions take the default size whatever -x says (tmux 3.3): set it
    subprocess.run([tmux, "resize-window", "-t", session, "-x", "200", "-y", "40"], check=True)
    try:
        def screen():
            return subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        row, text = None, ""
        for _ in range(80):  # eBPF load plus two samples
            time.sleep(0.25)
            text = screen()
            rows = [line for line in text.splitlines() if line.split()[:2] == [str(workload), "pagetest"]]
            if rows and float(rows[0].split()[4]) > 0 and "eBPF on" in text:
                row = rows[0]
                break
        assert row, f"no row with UFFD/s > 0 for pid {workload}:\n{text}"
        assert "farmem top" in text and "PID" in text and "UFFD/s" in text
        # '>' moves the sort to the next column (MAJ/s), Enter opens the per-thread view
        def shows(*what, seconds=20.0):  # a redraw takes up to an interval, longer under load
            text = ""
            for _ in range(int(seconds / 0.25)):
                text = screen()
                if all(w in text for w in what):
                    return
                time.sleep(0.25)
            pytest.fail(f"farmem top never showed {what}:\n{text}")

        subprocess.run([tmux, "send-keys", "-t", session, ">"], check=True)
        shows("MAJ/sv")
        subprocess.run([tmux, "send-keys", "-t", session, "Enter"], check=True)
        shows("threads of pid", "FAULTS/s")
        subprocess.run([tmux, "send-keys", "-t", session, "q"], check=True)
        for _ in range(40):
            time.sleep(0.25)
            if subprocess.run([tmux, "has-session", "-t", session], capture_output=True).returncode:
                break
        else:
            pytest.fail("farmem top did not quit on q")
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
