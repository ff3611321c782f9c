"""farmem-trace (bpf/, build/bin/farmem-trace) as a child process: the one place that starts it
and reads its JSON lines. `farmem top`, `farmem trace` and `farmem run --mode kswap` use it."""

import json
import logging
import subprocess
import threading
import time

from farmem import paths
from farmem.errors import FarmemError, Unavailable

log = logging.getLogger("farmem.trace")

EXIT_NOBPF = 3  # farmem-trace: eBPF not permitted or not supported here


def trace_binary():
    return paths.build_dir() / "bin" / "farmem-trace"


class Tracer:
    """farmem-trace as a child process. JSON lines are read by a thread: `stats` keeps the
    latest totals line, `on_event` (if given) gets every event dict, `events` collects them
    when keep_events is set. Start failures raise Unavailable with farmem-trace's reason."""

    def __init__(self, pids=(), interval_ms=1000, events=(), duration_s=None, threads=True,
                 on_event=None, keep_events=False):
        self.argv = [str(trace_binary()), "-i", str(int(interval_ms))]
        for pid in pids:
            self.argv += ["-p", str(pid)]
        if events:
            self.argv += ["-e", ",".join(events)]
        if duration_s:
            self.argv += ["-d", str(max(1, int(round(duration_s))))]
        if not threads:
            self.argv.append("-T")
        self.on_event = on_event
        self.keep_events = keep_events
        self.events = []
        self.start_info = None
        self.stats = None
        self.stats_time = None
        self.proc = None
        self._reader = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.stderr = ""

    def start(self, timeout: float = 20.0) -> "Tracer":
        binary = trace_binary()
        if not binary.exists():
            raise Unavailable("eBPF tracing", f"{binary} is not built (run `make`)")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1 << 16, env=paths.helper_env())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_err, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(1)
                if self._ready.is_set():
                    break
                time.sleep(0.1)  # let the stderr reader catch the message
                msg = self.stderr.strip().splitlines()
                reason = msg[-1].removeprefix("farmem-trace: ") if msg else f"exit {self.proc.returncode}"
                raise Unavailable("eBPF tracing", reason)
            if time.monotonic() > deadline:
                self.stop()
                raise FarmemError(f"farmem-trace did not start within {timeout:.0f} s")
        return self

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr += line

    def _read(self):
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                log.debug("farmem-trace: unparsable line %r", line[:200])
                continue
            kind = d.get("type")
            if kind == "start":
                self.start_info = d
                self._ready.set()
            elif kind == "stats":
                with self._lock:
                    self.stats = d
                    self.stats_time = time.monotonic()
            elif kind == "end":
                continue
            else:
                if self.keep_events:
                    self.events.append(d)
                if self.on_event:
                    self.on_event(d)

    @property
    def features(self) -> dict:
        return (self.start_info or {}).get("features", {})

    def latest(self):
        with self._lock:
            return self.stats

    def snapshot(self) -> tuple:
        """(the latest stats line, when it arrived): one pair, never a line with another's time."""
        with self._lock:
            return self.stats, self.stats_time

    def proc_stats(self, pid: int):
        s = self.latest()
        if not s:
            return None
        for p in s.get("procs", []):
            if p["pid"] == pid:
                return p
        return None

    def wait(self, timeout=None) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: farmem-trace prints its final totals and exits 0
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader:
            self._reader.join(5)


def lat_percentile_us(hist, pct: float) -> float:
    """farmem-trace's log2 histogram (slot s = [2^s, 2^(s+1)) ns): the slot's midpoint, in µs."""
    total = sum(hist)
    if not total:
        return 0.0
    rank = max(1, -(-total * pct // 100))
    cum = 0
    for s, n in enumerate(hist):
        cum += n
        if cum >= rank:
            return round(1.5 * (1 << s) / 1000.0, 2)
    return 0.0
