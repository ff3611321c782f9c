"""`farmem run [options] [--] CMD...`: run a program under the pager, with an embedded memd by default.

The contract with the preload shim is its environment (one variable per flag):

    LD_PRELOAD           <build>/lib/libfarmem_preload.so, before any LD_PRELOAD already set
    FARMEM_MEMD          unix:<tmpdir>/memd.sock (embedded) or the --memd list as given
    FARMEM_SECRET        the memd's shared secret (64 hex digits for the embedded memd)
    FARMEM_LOCAL         the local budget: a byte count or NN%
    FARMEM_CONTROL       <tmpdir>/control.sock, where each pager hands over its residency map
    FARMEM_LAUNCH_UID    who farmem run ran as: a process of another user runs unpaged, with a warning
                         (as root: it pages, showing FARMEM_CONTROL_KEY to the control socket)
    FARMEM_<KNOB>        the variable of every other knob flag that is given (uffd/knobs.h)
    JAVA_TOOL_OPTIONS    -agentpath:<build>/lib/libfarmem_agent.so=... appended: every JVM CMD starts
                         is paged by the agent, and the shim stands aside in it

With java as CMD there is no shim: the agent is on the command line, and the JVMs that java
starts get it from FARMEM_CHILD_JAVA_TOOL_OPTIONS, which the agent turns into their
JAVA_TOOL_OPTIONS.

The end-of-run figures come from the residency maps the pagers passed over FARMEM_CONTROL
(farmem/control.py), read after CMD has exited.
"""

import ctypes
import fcntl
import json
import logging
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farmem import doctor, knob_table, knobs, paths, resmap
from farmem.control import ControlServer
from farmem.embedded_memd import EmbeddedMemd
from farmem.errors import EXIT_CONFIG, FarmemError
from farmem.units import fmt_bytes, parse_bytes

log = logging.getLogger("farmem.run")

PROBE_TIMEOUT_S = 3.0
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1

def validate(args, parser) -> None:
    """Checks that need more than one flag; argparse has checked each value."""
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("missing CMD: the program to run (farmem run [options] -- CMD [ARG...])")
    args.cmd = cmd
    if getattr(args, "gc", None) not in (None, "stock"):
        from farmem import java
        if not java.is_java(cmd):
            parser.error(f"--gc {args.gc} goes with a java command (farmem run --gc {args.gc} -- java ...)")
    if args.evict_low is not None and args.evict_high is not None and args.evict_low >= args.evict_high:
        parser.error(f"--evict-low {args.evict_low}% must be below --evict-high {args.evict_high}%")
    if args.memd:
        if not args.secret_file and not os.environ.get("FARMEM_SECRET"):
            parser.error("--memd needs the memd's secret: give --secret-file FILE or set FARMEM_SECRET")
        if args.replicas is not None and args.replicas > len(args.memd):
            parser.error(f"--replicas {args.replicas} needs at least {args.replicas} --memd servers, "
                         f"{len(args.memd)} given")
        if args.transport == "shm" and not all(a.startswith("unix:") for a in args.memd):
            parser.error("--transport shm needs unix: memd addresses (shared memory is same-host only)")
    elif args.replicas is not None and args.replicas > 1:
        parser.error("--replicas goes with several --memd servers")
    elif args.secret_file:
        parser.error("--secret-file goes with --memd (the embedded memd makes its own secret)")
    if args.summary_json:
        parent = Path(args.summary_json).parent
        if not parent.is_dir():
            parser.error(f"argument --summary-json: directory {parent} does not exist")
    if getattr(args, "user", None):
        import pwd
        try:
            args.user_entry = pwd.getpwnam(args.user)
        except KeyError:
            parser.error(f"argument --user: no user named {args.user!r}")
        if os.geteuid() != 0:
            parser.error("--user needs farmem run to run as root (it starts CMD as that user)")
        if getattr(args, "mode", None) == "kswap":
            parser.error("--user goes with the pager, not --mode kswap")
        if args.fault == "thread":
            parser.error("--user runs CMD without privileges, with a user-mode-only userfaultfd: --fault thread "
                         "needs one that serves kernel faults")


def cmd_run(args) -> int:
    saved = {s: signal.signal(s, _terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run(args)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _terminated(signo, _frame):
    """SIGTERM/SIGHUP outside CMD's lifetime: unwind, so that memd and the tmpdir go too."""
    raise FarmemError(f"stopped by {signal.Signals(signo).name}", exit_code=128 + signo)


def _run(args) -> int:
    from farmem import java
    is_java = java.is_java(args.cmd)
    doctor.require("userfaultfd")
    if getattr(args, "fault", None) == "thread" and not doctor.uffd_kernel_faults():
        raise FarmemError("--fault thread needs a userfaultfd that serves faults taken inside system calls: "
                          "root, read-write access to /dev/userfaultfd, or vm.unprivileged_userfaultfd=1 "
                          "(the default, --fault signal, works without; `farmem doctor`)", exit_code=EXIT_CONFIG)
    if is_java:
        java.prepare(args, "unix:check", "check", quiet=True)  # refuse before anything starts
    else:
        doctor.require("farmem-preload")
        static = statically_linked(args.cmd[0])
        if static:
            log.warning("%s is statically linked: the preload shim cannot reach it (LD_PRELOAD needs the dynamic "
                        "linker), so none of its memory is paged; it runs as it would without farmem", static)
    if args.memd:
        secret = read_secret(args.secret_file)
        probe_memds(args.memd, secret)
        if getattr(args, "user_entry", None):
            check_reachable_as(args.memd, args.user_entry)
    else:
        doctor.require("farmem-memd")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            log.warning("an address-space limit (ulimit -v, hard %s) holds farmem's memd as well as CMD, unless "
                        "farmem may raise it: memd then keeps at most that much of CMD's memory; `ulimit -S -v` "
                        "limits CMD alone", fmt_bytes(hard))
    tmpdir = private_tmpdir()
    memd = control = None
    try:
        if args.memd:
            address = ",".join(args.memd)
        else:
            memd = EmbeddedMemd(paths.memd_binary(), tmpdir, log_level=args.log)
            memd.start()
            address, secret = memd.address, memd.secret
        try:
            control = ControlServer(os.path.join(tmpdir, "control.sock"))
        except OSError as e:
            raise FarmemError(f"cannot listen on the control socket in {tmpdir}: {e.strerror or e}")
        control.start()
        user = getattr(args, "user_entry", None)
        sockets = [control.path] + ([memd.socket] if memd is not None else [])
        if user:
            hand_over(tmpdir, sockets, user)
            control.also_uids = (user.pw_uid,)
        elif os.geteuid() == 0 and not is_java:
            control.key = open_to_run(tmpdir, sockets)
        if is_java:  # the JVMTI agent pages the heap; no shim (farmem/java.py)
            cmd = java.prepare(args, address, control.path)
            env = java.build_env(os.environ, secret)
            tool = java.tool_options(args, env, address, control.path)
            if tool:  # for the JVMs this one starts: the agent sets their JAVA_TOOL_OPTIONS from it
                env["FARMEM_CHILD_JAVA_TOOL_OPTIONS"] = tool
        else:
            cmd, env = args.cmd, build_env(args, os.environ, address, secret, control.path)
            if control.key:
                env["FARMEM_CONTROL_KEY"] = control.key
            tool = java.tool_options(args, env, address, control.path)
            if tool:  # the JVMs CMD starts, if any: the agent pages their heaps (docs/jvm.md)
                env["JAVA_TOOL_OPTIONS"] = tool
        if user:
            env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
            env["FARMEM_LAUNCH_UID"] = str(user.pw_uid)
        status, elapsed, killed_by, peak_rss = run_child(cmd, env, user)
        control.stop()
        summary = summarise(control.snapshot(), status, elapsed, killed_by)
        summary["peak_rss_bytes"] = peak_rss
    finally:
        if control is not None:
            control.close()
        if memd is not None:
            memd.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)
    hint = (gc_hint(summary, java.collector(args.cmd)) if is_java and getattr(args, "gc", None) in (None, "stock")
            else None)
    hints = [h for h in (hint, thrash_hint(summary, args.local),
                         None if is_java else idle_budget_hint(summary, args.local),
                         None if is_java else unpaged_hint(summary, env.get("FARMEM_THRESHOLD")),
                         sigbus_hint(summary)) if h]
    for line in summary_lines(summary) + hints:
        print(line, file=sys.stderr)
    if args.summary_json:
        write_json(args.summary_json, summary)
    return status


# --- the pieces -----------------------------------------------------------------------------------

def statically_linked(name: str) -> str | None:
    """The path of CMD's executable if it is an ELF file without a dynamic linker (Go's programs, static
    builds), else None. A script or anything unreadable is not judged."""
    path = shutil.which(name) if "/" not in name else name
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:  # 64-bit little-endian
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None
    types = [struct.unpack_from("<I", table, k * phentsize)[0] for k in range(len(table) // phentsize)]
    PT_INTERP = 3
    return None if PT_INTERP in types else path


def read_secret(path: str | None) -> str:
    if path:
        try:
            secret = Path(path).read_text().rstrip("\r\n")  # as memd reads it
        except OSError as e:
            raise FarmemError(f"cannot read the secret file {path}: {e.strerror or e}")
        where = path
    else:
        secret, where = os.environ.get("FARMEM_SECRET", "").strip(), "$FARMEM_SECRET"
    if not secret:
        raise FarmemError(f"the memd secret in {where} is empty")
    return secret


def probe_memds(addrs: list, secret: str) -> None:
    """Authenticate to every memd before CMD starts, so that a typo fails in seconds, not at the
    first eviction."""
    try:
        from farmem import memdproto
    except ModuleNotFoundError as e:
        if e.name != "farmem.memdproto":
            raise
        raise FarmemError("cannot check the memd: farmem/memdproto.py (the protocol client) "
                          "is missing from this install") from None
    for addr in addrs:
        try:
            # rdma://ADDR:PORT authenticates over TCP on the same ADDR:PORT first
            probe_addr = "tcp:" + addr[len("rdma://"):] if addr.startswith("rdma://") else addr
            memdproto.probe(probe_addr, secret, timeout=PROBE_TIMEOUT_S)
        except memdproto.MemdError as e:  # its sentence names the address already
            raise FarmemError(str(e), exit_code=EXIT_CONFIG) from None
        except OSError as e:
            raise FarmemError(f"cannot reach memd at {addr}: {e.strerror or e}", exit_code=EXIT_CONFIG) from None


def check_reachable_as(addrs: list, user) -> None:
    """--user with a memd of one's own: CMD's processes connect to it themselves, as that user,
    and one that may not would stop at its first paged mapping (exit 78), in the middle of its
    work (a PostgreSQL backend, its query). So connect to each Unix socket as that user first, in
    a child that takes the user's ids (system calls only, then _exit)."""
    import socket
    for addr in addrs:
        if not addr.startswith("unix:"):
            continue
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(5)
                s.connect(addr[len("unix:"):])
            except OSError as e:
                os.write(w, str(e.strerror or e).encode()[:300])
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            why = f.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise FarmemError(f"--user {user.pw_name}: CMD's processes could not connect to memd at {addr} "
                              f"({why or 'the check failed'}): give {user.pw_name} access to the socket "
                              f"(write on it, search on its directories)", exit_code=EXIT_CONFIG)


def private_tmpdir() -> str:
    """A 0700 directory for the memd socket, its secret and the control socket."""
    tmpdir = tempfile.mkdtemp(prefix="farmem-run-")
    if len(os.path.join(tmpdir, "control.sock")) > SUN_PATH_MAX:  # a long $TMPDIR
        os.rmdir(tmpdir)
        tmpdir = tempfile.mkdtemp(prefix="farmem-run-", dir="/tmp")
    return tmpdir


def hand_over(tmpdir: str, sockets: list, user) -> None:
    """--user: that user may reach the run's sockets (its own, as if it had run farmem itself);
    the memd secret file stays root's."""
    try:
        os.chown(tmpdir, user.pw_uid, user.pw_gid)
        for path in sockets:
            os.chown(path, user.pw_uid, user.pw_gid)
    except OSError as e:
        raise FarmemError(f"cannot hand the run's sockets in {tmpdir} to {user.pw_name}: {e.strerror or e}")


def open_to_run(tmpdir: str, sockets: list) -> str:
    """farmem run as root: the processes of the run that give up root (a server's workers, memcached
    -u, nginx) may reach the run's sockets too. memd asks them for its secret (HMAC), the control
    socket for the key returned here; the directory stays unlistable and the secret file root's."""
    try:
        os.chmod(tmpdir, 0o711)
        for path in sockets:
            os.chmod(path, 0o666)
    except OSError as e:
        raise FarmemError(f"cannot open the run's sockets in {tmpdir} to its processes: {e.strerror or e}")
    return os.urandom(16).hex()


def build_env(args, base, address: str, secret: str, control_path: str) -> dict:
    env = dict(base)
    shim = str(paths.preload_lib())
    old = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = f"{shim}:{old}" if old else shim
    env["FARMEM_MEMD"] = address
    env["FARMEM_SECRET"] = secret
    env["FARMEM_LOCAL"] = args.local
    env["FARMEM_CONTROL"] = control_path
    env["FARMEM_LAUNCH_UID"] = str(os.getuid())
    env.update(knobs.env_vars(args))
    # fault=auto: each process's shim takes handler threads if it has liburing or libaio loaded (uffd/preload.c).
    return env


FDS_HIGH = 512  # where farmem's C parts put their descriptors (memd/common/fm_fds.c)


def die_with_launcher(launcher: int):
    """In CMD's child, before exec: SIGTERM when farmem run dies, even by SIGKILL (which it cannot forward);
    and a descriptor table wide enough for the numbers farmem's C parts keep their descriptors at."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    high = FDS_HIGH if soft == resource.RLIM_INFINITY else min(FDS_HIGH, soft // 2)

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG; kept across exec and the --user switch before it
        if os.getppid() != launcher:  # it died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)
        # Grown here, with one thread, the table costs nothing, and exec keeps it. Grown by the JVM agent at
        # its first descriptor, with the JVM's threads sharing it, the kernel waited out an RCU grace period
        # first: 14-29 ms of every JVM's start (fm_fds_widen in memd/common/fm_fds.h).
        for fd in (2, 1, 0):
            try:
                os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high))
                break
            except OSError:
                pass
    return arm


def run_child(cmd: list, env: dict, user=None) -> tuple:
    """Run CMD, forwarding SIGINT/SIGTERM/SIGHUP to it; return (shell-style status, seconds, the name of
    the signal that killed it or None, the peak resident set in bytes of CMD or of one of the processes
    it waited for, whichever was largest)."""
    child = None
    pending = []

    def forward(signo, _frame):
        if child is None:
            pending.append(signo)
            return
        try:
            os.kill(child.pid, signo)
        except ProcessLookupError:
            pass

    saved = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        start = time.monotonic()
        try:
            ids = {}
            if user:
                ids = dict(user=user.pw_uid, group=user.pw_gid,
                           extra_groups=os.getgrouplist(user.pw_name, user.pw_gid))
            # CMD's far memory is this run's memd, which dies with us: so does CMD (an orphan ran on
            # with no budget and no memd, or stopped at its first page that memd had held).
            child = subprocess.Popen(cmd, env=env, preexec_fn=die_with_launcher(os.getpid()), **ids)
        except FileNotFoundError:
            raise FarmemError(f"cannot run {cmd[0]}: command not found", exit_code=127) from None
        except OSError as e:
            raise FarmemError(f"cannot run {cmd[0]}: {e.strerror or e}", exit_code=126) from None
        for signo in pending:
            os.kill(child.pid, signo)
        # wait4, not Popen.wait: its rusage holds the largest resident set of CMD and the processes it waited for.
        _, wstatus, usage = os.wait4(child.pid, 0)
        rc = child.returncode = os.waitstatus_to_exitcode(wstatus)
        elapsed = time.monotonic() - start
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return (128 - rc if rc < 0 else rc), elapsed, (signal.Signals(-rc).name if rc < 0 else None), usage.ru_maxrss << 10


def summarise(pagers: list, status: int, elapsed: float, killed_by: str | None = None) -> dict:
    hdrs = []
    for p in pagers:
        try:
            hdrs.append(resmap.read_fd(p.fd).hdr)
        except (OSError, ValueError) as e:
            log.warning("the residency map of pid %d is unreadable: %s", p.pid, e)
    out = resmap.figures(hdrs)
    out["pids"] = [int(h.pid) for h in hdrs]
    out["exit_status"] = status
    out["killed_by"] = killed_by
    out["elapsed_s"] = round(elapsed, 3)
    return out


FAULT_MODE_WORDS = {"signal": "in the faulting thread", "thread": "by handler threads"}


def summary_lines(s: dict) -> list:
    killed = f" (killed by {s['killed_by']})" if s.get("killed_by") else ""
    tail = f"exit status {s['exit_status']}{killed}, {s['elapsed_s']:.2f} s"
    # A pager that never registered anything (one started at its process's start: an executable with its
    # own malloc, uffd/preload.c) paged as little as none.
    if s["processes"] == 0 or not (s.get("peak_registered_bytes") or s.get("registered_bytes")):
        # What --local did not hold: all of CMD's memory (wait4's peak resident set of its largest process).
        unpaged = f"; CMD had up to {fmt_bytes(s['peak_rss_bytes'])} resident, none of it paged" \
            if s.get("peak_rss_bytes") else ""
        what = "no pager started" if s["processes"] == 0 else "nothing paged"
        return [f"farmem: {what} (nothing was mapped at or above the threshold, or no process could be paged: "
                f"see any warning above; small blocks until glibc's heaps pass the threshold, and with --no-reservations "
                f"all of them, stay local: docs/compatibility.md){unpaged}; {tail}"]
    # zero_fills counts pages (demand faults and the zero runs installed ahead of them), and
    # write-protect faults are not among `faults`: neither is a part of that figure.
    first = (f"farmem: {s['faults']} faults, {s['wp_faults']} write-protect faults; {s['zero_fills']} pages "
             f"zero-filled, {s['remote_reads']} remote reads, {s['remote_writes']} remote writes, "
             f"{s['evictions']} evictions ({s['evictions_clean']} clean, {s['evictions_dirty']} dirty); "
             f"fault p50 {s['fault_p50_us']:.2f} us, p99 {s['fault_p99_us']:.2f} us")
    if s.get("evict_pinned"):
        # I/O in flight had them pinned (an O_DIRECT read through libaio or io_uring): kept, not lost.
        first += f"; {s['evict_pinned']} times a victim was pinned for I/O and stayed"
    if s.get("pins_refused"):
        # Each such call's buffer was made resident but could leave again: an EFAULT, made again.
        first += (f"; {s['pins_refused']} system calls found the pin table full ({s['peak_pins']} held at once): "
                  f"their buffers were not kept from eviction")
    problems = [f"{s[k]} {k.replace('_', ' ')}" for k in ("memd_full", "crc_errors", "transport_errors",
                                                         "memd_servers_lost", "memd_timeouts", "memd_failovers")
                if s.get(k)]
    if s.get("refused_ranges"):
        # What the program would have had paged and the pager could not take: said here, not only in
        # the warnings above (a whole heap left local went unnoticed for sessions, docs/compatibility.md).
        problems.append(f"{s['refused_ranges']} ranges ({fmt_bytes(s['refused_bytes'])} of address space) not paged: "
                        f"region table full or memd refused them")
    procs = f"{s['processes']} process" + ("es" if s["processes"] != 1 else "")
    if s["processes"] > 1:
        # Each has a budget of its own (docs/fork-design.md): 100 short children of --local 16M read
        # "local limit 1.6 GiB" and looked like a flag misread.
        procs += " (the limit, resident and registered figures are their sums: each has a budget of its own)"
    # registered_bytes is a gauge: 0 once the program has unmapped its memory, so say it only if not.
    registered = f", registered {fmt_bytes(s['registered_bytes'])}" if s["registered_bytes"] else ""
    if registered and s.get("peak_registered_bytes", 0) > s["registered_bytes"]:
        registered += f" ({fmt_bytes(s['peak_registered_bytes'])} at its highest)"  # it unmapped the rest
    adopted = resmap.adopt_note(s)
    served = FAULT_MODE_WORDS.get(s.get("fault_mode"), s.get("fault_mode"))
    if s.get("heap_faults"):
        # Regions the kernel waits for (glibc's heaps, another allocator's mappings): a handler
        # thread served them, in any mode.
        served += f" ({s['heap_faults']} of them in malloc heaps and reservations, by a handler thread)"
    # A percentage budget follows the registered pages: when the program unmapped, the peak was
    # reached under a higher limit than the last, which is said beside it.
    highest = s.get("peak_limit_bytes", 0)
    highest = f" ({fmt_bytes(highest)} at its highest)" if highest > s["local_limit_bytes"] else ""
    second = (f"farmem: local limit {fmt_bytes(s['local_limit_bytes'])}{highest}, peak resident "
              f"{fmt_bytes(s['peak_resident_bytes'])}{' (' + adopted + ')' if adopted else ''}{registered}; "
              f"transport {s['transport']}, faults served {served}, "
              f"{procs}; " + ("; ".join(problems) + "; " if problems else "") + tail)
    lines = [first, second]
    if s.get("swapva_calls"):
        # A farmem JDK's SwapVA compaction (--gc swapva), or the shim's mremap, moved pages through the pager.
        lines.append(f"farmem: {s['swapva_calls']} page moves (SwapVA compaction, mremap): "
                     f"{s['swapva_pages_moved']} pages moved "
                     f"(UFFDIO_MOVE), {s['swapva_pages_remote']} remote pages moved inside memd "
                     f"({s.get('swapva_remote_copied', 0)} copied by memd itself: no page bytes on the wire), "
                     f"{s['swapva_pages_fetched']} fetched (memd full), {s['swapva_pages_untouched']} untouched, "
                     f"{s['swapva_pages_copied']} copied")
    if s.get("remaps"):
        # The program's mremaps of paged memory, done by the kernel with the books going along (uffd/remap.c).
        lines.append(f"farmem: {s['remaps']} mremaps of paged memory: {s.get('remap_pages_resident', 0)} resident "
                     f"pages moved by the kernel, {s.get('remap_pages_kept', 0)} pages in memd stayed in their "
                     f"slots (none read or copied)")
    return lines


# A stock JVM whose collector took this share of at least this many faults is told of --gc farmem.
GC_HINT_SHARE = 0.5
GC_HINT_FAULTS = 100_000
# Of those, this share taken by G1's concurrent threads (its marking) names the flags that stop it.
MARK_HINT_SHARE = 0.25
# Or this share, where at least CUT_SHORT_FULL_GCS full GCs came, about one for each marking cycle (at most one
# remark pause more than them): its cycles ended in a full GC, cut short or before a mixed collection could help,
# and what they read from memd went for nothing.
CUT_SHORT_SHARE = 0.1
CUT_SHORT_FULL_GCS = 3


def gc_hint(s: dict, collector: str = "G1") -> str | None:
    """For a stock JDK's run whose collector did most of the paging: what would page it better.
    Stock G1's full GCs read every live object's headers back from memd (their moves are done in memd
    with gc_moves, but HotSpot reads and writes the headers itself), and its marking reads every remote
    object (GcChurn at 25% local, session 70: 3.95x all local with stock G1, 2.11x with --gc farmem);
    Shenandoah marks and evacuates across the whole heap every cycle (H2 at 25% local: 3.2x all local,
    G1 1.6x; bench/RESULTS.md). The farmem JDK changes G1 only: no hint for the other collectors."""
    faults, gc = s.get("faults", 0), s.get("gc_faults", 0)
    if s.get("processes", 0) == 0 or gc < GC_HINT_FAULTS or gc < GC_HINT_SHARE * faults:
        return None
    share = f"{min(100, gc * 100 // faults)}% of the faults ({gc})"
    if collector == "Shenandoah":
        return (f"farmem: Shenandoah's threads took {share}: each of its cycles marks and evacuates across the "
                "whole heap, and what that touches beyond the budget comes back from memd; G1 (the default) "
                "pages the same programs with less of it (docs/jvm.md, \"Shenandoah\")")
    if collector != "G1":
        return None
    hint = (f"farmem: the collector's threads took {share}: `farmem run "
            "--gc farmem` runs the farmem JDK (`make jdk`), whose G1 postpones marking pages that are in memd "
            "and does a full GC's work where its pages lie (docs/patched-jdk.md)")
    conc = s.get("gc_conc_faults", 0)
    full, marks = s.get("full_gcs", 0), s.get("remark_pauses", 0)
    if full >= CUT_SHORT_FULL_GCS and marks <= full + 1 and conc >= CUT_SHORT_SHARE * gc:
        # GcChurn at 50% local: 11 full GCs, 12 remarks, no mixed collection; at 25%: 11 and 2-4. Marking took
        # 20-23% of the collector's faults; 7% (50%) and 13% (25%) faster without it (bench/RESULTS.md, session 81).
        hint += (f"; with this JDK, G1's concurrent marking took {conc} of them, and its cycles ended in a full "
                 f"GC ({full} full GCs, {marks} remarks): what it read from memd went for nothing. "
                 "`-XX:-G1UseAdaptiveIHOP -XX:InitiatingHeapOccupancyPercent=100` stops it; the full GCs "
                 "come anyway, and farmem does their moves in memd (docs/jvm.md)")
    elif conc >= MARK_HINT_SHARE * gc:
        # GcChurn, Spark at 25% local: 14% and 8% faster without marking, G1's pauses longer (bench/RESULTS.md, session 71).
        hint += (f"; with this JDK, G1's concurrent marking took {conc} of them: `-XX:-G1UseAdaptiveIHOP "
                 "-XX:InitiatingHeapOccupancyPercent=100` stops it and leaves the old generation's garbage to "
                 "full GCs, whose moves farmem does in memd: a faster run, longer pauses (docs/jvm.md)")
    return hint


# A run with at least this many faults, this share of them pages back within three budgets of leaving, is
# told what a larger budget would have saved.
THRASH_HINT_FAULTS = 100_000
THRASH_HINT_SHARE = 0.3
IDLE_HINT_RESERVED = 2  # registered at least this many times its peak resident: mostly never touched
THRASH_HINT_LEAST = 5  # percent of the faults a larger budget must save to be named


def larger_local(local: str | None, s: dict, factor: int) -> str:
    """--local for a budget `factor` times this run's: a percentage stays one, capped at 100%."""
    if local and local.endswith("%"):
        try:
            return f"{min(100.0, float(local[:-1]) * factor):g}%"
        except ValueError:
            pass
    limit = s.get("peak_limit_bytes") or s.get("local_limit_bytes", 0)
    return f"{-(-limit * factor // (1 << 20))}M"  # whole MiB, rounded up: what --local parses


def thrash_hint(s: dict, local: str | None = None) -> str | None:
    """For a run that worked on more than its budget: most faults were pages that had left less than a
    budget's evictions before (refaults_soon), which a budget twice as large would have kept, and
    refaults_3budgets those a budget four times as large would have, about: the clock's record of
    when each page left (uffd/evict.c). Without it a user sees only that the program was slow
    (Perl's hash at 25% local: 7M faults, 85% of them back within three budgets; docs/residency-map.md)."""
    faults, soon = s.get("faults", 0), s.get("refaults_soon", 0)
    within3 = max(soon, s.get("refaults_3budgets", 0))
    if s.get("processes", 0) == 0 or faults < THRASH_HINT_FAULTS or within3 < THRASH_HINT_SHARE * faults:
        return None
    said = []
    for factor, share in ((2, soon * 100 // faults), (4, within3 * 100 // faults)):
        larger = larger_local(local, s, factor)
        if share < THRASH_HINT_LEAST and larger != "100%":
            continue  # "would have saved about 0%" is no advice
        # All of it local is no estimate: nothing pages then.
        saved = "all" if larger == "100%" else f"about {share}%"
        said.append(f"`--local {larger}` would have saved {saved} of the faults" if not said
                    else f"`--local {larger}` {saved if saved != 'all' else 'all of them'}")
        if larger == "100%":
            break
    return (f"farmem: {soon * 100 // faults}% of the faults were pages back within one budget of evictions after "
            f"they left ({within3 * 100 // faults}% within three): CMD works on more than its local limit; "
            + ", ".join(said) + (" (estimated from when each page left)" if "about" in said[0] else ""))


def idle_budget_hint(s: dict, local: str | None = None) -> str | None:
    """A percentage budget that never bound: it is a share of what CMD registered, and a program that
    reserves far more than it touches (SBCL's 1 GiB dynamic space, a runtime's heap reserved whole)
    gets a budget above all it ever used, so nothing pages. Said with the byte budget that keeps the
    same share of what it did use. Not for a JVM: its percentage is of its heap by design, and a heap
    that fits its budget is what the budget was for (a JVM started by a script shows GC-thread faults)."""
    local = local or os.environ.get("FARMEM_LOCAL") or next(k["default"] for k in knob_table.KNOBS if k["name"] == "local")
    if not local.endswith("%") or s.get("processes", 0) == 0 or s.get("evictions", 0) or s.get("gc_faults", 0):
        return None
    try:
        pct = float(local[:-1])
    except ValueError:
        return None
    reg, peak = s.get("registered_bytes", 0), s.get("peak_resident_bytes", 0)
    limit = s.get("peak_limit_bytes") or s.get("local_limit_bytes", 0)
    if pct >= 100 or not peak or peak >= limit or reg < IDLE_HINT_RESERVED * peak:
        return None
    share = -(-int(peak * pct / 100) // (1 << 20))  # whole MiB, rounded up: what --local parses
    return (f"farmem: nothing left local memory: `--local {local}` is {local} of the {fmt_bytes(reg)} CMD registered "
            f"({fmt_bytes(limit)}), and it never had more than {fmt_bytes(peak)} resident (most of what it maps "
            f"it never touched); `--local {max(1, share)}M`, {local} of that, pages it")


# A run whose resident set passed its paged memory's by this much is told that --local did not hold the rest.
UNPAGED_HINT_LEAST = 64 << 20


def unpaged_hint(s: dict, threshold: str | None = None) -> str | None:
    """CMD's resident set was mostly memory farmem does not page, which no budget holds: small
    mappings and blocks (below --threshold, CPython's 1 MiB arenas of small objects), files, thread
    stacks. A pager started all the same for what did pass (a big block, glibc's thread heaps), so
    the summary gave a budget and no word that most of the program was outside it (`node` at 25%
    before session 40's pool: 367 MiB resident, 244 KiB of it paged, a 1 MiB budget). Not for a JVM:
    its heap is what is paged, by design, and the rest of a JVM (code, metaspace, threads) is not the
    heap."""
    rss, peak = s.get("peak_rss_bytes", 0), s.get("peak_resident_bytes", 0)
    limit = s.get("peak_limit_bytes") or s.get("local_limit_bytes", 0)
    if s.get("processes", 0) == 0 or s.get("gc_faults", 0):
        return None
    # At least this much: the paged memory's peak and CMD's may not be at one time. With the shared-memory
    # transport the pages CMD wrote to memd's store count in its resident set too (RssShmem), each slot
    # once however often it was written: at most the most ever registered (a program that pages some of
    # its memory hard and leaves most of it unpaged is told: Node with --threshold 256K).
    unpaged = rss - peak
    if s.get("transport") == "shm":
        written = s.get("remote_writes", 0) * 4096
        unpaged -= min(written, max(s.get("peak_registered_bytes", 0), s.get("registered_bytes", 0)) or written)
    if unpaged < UNPAGED_HINT_LEAST or unpaged < 2 * max(peak, limit):
        return None
    threshold = parse_bytes(threshold or next(k["default"] for k in knob_table.KNOBS if k["name"] == "threshold"))
    return (f"farmem: CMD had up to {fmt_bytes(rss)} resident (its largest process), and its paged memory never "
            f"more than {fmt_bytes(peak)} of it: at least {fmt_bytes(unpaged)} was memory farmem does not page, "
            f"which `--local` does not hold (mappings and blocks under `--threshold` ({fmt_bytes(threshold)}) not reserved "
            "PROT_NONE first, such as CPython's small objects; files; thread stacks: docs/compatibility.md)")


def sigbus_hint(s: dict) -> str | None:
    """CMD died of SIGBUS while faults were served in the faulting thread: a SIGBUS of its own, or a paging
    fault that reached it past the shim's covers (a raw rt_sigaction or rt_sigprocmask, docs/pager.md)."""
    if s.get("killed_by") != "SIGBUS" or "signal" not in s.get("fault_mode", ""):
        return None
    return ("farmem: CMD died of SIGBUS while farmem served its faults by SIGBUS: if it was not CMD's own, "
            "a handler or signal mask past farmem's covers took a paging fault; `farmem run --fault thread` "
            "pages it without signals (docs/compatibility.md)")


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        raise FarmemError(f"cannot write the summary to {path}: {e.strerror or e}") from None
