# SPDX-License-Identifier: Apache-2.0
"""Run a command under Linux swap with a local-memory limit: the baseline every
farmem figure is compared with (DESIGN.md, paging mode "kswap").

    with SwapEnv(limit_bytes=128 << 20) as env:
        r = env.run(["build/bench/faultlat", "--size", "512M", "--json"])
        print(r.wall_s, r.majflt, r.stdout)

What it does, and undoes on exit (also after an exception, SIGTERM or SIGINT):

* swap: when the machine has no active swap, it sets up a zram device (an
  unused /dev/zramN with disksize 0, else a new one from
  /sys/class/zram-control/hot_add), `mkswap`s it and `swapon -p 100`s it.
  Teardown: swapoff, reset the device, hot_remove it if it was added here.
  When swap is already active it is used as it is and left alone
  (zram="always" adds a zram device anyway, at a higher priority).
* a memory cgroup limited to the local budget: cgroup v1
  (/sys/fs/cgroup/memory, memory.limit_in_bytes) when mounted, else cgroup v2
  (memory.max, memory.swap.max=max).  The command is started through a tiny
  shell wrapper that writes its own pid into cgroup.procs and then execs the
  command, so every byte it touches is charged to the cgroup.  Teardown kills
  whatever the command left in the cgroup and removes the cgroup.
* per run: wall time, the child's rusage (major and minor faults, from
  wait4), the cgroup's memory.stat pgmajfault, the global pswpin/pswpout deltas
  and the cgroup's peak usage.

Runs as root.  Setups are serialised with a lock file, so two benchmark
drivers (or a driver and `farmem run --mode kswap`) never fight over zram
devices.  Standard library only: bench/ drivers import it as farmem.swap.

Command line (for trying it by hand):

    python3 -m farmem.swap --limit 64M [--zram-size 1G] -- CMD ARGS...

prints the command's output, then a JSON line with the run's figures on stderr,
and exits with the command's status.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

ZRAM_CONTROL = "/sys/class/zram-control"
CG1_MEMORY = "/sys/fs/cgroup/memory"
LOCK_FILE = "/run/farmem-bench-swap.lock"
CG_PREFIX = "farmem-swap-"


class SwapSetupError(RuntimeError):
    """Swap or cgroups cannot be set up on this machine (the message says why)."""


def parse_size(s: str | int) -> int:
    """'512M', '1G', '4096', '64MiB' -> bytes."""
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*", s)
    if not m:
        raise ValueError(f"bad size {s!r}")
    mul = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(m.group(1)) * mul


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str | int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def active_swaps() -> list[dict]:
    """Entries of /proc/swaps: [{'name', 'type', 'size_kb', 'used_kb', 'prio'}]."""
    out = []
    try:
        lines = _read("/proc/swaps").splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) >= 5:
            out.append({"name": f[0], "type": f[1], "size_kb": int(f[2]),
                        "used_kb": int(f[3]), "prio": int(f[4])})
    return out


def _vmstat() -> dict[str, int]:
    d = {}
    for line in _read("/proc/vmstat").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            d[k] = int(v)
    return d


def _memstat(path: str) -> dict[str, int]:
    d = {}
    try:
        for line in _read(path).splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                d[k] = int(v)
    except OSError:
        pass
    return d


def _tool(name: str) -> str:
    """Path of an admin tool: root's PATH may lack /sbin when run from a venv or make."""
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    raise SwapSetupError(f"{name} not found (util-linux)")


def _run_tool(argv: Sequence[str]) -> None:
    argv = [_tool(argv[0])] + list(argv[1:])
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SwapSetupError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")


@dataclass
class RunResult:
    """One command run under the limit."""
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    majflt: int                 # the child's (and its waited-for children's) major faults, from wait4
    minflt: int
    cg_pgmajfault: Optional[int]  # the cgroup's memory.stat pgmajfault during the run
    pswpin: int                 # global /proc/vmstat deltas during the run
    pswpout: int
    peak_usage_bytes: Optional[int]
    limit_bytes: int
    swap_devices: list[dict] = field(default_factory=list)
    timed_out: bool = False

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("stdout")
        d.pop("stderr")
        return d


class _Cgroup:
    """A memory cgroup with a hard limit: v1 when mounted, else v2."""

    def __init__(self, limit_bytes: int, name: str):
        self.limit = limit_bytes
        self.path: Optional[str] = None
        self.version = 0
        if os.path.isfile(os.path.join(CG1_MEMORY, "memory.limit_in_bytes")):
            self.version = 1
            parent = CG1_MEMORY
        else:
            parent = self._v2_parent()
            self.version = 2
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError as e:
            raise SwapSetupError(f"cannot create memory cgroup {path}: {e}") from e
        self.path = path
        try:
            if self.version == 1:
                # a process may not already be in it; set the limit before anything runs
                _write(os.path.join(path, "memory.limit_in_bytes"), limit_bytes)
                # swap is charged to memory.memsw (when enabled): leave it unlimited
            else:
                _write(os.path.join(path, "memory.max"), limit_bytes)
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "max")
        except OSError as e:
            self.remove()
            raise SwapSetupError(f"cannot set the memory limit on {path}: {e}") from e

    @staticmethod
    def _v2_parent() -> str:
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            ctl = os.path.join(root, "cgroup.controllers")
            if not os.path.isfile(ctl):
                continue
            if "memory" not in _read(ctl).split():
                continue
            sub = os.path.join(root, "cgroup.subtree_control")
            if "memory" not in _read(sub).split():
                try:
                    _write(sub, "+memory")
                except OSError as e:
                    raise SwapSetupError(f"cannot enable the memory controller in {sub}: {e}") from e
            return root
        raise SwapSetupError("no memory cgroup: neither v1 /sys/fs/cgroup/memory nor a cgroup v2 "
                             "hierarchy with the memory controller is available")

    @property
    def procs(self) -> str:
        assert self.path
        return os.path.join(self.path, "cgroup.procs")

    def memstat(self) -> dict[str, int]:
        assert self.path
        return _memstat(os.path.join(self.path, "memory.stat"))

    def pgmajfault(self) -> Optional[int]:
        st = self.memstat()
        for k in ("total_pgmajfault", "pgmajfault"):
            if k in st:
                return st[k]
        return None

    def peak(self) -> Optional[int]:
        assert self.path
        for f in ("memory.max_usage_in_bytes", "memory.peak"):
            p = os.path.join(self.path, f)
            if os.path.exists(p):
                try:
                    return int(_read(p).strip())
                except (OSError, ValueError):
                    return None
        return None

    def reset_peak(self) -> None:
        assert self.path
        p = os.path.join(self.path, "memory.max_usage_in_bytes")
        if os.path.exists(p):
            try:
                _write(p, 0)
            except OSError:
                pass

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in _read(self.procs).split()]
        except OSError:
            return []

    def remove(self) -> None:
        if not self.path:
            return
        # Whatever the command left behind was started by us: end it by pid.
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for _ in range(100):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SwapSetupError(f"could not remove cgroup {self.path}")
        self.path = None


class _Zram:
    """A zram swap device set up here and removed on close()."""

    def __init__(self, disksize: int, algorithm: Optional[str]):
        self.dev: Optional[int] = None
        self.hot_added = False
        self.swapped_on = False
        self.disksize = disksize
        self.algorithm = algorithm
        if not os.path.isdir("/sys/block/zram0") and not os.path.isdir(ZRAM_CONTROL):
            raise SwapSetupError("zram is not available (no /sys/block/zram0 and no "
                                 f"{ZRAM_CONTROL}; the zram module is not built in)")
        self.dev = self._pick()
        try:
            blk = f"/sys/block/zram{self.dev}"
            if algorithm:
                try:
                    _write(f"{blk}/comp_algorithm", algorithm)
                except OSError as e:
                    raise SwapSetupError(f"zram{self.dev}: compression algorithm {algorithm!r} "
                                         f"rejected ({e}); available: "
                                         f"{_read(blk + '/comp_algorithm').strip()}") from e
            _write(f"{blk}/disksize", disksize)
            _run_tool(["mkswap", f"/dev/zram{self.dev}"])
            _run_tool(["swapon", "-p", "100", f"/dev/zram{self.dev}"])
            self.swapped_on = True
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        return f"/dev/zram{self.dev}"

    def _pick(self) -> int:
        in_use = {s["name"] for s in active_swaps()}
        mounted = _read("/proc/mounts")
        for entry in sorted(os.listdir("/sys/block")):
            m = re.fullmatch(r"zram(\d+)", entry)
            if not m:
                continue
            n = int(m.group(1))
            try:
                size = int(_read(f"/sys/block/{entry}/disksize").strip())
            except (OSError, ValueError):
                continue
            if size == 0 and f"/dev/{entry}" not in in_use and f"/dev/{entry} " not in mounted:
                return n
        if os.path.isfile(os.path.join(ZRAM_CONTROL, "hot_add")):
            try:
                n = int(_read(os.path.join(ZRAM_CONTROL, "hot_add")).strip())
            except (OSError, ValueError) as e:
                raise SwapSetupError(f"zram hot_add failed: {e}") from e
            self.hot_added = True
            for _ in range(100):   # udev may take a moment to create the node
                if os.path.exists(f"/dev/zram{n}"):
                    break
                time.sleep(0.02)
            else:
                raise SwapSetupError(f"/dev/zram{n} did not appear after hot_add")
            return n
        raise SwapSetupError("no unused zram device and no zram-control/hot_add")

    def stats(self) -> dict:
        if self.dev is None:
            return {}
        try:
            f = _read(f"/sys/block/zram{self.dev}/mm_stat").split()
            return {"orig_data_size": int(f[0]), "compr_data_size": int(f[1]),
                    "mem_used_total": int(f[2])}
        except (OSError, ValueError, IndexError):
            return {}

    def close(self) -> None:
        if self.dev is None:
            return
        blk = f"/sys/block/zram{self.dev}"
        errors = []
        if self.swapped_on or self.name in {s["name"] for s in active_swaps()}:
            r = subprocess.run([_tool("swapoff"), self.name], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            if r.returncode != 0 and self.name in {s["name"] for s in active_swaps()}:
                errors.append(f"swapoff {self.name}: {r.stderr.strip()}")
            self.swapped_on = False
        for _ in range(50):
            try:
                _write(f"{blk}/reset", 1)
                break
            except OSError:           # EBUSY right after swapoff
                time.sleep(0.05)
        else:
            errors.append(f"cannot reset {self.name}")
        if self.hot_added:
            try:
                _write(os.path.join(ZRAM_CONTROL, "hot_remove"), self.dev)
            except OSError as e:
                errors.append(f"hot_remove zram{self.dev}: {e}")
        self.dev = None
        if errors:
            raise SwapSetupError("; ".join(errors))


class SwapEnv:
    """Context manager: swap (zram when none is active) plus a memory cgroup limited
    to limit_bytes; run() starts commands inside it.  Everything is undone on exit."""

    def __init__(self, limit_bytes: int | str, zram_size: int | str | None = None,
                 algorithm: Optional[str] = None, zram: str = "auto", name: Optional[str] = None):
        self.limit = parse_size(limit_bytes)
        if self.limit < (4 << 20):
            raise ValueError("limit below 4 MiB is not a useful budget")
        self.zram_size = parse_size(zram_size) if zram_size is not None else max(2 << 30, 4 * self.limit)
        self.algorithm = algorithm
        if zram not in ("auto", "always", "never"):
            raise ValueError("zram must be auto, always or never")
        self.zram_mode = zram
        self.name = name or f"{CG_PREFIX}{os.getpid()}-{int(time.time() * 1000) % 10**9}"
        self._zram: Optional[_Zram] = None
        self._cg: Optional[_Cgroup] = None
        self._lock_fd: Optional[int] = None
        self._old_handlers: dict[int, object] = {}

    # -- setup / teardown ---------------------------------------------------------

    def cgroup_figures(self) -> tuple[Optional[int], Optional[int]]:
        """The cgroup's major faults so far and its peak memory usage: every process of the run."""
        return (self._cg.pgmajfault(), self._cg.peak()) if self._cg else (None, None)

    def __enter__(self) -> "SwapEnv":
        if os.geteuid() != 0:
            raise SwapSetupError("the Linux swap baseline needs root (swapon, zram, cgroups)")
        self._install_signal_handlers()
        try:
            self._lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            remove_stale()
            swaps = active_swaps()
            if self.zram_mode == "always" or (self.zram_mode == "auto" and not swaps):
                self._zram = _Zram(self.zram_size, self.algorithm)
            elif not swaps:
                raise SwapSetupError("no swap is active and zram='never'")
            self._cg = _Cgroup(self.limit, self.name)
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()

    def close(self) -> None:
        self._teardown()

    def _teardown(self) -> None:
        errors = []
        try:
            if self._cg is not None:
                try:
                    self._cg.remove()
                except SwapSetupError as e:
                    errors.append(str(e))
                self._cg = None
            if self._zram is not None:
                try:
                    self._zram.close()
                except SwapSetupError as e:
                    errors.append(str(e))
                self._zram = None
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._restore_signal_handlers()
        if errors:
            raise SwapSetupError("teardown: " + "; ".join(errors))

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, h in self._old_handlers.items():
            try:
                signal.signal(sig, h)  # type: ignore[arg-type]
            except (ValueError, OSError, TypeError):
                pass
        self._old_handlers.clear()

    # -- information ----------------------------------------------------------------

    @property
    def cgroup_path(self) -> Optional[str]:
        return self._cg.path if self._cg else None

    @property
    def cgroup_version(self) -> int:
        return self._cg.version if self._cg else 0

    @property
    def zram_device(self) -> Optional[str]:
        return self._zram.name if self._zram else None

    def describe(self) -> dict:
        return {"limit_bytes": self.limit, "cgroup": self.cgroup_path,
                "cgroup_version": self.cgroup_version, "zram": self.zram_device,
                "zram_disksize": self.zram_size if self._zram else None,
                "zram_algorithm": self._zram_algorithm(), "swaps": active_swaps()}

    def _zram_algorithm(self) -> Optional[str]:
        if not self._zram or self._zram.dev is None:
            return None
        try:
            m = re.search(r"\[([^\]]+)\]", _read(f"/sys/block/zram{self._zram.dev}/comp_algorithm"))
            return m.group(1) if m else None
        except OSError:
            return None

    # -- running ----------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: Optional[float] = None,
            env: Optional[dict] = None, cwd: Optional[str] = None,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> RunResult:
        """Run argv inside the cgroup; wait for it; return its figures.
        stdout/stderr: PIPE (captured into the result) or a file object / None (inherit)."""
        if self._cg is None:
            raise RuntimeError("SwapEnv.run outside the with block")
        argv = [str(a) for a in argv]
        # The wrapper joins the cgroup, then becomes the command (same pid).
        wrapper = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self._cg.procs] + argv
        self._cg.reset_peak()
        maj0 = self._cg.pgmajfault()
        vm0 = _vmstat()
        t0 = time.monotonic()
        p = subprocess.Popen(wrapper, stdout=stdout, stderr=stderr, env=env, cwd=cwd, text=True)
        outs: dict[str, str] = {"out": "", "err": ""}
        readers = []
        for key, stream in (("out", p.stdout), ("err", p.stderr)):
            if stream is not None:
                def pump(s=stream, k=key):
                    outs[k] = s.read()
                th = threading.Thread(target=pump, daemon=True)
                th.start()
                readers.append(th)
        timed_out = False
        status = None
        ru = None
        deadline = None if timeout is None else t0 + timeout
        try:
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == p.pid:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    p.kill()
                    _, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.005)
        except BaseException:
            try:
                p.kill()
                os.wait4(p.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            raise
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        for th in readers:
            th.join(timeout=10)
        vm1 = _vmstat()
        maj1 = self._cg.pgmajfault()
        return RunResult(
            argv=argv, returncode=p.returncode, stdout=outs["out"], stderr=outs["err"],
            wall_s=wall, majflt=ru.ru_majflt, minflt=ru.ru_minflt,
            cg_pgmajfault=(maj1 - maj0) if (maj0 is not None and maj1 is not None) else None,
            pswpin=vm1.get("pswpin", 0) - vm0.get("pswpin", 0),
            pswpout=vm1.get("pswpout", 0) - vm0.get("pswpout", 0),
            peak_usage_bytes=self._cg.peak(), limit_bytes=self.limit,
            swap_devices=active_swaps(), timed_out=timed_out)


def remove_stale() -> list[str]:
    """Remove the cgroups of runs whose process is gone (killed by SIGKILL before its teardown):
    each is named after its run's pid, and one left behind made the next run's check of leftovers
    fail. Only empty ones: the kernel refuses the others. Under LOCK_FILE, so no run of ours is
    setting one up meanwhile. The paths removed."""
    gone = []
    for path in leftovers():
        m = re.match(re.escape(CG_PREFIX) + r"(\d+)-", os.path.basename(path))
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its run is alive
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.rmdir(path)
            gone.append(path)
            print(f"farmem: removed {path}, left behind by a run that was killed", file=sys.stderr)
        except OSError:
            pass
    return gone


def leftovers() -> list[str]:
    """Cgroups named by this module that still exist (from a crashed run)."""
    out = []
    for root in (CG1_MEMORY, "/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        try:
            out += [os.path.join(root, d) for d in os.listdir(root) if d.startswith(CG_PREFIX)]
        except OSError:
            pass
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="run a command under Linux swap with a memory limit")
    ap.add_argument("--limit", required=True, help="local memory budget (e.g. 128M)")
    ap.add_argument("--zram-size", default=None, help="zram disksize (default max(2G, 4x limit))")
    ap.add_argument("--algorithm", default=None, help="zram compression algorithm (default: kernel's)")
    ap.add_argument("--zram", default="auto", choices=("auto", "always", "never"))
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command given")
    try:
        with SwapEnv(a.limit, zram_size=a.zram_size, algorithm=a.algorithm, zram=a.zram) as env:
            desc = env.describe()
            r = env.run(cmd, timeout=a.timeout)
    except SwapSetupError as e:
        print(f"farmem.swap: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as e:
        print(f"farmem.swap: interrupted ({e}); swap and cgroup removed", file=sys.stderr)
        return 130
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    print(json.dumps({"env": desc, "run": r.as_dict()}), file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
