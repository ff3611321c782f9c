"""The launcher's control socket (FARMEM_CONTROL): paged processes hand it their residency map.

Protocol, version 1: a pager connects to the AF_UNIX SOCK_STREAM socket when it starts and
sends one line, `FMCTL1 pid=<pid>\\n`, with its residency-map memfd attached (SCM_RIGHTS) to
the first bytes. A launcher running as root opens its socket to the processes of its run that give
up root (FARMEM_CONTROL_KEY): they send `FMCTL1 pid=<pid> key=<hex>\\n`, and a pager of another uid
is taken only with that key. The launcher answers nothing and closes the connection. It keeps every fd
so that it can read a process's final figures after the process has exited.
"""

import logging
import os
import re
import selectors
import socket
import struct
import threading

from farmem import resmap

log = logging.getLogger("farmem.control")

HELLO_RE = re.compile(rb"FMCTL1 pid=([0-9]{1,10})(?: key=([0-9a-f]{1,64}))?\n")
MAX_LINE = 160
RECV_TIMEOUT_S = 2.0


def _same(a: bytes, b: bytes) -> bool:
    import hmac  # only for other users' pagers: every farmem run imports this module
    return hmac.compare_digest(a, b)


class Pager:
    __slots__ = ("pid", "fd", "peer_pid")

    def __init__(self, pid: int, fd: int, peer_pid: int):
        self.pid, self.fd, self.peer_pid = pid, fd, peer_pid


class ControlServer:
    """Listens on a private path; a background thread accepts pagers until stop()."""

    def __init__(self, path: str):
        self.path = path
        self.also_uids: tuple = ()  # farmem run --user: that user's pagers are ours too
        self.key = ""  # a root farmem run's: other users' pagers that show it are ours too
        self.pagers: list[Pager] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.bind(path)
            os.chmod(path, 0o600)
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="farmem-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Accept what is already queued, then stop listening. Safe to call twice."""
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join()
        if self._sock.fileno() >= 0:
            self._sock.close()

    def close(self) -> None:
        """Stop, then release every map fd."""
        self.stop()
        with self._lock:
            for p in self.pagers:
                os.close(p.fd)
            self.pagers.clear()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def snapshot(self) -> list:
        with self._lock:
            return list(self.pagers)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            stopping = False
            while not stopping:
                for key, _ in sel.select():
                    if key.fileobj is self._sock:
                        self._accept_all()
                    else:
                        stopping = True
            # A pager that connected just before its process exited is still in the backlog.
            self._accept_all()

    def _accept_all(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("control socket: accept failed: %s", e)
                return
            with conn:
                try:
                    self._handle(conn)
                except (OSError, ValueError) as e:
                    log.warning("control socket: ignored a connection: %s", e)

    def _handle(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(RECV_TIMEOUT_S)
        peer_pid, peer_uid, _ = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        data, fds, _, _ = socket.recv_fds(conn, MAX_LINE, 4)
        try:
            ours = peer_uid in (os.geteuid(), 0, *self.also_uids)
            if not ours and not self.key:
                raise ValueError(f"peer pid {peer_pid} runs as uid {peer_uid}, not ours")
            while b"\n" not in data and len(data) < MAX_LINE:
                more = conn.recv(MAX_LINE - len(data))
                if not more:
                    break
                data += more
            if not data and not fds:
                # A process that ended (killed) between its connect and its hello: nothing was registered.
                log.debug("control socket: peer pid %d closed the connection without a word", peer_pid)
                return
            m = HELLO_RE.fullmatch(data)
            if not m:
                raise ValueError(f"peer pid {peer_pid} sent {data[:40]!r}..., "
                                 "not 'FMCTL1 pid=<pid>\\n'")
            if not ours and not _same(m.group(2) or b"", self.key.encode()):
                raise ValueError(f"peer pid {peer_pid} runs as uid {peer_uid}, not ours, without the run's key")
            if len(fds) != 1:
                raise ValueError(f"peer pid {peer_pid} attached {len(fds)} fds, not 1")
            fd = fds.pop()
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
                if not link.startswith("/memfd:" + resmap.MEMFD_NAME):
                    raise ValueError(f"peer pid {peer_pid} attached {link}, not a "
                                     f"{resmap.MEMFD_NAME} memfd")
            except BaseException:
                os.close(fd)
                raise
        finally:
            for extra in fds:
                os.close(extra)
        pager = Pager(pid=int(m.group(1)), fd=fd, peer_pid=peer_pid)
        log.debug("control socket: pager of pid %d registered (fd %d)", pager.pid, fd)
        with self._lock:
            self.pagers.append(pager)
