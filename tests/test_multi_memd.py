# SPDX-License-Identifier: Apache-2.0
"""Several memd servers (memd/client/multi.c), over real TCP between network namespaces.

Each memd runs in a namespace of its own, joined to the root namespace by a veth pair that
the test creates (10.99.S.2 in the namespace, 10.99.S.1 in the root one, S unique to this
test process); the workload (build/tests/pagetest under `farmem run`) runs in the root
namespace. Failures: kill -9 of a memd (R=2 and R=1), a partition (the namespace's link
set down), a slow server (netem delay, or a tbf rate limit) and a memd stopped with SIGSTOP
(its connections stay open, nothing answers). Every namespace and link is deleted by the
fixture, also on failure; only the ones this file created.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

pytestmark = [pytest.mark.memd, pytest.mark.pager, pytest.mark.root]

SECRET = "multi-memd-test-secret"
PORT = 7070
PAGETEST = ["--size", "256M", "--threads", "8", "--rounds", "2"]
RUN_TIMEOUT_S = 300  # generous: a loaded 2-CPU CI machine runs these 2-3x slower than an idle one


def _need_root_netns():
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if not shutil.which("ip"):
        pytest.skip("needs ip (iproute2)")


def sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class Host:
    """One memory host: a namespace, a veth pair, a farmem-memd listening on its address."""

    def __init__(self, tag, idx, subnet):
        self.ns = f"fm{tag}h{idx}"
        self.veth_root = f"fm{tag}r{idx}"
        self.veth_ns = f"fm{tag}n{idx}"
        self.addr = f"10.99.{subnet}.2"
        self.root_addr = f"10.99.{subnet}.1"
        self.proc = None
        self.log = None

    @property
    def memd(self):
        return f"{self.addr}:{PORT}"

    def create(self):
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_ns)
        sh("ip", "link", "set", self.veth_ns, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.root_addr}/24", "dev", self.veth_root)
        sh("ip", "link", "set", self.veth_root, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.addr}/24", "dev", self.veth_ns)
        sh("ip", "-n", self.ns, "link", "set", self.veth_ns, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def start_memd(self, memd_bin, secret_file, logdir, extra=()):
        self.log = open(logdir / f"{self.ns}.log", "w")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, str(memd_bin), "--listen", self.memd,
             "--secret-file", str(secret_file), "--capacity", "1G", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memd in {self.ns} exited with {self.proc.returncode}")
            try:
                socket.create_connection((self.addr, PORT), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"memd in {self.ns} did not listen on {self.memd}")

    def stop(self):
        """SIGSTOP: the server stays, its connections stay open, and nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def kill9(self):
        # `ip netns exec` execs memd itself: this pid is the server.
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def destroy(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.log:
            self.log.close()
        sh("ip", "netns", "del", self.ns, check=False)          # takes veth_ns with it
        sh("ip", "link", "del", self.veth_root, check=False)   # gone already, normally


def _sweep_stale():
    """Namespaces and links an earlier run of this file left behind when it was killed (fixtures
    do not run on SIGKILL): only names of our own pattern whose test process is gone."""
    import re
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        m = re.match(r"^(fm(\d+)h\d+)\b", line)
        if not m or os.path.exists(f"/proc/{m.group(2)}"):
            continue
        for pid in sh("ip", "netns", "pids", m.group(1), check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", m.group(1), check=False)
    for line in sh("ip", "-br", "link", check=False).stdout.splitlines():
        m = re.match(r"^(fm(\d+)r\d+)@", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            sh("ip", "link", "del", m.group(1), check=False)


@pytest.fixture
def hosts(tmp_path, built):
    _need_root_netns()
    _sweep_stale()
    memd_bin = built("build/bin/farmem-memd")
    built("build/tests/pagetest")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    tag = f"{os.getpid() % 100000}"
    base = 10 + (os.getpid() % 48) * 5  # five subnets per test process, 10..254
    made = []

    def make(n, extra=()):
        for i in range(n):
            h = Host(tag, len(made), base + len(made))
            made.append(h)
            h.create()
            h.start_memd(memd_bin, secret_file, tmp_path, extra)
        return made[-n:]

    make.secret_file = secret_file
    make.tmp = tmp_path
    try:
        yield make
    finally:
        for h in made:
            h.destroy()


def farmem_run(farmem_cmd, build, hs, secret_file, summary, replicas, extra=(), size=PAGETEST):
    argv = [*farmem_cmd, "run", "--local", "25%", "--memd", ",".join(h.memd for h in hs),
            "--secret-file", str(secret_file), "--replicas", str(replicas),
            "--summary-json", str(summary), *extra, "--", str(build / "tests" / "pagetest"), *size]
    # A session of its own: on a timeout the whole group (farmem and the workload) goes.
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def finish(proc):
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"workload did not finish in {RUN_TIMEOUT_S} s:\n{err[-3000:]}")
    return proc.returncode, out, err


def wait_evicting(summary_dir, proc, seconds):
    """Let the workload get into its rewrite phase (evicting) before we break something."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "the workload ended before the failure was injected"


def stats(summary):
    return json.loads(summary.read_text())


def test_kill9_one_memd_r2_every_byte_checks_out(hosts, farmem_cmd, build):
    hs = hosts(3)
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=2)
    wait_evicting(hosts.tmp, p, 3.0)
    hs[1].kill9()
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    # A loss the run survives is a warning that says what it costs and that it mends.
    assert f"farmem: warning: lost memd at {hs[1].memd}" in err, err[-3000:]
    assert "now 1 copy (replicas=2); 2 memd servers are left: re-replicating them" in err, err[-3000:]
    assert "farmem: error" not in err, err[-3000:]
    s = stats(summary)
    assert s["memd_servers_lost"] == 1
    assert s["memd_servers_live"] == 2


def test_kill9_one_of_two_memds_r2_single_copies_counted_and_said(hosts, farmem_cmd, build):
    """R=2 over two memds, one killed: pages now have one copy and no server can take a second.
    The warning says so, and every write since counts as degraded (fewer than R copies)."""
    hs = hosts(2)
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=2)
    wait_evicting(hosts.tmp, p, 3.0)
    hs[0].kill9()
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    assert f"farmem: warning: lost memd at {hs[0].memd}" in err, err[-3000:]
    assert "now 1 copy (replicas=2); 1 memd server is left: too few to re-replicate" in err, err[-3000:]
    s = stats(summary)
    assert s["memd_servers_lost"] == 1, s
    assert s["memd_degraded_writes"] > 0, s
    assert s["memd_rereplicated"] == 0, s


def test_kill9_one_memd_r1_clear_message_never_wrong_data(hosts, farmem_cmd, build):
    hs = hosts(2)
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=1)
    wait_evicting(hosts.tmp, p, 3.0)
    hs[0].kill9()
    rc, out, err = finish(p)
    both = out + err
    assert f"lost memd at {hs[0].memd}" in err
    assert "mismatch" not in both.lower() and "FAIL" not in both
    if rc == 0:  # it never needed a page that lived only there
        assert "pagetest: OK" in both
    else:
        assert rc == 70, err[-3000:]
        assert f"held only by memd at {hs[0].memd}" in err
        assert "cannot be read back" in err


def test_partition_link_down_fails_over(hosts, farmem_cmd, build):
    hs = hosts(3)
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=2,
                   extra=("--memd-timeout", "300"))
    wait_evicting(hosts.tmp, p, 3.0)
    sh("ip", "-n", hs[2].ns, "link", "set", hs[2].veth_ns, "down")
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    s = stats(summary)
    assert s["memd_timeouts"] + s["memd_servers_lost"] > 0, s
    assert s["memd_failovers"] > 0, s
    assert f"memd at {hs[2].memd}" in err


def test_slow_server_times_out_and_fails_over(hosts, farmem_cmd, build, wait_paging):
    if not shutil.which("tc"):
        pytest.skip("needs tc (iproute2)")
    hs = hosts(3)
    summary = hosts.tmp / "s.json"
    # A smaller run than the others: through a server this slow, the time goes to timeouts, and a
    # loaded CI machine took over 300 s for the full-size run (it takes ~70 s alone).
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=2,
                   extra=("--memd-timeout", "200"), size=("--size", "96M", "--threads", "4", "--rounds", "1"))
    wait_paging(p, "pagetest")
    tc = ["ip", "netns", "exec", hs[0].ns, "tc", "qdisc", "add", "dev", hs[0].veth_ns, "root"]
    r = sh(*tc, "netem", "delay", "600ms", check=False)
    if r.returncode != 0:
        # No sch_netem in this kernel: a 200 kbit/s token bucket makes the server just as slow
        # (a 4 KiB page takes ~160 ms, a batch of them far more than the 200 ms timeout).
        r = sh(*tc, "tbf", "rate", "200kbit", "burst", "4kb", "latency", "2s", check=False)
    if r.returncode != 0:
        kill_group(p)
        finish(p)
        pytest.skip(f"neither netem nor tbf: {r.stderr.strip()}")
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    s = stats(summary)
    # Through tbf a lone page comes in ~160 ms, under the timeout, and a batch far over it. The
    # slow server is asked last once it timed out, or once it answered in over half the timeout:
    # one that never quite times out must not serve every fault at its pace (issue 17's hang).
    timed_out = f"memd at {hs[0].memd} did not answer within 200 ms" in err
    slow = f"memd at {hs[0].memd} answers slowly" in err
    assert timed_out or slow, err[-3000:]
    if timed_out:
        assert s["memd_timeouts"] > 0, s
        assert s["memd_failovers"] > 0, s


def wait_remote_reads(farmem_cmd, pid, proc, seconds=60.0):
    """Until the workload reads pages back from memd: a failure injected then hits reads in flight."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        r = subprocess.run([*farmem_cmd, "stat", str(pid), "--json"], capture_output=True, text=True)
        if r.returncode == 0 and json.loads(r.stdout).get("remote_reads", 0) > 100:
            return
        time.sleep(0.05)
    assert proc.poll() is None, "the workload ended before it read pages back"
    pytest.fail(f"no remote reads within {seconds} s")


def test_sigstop_only_memd_stops_program_70_within_timeout(hosts, farmem_cmd, build, wait_paging):
    """One memd, stopped mid-read with its connections open: every call has a deadline, so the
    program stops with status 70 and a clear message within the timeout, not never."""
    hs = hosts(1)
    summary = hosts.tmp / "s.json"
    timeout_ms = 500
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=1,
                   extra=("--memd-timeout", str(timeout_ms)),
                   size=("--size", "128M", "--threads", "4", "--rounds", "20"))
    pid = wait_paging(p, "pagetest")
    wait_remote_reads(farmem_cmd, pid, p)
    hs[0].stop()
    t0 = time.monotonic()
    rc, out, err = finish(p)
    took = time.monotonic() - t0
    assert rc == 70, err[-3000:]
    assert f"memd at {hs[0].memd} did not answer within {timeout_ms} ms" in err, err[-3000:]
    assert "cannot be read back" in err
    assert "mismatch" not in (out + err).lower()
    # A read in flight waits one timeout; a write the evictor had sent, one more. Plus start-up of
    # the exit (summary, unregister) on a loaded machine.
    assert took < 2 * timeout_ms / 1000 + 10, f"{took:.1f} s after SIGSTOP"


def test_sigstop_one_of_two_memds_r2_every_byte_checks_out(hosts, farmem_cmd, build, wait_paging):
    """Two memds with every page on both; one is stopped mid-read: reads fail over to the other
    within the timeout, the stopped one is given up, and every byte of the workload checks out."""
    hs = hosts(2)
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=2,
                   extra=("--memd-timeout", "300"),
                   size=("--size", "128M", "--threads", "4", "--rounds", "3"))
    pid = wait_paging(p, "pagetest")
    wait_remote_reads(farmem_cmd, pid, p)
    hs[1].stop()
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    assert f"memd at {hs[1].memd} did not answer within 300 ms" in err
    s = stats(summary)
    assert s["memd_timeouts"] > 0, s
    # The run went on past the stopped server: reads retried on the other one, or (when the
    # timeouts that gave it up came from writes) writes that reached only the other one.
    assert s["memd_failovers"] + s["memd_degraded_writes"] > 0, s
    assert s["memd_servers_lost"] == 1, s


def test_memd_beyond_loopback_refuses_to_start_without_secret(hosts, built):
    hs = hosts(1)
    memd_bin = built("build/bin/farmem-memd")
    env = {k: v for k, v in os.environ.items() if k != "FARMEM_SECRET"}
    r = subprocess.run(["ip", "netns", "exec", hs[0].ns, str(memd_bin), "--listen",
                        f"{hs[0].addr}:{PORT + 1}"], capture_output=True, text=True, timeout=10, env=env)
    assert r.returncode != 0
    assert "secret is required" in r.stderr


def test_session_quota_keeps_pages_local_and_correct(hosts, farmem_cmd, build):
    """Two memds that each take at most 8 MiB of this client: the rest stays local, all correct."""
    hs = hosts(2, extra=("--session-quota", "8M"))
    summary = hosts.tmp / "s.json"
    p = farmem_run(farmem_cmd, build, hs, hosts.secret_file, summary, replicas=1,
                   size=["--size", "64M", "--threads", "4", "--rounds", "1"])
    rc, out, err = finish(p)
    assert rc == 0, err[-3000:]
    assert "pagetest: OK" in out + err
    s = stats(summary)
    assert s["memd_full"] > 0, s
    assert s["remote_writes"] > 0, s


def test_two_pagers_share_memds_without_seeing_each_other(hosts, farmem_cmd, build):
    """Two real clients, same secret, same servers: each finds only its own bytes."""
    hs = hosts(2)
    procs = [farmem_run(farmem_cmd, build, hs, hosts.secret_file, hosts.tmp / f"s{k}.json", replicas=2,
                        size=["--size", "64M", "--threads", "4", "--rounds", "2", "--seed", str(k + 7)])
             for k in range(2)]
    for p in procs:
        rc, out, err = finish(p)
        assert rc == 0, err[-3000:]
        assert "pagetest: OK" in out + err
    for k in range(2):
        assert stats(hosts.tmp / f"s{k}.json")["remote_reads"] > 0
