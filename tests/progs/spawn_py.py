# SPDX-License-Identifier: Apache-2.0
"""Python starting programs while it holds a big paged buffer (issue 19, tests/test_spawn.py).
Run under `farmem run --local` well below --mib:

    python spawn_py.py [--mib 256] [--times 3] [METHOD...]

METHOD is any of subprocess (subprocess.run as people call it: _posixsubprocess, which uses vfork
in Python 3.10+ when it can), subprocess_posix_spawn (close_fds=False: subprocess takes
os.posix_spawn), os_system, os_posix_spawn, and subprocess_preexec (a preexec_fn: a real fork,
the contrast). Default: all of them. The buffer is a bytearray (one big malloc block, which the
shim maps and pages) with a pattern in every page; every child runs /bin/false (exit status 1
says it ran) and after each method every page is checked.

The program reads its own pager's counters (the residency map, farmem.resmap) around each spawn
and prints per method one line of JSON: the increase of forks, fork_pages_fetched,
forks_without_paged and remote_reads over its spawns, and the most pages any spawn found
resident. Then "spawn_py: METHOD ok"; "spawn_py: all ok" at the end.
"""

import ctypes
import json
import os
import struct
import subprocess
import sys
import time

from farmem import procmap, resmap

PG = 4096
CHILD = "/bin/false"
COUNTERS = ("forks", "fork_pages_fetched", "forks_without_paged", "remote_reads")


def page(i: int) -> bytes:
    # Never all zeros (a page read back as zeros fails), different in every page.
    return struct.pack("<QQ", i + 1, (i * 0x9E3779B97F4A7C15) & (2**64 - 1)) * (PG // 16)


def check(buf: bytearray, npages: int) -> int:
    mv = memoryview(buf)
    return sum(mv[i * PG:(i + 1) * PG] != page(i) for i in range(npages))


def stats_reader():
    """A function returning this process's pager counters now. Read with pread, not mmap: a
    mapping made here would go through the shim's mmap hook."""
    paths = procmap.find_maps(os.getpid())
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        hdr = resmap.ResmapHdr.from_buffer_copy(os.pread(fd, ctypes.sizeof(resmap.ResmapHdr), 0))
        if hdr.magic == resmap.MAGIC and hdr.pid == os.getpid():
            def read():
                return resmap.ResmapHdr.from_buffer_copy(os.pread(fd, ctypes.sizeof(resmap.ResmapHdr), 0)).stats
            return read
        os.close(fd)
    sys.exit(f"spawn_py: no residency map of pid {os.getpid()} (not under farmem run? found {paths})")


def settle(read) -> None:
    """Until the pager is back at its budget (at most 10 s): every spawn finds the buffer mostly in
    memd, as a program's would be."""
    for _ in range(1000):
        st = read()
        if st.resident_pages <= st.local_limit_pages + 256:
            return
        time.sleep(0.01)


def spawn(method: str) -> int:
    """Start /bin/false by method and wait; its exit status."""
    if method == "subprocess":
        return subprocess.run([CHILD]).returncode
    if method == "subprocess_posix_spawn":
        return subprocess.run([CHILD], close_fds=False).returncode
    if method == "subprocess_preexec":
        return subprocess.run([CHILD], preexec_fn=lambda: None).returncode
    if method == "os_system":
        return os.waitstatus_to_exitcode(os.system(CHILD))
    if method == "os_posix_spawn":
        pid = os.posix_spawn(CHILD, [CHILD], os.environ)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    sys.exit(f"spawn_py: no method {method}")


METHODS = ("subprocess", "subprocess_posix_spawn", "os_system", "os_posix_spawn", "subprocess_preexec")


def main() -> None:
    args = sys.argv[1:]
    mib, times = 256, 3
    while args and args[0].startswith("--"):
        opt, val = args[0], int(args[1])
        args = args[2:]
        if opt == "--mib":
            mib = val
        elif opt == "--times":
            times = val
        else:
            sys.exit(f"spawn_py: unknown option {opt}")
    npages = (mib << 20) // PG
    buf = bytearray(npages * PG)
    for i in range(npages):
        buf[i * PG:(i + 1) * PG] = page(i)
    read = stats_reader()
    print(f"spawn_py: {npages} pages, python {sys.version.split()[0]}", flush=True)
    for method in args or METHODS:
        got = dict.fromkeys(COUNTERS, 0)
        got["resident_before"] = 0
        for _ in range(times):
            settle(read)
            before = read()
            got["resident_before"] = max(got["resident_before"], before.resident_pages)
            rc = spawn(method)
            after = read()
            if rc != 1:
                print(f"spawn_py: {method} FAILED: child exit status {rc}, want 1", flush=True)
                sys.exit(1)
            for k in COUNTERS:
                got[k] += getattr(after, k) - getattr(before, k)
        print(json.dumps({"method": method, "spawns": times, **got}), flush=True)
        bad = check(buf, npages)
        if bad:
            print(f"spawn_py: {method} FAILED: {bad} pages of the buffer wrong after it", flush=True)
            sys.exit(1)
        print(f"spawn_py: {method} ok", flush=True)
    print("spawn_py: all ok", flush=True)


if __name__ == "__main__":
    main()
