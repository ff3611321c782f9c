"""A small pure-Python client of the farmem memd wire protocol, version 1.

The protocol is described in docs/protocol.md (its C form is memd/common/protocol.h).
This module is for probes and tests, not for paging: it speaks the stream
protocol over TCP or a Unix socket, one request at a time unless the caller
pipelines with send_frame/recv_frame.

    from farmem import memdproto
    stats = memdproto.probe("unix:/run/farmem/memd.sock", secret)   # or raises MemdError
    c = memdproto.connect("tcp:10.0.0.2:7070", secret)
    sp = c.space_open(1024)
    c.write(sp, [(0, b"x" * 4096)])
    [(status, crc, data)] = c.read(sp, [0])

Only the standard library is used; crc32c is a table-driven pure-Python one.
"""

import hashlib
import hmac
import os
import socket
import struct

__all__ = [
    "MemdError", "MemdStatusError", "Conn", "Frame", "connect", "probe", "crc32c",
    "parse_addr", "read_secret_file",
]

MAGIC = 0x31444D46  # "FMD1"
VERSION = 1
PAGE_SIZE = 4096
NONCE_LEN = 32
MAC_LEN = 32
SESSION_KEY_LEN = 16
MAX_BATCH = 256
MAX_RANGES = 1024
MAX_SPACE_PAGES = 1 << 36
MAX_PAYLOAD = MAX_BATCH * (PAGE_SIZE + 16) + 64
HELLO_F_SHM = 1
HELLO_F_COPY = 2   # memd knows COPY (an optional op of version 1)
HELLO_F_EDIT = 4   # memd knows EDIT (byte-granular changes in its store, another optional op)
HELLO_F_ALLOC = 8  # memd knows SHM_ALLOC (it allocates a mapped space's slots, charged to its cgroup)
HELLO_F_RDMA_REG = 16  # both sides: RDMA regions are registered chunk by chunk (RDMA_REG)
HELLO_F_RDMA_UNREG = 32  # memd knows RDMA_UNREG (an emptied chunk goes back)
SHM_PRESENT = 1

# Ops
HELLO, AUTH, SESSION_NEW, SESSION_JOIN = 1, 2, 3, 4
SPACE_OPEN, SPACE_CLOSE, READ, WRITE, DISCARD = 5, 6, 7, 8, 9
STATS, SHM_MAP, QUOTA, RDMA_MAP, COPY, EDIT, SHM_ALLOC, RDMA_REG = 10, 11, 12, 13, 14, 15, 16, 17
RDMA_UNREG = 18
ERROR = 0x7FFF

# Status codes (header status of FM_OP_ERROR replies, and per-page statuses)
OK, E_PROTO, E_VERSION, E_AUTH, E_OP, E_RANGE, E_TOOBIG = 0, 1, 2, 3, 4, 5, 6
E_FULL, E_NOSPACE, E_CRC, E_ABSENT, E_STATE, E_NOSHM, E_INTERNAL = 7, 8, 9, 10, 11, 12, 13

STATUS_NAMES = {
    OK: "OK", E_PROTO: "E_PROTO", E_VERSION: "E_VERSION", E_AUTH: "E_AUTH", E_OP: "E_OP",
    E_RANGE: "E_RANGE", E_TOOBIG: "E_TOOBIG", E_FULL: "E_FULL", E_NOSPACE: "E_NOSPACE",
    E_CRC: "E_CRC", E_ABSENT: "E_ABSENT", E_STATE: "E_STATE", E_NOSHM: "E_NOSHM",
    E_INTERNAL: "E_INTERNAL",
}

HDR = struct.Struct("<IHHQII")           # magic op status req_id count len
HELLO_REQ = struct.Struct("<HHI32s")
HELLO_REP = struct.Struct("<HHI32s")
SESSION = struct.Struct("<Q16s")
SPACE_OPEN_REQ = struct.Struct("<QII")
SPACE_REF = struct.Struct("<II")
PAGE_STATUS = struct.Struct("<II")
WRITE_ENT = struct.Struct("<QII")
RANGE = struct.Struct("<QQ")
COPY_REQ = struct.Struct("<II")            # src_space dst_space
COPY_ENT = struct.Struct("<QQ")            # src_page dst_page
EDIT_ENT = struct.Struct("<HHIQQ")         # kind reserved len src dst
EDIT_MOVE, EDIT_PUT, EDIT_GET = 1, 2, 3
QUOTA_REQ = struct.Struct("<q")
QUOTA_REP = struct.Struct("<Q")
SHM_MAP_REP = struct.Struct("<QQQQ")
SHM_META = struct.Struct("<II")           # crc flags
STATS_FIELDS = ("capacity_pages", "used_pages", "sessions", "spaces", "connections",
                "reads", "writes", "discards", "errors", "full_rejects")
STATS_REP = struct.Struct("<" + "Q" * len(STATS_FIELDS))
SHM_MAP_FIELDS = ("npages", "data_offset", "meta_offset", "map_len")


# ---- crc32c ------------------------------------------------------------------

def _crc_table():
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    """crc32c (Castagnoli) of data; crc32c(b"123456789") == 0xE3069283.

    Pass a previous result as crc to continue a running checksum."""
    table = _CRC_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# ---- errors and addresses ---------------------------------------------------

class MemdError(Exception):
    """Anything that went wrong talking to memd; str() is a sentence for a user."""


class MemdStatusError(MemdError):
    """memd answered a request with FM_OP_ERROR."""

    def __init__(self, status, message, op=None):
        self.status = status
        self.message = message
        self.op = op
        name = STATUS_NAMES.get(status, str(status))
        super().__init__(f"memd refused the request ({name}): {message}")


class MemdClosed(MemdError):
    """memd closed the connection."""


def parse_addr(addr):
    """"unix:/path", "tcp:HOST:PORT", "HOST:PORT" or "[V6]:PORT" ->
    ("unix", path) or ("tcp", host, port)."""
    if not isinstance(addr, str) or not addr:
        raise MemdError(f"bad memd address {addr!r}: want unix:PATH, tcp:HOST:PORT or HOST:PORT")
    if addr.startswith("unix:"):
        path = addr[5:]
        if not path:
            raise MemdError(f"bad memd address {addr!r}: no socket path after unix:")
        return ("unix", path)
    rest = addr[4:] if addr.startswith("tcp:") else addr
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise MemdError(f"bad memd address {addr!r}: want unix:PATH, tcp:HOST:PORT or HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise MemdError(f"bad memd address {addr!r}: no host before the port")
    return ("tcp", host, int(port))


def read_secret_file(path):
    """The secret as memd reads it: the file's bytes, trailing newlines stripped."""
    with open(path, "rb") as f:
        return f.read().rstrip(b"\r\n")


def _secret_bytes(secret):
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret:
        raise MemdError("no secret given: memd always requires one")
    return bytes(secret)


class Frame:
    """A frame as received: header fields, payload bytes and any passed fds."""

    __slots__ = ("magic", "op", "status", "req_id", "count", "len", "payload", "fds")

    def __init__(self, magic, op, status, req_id, count, length, payload, fds):
        self.magic, self.op, self.status, self.req_id = magic, op, status, req_id
        self.count, self.len, self.payload, self.fds = count, length, payload, fds

    @property
    def message(self):
        return self.payload.decode("utf-8", "replace") if self.op == ERROR else ""

    def __repr__(self):
        return (f"Frame(op={self.op}, status={self.status}, req_id={self.req_id}, "
                f"count={self.count}, len={self.len}, fds={self.fds})")


# ---- connection -------------------------------------------------------------

class Conn:
    """One connection to memd. Not thread-safe."""

    def __init__(self, addr, timeout=10.0):
        self.addr = addr
        kind = parse_addr(addr)
        self.is_unix = kind[0] == "unix"
        self.version = None
        self.server_flags = 0
        self.session_id = None
        self.session_key = None
        self._next_id = 1
        try:
            if self.is_unix:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(timeout)
                try:
                    s.connect(kind[1])
                except BaseException:
                    s.close()
                    raise
            else:
                s = socket.create_connection((kind[1], kind[2]), timeout=timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except socket.timeout:
            raise MemdError(f"cannot connect to memd at {addr}: timed out after {timeout} s") from None
        except OSError as e:
            raise MemdError(f"cannot connect to memd at {addr}: {e.strerror or e}") from None
        self.sock = s

    # -- raw frames --

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def new_req_id(self):
        rid = self._next_id
        self._next_id += 1
        return rid

    def _send(self, data):
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise MemdError(f"memd at {self.addr} did not take the request in time") from None
        except ConnectionError as e:
            raise MemdClosed(f"memd at {self.addr} closed the connection: {e.strerror or e}") from None

    def send_raw(self, data):
        self._send(data)

    def send_frame(self, op, payload=b"", count=0, req_id=None, status=0, magic=MAGIC,
                   length=None):
        """Send one frame; length overrides the header's len (for hostile tests)."""
        if req_id is None:
            req_id = self.new_req_id()
        payload = bytes(payload)
        hdr = HDR.pack(magic, op, status, req_id, count, len(payload) if length is None else length)
        self._send(hdr + payload)
        return req_id

    def _recv_exact(self, n, fds):
        buf = bytearray()
        while len(buf) < n:
            if self.is_unix:
                # The fd of an SHM_MAP reply rides on its first byte: always
                # read with room for it, or the kernel drops it.
                data, anc, _flags, _addr = self.sock.recvmsg(
                    n - len(buf), socket.CMSG_SPACE(16 * 4))
                for level, typ, cdata in anc:
                    if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                        usable = len(cdata) - len(cdata) % 4
                        fds.extend(struct.unpack(f"<{usable // 4}i", cdata[:usable]))
            else:
                data = self.sock.recv(n - len(buf))
            if not data:
                raise MemdClosed(f"memd at {self.addr} closed the connection")
            buf += data
        return bytes(buf)

    def recv_frame(self):
        """Receive one frame (raises MemdClosed at end of stream)."""
        fds = []
        try:
            hdr = self._recv_exact(HDR.size, fds)
            magic, op, status, req_id, count, length = HDR.unpack(hdr)
            if magic != MAGIC:
                raise MemdError(f"memd at {self.addr} sent a frame with bad magic {magic:#x}")
            if length > MAX_PAYLOAD:
                raise MemdError(f"memd at {self.addr} sent a frame of {length} bytes")
            payload = self._recv_exact(length, fds) if length else b""
        except socket.timeout:
            raise MemdError(f"memd at {self.addr} did not answer in time") from None
        except ConnectionError as e:
            raise MemdClosed(f"memd at {self.addr} closed the connection: {e.strerror or e}") from None
        return Frame(magic, op, status, req_id, count, length, payload, fds)

    def request(self, op, payload=b"", count=0):
        """Send a request and return its reply; FM_OP_ERROR raises MemdStatusError."""
        rid = self.send_frame(op, payload, count)
        rep = self.recv_frame()
        return self._check(rep, op, rid)

    def _check(self, rep, op, rid):
        if rep.req_id != rid:
            raise MemdError(f"memd at {self.addr} answered request {rep.req_id}, expected {rid}")
        if rep.op == ERROR:
            for fd in rep.fds:
                os.close(fd)
            raise MemdStatusError(rep.status, rep.message, op)
        if rep.op != op or rep.status != OK:
            raise MemdError(f"memd at {self.addr} answered op {op} with op {rep.op} "
                            f"status {rep.status}")
        return rep

    # -- handshake --

    def hello(self, min_version=VERSION, max_version=VERSION, client_nonce=None):
        self.client_nonce = client_nonce or os.urandom(NONCE_LEN)
        rep = self.request(HELLO, HELLO_REQ.pack(min_version, max_version, 0, self.client_nonce))
        if len(rep.payload) != HELLO_REP.size:
            raise MemdError(f"memd at {self.addr} sent a malformed HELLO reply")
        self.version, _, self.server_flags, self.server_nonce = HELLO_REP.unpack(rep.payload)
        return self.version, self.server_flags

    def auth(self, secret):
        secret = _secret_bytes(secret)
        mac = hmac.new(secret, b"farmem-client-v1" + self.server_nonce + self.client_nonce,
                       hashlib.sha256).digest()
        rep = self.request(AUTH, mac)
        want = hmac.new(secret, b"farmem-server-v1" + self.client_nonce + self.server_nonce,
                        hashlib.sha256).digest()
        if not hmac.compare_digest(rep.payload, want):
            self.close()
            raise MemdError(f"memd at {self.addr} failed to prove that it knows the secret")

    def session_new(self):
        rep = self.request(SESSION_NEW)
        self.session_id, self.session_key = SESSION.unpack(rep.payload)
        return self.session_id, self.session_key

    def session_join(self, session_id, key):
        self.request(SESSION_JOIN, SESSION.pack(session_id, key))
        self.session_id, self.session_key = session_id, key

    # -- spaces and pages --

    def space_open(self, npages, flags=0):
        rep = self.request(SPACE_OPEN, SPACE_OPEN_REQ.pack(npages, flags, 0))
        return SPACE_REF.unpack(rep.payload)[0]

    def space_close(self, space):
        self.request(SPACE_CLOSE, SPACE_REF.pack(space, 0))

    def read(self, space, pages):
        """-> [(status, crc, bytes)] per page; bytes are zeros unless status is OK."""
        pages = list(pages)
        payload = SPACE_REF.pack(space, 0) + b"".join(struct.pack("<Q", p) for p in pages)
        rep = self.request(READ, payload, len(pages))
        n = len(pages)
        out = []
        base = n * PAGE_STATUS.size
        for i in range(n):
            st, crc = PAGE_STATUS.unpack_from(rep.payload, i * PAGE_STATUS.size)
            out.append((st, crc, rep.payload[base + i * PAGE_SIZE: base + (i + 1) * PAGE_SIZE]))
        return out

    def write(self, space, items, crcs=None):
        """items: [(page, 4096 bytes)] -> [status]; crcs overrides the checksums sent."""
        items = list(items)
        ents, datas = [], []
        for i, (page, data) in enumerate(items):
            data = bytes(data)
            if len(data) != PAGE_SIZE:
                raise ValueError(f"page {page}: {len(data)} bytes, want {PAGE_SIZE}")
            crc = crcs[i] if crcs is not None else crc32c(data)
            ents.append(WRITE_ENT.pack(page, crc, 0))
            datas.append(data)
        payload = SPACE_REF.pack(space, 0) + b"".join(ents) + b"".join(datas)
        rep = self.request(WRITE, payload, len(items))
        return list(struct.unpack(f"<{len(items)}I", rep.payload))

    def copy(self, src, dst, pairs):
        """pairs: [(src_page, dst_page)]: memd copies src's pages (bytes and crc) to dst's
        slots, in order -> [status] (OK, E_ABSENT, E_FULL or E_RANGE)."""
        pairs = list(pairs)
        payload = COPY_REQ.pack(src, dst) + b"".join(COPY_ENT.pack(s, d) for s, d in pairs)
        rep = self.request(COPY, payload, len(pairs))
        return list(struct.unpack(f"<{len(pairs)}I", rep.payload))

    def edit(self, space, entries):
        """entries: [(EDIT_MOVE, len, src, dst) | (EDIT_PUT, bytes, dst) | (EDIT_GET, len, src)], byte
        offsets in the space, applied in order by memd, all or nothing -> the GET entries' bytes."""
        ents, put = [], []
        for e in entries:
            if e[0] == EDIT_MOVE:
                ents.append(EDIT_ENT.pack(EDIT_MOVE, 0, e[1], e[2], e[3]))
            elif e[0] == EDIT_PUT:
                ents.append(EDIT_ENT.pack(EDIT_PUT, 0, len(e[1]), 0, e[2]))
                put.append(e[1])
            else:
                ents.append(EDIT_ENT.pack(EDIT_GET, 0, e[1], e[2], 0))
        rep = self.request(EDIT, SPACE_REF.pack(space, 0) + b"".join(ents) + b"".join(put), len(ents))
        return rep.payload

    def discard(self, space, ranges):
        """ranges: [(first, npages)]."""
        ranges = list(ranges)
        payload = SPACE_REF.pack(space, 0) + b"".join(RANGE.pack(f, n) for f, n in ranges)
        self.request(DISCARD, payload, len(ranges))

    def stats(self):
        rep = self.request(STATS)
        return dict(zip(STATS_FIELDS, STATS_REP.unpack(rep.payload)))

    def quota(self, delta):
        """Reserve (>0) or release (<0) pages; returns the session's grant."""
        rep = self.request(QUOTA, QUOTA_REQ.pack(delta))
        return QUOTA_REP.unpack(rep.payload)[0]

    def shm_map(self, space):
        """-> (fd, {npages, data_offset, meta_offset, map_len}); the caller closes fd."""
        rep = self.request(SHM_MAP, SPACE_REF.pack(space, 0))
        if len(rep.fds) != 1:
            for fd in rep.fds:
                os.close(fd)
            raise MemdError(f"memd at {self.addr} sent {len(rep.fds)} fds with SHM_MAP")
        return rep.fds[0], dict(zip(SHM_MAP_FIELDS, SHM_MAP_REP.unpack(rep.payload)))


def connect(addr, secret, session=None, timeout=10.0):
    """Connect, HELLO, AUTH (checking memd's own proof), then SESSION_NEW, or
    SESSION_JOIN when session is a (session_id, key) pair."""
    c = Conn(addr, timeout)
    try:
        c.hello()
        c.auth(secret)
        if session is None:
            c.session_new()
        else:
            c.session_join(*session)
    except BaseException:
        c.close()
        raise
    return c


def probe(addr, secret, timeout=3.0):
    """Check that a memd answers at addr and accepts secret; returns its stats
    (plus "version" and "shm") or raises MemdError with a sentence for the user."""
    try:
        c = Conn(addr, timeout)
    except MemdError:
        raise
    try:
        try:
            version, flags = c.hello()
        except MemdStatusError as e:
            if e.status == E_VERSION:
                raise MemdError(f"memd at {addr} speaks no protocol version this farmem knows "
                                f"({e.message})") from None
            raise MemdError(f"memd at {addr} refused the handshake: {e.message}") from None
        except MemdClosed:
            raise MemdError(f"memd at {addr} closed the connection during the handshake "
                            f"(is it a farmem memd?)") from None
        try:
            c.auth(secret)
        except (MemdStatusError, MemdClosed) as e:
            if isinstance(e, MemdStatusError) and e.status != E_AUTH:
                raise MemdError(f"memd at {addr} refused authentication: {e.message}") from None
            raise MemdError(f"memd at {addr} rejected the secret (authentication failed)") from None
        st = c.stats()
        st["version"] = version
        st["shm"] = bool(flags & HELLO_F_SHM)
        return st
    except MemdError:
        raise
    except socket.timeout:
        raise MemdError(f"memd at {addr} did not answer within {timeout} s") from None
    except OSError as e:
        raise MemdError(f"lost the connection to memd at {addr}: {e.strerror or e}") from None
    finally:
        c.close()
