"""`farmem run --mode kswap --local 25% -- CMD`: Linux swap under a memory cgroup instead of the pager.

CMD runs in a memory cgroup limited to the local budget, with swap (a zram device set up here
when the machine has none; farmem/swap.py does the setup and the teardown). This process is
the kswap monitor (farmem/kswap.py): it owns CMD's residency map, rescans it every
--kswap-scan-ms and at once after a reclaim run, and marks pages resident on the major faults
farmem-trace reports; without eBPF the periodic scan does it all.

A percentage budget is a share of the paged memory, as with the pager: of -Xmx for a JVM, else
of the large anonymous mappings as they appear (the limit follows them), plus KSWAP_SLACK for
the rest of the process (code, libraries, JVM metadata), which the pager leaves unlimited.
"""

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from farmem import resmap
from farmem.errors import FarmemError, Unavailable
from farmem import java
from farmem.kswap import DEFAULT_THRESHOLD, PAGE_SHIFT, KswapMonitor
from farmem.units import fmt_bytes

log = logging.getLogger("farmem.kswap")

KSWAP_SLACK = 64 << 20           # budget for memory outside the paged mappings
DEFAULT_SCAN_MS = 200
DEFAULT_EPOCH_CHURN = 10


def add_mode_args(p) -> None:
    """The kswap flags of `farmem run` (main.py's _add_run calls this)."""
    p.add_argument("--mode", choices=("uffd", "kswap"), default="uffd",
                   help="uffd: the farmem pager (default); kswap: Linux swap under a memory "
                        "cgroup limit, with the same residency map")
    p.add_argument("--epoch-churn", type=int, default=DEFAULT_EPOCH_CHURN, metavar="PCT",
                   help=f"kswap: advance the swap epoch when pages that changed residency exceed "
                        f"PCT%% of the paged pages (default {DEFAULT_EPOCH_CHURN})")
    p.add_argument("--kswap-scan-ms", type=int, default=DEFAULT_SCAN_MS, metavar="MS",
                   help=f"kswap: PAGEMAP_SCAN period (default {DEFAULT_SCAN_MS})")
    p.add_argument("--no-bpf", action="store_true",
                   help="kswap: do not start farmem-trace (pagemap scans only)")
    run_func, run_validate = p.get_default("func"), p.get_default("validate")

    def dispatch(args):
        return cmd_run_kswap(args) if args.mode == "kswap" else run_func(args)

    def validate(args, parser):
        run_validate(args, parser)
        if args.mode != "kswap":
            return
        if args.memd:
            parser.error("--mode kswap pages to Linux swap: --memd does not apply")
        if not 1 <= args.epoch_churn <= 100:
            parser.error("--epoch-churn: give 1 to 100")
        if not 10 <= args.kswap_scan_ms <= 60000:
            parser.error("--kswap-scan-ms: give 10 to 60000")

    p.set_defaults(func=dispatch, validate=validate)


LIMIT_TRIES = 8


def _set_limit(swapenv, limit: int) -> None:
    """A v1 write below the usage reclaims first and answers EBUSY at the first round that frees
    nothing. Reclaim moves pages from the active to the inactive list only when the cgroup's
    statistics say the inactive list is low (vmscan.c inactive_is_low), and those are flushed every
    2 s or when read. A program that wrote its pages a moment ago has them all active (read after
    an EBUSY: 191 MiB active, none inactive) while the last flush may still count them inactive:
    no round frees anything, scan after scan, until the next flush. Reading memory.stat flushes
    them. Measured (a 200 MiB bytearray under a 114 MiB limit, 60 runs each): 23 runs never got
    their limit with a 10 ms sleep between tries, none with the read."""
    path = swapenv.cgroup_path
    name = "memory.limit_in_bytes" if swapenv.cgroup_version == 1 else "memory.max"
    for attempt in range(LIMIT_TRIES):
        try:
            with open(os.path.join(path, name), "w") as f:
                f.write(str(limit))
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == LIMIT_TRIES - 1:
                raise
            if swapenv.cgroup_version == 1:
                with open(os.path.join(path, "memory.stat")) as f:
                    f.read()


def _phys_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cmd_run_kswap(args) -> int:
    if os.geteuid() != 0:
        raise Unavailable("kswap mode", "it needs root (zram, swapon, memory cgroups)")
    from farmem import doctor, swap  # here, not at the top: every farmem command imports this module
    doctor.require("cgroup-memory")
    if not doctor.run_check("swap").available:
        doctor.require("zram")  # no swap yet: farmem sets up zram, so it must exist
    pct = int(args.local[:-1]) if args.local.endswith("%") else None
    heap = None
    if java.is_java(args.cmd):
        args.cmd, heap = java.same_heap_as_the_pager(args.cmd)
    if pct is None:
        limit = int(args.local)
    elif heap:
        limit = heap * pct // 100 + KSWAP_SLACK
    else:
        limit = _phys_bytes()  # lowered when the paged mappings appear
    threshold = args.threshold or DEFAULT_THRESHOLD
    mon = KswapMonitor(args.epoch_churn, threshold)
    tracer = None
    stop = threading.Event()
    t0 = time.monotonic()
    try:
        with swap.SwapEnv(max(limit, 8 << 20), zram_size=max(2 << 30, 4 * (heap or 0))) as env:
            log.info("kswap: cgroup %s, limit %s, swap %s", env.cgroup_path, fmt_bytes(limit),
                     env.zram_device or "existing")
            child_env = dict(os.environ, FARMEM_RESMAP_FD=str(mon.fd), FARMEM_MODE="kswap")
            wrapper = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"',
                       os.path.join(env.cgroup_path, "cgroup.procs")] + list(args.cmd)
            maj0 = env.cgroup_figures()[0]
            try:
                child = subprocess.Popen(wrapper, env=child_env, pass_fds=(mon.fd,))
            except OSError as e:
                raise FarmemError(f"cannot start {args.cmd[0]}: {e.strerror}") from None
            saved = {s: signal.signal(s, lambda signo, _f: child.send_signal(signo))
                     for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
            try:
                mon.attach(child.pid)
                def monitor():
                    while not stop.is_set():
                        mon.refresh_regions()
                        if pct is not None and not heap and mon.regions:
                            paged = sum(r[1] for r in mon.regions) << PAGE_SHIFT
                            want = paged * pct // 100 + KSWAP_SLACK
                            if want != monitor.limit:
                                try:
                                    _set_limit(env, want)
                                    monitor.limit = want
                                    monitor.stand_in = False
                                    monitor.refused = None
                                except OSError as e:
                                    # v1 answers EBUSY while it cannot reclaim down to the new
                                    # limit yet: try again at the next scan
                                    (log.debug if e.errno == errno.EBUSY else log.warning)(
                                        "kswap: cannot set the cgroup limit to %s: %s", fmt_bytes(want), e)
                                    monitor.refused = (want, e.strerror)
                        mon.scan()
                        mon.update_counters(monitor.limit,
                                            tracer.proc_stats(child.pid) if tracer else None,
                                            budget=not monitor.stand_in)
                        mon.wake.wait(args.kswap_scan_ms / 1000)
                        mon.wake.clear()
                monitor.limit = limit
                monitor.refused = None  # (the limit asked for, the kernel's answer) while it stands
                monitor.stand_in = pct is not None and not heap  # the whole machine until the paged mappings are seen
                th = threading.Thread(target=monitor, daemon=True)
                th.start()  # before eBPF: a program may map, use and free its memory before farmem-trace has loaded
                if not args.no_bpf:
                    from farmem.tracer import Tracer

                    def on_event(e):
                        if e["type"] == "major":
                            mon.on_major(e["addr"])
                        elif e["type"] == "reclaim":
                            mon.wake.set()
                    try:
                        tracer = Tracer(pids=[child.pid], interval_ms=500, events=("major", "reclaim"),
                                        threads=False, on_event=on_event).start()
                    except FarmemError as e:
                        log.warning("kswap: no eBPF (%s): the map follows pagemap scans only", e)
                        tracer = None

                status = child.wait()
                maj1, cg_peak = env.cgroup_figures()
                stop.set()
                mon.wake.set()
                th.join(10)
            finally:
                for s, h in saved.items():
                    signal.signal(s, h)
                if child.poll() is None:
                    child.kill()
                    child.wait()
                if tracer:
                    tracer.stop()
                    # Its last line totals the run to the end; the monitor's last look may predate the last faults.
                    final = tracer.proc_stats(child.pid)
                    if final:
                        mon.update_counters(getattr(monitor, "limit", limit), final,
                                            budget=not getattr(monitor, "stand_in", False))
            elapsed = time.monotonic() - t0
            if getattr(monitor, "refused", None):
                want, why = monitor.refused
                log.warning("kswap: the cgroup limit was never set to %s (%s): the program ended under %s",
                            fmt_bytes(want), why, fmt_bytes(monitor.limit))
            elif getattr(monitor, "stand_in", False):
                # Node's heap is 256 KiB reservations: under Linux swap it ran with no limit at all.
                log.warning("kswap: no private anonymous mapping of %s or more appeared, so --local %s "
                            "had nothing to be a share of: the program ran under %s, the machine's memory "
                            "(give --local in bytes, or a smaller --threshold)",
                            fmt_bytes(threshold), args.local, fmt_bytes(monitor.limit))
            s = resmap.figures([mon.hdr])
            summary = {"mode": "kswap", "exit_status": status, "elapsed_s": round(elapsed, 3),
                       "swap_epoch": mon.hdr.swap_epoch, "cgroup_limit_bytes": monitor.limit,
                       "bpf": tracer is not None, **s,
                       # Every process of the run, where the figures above follow CMD's own pid only.
                       "cgroup_major_faults": maj1 - maj0 if maj0 is not None and maj1 is not None else None,
                       "cgroup_peak_bytes": cg_peak}
    except swap.SwapSetupError as e:
        raise Unavailable("kswap mode", str(e)) from None
    finally:
        mon.close()
    status = summary["exit_status"]
    status = 128 - status if status < 0 else status
    cg_maj, cg_peak = summary["cgroup_major_faults"], summary["cgroup_peak_bytes"]
    # stress-ng's workers, a shell's children: CMD's own figures were 0 while the run swapped hard.
    others = (f"; every process of the run (the cgroup): {cg_maj} major faults, peak {fmt_bytes(cg_peak)}"
              if cg_maj is not None and cg_peak is not None and cg_maj > summary["faults"] else "")
    print(f"farmem: kswap: {summary['faults']} major faults, {summary['evictions']} pages swapped out, "
          f"{summary['remote_reads']} swapped in (eBPF), swap epoch {summary['swap_epoch']}; limit "
          f"{fmt_bytes(summary['cgroup_limit_bytes'])}, peak resident {fmt_bytes(summary['peak_resident_bytes'])}"
          f"{others}; exit status {status}, {elapsed:.2f} s", file=sys.stderr)
    if args.summary_json:
        from farmem.commands.run import write_json
        write_json(args.summary_json, summary)
    return status
