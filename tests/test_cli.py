# SPDX-License-Identifier: Apache-2.0
"""The farmem command: flag checking, `farmem run` (embedded memd, environment, exit status,
signals, control socket, summary), `farmem memd`, `farmem stat` and the residency-map reader."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from farmem import main, resmap, units

CLI_SRC = Path(__file__).resolve().parent.parent / "cli" / "src"

SUMMARY_KEYS = {
    "faults", "remote_reads", "remote_writes", "evictions", "evictions_clean", "evictions_dirty",
    "zero_fills", "wp_faults", "prefetch_issued", "prefetch_used", "gc_faults", "app_faults",
    "memd_full", "crc_errors", "transport_errors", "fault_p50_us", "fault_p99_us",
    "local_limit_bytes", "peak_resident_bytes", "registered_bytes", "transport", "processes",
    "exit_status", "elapsed_s",
}
COUNTERS = SUMMARY_KEYS - {"transport", "exit_status", "elapsed_s"}


def cli(capsys, *argv):
    """Run farmem in this process; return (status, stdout, stderr)."""
    status = main.cli([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def farmem(farmem_cmd, *args, timeout=120, env=None, **kw):
    return subprocess.run([*farmem_cmd, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def clean_env(**extra):
    """The test's environment without any FARMEM_* knob or LD_PRELOAD that could leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARMEM_") and k != "LD_PRELOAD"}
    env.update(extra)
    return env


def processes_mentioning(text: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# --- sizes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("64M", 64 << 20), ("1g", 1 << 30), ("512MiB", 512 << 20), ("64mb", 64 << 20),
    ("7K", 7 << 10), ("2T", 2 << 40), ("100b", 100),
])
def test_parse_bytes_accepts(text, value):
    assert units.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5G", "-1", "12x", "1ib", "64 M", "0x10", "1GiBB", "1P"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        units.parse_bytes(text)


def test_parse_local():
    assert units.parse_local("25%") == "25%"
    assert units.parse_local("100%") == "100%"
    assert units.parse_local("64M") == str(64 << 20)
    for bad in ("0%", "101%", "150%", "abc", "%", "512K", "12.5%"):
        with pytest.raises(ValueError):
            units.parse_local(bad)


# --- flags ----------------------------------------------------------------------------------------

BAD_RUN_FLAGS = [
    (["--local", "abc"], "argument --local"),
    (["--local", "150%"], "argument --local"),
    (["--local", "0%"], "argument --local"),
    (["--local", "512K"], "argument --local"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--transport", "rdma"], "argument --transport"),
    (["--threshold", "1x"], "argument --threshold"),
    (["--threshold", "100"], "argument --threshold"),
    (["--fill-threads", "0"], "argument --fill-threads"),
    (["--fill-threads", "two"], "argument --fill-threads"),
    (["--evict-high", "101"], "argument --evict-high"),
    (["--evict-high", "80", "--evict-low", "90"], "--evict-low 90% must be below --evict-high 80%"),
    (["--prefetch", "-1"], "argument --prefetch"),
    (["--prefetch", "65"], "argument --prefetch"),
    (["--memd", "nonsense"], "argument --memd"),
    (["--memd", "tcp:127.0.0.1:99999"], "argument --memd"),
    (["--memd", "unix:"], "argument --memd"),
    (["--memd", "10.0.0.1:7070,"], "argument --memd"),
    (["--log", "loud"], "argument --log"),
    (["--summary-json", "/nonexistent-dir/s.json"], "argument --summary-json"),
    (["--memd", "127.0.0.1:7070"], "--memd needs the memd's secret"),
    (["--secret-file", "/etc/hostname"], "--secret-file goes with --memd"),
]


@pytest.mark.parametrize("flags,message", BAD_RUN_FLAGS, ids=[" ".join(f) for f, _ in BAD_RUN_FLAGS])
def test_run_rejects_bad_flags(flags, message, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FARMEM_SECRET", raising=False)
    marker = tmp_path / "ran"
    status, out, err = cli(capsys, "run", *flags, "--", "touch", marker)
    assert status == 2, err
    # one line: what is wrong, and where the help is (not argparse's whole usage block)
    assert err.startswith("farmem run: error: ") and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith("see `farmem run --help`"), err
    assert message in err
    assert not marker.exists()


def test_run_shm_needs_unix_addresses(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FARMEM_SECRET", "x" * 64)
    status, _, err = cli(capsys, "run", "--transport", "shm", "--memd", "tcp:127.0.0.1:7070", "--", "true")
    assert status == 2 and "--transport shm needs unix: memd addresses" in err


@pytest.mark.parametrize("argv", [["run"], ["run", "--"], ["run", "--local", "25%"], ["run", "--local", "25%", "--"]])
def test_run_without_cmd_is_a_usage_error(argv, capsys):
    status, _, err = cli(capsys, *argv)
    assert status == 2
    assert err.startswith("farmem run: error: missing CMD") and len(err.splitlines()) == 1


def test_unknown_command_and_no_command(capsys):
    status, _, err = cli(capsys, "frobnicate")
    assert status == 2 and err.startswith("farmem: error: argument COMMAND: invalid choice: 'frobnicate'")
    assert len(err.splitlines()) == 1
    status, _, err = cli(capsys)
    assert status == 2 and err.startswith("farmem: give a command:")
    sub = next(a for a in main.get_command_parser()._actions if a.dest == "command")
    listed = [line.split()[0] for line in err.splitlines()[1:-1]]
    assert listed == list(sub.choices) and {"attach", "detach"} <= set(listed)


def test_help_exits_0(capsys):
    status, out, _ = cli(capsys, "run", "--help")
    assert status == 0 and "--summary-json" in out and "examples:" in out


def test_cmd_arguments_that_look_like_flags_belong_to_cmd(tmp_path, farmem_cmd):
    """Everything after CMD is CMD's, even without `--`."""
    out = tmp_path / "args"
    r = farmem(farmem_cmd, "run", "sh", "-c", f'printf "%s\\n" "$@" > {out}', "sh", "--local", "-x",
               env=clean_env())
    assert r.returncode == 0, r.stderr
    assert out.read_text().split() == ["--local", "-x"]


# --- farmem run with the embedded memd ------------------------------------------------------------

@pytest.mark.memd
@pytest.mark.pager
def test_run_exit_status_and_cleanup(tmp_path, farmem_cmd):
    info = tmp_path / "info"
    script = (f'echo "$FARMEM_CONTROL" > {info}; echo "$FARMEM_MEMD" >> {info}; '
              f'test -S "${{FARMEM_MEMD#unix:}}" && echo memd-listening >> {info}; exit 7')
    r = farmem(farmem_cmd, "run", "--", "sh", "-c", script, env=clean_env())
    assert r.returncode == 7, r.stderr
    control, memd, listening = info.read_text().splitlines()
    assert listening == "memd-listening"
    assert memd.startswith("unix:")
    tmpdir = os.path.dirname(control)
    assert os.path.dirname(memd.removeprefix("unix:")) == tmpdir
    assert not os.path.exists(tmpdir), "the private directory outlived the run"
    assert processes_mentioning(tmpdir) == [], "the embedded memd outlived the run"

    r = farmem(farmem_cmd, "run", "--", "true", env=clean_env())
    assert r.returncode == 0, r.stderr


@pytest.mark.memd
@pytest.mark.pager
@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGKILL])
def test_run_signal_death_is_128_plus_n(signo, farmem_cmd):
    r = farmem(farmem_cmd, "run", "--", "sh", "-c", f"kill -{signo.name[3:]} $$", env=clean_env())
    assert r.returncode == 128 + signo, r.stderr


def wait_started(proc, started: Path) -> None:
    """Until CMD of the `farmem run` PROC has created STARTED."""
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "CMD never started"
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)


@pytest.mark.memd
@pytest.mark.pager
@pytest.mark.parametrize("signo,code", [(signal.SIGTERM, 42), (signal.SIGINT, 43)])
def test_run_forwards_signals_to_cmd(signo, code, tmp_path, farmem_cmd):
    started = tmp_path / "started"
    script = f'trap "exit {code}" {signo.name[3:]}; touch {started}; while :; do sleep 0.05; done'
    proc = subprocess.Popen([*farmem_cmd, "run", "--", "sh", "-c", script], env=clean_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_started(proc, started)
        proc.send_signal(signo)
        assert proc.wait(30) == code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.memd
@pytest.mark.pager
def test_run_says_when_cmd_is_statically_linked(tmp_path, farmem_cmd):
    """LD_PRELOAD cannot reach a static executable (a Go program, a static build): farmem says so instead
    of leaving the user with "no pager started"; a dynamic one gets no such word."""
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    static = tmp_path / "hello-static"
    subprocess.run(["cc", "-static", "-O2", "-o", str(static), str(src)], check=True, capture_output=True)
    r = farmem(farmem_cmd, "run", "--", static, env=clean_env())
    assert r.returncode == 0 and r.stdout == "hello\n", r.stderr
    assert f"{static} is statically linked" in r.stderr, r.stderr
    r = farmem(farmem_cmd, "run", "--", "true", env=clean_env())
    assert r.returncode == 0 and "statically linked" not in r.stderr, r.stderr


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.memd
@pytest.mark.pager
def test_cmd_dies_with_a_killed_launcher(tmp_path, farmem_cmd):
    """`farmem run` killed by SIGKILL cannot forward it, and its memd goes with it: CMD must not run
    on orphaned (before session 33 it did, unpaged, with no budget). It gets SIGTERM."""
    started = tmp_path / "started"
    proc = subprocess.Popen([*farmem_cmd, "run", "--", "sh", "-c", f"echo $$ $FARMEM_CONTROL > {started}.tmp && "
                             f"mv {started}.tmp {started} && exec sleep 300"], env=clean_env(),
                            stderr=subprocess.PIPE, text=True)
    pid = run_dir = None
    try:
        wait_started(proc, started)
        pid, control = started.read_text().split()
        pid, run_dir = int(pid), os.path.dirname(control)
        assert not gone(pid)
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 10
        while not gone(pid):
            assert time.monotonic() < deadline, f"CMD (pid {pid}) still runs 10 s after farmem run was killed"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid and not gone(pid):
            os.kill(pid, signal.SIGKILL)
        if run_dir:  # a launcher killed by SIGKILL leaves its directory behind
            shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.memd
@pytest.mark.pager
def test_run_environment_contract(tmp_path, farmem_cmd, build):
    def run_env(*flags, **extra):
        script = (f'env > {tmp_path}/env; cat "$(dirname "$FARMEM_CONTROL")/secret" > {tmp_path}/secret; '
                  f'stat -c %a "$(dirname "$FARMEM_CONTROL")/secret" > {tmp_path}/mode; '
                  f'test -S "$FARMEM_CONTROL" && echo yes > {tmp_path}/control')
        r = farmem(farmem_cmd, "run", *flags, "--", "sh", "-c", script, env=clean_env(**extra))
        assert r.returncode == 0, r.stderr
        env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
        return env

    shim = str(build / "lib" / "libfarmem_preload.so")
    env = run_env("--local", "64M", "--threshold", "128M", "--fill-threads", "3", "--evict-high", "80",
                  "--evict-low", "60", "--prefetch", "16", "--transport", "stream", "--log", "warn",
                  LD_PRELOAD="libc.so.6")
    assert env["LD_PRELOAD"] == f"{shim}:libc.so.6"
    assert env["FARMEM_LOCAL"] == str(64 << 20)
    assert env["FARMEM_THRESHOLD"] == str(128 << 20)
    assert (env["FARMEM_FILL_THREADS"], env["FARMEM_EVICT_HIGH"], env["FARMEM_EVICT_LOW"],
            env["FARMEM_PREFETCH"], env["FARMEM_TRANSPORT"], env["FARMEM_LOG"]) == \
        ("3", "80", "60", "16", "stream", "warn")
    assert re.fullmatch(r"[0-9a-f]{64}", env["FARMEM_SECRET"])
    assert (tmp_path / "secret").read_text() == env["FARMEM_SECRET"]
    assert (tmp_path / "mode").read_text().strip() == "600"
    assert (tmp_path / "control").read_text().strip() == "yes"
    assert env["FARMEM_MEMD"] == "unix:" + os.path.join(os.path.dirname(env["FARMEM_CONTROL"]), "memd.sock")

    first_secret = env["FARMEM_SECRET"]
    env = run_env("--local", "30%")
    assert env["LD_PRELOAD"] == shim
    assert env["FARMEM_LOCAL"] == "30%"
    assert env["FARMEM_SECRET"] != first_secret, "every run gets a fresh secret"
    for name in ("FARMEM_THRESHOLD", "FARMEM_FILL_THREADS", "FARMEM_EVICT_HIGH", "FARMEM_EVICT_LOW",
                 "FARMEM_PREFETCH", "FARMEM_TRANSPORT", "FARMEM_LOG"):
        assert name not in env, f"{name} set although its flag was not given"
    assert run_env()["FARMEM_LOCAL"] == "25%"


@pytest.mark.memd
@pytest.mark.pager
def test_run_command_not_found_is_127(farmem_cmd, tmp_path):
    r = farmem(farmem_cmd, "run", "--", str(tmp_path / "no-such-program"), env=clean_env())
    assert r.returncode == 127
    assert "farmem: error: cannot run" in r.stderr and "command not found" in r.stderr


@pytest.mark.memd
@pytest.mark.pager
def test_summary_json_without_a_pager(tmp_path, farmem_cmd):
    out = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--summary-json", out, "--", "sh", "-c", "exit 3", env=clean_env())
    assert r.returncode == 3, r.stderr
    s = json.loads(out.read_text())
    assert SUMMARY_KEYS <= s.keys()
    assert all(s[k] == 0 for k in COUNTERS), {k: s[k] for k in COUNTERS if s[k]}
    assert s["transport"] == "none" and s["exit_status"] == 3 and s["elapsed_s"] >= 0
    assert "farmem: no pager started" in r.stderr
    assert re.search(r"; CMD had up to [\d.]+ [KM]iB resident, none of it paged; exit status 3", r.stderr), r.stderr
    assert s["peak_rss_bytes"] > 0, s


# A stand-in for a pager: hands a residency map over FARMEM_CONTROL the way uffd/pager.c does,
# then keeps counting after the hand-over; the launcher must report the final figures.
FAKE_PAGER = textwrap.dedent("""
    import mmap, os, socket, sys
    sys.path.insert(0, sys.argv[1])
    from farmem import resmap
    size = resmap.MAP_OFFSET + 4096
    fd = os.memfd_create("farmem-map")
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    h = resmap.ResmapHdr.from_buffer(mm)
    h.magic, h.version, h.page_shift, h.hdr_size = resmap.MAGIC, resmap.VERSION, 12, resmap.MAP_OFFSET
    h.pid, h.transport = os.getpid(), 2
    st = h.stats
    st.faults, st.remote_reads, st.remote_writes, st.zero_fills = 1000, 300, 200, 700
    st.evictions_clean, st.evictions_dirty = 50, 150
    st.local_limit_pages, st.peak_resident_pages, st.registered_pages = 1024, 1000, 4096
    st.peak_limit_pages = 1024                                   # a budget that never fell: said once
    st.adopt_peak_pages, st.adopt_evictions = 2048, 1100       # found over the limit at registration
    st.lat_hist[resmap.lat_bucket(5000)] = 98
    st.lat_hist[resmap.lat_bucket(200000)] = 2
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["FARMEM_CONTROL"])
    socket.send_fds(s, [b"FMCTL1 pid=%d\\n" % os.getpid()], [fd])
    s.close()
    junk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # a bad peer: no fd, bad line
    junk.connect(os.environ["FARMEM_CONTROL"])
    junk.sendall(b"hello\\n")
    junk.close()
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)    # a process killed before its hello
    mute.connect(os.environ["FARMEM_CONTROL"])
    mute.close()
    st.faults = 1234                                             # after the hand-over
    print(os.getpid())
    del h, st
    mm.close()
""")


@pytest.mark.memd
@pytest.mark.pager
def test_summary_from_the_control_socket(tmp_path, farmem_cmd):
    out, pidfile = tmp_path / "s.json", tmp_path / "pid"
    script = tmp_path / "fake_pager.py"
    script.write_text(FAKE_PAGER)
    r = farmem(farmem_cmd, "run", "--threshold", "1T", "--summary-json", out, "--",
               "sh", "-c", f'"$0" "$@" > {pidfile}', sys.executable, script, CLI_SRC, env=clean_env())
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert SUMMARY_KEYS <= s.keys()
    assert s["processes"] == 1 and s["pids"] == [int(pidfile.read_text())]
    assert s["faults"] == 1234, "the figures must be read after the process exited"
    assert (s["remote_reads"], s["remote_writes"], s["zero_fills"]) == (300, 200, 700)
    assert (s["evictions"], s["evictions_clean"], s["evictions_dirty"]) == (200, 50, 150)
    assert s["local_limit_bytes"] == s["peak_limit_bytes"] == 1024 * 4096
    assert s["peak_resident_bytes"] == 1000 * 4096
    assert "local limit 4.0 MiB, peak resident" in r.stderr, r.stderr
    assert s["registered_bytes"] == 4096 * 4096
    assert s["transport"] == "shm"
    assert s["fault_p50_us"] == round(resmap.lat_bucket_floor(resmap.lat_bucket(5000)) / 1000, 2)
    assert s["fault_p99_us"] == round(resmap.lat_bucket_floor(resmap.lat_bucket(200000)) / 1000, 2)
    assert "farmem: 1234 faults" in r.stderr
    # The excursion registration found is said beside the peak, which counts from after it.
    assert s["adopt_peak_bytes"] == 2048 * 4096 and s["adopt_evictions"] == 1100
    assert "peak resident 3.9 MiB (8.0 MiB resident when registered, over the limit: 1100 pages evicted at once)" \
        in r.stderr, r.stderr
    # The bad peer is warned about; one that said nothing (killed before its hello: stress-ng's
    # shm-sysv stressor's children) is not.
    assert r.stderr.count("control socket: ignored a connection") == 1, r.stderr


@pytest.mark.memd
@pytest.mark.pager
def test_summary_of_a_process_that_execs(tmp_path, farmem_cmd, built):
    """A process paged before and after an exec (a shell or a script that execs its program) has a
    pager, and a map, for each image: it is one process, with the budget once, not twice."""
    pagetest = built("build/tests/pagetest")
    out = tmp_path / "s.json"
    prog = ("import mmap, os, sys; m = mmap.mmap(-1, 8 << 20); m.write(b'x' * (8 << 20)); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    r = farmem(farmem_cmd, "run", "--threshold", "1M", "--local", "16M", "--summary-json", out, "--",
               sys.executable, "-c", prog, pagetest, "--size", "64M", "--rounds", "1", env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert len(s["pids"]) == 2 and len(set(s["pids"])) == 1, s  # python's pager, then pagetest's
    assert s["processes"] == 1 and "1 process;" in r.stderr, r.stderr
    assert s["local_limit_bytes"] == 16 << 20, s
    assert 8 << 20 <= s["peak_resident_bytes"] <= 16 << 20, s


@pytest.mark.memd
@pytest.mark.pager
def test_summary_of_a_real_pager(tmp_path, farmem_cmd, built):
    pagetest = built("build/tests/pagetest")
    out = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--local", "64M", "--summary-json", out, "--",
               pagetest, "--size", "256M", "--rounds", "1", "--rewrites", "20000", env=clean_env(), timeout=300)
    s = json.loads(out.read_text())
    assert s["exit_status"] == r.returncode
    assert s["processes"] == 1, r.stderr
    assert s["local_limit_bytes"] == 64 << 20
    assert s["registered_bytes"] <= 256 << 20  # a gauge: pagetest unmaps its region before exit
    assert s["faults"] > 0 and s["remote_writes"] > 0 and s["remote_reads"] > 0 and s["evictions"] > 0, s
    assert s["peak_resident_bytes"] <= 64 << 20
    assert 0 < s["fault_p50_us"] <= s["fault_p99_us"]
    assert s["transport"] in ("shm", "stream")
    assert re.search(r"farmem: \d+ faults, \d+ write-protect faults; \d+ pages zero-filled, .* fault p50 [\d.]+ us, "
                     r"p99 [\d.]+ us", r.stderr)


def test_a_loop_over_more_than_its_budget_reads_back_what_does_not_fit(tmp_path, farmem_cmd, built):
    """A program going round 64 MiB in order at 48 MiB local, four rounds and a check: the loop rule
    (loop_evict, uffd/evict.c) lets go of what the loop passed, so each round reads back about the
    16 MiB that does not fit, and the summary counts the pages it chose; FARMEM_LOOP_EVICT=0 leaves
    the clock, which reads back most of every round, and the counter at 0."""
    rewrite = built("build/bench/rewrite")
    pages = (64 << 20) // 4096
    runs = {}
    for rule in ("1", "0"):
        out = tmp_path / f"s{rule}.json"
        r = farmem(farmem_cmd, "run", "--local", "48M", "--summary-json", out, "--", rewrite, "--mode", "fit",
                   "--size", "64M", "--rounds", str(4 * pages), env=clean_env(FARMEM_LOOP_EVICT=rule), timeout=300)
        assert r.returncode == 0, r.stderr
        runs[rule] = json.loads(out.read_text())
    on, off = runs["1"], runs["0"]
    # Four rounds after the fill, a quarter of the pages each at best: 16,384 reads; the clock about 65,000.
    assert on["remote_reads"] < 2 * 4 * pages // 4 < off["remote_reads"], (on, off)
    assert on["loop_evictions"] >= 4 * pages // 4 // 2 and off["loop_evictions"] == 0, (on, off)
    # The rule's pages come back in the loop's runs: its record keeps it on (uffd/prefetch.c, loop_trusted).
    assert on["loop_back_run"] > on["loop_back_random"] and off["loop_back_run"] == off["loop_back_random"] == 0, (on, off)


def test_a_copying_collectors_two_spaces_leave_the_loop_rule_aside(tmp_path, farmem_cmd, built):
    """Two spaces of 32 MiB at 48 MiB local, random work in one and then a copy into the other, as a
    copying collector does (build/bench/semispace, which checks every page): the copy's writes are a
    run over pages that left not long ago, as a loop's are, but a run of writes gets the rule only once
    its record speaks for it (uffd/prefetch.c, loop_trusted), so the run reads back no more than 5% over
    the clock alone (28% more before the record: 86,831 remote reads against 67,879)."""
    semispace = built("build/bench/semispace")
    runs = {}
    for rule in ("1", "0"):
        out = tmp_path / f"s{rule}.json"
        r = farmem(farmem_cmd, "run", "--threshold", "1M", "--local", "48M", "--summary-json", out, "--", semispace,
                   "--size", "32M",
                   "--copies", "8", "--touches", "50000", env=clean_env(FARMEM_LOOP_EVICT=rule), timeout=300)
        assert r.returncode == 0 and "all pages checked" in r.stdout, r.stderr
        runs[rule] = json.loads(out.read_text())
    on, off = runs["1"], runs["0"]
    assert off["loop_evictions"] == off["loop_back_run"] == off["loop_back_random"] == 0, (on, off)
    assert 0 < off["remote_reads"] and on["remote_reads"] <= off["remote_reads"] * 1.05, (on, off)


def test_a_stencils_two_buffers_get_the_loop_rule(tmp_path, farmem_cmd, built):
    """Two buffers of 32 MiB at 48 MiB local, each pass reading one in order and writing the other
    (build/bench/semispace --touches 0, every page checked): each fits, both do not, so a pass comes
    back to what the one before went through, a loop over more than the budget. Runs of writes get
    the rule only once its record speaks for it, and while the record is empty a probe lets them
    start one (uffd/prefetch.c, loop_trusted): with the rule the passes read back at most four fifths of what the clock alone
    does (until session 64 the writes never got a record and both read the same)."""
    semispace = built("build/bench/semispace")
    runs = {}
    for rule in ("1", "0"):
        out = tmp_path / f"s{rule}.json"
        r = farmem(farmem_cmd, "run", "--threshold", "1M", "--local", "48M", "--summary-json", out, "--", semispace,
                   "--size", "32M", "--copies", "8", "--touches", "0", env=clean_env(FARMEM_LOOP_EVICT=rule),
                   timeout=300)
        assert r.returncode == 0 and "all pages checked" in r.stdout, r.stderr
        runs[rule] = json.loads(out.read_text())
    on, off = runs["1"], runs["0"]
    assert off["loop_evictions"] == 0 < on["loop_evictions"], (on, off)
    assert on["loop_back_run"] > 10 * on["loop_back_random"], (on, off)
    assert 0 < on["remote_reads"] <= off["remote_reads"] * 0.8, (on, off)


def test_a_run_larger_than_its_budget_is_told_what_a_larger_one_saves(tmp_path, farmem_cmd, built):
    """Random pages of 128 MiB at 32 MiB local: each page that comes back has left some budgets of
    evictions before, and the summary says how many faults twice and four times the budget would
    have saved; the same program within its budget is told nothing."""
    rewrite = built("build/bench/rewrite")
    out = tmp_path / "s.json"
    r = farmem(farmem_cmd, "run", "--local", "32M", "--summary-json", out, "--",
               rewrite, "--size", "128M", "--rounds", "200000", env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    # Uniform random over four budgets: about 28% back within one budget, 63% within three.
    assert 0 < s["refaults_soon"] < s["refaults_3budgets"] <= s["faults"], s
    assert 0.15 < s["refaults_soon"] / s["faults"] < 0.45 and 0.45 < s["refaults_3budgets"] / s["faults"] < 0.85, s
    hint = re.search(r"farmem: (\d+)% of the faults were pages back within one budget .* \((\d+)% within three\).*"
                     r"`--local 64M` would have saved about (\d+)% .*`--local 128M` about (\d+)%", r.stderr)
    assert hint, r.stderr
    assert int(hint[1]) == s["refaults_soon"] * 100 // s["faults"] == int(hint[3])
    assert int(hint[2]) == s["refaults_3budgets"] * 100 // s["faults"] == int(hint[4])
    r = farmem(farmem_cmd, "run", "--local", "32M", "--", rewrite, "--mode", "fit", "--size", "16M",
               "--rounds", "150000", env=clean_env(), timeout=300)
    assert r.returncode == 0 and "budget of evictions" not in r.stderr, r.stderr


def test_thrash_hint_keeps_a_percentage_a_percentage():
    from farmem.commands.run import thrash_hint
    base = {"processes": 1, "faults": 400_000, "refaults_soon": 200_000, "refaults_3budgets": 300_000,
            "local_limit_bytes": 100 << 20, "peak_limit_bytes": 110 << 20}
    hint = thrash_hint(base, "25%")
    assert "50% of the faults" in hint and "(75% within three)" in hint
    assert "`--local 50%` would have saved about 50% of the faults, `--local 100%` all of them" in hint
    assert "`--local 40%` would have saved about 50% of the faults, `--local 80%` about 75%" in thrash_hint(base, "20%")
    assert "`--local 100%` would have saved all of them of the faults" not in thrash_hint(base, "50%")
    assert "`--local 100%` would have saved all of the faults" in thrash_hint(base, "50%")
    # A byte budget: the highest limit in force, doubled, in whole MiB.
    assert "`--local 220M`" in thrash_hint(base, "100M") and "`--local 440M`" in thrash_hint(base, "100M")
    assert thrash_hint({**base, "refaults_soon": 10_000, "refaults_3budgets": 100_000}) is None  # a quarter
    assert thrash_hint({**base, "faults": 50_000}) is None                                        # too few to matter
    assert thrash_hint({"processes": 0, "faults": 0}) is None
    # A larger budget that would save next to nothing is not named (it said "about 0%" before session 39).
    few = thrash_hint({**base, "refaults_soon": 4_000}, "25%")
    assert "`--local 50%`" not in few and "`--local 100%` would have saved all of the faults" in few, few
    assert "`--local 440M` would have saved about 75%" in thrash_hint({**base, "refaults_soon": 4_000}, "100M")


def test_idle_budget_hint_only_for_a_percentage_that_never_bound():
    from farmem.commands.run import idle_budget_hint
    ran = {"processes": 1, "evictions": 0, "registered_bytes": 1 << 30, "peak_resident_bytes": 50 << 20,
           "local_limit_bytes": 256 << 20, "peak_limit_bytes": 256 << 20}
    hint = idle_budget_hint(ran, "25%")
    assert "`--local 25%` is 25% of the 1.0 GiB CMD registered (256.0 MiB)" in hint, hint
    assert "`--local 13M`, 25% of that, pages it" in hint, hint  # 12.5 MiB, rounded up
    assert idle_budget_hint(ran, "64M") is None                                   # a byte budget means what it says
    assert idle_budget_hint(ran, "100%") is None                                  # all of it local: nothing to page
    assert idle_budget_hint({**ran, "evictions": 1}, "25%") is None               # it bound
    assert idle_budget_hint({**ran, "peak_resident_bytes": 256 << 20}, "25%") is None  # it reached the budget
    assert idle_budget_hint({**ran, "registered_bytes": 90 << 20}, "60%") is None # most of it was touched
    assert idle_budget_hint({"processes": 0}, "25%") is None
    assert idle_budget_hint({**ran, "gc_faults": 10}, "25%") is None                   # a JVM's heap, by design


def test_unpaged_hint_only_when_most_of_the_resident_set_was_never_paged():
    from farmem.commands.run import unpaged_hint
    node = {"processes": 1, "peak_rss_bytes": 367 << 20, "peak_resident_bytes": 244 << 10,
            "local_limit_bytes": 1 << 20, "peak_limit_bytes": 1 << 20, "remote_writes": 0, "transport": "shm"}
    hint = unpaged_hint(node)
    assert "CMD had up to 367.0 MiB resident (its largest process)" in hint, hint
    assert "never more than 244.0 KiB of it: at least 366.8 MiB was memory farmem does not page" in hint, hint
    assert "`--threshold` (64.0 MiB)" in hint and "`--threshold` (1.0 MiB)" in unpaged_hint(node, "1M"), hint
    assert "`--threshold` (256.0 KiB)" in unpaged_hint(node, "262144")  # FARMEM_THRESHOLD holds bytes
    assert unpaged_hint({**node, "peak_rss_bytes": 60 << 20}) is None     # too little to matter
    assert unpaged_hint({**node, "peak_resident_bytes": 200 << 20}) is None  # mostly paged
    assert unpaged_hint({**node, "peak_limit_bytes": 200 << 20}) is None     # the budget is larger than the rest
    # Written to memd's store through the shared mapping: in CMD's resident set, not outside the budget.
    assert unpaged_hint({**node, "remote_writes": 80_000}) is None
    # ... each slot once, however often it was written: at most what was registered.
    assert unpaged_hint({**node, "remote_writes": 500_000, "registered_bytes": 29 << 20}) is not None
    assert unpaged_hint({**node, "remote_writes": 500_000, "registered_bytes": 320 << 20}) is None
    assert unpaged_hint({**node, "remote_writes": 80_000, "transport": "tcp"}) is not None
    assert unpaged_hint({**node, "processes": 0}) is None               # "no pager started" says it
    assert unpaged_hint({**node, "gc_faults": 10}) is None              # a JVM: its heap is what is paged


def test_summary_of_several_processes_says_its_figures_are_sums():
    """Each process under farmem has a budget of its own, and the summary adds them up: 101 processes
    of `--local 16M` read "local limit 1.6 GiB" with nothing beside it to say why."""
    from farmem.commands.run import summary_lines
    s = {"processes": 101, "local_limit_bytes": 101 * (16 << 20), "peak_limit_bytes": 0,
         "peak_resident_bytes": 230 << 20, "registered_bytes": 25 << 20, "transport": "shm",
         "fault_mode": "signal", "exit_status": 0, "elapsed_s": 1.9, "faults": 10, "wp_faults": 0,
         "zero_fills": 10, "remote_reads": 0, "remote_writes": 0, "evictions": 0, "evictions_clean": 0,
         "evictions_dirty": 0, "fault_p50_us": 2.0, "fault_p99_us": 9.0}
    line = summary_lines(s)[1]
    assert "local limit 1.6 GiB" in line and "101 processes (the limit, resident and registered figures are " \
        "their sums: each has a budget of its own)" in line, line
    assert "their sums" not in summary_lines({**s, "processes": 1})[1]


# --- --memd, farmem memd ------------------------------------------------------------------------

def test_unreachable_memd_never_starts_cmd(tmp_path, farmem_cmd):
    secret = tmp_path / "secret"
    secret.write_text("s" * 64)
    marker = tmp_path / "ran"
    start = time.monotonic()
    r = farmem(farmem_cmd, "run", "--memd", "tcp:127.0.0.1:1", "--secret-file", secret, "--",
               "touch", marker, env=clean_env())
    assert r.returncode == 78  # EX_CONFIG, as docs/knobs.md's table says
    assert r.stderr.startswith("farmem: error: cannot connect to memd at tcp:127.0.0.1:1: "), r.stderr
    assert r.stderr.count("tcp:127.0.0.1:1") == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert not marker.exists()
    assert time.monotonic() - start < 20


def test_missing_secret_file_is_an_error(tmp_path, farmem_cmd):
    r = farmem(farmem_cmd, "run", "--memd", "127.0.0.1:1", "--secret-file", tmp_path / "nope", "--",
               "true", env=clean_env())
    assert r.returncode == 1 and "farmem: error: cannot read the secret file" in r.stderr


@pytest.fixture
def memd_server(tmp_path, farmem_cmd):
    """`farmem memd` on a Unix socket in tmp_path, with a generated secret: (address, secret path)."""
    sock = tmp_path / "memd.sock"
    m = None
    proc = subprocess.Popen([*farmem_cmd, "memd", "--unix", str(sock), "--capacity", "64M"],
                            stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        first = proc.stderr.readline()
        m = re.search(r"memd secret written to (\S+)", first)
        assert m, f"no secret path in {first!r}"
        secret = Path(m.group(1))
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "memd never listened"
            time.sleep(0.02)
        yield f"unix:{sock}", secret
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        if m and secret.parent.name.startswith("farmem-memd-"):
            shutil.rmtree(secret.parent, ignore_errors=True)


@pytest.mark.memd
@pytest.mark.pager
def test_farmem_memd_and_run_against_it(memd_server, tmp_path, farmem_cmd):
    address, secret_file = memd_server
    secret = secret_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", secret)
    assert secret_file.stat().st_mode & 0o777 == 0o600

    marker = tmp_path / "ran"
    wrong = tmp_path / "wrong"
    wrong.write_text("0" * 64)
    r = farmem(farmem_cmd, "run", "--memd", address, "--secret-file", wrong, "--", "touch", marker,
               env=clean_env())
    assert r.returncode == 78 and f"farmem: error: memd at {address} rejected the secret" in r.stderr
    assert not marker.exists()

    out = tmp_path / "seen"
    r = farmem(farmem_cmd, "run", "--memd", address, "--", "sh", "-c",
               f'echo "$FARMEM_MEMD $FARMEM_SECRET" > {out}', env=clean_env(FARMEM_SECRET=secret))
    assert r.returncode == 0, r.stderr
    assert out.read_text().split() == [address, secret]


def test_memd_flags_translate_one_to_one():
    from farmem.commands import memd
    args = main.get_command_parser().parse_args(
        ["memd", "--listen", "10.0.0.2:7070", "--listen", ":7071", "--capacity", "64G",
         "--threads", "4", "--log", "info", "--session-quota", "1G"])
    assert memd.memd_argv(args, "/b/farmem-memd", "/s") == [
        "/b/farmem-memd", "--listen", "10.0.0.2:7070", "--listen", ":7071", "--capacity", str(64 << 30),
        "--secret-file", "/s", "--session-quota", str(1 << 30), "--threads", "4", "--log", "info"]
    args = main.get_command_parser().parse_args(["memd", "--unix", "/tmp/x.sock"])
    assert memd.memd_argv(args, "m", "/s") == ["m", "--unix", "/tmp/x.sock", "--secret-file", "/s"]
    args = main.get_command_parser().parse_args(["memd", "--unix", "/tmp/x.sock", "--idmap"])
    assert memd.memd_argv(args, "m", "/s") == ["m", "--unix", "/tmp/x.sock", "--secret-file", "/s",
                                               "--idmap"]


@pytest.mark.parametrize("flags", [["--listen", "nohost"], ["--capacity", "12q"], ["--threads", "0"],
                                   ["--listen", "h:70000"], ["--bogus"]])
def test_memd_rejects_bad_flags(flags, capsys):
    status, _, err = cli(capsys, "memd", *flags)
    assert status == 2 and err.startswith("farmem memd: error: ") and len(err.splitlines()) == 1


# --- the residency map and farmem stat ------------------------------------------------------------

def test_resmap_layout_matches_the_c_header(built):
    prog = built("build/tests/fm_layout")
    c = json.loads(subprocess.run([prog], capture_output=True, text=True, check=True).stdout)
    for key, value in resmap.layout().items():
        assert c[key] == value, key
    assert (c["magic"], c["version"], c["map_offset"]) == (resmap.MAGIC, resmap.VERSION, resmap.MAP_OFFSET)
    assert c["lat_floor"] == [resmap.lat_bucket_floor(b) for b in range(resmap.LAT_BUCKETS)]
    assert [[ns, resmap.lat_bucket(ns)] for ns, _ in c["lat_bucket"]] == c["lat_bucket"]


def test_percentiles():
    hist = [0] * resmap.LAT_BUCKETS
    assert resmap.percentile_us(hist, 50) == 0.0
    hist[resmap.lat_bucket(10)] = 50
    hist[resmap.lat_bucket(4096)] = 49
    hist[resmap.lat_bucket(10 ** 9)] = 1
    assert resmap.percentile_us(hist, 50) == 0.01     # 10 ns
    assert resmap.percentile_us(hist, 99) == 4.1      # 4096 ns, 2 decimals
    assert resmap.percentile_us(hist, 100) == round(resmap.lat_bucket_floor(resmap.lat_bucket(10 ** 9)) / 1000, 2)
    for ns in (8, 100, 12345, 10 ** 6):
        assert resmap.lat_bucket_floor(resmap.lat_bucket(ns)) <= ns
        assert resmap.lat_bucket(resmap.lat_bucket_floor(resmap.lat_bucket(ns))) == resmap.lat_bucket(ns)


# A process holding a residency map with known page states, like a paged process would.
FAKE_MAPPED = textwrap.dedent("""
    import mmap, os, sys
    sys.path.insert(0, sys.argv[1])
    from farmem import resmap
    size = resmap.MAP_OFFSET + 64
    fd = os.memfd_create("farmem-map")
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    h = resmap.ResmapHdr.from_buffer(mm)
    h.magic, h.version, h.page_shift, h.hdr_size = resmap.MAGIC, resmap.VERSION, 12, resmap.MAP_OFFSET
    h.pid, h.swap_epoch, h.gc_cycles, h.nregions, h.transport = os.getpid(), 7, 3, 101, 1
    h.memd = b"unix:/tmp/x.sock"
    h.stats.faults, h.stats.registered_pages, h.stats.resident_pages = 42, 8, 4
    h.stats.local_limit_pages, h.stats.peak_resident_pages, h.stats.adopt_peak_pages = 4, 4, 6
    h.stats.adopt_evictions = 2
    h.stats.remaps, h.stats.remap_pages_resident, h.stats.remap_pages_kept = 3, 5, 11
    r = h.regions[0]
    r.base, r.npages, r.map_offset, r.flags = 0x7f0000000000, 8, resmap.MAP_OFFSET, 1 | 2 | 8
    h.regions[1].npages = 99                     # a slot not flagged live: not a region
    r = h.slot(100)                              # past the first table: more_regions[36]
    r.base, r.npages, r.map_offset, r.flags = 0x7f1000000000, 8, resmap.MAP_OFFSET, 1
    mm[resmap.MAP_OFFSET:resmap.MAP_OFFSET + 8] = bytes([2, 4 | 0x10, 6 | 0x08, 1, 0, 3, 5, 7])
    print("ready", flush=True)
    sys.stdin.read()
""")


def test_stat_reads_a_residency_map(tmp_path, capsys):
    script = tmp_path / "mapped.py"
    script.write_text(FAKE_MAPPED)
    proc = subprocess.Popen([sys.executable, script, CLI_SRC], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        status, out, err = cli(capsys, "stat", proc.pid, "--json")
        assert status == 0, err
        s = json.loads(out)
        assert SUMMARY_KEYS - {"exit_status", "elapsed_s"} <= s.keys()
        assert (s["pid"], s["swap_epoch"], s["gc_cycles"], s["faults"]) == (proc.pid, 7, 3, 42)
        assert s["transport"] == "stream" and s["memd"] == "unix:/tmp/x.sock"
        assert s["registered_bytes"] == 8 * 4096
        assert len(s["regions"]) == 2 and (s["regions"][1]["slot"], s["regions"][1]["base"]) == (100, 0x7F1000000000)
        region = s["regions"][0]
        assert (region["base"], region["npages"], region["flags"]) == (0x7F0000000000, 8, ["heap", "sparse"])
        assert (s["adopt_peak_bytes"], s["adopt_evictions"]) == (6 * 4096, 2)
        # clean, dirty, remote, filling, untouched, updating, leaving, unmanaged
        assert (region["resident"], region["remote"], region["dirty"]) == (4, 2, 1)
        assert (region["untouched"], region["unmanaged"], region["filling"]) == (1, 1, 1)

        status, out, _ = cli(capsys, "stat", proc.pid)
        assert status == 0 and out.startswith(f"pid {proc.pid}: 2 regions") and "region 0x7f0000000000" in out and "region 0x7f1000000000" in out
        assert "(peak 16.0 KiB; 24.0 KiB resident when registered, over the limit: 2 pages evicted at once)" in out
        assert "mremaps 3: 5 resident pages moved by the kernel, 11 pages in memd stayed in their slots" in out
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_stat_errors(capsys):
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    status, _, err = cli(capsys, "stat", pid)
    assert status == 1 and err == f"farmem: error: no process with pid {pid}\n"
    status, _, err = cli(capsys, "stat", os.getpid())
    assert status == 1 and f"pid {os.getpid()} is not running under farmem" in err
    assert cli(capsys, "stat", "abc")[0] == 2


@pytest.mark.memd
@pytest.mark.pager
def test_stat_of_a_process_under_farmem_run(tmp_path, farmem_cmd, capsys):
    """The map of a real pager, read from outside while the program runs."""
    program = textwrap.dedent("""
        import mmap, os, sys
        m = mmap.mmap(-1, 96 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, len(m), 4096):
            m[off] = 1
        print(os.getpid(), flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([*farmem_cmd, "run", "--local", "32M", "--", sys.executable, "-c", program],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env())
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), proc.stderr.read() if proc.poll() is not None else line
        status, out, err = cli(capsys, "stat", int(line), "--json")
        assert status == 0, err
        s = json.loads(out)
        assert s["map_pid"] == int(line)
        assert s["registered_bytes"] >= 96 << 20 and s["local_limit_bytes"] == 32 << 20
        assert s["faults"] > 0 and s["zero_fills"] >= (96 << 20) // 4096  # each page touched once
        assert sum(r["resident"] for r in s["regions"]) <= (32 << 20) // 4096
        assert sum(r["remote"] for r in s["regions"]) > 0
    finally:
        proc.stdin.close()
        proc.wait(60)


# --- exit statuses: one test per row of docs/knobs.md's table ---------------------------------------

KNOBS_MD = Path(__file__).resolve().parent.parent / "docs" / "knobs.md"


def documented_statuses() -> list:
    text = KNOBS_MD.read_text().split("## Exit statuses", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| status")]
    return [row.split("|")[1].strip() for row in rows]


def _sigint_while_farmem_waits(farmem_cmd, tmp_path, _wait_paging):
    # SIGINT as a terminal sends it: a test run started in the background (`cmd &` in a script)
    # ignores SIGINT, the child inherits that, and Python then leaves it ignored.
    proc = subprocess.Popen([*farmem_cmd, "top", "--once", "--no-bpf", "60"], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Once Python is up and in the interval's sleep (a loaded machine may take longer than a fixed wait).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if "nanosleep" in Path(f"/proc/{proc.pid}/wchan").read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(30)
    assert "interrupted" in proc.stderr.read()
    return rc


def _memd_lost(farmem_cmd, tmp_path, wait_paging):
    """A page in memd that cannot be read back: the pager stops the program with 70."""
    sock = tmp_path / "m.sock"
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    build = CLI_SRC.parent.parent / "build"
    memd = subprocess.Popen([build / "bin" / "farmem-memd", "--unix", sock, "--secret-file", secret,
                             "--capacity", "256M"], env=clean_env(), stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline and memd.poll() is None, "memd never listened"
            time.sleep(0.02)
        # stream: with shm the store stays mapped in the program after memd dies
        run = subprocess.Popen([*farmem_cmd, "run", "--local", "16M", "--transport", "stream", "--memd",
                                f"unix:{sock}", "--secret-file", secret, "--", build / "tests" / "pagetest",
                                "--size", "64M", "--rounds", "1000"], env=clean_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_paging(run, "pagetest")
        memd.kill()
        return run.wait(60)
    finally:
        if memd.poll() is None:
            memd.kill()
        memd.wait()


EXIT_CASES = {
    "0": lambda f, t, w: farmem(f, "run", "--", "true", env=clean_env()).returncode,
    "CMD's": lambda f, t, w: farmem(f, "run", "--", "sh", "-c", "exit 7", env=clean_env()).returncode - 7,
    "128+N": lambda f, t, w: farmem(f, "run", "--", "sh", "-c", "kill -TERM $$", env=clean_env()).returncode - 128
    - signal.SIGTERM,
    "1": lambda f, t, w: farmem(f, "stat", os.getpid(), env=clean_env()).returncode,
    "2": lambda f, t, w: farmem(f, "run", "--bogus", "--", "true", env=clean_env()).returncode,
    "70": _memd_lost,
    "78": lambda f, t, w: farmem(f, "run", "--memd", "tcp:127.0.0.1:1", "--", "true",
                                 env=clean_env(FARMEM_SECRET="s")).returncode,
    "126": lambda f, t, w: farmem(f, "run", "--", "/etc/hostname", env=clean_env()).returncode,
    "127": lambda f, t, w: farmem(f, "run", "--", "/nonexistent/cmd", env=clean_env()).returncode,
    "130": _sigint_while_farmem_waits,
}


def test_every_documented_status_has_a_test():
    assert documented_statuses() == list(EXIT_CASES)


@pytest.mark.memd
@pytest.mark.pager
@pytest.mark.parametrize("status", list(EXIT_CASES))
def test_exit_status(status, farmem_cmd, tmp_path, built, wait_paging):
    built("build/tests/pagetest")
    want = 0 if status in ("CMD's", "128+N") else int(status)  # those two return the difference
    assert EXIT_CASES[status](farmem_cmd, tmp_path, wait_paging) == want


@pytest.mark.memd
def test_memd_in_the_foreground_removes_its_secret_directory(tmp_path, farmem_cmd):
    sock = tmp_path / "memd.sock"
    for signo in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([*farmem_cmd, "memd", "--unix", str(sock), "--capacity", "64M"],
                                stderr=subprocess.PIPE, text=True, env=clean_env())
        try:
            m = re.search(r"memd secret written to (\S+)", proc.stderr.readline())
            assert m
            secret_dir = Path(m.group(1)).parent
            deadline = time.monotonic() + 20
            while not sock.exists():
                assert proc.poll() is None and time.monotonic() < deadline, "memd never listened"
                time.sleep(0.02)
            assert secret_dir.is_dir()
            proc.send_signal(signo)
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
        assert not secret_dir.exists(), f"{secret_dir} outlived memd ({signo.name})"
        assert processes_mentioning(str(sock)) == [], "memd outlived farmem memd"
        sock.unlink(missing_ok=True)


def test_gc_hint_only_when_the_collector_paged_most():
    from farmem.commands.run import gc_hint
    base = {"processes": 1, "faults": 400_000}
    hint = gc_hint({**base, "gc_faults": 300_000})
    assert hint and "75% of the faults (300000)" in hint and "--gc farmem" in hint
    assert "InitiatingHeapOccupancyPercent" not in hint                    # marking took none of them
    hint = gc_hint({**base, "gc_faults": 300_000, "gc_conc_faults": 100_000})
    assert "concurrent marking took 100000 of them" in hint and "InitiatingHeapOccupancyPercent=100" in hint
    assert "InitiatingHeapOccupancyPercent" not in gc_hint({**base, "gc_faults": 300_000, "gc_conc_faults": 70_000})
    # Marking whose cycles end in a full GC (about one for each remark, or none) is named at a lower share.
    cut = {**base, "gc_faults": 300_000, "gc_conc_faults": 60_000, "full_gcs": 11, "remark_pauses": 2}
    hint = gc_hint(cut)
    assert "its cycles ended in a full GC (11 full GCs, 2 remarks)" in hint, hint
    assert "InitiatingHeapOccupancyPercent=100" in hint and "took 60000 of them" in hint, hint
    assert "InitiatingHeapOccupancyPercent=100" in gc_hint({**cut, "remark_pauses": 12})  # each cycle, then a full GC
    assert "InitiatingHeapOccupancyPercent" not in gc_hint({**cut, "remark_pauses": 13})  # mixed collections helped
    assert "InitiatingHeapOccupancyPercent" not in gc_hint({**cut, "full_gcs": 2, "remark_pauses": 0})
    assert "InitiatingHeapOccupancyPercent" not in gc_hint({**cut, "gc_conc_faults": 20_000})  # marking paged little
    assert gc_hint({**base, "gc_faults": 150_000}) is None      # under half of the faults
    assert gc_hint({"processes": 1, "faults": 60_000, "gc_faults": 50_000}) is None  # too few to matter
    assert gc_hint({"processes": 0, "faults": 0, "gc_faults": 0}) is None
    # The farmem JDK changes G1 only: Shenandoah's users are pointed at G1, Parallel's at nothing.
    hint = gc_hint({**base, "gc_faults": 300_000}, "Shenandoah")
    assert hint and "Shenandoah's threads took 75%" in hint and "--gc farmem" not in hint
    assert gc_hint({**base, "gc_faults": 300_000}, "UseParallelGC") is None


def test_collector_of_a_java_command(monkeypatch):
    from farmem.java import collector
    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    monkeypatch.delenv("JDK_JAVA_OPTIONS", raising=False)
    assert collector(["java", "-Xmx1g", "-jar", "app.jar", "-XX:+UseShenandoahGC"]) == "G1"  # an app argument
    assert collector(["java", "-XX:+UseShenandoahGC", "-Xmx1g", "Main"]) == "Shenandoah"
    assert collector(["java", "-XX:+UseParallelGC", "Main"]) == "UseParallelGC"
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+UseShenandoahGC")
    assert collector(["java", "Main"]) == "Shenandoah"


def test_adoption_over_the_budget_is_said_against_its_highest():
    """ffmpeg's heaps, adopted at 45.8 MiB resident under a 25% budget of 50.9 MiB that later fell
    to 1.2 MiB, were reported "over the limit: 0 pages evicted at once"."""
    mib = 1 << 20
    fell = {"adopt_peak_bytes": 46 * mib, "adopt_evictions": 0, "local_limit_bytes": 1 * mib,
            "peak_limit_bytes": 51 * mib}
    assert resmap.adopt_note(fell) == ""
    over = {**fell, "adopt_peak_bytes": 60 * mib, "adopt_evictions": 2304}
    assert resmap.adopt_note(over) == "60.0 MiB resident when registered, over the limit: 2304 pages evicted at once"
    older_map = {"adopt_peak_bytes": 8 * mib, "adopt_evictions": 1024, "local_limit_bytes": 4 * mib}
    assert "over the limit: 1024 pages" in resmap.adopt_note(older_map)


def test_memd_stop_wakes_at_the_exit_and_times_out_on_a_process_that_stays():
    """embedded_memd.wait_exit: the exit status as soon as the process is gone (woken by its pidfd, not
    a polling sleep), TimeoutExpired with the process still running when it outlasts the timeout."""
    from farmem.embedded_memd import wait_exit
    quick = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 7"])
    t0 = time.monotonic()
    assert wait_exit(quick, 10) == 7
    assert 0.25 <= time.monotonic() - t0 < 5
    slow = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_exit(slow, 0.2)
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
    assert wait_exit(slow, 1) == -signal.SIGKILL  # reaped already: Popen's own status
