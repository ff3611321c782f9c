#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The core benchmark: fault latency and throughput of farmem side by side with the
bare userfaultfd floor and with Linux swap on zram, in one run, with the same local
budget (issue 2, "Benchmarks").

For each access pattern (random, seq) and each repeat, the configurations run one
after the other (their order rotates every repeat, so slow drift of the machine
spreads evenly over them):

  floor           build/bench/uffd_floor --pin same: every access a missing fault,
                  served with UFFDIO_COPY from a local buffer by a handler on the
                  same CPU (the best a uffd pager can do here)
  floor_unpinned  the same with the scheduler placing the handler (often on the
                  other CPU: the cross-CPU wakeup cost shows up here)
  embedded        ./farmem run --local BUDGET -- build/bench/faultlat ...
  stream          ./farmem run --transport stream --local BUDGET -- ... (embedded
                  memd, the two-sided stream protocol over its Unix socket)
  tcp             build/bin/farmem-memd --listen 127.0.0.1:PORT --secret-file F, and
                  ./farmem run --memd tcp:127.0.0.1:PORT --secret-file F --local BUDGET -- ...
  swap            build/bench/faultlat in a memory cgroup limited to BUDGET with a
                  zram swap device (farmem.swap sets both up and removes them)
  local           (not in the defaults) build/bench/faultlat with no limit at all

faultlat writes every page of the region once, then times each access of one pass
over it; accesses slower than 1 us count as faults.  With perf (the default when it is
installed) every run is counted too: system calls, TLB-shootdown IPIs sent and local TLB
flushes of the run's process tree (tracepoints raw_syscalls:sys_enter and tlb:tlb_flush),
reported per page of the region for the whole run (fill and measured pass); a memd that
runs apart (the tcp config) is not in the tree and not counted.  Each figure is the median over
the repeats.  The markdown table goes to stdout; --out FILE appends it, with the
command line, machine and date, to FILE (bench/RESULTS.md).

    .venv/bin/python bench/run_core.py [--size 512M] [--local 25%] [--repeats 3]
        [--patterns random,seq] [--configs floor,floor_unpinned,embedded,stream,tcp,swap]
        [--out bench/RESULTS.md] [--json raw.json] [--no-perf] [--split]

--split (issue 5) runs faultlat --split under farmem and adds a table of where a remote
fault's time goes: kernel (fault entry, event delivery, running again), handler, transport
(memd round trip) and copy (UFFDIO_COPY), in us per fault and as fractions of the wait.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("farmem") is None:  # not run from .venv: use this checkout's sources
    sys.path.insert(0, os.path.join(ROOT, "cli", "src"))
from farmem import swap  # noqa: E402

ALL_CONFIGS = ["floor", "floor_unpinned", "embedded", "stream", "tcp", "swap", "local"]
DEFAULT_CONFIGS = ["floor", "floor_unpinned", "embedded", "stream", "tcp", "swap"]
LABELS = {
    "floor": "uffd floor (handler on the same CPU)",
    "floor_unpinned": "uffd floor (unpinned)",
    "embedded": "farmem, embedded memd (default)",
    "stream": "farmem, embedded memd, stream over Unix socket",
    "tcp": "farmem, memd over TCP loopback",
    "swap": "Linux swap on zram, cgroup limit",
    "local": "all local (no limit)",
}
FARMEM_CONFIGS = ("embedded", "stream", "tcp")
# perf stat events: what a fault path costs the kernel besides time (tlb_flush reason 4 is
# "remote IPI send", 2 and 3 are the local flushes; see the tracepoint's format file)
PERF_EVENTS = [("syscalls", ["-e", "raw_syscalls:sys_enter"]),
               ("ipis_sent", ["-e", "tlb:tlb_flush", "--filter", "reason == 4"]),
               ("local_flushes", ["-e", "tlb:tlb_flush", "--filter", "reason == 2 || reason == 3"])]


def perf_usable() -> bool:
    """perf can count the tracepoints here (root, tracefs, perf installed)."""
    perf = shutil.which("perf")
    if not perf:
        return False
    argv = [perf, "stat", "-x,", "-o", "/dev/null"] + [x for _, e in PERF_EVENTS for x in e] + ["true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def perf_wrap(argv: list[str], out: str) -> list[str]:
    return ["perf", "stat", "-x,", "-o", out] + [x for _, e in PERF_EVENTS for x in e] + ["--"] + argv


def perf_read(path: str) -> dict:
    """{name: count} from `perf stat -x,` output, in PERF_EVENTS order."""
    counts = []
    try:
        for line in open(path):
            f = line.strip().split(",")
            if len(f) > 2 and f[2].startswith(("raw_syscalls", "tlb")):
                counts.append(int(f[0]) if f[0].isdigit() else None)
    except OSError:
        return {}
    if len(counts) != len(PERF_EVENTS) or None in counts:
        return {}
    return {name: c for (name, _), c in zip(PERF_EVENTS, counts)}


SPLIT_KEYS = ("split_remote_faults", "split_wait_us", "split_kernel_us", "split_handler_us",
              "split_transport_us", "split_copy_us")


def split_table(rows: list[tuple[str, dict]]) -> list[str]:
    """Markdown rows of the fault path split: (label, figures with SPLIT_KEYS) each."""
    out = ["| config | remote faults | wait µs/fault | kernel | handler | transport | copy |",
           "|---|---|---|---|---|---|---|"]
    for label, m in rows:
        if "split_wait_us" not in m or not m.get("split_remote_faults"):
            out.append(f"| {label} | no split figures |  |  |  |  |  |")
            continue
        w = m["split_wait_us"]

        def part(k: str) -> str:
            return f"{m[k]:.1f} µs ({100 * m[k] / w:.0f}%)" if w > 0 else f"{m[k]:.1f} µs"
        out.append(f"| {label} | {m['split_remote_faults']:.0f} | {w:.1f} | {part('split_kernel_us')} "
                   f"| {part('split_handler_us')} | {part('split_transport_us')} "
                   f"| {part('split_copy_us')} |")
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt_size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def parse_local(s: str, size: int) -> int:
    s = s.strip()
    if s.endswith("%"):
        frac = float(s[:-1]) / 100.0
        if not 0 < frac <= 1:
            raise ValueError(f"bad --local {s!r}")
        b = int(size * frac)
    else:
        b = swap.parse_size(s)
    b -= b % 4096
    if b < (4 << 20):
        raise ValueError("--local must be at least 4 MiB")
    return b


def last_json(text: str) -> Optional[dict]:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def tail(text: str, n: int = 6) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


class Memd:
    """A farmem-memd on 127.0.0.1:PORT with a fresh secret, for the tcp configuration."""

    def __init__(self, binary: str, workdir: str, extra: list[str]):
        self.binary = binary
        self.secret_file = os.path.join(workdir, "memd.secret")
        fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.log_path = os.path.join(workdir, "memd.log")
        self.argv = [binary, "--listen", self.addr, "--secret-file", self.secret_file] + extra
        self.proc: Optional[subprocess.Popen] = None
        self.extra = extra

    def start(self, timeout: float = 10.0) -> None:
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                     cwd=ROOT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"farmem-memd exited with {self.proc.returncode}: "
                                   f"{tail(open(self.log_path).read())}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"farmem-memd did not listen on {self.addr} within {timeout:.0f} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.logf.close()


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.size = swap.parse_size(a.size)
        if self.size % 4096:
            raise SystemExit("run_core: --size must be a multiple of 4 KiB")
        self.local = parse_local(a.local, self.size)
        self.farmem = os.path.join(ROOT, a.farmem) if not os.path.isabs(a.farmem) else a.farmem
        self.memd_bin = os.path.join(ROOT, a.memd) if not os.path.isabs(a.memd) else a.memd
        self.faultlat = os.path.join(ROOT, "build", "bench", "faultlat")
        self.floor = os.path.join(ROOT, "build", "bench", "uffd_floor")
        self.workdir = tempfile.mkdtemp(prefix="farmem-bench-")
        self.memd: Optional[Memd] = None
        self.unavailable: dict[str, str] = {}
        self.records: list[dict] = []
        self.perf = not a.no_perf and perf_usable()

    # -- the command of each configuration ------------------------------------------------

    def workload(self, pattern: str) -> list[str]:
        w = [self.faultlat, "--size", fmt_size(self.size), "--pattern", pattern,
             "--passes", str(self.a.passes), "--json",
             "--fault-threshold-us", str(self.a.fault_threshold_us)]
        if self.a.write:
            w.append("--write")
        return w

    def farmem_argv(self, config: str, pattern: str, summary: str) -> list[str]:
        argv = [self.farmem, "run"]
        if config == "stream":
            argv += ["--transport", "stream"]
        if config == "tcp":
            assert self.memd
            argv += ["--memd", f"tcp:{self.memd.addr}", "--secret-file", self.memd.secret_file]
        argv += ["--local", fmt_size(self.local), "--summary-json", summary]
        argv += shlex.split(self.a.farmem_args)
        return argv + ["--"] + self.workload(pattern) + (["--split"] if self.a.split else [])

    def check_available(self, configs: list[str]) -> None:
        for b in (self.faultlat, self.floor):
            if not os.access(b, os.X_OK):
                raise SystemExit(f"run_core: {os.path.relpath(b, ROOT)} is missing: run `make` first")
        for c in configs:
            if c in FARMEM_CONFIGS and not os.access(self.farmem, os.X_OK):
                self.unavailable[c] = f"{os.path.relpath(self.farmem, ROOT)} not found"
            if c == "tcp" and "tcp" not in self.unavailable and not os.access(self.memd_bin, os.X_OK):
                self.unavailable[c] = f"{os.path.relpath(self.memd_bin, ROOT)} not found"
            if c == "swap" and os.geteuid() != 0:
                self.unavailable[c] = "Linux swap baseline needs root"
        if "tcp" in configs and "tcp" not in self.unavailable:
            self.memd = Memd(self.memd_bin, self.workdir, shlex.split(self.a.memd_args))
            try:
                self.memd.start()
                log(f"run_core: farmem-memd listening on {self.memd.addr} (log {self.memd.log_path})")
            except RuntimeError as e:
                self.unavailable["tcp"] = str(e)
                self.memd = None

    # -- one run ------------------------------------------------------------------------------

    def run_one(self, config: str, pattern: str, rep: int) -> dict:
        rec: dict = {"config": config, "pattern": pattern, "repeat": rep, "ok": False}
        if config in self.unavailable:
            rec["error"] = self.unavailable[config]
            return rec
        t0 = time.monotonic()
        perf_out = os.path.join(self.workdir, f"perf-{config}-{pattern}-{rep}.csv")
        wrap = (lambda argv: perf_wrap(argv, perf_out)) if self.perf else (lambda argv: argv)
        try:
            if config in ("floor", "floor_unpinned"):
                argv = [self.floor, "--size", fmt_size(self.size), "--pattern", pattern,
                        "--passes", str(self.a.passes), "--json",
                        "--pin", "same" if config == "floor" else "none"]
                if self.a.write:
                    argv.append("--write")
                r = subprocess.run(wrap(argv), capture_output=True, text=True, timeout=self.a.timeout, cwd=ROOT)
                rc, out, err = r.returncode, r.stdout, r.stderr
            elif config == "local":
                argv = self.workload(pattern)
                r = subprocess.run(wrap(argv), capture_output=True, text=True, timeout=self.a.timeout, cwd=ROOT)
                rc, out, err = r.returncode, r.stdout, r.stderr
            elif config == "swap":
                argv = self.workload(pattern)
                zram_size = max(2 << 30, 2 * self.size)
                with swap.SwapEnv(self.local, zram_size=zram_size, algorithm=self.a.zram_algorithm) as env:
                    rec["swap_env"] = env.describe()
                    sr = env.run(wrap(argv), timeout=self.a.timeout, cwd=ROOT)
                rc, out, err = sr.returncode, sr.stdout, sr.stderr
                rec["swap"] = sr.as_dict()
                if sr.timed_out:
                    raise subprocess.TimeoutExpired(argv, self.a.timeout)
            else:
                if config == "tcp" and not (self.memd and self.memd.alive()):
                    raise RuntimeError("farmem-memd is not running "
                                       f"({tail(open(self.memd.log_path).read()) if self.memd else ''})")
                summary = os.path.join(self.workdir, f"summary-{config}-{pattern}-{rep}.json")
                argv = self.farmem_argv(config, pattern, summary)
                r = subprocess.run(wrap(argv), capture_output=True, text=True, timeout=self.a.timeout, cwd=ROOT)
                rc, out, err = r.returncode, r.stdout, r.stderr
                if os.path.exists(summary):
                    try:
                        with open(summary) as f:
                            rec["pager"] = json.load(f)
                    except ValueError as e:
                        rec["pager_error"] = f"bad summary JSON: {e}"
            rec["argv"] = argv
            rec["returncode"] = rc
            if self.perf:
                rec["perf"] = perf_read(perf_out)
            rec["elapsed_s"] = time.monotonic() - t0
            d = last_json(out)
            if rc != 0 or d is None:
                rec["error"] = f"exit {rc}: {tail(err) or tail(out)}"
                rec["stderr_tail"] = tail(err, 20)
            else:
                rec["ok"] = True
                rec["result"] = d
                rec["stderr_tail"] = tail(err, 10)
        except subprocess.TimeoutExpired:
            rec["error"] = f"timed out after {self.a.timeout:.0f} s"
        except (swap.SwapSetupError, RuntimeError, OSError) as e:
            rec["error"] = str(e)
        rec.setdefault("elapsed_s", time.monotonic() - t0)
        return rec

    def run(self, configs: list[str], patterns: list[str]) -> None:
        self.check_available(configs)
        total = self.a.repeats * len(patterns) * len(configs)
        n = 0
        try:
            for rep in range(self.a.repeats):
                for pattern in patterns:
                    k = rep % len(configs)
                    for config in configs[k:] + configs[:k]:
                        n += 1
                        rec = self.run_one(config, pattern, rep)
                        self.records.append(rec)
                        if rec["ok"]:
                            d = rec["result"]
                            log(f"[{n}/{total}] {pattern:6} {config:14} #{rep + 1}: "
                                f"fault p50 {d['fault_p50_us']:.2f} us p99 {d['fault_p99_us']:.1f} us, "
                                f"{d['faults']} faults, {d['mb_per_s']:.1f} MB/s ({rec['elapsed_s']:.1f} s)")
                        else:
                            log(f"[{n}/{total}] {pattern:6} {config:14} #{rep + 1}: FAILED: {rec['error']}")
        finally:
            if self.memd:
                self.memd.stop()

    # -- report ---------------------------------------------------------------------------------

    def medians(self, config: str, pattern: str) -> dict:
        recs = [r for r in self.records if r["config"] == config and r["pattern"] == pattern]
        ok = [r for r in recs if r["ok"]]
        m: dict = {"runs": len(ok), "tried": len(recs)}
        if not ok:
            errs = [r.get("error", "") for r in recs]
            m["error"] = errs[-1] if errs else "not run"
            return m
        for key in ("fault_p50_us", "fault_p99_us", "faults_per_s", "mb_per_s", "faults",
                    "pass_wall_s", "majflt"):
            m[key] = statistics.median(r["result"][key] for r in ok)
        for key in SPLIT_KEYS:
            vals = [r["result"][key] for r in ok if isinstance(r["result"].get(key), (int, float))]
            if vals:
                m[key] = statistics.median(vals)
        pager = [r["pager"] for r in ok if isinstance(r.get("pager"), dict)]
        for key in ("fault_p50_us", "remote_reads", "evictions"):
            vals = [p[key] for p in pager if isinstance(p.get(key), (int, float))]
            if vals:
                m["pager_" + key] = statistics.median(vals)
        for name, _ in PERF_EVENTS:
            vals = [r["perf"][name] for r in ok if r.get("perf")]
            if vals:
                m["per_page_" + name] = statistics.median(vals) / (self.size // 4096)
        sw = [r["swap"] for r in ok if isinstance(r.get("swap"), dict)]
        if sw:
            m["swap_majflt"] = statistics.median(s["majflt"] for s in sw)
        return m

    def report(self, configs: list[str], patterns: list[str], started: str, load0: str) -> str:
        out = []
        cmd = shlex.join([os.path.relpath(sys.executable, ROOT)
                          if sys.executable.startswith(ROOT) else sys.executable] + sys.argv)
        u = platform.uname()
        cpu = ""
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
        memtotal = ""
        try:
            for line in open("/proc/meminfo"):
                if line.startswith("MemTotal"):
                    memtotal = f"{int(line.split()[1]) / (1 << 20):.0f} GiB"
                    break
        except OSError:
            pass
        load1 = open("/proc/loadavg").read().split()[:3]
        out.append(f"## Core benchmark: fault latency and throughput, {started}")
        out.append("")
        out.append(f"- command: `{cmd}`")
        out.append(f"- machine: {os.cpu_count()} CPUs ({cpu}), {memtotal}, kernel {u.release}, "
                   f"load average {load0} at start, {' '.join(load1)} at end"
                   + (f", commit {commit}" if commit else ""))
        out.append(f"- workload: faultlat, region {fmt_size(self.size)} "
                   f"({self.size // 4096} pages), local budget {fmt_size(self.local)} "
                   f"({100 * self.local / self.size:.0f}%), "
                   f"{'write' if self.a.write else 'read'} one word per page, "
                   f"{self.a.passes} measured pass(es); median of {self.a.repeats} interleaved repeats")
        out.append(f"- fault = an access slower than {self.a.fault_threshold_us} us; MB/s = pages touched x 4096 / pass time; "
                   "'p50 / floor' divides by the uffd floor with the handler on the same CPU; "
                   "'MB/s / swap' divides by Linux swap on zram with the same budget")
        for pattern in patterns:
            meds = {c: self.medians(c, pattern) for c in configs}
            floor = meds.get("floor", {}).get("fault_p50_us")
            swp = meds.get("swap", {}).get("mb_per_s")
            out.append("")
            out.append(f"### {pattern} access")
            out.append("")
            out.append("| config | runs | faults | fault p50 µs | fault p99 µs | faults/s | pass MB/s "
                       "| p50 / floor | MB/s / swap | pager p50 µs | remote reads |")
            out.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for c in configs:
                m = meds[c]
                if not m["runs"]:
                    err = m.get("error", "").replace("|", "/")
                    if len(err) > 160:
                        err = err[:157] + "..."
                    out.append(f"| {LABELS[c]} | 0/{m['tried']} | failed: {err} |  |  |  |  |  |  |  |  |")
                    continue
                r_floor = f"{m['fault_p50_us'] / floor:.2f}×" if floor else "n/a"
                r_swap = f"{m['mb_per_s'] / swp:.2f}×" if swp else "n/a"
                pp50 = f"{m['pager_fault_p50_us']:.1f}" if "pager_fault_p50_us" in m else ""
                rr = f"{m['pager_remote_reads']:.0f}" if "pager_remote_reads" in m else ""
                out.append(f"| {LABELS[c]} | {m['runs']}/{m['tried']} | {m['faults']:.0f} "
                           f"| {m['fault_p50_us']:.2f} | {m['fault_p99_us']:.1f} "
                           f"| {m['faults_per_s']:,.0f} | {m['mb_per_s']:.1f} | {r_floor} | {r_swap} "
                           f"| {pp50} | {rr} |")
            if self.a.split:
                out.append("")
                out.append(f"Fault path split ({pattern}; per remote fault, median over the repeats; "
                           "kernel = measured wait − handler time):")
                out.append("")
                out.extend(split_table([(LABELS[c], meds[c]) for c in configs
                                        if c in FARMEM_CONFIGS and meds[c].get("runs")]))
        out.append("")
        if self.perf:
            out.extend(self.kernel_costs(configs, patterns))
        out.extend(self.targets(patterns))
        out.append("")
        return "\n".join(out)

    def kernel_costs(self, configs: list[str], patterns: list[str]) -> list[str]:
        lines = ["What each page cost the kernel (perf stat over the whole run: fill and measured pass, "
                 "divided by the region's pages; median of the repeats):", "",
                 "| config | pattern | syscalls / page | TLB-shootdown IPIs sent / page | local TLB flushes / page |",
                 "|---|---|---|---|---|"]
        for pattern in patterns:
            for c in configs:
                m = self.medians(c, pattern)
                if "per_page_syscalls" not in m:
                    continue
                lines.append(f"| {LABELS[c]} | {pattern} | {m['per_page_syscalls']:.2f} "
                             f"| {m['per_page_ipis_sent']:.4f} | {m['per_page_local_flushes']:.3f} |")
        lines.append("")
        return lines

    def targets(self, patterns: list[str]) -> list[str]:
        lines = ["Targets (issue 2):", ""]

        def verdict(ok: Optional[bool]) -> str:
            return "n/a" if ok is None else ("met" if ok else "NOT met")

        for pattern in patterns:
            e = self.medians("embedded", pattern)
            f = self.medians("floor", pattern)
            if e.get("runs") and f.get("runs"):
                ratio = e["fault_p50_us"] / f["fault_p50_us"]
                lines.append(f"- {pattern}: embedded fault p50 ≤ 2× floor: {verdict(ratio <= 2.0)} "
                             f"({ratio:.2f}×)")
            else:
                lines.append(f"- {pattern}: embedded fault p50 ≤ 2× floor: n/a")
        want = {"seq": (1.5, "sequential throughput ≥ 1.5× Linux swap"),
                "random": (1.0, "random throughput at this budget ≥ Linux swap")}
        for pattern in patterns:
            if pattern not in want:
                continue
            k, text = want[pattern]
            e = self.medians("embedded", pattern)
            s = self.medians("swap", pattern)
            if e.get("runs") and s.get("runs"):
                ratio = e["mb_per_s"] / s["mb_per_s"]
                lines.append(f"- {pattern}: {text}: {verdict(ratio >= k)} ({ratio:.2f}×)")
            else:
                lines.append(f"- {pattern}: {text}: n/a")
        return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M", help="region size (default 512M)")
    ap.add_argument("--local", default="25%", help="local budget, bytes or %% of --size (default 25%%)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every configuration (default 3)")
    ap.add_argument("--patterns", default="random,seq", help="comma-separated: random,seq")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help=f"comma-separated, from {','.join(ALL_CONFIGS)}")
    ap.add_argument("--passes", type=int, default=1, help="measured passes per run (default 1)")
    ap.add_argument("--write", action="store_true", help="measured accesses write instead of read")
    ap.add_argument("--out", help="append the markdown section to this file (e.g. bench/RESULTS.md)")
    ap.add_argument("--json", dest="json_out", help="write every run's raw figures to this file")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    ap.add_argument("--farmem", default="farmem", help="the farmem command (default ./farmem)")
    ap.add_argument("--memd", default="build/bin/farmem-memd", help="memd binary for the tcp config")
    ap.add_argument("--farmem-args", default="", help="extra flags for every `farmem run`")
    ap.add_argument("--memd-args", default="", help="extra flags for farmem-memd (tcp config)")
    ap.add_argument("--split", action="store_true",
                    help="under farmem: split each remote fault's time (faultlat --split)")
    ap.add_argument("--fault-threshold-us", type=float, default=1.0,
                    help="faultlat's fault threshold (default 1.0)")
    ap.add_argument("--zram-algorithm", default=None, help="zram compression (default: the kernel's)")
    ap.add_argument("--no-perf", action="store_true",
                    help="do not count syscalls and TLB flushes with perf stat")
    a = ap.parse_args()

    patterns = [p.strip() for p in a.patterns.split(",") if p.strip()]
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    for p in patterns:
        if p not in ("random", "seq"):
            ap.error(f"unknown pattern {p!r}")
    for c in configs:
        if c not in ALL_CONFIGS:
            ap.error(f"unknown config {c!r} (from {','.join(ALL_CONFIGS)})")
    if a.repeats < 1 or a.passes < 1:
        ap.error("--repeats and --passes must be at least 1")
    try:
        b = Bench(a)
    except ValueError as e:
        ap.error(str(e))
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = " ".join(open("/proc/loadavg").read().split()[:3])
    log(f"run_core: region {fmt_size(b.size)}, local {fmt_size(b.local)}, {a.repeats} repeats, "
        f"patterns {','.join(patterns)}, configs {','.join(configs)}")
    try:
        b.run(configs, patterns)
    except KeyboardInterrupt:
        log("run_core: interrupted; reporting what finished")
    text = b.report(configs, patterns, started, load0)
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write("\n" + text)
        log(f"run_core: appended to {a.out}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"size": b.size, "local": b.local, "records": b.records}, f, indent=1)
    failed = [r for r in b.records if not r["ok"]]
    if failed:
        log(f"run_core: {len(failed)} of {len(b.records)} runs failed (logs and summaries kept in "
            f"{b.workdir})")
        return 1
    shutil.rmtree(b.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
