"""The embedded memory server: farmem-memd on a private Unix socket with a fresh secret.

`farmem run` starts one when no --memd is given and stops it when CMD ends; `farmem attach`'s
keeper starts one per JVM. memd runs in its own session (a Ctrl-C meant for CMD must not stop
it) and gets SIGTERM if the process that started it dies, so none is ever left behind.
"""

import ctypes
import logging
import os
import resource
import select
import signal
import subprocess
import time
from pathlib import Path

from farmem.errors import FarmemError
from farmem.paths import helper_env

log = logging.getLogger("farmem.memd")

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


def die_with_parent() -> None:
    """In a memd child: get SIGTERM if farmem itself dies, so that no memd is left behind. A limit on the
    address space (`ulimit -v`) is meant for CMD, not for the memory that holds CMD's pages: lifted as far
    as the hard limit lets (memd refused every space it could not map)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    for limit in (resource.RLIM_INFINITY, hard):
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            break
        except (ValueError, OSError):
            continue


def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    """proc's exit status once it has exited, or subprocess.TimeoutExpired after timeout seconds. Woken
    by the exit itself (a pidfd), where Popen.wait(timeout) polls in sleeps growing to 50 ms: memd
    freeing its store after a JVM exits (0.2 s for a GiB) was seen 35 ms late, every run."""
    if proc.returncode is not None:  # reaped: its pid may be another process's by now
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (before Linux 5.3)
        return proc.wait(timeout)
    try:
        waiter = select.poll()  # not select.select: an fd past 1023 is fine
        waiter.register(fd, select.POLLIN)
        if not waiter.poll(timeout * 1000):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def default_capacity() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


class EmbeddedMemd:
    """farmem-memd on a private Unix socket with a fresh secret, for the length of one run."""

    def __init__(self, binary: Path, tmpdir: str, log_level: str | None = None, capacity: int | None = None):
        self.binary = binary
        self.socket = os.path.join(tmpdir, "memd.sock")
        self.secret_file = os.path.join(tmpdir, "secret")
        self.address = "unix:" + self.socket
        self.log_level = log_level
        self.capacity = capacity or default_capacity()
        self.secret = ""
        self.proc = None

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.secret = os.urandom(32).hex()  # what secrets.token_hex does, without importing hashlib
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.secret)
        r, w = os.pipe()
        argv = [str(self.binary), "--unix", self.socket, "--secret-file", self.secret_file,
                "--ready-fd", str(w), "--capacity", str(self.capacity)]
        if self.log_level:
            argv += ["--log", self.log_level]
        log.debug("starting %s", " ".join(argv))
        try:
            try:
                # Its own session: a Ctrl-C meant for CMD must not stop memd under it.
                self.proc = subprocess.Popen(argv, pass_fds=(w,), stdin=subprocess.DEVNULL, env=helper_env(),
                                             start_new_session=True, preexec_fn=die_with_parent)
            except OSError as e:
                raise FarmemError(f"cannot start {self.binary}: {e.strerror or e}") from None
            finally:
                os.close(w)
            self._wait_ready(r, timeout)
        finally:
            os.close(r)

    def _wait_ready(self, r: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop(quiet=True)
                raise FarmemError(f"the embedded memd ({self.binary}) did not report ready within "
                                  f"{timeout:.0f} s")
            if not select.select([r], [], [], left)[0]:
                continue
            chunk = os.read(r, 64)
            if not chunk:
                try:
                    rc = self.proc.wait(1.0)
                    how = (f"exited with status {rc}" if rc >= 0 else
                           f"was killed by signal {-rc} ({signal.Signals(-rc).name})")
                except subprocess.TimeoutExpired:
                    how = "closed its ready pipe"
                self.stop(quiet=True)
                raise FarmemError(f"the embedded memd ({self.binary}) {how} before it was ready; "
                                  "its messages, if any, are above")
            buf += chunk
        line = buf.split(b"\n", 1)[0]
        if line != b"ready":
            self.stop(quiet=True)
            raise FarmemError(f"the embedded memd wrote {line!r} on its ready pipe instead of 'ready'")
        log.debug("memd ready on %s", self.socket)

    def stop(self, quiet: bool = False) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S. Warns if memd had died on its own."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                wait_exit(proc, STOP_TIMEOUT_S)
                return
            except subprocess.TimeoutExpired:
                log.warning("the embedded memd ignored SIGTERM for %.0f s: killing it", STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
                return
        if not quiet:
            log.warning("the embedded memd had exited during the run (status %s)", proc.returncode)
