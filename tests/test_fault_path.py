# SPDX-License-Identifier: Apache-2.0
"""The fault path of issue 16: faults served in the faulting thread (UFFD_FEATURE_SIGBUS),
and what that mode must not break: system calls into evicted buffers (the shim's covers), a
program's own SIGBUS handler, threads that block every signal, a JVM's own SIGSEGV/SIGBUS
handling, the lost-write race under eviction with 8 threads, and the fallback to handler
threads (fault=thread)."""

import json
import os
import re
import resource
import signal
import subprocess
import sys

import pytest

from conftest import run_or_show_hang

pytestmark = [pytest.mark.pager, pytest.mark.memd]


def run(farmem_cmd, tmp_path, argv, local="32M", env_extra=None, timeout=300, perf_counts=None):
    """`farmem run --local LOCAL -- ARGV`: (result, summary). With PERF_COUNTS, under `perf stat`
    counting the tgkill system calls of the whole run into that file (CSV)."""
    summary = tmp_path / "s.json"
    env = dict(os.environ)
    env.pop("FARMEM_FAULT", None)
    env.update(env_extra or {})
    perf = ["perf", "stat", "-x,", "-o", str(perf_counts), "-e", "syscalls:sys_enter_tgkill", "--"] if perf_counts else []
    cmd = [*perf, *farmem_cmd, "run", "--local", local, "--summary-json", str(summary), "--", *argv]
    # A hang (once in session 52's third clean-clone run, under fault=thread) shows where each thread slept.
    r = run_or_show_hang(cmd, timeout, env=env)
    s = json.loads(summary.read_text()) if summary.exists() else {}
    return r, s


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_system_calls_into_evicted_buffers(built, farmem_cmd, tmp_path, fault):
    """read/pread/readv (with the iovec array itself paged), write/writev, stdio's fread and fwrite,
    send/recv, sendmsg/recvmsg and sendmmsg/recvmmsg on buffers that were just evicted: every byte right, in both modes.
    A stream whose own buffer (setvbuf) is paged keeps every line (EFAULT at fflush before session 35).
    A read, write and getrandom larger than the budget keep to it (moved in pinned pieces).
    Threads blocked in a covered read or wait can be cancelled, and give their pins back. A range
    made PROT_NONE leaves paged memory with its bytes instead of faulting in the evictor.
    glibc's semaphores, mutexes, condition variables, rwlocks and barriers in paged memory, used by
    8 threads under eviction: no abort ("The futex facility returned an unexpected error code"),
    and with faults served in the faulting thread each wait keeps its object's page resident.
    A SIGBUS handler the program installs after the pager started, by any of glibc's seven names
    for it, gets its own SIGBUS and never a paging fault (by sigset it took them all before session
    33). SIGBUS blocked every way glibc has (pthread_sigmask, sigprocmask, sighold, sigset's
    SIG_HOLD, sigblock, sigsetmask), by a handler's mask, inside sigsuspend, or ignored by
    sigignore: paging goes on (all but the first two killed the process with SIGBUS before).
    Coroutines (makecontext), a thread (pthread_attr_setstack) and a signal handler (sigaltstack) on
    stacks of paged memory run to their end (under fault=signal they died before session 33); a
    thread given its stack's top only (pthread_attr_setstackaddr) starts and fstats into its frame
    (the process died of SIGBUS at its start before session 36); and so
    does code on a stack switched to by the program's own assembly, as Erlang's JIT does (it died of
    SIGSEGV at its first fault before session 34), also in a new thread whose first fault comes there
    (session 35); an mmap, madvise, mprotect and munmap called from there (the pager's frames for
    them ran onto the evicted stack under its region lock before session 38: stopped with "Resource
    deadlock avoided" under fault=signal, hung under fault=thread), and a big block malloc'd,
    realloc'd, freed and calloc'd there (the same, before session 39), a read into evicted memory
    from there, evicting as it goes. epoll_wait, epoll_pwait, poll, ppoll, select and
    pselect with their arrays in evicted memory find the ready descriptor (EFAULT before session 34).
    posix_spawn, posix_spawnp, execve, execvpe, execle, execl, system and popen with the path, the
    arguments, the environment and the vectors in evicted memory start their program (EFAULT, or the
    child killed by SIGBUS, before session 45).
    Every descriptor but 0-2 closed as daemons do (a loop, close_range, closefrom): the pager's
    survive, and the program's next file holds only its own bytes (it was stopped, 70, before);
    its dup2 and dup3 onto farmem's are refused with EBUSY (the pager stopped it, 70, before).
    The same through glibc's syscall(): a mapping made by syscall(SYS_mmap) is paged (SBCL's heap was
    not) and unmapped by syscall(SYS_munmap); pages dropped by syscall(SYS_madvise, MADV_DONTNEED)
    while evicted read zeros (they came back from memd with their old bytes before session 38);
    syscall(SYS_pread64), SYS_read, a FUTEX_WAIT on an evicted word and an rt_sigprocmask whose set
    was evicted (any other number, since session 47) do not fail with EFAULT."""
    prog = built("build/tests/iotest")
    built("build/lib/libfarmem_preload.so")
    r, s = run(farmem_cmd, tmp_path, [str(prog), "--size", "64M", "--pressure", "128M"],
               env_extra={"FARMEM_FAULT": fault})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for name in ("read", "write", "stdio", "fortify", "big", "socket", "sigbus", "blocked", "protect", "cancel", "sync",
                 "stacks", "ownstack", "exits", "poll", "exec", "close", "syscall"):
        assert f"iotest: {name} ok" in out, out[-3000:]
    assert s["fault_mode"] == fault
    # `big` moves 48 MiB in one call under a 32 MiB budget: the covers' pieces keep to it.
    assert s["peak_resident_bytes"] <= s["local_limit_bytes"], s
    assert s["evictions"] > 20000, s  # the buffer really was evicted between the calls
    # A dup2 (dup3) onto each number below 1024: farmem's refuse (EBUSY), and the file keeps its line.
    refused = re.search(r"close: (\d+) dup2s onto farmem's descriptors refused", out)
    assert refused and int(refused[1]) >= 2, out[-3000:]  # its userfaultfd and memd connection at least
    held = re.search(r"sync: (\d+) of (\d+) waits kept their page", out)
    crowd = re.search(r"sync: (\d+) of (\d+) sleepers at once kept their page", out)
    assert held and crowd, out[-3000:]
    if fault == "signal":
        # The covers made the evicted buffers resident for the kernel.
        assert s["io_prefaults"] > 1000, s
        assert "in the faulting thread" in out
        # Each glibc wait pinned its futex word's page while it slept (uffd/preload_sync.c),
        # also 100 at once (the pin table held 64 until session 22).
        assert held[1] == held[2], held[0]
        assert crowd and crowd[1] == crowd[2], crowd and crowd[0]
        # `cancel` cancels 1100 threads each holding a pin: had one kept its pin, they would add up
        # past `sync`'s 100 sleepers at once (the table's 1024 filled and failed what followed,
        # until session 50 made it 8192).
        assert s["peak_pins"] <= 200 and s["pins_refused"] == 0, s
    else:
        assert s["io_prefaults"] == 0, s
        # The kernel waits for a page: nothing is pinned, so the same check sees the pages leave.
        assert held[1] == "0", held[0]


PAGE_THROUGH = """
b = bytearray(128 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("sum", sum(b[i] for i in range(0, len(b), 4096)))
"""
BLOCK_SIGBUS_RAW = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
bus = ctypes.c_ulong(1 << (7 - 1))  # SIGBUS, blocked by the raw system call: no cover sees it
assert libc.syscall(14, 0, ctypes.byref(bus), None, 8) == 0  # rt_sigprocmask(SIG_BLOCK, ...)
""" + PAGE_THROUGH


def run_python(farmem_cmd, tmp_path, script, *flags, preexec_fn=None):
    """SCRIPT in this Python under `farmem run --threshold 1M --local 25% FLAGS`: (result, summary)."""
    summary = tmp_path / "s.json"
    env = {k: v for k, v in os.environ.items() if k != "FARMEM_FAULT"}
    r = subprocess.run([*farmem_cmd, "run", "--threshold", "1M", "--local", "25%", *flags, "--summary-json",
                        str(summary), "--", sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, env=env, preexec_fn=preexec_fn)
    return r, json.loads(summary.read_text())


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_a_death_by_sigbus_says_what_to_try(built, farmem_cmd, tmp_path, fault):
    """SIGBUS blocked behind the shim's back (a raw rt_sigprocmask): under fault=signal the first paging
    fault kills the program, and farmem says so by name and points at --fault thread, which pages the
    same program to its end."""
    built("build/lib/libfarmem_preload.so")
    r, s = run_python(farmem_cmd, tmp_path, BLOCK_SIGBUS_RAW, "--fault", fault)
    if fault == "signal":
        assert r.returncode == 135 and s["killed_by"] == "SIGBUS", r.stderr[-3000:]
        assert "exit status 135 (killed by SIGBUS)" in r.stderr and "--fault thread" in r.stderr, r.stderr
    else:
        assert r.returncode == 0 and "sum 32768" in r.stdout, r.stdout + r.stderr[-3000:]
        assert s["killed_by"] is None and s["evictions"] > 0, s
        assert "killed by" not in r.stderr and "--fault thread" not in r.stderr, r.stderr


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_sigbus_blocked_by_the_parent(built, farmem_cmd, tmp_path, fault):
    """A program started with SIGBUS blocked in the mask it inherited (its parent blocked it, and the
    mask survives exec) still pages: before session 33 it died of SIGBUS at its first paging fault
    under fault=signal. The shim unblocks SIGBUS in the main thread and where the pager starts."""
    built("build/lib/libfarmem_preload.so")
    r, s = run_python(farmem_cmd, tmp_path, PAGE_THROUGH, "--fault", fault,
                      preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGBUS}))
    assert r.returncode == 0 and "sum 32768" in r.stdout, r.stdout + r.stderr[-3000:]
    assert s["evictions"] > 0, s


def test_a_program_under_an_address_space_limit(built, farmem_cmd, tmp_path):
    """`ulimit -S -v`: the pager's maps (16 TiB of state bytes, a 1 GiB arena, all NORESERVE) counted
    against it, and until session 33 no pager started under 2 GB ("cannot create the residency map",
    exit 78). Now they are sized to the limit, memd is let out of it, and the program pages."""
    built("build/lib/libfarmem_preload.so")
    limit = 1 << 30
    r, s = run_python(farmem_cmd, tmp_path, PAGE_THROUGH, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY)))
    assert r.returncode == 0 and "sum 32768" in r.stdout, r.stdout + r.stderr[-3000:]
    assert s["evictions"] > 0, s
    assert "refused" not in r.stderr and "error" not in r.stderr, r.stderr


def test_a_thread_that_exits_gives_its_stack_back(built, farmem_cmd, tmp_path):
    """200 threads one after another, each reading an evicted page, half ending by pthread_exit and
    half cancelled: each one's stack of farmem's (its alternate stack for faults taken in the
    faulting thread) goes back to the pool as it ends. Before session 36 only a returning start
    routine gave it back; the others' were found again by a tgkill scan at the next thread's start
    (399 tgkills in this run then, 1 after)."""
    prog = built("build/tests/iotest")
    built("build/lib/libfarmem_preload.so")
    counts = tmp_path / "perf.csv"
    r, s = run(farmem_cmd, tmp_path, [str(prog), "--size", "64M", "--pressure", "128M", "--only", "exits"],
               env_extra={"FARMEM_FAULT": "signal"}, perf_counts=counts)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "iotest: exits ok" in out, out[-3000:]
    assert s["fault_mode"] == "signal" and s["evictions"] > 1000, s
    tgkills = [int(line.split(",")[0]) for line in counts.read_text().splitlines() if "sys_enter_tgkill" in line]
    assert tgkills and tgkills[0] < 20, counts.read_text()


@pytest.mark.parametrize("fault,expect", [("signal", "raw: efault"), ("thread", "raw: ok")])
def test_a_raw_system_call_is_what_the_covers_are_for(built, farmem_cmd, tmp_path, fault, expect):
    """Without a cover (the syscall instruction itself), a system call into an evicted page fails with EFAULT when faults are
    served in the faulting thread (the kernel cannot wait): the hazard the shim covers. With
    handler threads the kernel waits and the call succeeds."""
    prog = built("build/tests/iotest")
    built("build/lib/libfarmem_preload.so")
    r, _ = run(farmem_cmd, tmp_path, [str(prog), "--size", "64M", "--pressure", "128M", "--only", "raw"],
               env_extra={"FARMEM_FAULT": fault})
    assert r.returncode == 0, r.stderr[-3000:]
    assert expect in r.stdout


@pytest.mark.parametrize("fault,capture", [("signal", "1"), ("signal", "0"), ("thread", "1")])
def test_lost_write_race_eight_threads(built, farmem_cmd, tmp_path, fault, capture):
    """8 threads rewrite random pages of a buffer 8x the budget while they evict for each
    other. Write-protecting eviction (fault=thread, and signal without capture): a write that races it waits for memd's acknowledgement,
    then faults the page back. Capturing eviction (fault=signal, uffd/capture.h): a write
    before the drop is in the page the pipe holds, one after it waits the same way. Every byte
    is checked at the end."""
    prog = built("build/bench/rewrite")
    built("build/lib/libfarmem_preload.so")
    r, s = run(farmem_cmd, tmp_path, [str(prog), "--size", "256M", "--threads", "8", "--rounds", "200000",
                                      "--write-pct", "80"],
               env_extra={"FARMEM_FAULT": fault, "FARMEM_EVICT_CAPTURE": capture})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "every byte as expected" in out
    assert s["evictions_dirty"] > 50000, s
    # Where handler threads serve faults every page goes in writable (docs/pager.md): no clean page
    # is opened by a write, and the writes that race eviction wait on its write-protected victims.
    assert s["wp_faults"] == 0 if fault == "thread" else s["wp_faults"] > 1000, s
    if fault == "signal" and capture == "1":
        # Nearly every dirty page left through a capture (a batch with none dirty needs none).
        assert s["evictions_captured"] >= 0.9 * s["evictions_dirty"], s
    else:
        assert s["evictions_captured"] == 0, s
    assert s["peak_resident_bytes"] <= s["local_limit_bytes"], s


def test_the_handler_follows_the_faulting_thread(built, farmem_cmd, tmp_path):
    """fault=thread: one thread rewrites random pages, alone on the machine; the handler moves
    to its CPU at idle priority (uffd/follow.h) and every page is right at the end. Without
    CAP_SYS_NICE (a thread at idle priority could not come back to normal) it stays put."""
    prog = built("build/tests/hogtest")
    built("build/lib/libfarmem_preload.so")
    argv = [str(prog), "--size", "128M", "--hogs", "0", "--seconds", "2"]
    r, s = run(farmem_cmd, tmp_path, argv, env_extra={"FARMEM_FAULT": "thread"})
    assert r.returncode == 0 and "hogtest: OK" in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert s["follows"] >= 1 and s["evictions_dirty"] > 10000, s
    r, s = run(farmem_cmd, tmp_path, ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice",
                                      "--", *argv], env_extra={"FARMEM_FAULT": "thread"})
    assert r.returncode == 0 and "hogtest: OK" in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert s["follows"] == 0, s


def test_a_handler_that_followed_is_not_starved(built, farmem_cmd, tmp_path):
    """The handler followed a thread to its CPU at idle priority, then threads that never
    fault take every CPU: the watch puts the handler back (or it leaves, the machine
    crowded) and no access waits a second for its page (hogtest exits 4 if one does)."""
    prog = built("build/tests/hogtest")
    built("build/lib/libfarmem_preload.so")
    ncpu = len(os.sched_getaffinity(0))
    r, s = run(farmem_cmd, tmp_path, [str(prog), "--size", "128M", "--hogs", str(ncpu), "--hogs-after", "700",
                                      "--seconds", "3", "--max-ms", "1000"], env_extra={"FARMEM_FAULT": "thread"})
    assert r.returncode == 0 and "hogtest: OK" in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert s["follows"] >= 1, s


def test_jvm_keeps_its_own_signal_handlers(jvm_built, build, farmem_cmd, tmp_path):
    """HotSpot turns a SIGBUS on a truncated mapped file into an InternalError and SIGSEGVs
    into NullPointerExceptions and StackOverflowErrors; the pager's SIGBUS handler, installed
    after HotSpot's, must pass those on while it serves the heap's faults."""
    r, s = run(farmem_cmd, tmp_path, ["java", "-Xmx256m", "-cp", str(build / "java"), "SignalMix",
                                      "--live-mb", "160", "--rounds", "4"], local="64M")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = re.search(r"signalmix: ok .*sigbus->InternalError=4 npe=20000 soe=4", out)
    assert m, out[-3000:]
    assert s["fault_mode"] == "signal" and s["remote_reads"] > 10000, s


def test_unknown_fault_mode_is_refused(built, farmem_cmd, tmp_path):
    built("build/lib/libfarmem_preload.so")
    r, _ = run(farmem_cmd, tmp_path, [str(built("build/tests/pagetest")), "--size", "64M"],
               env_extra={"FARMEM_FAULT": "sideways"})
    assert r.returncode == 78, r.stderr
    assert "FARMEM_FAULT" in r.stderr and "sideways" in r.stderr and "auto|signal|thread" in r.stderr


@pytest.mark.parametrize("fault", ["signal", "thread"])
def test_pages_moved_out_by_eviction_survive_compaction(built, farmem_cmd, tmp_path, fault):
    """Eviction that moves dirty pages out (UFFDIO_MOVE, --evict-move 1) while the kernel compacts
    memory. Since Linux 6.18 a move that met a page under migration moves pages past the count it
    returns (uffd/uffd_move.h); taken at its word, the pager left those pages in the stage and read
    them where they had been: under fault=thread a handler faulted on its own region and the program
    hung, under fault=signal this run failed within 2 s. Every page is checked by pagetest."""
    if not os.access("/proc/sys/vm/compact_memory", os.W_OK):
        pytest.skip("compaction is started by writing /proc/sys/vm/compact_memory (root)")
    built("build/lib/libfarmem_preload.so")
    compactor = subprocess.Popen(
        ["bash", "-c", "while :; do echo 1 > /proc/sys/vm/compact_memory; sleep 0.01; done"],
        start_new_session=True)
    try:
        r, s = run(farmem_cmd, tmp_path, [str(built("build/tests/pagetest")), "--size", "256M",
                                          "--rounds", "2", "--threads", "2"],
                   local="48M", env_extra={"FARMEM_FAULT": fault, "FARMEM_EVICT_MOVE": "1"}, timeout=240)
    finally:
        os.killpg(compactor.pid, signal.SIGKILL)
        compactor.wait()
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert s["evictions_moved"] > 10000, s
