"""`farmem stat PID`: the figures of a process under farmem, read from its residency map
(farmem/procmap.py)."""

import json
import sys

from farmem import procmap, resmap
from farmem.units import fmt_bytes


def render(s: dict) -> list:
    adopted = resmap.adopt_note(s)
    lines = [
        f"pid {s['pid']}: {len(s['regions'])} regions, {fmt_bytes(s['registered_bytes'])} registered, "
        f"local limit {fmt_bytes(s['local_limit_bytes'])}, resident {fmt_bytes(s['resident_bytes'])} "
        f"(peak {fmt_bytes(s['peak_resident_bytes'])}{'; ' + adopted if adopted else ''}), "
        f"transport {s['transport']}, memd {s['memd'] or '-'}",
        f"faults {s['faults']} ({s['gc_faults']} by GC), write-protect faults {s['wp_faults']}, "
        f"pages zero-filled {s['zero_fills']}, fault p50 {s['fault_p50_us']:.2f} us, p99 {s['fault_p99_us']:.2f} us",
        f"remote reads {s['remote_reads']}, writes {s['remote_writes']}, evictions {s['evictions']} "
        f"({s['evictions_clean']} clean, {s['evictions_dirty']} dirty), prefetch {s['prefetch_issued']} "
        f"issued / {s['prefetch_used']} seen used",
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
    if s.get("remaps"):
        lines.append(f"mremaps {s['remaps']}: {s.get('remap_pages_resident', 0)} resident pages moved by the "
                     f"kernel, {s.get('remap_pages_kept', 0)} pages in memd stayed in their slots")
    for r in s["regions"]:
        kinds = f" [{','.join(r['flags'])}]" if r["flags"] else ""
        lines.append(f"  region {r['base']:#x} {fmt_bytes(r['bytes'])}{kinds}: {r['resident']} resident "
                     f"({r['dirty']} dirty), {r['remote']} remote, {r['untouched']} untouched, "
                     f"{r['unmanaged']} unmanaged")
    return lines


def cmd_stat(args) -> int:
    snap = procmap.read_map(args.pid)
    s = procmap.stat_figures(args.pid, snap)
    if args.json:
        json.dump(s, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(render(s)))
    return 0
