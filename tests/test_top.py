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
    assert row["p99_us"] >= row["p50_us"] > 0 and row["stall_pct"] > 0
    # The workload's thread is listed with the most faults (the first row is the busiest of the
    # last interval, which can be the evictor's minor faults on a loaded machine), and its rates
    # are those of the interval, not zero beside a growing count.
    main = max(row["threads"], key=lambda t: t["faults"])
    assert main["tid"] == workload
    assert main["faults_s"] > 0 and main["min_fs"] > 0 and main["uffd_waits_s"] > 0 and main["stall_pct"] > 0


def number(text: str) -> float:
    """A figure as farmem top prints it: 12.3, 123, 12k, 1.2M."""
    mult = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(text[-1:], 1)
    return float(text.rstrip("kMGT")) * mult


def columns(text: str, header_start: str) -> tuple:
    """(header names, rows as lists) of the table whose header line starts like header_start."""
    lines = text.splitlines()
    h = next(i for i, line in enumerate(lines) if line.split()[:2] == header_start.split())
    return lines[h].split(), [line.split() for line in lines[h + 1:] if line.strip()]


@pytest.mark.parametrize("width", [80, 160])
def test_tmux_screen(workload, farmem_cmd, width):
    tmux = shutil.which("tmux") or pytest.fail("tmux is needed (tools/deps.sh installs it)")
    session = f"fmtop{workload}x{width}"
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", str(width), "-y", "40",
                    " ".join(farmem_cmd + ["top", "0.5"])], check=True)
    # detached sessions take the default size whatever -x says (tmux 3.3): set it
    subprocess.run([tmux, "resize-window", "-t", session, "-x", str(width), "-y", "40"], check=True)
    wide = width >= 160
    pid_row = [str(workload), "pagetest" if wide else "pagete"]
    try:
        def screen():
            return subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        def shows(*what, seconds=20.0):  # a redraw takes up to an interval, longer under load
            text = ""
            for _ in range(int(seconds / 0.25)):
                text = screen()
                if all(w in text for w in what):
                    return text
                time.sleep(0.25)
            pytest.fail(f"farmem top never showed {what}:\n{text}")

        row, text = None, ""
        for _ in range(80):  # eBPF load plus two samples
            time.sleep(0.25)
            text = screen()
            if "eBPF on" not in text:
                continue
            names, rows = columns(text, "PID COMM")
            mine = [r for r in rows if r[:2] == pid_row]
            if mine and number(mine[0][names.index("UFFD/s" if wide else "UF/s")]) > 0:
                row = dict(zip(names, mine[0]))
                break
        size = subprocess.run([tmux, "display", "-p", "-t", session, "#{window_width}x#{window_height}"],
                              capture_output=True, text=True).stdout.strip()
        assert row, f"no row with faults/s > 0 for pid {workload} in a {size} window:\n{text}"
        # everything fits: the totals, every column (each with a value), one line on STALL%
        assert all(len(line) < width for line in text.splitlines()), text
        assert "farmem top" in text and "memd" in text and "MB/s" in text and "processes" in text
        assert len(row) == 15 and (("STALL%" in text) if wide else ("STL%" in text))
        stall = next(line for line in text.splitlines() if line.startswith(("STALL% =", "STL%:")))
        assert ">100" in stall or "above 100" in stall
        assert number(row["P99us" if wide else "P99"]) > 0
        assert "sorted by " + ("UFFD/s" if wide else "UF/s") + ", largest first" in text
        # '>' moves the sort to the next column: the marker is a line of its own, not glued on
        subprocess.run([tmux, "send-keys", "-t", session, ">"], check=True)
        text = shows("sorted by " + ("MAJ/s" if wide else "MJ/s"))
        assert "MAJ/s^" not in text and "MAJ/sv" not in text
        # Enter: the per-thread view of the selected row, whose rates move with the workload. Other
        # farmem processes may be listed (and busier): pause, so that the rows stand still, select
        # the workload's, open it, and go on.
        subprocess.run([tmux, "send-keys", "-t", session, "p"], check=True)
        names, rows = columns(shows("[paused]"), "PID COMM")
        index = [r[:2] for r in rows].index(pid_row)
        for _ in range(index):
            subprocess.run([tmux, "send-keys", "-t", session, "Down"], check=True)
        subprocess.run([tmux, "send-keys", "-t", session, "Enter"], check=True)
        text = shows(f"threads of pid {workload}", "FAULTS/s" if wide else "FLT/s")
        subprocess.run([tmux, "send-keys", "-t", session, "p"], check=True)
        for _ in range(80):
            if "[paused]" not in screen():
                break
            time.sleep(0.25)
        else:
            pytest.fail("farmem top did not go on after the second p")
        for _ in range(40):
            names, rows = columns(screen(), "TID COMM")
            mine = [dict(zip(names, r)) for r in rows if r[0] == str(workload)]
            if mine and number(mine[0]["FAULTS/s" if wide else "FLT/s"]) > 0:
                break
            time.sleep(0.25)
        else:
            pytest.fail(f"the thread view shows no faults/s for tid {workload}:\n{screen()}")
        t = mine[0]
        assert number(t["MIN/s" if wide else "MN/s"]) > 0 and number(t["UWAIT/s" if wide else "UW/s"]) > 0
        # p freezes this view too: the same screen two intervals apart
        subprocess.run([tmux, "send-keys", "-t", session, "p"], check=True)
        shows("[paused]")
        time.sleep(0.5)  # a frame drawn before the key was read may still be on screen
        first = screen()
        time.sleep(1.5)
        assert screen() == first and "[paused]" in first
        subprocess.run([tmux, "send-keys", "-t", session, "q"], check=True)
        for _ in range(40):
            time.sleep(0.25)
            if subprocess.run([tmux, "has-session", "-t", session], capture_output=True).returncode:
                break
        else:
            pytest.fail("farmem top did not quit on q")
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
