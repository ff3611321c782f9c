"""`farmem stat PID`: the figures of a process under farmem, read from its residency map.

The map is a memfd named "farmem-map" that the paged process holds open; from outside it
is /proc/PID/fd/N, whose link reads "/memfd:farmem-map (deleted)". We map it read-only.
"""

import json
import os
import sys
import time

from farmem import resmap
from farmem.errors import FarmemError
from farmem.units import fmt_bytes


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


def render(s: dict) -> list:
    lines = [
        f"pid {s['pid']}: {len(s['regions'])} regions, {fmt_bytes(s['registered_bytes'])} registered, "
        f"local limit {fmt_bytes(s['local_limit_bytes'])}, resident {fmt_bytes(s['resident_bytes'])} "
        f"(peak {fmt_bytes(s['peak_resident_bytes'])}), transport {s['transport']}, memd {s['memd'] or '-'}",
        f"faults {s['faults']} ({s['zero_fills']} zero-fill, {s['wp_faults']} write-protect, "
        f"{s['gc_faults']} by GC), fault p50 {s['fault_p50_us']:.2f} us, p99 {s['fault_p99_us']:.2f} us",
        f"remote reads {s['remote_reads']}, writes {s['remote_writes']}, evictions {s['evictions']} "
        f"({s['evictions_clean']} clean, {s['evictions_dirty']} dirty), prefetch {s['prefetch_issued']} "
        f"issued / {s['prefetch_used']} used",
        f"swap epoch {s['swap_epoch']}, gc cycles {s['gc_cycles']}"
        + (" (GC running)" if s["gc_active"] else "")
        + f", memd full {s['memd_full']}, crc errors {s['crc_errors']}, transport errors {s['transport_errors']}",
    ]
    if s.get("memd_servers_live") or s.get("memd_servers_lost"):
        # Several memd servers (--memd A,B,...): failover and replication at a glance.
        lines.append(f"memd servers {s['memd_servers_live']} live, {s['memd_servers_lost']} lost; "
                     f"timeouts {s['memd_timeouts']}, failovers {s['memd_failovers']}, "
                     f"re-replicated {s['memd_rereplicated']} pages, degraded writes {s['memd_degraded_writes']}")
    if s.get("swapva_calls"):
        lines.append(f"SwapVA moves {s['swapva_calls']}: {s['swapva_pages_moved']} pages moved, "
                     f"{s['swapva_pages_remote']} remote pages moved inside memd "
                     f"({s.get('swapva_remote_copied', 0)} copied by memd itself), {s['swapva_pages_fetched']} "
                     f"fetched, {s['swapva_pages_untouched']} untouched, {s['swapva_pages_copied']} copied")
    for r in s["regions"]:
        kinds = f" [{','.join(r['flags'])}]" if r["flags"] else ""
        lines.append(f"  region {r['base']:#x} {fmt_bytes(r['bytes'])}{kinds}: {r['resident']} resident "
                     f"({r['dirty']} dirty), {r['remote']} remote, {r['untouched']} untouched, "
                     f"{r['unmanaged']} unmanaged")
    return lines


def cmd_stat(args) -> int:
    snap = read_map(args.pid)
    s = stat_figures(args.pid, snap)
    if args.json:
        json.dump(s, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(render(s)))
    return 0
