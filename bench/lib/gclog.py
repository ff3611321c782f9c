# SPDX-License-Identifier: Apache-2.0
"""What a G1, Parallel or Shenandoah log (-Xlog:gc, optionally gc+heap+exit) says about a run: bytes allocated, time in
pauses and where the heap was. Standard library only; the benchmark drivers share it.

Allocation is read from occupancy: the heap only shrinks at a pause (Shenandoah: at its
concurrent cleanup), so what the program allocated between two of them is the occupancy before
the second minus the occupancy after the first. With gc+heap+exit the heap's use at exit closes the last interval. G1 prints occupancy in
whole MiB: the error is under 1 MiB per pause.
"""

from __future__ import annotations

import re

# Where the heap shrinks: G1's and Parallel's pauses, Shenandoah's concurrent cleanup (and its
# degenerated and full pauses, which are "Pause" lines too).
SHRINK = re.compile(r"GC\(\d+\) (?:Pause|Concurrent cleanup) .*?(\d+)M->(\d+)M\(\d+M\)")
PAUSE_MS = re.compile(r"GC\(\d+\) Pause [^\n]*? ([\d.]+)ms$", re.M)
EXIT_USED = re.compile(r"garbage-first heap\s+total \d+K, used (\d+)K|\d+M committed, (\d+)K used")
EXIT_RANGE = re.compile(r"garbage-first heap\s+total \d+K, used \d+K \[(0x[0-9a-f]+), (0x[0-9a-f]+)\)|"
                        r"Reserved region:\s*\n[^\n]*- \[(0x[0-9a-f]+), (0x[0-9a-f]+)\)")


def allocated_bytes(text: str) -> int | None:
    """Bytes allocated over the run, or None when the log shows no pause and no exit figure."""
    total, prev, seen = 0, 0, False
    for m in SHRINK.finditer(text):
        before, after = int(m.group(1)) << 20, int(m.group(2)) << 20
        total += max(0, before - prev)
        prev = after
        seen = True
    m = EXIT_USED.search(text)
    if m:
        total += max(0, (int(m.group(1) or m.group(2)) << 10) - prev)
        seen = True
    return total if seen else None


def pause_seconds(text: str) -> float:
    """Total stop-the-world time the log reports."""
    return sum(float(m.group(1)) for m in PAUSE_MS.finditer(text)) / 1000.0


def full_pause_seconds(text: str) -> float:
    """Of pause_seconds, the full collections' (`Pause Full`): where a stock collector under far
    memory sweeps the whole heap (bench/RESULTS.md, session 59)."""
    return sum(float(m.group(1)) for m in PAUSE_MS.finditer(text) if " Pause Full " in m.group(0)) / 1000.0


COLLECTION = re.compile(r"GC\(\d+\) Pause (Young|Full)( \(Mixed\))?")


def collections(text: str) -> dict[str, int]:
    """G1's (and Parallel's, Serial's) pauses that collect, by kind: young, mixed (a young pause that
    also evacuates old regions, after a concurrent cycle's remembered-set rebuild ends in time) and
    full. A stock G1 at far memory whose concurrent cycles never reach a mixed pause before the heap
    fills compacts it whole instead (bench/RESULTS.md, session 67)."""
    n = {"young": 0, "mixed": 0, "full": 0}
    for m in COLLECTION.finditer(text):
        n["full" if m.group(1) == "Full" else "mixed" if m.group(2) else "young"] += 1
    return n


def heap_range(text: str) -> tuple[int, int] | None:
    """[start, end) of the heap's addresses, from the gc+heap+exit lines."""
    m = EXIT_RANGE.search(text)
    if not m:
        return None
    lo, hi = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return int(lo, 16), int(hi, 16)


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
