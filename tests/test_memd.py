# SPDX-License-Identifier: Apache-2.0
"""farmem-memd as a black box: a real server on a Unix socket and a TCP port,
driven with farmem.memdproto (docs/protocol.md). Every memd started here must
still be alive at the end of its test and exit 0 on SIGTERM."""

import mmap
import os
import random
import select
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from farmem import memdproto as mp

pytestmark = pytest.mark.memd

SECRET = b"memd-test-secret"
PAGE = mp.PAGE_SIZE


def page_bytes(tag, page):
    """A recognisable 4 KiB page."""
    head = f"{tag}:{page}:".encode()
    return (head * (PAGE // len(head) + 1))[:PAGE]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Memd:
    """One farmem-memd process, started with --ready-fd and waited for."""

    def __init__(self, binary, tmp_path, args=(), secret=SECRET, tcp=True):
        self.binary = binary
        self.tmp = tmp_path
        self.sock = str(tmp_path / f"memd-{os.getpid()}-{id(self)}.sock")
        self.secret = secret
        self.secret_file = tmp_path / "secret"
        self.secret_file.write_bytes(secret + b"\n")
        self.log = tmp_path / f"memd-{id(self)}.log"
        self.args = list(args)
        self.tcp = tcp
        self.proc = None
        for _ in range(3):  # the free port may be taken between probe and bind
            self.port = free_port()
            if self._start():
                return
        raise AssertionError(f"memd did not start:\n{self.log.read_text()}")

    @property
    def unix_addr(self):
        return f"unix:{self.sock}"

    @property
    def tcp_addr(self):
        return f"tcp:127.0.0.1:{self.port}"

    def _start(self):
        r, w = os.pipe()
        cmd = [str(self.binary), "--unix", self.sock, "--secret-file", str(self.secret_file),
               "--ready-fd", str(w), *self.args]
        if self.tcp:
            cmd += ["--listen", f"127.0.0.1:{self.port}"]
        env = {k: v for k, v in os.environ.items() if k != "FARMEM_SECRET"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env)
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], 10)
            data = os.read(r, 64) if ready else b""
        finally:
            os.close(r)
        if data == b"ready\n":
            return True
        self.proc.kill()
        self.proc.wait()
        return False

    def connect(self, unix=True, session=None):
        return mp.connect(self.unix_addr if unix else self.tcp_addr, self.secret,
                          session=session, timeout=10)

    def raw(self, unix=False, auth=False, session=False):
        """A connection at a chosen stage of the handshake."""
        c = mp.Conn(self.unix_addr if unix else self.tcp_addr, timeout=10)
        if auth:
            c.hello()
            c.auth(self.secret)
            if session:
                c.session_new()
        return c

    def stats(self):
        return mp.probe(self.unix_addr, self.secret)

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("memd did not exit within 10 s of the signal")


@pytest.fixture(scope="module")
def memd_bin(built):
    # FARMEM_TEST_MEMD: test another build (an installed one, a sanitizer build).
    if os.environ.get("FARMEM_TEST_MEMD"):
        return os.environ["FARMEM_TEST_MEMD"]
    return built("build/bin/farmem-memd")


@pytest.fixture
def start_memd(memd_bin, tmp_path):
    started = []

    def start(*args, **kw):
        m = Memd(memd_bin, tmp_path, args, **kw)
        started.append(m)
        return m

    yield start
    for m in started:
        crashed = not m.alive()
        rc = m.stop()
        assert not crashed, f"memd died during the test (rc {rc}):\n{m.log.read_text()}"
        assert rc == 0, f"memd exited {rc} on SIGTERM:\n{m.log.read_text()}"


@pytest.fixture
def memd(start_memd):
    return start_memd("--capacity", "64M")


def expect_status(status, fn, *args):
    with pytest.raises(mp.MemdStatusError) as ei:
        fn(*args)
    assert ei.value.status == status, str(ei.value)
    return ei.value


def expect_closed(conn):
    """memd closed this connection (after its error reply, already read)."""
    conn.sock.settimeout(5)
    with pytest.raises(mp.MemdClosed):
        conn.recv_frame()


def until(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return pred()


# ---- data path -----------------------------------------------------------------------

def test_roundtrip_two_connections_one_session(memd):
    a = memd.connect(unix=True)
    sp = a.space_open(128)
    pages = [0, 1, 63, 127]
    assert a.write(sp, [(p, page_bytes("a", p)) for p in pages]) == [mp.OK] * 4
    # The second connection joins over TCP and reads what the first wrote.
    b = memd.connect(unix=False, session=(a.session_id, a.session_key))
    got = b.read(sp, pages + [5])
    for p, (st, crc, data) in zip(pages, got):
        assert st == mp.OK
        assert data == page_bytes("a", p)
        assert crc == mp.crc32c(data)
    assert got[4][0] == mp.E_ABSENT and got[4][2] == bytes(PAGE)
    # And the other way round, overwriting.
    assert b.write(sp, [(1, page_bytes("b", 1))]) == [mp.OK]
    [(st, crc, data)] = a.read(sp, [1])
    assert (st, data, crc) == (mp.OK, page_bytes("b", 1), mp.crc32c(page_bytes("b", 1)))
    # A page sent with a wrong checksum is refused and not stored.
    assert a.write(sp, [(2, page_bytes("a", 2)), (3, page_bytes("a", 3))],
                   crcs=[mp.crc32c(page_bytes("a", 2)) ^ 1, mp.crc32c(page_bytes("a", 3))]) \
        == [mp.E_CRC, mp.OK]
    assert [s for s, _, _ in a.read(sp, [2, 3])] == [mp.E_ABSENT, mp.OK]
    a.discard(sp, [(0, 2)])
    assert [s for s, _, _ in b.read(sp, [0, 1, 63])] == [mp.E_ABSENT, mp.E_ABSENT, mp.OK]
    st = memd.stats()
    assert st["sessions"] == 1 and st["spaces"] == 1 and st["used_pages"] == 3


def test_pipelining(memd):
    c = memd.connect(unix=False)
    sp = c.space_open(16)
    ref = mp.SPACE_REF.pack(sp, 0)
    data = page_bytes("pipe", 3)
    ids = random.sample(range(1, 1 << 60), 6)
    # All sent before any reply is read; the READ must see the WRITE before it.
    c.send_frame(mp.WRITE, ref + mp.WRITE_ENT.pack(3, mp.crc32c(data), 0) + data, 1, req_id=ids[0])
    c.send_frame(mp.READ, ref + struct.pack("<Q", 3), 1, req_id=ids[1])
    c.send_frame(99, b"junk", 0, req_id=ids[2])
    c.send_frame(mp.STATS, req_id=ids[3])
    c.send_frame(mp.DISCARD, ref + mp.RANGE.pack(3, 1), 1, req_id=ids[4])
    c.send_frame(mp.READ, ref + struct.pack("<Q", 3), 1, req_id=ids[5])
    reps = [c.recv_frame() for _ in ids]
    assert [r.req_id for r in reps] == ids
    assert [r.op for r in reps] == [mp.WRITE, mp.READ, mp.ERROR, mp.STATS, mp.DISCARD, mp.READ]
    assert struct.unpack("<I", reps[0].payload) == (mp.OK,)
    assert mp.PAGE_STATUS.unpack_from(reps[1].payload) == (mp.OK, mp.crc32c(data))
    assert reps[1].payload[8:] == data
    assert reps[2].status == mp.E_OP
    assert mp.PAGE_STATUS.unpack_from(reps[5].payload)[0] == mp.E_ABSENT


# ---- handshake -------------------------------------------------------------------------

def test_wrong_secret_closes(memd):
    for unix in (True, False):
        c = memd.raw(unix=unix)
        c.hello()
        expect_status(mp.E_AUTH, c.auth, b"not-the-secret")
        expect_closed(c)
    with pytest.raises(mp.MemdError, match="rejected the secret"):
        mp.probe(memd.tcp_addr, "wrong")
    assert memd.stats()["errors"] >= 3


def test_foreground_memd_says_where_it_listens_and_who_failed_to_log_in(memd_bin, tmp_path):
    """At the default log level, a memd in the foreground (no --ready-fd) says where it listens,
    and a failed login names the client by its address (a local one by its pid), not by an fd."""
    port = free_port()
    sock = tmp_path / "fg.sock"
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    log = tmp_path / "fg.log"
    env = {k: v for k, v in os.environ.items() if k != "FARMEM_SECRET"}
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(memd_bin), "--listen", f"127.0.0.1:{port}", "--unix", str(sock),
                                 "--secret-file", str(secret)], stdout=f, stderr=f, env=env)
    try:
        assert until(lambda: log.read_text().count("listening on") == 2), log.read_text()
        text = log.read_text()
        assert f"farmem-memd: listening on tcp:127.0.0.1:{port}\n" in text, text
        assert f"farmem-memd: listening on unix:{sock}\n" in text, text
        c = mp.Conn(f"tcp:127.0.0.1:{port}")
        client_port = c.sock.getsockname()[1]
        c.hello()
        expect_status(mp.E_AUTH, c.auth, b"not-the-secret")
        c.close()
        want = f"farmem-memd: warning: authentication failed from tcp:127.0.0.1:{client_port}\n"
        assert until(lambda: want in log.read_text()), log.read_text()
        with pytest.raises(mp.MemdError, match="rejected the secret"):
            mp.probe(f"unix:{sock}", "wrong")
        want = f"authentication failed from a local process (unix socket, pid {os.getpid()}, uid {os.getuid()})"
        assert until(lambda: want in log.read_text()), log.read_text()
        assert "fd " not in log.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0, log.read_text()


def test_memd_started_with_ready_fd_keeps_quiet(memd):
    """A program that starts memd with --ready-fd learns it is up from the fd: at the default
    level memd says nothing of where it listens in that program's output."""
    assert "listening on" not in memd.log.read_text()


def test_op_before_auth_rejected(memd):
    c = memd.raw()
    expect_status(mp.E_AUTH, c.request, mp.STATS)
    expect_closed(c)
    c = memd.raw()
    c.hello()
    expect_status(mp.E_AUTH, c.request, mp.SPACE_OPEN, mp.SPACE_OPEN_REQ.pack(8, 0, 0))
    expect_closed(c)
    # Authenticated, no session yet: space ops are refused, the connection stays.
    c = memd.raw(auth=True)
    expect_status(mp.E_STATE, c.space_open, 8)
    assert c.stats()["sessions"] == 0


def test_wrong_version(memd):
    c = memd.raw()
    e = expect_status(mp.E_VERSION, c.hello, 2, 9)
    assert "1" in e.message
    expect_closed(c)
    c = memd.raw()
    # a range that includes 1 gets 1; TCP: no SHM flag, COPY, EDIT and chunked RDMA (both ways) announced
    assert c.hello(0, 5) == (1, mp.HELLO_F_COPY | mp.HELLO_F_EDIT | mp.HELLO_F_RDMA_REG | mp.HELLO_F_RDMA_UNREG)


def test_unknown_op_keeps_connection(memd):
    c = memd.connect()
    for op in (0, 19, 500, mp.ERROR):  # 13 is RDMA_MAP, 14 COPY, 15 EDIT, 16 SHM_ALLOC, 17/18 RDMA_(UN)REG
        expect_status(mp.E_OP, c.request, op, b"abc")
    assert c.space_open(4) >= 1
    assert memd.stats()["errors"] >= 4


def test_rdma_ops_without_an_rdma_listener(memd):
    """RDMA_MAP, RDMA_REG and RDMA_UNREG to a memd without --rdma: a clear error each, and the connection
    and its space go on (registration itself runs in the qemu lane: tests/vm/rdma_peer.c)."""
    c = memd.connect(unix=False)
    sp = c.space_open(8)
    ref = mp.SPACE_REF.pack(sp, 0)
    e = expect_status(mp.E_NOSHM, c.request, mp.RDMA_MAP, ref)
    assert "--rdma" in e.message
    e = expect_status(mp.E_STATE, c.request, mp.RDMA_REG, ref + bytes(8), 1)
    assert "RDMA_MAP" in e.message
    expect_status(mp.E_TOOBIG, c.request, mp.RDMA_REG, ref + bytes(8 * 65), 65)
    expect_status(mp.E_NOSPACE, c.request, mp.RDMA_REG, mp.SPACE_REF.pack(sp + 99, 0) + bytes(8), 1)
    e = expect_status(mp.E_STATE, c.request, mp.RDMA_UNREG, ref + bytes(8), 1)
    assert "RDMA_MAP" in e.message
    expect_status(mp.E_TOOBIG, c.request, mp.RDMA_UNREG, ref + bytes(8 * 65), 65)
    expect_status(mp.E_NOSPACE, c.request, mp.RDMA_UNREG, mp.SPACE_REF.pack(sp + 99, 0) + bytes(8), 1)
    assert c.write(sp, [(0, page_bytes("rdma", 0))]) == [mp.OK]
    assert c.read(sp, [0])[0][2] == page_bytes("rdma", 0)


# ---- malformed input ---------------------------------------------------------------------

def _victim(memd):
    v = memd.connect(unix=False)
    sp = v.space_open(8)
    assert v.write(sp, [(0, page_bytes("victim", 0))]) == [mp.OK]
    return v, sp


def _victim_ok(memd, v, sp):
    assert v.read(sp, [0])[0][2] == page_bytes("victim", 0)
    assert memd.connect().stats()["capacity_pages"] > 0


def test_bad_magic_and_oversized_len_close(memd):
    v, sp = _victim(memd)
    for unix in (True, False):
        c = memd.raw(unix=unix, auth=True, session=True)
        c.send_frame(mp.STATS, magic=0x11223344)
        r = c.recv_frame()
        assert (r.op, r.status) == (mp.ERROR, mp.E_PROTO)
        expect_closed(c)

        c = memd.raw(unix=unix, auth=True, session=True)
        c.send_frame(mp.WRITE, b"", 1, length=mp.MAX_PAYLOAD + 1)
        r = c.recv_frame()
        assert (r.op, r.status) == (mp.ERROR, mp.E_TOOBIG)
        expect_closed(c)

        # A count that does not match the length is malformed too.
        c = memd.raw(unix=unix, auth=True, session=True)
        c.send_frame(mp.READ, mp.SPACE_REF.pack(1, 0) + b"\0", 2)
        r = c.recv_frame()
        assert (r.op, r.status) == (mp.ERROR, mp.E_PROTO)
        expect_closed(c)
    # Before authentication as well, and with the header cut short.
    c = memd.raw()
    c.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    r = c.recv_frame()
    assert (r.op, r.status) == (mp.ERROR, mp.E_PROTO)
    expect_closed(c)
    _victim_ok(memd, v, sp)


def test_out_of_range(memd):
    c = memd.connect()
    sp = c.space_open(8)
    assert [s for s, _, _ in c.read(sp, [7, 8, 1 << 40, (1 << 64) - 1])] == \
        [mp.E_ABSENT, mp.E_RANGE, mp.E_RANGE, mp.E_RANGE]
    assert c.write(sp, [(8, page_bytes("x", 8)), (7, page_bytes("x", 7))]) == [mp.E_RANGE, mp.OK]
    expect_status(mp.E_RANGE, c.discard, sp, [(0, 1), (7, 2)])
    expect_status(mp.E_RANGE, c.discard, sp, [(1 << 63, 1 << 63)])
    assert c.read(sp, [7])[0][0] == mp.OK  # the refused DISCARD dropped nothing
    expect_status(mp.E_RANGE, c.space_open, 0)
    expect_status(mp.E_RANGE, c.space_open, mp.MAX_SPACE_PAGES + 1)


def test_count_over_batch(memd):
    c = memd.connect()
    sp = c.space_open(8)
    ref = mp.SPACE_REF.pack(sp, 0)
    # Well framed but over the limit: an error, and the connection goes on.
    expect_status(mp.E_TOOBIG, c.request, mp.READ, ref + bytes(8 * 257), 257)
    expect_status(mp.E_TOOBIG, c.request, mp.DISCARD, ref + bytes(16 * 1025), 1025)
    assert [s for s, _, _ in c.read(sp, list(range(8)))] == [mp.E_ABSENT] * 8
    assert len(c.read(sp, [0] * mp.MAX_BATCH)) == mp.MAX_BATCH
    # A WRITE of 257 pages cannot fit in a frame: oversized, closed.
    c.send_frame(mp.WRITE, b"", 257, length=8 + 257 * (16 + PAGE))
    r = c.recv_frame()
    assert (r.op, r.status) == (mp.ERROR, mp.E_TOOBIG)
    expect_closed(c)


def _random_frame(rng, space):
    op = rng.choice([mp.HELLO, mp.AUTH, mp.SESSION_NEW, mp.SESSION_JOIN, mp.SPACE_OPEN,
                     mp.SPACE_CLOSE, mp.READ, mp.WRITE, mp.DISCARD, mp.STATS, mp.SHM_MAP,
                     mp.QUOTA, mp.SHM_ALLOC, 0, 13, 4242, mp.ERROR])
    count = rng.choice([0, 0, 1, 2, 3, rng.randrange(1 << 32)])
    small = lambda n: bytes(rng.choice([0, 1, 2, 3, space, 255]) for _ in range(n))  # noqa: E731
    shapes = {mp.READ: (8, 8), mp.WRITE: (8, 16 + PAGE), mp.DISCARD: (8, 16), mp.SHM_ALLOC: (8, 16),
              mp.SPACE_OPEN: (16, 0), mp.SPACE_CLOSE: (8, 0), mp.SHM_MAP: (8, 0),
              mp.QUOTA: (8, 0), mp.SESSION_JOIN: (24, 0), mp.STATS: (0, 0),
              mp.SESSION_NEW: (0, 0), mp.HELLO: (40, 0), mp.AUTH: (32, 0)}
    fixed, item = shapes.get(op, (rng.randrange(64), 0))
    if item == 0 and rng.random() < 0.8:
        count = 0
    if item and count > 3:
        count = count % 300 if op != mp.WRITE else count % 4
    length = fixed + item * count
    roll = rng.random()
    if roll < 0.05:
        length = rng.randrange(1 << 32)
    elif roll < 0.15:
        length = rng.randrange(64)
    magic = mp.MAGIC if rng.random() > 0.05 else rng.randrange(1 << 32)
    body = small(min(length, 64)) + (rng.randbytes(length - 64) if 64 < length <= 70000 else b"")
    if length > mp.MAX_PAYLOAD:
        body = b""
    hdr = mp.HDR.pack(magic, op, rng.randrange(1 << 16), rng.randrange(1 << 64), count, length)
    return hdr + body


def test_fuzz_random_frames(memd):
    v, sp = _victim(memd)
    rng = random.Random(1234)
    deadline = time.monotonic() + 10
    frames = closes = 0
    c = None
    while frames < 10000 and time.monotonic() < deadline:
        if c is None:
            stage = rng.random()
            c = memd.raw(unix=rng.random() < 0.5, auth=stage > 0.2, session=stage > 0.3)
            c.sock.setblocking(False)
            if c.session_id is not None and rng.random() < 0.7:
                c.sock.setblocking(True)
                c.space_open(rng.choice([1, 3, 64]))
                c.sock.setblocking(False)
        if rng.random() < 0.1:
            data = rng.randbytes(rng.randrange(1, 200))  # plain garbage
        else:
            data = _random_frame(rng, 1)
        frames += 1
        try:
            c.sock.sendall(data)
        except BlockingIOError:
            pass  # memd is applying back-pressure: fine, drain below
        except (BrokenPipeError, ConnectionResetError):
            c.close()
            c, closes = None, closes + 1
            continue
        # Drain what memd answered so far; EOF means it closed us.
        try:
            while True:
                chunk = c.sock.recv(1 << 20)
                if not chunk:
                    c.close()
                    c, closes = None, closes + 1
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except ConnectionResetError:
            c.close()
            c, closes = None, closes + 1
    if c is not None:
        c.close()
    assert frames >= 1000, "fuzz loop too slow to mean anything"
    assert closes > 20, "memd never closed a fuzzing connection: the frames were not hostile"
    assert memd.alive()
    _victim_ok(memd, v, sp)
    assert until(lambda: memd.stats()["sessions"] == 1), f"fuzz sessions leaked: {memd.stats()}"


# ---- capacity, isolation, sessions ---------------------------------------------------------

def test_capacity_full_and_discard(start_memd):
    m = start_memd("--capacity", "64K")  # 16 pages
    c = m.connect()
    sp = c.space_open(64)
    st = c.write(sp, [(p, page_bytes("f", p)) for p in range(20)])
    assert st == [mp.OK] * 16 + [mp.E_FULL] * 4
    s = m.stats()
    assert (s["capacity_pages"], s["used_pages"], s["full_rejects"]) == (16, 16, 4)
    assert c.write(sp, [(0, page_bytes("g", 0))]) == [mp.OK]  # overwrites still fit
    assert [x for x, _, _ in c.read(sp, [16, 19])] == [mp.E_ABSENT, mp.E_ABSENT]
    c.discard(sp, [(0, 4), (10, 2)])
    assert m.stats()["used_pages"] == 10
    assert c.write(sp, [(p, page_bytes("f", p)) for p in range(16, 22)]) == [mp.OK] * 6
    assert m.stats()["used_pages"] == 16
    assert c.write(sp, [(40, page_bytes("f", 40))]) == [mp.E_FULL]
    c.space_close(sp)
    assert m.stats()["used_pages"] == 0


def test_session_quota(start_memd):
    m = start_memd("--capacity", "64K", "--session-quota", "16K")  # 16 pages, 4 per session
    a, b = m.connect(), m.connect(unix=False)
    sa, sb = a.space_open(32), b.space_open(32)
    assert a.write(sa, [(p, page_bytes("a", p)) for p in range(6)]) == [mp.OK] * 4 + [mp.E_FULL] * 2
    assert b.write(sb, [(p, page_bytes("b", p)) for p in range(6)]) == [mp.OK] * 4 + [mp.E_FULL] * 2
    assert m.stats()["used_pages"] == 8


def test_copy(memd):
    """COPY over TCP: bytes and crc slot to slot, within a space and across two, in order;
    absent sources and out-of-range pages per entry; nothing crosses the wire but the pairs."""
    c = memd.connect(unix=False)
    a, b = c.space_open(16), c.space_open(8)
    assert c.write(a, [(p, page_bytes("cp", p)) for p in (0, 1, 2)]) == [mp.OK] * 3
    before = memd.stats()
    assert c.copy(a, b, [(0, 7), (1, 0), (5, 1), (2, 8), (16, 2), (0, 0)]) == \
        [mp.OK, mp.OK, mp.E_ABSENT, mp.E_RANGE, mp.E_RANGE, mp.OK]
    after = memd.stats()
    assert after["writes"] - before["writes"] == 3 and after["reads"] == before["reads"]
    assert after["used_pages"] - before["used_pages"] == 2  # b's pages 7 and 0
    got = c.read(b, [7, 0, 1])
    assert got[0][0] == mp.OK and got[0][2] == page_bytes("cp", 0) and got[0][1] == mp.crc32c(got[0][2])
    assert got[1][0] == mp.OK and got[1][2] == page_bytes("cp", 0)  # the last copy to page 0 wins
    assert got[2][0] == mp.E_ABSENT  # an absent source leaves the destination as it was
    # Within one space, in order: 0 -> 3, then 3 -> 4 sees the first; a page onto itself is kept.
    assert c.copy(a, a, [(0, 3), (3, 4), (1, 1)]) == [mp.OK] * 3
    assert [d for _, _, d in c.read(a, [3, 4, 1])] == [page_bytes("cp", 0)] * 2 + [page_bytes("cp", 1)]
    # Overwriting a present destination does not count again; the source stays.
    used = memd.stats()["used_pages"]
    assert c.copy(a, b, [(2, 7)]) == [mp.OK]
    assert memd.stats()["used_pages"] == used
    assert c.read(b, [7])[0][2] == page_bytes("cp", 2) and c.read(a, [2])[0][2] == page_bytes("cp", 2)
    # Bounded like READ and WRITE; a count that does not match the length closes.
    ref = mp.COPY_REQ.pack(a, b)
    expect_status(mp.E_TOOBIG, c.request, mp.COPY, ref + bytes(16 * 257), 257)
    assert c.copy(a, b, [(0, 0)] * mp.MAX_BATCH) == [mp.OK] * mp.MAX_BATCH
    c.send_frame(mp.COPY, ref + bytes(15), 1)
    r = c.recv_frame()
    assert (r.op, r.status) == (mp.ERROR, mp.E_PROTO)
    expect_closed(c)


def test_edit(start_memd):
    """EDIT over TCP: MOVE, PUT and GET in one request, in order, the pages' crc made again; a
    refused request (a page read that memd does not hold, no room, a bad entry) changes nothing."""
    m = start_memd("--capacity", "16k")  # four pages
    c = m.connect(unix=False)
    sp = c.space_open(8)
    p0, p1 = page_bytes("ed", 0), page_bytes("ed", 1)
    assert c.write(sp, [(0, p0), (1, p1)]) == [mp.OK] * 2
    got = c.edit(sp, [(mp.EDIT_MOVE, 100, 4096 + 50, 3 * 4096 + 8), (mp.EDIT_PUT, b"12345678", 3 * 4096),
                      (mp.EDIT_GET, 16, 3 * 4096), (mp.EDIT_MOVE, 4086, 10, 0)])
    want3 = b"12345678" + p1[50:150] + bytes(4096 - 108)
    assert got == want3[:16]
    pages = c.read(sp, [0, 3])
    assert pages[0][2] == p0[10:] + p0[4086:] and pages[1][2] == want3
    assert all(st == mp.OK and crc == mp.crc32c(d) for st, crc, d in pages)
    assert m.stats()["used_pages"] == 3
    # Refused, all of it: the PUT before a read of an absent page does not happen either.
    expect_status(mp.E_ABSENT, c.edit, sp, [(mp.EDIT_PUT, b"x" * 8, 0), (mp.EDIT_GET, 8, 5 * 4096)])
    expect_status(mp.E_FULL, c.edit, sp, [(mp.EDIT_PUT, b"y", 5 * 4096), (mp.EDIT_PUT, b"z", 6 * 4096)])
    expect_status(mp.E_RANGE, c.edit, sp, [(mp.EDIT_MOVE, 16, 4090, 0)])  # across two pages
    expect_status(mp.E_RANGE, c.edit, sp, [(mp.EDIT_GET, 8, 8 * 4096)])   # outside the space
    assert c.read(sp, [0])[0][2] == p0[10:] + p0[4086:] and m.stats()["used_pages"] == 3
    # Fewer bytes than its entries: the frame is malformed, the connection closes.
    c.send_frame(mp.EDIT, mp.SPACE_REF.pack(sp, 0) + bytes(10), 1)
    r = c.recv_frame()
    assert (r.op, r.status) == (mp.ERROR, mp.E_PROTO)
    expect_closed(c)


def test_copy_full_and_foreign(start_memd):
    m = start_memd("--capacity", "16k")  # four pages
    a = m.connect(unix=False)
    sa, sa2 = a.space_open(8), a.space_open(8)
    assert a.write(sa, [(p, page_bytes("f", p)) for p in range(3)]) == [mp.OK] * 3
    # One page of room left: the first new destination takes it, the second is refused.
    assert a.copy(sa, sa2, [(0, 0), (1, 1), (2, 0)]) == [mp.OK, mp.E_FULL, mp.OK]
    assert m.stats()["full_rejects"] == 1
    assert a.read(sa2, [0, 1])[1][0] == mp.E_ABSENT
    assert a.read(sa2, [0])[0][2] == page_bytes("f", 2)
    # Another session names a's spaces: no such space, for either side; the connection stays.
    b = m.connect(unix=True)
    sb = b.space_open(8)
    expect_status(mp.E_NOSPACE, b.copy, sa2, sb, [(0, 0)])  # a has a space sa2, b does not
    expect_status(mp.E_NOSPACE, b.copy, sb, sa2, [(0, 0)])
    expect_status(mp.E_NOSPACE, a.copy, sa, sb + 100, [(0, 1)])
    assert b.copy(sb, sb, [(0, 1)]) == [mp.E_ABSENT]
    # A closed space is gone for COPY too.
    a.space_close(sa2)
    expect_status(mp.E_NOSPACE, a.copy, sa, sa2, [(0, 0)])
    assert a.read(sa, [0])[0][2] == page_bytes("f", 0)


def test_isolation_between_sessions(memd):
    a = memd.connect()
    sa = a.space_open(16)
    assert a.write(sa, [(0, page_bytes("secret-of-a", 0))]) == [mp.OK]
    b = memd.connect(unix=True)
    # b has no space yet: a's id means nothing to b.
    expect_status(mp.E_NOSPACE, b.read, sa, [0])
    expect_status(mp.E_NOSPACE, b.write, sa, [(0, page_bytes("b", 0))])
    expect_status(mp.E_NOSPACE, b.discard, sa, [(0, 1)])
    expect_status(mp.E_NOSPACE, b.shm_map, sa)
    expect_status(mp.E_NOSPACE, b.space_close, sa)
    # b's own first space may have the same number; it holds none of a's data.
    sb = b.space_open(16)
    st, _, data = b.read(sb, [0])[0]
    assert st == mp.E_ABSENT and data == bytes(PAGE)
    # a's page is untouched.
    assert a.read(sa, [0])[0][2] == page_bytes("secret-of-a", 0)
    # Joining a's session needs a's key.
    c = memd.raw(auth=True)
    expect_status(mp.E_AUTH, c.session_join, a.session_id, bytes(16))
    expect_status(mp.E_AUTH, c.session_join, a.session_id ^ 1, a.session_key)
    c.session_join(a.session_id, a.session_key)
    assert c.read(sa, [0])[0][2] == page_bytes("secret-of-a", 0)


def test_session_death_frees_memory(memd):
    base = memd.stats()
    a = memd.connect()
    sp = a.space_open(64)
    assert a.write(sp, [(p, page_bytes("d", p)) for p in range(10)]) == [mp.OK] * 10
    b = memd.connect(unix=False, session=(a.session_id, a.session_key))
    s = memd.stats()
    assert s["used_pages"] == base["used_pages"] + 10 and s["sessions"] == base["sessions"] + 1
    a.close()
    time.sleep(0.1)
    assert memd.stats()["used_pages"] == base["used_pages"] + 10  # b keeps it alive
    assert b.read(sp, [9])[0][2] == page_bytes("d", 9)
    b.close()
    s = until(lambda: (x := memd.stats())["sessions"] == base["sessions"] and x)
    assert s, memd.stats()
    assert (s["used_pages"], s["spaces"]) == (base["used_pages"], base["spaces"])
    # The session is gone for good: nobody can join it any more.
    c = memd.raw(auth=True)
    expect_status(mp.E_AUTH, c.session_join, a.session_id, a.session_key)


# ---- shared memory ----------------------------------------------------------------------

def test_shm_map(memd):
    c = memd.connect(unix=True)
    assert c.server_flags & mp.HELLO_F_SHM
    sp = c.space_open(100)
    assert c.write(sp, [(5, page_bytes("stream", 5))]) == [mp.OK]
    fd, info = c.shm_map(sp)
    try:
        assert info["npages"] == 100 and info["data_offset"] == 0
        assert info["meta_offset"] % PAGE == 0 and info["meta_offset"] >= 100 * PAGE
        assert info["map_len"] >= info["meta_offset"] + 100 * mp.SHM_META.size
        assert os.fstat(fd).st_size == info["map_len"]
        with mmap.mmap(fd, info["map_len"]) as m:
            meta = lambda p: mp.SHM_META.unpack_from(m, info["meta_offset"] + 8 * p)  # noqa: E731
            # Written over the stream, visible in the mapping.
            assert m[5 * PAGE:6 * PAGE] == page_bytes("stream", 5)
            assert meta(5) == (mp.crc32c(page_bytes("stream", 5)), mp.SHM_PRESENT)
            assert meta(6) == (0, 0)
            # Written in the mapping (data, crc, then flags), visible over the stream.
            for p in (6, 99):
                d = page_bytes("shm", p)
                m[p * PAGE:(p + 1) * PAGE] = d
                mp.SHM_META.pack_into(m, info["meta_offset"] + 8 * p, mp.crc32c(d), 0)
                struct.pack_into("<I", m, info["meta_offset"] + 8 * p + 4, mp.SHM_PRESENT)
            tcp = memd.connect(unix=False, session=(c.session_id, c.session_key))
            got = tcp.read(sp, [6, 99, 7])
            assert got[0] == (mp.OK, mp.crc32c(page_bytes("shm", 6)), page_bytes("shm", 6))
            assert got[1][2] == page_bytes("shm", 99) and got[2][0] == mp.E_ABSENT
            # DISCARD over the stream clears the flag in the mapping.
            tcp.discard(sp, [(6, 1)])
            assert meta(6)[1] & mp.SHM_PRESENT == 0
            # Only Unix-socket connections can map.
            expect_status(mp.E_NOSHM, tcp.shm_map, sp)
    finally:
        os.close(fd)
    # The memfd is sealed: a client cannot shrink it under memd.
    fd, info = c.shm_map(sp)
    try:
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def test_quota_bounded_by_capacity(start_memd):
    m = start_memd("--capacity", "40K")  # 10 pages
    c = m.connect(unix=True)
    sp = c.space_open(64)
    assert c.write(sp, [(0, page_bytes("q", 0)), (1, page_bytes("q", 1))]) == [mp.OK, mp.OK]
    fd, _ = c.shm_map(sp)
    os.close(fd)
    # The two pages the space held became the session's grant.
    assert c.quota(0) == 2 and m.stats()["used_pages"] == 2
    assert c.quota(3) == 5
    assert c.quota(100) == 10  # what fits
    assert c.quota(1) == 10
    assert m.stats()["used_pages"] == 10
    other = m.connect(unix=False)
    assert other.quota(5) == 0
    so = other.space_open(4)
    assert other.write(so, [(0, page_bytes("o", 0))]) == [mp.E_FULL]
    assert c.quota(-4) == 6
    assert other.write(so, [(0, page_bytes("o", 0))]) == [mp.OK]
    assert c.quota(-(1 << 63)) == 0
    assert m.stats()["used_pages"] == 1
    c.close()
    assert until(lambda: m.stats()["sessions"] == 1)


# ---- polling for requests ----------------------------------------------------------------

def run_workers(worker, n: int) -> None:
    """worker(k) for k in 0..n-1, each on a thread of its own, all at once."""
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)


def test_a_polling_memd_serves_every_client_and_stops(start_memd):
    """--spin-us: each worker polls for the next request after serving one. Clients on both
    sockets, one after another and several at once, get their own pages back, an idle memd
    goes back to sleep (its CPU time stops growing), and SIGTERM still stops it."""
    m = start_memd("--threads", "2", "--capacity", "64M", "--spin-us", "2000")
    errors = []

    def worker(k):
        try:
            c = m.connect(unix=k % 2 == 0)
            sp = c.space_open(64)
            for r in range(64):
                assert c.write(sp, [(r, page_bytes(f"s{k}", r))]) == [mp.OK]
            for r in range(64):
                assert c.read(sp, [r])[0][2] == page_bytes(f"s{k}", r)
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    worker(99)
    run_workers(worker, 6)
    assert not errors, errors

    def cpu_ticks():
        with open(f"/proc/{m.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    time.sleep(0.5)
    idle = cpu_ticks()
    time.sleep(1.0)
    assert cpu_ticks() - idle <= 5, "memd kept polling with no client asking"  # 5 ticks: 50 ms of 1 s
    # (the fixture then stops it with SIGTERM, and fails the test if that takes 10 s or exits non-zero)


# ---- threads and slow clients -----------------------------------------------------------

def test_slow_clients_do_not_block_others(start_memd):
    m = start_memd("--threads", "2", "--capacity", "64M")
    # One client stalls halfway through a header, one floods READs and never reads.
    stall = m.raw(unix=False, auth=True, session=True)
    stall.send_raw(mp.HDR.pack(mp.MAGIC, mp.STATS, 0, 1, 0, 0)[:10])
    flood = m.raw(unix=True, auth=True, session=True)
    fsp = flood.space_open(256)
    req = mp.SPACE_REF.pack(fsp, 0) + b"".join(struct.pack("<Q", p) for p in range(256))
    nflood = 100  # 100 replies of 1 MiB each
    frames = b"".join(mp.HDR.pack(mp.MAGIC, mp.READ, 0, i, 256, len(req)) + req
                      for i in range(nflood))
    # A small send buffer: what memd has not read yet stays within a few requests.
    flood.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    flood.sock.settimeout(None)
    sender = threading.Thread(target=flood.sock.sendall, args=(frames,), daemon=True)
    sender.start()
    # Meanwhile many well-behaved clients on several threads are served promptly.
    errors = []

    def worker(k):
        try:
            c = m.connect(unix=k % 2 == 0)
            sp = c.space_open(32)
            t0 = time.monotonic()
            for r in range(5):
                assert c.write(sp, [(r, page_bytes(f"w{k}", r))]) == [mp.OK]
                assert c.read(sp, [r])[0][2] == page_bytes(f"w{k}", r)
            assert time.monotonic() - t0 < 5
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    run_workers(worker, 8)
    assert not errors, errors
    # memd stopped reading the flooder: its 100 MiB of replies are not all queued.
    sender.join(0.5)
    assert sender.is_alive(), "memd read every request while nobody read the replies"
    # The flooder can still collect every reply, in order.
    flood.sock.settimeout(10)
    for i in range(nflood):
        r = flood.recv_frame()
        assert (r.req_id, r.op, r.count) == (i, mp.READ, 256)
    sender.join(10)
    assert not sender.is_alive()
    stall.send_raw(mp.HDR.pack(mp.MAGIC, mp.STATS, 0, 1, 0, 0)[10:])
    assert stall.recv_frame().op == mp.STATS


# ---- command line and lifecycle ---------------------------------------------------------

def _run(memd_bin, args, env_secret=None, timeout=10):
    env = {k: v for k, v in os.environ.items() if k != "FARMEM_SECRET"}
    if env_secret is not None:
        env["FARMEM_SECRET"] = env_secret
    return subprocess.run([str(memd_bin), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_missing_secret_exit_2(memd_bin, tmp_path):
    r = _run(memd_bin, ["--unix", str(tmp_path / "s.sock")])
    assert r.returncode == 2
    assert "secret" in r.stderr and "FARMEM_SECRET" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = _run(memd_bin, ["--unix", str(tmp_path / "s.sock"), "--secret-file", str(empty)])
    assert r.returncode == 2 and "empty" in r.stderr
    r = _run(memd_bin, ["--unix", str(tmp_path / "s.sock"), "--secret-file",
                        str(tmp_path / "nope")])
    assert r.returncode == 2 and "nope" in r.stderr
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("args", [
    ["--bogus"],
    ["--threads", "0"],
    ["--threads", "many"],
    ["--spin-us", "10001"],
    ["--spin-us", "soon"],
    ["--capacity", "12X"],
    ["--session-quota", "-1"],
    ["--log", "loud"],
    ["--listen", "7070"],
    ["--listen", "127.0.0.1:99999"],
    ["--ready-fd", "987"],
    ["--unix", "/tmp/" + "x" * 200],
    ["--unix"],
    [],
    ["extra-argument"],
])
def test_bad_flags_exit_2(memd_bin, tmp_path, args):
    if args and args[0] not in ("--listen", "--unix") and args != ["--unix"]:
        args = args + ["--unix", str(tmp_path / "s.sock")]
    r = _run(memd_bin, args, env_secret="s")
    assert r.returncode == 2, r.stderr
    assert "usage: farmem-memd" in r.stderr


def test_help(memd_bin):
    r = _run(memd_bin, ["--help"])
    assert r.returncode == 0 and "--ready-fd" in r.stdout


@pytest.mark.skipif(os.path.exists("/dev/swapva"), reason="kmod-swapva is loaded here")
def test_idmap_without_the_module_fails_cleanly(memd_bin, tmp_path):
    # --idmap needs /dev/swapva (kmod-swapva; the qemu lane tests it loaded): without it,
    # memd must say so and exit before it listens, leaving no socket behind.
    sock = tmp_path / "idmap.sock"
    r = _run(memd_bin, ["--idmap", "--unix", str(sock)], env_secret="s")
    assert r.returncode == 1, r.stderr
    assert "--idmap: /dev/swapva does not exist: load the kmod-swapva module" in r.stderr
    assert not sock.exists()
    r = _run(memd_bin, ["--idmap", "--numa-node", "0", "--unix", str(sock)], env_secret="s")
    assert r.returncode == 2 and "cannot be combined" in r.stderr, r.stderr
    assert "--idmap" in _run(memd_bin, ["--help"]).stdout


def test_ready_fd_and_env_secret(memd_bin, tmp_path):
    sock = tmp_path / "env.sock"
    r, w = os.pipe()
    env = dict(os.environ, FARMEM_SECRET="from-env")
    p = subprocess.Popen([str(memd_bin), "--unix", str(sock), "--ready-fd", str(w)],
                         pass_fds=(w,), env=env, stderr=subprocess.PIPE)
    os.close(w)
    try:
        assert select.select([r], [], [], 10)[0], "no ready message"
        assert os.read(r, 100) == b"ready\n"
        assert os.read(r, 100) == b"", "memd must close the ready fd"
        # Listening by the time it says so.
        assert mp.probe(f"unix:{sock}", "from-env")["used_pages"] == 0
        with pytest.raises(mp.MemdError, match="rejected the secret"):
            mp.probe(f"unix:{sock}", "from-env\n")
    finally:
        os.close(r)
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0, p.stderr.read()
    assert not sock.exists()


def test_sigterm_clean_exit(memd_bin, tmp_path):
    m = Memd(memd_bin, tmp_path, ["--threads", "3"])
    c = m.connect()
    sp = c.space_open(8)
    c.write(sp, [(0, page_bytes("t", 0))])
    assert os.path.exists(m.sock)
    assert m.stop(signal.SIGTERM) == 0
    assert not os.path.exists(m.sock), "the Unix socket must be removed"
    with pytest.raises(mp.MemdError, match="cannot connect to memd"):
        mp.probe(m.tcp_addr, SECRET, timeout=2)


def test_probe_messages(memd, tmp_path):
    with pytest.raises(mp.MemdError, match=r"cannot connect to memd at unix:.*nothing"):
        mp.probe(f"unix:{tmp_path}/nothing", SECRET)
    port = free_port()
    with pytest.raises(mp.MemdError, match=f"cannot connect to memd at tcp:127.0.0.1:{port}: "
                                           "Connection refused"):
        mp.probe(f"tcp:127.0.0.1:{port}", SECRET)
    with pytest.raises(mp.MemdError, match="bad memd address"):
        mp.probe("nonsense", SECRET)
    # Something that is not memd: a server that closes at once.
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        addr = f"127.0.0.1:{srv.getsockname()[1]}"
        t = threading.Thread(target=lambda: srv.accept()[0].close())
        t.start()
        with pytest.raises(mp.MemdError, match="closed the connection"):
            mp.probe(addr, SECRET)
        t.join()
    st = mp.probe(memd.tcp_addr, SECRET)
    assert st["version"] == 1 and st["shm"] is False and st["capacity_pages"] == (64 << 20) // PAGE
    assert mp.probe(memd.unix_addr, SECRET.decode())["shm"] is True


def test_crc32c_known_answers():
    assert mp.crc32c(b"123456789") == 0xE3069283
    assert mp.crc32c(b"") == 0
    assert mp.crc32c(bytes(32)) == 0x8A9136AA
    assert mp.crc32c(b"56789", mp.crc32c(b"1234")) == 0xE3069283
