#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libswapva vs memmove: move/swap objects of 1..4096 pages with every backend available
here (kmod in the qemu lane, UFFDIO_MOVE on the host) and the plain memmove baseline,
side by side in one run. Prints a markdown table, the break-even size (smallest object
from which the backend stays faster than copying) and the ratio at 64 pages.

    python3 bench/bench_swapva.py [--sizes 1,2,...] [--iters N] [--json]
          [--bin build/bench/swapva_bench] [--dst populated,empty]

MOVE is measured into a populated destination (space that held garbage) and into an empty
one (what farmem's discard leaves of a collector's free regions), one row set each.

Medians per call; the machine is shared, so compare ratios from one run only."""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = "1,2,4,8,16,32,64,128,256,512,1024,4096"


def run_bench(binary, sizes, iters, backends=None, dst="populated", op=None):
    argv = [binary, "--sizes", sizes, "--dst", dst]
    if op:
        argv += ["--op", op]
    if iters:
        argv += ["--iters", str(iters)]
    if backends:
        argv += ["--backends", backends]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def summarize(rows):
    """{op: {"pages": [...], "copy": {p: ns}, backend: {p: ns}}} plus per-backend stats."""
    table = {}
    for r in rows:
        if "op" not in r or r.get("error"):
            continue
        op = r["op"] if r["op"] == "swap" else f"move ({r.get('dst', 'populated')} dst)"
        t = table.setdefault(op, {})
        t.setdefault(r["backend"], {})[r["pages"]] = r["median_ns"]
    stats = []
    for op, t in table.items():
        base = t.get("copy", {})
        for b, vals in t.items():
            if b == "copy":
                continue
            pages = sorted(p for p in vals if p in base)
            # break-even: smallest size from which the backend is faster at every larger size
            be = None
            for p in reversed(pages):
                if vals[p] < base[p]:
                    be = p
                else:
                    break
            r64 = base[64] / vals[64] if 64 in vals and 64 in base and vals[64] else None
            stats.append({"backend": b, "op": op, "breakeven_pages": be, "ratio_at_64": r64})
    return table, stats


def markdown(table, stats, available):
    lines = [f"backends available: {available}", ""]
    for op, t in sorted(table.items()):
        backends = [b for b in sorted(t) if b != "copy"]
        hdr = ["pages", "memmove (ns)"] + [f"{b} (ns)" for b in backends] + \
              [f"memmove/{b}" for b in backends]
        lines.append(f"**{op}**")
        lines.append("")
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for p in sorted(t.get("copy", {})):
            base = t["copy"][p]
            cells = [str(p), f"{base:.0f}"]
            cells += [f"{t[b][p]:.0f}" if p in t[b] else "-" for b in backends]
            cells += [f"{base / t[b][p]:.2f}x" if t[b].get(p) else "-" for b in backends]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("| backend | op | break-even (pages) | memmove/backend at 64 pages |")
    lines.append("|---|---|---|---|")
    for s in stats:
        be = s["breakeven_pages"] if s["breakeven_pages"] is not None else "never"
        r = f"{s['ratio_at_64']:.2f}x" if s["ratio_at_64"] else "-"
        lines.append(f"| {s['backend']} | {s['op']} | {be} | {r} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bench", "swapva_bench"))
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--backends", default=None)
    ap.add_argument("--dst", default="populated,empty",
                    help="MOVE destination states to measure (populated, empty)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON too")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        subprocess.run(["make", "-s", os.path.relpath(a.bin, ROOT)], cwd=ROOT, check=True)
    rows = []
    for i, dst in enumerate(a.dst.split(",")):
        # SWAP has no destination state: measure it once, with the first
        rows += run_bench(a.bin, a.sizes, a.iters, a.backends, dst, None if i == 0 else "move")
    available = next((r["available"] for r in rows if "available" in r), "?")
    table, stats = summarize(rows)
    print(markdown(table, stats, available))
    if a.json:
        print(json.dumps({"available": available, "stats": stats, "table": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
