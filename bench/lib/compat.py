# SPDX-License-Identifier: Apache-2.0
"""The compatibility matrix's workloads (issue 19, docs/compatibility.md): programs from Debian's
packages, each loaded with its own client where it has one and checked byte for byte.

tests/test_compat.py runs them on small data under `farmem run --local 25%`; bench/bench_compat.py
runs them on large data under `farmem run` and under Linux swap at the same budget
(`farmem run --mode kswap`), and with no limit at all.

Every workload takes a Launch (how to start a program: which mode, which budget) and a work
directory, returns a dict of figures, and raises Failed with the reason when a result is wrong.
Servers listen on Unix sockets in the work directory, so runs never collide. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"  # Debian's, with Debian's python3-numpy


class Failed(AssertionError):
    """A workload's result is wrong, or it could not run; the message says which."""


@dataclass
class Launch:
    """How to start a program: mode 'farmem' (the pager), 'kswap' (Linux swap under a memory
    cgroup, `farmem run --mode kswap`) or 'local' (no limit); --local and --threshold as given."""
    mode: str = "farmem"
    local: str = "25%"
    threshold: str | None = None
    extra: list = field(default_factory=list)
    farmem: list = field(default_factory=lambda: [str(REPO / "farmem")])

    def argv(self, cmd: list, summary: Path | None) -> list:
        cmd = [str(c) for c in cmd]
        if self.mode == "local":
            return cmd
        argv = [*self.farmem, "run"]
        if self.mode == "kswap":
            argv += ["--mode", "kswap"]
        argv += ["--local", self.local]
        if self.threshold:
            argv += ["--threshold", str(self.threshold)]
        if summary:
            argv += ["--summary-json", str(summary)]
        return argv + [*self.extra, "--", *cmd]


def read_summary(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path and path.exists() else None


def run(launch: Launch, cmd: list, workdir: Path, name: str, timeout: float = 1800, **kw) -> tuple:
    """Run a program to completion: (CompletedProcess, summary or None, seconds)."""
    summary = workdir / f"{name}-summary.json"
    t0 = time.monotonic()
    r = subprocess.run(launch.argv(cmd, summary), capture_output=True, text=True, timeout=timeout,
                       cwd=workdir, **kw)
    return r, read_summary(summary), time.monotonic() - t0


def run_checked(launch: Launch, cmd: list, workdir: Path, name: str, want: str, timeout: float = 1800) -> dict:
    """Run a program that prints its answer last: its summary, seconds and stderr, or Failed when it
    exited non-zero or printed another answer than want."""
    r, summary, secs = run(launch, cmd, workdir, name, timeout=timeout)
    out = r.stdout.strip().splitlines()
    if r.returncode != 0 or not out or out[-1] != want:
        raise Failed(f"{name}: exit {r.returncode}: got {(out[-1] if out else '')!r}, want {want!r}: {r.stderr[-1500:]}")
    return {"summary": summary, "seconds": round(secs, 2), "stderr": r.stderr}


class Server:
    """A server under a Launch, up once its Unix socket accepts; stop() ends it and returns
    (exit status, summary). Its output goes to WORKDIR/NAME.log."""

    def __init__(self, launch: Launch, cmd: list, workdir: Path, name: str, sock: Path):
        self.summary = workdir / f"{name}-summary.json"
        self.log = workdir / f"{name}.log"
        self.sock = sock
        self.name = name
        # kswap mode waits for bench/lib/swap.py's machine-wide lock while another run holds it
        self.start_timeout = 1800 if launch.mode == "kswap" else 60
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(launch.argv(cmd, self.summary), stdout=out, stderr=subprocess.STDOUT,
                                         cwd=workdir, start_new_session=True)
        self.t0 = time.monotonic()

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = timeout or self.start_timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"{self.name} exited with status {self.proc.returncode} before it was ready:\n"
                             f"{self.output()}")
            try:
                connect(self.sock).close()
                return
            except OSError:
                time.sleep(0.05)
        raise Failed(f"{self.name} did not listen on {self.sock} within {timeout:.0f} s:\n{self.output()}")

    def output(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""

    def stop(self, how=None, timeout: float = 120) -> tuple:
        """how(): asks the server to exit (else SIGTERM, which farmem run forwards)."""
        if self.proc.poll() is None:
            try:
                if how:
                    how()
                else:
                    self.proc.send_signal(signal.SIGTERM)
            except OSError:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise Failed(f"{self.name} did not exit within {timeout:.0f} s:\n{self.output()}")
        self.seconds = time.monotonic() - self.t0
        return self.proc.returncode, read_summary(self.summary)

    def kill(self, grace: float = 30) -> None:
        """SIGTERM first: farmem run forwards it and then tears down what it set up (kswap mode's
        cgroup and zram, which a SIGKILL would leave behind); SIGKILL after grace seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def value(i: int, mean: int) -> bytes:
    """Key i's value: mean/2 to 3*mean/2 bytes, a pattern of its own (a page of another key's
    bytes never passes for it)."""
    seed = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).digest()
    size = mean // 2 + (i * 7919) % mean
    return (seed * (size // 32 + 1))[:size]


def need(*programs: str) -> None:
    import shutil
    missing = [p for p in programs if not shutil.which(p)]
    if missing:
        raise Failed(f"not installed: {', '.join(missing)} (make deps: tools/deps.sh)")


# --- Redis ----------------------------------------------------------------------------------------

def connect(addr) -> socket.socket:
    """A Unix socket's path, or a TCP (host, port) on this machine."""
    if isinstance(addr, tuple):
        return socket.create_connection(addr)
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(addr))
    return s


class UnixClient:
    """A connection to a server's Unix socket (or a TCP (host, port)), read line by line."""

    def __init__(self, path, timeout: float = 300):
        self.s = connect(path)
        self.s.settimeout(timeout)
        self.f = self.s.makefile("rb")

    def close(self) -> None:
        self.f.close()
        self.s.close()


class Resp(UnixClient):
    """A Redis client: RESP2, pipelined."""

    @staticmethod
    def encode(*args) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def reply(self):
        line = self.f.readline()
        if not line:
            raise Failed("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise Failed(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise Failed(f"redis: unexpected reply {line[:80]!r}")

    def call(self, *args):
        self.s.sendall(self.encode(*args))
        return self.reply()

    def pipeline(self, cmds: list) -> list:
        self.s.sendall(b"".join(self.encode(*c) for c in cmds))
        return [self.reply() for _ in cmds]

    def info(self, section: str) -> dict:
        text = self.call("INFO", section).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def scan(self, pattern: str) -> list:
        cursor, keys = b"0", []
        while True:
            cursor, batch = self.call("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            keys += batch
            if cursor == b"0":
                return keys


def redis_load(r: Resp, keys: int, mean: int, prefix: str = "fm", gen=value) -> None:
    for lo in range(0, keys, 1000):
        cmds = [("SET", f"{prefix}:{i}", gen(i, mean)) for i in range(lo, min(lo + 1000, keys))]
        if r.pipeline(cmds) != ["OK"] * len(cmds):
            raise Failed("redis: a SET did not answer OK")


def redis_check(r: Resp, keys: int, mean: int, prefix: str = "fm", gen=value, what: str = "redis") -> None:
    bad = []
    for lo in range(0, keys, 1000):
        idx = range(lo, min(lo + 1000, keys))
        got = r.call("MGET", *[f"{prefix}:{i}" for i in idx])
        bad += [i for i, v in zip(idx, got) if v != gen(i, mean)]
    if bad:
        raise Failed(f"{what}: {len(bad)} of {keys} values wrong or missing, e.g. {prefix}:{bad[0]}")


def redis_server_argv(sock: Path, workdir: Path) -> list:
    return ["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
            "--dir", workdir, "--dbfilename", "dump.rdb", "--loglevel", "warning", "--daemonize", "no"]


def redis_benchmark(sock: Path, requests: int, keyspace: int, size: int, tests: str) -> dict:
    """redis-benchmark, pipelined; its requests per second for each test."""
    r = subprocess.run(["redis-benchmark", "-s", str(sock), "-q", "--csv", "-t", tests, "-n", str(requests),
                        "-r", str(keyspace), "-d", str(size), "-P", "16", "-c", "8"],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise Failed(f"redis-benchmark exited with {r.returncode}: {r.stderr[-2000:]}")
    rps = {}
    for line in r.stdout.splitlines():
        cols = [c.strip('"') for c in line.split(",")]
        if len(cols) >= 2 and cols[0] != "test":
            rps[cols[0]] = float(cols[1])
    want = {t.upper() for t in tests.split(",")}
    if not want <= set(rps) or not all(v > 0 for v in rps.values()):
        raise Failed(f"redis-benchmark did not report every test: {r.stdout[-2000:]}")
    return rps


def redis(launch: Launch, workdir: Path, keys: int = 60000, mean: int = 1000, requests: int = 100000,
          keyspace: int = 50000, bench_size: int = 600) -> dict:
    """Redis (jemalloc) loaded with our keys, then with redis-benchmark (SET, GET, LPUSH, INCR),
    then everything read back: our keys byte for byte, the benchmark's keys and list equal to its
    payload, its counters adding up to its INCR count."""
    need("redis-server", "redis-benchmark")
    sock = workdir / "redis.sock"
    srv = Server(launch, redis_server_argv(sock, workdir), workdir, "redis", sock)
    try:
        srv.wait_ready()
        r = Resp(sock)
        t0 = time.monotonic()
        redis_load(r, keys, mean)
        load_s = time.monotonic() - t0
        rps = redis_benchmark(sock, requests, keyspace, bench_size, "set,get,lpush,incr")
        t0 = time.monotonic()
        redis_check(r, keys, mean)
        bkeys = r.scan("key:*")
        if not bkeys:
            raise Failed("redis: the benchmark's keys are missing")
        payload = r.call("GET", bkeys[0])
        if payload is None or len(payload) != bench_size:
            raise Failed(f"redis: the benchmark's payload is {payload!r:.80}")
        for lo in range(0, len(bkeys), 1000):
            got = r.call("MGET", *bkeys[lo:lo + 1000])
            if any(v != payload for v in got):
                raise Failed("redis: a benchmark key does not hold the benchmark's payload")
        if r.call("LLEN", "mylist") != requests:
            raise Failed(f"redis: mylist has {r.call('LLEN', 'mylist')} elements, not {requests}")
        for lo in range(0, requests, 10000):
            if any(v != payload for v in r.call("LRANGE", "mylist", lo, lo + 9999)):
                raise Failed("redis: a mylist element does not hold the benchmark's payload")
        counters = r.scan("counter:*")
        total = sum(int(v) for lo in range(0, len(counters), 1000)
                    for v in r.call("MGET", *counters[lo:lo + 1000]))
        if total != requests:
            raise Failed(f"redis: the INCR counters add up to {total}, not {requests}")
        check_s = time.monotonic() - t0
        used = int(r.info("memory")["used_memory"])
        r.close()
        status, summary = srv.stop(lambda: Resp(sock).s.sendall(Resp.encode("SHUTDOWN", "NOSAVE")))
        if status != 0:
            raise Failed(f"redis-server exited with {status}:\n{srv.output()}")
        return {"rps": rps, "load_s": round(load_s, 2), "check_s": round(check_s, 2),
                "used_memory": used, "summary": summary, "seconds": round(srv.seconds, 2)}
    finally:
        srv.kill()


def value2(i: int, mean: int) -> bytes:
    """The values that overwrite the first keys while a snapshot is being written."""
    return value(i + (1 << 40), mean)


def redis_bgsave(launch: Launch, workdir: Path, keys: int = 60000, mean: int = 1000) -> dict:
    """BGSAVE forks; the child writes the data set as it was at fork while the parent goes on
    (it overwrites keys meanwhile). A second redis-server, not paged, loads the snapshot: every
    value must be the one from before the overwrite, and the parent must hold the new ones."""
    need("redis-server")
    sock = workdir / "redis.sock"
    rdb = workdir / "dump.rdb"
    rdb.unlink(missing_ok=True)
    srv = Server(launch, redis_server_argv(sock, workdir), workdir, "redis-bgsave", sock)
    try:
        srv.wait_ready()
        r = Resp(sock)
        redis_load(r, keys, mean)
        over = min(keys, 5000)
        t0 = time.monotonic()
        if r.call("BGSAVE") != "Background saving started":
            raise Failed("redis: BGSAVE did not start")
        redis_load(r, over, mean, gen=value2)  # while the child writes
        while r.info("persistence")["rdb_bgsave_in_progress"] != "0":
            if time.monotonic() - t0 > 600:
                raise Failed("redis: BGSAVE still running after 600 s")
            time.sleep(0.1)
        save_s = time.monotonic() - t0
        status = r.info("persistence")["rdb_last_bgsave_status"]
        if status != "ok":
            log = srv.output()
            why = next((line for line in log.splitlines() if "terminated by signal" in line), log[-500:])
            raise Failed(f"redis: BGSAVE failed ({status}): {why.strip()}")
        redis_check(r, over, mean, gen=value2, what="redis (parent after BGSAVE)")
        r.close()
        st, summary = srv.stop(lambda: Resp(sock).s.sendall(Resp.encode("SHUTDOWN", "NOSAVE")))
        if st != 0:
            raise Failed(f"redis-server exited with {st}:\n{srv.output()}")
    finally:
        srv.kill()
    # The snapshot, read by a redis-server that farmem does not page.
    sock2 = workdir / "redis-check.sock"
    chk = Server(Launch(mode="local"), redis_server_argv(sock2, workdir), workdir, "redis-check", sock2)
    try:
        chk.wait_ready()
        r = Resp(sock2)
        t0 = time.monotonic()
        while r.info("persistence").get("loading") != "0":  # it answers LOADING until then
            if time.monotonic() - t0 > 600:
                raise Failed("redis: the snapshot is still loading after 600 s")
            time.sleep(0.1)
        if r.call("DBSIZE") != keys:
            raise Failed(f"redis: the snapshot holds {r.call('DBSIZE')} keys, not {keys}")
        redis_check(r, keys, mean, what="redis (snapshot)")
        r.close()
        chk.stop(lambda: Resp(sock2).s.sendall(Resp.encode("SHUTDOWN", "NOSAVE")))
    finally:
        chk.kill()
    return {"save_s": round(save_s, 2), "rdb_bytes": rdb.stat().st_size, "summary": summary}


# --- memcached ------------------------------------------------------------------------------------

class Memcache(UnixClient):
    """memcached's text protocol."""

    def set_many(self, items: list) -> None:
        self.s.sendall(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(v), v) for k, v in items))
        for k, _ in items:
            line = self.f.readline()
            if line != b"STORED\r\n":
                raise Failed(f"memcached: set {k.decode()} answered {line!r}")

    def get_many(self, keys: list) -> dict:
        self.s.sendall(b"get " + b" ".join(keys) + b"\r\n")
        got = {}
        while True:
            line = self.f.readline()
            if line == b"END\r\n":
                return got
            parts = line.split()
            if len(parts) != 4 or parts[0] != b"VALUE":
                raise Failed(f"memcached: unexpected reply {line[:80]!r}")
            got[parts[1]] = self.f.read(int(parts[3]) + 2)[:-2]

    def stats(self) -> dict:
        self.s.sendall(b"stats\r\n")
        out = {}
        while (line := self.f.readline()) != b"END\r\n":
            _, k, v = line.decode().split(None, 2)
            out[k] = v.strip()
        return out


def memslap(sock: Path, test: str, requests: int, threads: int = 2) -> float:
    """memcslap (libmemcached-tools): seconds for requests x threads of test."""
    r = subprocess.run(["memcslap", "--servers", str(sock), "--test", test, "--execute-number", str(requests),
                        "--concurrency", str(threads)], capture_output=True, text=True, timeout=3600)
    line = next((x for x in r.stdout.splitlines() if x.startswith(f"Time to {test}")), None)
    if r.returncode != 0 or line is None:
        raise Failed(f"memcslap --test {test} failed ({r.returncode}): {r.stdout[-1000:]}{r.stderr[-1000:]}")
    return float(line.split(":")[-1].split()[0])


def memcached(launch: Launch, workdir: Path, megabytes: int = 256, items: int = 40000, mean: int = 1000,
              slap: int = 20000, prealloc: bool = True, user: str = "root") -> dict:
    """memcached with its whole cache preallocated (-L: one big aligned block, which farmem
    pages), loaded by memcslap (set, then get) and with our items; every item read back.
    prealloc=False: its slabs come 1 MiB at a time from glibc, in its worker threads' heaps
    (paged as regions the kernel waits for). user: the user memcached gives root up for when it starts as root
    (-u), as Debian's service does (memcache)."""
    need("memcached", "memcslap")
    sock = workdir / "memcached.sock"
    cmd = ["memcached", "-m", megabytes, *(["-L"] if prealloc else []), "-s", sock, "-t", 2, "-c", 256]
    if os.geteuid() == 0:
        cmd += ["-u", user]
    srv = Server(launch, cmd, workdir, "memcached", sock)
    try:
        srv.wait_ready()
        set_s = memslap(sock, "set", slap)
        m = Memcache(sock)
        keys = [b"fm:%d" % i for i in range(items)]
        for lo in range(0, items, 500):
            m.set_many([(keys[i], value(i, mean)) for i in range(lo, min(lo + 500, items))])
        get_s = memslap(sock, "get", slap)
        missing, wrong = 0, []
        for lo in range(0, items, 100):
            got = m.get_many(keys[lo:lo + 100])
            for i in range(lo, min(lo + 100, items)):
                v = got.get(keys[i])
                if v is None:
                    missing += 1
                elif v != value(i, mean):
                    wrong.append(i)
        stats = m.stats()
        m.close()
        if wrong:
            raise Failed(f"memcached: {len(wrong)} of {items} values wrong, e.g. fm:{wrong[0]}")
        if missing:
            raise Failed(f"memcached: {missing} of {items} items missing ({stats.get('evictions')} evictions by "
                         f"memcached's LRU: give it more than -m {megabytes})")
        status, summary = srv.stop()
        if status != 0:
            raise Failed(f"memcached exited with {status}:\n{srv.output()}")
        return {"memcslap_set_s": set_s, "memcslap_get_s": get_s, "items": int(stats["curr_items"]),
                "summary": summary, "seconds": round(srv.seconds, 2)}
    finally:
        srv.kill()


YRMCDS_CONF = """virtual_ip = 127.0.0.1
port = {port}
repl_port = {repl}
max_connections = 64
temp_dir = "{tmp}"
log.threshold = warning
log.file = "{log}"
buckets = 1000000
max_data_size = 10M
heap_data_limit = 256K
repl_buffer_size = 30
secure_erase = false
lock_memory = false
memory_limit = {megabytes}M
workers = 2
gc_interval = 10
slave_timeout = 10
counter.enable = false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def yrmcds(launch: Launch, workdir: Path, items: int = 40000, mean: int = 2000, megabytes: int = 1024) -> dict:
    """yrmcds (Debian's, a memcached-compatible store linked with tcmalloc), on TCP: our items set,
    then every one read back twice, in a scattered order and in order. Its items live in tcmalloc's
    heap, which tcmalloc grows with its own sbrk: nothing of it was paged before session 46."""
    daemon = "/usr/sbin/yrmcdsd"
    need(daemon)
    tmp = workdir / "yrmcds-tmp"
    tmp.mkdir(exist_ok=True)
    port = free_port()
    conf = workdir / "yrmcds.conf"
    conf.write_text(YRMCDS_CONF.format(port=port, repl=free_port(), tmp=tmp, log=workdir / "yrmcds-own.log",
                                       megabytes=megabytes))
    srv = Server(launch, [daemon, "-f", conf], workdir, "yrmcds", ("127.0.0.1", port))
    try:
        srv.wait_ready()
        m = Memcache(("127.0.0.1", port))
        keys = [b"fm:%d" % i for i in range(items)]
        wrong = missing = 0
        try:
            for lo in range(0, items, 500):
                m.set_many([(keys[i], value(i, mean)) for i in range(lo, min(lo + 500, items))])
            for order in ([(i * 7919) % items for i in range(items)], range(items)):
                order = list(order)
                for lo in range(0, items, 100):
                    got = m.get_many([keys[i] for i in order[lo:lo + 100]])
                    for i in order[lo:lo + 100]:
                        v = got.get(keys[i])
                        missing += v is None
                        wrong += v is not None and v != value(i, mean)
        except (Failed, OSError) as e:
            time.sleep(1)
            if srv.proc.poll() is not None:  # Linux swap's OOM killer, at its limit
                raise Failed(f"yrmcds died (exit {srv.proc.returncode}): {srv.output()[-600:]}") from e
            raise
        m.close()
        if wrong or missing:
            raise Failed(f"yrmcds: of {items} items {wrong} wrong, {missing} missing")
        # yrmcds 1.1 stopped at once after its last client left hangs in its shutdown now and then, a
        # thread spinning (1 of 3 runs here, with no farmem); a second later, 15 of 15 exit.
        time.sleep(1)
        status, summary = srv.stop()
        if status not in (0, 143, -signal.SIGTERM):  # SIGTERM is how it is stopped: it dies of it
            raise Failed(f"yrmcds exited with {status}:\n{srv.output()}")
        return {"items": items, "summary": summary, "seconds": round(srv.seconds, 2)}
    finally:
        srv.kill()


# --- PostgreSQL -----------------------------------------------------------------------------------

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def pg_expected(rows: int) -> list:
    """The answers of PG_QUERIES, computed here."""
    strings = sorted(hashlib.md5(str(i).encode()).hexdigest() for i in range(1, rows + 1))
    groups = rows // 2
    counts = [0] * groups
    for i in range(1, rows + 1):
        counts[i % groups] += 1
    joined = range(2, rows + 1, 2)  # a.i = 2 * b.j: every even a.i has its b.j
    return [hashlib.md5(",".join(strings).encode()).hexdigest(),
            f"{sum(1 for c in counts if c)}|{sum(c * c for c in counts)}",
            f"{len(joined)}|{sum(joined)}"]


# An in-memory sort of `rows` strings, a hash aggregate of rows/2 groups, a hash join: each in one
# backend's memory (work_mem), which the shim pages in blocks of at least the threshold.
PG_QUERIES = [
    "SELECT md5(string_agg(s, ',' ORDER BY s)) FROM (SELECT md5(i::text) s FROM generate_series(1, {rows}) i) t",
    "SELECT count(*) || '|' || sum(c * c) FROM (SELECT i % ({rows} / 2) g, count(*) c "
    "FROM generate_series(1, {rows}) i GROUP BY g) t",
    "SELECT count(*) || '|' || sum(a.i) FROM generate_series(1, {rows}) a(i) "
    "JOIN generate_series(1, {rows}) b(j) ON a.i = 2 * b.j",
]


def postgres(launch: Launch, workdir: Path, rows: int = 2_000_000, work_mem: str = "512MB") -> dict:
    """PostgreSQL 15, a server that refuses to run as root, run as the postgres user (farmem run
    --user postgres; runuser otherwise): three queries whose working memory is one backend's
    (a sort, a hash aggregate, a hash join), each answer checked against the one computed here."""
    import pwd
    import shutil
    import tempfile
    if not (PG_BIN / "postgres").exists():
        raise Failed(f"not installed: {PG_BIN / 'postgres'} (make deps: tools/deps.sh)")
    need("psql")
    pg = pwd.getpwnam("postgres")
    # Its own directory, which the postgres user may enter (a test's tmp_path is root's, 0700).
    home = Path(tempfile.mkdtemp(prefix="farmem-pg-", dir="/tmp"))
    os.chown(home, pg.pw_uid, pg.pw_gid)
    data, sock = home / "data", home / "sock"

    def as_pg(cmd, **kw):
        return subprocess.run(cmd, user=pg.pw_uid, group=pg.pw_gid, capture_output=True, text=True, cwd=home, **kw)

    try:
        r = as_pg([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--no-sync", "--locale=C"], timeout=300)
        if r.returncode:
            raise Failed(f"initdb failed: {r.stdout[-1000:]}{r.stderr[-1000:]}")
        sock.mkdir()
        os.chown(sock, pg.pw_uid, pg.pw_gid)
        cmd = [str(PG_BIN / "postgres"), "-D", str(data), "-k", str(sock), "-c", "listen_addresses=",
               "-c", f"work_mem={work_mem}", "-c", "max_parallel_workers_per_gather=0", "-c", "jit=off",
               "-c", "fsync=off"]
        if launch.mode == "farmem":
            launch = Launch(mode=launch.mode, local=launch.local, threshold=launch.threshold,
                            extra=[*launch.extra, "--user", "postgres"], farmem=launch.farmem)
        else:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        srv = Server(launch, cmd, workdir, "postgres", sock / ".s.PGSQL.5432")
        try:
            srv.wait_ready()
            want = pg_expected(rows)
            got, query_s = [], []
            for q in PG_QUERIES:
                t0 = time.monotonic()
                r = as_pg(["psql", "-h", str(sock), "-U", "postgres", "-d", "postgres", "-At", "-v", "ON_ERROR_STOP=1",
                           "-c", q.format(rows=rows)], timeout=3600)
                query_s.append(round(time.monotonic() - t0, 2))
                if r.returncode:
                    raise Failed(f"psql failed ({r.returncode}): {r.stderr[-1000:]}\n{srv.output()}")
                got.append(r.stdout.strip())
            if got != want:
                raise Failed(f"postgres: answers {got}, expected {want}")
            # A fast shutdown, by the server's own tool (runuser would not pass a signal on).
            status, summary = srv.stop(how=lambda: as_pg([str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m",
                                                          "fast"], timeout=120))
            if status != 0:
                raise Failed(f"postgres exited with {status}:\n{srv.output()}")
            return {"query_s": query_s, "summary": summary, "seconds": round(srv.seconds, 2)}
        finally:
            srv.kill()
    finally:
        shutil.rmtree(home, ignore_errors=True)


# --- Python and NumPy -----------------------------------------------------------------------------

NUMPY = r"""
import os, subprocess, sys
import numpy as np
n = (int(sys.argv[1]) << 20) // 8
a = np.arange(n, dtype=np.int64)
assert n % 7919, "n must be prime to 7919"
p = (a * 7919) % n  # a permutation, made in one streaming pass (a shuffle would thrash any pager)
s = np.sort(p)
c = a.astype(np.float64) * 0.5
m = np.arange(1 << 20, dtype=np.float64).reshape(1024, 1024) % 7
checks = {
    "sum": int(a.sum()) == n * (n - 1) // 2,
    "permutation": int(p.sum()) == n * (n - 1) // 2,
    "sort": bool(np.array_equal(s, a)),
    "float sum": float(c.sum()) == n * (n - 1) / 4,
    "matmul": bool(np.array_equal(m @ np.eye(1024), m)),
}
CH = 1 << 20
checks["a intact"] = all(np.array_equal(a[i:i + CH], np.arange(i, min(i + CH, n), dtype=np.int64))
                         for i in range(0, n, CH))
# A paged process starts others: fork+exec, and a fork whose child touches nothing paged.
checks["spawn"] = subprocess.run(["/bin/true"]).returncode == 0
pid = os.fork()
if pid == 0:
    os._exit(7)
checks["fork, exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
bad = [k for k, ok in checks.items() if not ok]
print("numpy ok" if not bad else "numpy FAILED: " + ", ".join(bad))
sys.exit(1 if bad else 0)
"""

POOL = r"""
import multiprocessing as mp, sys
import numpy as np
n = (int(sys.argv[1]) << 20) // 8
timeout = float(sys.argv[2])
CH = 1 << 20
arr = None

def work(rng):
    lo, hi = rng
    return lo, bool(np.array_equal(arr[lo:hi], np.arange(lo, hi, dtype=np.int64) * 3 + 1))

if __name__ == "__main__":
    arr = np.arange(n, dtype=np.int64) * 3 + 1
    other = np.ones(n, dtype=np.int64)  # pushes part of arr out before the fork
    pool = mp.get_context("fork").Pool(2)
    arr *= -1  # after the fork: the workers must see arr as it was at fork
    other[:] = 2
    try:
        res = pool.map_async(work, [(i, min(i + CH, n)) for i in range(0, n, CH)]).get(timeout)
    except mp.TimeoutError:
        print(f"pool FAILED: no result within {timeout:.0f} s (a worker died)")
        pool.terminate()
        sys.exit(1)
    pool.close()
    pool.join()
    bad = [lo for lo, ok in res if not ok]
    parent = bool(np.array_equal(arr[:CH], -(np.arange(CH, dtype=np.int64) * 3 + 1))) and int(other.sum()) == 2 * n
    if bad or not parent:
        print(f"pool FAILED: {len(bad)} chunks wrong in the workers, parent {'ok' if parent else 'wrong'}")
        sys.exit(1)
    print("pool ok")
"""


def _python(launch: Launch, workdir: Path, name: str, script: str, args: list, want: str) -> dict:
    r, summary, secs = run(launch, [PYTHON, "-c", script, *args], workdir, name)
    out = r.stdout.strip().splitlines()
    if r.returncode != 0 or not out or out[-1] != want:
        raise Failed(f"{name}: exit {r.returncode}: {(out[-1] if out else '')} {r.stderr[-1500:]}")
    return {"summary": summary, "seconds": round(secs, 2)}


def numpy(launch: Launch, workdir: Path, mib: int = 128) -> dict:
    """NumPy: four arrays of MIB MiB (arange, a permutation, its sort, a float copy) and their
    checks, then the first array again chunk by chunk; a paged process spawns and forks."""
    return _python(launch, workdir, "numpy", NUMPY, [mib], "numpy ok")


def numpy_pool(launch: Launch, workdir: Path, mib: int = 128, timeout: float = 60) -> dict:
    """A multiprocessing pool (fork) whose workers read the parent's array, which the parent
    changes after the fork: the workers must see it as it was at fork."""
    return _python(launch, workdir, "numpy-pool", POOL, [mib, timeout], "pool ok")


# --- Open MPI -------------------------------------------------------------------------------------

MPI_PROG = r"""
import sys
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n, rounds = (int(sys.argv[1]) << 20) // 8, int(sys.argv[2])
a = np.arange(n, dtype=np.float64) * (rank + 1)
other = np.ones(n, dtype=np.float64)  # presses the budget between transfers
for k in range(rounds):
    b = np.empty_like(a)
    comm.Allreduce(a, b, op=MPI.SUM)
    other += 1.0
    ok = np.array_equal(b, np.arange(n, dtype=np.float64) * (size * (size + 1) // 2))
    if rank == 0:
        comm.Send(a, dest=1, tag=k)
    elif rank == 1:
        got = np.empty_like(a)
        comm.Recv(got, source=0, tag=k)
        ok = ok and np.array_equal(got, np.arange(n, dtype=np.float64))
    if not comm.allreduce(ok, op=MPI.LAND):
        if rank == 0:
            print(f"mpi FAILED in round {k}")
        sys.exit(1)
if rank == 0:
    print("mpi ok")
"""


def openmpi(launch: Launch, workdir: Path, mib: int = 64, ranks: int = 2, rounds: int = 3) -> dict:
    """Open MPI (Debian's, with mpi4py and NumPy): RANKS ranks reduce arrays of MIB MiB with
    Allreduce and pass one rank to rank with Send/Recv, every element checked, ROUNDS rounds.
    Between ranks on one machine Open MPI moves large messages by CMA, process_vm_readv of the
    other rank's array, which is paged. Its stderr is returned: Open MPI says there when a CMA
    transfer failed ("Read -1, expected ..., errno = 14") and falls back to copies."""
    need("mpirun")
    prog = workdir / "mpi_prog.py"
    prog.write_text(MPI_PROG)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", ranks, PYTHON, prog, mib, rounds]
    return run_checked(launch, cmd, workdir, "openmpi", "mpi ok", timeout=600)


# --- SQLite ---------------------------------------------------------------------------------------

SLOT = 4608  # a page-cache slot: the 4 KiB page and SQLite's header


def sqlite(launch: Launch, workdir: Path, rows: int = 200000, width: int = 400, pagecache: bool = True) -> dict:
    """The sqlite3 shell with its page cache in one block (-pagecache, which farmem pages) big
    enough for the whole database: a table and an index built, an integrity check, every row's
    bytes compared in SQL with the formula that made them, sums, an index range and a second
    full scan from the cache, all against values computed here. pagecache=False: SQLite's own
    page cache, a small block per page from glibc's main heap (the shell has one thread)."""
    need("sqlite3")
    db = workdir / "compat.sqlite"
    db.unlink(missing_ok=True)
    pages = rows * (width + 40) // 4096 * 2 + 1000  # the table and its index, with room
    formula = (f"substr(replace(hex(zeroblob({(width + 7) // 8})), '00', "
               f"printf('%08x', (x * 2654435761) % 4294967296)), 1, {width})")
    script = f"""
.bail on
PRAGMA cache_size = {pages};
PRAGMA journal_mode = MEMORY;
PRAGMA synchronous = OFF;
CREATE TABLE t(x INTEGER PRIMARY KEY, k INTEGER, v TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})
INSERT INTO t SELECT x, (x * 40503) % 1000003, {formula} FROM c;
CREATE INDEX tk ON t(k);
SELECT 'integrity', group_concat(integrity_check) FROM pragma_integrity_check;
SELECT 'sums', count(*), sum(x), sum(k), sum(length(v)) FROM t;
SELECT 'wrong', count(*) FROM t WHERE v != {formula};
SELECT 'range', group_concat(x) FROM (SELECT x FROM t WHERE k BETWEEN 1000 AND 3000 ORDER BY x);
SELECT 'scan', sum(unicode(substr(v, 1 + x % {width}, 1))) FROM t;
"""
    r, summary, secs = run(launch, ["sqlite3", "-batch", "-stats", *(["-pagecache", SLOT, pages] if pagecache else []), db],
                           workdir, "sqlite", input=script)
    if r.returncode != 0:
        raise Failed(f"sqlite3: exit {r.returncode}: {r.stderr[-1500:]}")
    got = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition("|")
        got.setdefault(key, rest)
    xs = range(1, rows + 1)
    want = {
        "integrity": "ok",
        "sums": f"{rows}|{rows * (rows + 1) // 2}|{sum((x * 40503) % 1000003 for x in xs)}|{rows * width}",
        "wrong": "0",
        "range": ",".join(str(x) for x in xs if 1000 <= (x * 40503) % 1000003 <= 3000),
        "scan": str(sum(ord(f"{(x * 2654435761) % 2 ** 32:08x}"[x % width % 8]) for x in xs)),
    }
    bad = {k: (got.get(k, "")[:80], v[:80]) for k, v in want.items() if got.get(k) != v}
    if bad:
        raise Failed(f"sqlite3: wrong results (got, want): {bad}")
    # -stats: how much of the cache SQLite had to take from malloc instead of the big block
    overflow = next((line for line in r.stdout.splitlines() if "Pcache Overflow Bytes" in line), "")
    return {"summary": summary, "seconds": round(secs, 2), "db_bytes": db.stat().st_size,
            "pcache_overflow": overflow.split(":")[-1].strip()}


# --- system calls into paged buffers --------------------------------------------------------------

def sysio(launch: Launch, workdir: Path, mib: int = 32, expect_evicted: int = 90) -> dict:
    """build/tests/sysio: read, pread, preadv, readv, recv and io_uring reads into evicted
    buffers, write and send out of them, every byte checked (see tests/progs/sysio.c)."""
    prog = REPO / "build/tests/sysio"
    if not prog.exists():
        raise Failed(f"{prog} is missing: run make")
    r, summary, secs = run(launch, [prog, "--dir", workdir, "--size", mib, "--expect-evicted", expect_evicted],
                           workdir, "sysio")
    lines = r.stdout.splitlines()
    if r.returncode != 0 or not lines or lines[-1] != "sysio ok":
        raise Failed(f"sysio: exit {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-1000:]}")
    return {"summary": summary, "seconds": round(secs, 2), "methods": lines[:-1]}


# --- xz ------------------------------------------------------------------------------------------

def words_text(path: Path, size: int, seed: int = 7) -> str:
    """size bytes of lines of words drawn from a fixed vocabulary: text an LZ coder finds matches
    in at every distance. Returns its SHA-256."""
    import random
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rnd.choices(letters, k=rnd.randint(3, 12))) for _ in range(60000)]
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left > 0:
            block = "".join(" ".join(rnd.choices(vocab, k=12)) + "\n" for _ in range(4096)).encode()[:left]
            f.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def xz(launch: Launch, workdir: Path, mib: int = 4) -> dict:
    """xz (liblzma) compressing MIB MiB of text at preset 9 with a dictionary as large as the input:
    its binary-tree match finder (about ten times the dictionary) is read and rewritten at random
    for every byte. The archive is checked by xz itself (-t) and decompressed, outside the run,
    back to the input's SHA-256."""
    need("xz")
    src = workdir / "xz-input.txt"
    want = words_text(src, mib << 20)
    r, summary, secs = run(launch, ["xz", "-k", "-f", "-T1", f"--lzma2=preset=9,dict={mib}MiB", src],
                           workdir, "xz")
    archive = src.with_name(src.name + ".xz")
    if r.returncode != 0 or not archive.exists():
        raise Failed(f"xz: exit {r.returncode}: {r.stderr[-1500:]}")
    t = subprocess.run(["xz", "-t", archive], capture_output=True, text=True)
    if t.returncode != 0:
        raise Failed(f"xz -t: the archive is damaged: {t.stderr[-500:]}")
    d = subprocess.run(["xz", "-d", "-c", archive], capture_output=True)
    got = hashlib.sha256(d.stdout).hexdigest()
    if d.returncode != 0 or got != want:
        raise Failed(f"xz: the archive decompresses to {len(d.stdout)} bytes with SHA-256 {got[:16]}..., "
                     f"not the input's {want[:16]}...")
    return {"summary": summary, "seconds": round(secs, 2), "ratio": round(archive.stat().st_size / (mib << 20), 3)}


# --- sort ----------------------------------------------------------------------------------------

def sort(launch: Launch, workdir: Path, mib: int = 16) -> dict:
    """GNU sort (coreutils) with a sort buffer twice its input, in one paged block: it freads the
    file straight into the buffer, sorts the lines there and writes them out. The output is
    compared, outside the run, with the input's lines sorted here (bytewise, as LC_ALL=C does)."""
    need("sort")
    src = workdir / "sort-input.txt"
    words_text(src, mib << 20, seed=11)
    # sort ends every line it writes with a newline, the input's cut-off last one too
    lines = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in src.read_bytes().splitlines(keepends=True)]
    want = hashlib.sha256(b"".join(sorted(lines))).hexdigest()
    r, summary, secs = run(launch, ["sort", "-S", f"{2 * mib}M", "--parallel=1", "-o", workdir / "sorted.txt", src],
                           workdir, "sort", env=dict(os.environ, LC_ALL="C"))
    if r.returncode != 0:
        raise Failed(f"sort: exit {r.returncode}: {r.stderr[-1500:]}")
    got = hashlib.sha256((workdir / "sorted.txt").read_bytes()).hexdigest()
    if got != want:
        raise Failed(f"sort: the output's SHA-256 is {got[:16]}..., the input's lines sorted give {want[:16]}...")
    return {"summary": summary, "seconds": round(secs, 2)}


# --- fio -----------------------------------------------------------------------------------------

FIO_JOB = """[global]
filename={data}
size={mib}m
bs=1m
iodepth=16
direct=1
verify=crc32c
do_verify=1
verify_fatal=1
verify_state_save=0
[w]
rw=randwrite
"""


def fio(launch: Launch, workdir: Path, mib: int = 256, engine: str = "libaio") -> dict:
    """fio (Debian's) with O_DIRECT through libaio, io_uring or POSIX AIO (posixaio: glibc's aio_read
    and aio_write, done in glibc's own threads): MIB MiB written at random from 16 MiB of buffers,
    16 requests in flight, then read back into them and every 1 MiB block's crc32c checked by fio
    itself (verify_fatal: a bad block ends the run, exit 1). The kernel pins a buffer's pages from
    submission to completion and the device writes into them by DMA: a read whose pages were
    evicted meanwhile fails the check (it did under farmem before session 47). fio links libaio
    for every engine, so farmem serves its faults with handler threads unless told `--fault
    signal` (posixaio failed so with EFAULT before session 48)."""
    need("fio")
    job = workdir / "fio.job"
    data = workdir / "fio-data"
    job.write_text(FIO_JOB.format(data=data, mib=mib))
    try:
        r, summary, secs = run(launch, ["fio", f"--ioengine={engine}", "--output-format=terse", job], workdir, "fio")
    finally:
        data.unlink(missing_ok=True)
    if r.returncode != 0:
        bad = [ln for ln in (r.stdout + r.stderr).splitlines() if "verify" in ln or "CRC" in ln]
        raise Failed(f"fio ({engine}): exit {r.returncode}, {len(bad)} lines about bad blocks: "
                     f"{chr(10).join(bad[:4]) or r.stderr[-1500:]}")
    return {"summary": summary, "seconds": round(secs, 2)}


# --- PHP -----------------------------------------------------------------------------------------

PHP = r"""<?php
$n = (int)$argv[1]; $h = [];
for ($i = 0; $i < $n; $i++) $h["k$i"] = [$i, str_repeat("v", $i % 50)];
$s = 0;
for ($r = 0; $r < 3; $r++)
    for ($i = 0; $i < $n; $i += 3) { $k = "k" . (($i * 7919) % $n); $h[$k][0] += $r; $s += $h[$k][0] % 13; }
$len = 0; $sum = 0; foreach ($h as $v) { $len += strlen($v[1]); $sum += $v[0]; }
$k = array_keys($h); sort($k, SORT_STRING);
echo "php $s " . count($k) . " " . $k[12345 % $n] . " $len $sum " . count(get_loaded_extensions()) . "
";
"""


def scattered_updates(n: int, entries: int) -> tuple:
    """The hash programs' updates (PHP's, SBCL's): entries values 0.., a third of the first n keys
    updated three times in a scattered order. (the sum of each updated value mod 13, the values)"""
    vals = list(range(entries))
    s = 0
    for r in range(3):
        for i in range(0, n, 3):
            j = (i * 7919) % n
            vals[j] += r
            s += vals[j] % 13
    return s, vals


def keyed_want(name: str, n: int) -> str:
    """What SBCL's, Node's and Prolog's programs print: N+1 keys "k0".., each with a number and a string of
    i mod 50 characters, a third of the numbers updated three times in a scattered order."""
    s, _ = scattered_updates(n, n + 1)
    keys = sorted(f"k{i}" for i in range(n + 1))
    return f"{name} {s} {n + 1} {keys[12345 % n]} {sum(i % 50 for i in range(n + 1))}"


def php_expected(n: int) -> str:
    s, vals = scattered_updates(n, n)
    keys = sorted(f"k{i}" for i in range(n))
    return f"php {s} {n} {keys[12345 % n]} {sum(i % 50 for i in range(n))} {sum(vals)}"


def php(launch: Launch, workdir: Path, n: int = 400_000, timeout: float = 1800) -> dict:
    """PHP's command line (Debian's php-cli) with its extensions, which it opens with dlopen at
    startup (the dynamic linker's books of them then live in the paged main heap): an array of N
    entries built, a third of them updated three times in a scattered order, summed and its keys
    sorted; every figure computed again here. The last field, the number of extensions loaded,
    must match a run of php outside farmem."""
    need("php")
    script = workdir / "prog.php"
    script.write_text(PHP)
    base = subprocess.run(["php", "-r", "echo count(get_loaded_extensions());"], capture_output=True, text=True,
                          timeout=60)
    want = f"{php_expected(n)} {base.stdout.strip()}"
    return run_checked(launch, ["php", "-d", "memory_limit=-1", script, str(n)], workdir, "php", want, timeout)


ERLANG = """N = {n},
M = maps:from_list([{{integer_to_list(I), {{I, lists:duplicate(I rem 50, $v)}}}} || I <- lists:seq(0, N)]),
S = lists:foldl(fun(R, Acc) -> lists:foldl(fun(I, A2) -> K = integer_to_list((I * 7919) rem N),
    {{V, _}} = maps:get(K, M), A2 + (V + R) rem 13 end, Acc, lists:seq(0, N - 1, 3)) end, 0, [0, 1, 2]),
Ks = lists:sort(maps:keys(M)),
io:format("erlang ~p ~p ~s~n", [S, length(Ks), lists:nth(12345 rem N + 1, Ks)]),
halt()."""


def erlang(launch: Launch, workdir: Path, n: int = 200_000, timeout: float = 1800) -> dict:
    """Erlang/OTP (Debian's erlang-base, its JIT): a map of N+1 string keys built, looked up a third
    at a time three times in a scattered order, its keys sorted; every figure computed again here.
    Its JIT runs Erlang code on each process's stack, which lives in the runtime's own heap, and its
    poll thread keeps the poll set's events in its own allocator's blocks."""
    need("erl")
    s = sum((((i * 7919) % n) + r) % 13 for r in range(3) for i in range(0, n, 3))
    keys = sorted(str(i) for i in range(n + 1))
    want = f"erlang {s} {n + 1} {keys[12345 % n]}"
    return run_checked(launch, ["erl", "-noshell", "-eval", ERLANG.format(n=n)], workdir, "erlang", want, timeout)


SBCL = """(let ((h (make-hash-table :test 'equal)) (n {n}) (s 0))
  (dotimes (i (1+ n)) (setf (gethash (format nil "k~D" i) h) (list i (make-string (mod i 50) :initial-element #\\v))))
  (dotimes (r 3)
    (loop for i from 0 below n by 3
          do (let ((o (gethash (format nil "k~D" (mod (* i 7919) n)) h)))
               (incf (first o) r) (incf s (mod (first o) 13)))))
  (sb-ext:gc :full t)
  (let ((k (sort (loop for key being the hash-keys of h collect key) #'string<)))
    (format t "sbcl ~D ~D ~A ~D~%" s (length k) (nth (mod 12345 n) k)
            (loop for v being the hash-values of h sum (length (second v))))))
"""


def sbcl(launch: Launch, workdir: Path, n: int = 200_000, timeout: float = 1800) -> dict:
    """Steel Bank Common Lisp (Debian's sbcl): a hash table of N+1 string keys, each a list of a number
    and a string, a third updated three times in a scattered order, a full collection, its keys
    sorted; every figure computed again here. SBCL maps its heap with glibc's syscall(SYS_mmap)
    rather than mmap(), so nothing of it was paged before session 38; its collector moves objects
    and gives freed pages back with madvise."""
    need("sbcl")
    script = workdir / "prog.lisp"
    script.write_text(SBCL.format(n=n))
    return run_checked(launch, ["sbcl", "--dynamic-space-size", "1024", "--script", script], workdir, "sbcl",
                       keyed_want("sbcl", n), timeout)


PROLOG = """:- initialization(main, main).
entry(I, K-v(I, S)) :- format(atom(K), "k~d", [I]), L is I mod 50, length(Cs, L),
    maplist(=(0'v), Cs), string_codes(S, Cs).
update(N, R, I, A0-S0, A-S) :- J is (I * 7919) mod N, format(atom(K), "k~d", [J]),
    get_assoc(K, A0, v(X0, Str)), X is X0 + R, put_assoc(K, A0, v(X, Str), A), S is S0 + X mod 13.
round(N, R, A0-S0, A-S) :- N1 is N - 1, numlist(0, N1, Is0), include([I]>>(I mod 3 =:= 0), Is0, Is),
    foldl(update(N, R), Is, A0-S0, A-S).
vlen(v(_, S), L0, L) :- string_length(S, Len), L is L0 + Len.
main :-
    current_prolog_flag(argv, [Arg|_]), atom_number(Arg, N),
    numlist(0, N, All), maplist(entry, All, Pairs), list_to_assoc(Pairs, A0),
    foldl(round(N), [0, 1, 2], A0-0, A-Sum),
    garbage_collect,
    assoc_to_keys(A, Keys), length(Keys, Len), Idx is 12345 mod N, nth0(Idx, Keys, Kx),
    assoc_to_values(A, Vs), foldl(vlen, Vs, 0, SL),
    format("prolog ~d ~d ~w ~d~n", [Sum, Len, Kx, SL]).
"""


def prolog(launch: Launch, workdir: Path, n: int = 100_000, timeout: float = 1800) -> dict:
    """SWI-Prolog (Debian's swi-prolog-core, linked with tcmalloc): an AVL tree (library(assoc)) of
    N+1 atom keys, each a number and a string, a third of the numbers updated three times in a
    scattered order (each update a new path of the tree), a garbage collection, its keys in order;
    every figure computed again here. SWI maps its stacks itself; tcmalloc grows the break with its
    own sbrk, whose memory was not paged before session 46."""
    need("swipl")
    script = workdir / "prog.pl"
    script.write_text(PROLOG)
    return run_checked(launch, ["swipl", script, str(n)], workdir, "prolog", keyed_want("prolog", n), timeout)


NODE = """const n = {n}, m = new Map();
let s = 0, len = 0;
for (let i = 0; i <= n; i++) m.set("k" + i, [i, "v".repeat(i % 50)]);
for (let r = 0; r < 3; r++)
  for (let i = 0; i < n; i += 3) {{ const o = m.get("k" + (i * 7919) % n); o[0] += r; s += o[0] % 13; }}
for (const o of m.values()) len += o[1].length;
const k = Array.from(m.keys()).sort();
console.log(`node ${{s}} ${{k.length}} ${{k[12345 % n]}} ${{len}}`);
"""


def node(launch: Launch, workdir: Path, n: int = 300_000, timeout: float = 1800) -> dict:
    """Node.js (Debian's nodejs): a Map of N+1 string keys, each an array of a number and a string, a
    third updated three times in a scattered order, its keys sorted; every figure computed again here.
    V8 maps its JavaScript heap a 256 KiB page at a time, each page reserved on its own: the shim
    places them in its pool, where they are paged (docs/compatibility.md)."""
    need("node")
    script = workdir / "prog.js"
    script.write_text(NODE.format(n=n))
    return run_checked(launch, ["node", script], workdir, "node", keyed_want("node", n), timeout)


WORKLOADS = {
    "redis": redis,
    "redis-bgsave": redis_bgsave,
    "memcached": memcached,
    "memcached-heaps": lambda launch, work, **kw: memcached(launch, work, prealloc=False, **kw),
    "postgres": postgres,
    "numpy": numpy,
    "numpy-pool": numpy_pool,
    "openmpi": openmpi,
    "sqlite": sqlite,
    "sqlite-heap": lambda launch, work, **kw: sqlite(launch, work, pagecache=False, **kw),
    "sysio": sysio,
    "xz": xz,
    "sort": sort,
    "php": php,
    "erlang": erlang,
    "sbcl": sbcl,
    "yrmcds": yrmcds,
    "prolog": prolog,
    "node": node,
    "fio": fio,
    "fio-uring": lambda launch, work, **kw: fio(launch, work, engine="io_uring", **kw),
    "fio-posixaio": lambda launch, work, **kw: fio(launch, work, engine="posixaio", **kw),
}

if __name__ == "__main__":
    sys.exit("bench/lib/compat.py is a library: run bench/bench_compat.py or tests/test_compat.py")
