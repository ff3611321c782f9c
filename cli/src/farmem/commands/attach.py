"""`farmem attach PID` and `farmem detach PID`: page the heap of a HotSpot JVM that is running.

attach loads build/lib/libfarmem_agent.so with `jcmd PID JVMTI.agent_load LIB OPTIONS` (the
JVM's own jcmd, next to its java). Without --memd it first starts a *keeper*: a small
detached process (this module, `python -m farmem.commands.attach keeper ...`) that owns the
embedded memd and the state directory /tmp/farmem-attach-PID (0700: memd.sock, secret,
keeper.pid, msg). The keeper outlives `farmem attach`; it stops memd and removes the
directory when the JVM exits (it waits on a pidfd) or when `farmem detach` sends it SIGTERM,
so nothing is left behind either way. memd gets SIGTERM if the keeper itself dies.

detach loads the agent once more with `detach`: the agent that is already loaded brings every
remote page home, unregisters the heap and stops its pager (the library stays loaded, idle;
a later attach starts it again). Then the keeper is stopped.
"""

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from farmem import java as javacmd
from farmem import knobs, paths, procmap
from farmem.errors import FarmemError
from farmem.units import fmt_bytes

STATE_PREFIX = "/tmp/farmem-attach-"
JCMD_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 15.0
PAGING_TIMEOUT_S = 10.0


def state_dir(pid: int) -> Path:
    return Path(f"{STATE_PREFIX}{pid}")


# --- checks ---------------------------------------------------------------------------------------

def check_hotspot(pid: int) -> Path:
    """The path of the JVM's jcmd; refuses a process that is not a HotSpot JVM."""
    if not os.path.exists(f"/proc/{pid}"):
        raise FarmemError(f"no process with pid {pid}")
    try:
        with open(f"/proc/{pid}/maps") as f:
            jvm = next((line.split()[-1] for line in f if line.rstrip().endswith("/libjvm.so")), None)
    except PermissionError:
        raise FarmemError(f"cannot read the memory map of pid {pid}: permission denied "
                          "(run as its user or as root)") from None
    if not jvm:
        raise FarmemError(f"pid {pid} is not a HotSpot JVM (no libjvm.so in its memory map): "
                          "farmem attach serves Java programs; use `farmem run` for others")
    # <jdk>/lib/server/libjvm.so -> <jdk>/bin/jcmd
    jcmd = Path(jvm).parent.parent.parent / "bin" / "jcmd"
    if not jcmd.exists():
        found = shutil.which("jcmd")
        if not found:
            raise FarmemError(f"no jcmd next to the JVM of pid {pid} ({jcmd}) nor on PATH: "
                              "install the JDK (not only the JRE)")
        jcmd = Path(found)
    if attach_disabled(pid):
        raise FarmemError(f"pid {pid} was started with -XX:+DisableAttachMechanism: it takes no agent after its "
                          "start (no jcmd reaches it); start it under `farmem run` instead")
    return jcmd


def attach_disabled(pid: int) -> bool:
    """The JVM turned its attach listener off, on its command line or in the variables the launcher reads."""
    said = []
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            said += f.read().split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                name, _, value = var.partition(b"=")
                if name in (b"JAVA_TOOL_OPTIONS", b"JDK_JAVA_OPTIONS", b"_JAVA_OPTIONS"):
                    said += value.split()
    except OSError:
        return False
    last = [a for a in said if a in (b"-XX:+DisableAttachMechanism", b"-XX:-DisableAttachMechanism")]
    return bool(last) and last[-1] == b"-XX:+DisableAttachMechanism"


# jcmd waits this long for the JVM's attach listener (its default, 10 s, is short for a JVM that
# pages and collects on a loaded machine); a JVM that did not answer is asked again, ATTACH_TRIES in all.
ATTACH_TIMEOUT_MS = 20000
ATTACH_TRIES = 2


def jcmd_failure(out: str) -> str:
    """What a failed jcmd says: its exception's line (with the cause's), not the last stack frame."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(("at ", "...")) and not re.fullmatch(r"[0-9]+:", line)]
    return "; ".join(said[-2:]) if said else (lines[-1] if lines else "")


def _attach_unanswered(out: str) -> bool:
    """jcmd could not reach the JVM's attach listener (not: the command ran and failed)."""
    return "AttachNotSupportedException" in out or "doesn't respond" in out or \
        "Connection refused" in out or "Unable to open socket file" in out


def jcmd_agent_load(jcmd: Path, pid: int, options: str, msgfile: Path) -> None:
    """JVMTI.agent_load; the agent's own refusal, from msgfile, is the error message."""
    lib = javacmd.agent_lib()
    try:
        msgfile.unlink()
    except FileNotFoundError:
        pass
    for _ in range(ATTACH_TRIES):
        try:
            # jcmd splits its arguments at "=" unless quoted (DCmdArgIter).
            r = subprocess.run([str(jcmd), f"-J-Dsun.tools.attach.attachTimeout={ATTACH_TIMEOUT_MS}", str(pid),
                                "JVMTI.agent_load", str(lib), f'"{options}"'],
                               capture_output=True, text=True, timeout=JCMD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise FarmemError(f"jcmd {pid} JVMTI.agent_load did not finish in {JCMD_TIMEOUT_S:.0f} s") from None
        out = (r.stdout + r.stderr).strip()
        m = re.search(r"return code: (-?[0-9]+)", out)
        if r.returncode == 0 and m and m.group(1) == "0":
            return
        if m or not _attach_unanswered(out) or not Path(f"/proc/{pid}").exists():
            break
        print(f"farmem: pid {pid} did not answer jcmd ({jcmd_failure(out)}); asking again", file=sys.stderr)
    why = ""
    try:
        why = msgfile.read_text().strip()
    except OSError:
        pass
    if not why:
        why = jcmd_failure(out) or f"jcmd exited with status {r.returncode}"
    raise FarmemError(f"pid {pid}: {why}")


# --- the keeper ----------------------------------------------------------------------------------

def start_keeper(pid: int, sdir: Path, log_level: str | None) -> int:
    """Start the keeper detached; return its pid once its memd is ready."""
    r, w = os.pipe()
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = pkg_root + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [sys.executable, "-m", "farmem.commands.attach", "keeper", str(pid), str(sdir), str(w),
            log_level or ""]
    with open(sdir / "keeper.log", "ab") as logf:
        proc = subprocess.Popen(argv, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, env=env)
    os.close(w)
    deadline = time.monotonic() + READY_TIMEOUT_S
    buf = b""
    try:
        while b"\n" not in buf and time.monotonic() < deadline:
            if select.select([r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(r, 64)
                if not chunk:
                    break
                buf += chunk
    finally:
        os.close(r)
    if buf.split(b"\n", 1)[0] != b"ready":
        proc.kill()
        proc.wait()
        log = ""
        try:
            log = (sdir / "keeper.log").read_text().strip()
        except OSError:
            pass
        shutil.rmtree(sdir, ignore_errors=True)
        raise FarmemError(f"the memd for pid {pid} did not start{': ' + log if log else ''}")
    return proc.pid


def keeper_main(pid: int, sdir: Path, ready_fd: int, log_level: str) -> int:
    """Runs detached: memd for one JVM, until that JVM exits or SIGTERM."""
    from farmem.embedded_memd import EmbeddedMemd
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    memd = EmbeddedMemd(paths.memd_binary(), str(sdir), log_level=log_level or None)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        shutil.rmtree(sdir, ignore_errors=True)
        return 1
    try:
        memd.start()
        (sdir / "keeper.pid").write_text(f"{os.getpid()}\n")
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
        while not stop:
            try:
                if select.select([pidfd], [], [], 1.0)[0]:
                    break  # the JVM exited
            except InterruptedError:
                continue
            if memd.proc is not None and memd.proc.poll() is not None:
                print(f"farmem: memd for pid {pid} exited with status {memd.proc.returncode}", file=sys.stderr)
                break
    finally:
        memd.stop(quiet=True)
        os.close(pidfd)
        shutil.rmtree(sdir, ignore_errors=True)
    return 0


def stop_keeper(sdir: Path, timeout: float = 10.0) -> None:
    try:
        kpid = int((sdir / "keeper.pid").read_text())
    except (OSError, ValueError):
        shutil.rmtree(sdir, ignore_errors=True)
        return
    try:
        os.kill(kpid, signal.SIGTERM)
    except ProcessLookupError:
        shutil.rmtree(sdir, ignore_errors=True)
        return
    deadline = time.monotonic() + timeout
    while sdir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if sdir.exists():
        raise FarmemError(f"the memd keeper (pid {kpid}) did not stop within {timeout:.0f} s; "
                          f"its state is in {sdir}")


def hand_to_jvm(pid: int, sdir: Path) -> None:
    """A JVM of another user (a service's, attached by root): the agent inside it reads the secret
    and reaches memd's socket, and writes its message, as that user. The state directory and what
    is in it become the JVM's; the keeper (root) still removes them."""
    st = os.stat(f"/proc/{pid}")  # its effective uid and gid
    if st.st_uid == os.geteuid():
        return
    try:
        for path in (sdir, sdir / "memd.sock", sdir / "secret"):
            os.chown(path, st.st_uid, st.st_gid)
    except OSError as e:
        raise FarmemError(f"pid {pid} runs as uid {st.st_uid}: cannot hand it the memd in {sdir} "
                          f"({e.strerror or e}); attach as root or as that user") from None


def _keeper_alive(sdir: Path) -> bool:
    try:
        kpid = int((sdir / "keeper.pid").read_text())
        os.kill(kpid, 0)
        return True
    except (OSError, ValueError):
        return False


# --- the commands ---------------------------------------------------------------------------------

def cmd_attach(args) -> int:
    pid = args.pid
    from farmem import doctor
    for feature in ("userfaultfd", "jcmd"):
        doctor.require(feature)
    jcmd = check_hotspot(pid)
    lib = javacmd.agent_lib()
    if not lib.exists():
        raise FarmemError(f"the JVMTI agent {lib} is missing: build it with `make c`")
    if procmap.find_maps(pid):
        raise FarmemError(f"pid {pid} is already paged by farmem (`farmem stat {pid}`; `farmem detach {pid}`)")
    sdir = state_dir(pid)
    if sdir.exists():
        if _keeper_alive(sdir):
            raise FarmemError(f"a memd for pid {pid} is already running ({sdir}); `farmem detach {pid}` stops it")
        shutil.rmtree(sdir, ignore_errors=True)  # a keeper that was killed: stale
    opts = [f"local={args.local}", "onerror=exit"] + knobs.agent_options(args, "attach")
    keeper = None
    if args.memd:
        if not args.secret_file:
            raise FarmemError("--memd needs the memd's secret file (--secret-file FILE), readable by the JVM")
        opts += [f"memd={';'.join(args.memd)}", f"secret_file={os.path.abspath(args.secret_file)}"]
        msgdir = Path(os.environ.get("TMPDIR", "/tmp"))
        msgfile = msgdir / f"farmem-attach-msg-{pid}-{os.getpid()}"
    else:
        try:
            os.mkdir(sdir, 0o700)
        except FileExistsError:
            raise FarmemError(f"{sdir} exists: another farmem attach to pid {pid} is starting") from None
        keeper = start_keeper(pid, sdir, args.log)
        try:
            hand_to_jvm(pid, sdir)
        except BaseException:
            stop_keeper(sdir)
            raise
        opts += [f"memd=unix:{sdir}/memd.sock", f"secret_file={sdir}/secret"]
        msgfile = sdir / "msg"
    opts.append(f"msgfile={msgfile}")
    try:
        jcmd_agent_load(jcmd, pid, ",".join(opts), msgfile)
        figures = wait_paging(pid)
    except BaseException:
        if keeper is not None:
            stop_keeper(sdir)
        raise
    finally:
        if args.memd:
            try:
                msgfile.unlink()
            except OSError:
                pass
    print(f"farmem: attached to pid {pid}: paging {fmt_bytes(figures['registered_bytes'])} of Java heap, "
          f"local limit {fmt_bytes(figures['local_limit_bytes'])}"
          + (f"; memd in {sdir}, stopped by `farmem detach {pid}` or when the JVM exits" if keeper else ""),
          file=sys.stderr)
    return 0


def wait_paging(pid: int) -> dict:
    """Success means the pager is paging: its map lists registered pages."""
    deadline = time.monotonic() + PAGING_TIMEOUT_S
    while True:
        try:
            figures = procmap.stat_figures(pid, procmap.read_map(pid))
            if figures["registered_bytes"] > 0:
                return figures
        except FarmemError:
            pass
        if time.monotonic() > deadline:
            raise FarmemError(f"the agent loaded into pid {pid} but no paged heap showed up within "
                              f"{PAGING_TIMEOUT_S:.0f} s (see the JVM's stderr)")
        time.sleep(0.1)


def cmd_detach(args) -> int:
    pid = args.pid
    jcmd = check_hotspot(pid)
    sdir = state_dir(pid)
    if not procmap.find_maps(pid):
        if sdir.exists():
            stop_keeper(sdir)
        raise FarmemError(f"pid {pid} is not paged by farmem: nothing to detach")
    msgfile = (sdir / "msg") if sdir.exists() else Path(os.environ.get("TMPDIR", "/tmp")) / \
        f"farmem-detach-msg-{pid}-{os.getpid()}"
    try:
        jcmd_agent_load(jcmd, pid, f"detach,msgfile={msgfile}", msgfile)
    finally:
        if not sdir.exists() or msgfile.parent != sdir:
            try:
                msgfile.unlink()
            except OSError:
                pass
    had_keeper = sdir.exists()
    if had_keeper:
        stop_keeper(sdir)
    print(f"farmem: detached from pid {pid}: every heap page is local again, the pager is stopped"
          + ("; its memd is stopped" if had_keeper else ""), file=sys.stderr)
    return 0


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "keeper":
    sys.exit(keeper_main(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]))
