"""A process under farmem, seen from outside: the residency maps it holds (memfds named
"farmem-map", /proc/PID/fd/N, whose link reads "/memfd:farmem-map (deleted)"), read-only, and
the figures `farmem stat`, `farmem top` and `farmem attach` show from them."""

import os
import time

from farmem import resmap
from farmem.errors import FarmemError


def descendant_named(root: int, comm: str):
    """A process named comm that descends from root (root itself included), or None: the JVM
    under `farmem run`, a shell and its launchers."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
    for pid in parent:
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p != root:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return pid
        except OSError:
            continue
    return None


def wait_descendant_named(root: int, comm: str, deadline: float, poll: float = 0.02):
    """descendant_named, asked again every `poll` seconds until time.monotonic() passes
    deadline; None then."""
    while time.monotonic() < deadline:
        pid = descendant_named(root, comm)
        if pid:
            return pid
        time.sleep(poll)
    return None


def farmem_pids() -> list:
    """Processes holding a farmem-map memfd, found through /proc/*/fd."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{name}/fd"):
                if os.readlink(f"/proc/{name}/fd/{fd}").startswith("/memfd:" + resmap.MEMFD_NAME):
                    out.append(int(name))
                    break
        except OSError:
            continue
    return sorted(out)


def find_maps(pid: int) -> list:
    """Paths /proc/PID/fd/N of every farmem-map memfd the process holds."""
    fd_dir = f"/proc/{pid}/fd"
    if not os.path.exists(f"/proc/{pid}"):
        raise FarmemError(f"no process with pid {pid}")
    try:
        entries = sorted(os.listdir(fd_dir), key=int)
    except PermissionError:
        raise FarmemError(f"cannot look at the files of pid {pid}: permission denied "
                          "(run as its user or as root)") from None
    except FileNotFoundError:
        raise FarmemError(f"no process with pid {pid} (it exited)") from None
    found = []
    for name in entries:
        path = f"{fd_dir}/{name}"
        try:
            if os.readlink(path).startswith("/memfd:" + resmap.MEMFD_NAME):
                found.append(path)
        except OSError:  # closed while we looked
            continue
    return found


def read_map(pid: int) -> resmap.Snapshot:
    paths = find_maps(pid)
    if not paths:
        raise FarmemError(f"pid {pid} is not running under farmem: it holds no "
                          f"{resmap.MEMFD_NAME} memfd (start it with `farmem run`)")
    snaps, errors = [], []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            errors.append(f"{path}: {e.strerror}")
            continue
        try:
            snaps.append(resmap.read_fd(fd, with_regions=True))
        except (OSError, ValueError) as e:
            errors.append(f"{path}: {e}")
        finally:
            os.close(fd)
    if not snaps:
        raise FarmemError(f"pid {pid}: cannot read its residency map: {'; '.join(errors)}")
    # `farmem run` itself holds the maps of its children: prefer the process's own.
    own = [s for s in snaps if s.hdr.pid == pid]
    return (own or snaps)[0]


def own_map_fd(pid: int):
    """An open read-only fd of the residency map pid's own pager made (not one it only holds, as
    `farmem run` holds its children's), or None: no such map yet, or the process is gone. For a
    reader that follows the map's counters while the process runs; the caller closes it."""
    try:
        paths = find_maps(pid)
    except FarmemError:
        return None
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # closed while we looked
            continue
        try:
            if resmap.read_fd(fd).hdr.pid == pid:
                return fd
        except (OSError, ValueError):
            pass
        os.close(fd)
    return None


def stat_figures(pid: int, snap: resmap.Snapshot) -> dict:
    hdr = snap.hdr
    out = resmap.figures([hdr])
    out.update(
        pid=pid,
        map_pid=int(hdr.pid),
        page_size=1 << hdr.page_shift,
        swap_epoch=hdr.swap_epoch,
        churn_pages=hdr.churn_pages,
        epoch_churn_pct=hdr.epoch_churn_pct,
        gc_cycles=hdr.gc_cycles,
        gc_active=bool(hdr.gc_active),
        memd=hdr.memd.decode(errors="replace"),
        start_time_ns=hdr.start_time_ns,
        uptime_s=round(max(0.0, time.time() - hdr.start_time_ns / 1e9), 3) if hdr.start_time_ns else None,
        regions=snap.regions,
    )
    return out
