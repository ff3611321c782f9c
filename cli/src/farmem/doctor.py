"""`farmem doctor`: what this machine can do, found by trying each feature.

One function per check, registered with @check(name, without): it returns
(available, detail) or (available, detail, data) and may raise; run_check() turns an
exception into an unavailable line carrying the error, so one broken probe never hides
the others. `without` says what farmem does when the feature is missing.

Other commands call require(name) to refuse with one shared wording:
    farmem: <name> is not available here: <detail>. Run `farmem doctor` for details.
"""

import ctypes
import errno
import fcntl
import functools
import os
import platform
import shutil
import struct
import subprocess
from pathlib import Path

from farmem import paths
from farmem.errors import Unavailable


class Result:
    # A plain class: dataclasses imports inspect, 10 ms of every `farmem run`'s start.
    __slots__ = ("name", "available", "detail", "without", "data")

    def __init__(self, name: str, available: bool, detail: str, without: str, data: dict | None = None):
        self.name, self.available, self.detail, self.without = name, available, detail, without
        self.data = {} if data is None else data

    def __repr__(self) -> str:
        return f"Result({self.name!r}, available={self.available}, detail={self.detail!r})"

    def as_json(self) -> dict:
        return {"name": self.name, "available": self.available, "detail": self.detail,
                "without": self.without, "data": self.data}


CHECKS: dict = {}  # name -> (function, without), in the order `farmem doctor` prints them


def check(name: str, without: str):
    def register(fn):
        CHECKS[name] = (fn, without)
        return fn
    return register


def run_check(name: str) -> Result:
    fn, without = CHECKS[name]
    try:
        out = fn()
        available, detail = out[0], out[1]
        data = out[2] if len(out) > 2 else {}
        return Result(name, bool(available), detail, without, data)
    except Exception as e:  # a probe that breaks reports itself, never the whole doctor
        return Result(name, False, f"the check failed: {e.__class__.__name__}: {e}", without)


def run_all() -> list:
    return [run_check(name) for name in CHECKS]


def require(feature: str) -> Result:
    """Return the feature's result, or raise Unavailable with the shared refusal wording."""
    if feature not in CHECKS:
        raise ValueError(f"no doctor check named {feature!r}")
    res = run_check(feature)
    if not res.available:
        raise Unavailable(feature, res.detail)
    return res


# --- system calls -----------------------------------------------------------------------------

_SYSCALLS = {  # (userfaultfd, perf_event_open, bpf, pidfd_open, process_madvise)
    "x86_64": (323, 298, 321, 434, 440),
    "aarch64": (282, 241, 280, 434, 440),
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.restype = ctypes.c_int
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

PAGE = os.sysconf("SC_PAGE_SIZE")


def _nr(which: int) -> int:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise OSError(errno.ENOSYS, f"system call numbers for {machine} are not known")
    return _SYSCALLS[machine][which]


def _oserror(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _syscall(which: int, what: str, *args: int) -> int:
    r = _libc.syscall(ctypes.c_long(_nr(which)), *(ctypes.c_long(a) for a in args))
    if r < 0:
        raise _oserror(what)
    return r


def _ioctl(fd: int, request: int, buf, what: str) -> int:
    r = _libc.ioctl(fd, request, ctypes.addressof(buf))
    if r < 0:
        raise _oserror(what)
    return r


def _addr(buf) -> int:
    return ctypes.addressof(buf)


def _errtext(e: OSError) -> str:
    return e.strerror or str(e)


def _read(path: str) -> str:
    return Path(path).read_text().strip()


# --- userfaultfd ------------------------------------------------------------------------------

USERFAULTFD_IOC_NEW = 0xAA00                     # _IO(0xAA, 0x00), Linux 6.1
UFFDIO_API = 0xC018AA3F                          # _IOWR(0xAA, 0x3F, struct uffdio_api)
UFFDIO_REGISTER = 0xC020AA00                     # _IOWR(0xAA, 0x00, struct uffdio_register)
UFFDIO_UNREGISTER = 0x8010AA01                   # _IOR(0xAA, 0x01, struct uffdio_range)
UFFD_API = 0xAA
UFFD_USER_MODE_ONLY = 1
REGISTER_MISSING, REGISTER_WP, REGISTER_MINOR = 1, 2, 4

UFFD_FEATURES = (  # bit -> name, <linux/userfaultfd.h> through 6.8 (uffd/uffd_compat.h)
    "PAGEFAULT_FLAG_WP", "EVENT_FORK", "EVENT_REMAP", "EVENT_REMOVE", "MISSING_HUGETLBFS",
    "MISSING_SHMEM", "EVENT_UNMAP", "SIGBUS", "THREAD_ID", "MINOR_HUGETLBFS", "MINOR_SHMEM",
    "EXACT_ADDRESS", "WP_HUGETLBFS_SHMEM", "WP_UNPOPULATED", "POISON", "WP_ASYNC", "MOVE",
)
RANGE_IOCTLS = {2: "WAKE", 3: "COPY", 4: "ZEROPAGE", 5: "MOVE", 6: "WRITEPROTECT", 7: "CONTINUE",
                8: "POISON"}
UFFD_METHODS = ("device", "syscall", "user-mode-only")
UFFD_METHOD_TEXT = {
    "device": "/dev/userfaultfd",
    "syscall": "userfaultfd(2)",
    "user-mode-only": "userfaultfd(2) with UFFD_USER_MODE_ONLY",
}


def feature_names(bits: int) -> list:
    names = [name for i, name in enumerate(UFFD_FEATURES) if bits >> i & 1]
    names += [f"bit{i}" for i in range(len(UFFD_FEATURES), 64) if bits >> i & 1]
    return names


def _uffd_open(method: str) -> int:
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    if method == "device":
        try:
            dev = os.open("/dev/userfaultfd", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise OSError(e.errno, f"/dev/userfaultfd: {e.strerror}") from None
        try:
            return fcntl.ioctl(dev, USERFAULTFD_IOC_NEW, flags)
        except OSError as e:
            raise OSError(e.errno, f"/dev/userfaultfd: USERFAULTFD_IOC_NEW: {e.strerror}") from None
        finally:
            os.close(dev)
    if method == "user-mode-only":
        flags |= UFFD_USER_MODE_ONLY
    return _syscall(0, UFFD_METHOD_TEXT[method], flags)


def _uffd_api(ufd: int) -> tuple:
    """UFFDIO_API asking for no feature: the kernel answers with every feature it has."""
    api = (ctypes.c_uint64 * 3)(UFFD_API, 0, 0)
    _ioctl(ufd, UFFDIO_API, api, "UFFDIO_API")
    return api[1], api[2]


def _uffd_register(ufd: int, mode: int, shmem: bool) -> int:
    """Register one fresh page in `mode`; return the range ioctls the kernel allows on it."""
    memfd = os.memfd_create("farmem-doctor", os.MFD_CLOEXEC) if shmem else -1
    try:
        if shmem:
            os.ftruncate(memfd, PAGE)
        flags = 0x01 if shmem else 0x22  # MAP_SHARED, or MAP_PRIVATE | MAP_ANONYMOUS
        addr = _libc.mmap(None, PAGE, 0x3, flags, memfd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise _oserror("mmap")
        try:
            reg = (ctypes.c_uint64 * 4)(addr, PAGE, mode, 0)
            _ioctl(ufd, UFFDIO_REGISTER, reg, "UFFDIO_REGISTER")
            rng = (ctypes.c_uint64 * 2)(addr, PAGE)
            _ioctl(ufd, UFFDIO_UNREGISTER, rng, "UFFDIO_UNREGISTER")
            return reg[3]
        finally:
            _libc.munmap(addr, PAGE)
    finally:
        if memfd >= 0:
            os.close(memfd)


def _ioctl_names(bits: int) -> list:
    return [name for b, name in RANGE_IOCTLS.items() if bits >> b & 1]


@functools.cache
def _uffd_probe() -> dict:
    """Try every way to get a userfaultfd; handshake and register pages with the first that works."""
    out = {"methods": {}, "features": None, "registers": {}}
    for method in UFFD_METHODS:
        try:
            ufd = _uffd_open(method)
        except OSError as e:
            out["methods"][method] = _errtext(e)
            continue
        try:
            features, _ = _uffd_api(ufd)
            out["methods"][method] = None
            if out["features"] is None:
                out["features"] = features
                out["method"] = method
                for label, mode, shmem in (("anon missing+wp", REGISTER_MISSING | REGISTER_WP, False),
                                           ("anon missing", REGISTER_MISSING, False),
                                           ("shmem minor", REGISTER_MINOR, True)):
                    try:
                        out["registers"][label] = _ioctl_names(_uffd_register(ufd, mode, shmem))
                    except OSError as e:
                        out["registers"][label] = _errtext(e)
        except OSError as e:
            out["methods"][method] = _errtext(e)
        finally:
            os.close(ufd)
    return out


def _uffd_feature(bit_name: str, needs_ioctl: tuple = (), register: str = "") -> tuple:
    probe = _uffd_probe()
    if probe["features"] is None:
        return False, "no userfaultfd could be opened (see the userfaultfd line)"
    names = feature_names(probe["features"])
    via = UFFD_METHOD_TEXT[probe["method"]]
    if bit_name not in names:
        return False, f"UFFD_FEATURE_{bit_name} is not offered by this kernel (via {via})"
    if register:
        got = probe["registers"].get(register)
        if isinstance(got, str):
            return False, f"UFFD_FEATURE_{bit_name} offered, but registering {register} failed: {got}"
        missing = [i for i in needs_ioctl if i not in got]
        if missing:
            return False, (f"UFFD_FEATURE_{bit_name} offered, but a {register} range lacks "
                           f"UFFDIO_{', UFFDIO_'.join(missing)}")
        return True, f"UFFD_FEATURE_{bit_name}; {register} range allows UFFDIO_{', UFFDIO_'.join(needs_ioctl)}"
    return True, f"UFFD_FEATURE_{bit_name} (via {via})"


@check("userfaultfd", "farmem run refuses: the pager needs a userfaultfd; only the kswap mode (Linux "
       "swap under a cgroup limit) can work")
def check_userfaultfd():
    """What the pager can use (uffd/uffd_ops.c open_raw): /dev/userfaultfd, else userfaultfd(2),
    else, for fault=signal, userfaultfd(2) with UFFD_USER_MODE_ONLY: with faults served in the
    faulting thread (UFFD_FEATURE_SIGBUS) a system call touching a remote page gets EFAULT from
    either kind of descriptor, so a user without root or /dev/userfaultfd loses nothing there."""
    probe = _uffd_probe()
    data = {"methods": {m: e is None for m, e in probe["methods"].items()},
            "errors": {m: e for m, e in probe["methods"].items() if e is not None}}
    if probe["features"] is None:
        return False, "; ".join(probe["methods"].values()), data
    names = feature_names(probe["features"])
    data.update(method=probe["method"], features=names, features_raw=probe["features"],
                registers=probe["registers"])
    reg = probe["registers"].get("anon missing+wp")
    regtext = f"anon missing+wp range: {' '.join(reg)}" if isinstance(reg, list) else f"register: {reg}"
    if probe["method"] == "user-mode-only":
        if "SIGBUS" not in names:
            return False, (f"only UFFD_USER_MODE_ONLY descriptors here, and no UFFD_FEATURE_SIGBUS "
                           f"({'; '.join(data['errors'].values())})"), data
        return True, (f"only UFFD_USER_MODE_ONLY descriptors here: fault=signal works, fault=thread needs "
                      f"root, /dev/userfaultfd or vm.unprivileged_userfaultfd=1; features: {' '.join(names)}; "
                      f"{regtext}"), data
    return True, f"via {UFFD_METHOD_TEXT[probe['method']]}; features: {' '.join(names)}; {regtext}", data


def uffd_kernel_faults() -> bool:
    """The pager can have a userfaultfd that serves faults taken inside system calls (fault=thread)."""
    return _uffd_probe().get("method") in ("device", "syscall")


@check("userfaultfd-device", "the pager falls back to the userfaultfd(2) system call")
def check_userfaultfd_device():
    err = _uffd_probe()["methods"]["device"]
    if err is None:
        return True, "/dev/userfaultfd opens and USERFAULTFD_IOC_NEW gives a working descriptor"
    return False, err


@check("userfaultfd-syscall", "the pager uses /dev/userfaultfd; with neither, farmem run refuses")
def check_userfaultfd_syscall():
    err = _uffd_probe()["methods"]["syscall"]
    sysctl = _read("/proc/sys/vm/unprivileged_userfaultfd")
    if err is None:
        why = ("vm.unprivileged_userfaultfd=1" if sysctl == "1"
               else f"vm.unprivileged_userfaultfd={sysctl}, allowed because this process has CAP_SYS_PTRACE")
        return True, f"userfaultfd(2) serves user and kernel faults ({why})"
    return False, f"{err} (vm.unprivileged_userfaultfd={sysctl}, no CAP_SYS_PTRACE)"


@check("userfaultfd-user-mode-only", "a user with neither /dev/userfaultfd nor the full system call "
       "cannot run the pager")
def check_userfaultfd_user_mode_only():
    err = _uffd_probe()["methods"]["user-mode-only"]
    if err is None:
        return True, "userfaultfd(2) with UFFD_USER_MODE_ONLY works"
    return False, err


@check("vm.unprivileged_userfaultfd", "users without CAP_SYS_PTRACE need read-write access to "
       "/dev/userfaultfd for fault=thread; fault=signal (the default) takes a user-mode-only descriptor")
def check_unprivileged_userfaultfd():
    value = _read("/proc/sys/vm/unprivileged_userfaultfd")
    if value == "1":
        return True, "1: any user may create a userfaultfd that serves kernel faults", {"value": 1}
    return False, (f"{value}: only CAP_SYS_PTRACE gets full userfaultfd(2); others need "
                   "/dev/userfaultfd or UFFD_USER_MODE_ONLY"), {"value": int(value)}


@check("uffd-wp", "farmem run refuses: eviction write-protects a page before copying it out, "
       "so that no write is lost")
def check_uffd_wp():
    return _uffd_feature("PAGEFAULT_FLAG_WP", ("WRITEPROTECT",), "anon missing+wp")


@check("uffd-sigbus", "faults are served by handler threads (fault=thread): each costs two "
       "cross-CPU wakeups where the faulting thread would have served it on its own CPU")
def check_uffd_sigbus():
    return _uffd_feature("SIGBUS")


@check("process-madvise", "an eviction batch drops its pages with one madvise per run of pages "
       "instead of one process_madvise (and one TLB flush) per batch")
def check_process_madvise():
    import mmap
    libc = _libc
    pidfd = libc.syscall(_nr(3), os.getpid(), 0)
    if pidfd < 0:
        return False, f"pidfd_open: {os.strerror(ctypes.get_errno())}"
    try:
        m = mmap.mmap(-1, 4096)
        m[0] = 1
        buf = ctypes.c_char.from_buffer(m)
        iov = (ctypes.c_uint64 * 2)(ctypes.addressof(buf), 4096)
        del buf
        rc = libc.syscall(_nr(4), pidfd, ctypes.byref(iov), 1, 4, 0)  # MADV_DONTNEED
        err = ctypes.get_errno()
        m.close()
    finally:
        os.close(pidfd)
    if rc != 4096:
        return False, f"process_madvise(MADV_DONTNEED) on ourselves: {os.strerror(err)} (Linux 6.13+ allows it)"
    return True, "process_madvise(MADV_DONTNEED) on ourselves works"


@check("uffd-minor-shmem", "a shared-memory Java heap (-XX:AllocateHeapAt=/dev/shm) cannot be "
       "paged; an anonymous heap still can")
def check_uffd_minor_shmem():
    return _uffd_feature("MINOR_SHMEM", ("CONTINUE",), "shmem minor")


@check("uffd-move", "libswapva moves pages with /dev/swapva if loaded, else with memmove")
def check_uffd_move():
    return _uffd_feature("MOVE", ("MOVE",), "anon missing")


@check("uffd-wp-async", "the kswap mode reads written-page state from /proc/PID/pagemap "
       "instead of asynchronous write-protection (slower scans)")
def check_uffd_wp_async():
    return _uffd_feature("WP_ASYNC")


@check("uffd-thread-id", "prefetch detects runs per address stream instead of per faulting thread")
def check_uffd_thread_id():
    return _uffd_feature("THREAD_ID")


@check("uffd-events", "the preload shim learns of munmap/mremap/madvise only through its own "
       "wrappers, not from the kernel")
def check_uffd_events():
    wanted = ("EVENT_REMOVE", "EVENT_UNMAP", "EVENT_REMAP")
    results = [_uffd_feature(name) for name in wanted]
    if all(ok for ok, _ in results):
        return True, "UFFD_FEATURE_" + ", UFFD_FEATURE_".join(wanted)
    return False, "; ".join(text for ok, text in results if not ok)


# --- PAGEMAP_SCAN -----------------------------------------------------------------------------

PAGEMAP_SCAN = 0xC0606610  # _IOWR('f', 16, struct pm_scan_arg), Linux 6.7
PAGE_IS_PRESENT = 1 << 3


@check("pagemap-scan", "the kswap mode fills its residency map by reading /proc/PID/pagemap "
       "page by page (slower)")
def check_pagemap_scan():
    addr = _libc.mmap(None, 4 * PAGE, 0x3, 0x22, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise _oserror("mmap")
    try:
        ctypes.memset(addr + PAGE, 1, 1)  # touch page 1 only
        vec = (ctypes.c_uint64 * 12)()     # 4 struct page_region
        arg = (ctypes.c_uint64 * 12)(96, 0, addr, addr + 4 * PAGE, 0, _addr(vec), 4, 0,
                                     0, 0, PAGE_IS_PRESENT, PAGE_IS_PRESENT)
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            n = _ioctl(fd, PAGEMAP_SCAN, arg, "ioctl(PAGEMAP_SCAN)")
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.EINVAL):
                return False, f"/proc/self/pagemap: {_errtext(e)} (PAGEMAP_SCAN needs Linux 6.7)"
            raise
        finally:
            os.close(fd)
        found = [(vec[3 * i] - addr) // PAGE for i in range(n)]
        if found != [1]:
            return False, f"PAGEMAP_SCAN answered, but reported present pages {found} instead of [1]"
        return True, "ioctl(PAGEMAP_SCAN) on /proc/self/pagemap found the one touched page"
    finally:
        _libc.munmap(addr, 4 * PAGE)


# --- eBPF -----------------------------------------------------------------------------------------

BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 5, 17
PROG_SOCKET_FILTER, PROG_KPROBE, PROG_PERF_EVENT, PROG_RAW_TRACEPOINT, PROG_TRACING = 1, 2, 7, 17, 26
TRACE_RAW_TP, TRACE_FENTRY = 23, 24
# r0 = 0; exit
TRIVIAL_PROG = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)
TRACEPOINT = "sched_switch"
FENTRY_CANDIDATES = ("vfs_read", "do_sys_openat2", "__x64_sys_getpid")
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0


def _bpf(cmd: int, attr: bytearray, what: str) -> int:
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    return _syscall(2, what, cmd, _addr(buf), len(attr))


def _prog_load(prog_type: int, attach_type: int = 0, btf_id: int = 0, what: str = "") -> int:
    insns = ctypes.create_string_buffer(TRIVIAL_PROG, len(TRIVIAL_PROG))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = bytearray(128)
    struct.pack_into("<IIQQ", attr, 0, prog_type, len(TRIVIAL_PROG) // 8, _addr(insns), _addr(license_))
    struct.pack_into("<16s", attr, 48, b"farmem_doctor")
    struct.pack_into("<I", attr, 68, attach_type)
    struct.pack_into("<I", attr, 108, btf_id)
    return _bpf(BPF_PROG_LOAD, attr, what or "bpf(BPF_PROG_LOAD)")


def _raw_tp_open(prog_fd: int, name: str | None) -> int:
    name_buf = ctypes.create_string_buffer(name.encode()) if name else None
    attr = bytearray(16)
    struct.pack_into("<QI", attr, 0, _addr(name_buf) if name_buf else 0, prog_fd)
    return _bpf(BPF_RAW_TRACEPOINT_OPEN, attr, "bpf(BPF_RAW_TRACEPOINT_OPEN)")


def _close(*fds: int) -> None:
    for fd in fds:
        if fd is not None and fd >= 0:
            os.close(fd)


BTF_KIND_TYPEDEF, BTF_KIND_FUNC = 8, 12
_BTF_EXTRA = {1: lambda v: 4, 3: lambda v: 12, 4: lambda v: 12 * v, 5: lambda v: 12 * v,
              6: lambda v: 8 * v, 13: lambda v: 8 * v, 14: lambda v: 4, 15: lambda v: 12 * v,
              17: lambda v: 4, 19: lambda v: 12 * v}
_BTF_NO_EXTRA = {2, 7, 8, 9, 10, 11, 12, 16, 18}


@functools.cache
def _btf_ids(wanted: tuple) -> dict:
    """Type ids in the kernel's BTF of (kind, name) pairs; absent ones are left out."""
    data = Path("/sys/kernel/btf/vmlinux").read_bytes()
    magic, _, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data, 0)
    if magic != 0xEB9F:
        raise ValueError(f"/sys/kernel/btf/vmlinux: bad magic {magic:#x}")
    strings = data[hdr_len + str_off:hdr_len + str_off + str_len]
    targets = {}
    for kind, name in wanted:
        at = strings.find(b"\0" + name.encode() + b"\0")
        if at >= 0:
            targets[(kind, at + 1)] = (kind, name)
    found = {}
    pos, end, tid = hdr_len + type_off, hdr_len + type_off + type_len, 1
    while pos < end and len(found) < len(targets):
        name_off, info = struct.unpack_from("<II", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        key = (kind, name_off)
        if key in targets:
            found[targets[key]] = tid
        if kind in _BTF_NO_EXTRA:
            pos += 12
        elif kind in _BTF_EXTRA:
            pos += 12 + _BTF_EXTRA[kind](vlen)
        else:
            raise ValueError(f"/sys/kernel/btf/vmlinux: unknown BTF kind {kind} (type {tid})")
        tid += 1
    return found


def _unpriv_bpf() -> str:
    try:
        return f"kernel.unprivileged_bpf_disabled={_read('/proc/sys/kernel/unprivileged_bpf_disabled')}"
    except OSError:
        return "kernel.unprivileged_bpf_disabled unreadable"


@check("bpf", "farmem-trace refuses; farmem top and stat show the residency-map figures only")
def check_bpf():
    try:
        fd = _prog_load(PROG_SOCKET_FILTER)
    except OSError as e:
        return False, f"{_errtext(e)} ({_unpriv_bpf()})"
    _close(fd)
    return True, f"bpf(BPF_PROG_LOAD) of a socket filter works ({_unpriv_bpf()})"


@check("bpf-btf", "farmem-trace refuses: its programs are CO-RE and need the kernel's BTF")
def check_bpf_btf():
    ids = _btf_ids(((BTF_KIND_TYPEDEF, f"btf_trace_{TRACEPOINT}"),))
    if not ids:
        return False, f"/sys/kernel/btf/vmlinux parsed but has no btf_trace_{TRACEPOINT}"
    return True, f"/sys/kernel/btf/vmlinux parsed (btf_trace_{TRACEPOINT} is type {next(iter(ids.values()))})"


@check("bpf-tracepoint", "farmem-trace refuses: its probes are tracepoints (tp_btf, else raw_tp)")
def check_bpf_tracepoint():
    results, data = [], {}
    # raw_tp: by tracepoint name, no tracefs or BTF needed.
    prog = link = -1
    try:
        prog = _prog_load(PROG_RAW_TRACEPOINT)
        link = _raw_tp_open(prog, TRACEPOINT)
        data["raw_tp"] = True
        results.append(f"raw_tp/{TRACEPOINT} attached")
    except OSError as e:
        data["raw_tp"] = False
        results.append(f"raw_tp/{TRACEPOINT}: {_errtext(e)}")
    finally:
        _close(link, prog)
    # tp_btf: a tracing program typed by the tracepoint's BTF.
    prog = link = -1
    try:
        key = (BTF_KIND_TYPEDEF, f"btf_trace_{TRACEPOINT}")
        btf_id = _btf_ids((key,)).get(key)
        if btf_id is None:
            raise OSError(errno.ENOENT, f"no {key[1]} in the kernel's BTF")
        prog = _prog_load(PROG_TRACING, TRACE_RAW_TP, btf_id)
        link = _raw_tp_open(prog, None)
        data["tp_btf"] = True
        results.append(f"tp_btf/{TRACEPOINT} attached")
    except (OSError, ValueError) as e:
        data["tp_btf"] = False
        results.append(f"tp_btf/{TRACEPOINT}: {_errtext(e) if isinstance(e, OSError) else e}")
    finally:
        _close(link, prog)
    return data["raw_tp"] or data["tp_btf"], "; ".join(results), data


def _perf_event_open(ptype: int, config: int = 0, config1: int = 0, config2: int = 0,
                     period: int = 0, flags: int = 1, pid: int = 0, cpu: int = -1) -> int:
    attr = bytearray(128)
    struct.pack_into("<IIQQ", attr, 0, ptype, len(attr), config, period)
    struct.pack_into("<Q", attr, 40, flags)  # bit 0: disabled
    struct.pack_into("<QQ", attr, 56, config1, config2)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    return _syscall(1, "perf_event_open()", _addr(buf), pid, cpu, -1, 0x8)  # PERF_FLAG_FD_CLOEXEC


def _attach_to_perf_event(prog_type: int, open_event) -> str | None:
    """Load a trivial program and attach it to a new perf event: None, or what failed."""
    prog = ev = -1
    try:
        prog = _prog_load(prog_type)
        ev = open_event()
        try:
            fcntl.ioctl(ev, PERF_EVENT_IOC_SET_BPF, prog)
        except OSError as e:
            raise OSError(e.errno, f"PERF_EVENT_IOC_SET_BPF: {e.strerror}") from None
        return None
    except OSError as e:
        return _errtext(e)
    finally:
        _close(ev, prog)


@check("bpf-perf-event", "no sampling of the pager's CPU time in farmem-trace")
def check_bpf_perf_event():
    # disabled | exclude_kernel | exclude_hv: what perf_event_paranoid=2 still allows a user
    err = _attach_to_perf_event(PROG_PERF_EVENT, lambda: _perf_event_open(
        PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, period=10_000_000, flags=1 | 1 << 5 | 1 << 6))
    if err:
        return False, f"cpu-clock sampling event: {err} ({_unpriv_bpf()})"
    return True, "a perf-event program attached to a cpu-clock sampling event"


def _pmu_type(name: str) -> int | None:
    try:
        return int(_read(f"/sys/bus/event_source/devices/{name}/type"))
    except FileNotFoundError:
        return None


def _elf_entry_offset(path: str) -> int:
    """File offset of an ELF's entry point: a valid place for a uprobe."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise ValueError(f"{path} is not a 64-bit ELF file")
        entry, phoff = struct.unpack_from("<QQ", head, 24)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == 1 and p_vaddr <= entry < p_vaddr + p_filesz:
            return entry - p_vaddr + p_offset
    raise ValueError(f"{path}: entry point outside every loadable segment")


@check("uprobes", "no USDT probes in the JVM for farmem-trace; GC phases come from JVMTI events")
def check_uprobes():
    pmu = _pmu_type("uprobe")
    if pmu is None:
        return False, "no uprobe PMU in /sys/bus/event_source/devices (CONFIG_UPROBE_EVENTS off)"
    exe = os.path.realpath("/proc/self/exe")
    path = ctypes.create_string_buffer(exe.encode())
    offset = _elf_entry_offset(exe)
    err = _attach_to_perf_event(PROG_KPROBE, lambda: _perf_event_open(
        pmu, config1=_addr(path), config2=offset, pid=-1, cpu=0))
    if err:
        return False, f"uprobe on {exe}+{offset:#x}: {err}"
    return True, f"a uprobe on {exe}+{offset:#x} took a BPF program"


def _tracefs_file(name: str) -> str | None:
    for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.exists(f"{root}/{name}"):
            return f"{root}/{name}"
    return None


@check("kprobes", "nothing: farmem's eBPF side uses tracepoints and perf events only")
def check_kprobes():
    pmu = _pmu_type("kprobe")
    events = _tracefs_file("kprobe_events")
    if pmu is None and events is None:
        return False, ("no kprobe PMU in /sys/bus/event_source/devices and no kprobe_events in "
                       "tracefs (kernel built without CONFIG_KPROBE_EVENTS)")
    if pmu is None:
        return True, f"{events} exists (no kprobe PMU for BPF links)"
    sym = ctypes.create_string_buffer(FENTRY_CANDIDATES[0].encode())
    err = _attach_to_perf_event(PROG_KPROBE, lambda: _perf_event_open(pmu, config1=_addr(sym), pid=-1, cpu=0))
    if err:
        return False, f"kprobe on {FENTRY_CANDIDATES[0]}: {err}"
    return True, f"a kprobe on {FENTRY_CANDIDATES[0]} took a BPF program"


@check("fentry", "nothing: farmem-trace attaches with tp_btf or raw_tp")
def check_fentry():
    keys = tuple((BTF_KIND_FUNC, name) for name in FENTRY_CANDIDATES)
    ids = _btf_ids(keys)
    target = next((k for k in keys if k in ids), None)
    if target is None:
        return False, f"none of {', '.join(FENTRY_CANDIDATES)} is in the kernel's BTF"
    prog = link = -1
    try:
        prog = _prog_load(PROG_TRACING, TRACE_FENTRY, ids[target])
        link = _raw_tp_open(prog, None)
    except OSError as e:
        stage = "load" if prog < 0 else "attach"
        return False, f"fentry/{target[1]}: {stage} failed: {_errtext(e)}"
    finally:
        _close(link, prog)
    return True, f"fentry/{target[1]} loaded and attached"


# --- kernel module, RDMA, cgroups, swap -------------------------------------------------------------

@check("swapva", "libswapva uses UFFDIO_MOVE (Linux 6.8+), else memmove; the module itself is "
       "tested in the qemu lane (tests/vm/)")
def check_swapva():
    try:
        fd = os.open("/dev/swapva", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        loaded = os.path.exists("/sys/module/swapva")
        return False, "no /dev/swapva" + (" (module loaded, device missing)" if loaded
                                          else " (module swapva not loaded)")
    except OSError as e:
        return False, f"/dev/swapva: {_errtext(e)}"
    os.close(fd)
    return True, "/dev/swapva opens"


@check("rdma", "memd clients use TCP or the shared-memory transport")
def check_rdma():
    root = Path("/sys/class/infiniband")
    devices = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if not devices:
        return False, "no RDMA device in /sys/class/infiniband", {"devices": []}
    return True, "RDMA devices: " + ", ".join(devices), {"devices": devices}


def _mounts() -> list:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4:
            out.append((fields[1], fields[2], fields[3].split(",")))
    return out


@check("cgroup-memory", "the kswap mode and the Linux-swap baseline of farmem bench refuse: "
       "they need a memory cgroup to set the local budget")
def check_cgroup():
    mounts = _mounts()
    v1 = next((mp for mp, fs, opts in mounts if fs == "cgroup" and "memory" in opts), None)
    v2 = next((mp for mp, fs, _ in mounts if fs == "cgroup2"), None)
    v2_memory = bool(v2) and "memory" in _read(f"{v2}/cgroup.controllers").split()
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    data = {"v1_memory": v1, "v2": v2, "v2_memory": v2_memory}
    parts = []
    if v1:
        path = next((p for c, p in own.items() if "memory" in c.split(",")), "/")
        data["writable"] = os.access(v1 + path, os.W_OK)
        parts.append(f"cgroup v1 memory controller at {v1} (this process in {path}"
                     f"{', writable' if data['writable'] else ', not writable'})")
    if v2:
        parts.append(f"cgroup v2 at {v2} " + ("with" if v2_memory else "without") + " the memory controller")
        if v2_memory:
            path = own.get("", "/")
            data.setdefault("writable", os.access(v2 + path, os.W_OK))
    if not parts:
        return False, "no cgroup file system mounted", data
    data["version"] = 2 if v2_memory else 1 if v1 else None
    if not (v1 or v2_memory):
        return False, "; ".join(parts) + "; no memory controller", data
    if not data["writable"]:
        return False, "; ".join(parts) + "; this user cannot create a cgroup there", data
    return True, "; ".join(parts), data


@check("swap", "the kswap mode needs swap; farmem bench sets up its own zram swap for the baseline")
def check_swap():
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    devices = [line.split()[0] for line in lines if line.strip()]
    if not devices:
        return False, "no swap device in /proc/swaps", {"devices": []}
    return True, "swap on " + ", ".join(devices), {"devices": devices}


@check("zram", "farmem bench cannot build its zram swap baseline (modprobe zram)")
def check_zram():
    if os.path.isdir("/sys/class/zram-control"):
        devices = sorted(p.name for p in Path("/sys/block").glob("zram*"))
        return True, "zram loaded (/sys/class/zram-control)" + (
            f"; devices: {', '.join(devices)}" if devices else "; no device yet")
    return False, "no /sys/class/zram-control (zram module not loaded)"


CPUIDLE = "/sys/devices/system/cpu/cpuidle/current_driver"
HALT_POLL = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"


@check("idle-polling", "a fault served by a handler thread (glibc's heaps, fault=thread) or by a memd "
       "over a socket wakes a thread on a CPU that halted: an IPI and, in a VM, an exit to the host "
       "each time (sqlite's heap at 52 MiB local: 8.7 s against 6.2 s with halt polling, "
       "bench/RESULTS.md); faults served in the faulting thread do not pay it")
def check_idle_polling():
    """Whether an idle CPU polls before it halts, so that a wakeup sent to it is cheap: a VM's
    cpuidle-haltpoll driver with its window above 0 (the kernel's default is 200 us), or bare
    metal, whose idle CPUs wake from mwait without an exit. Root can open the window with
    `echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns`."""
    try:
        driver = _read(CPUIDLE)
    except OSError:
        driver = "none"
    in_vm = " hypervisor" in _read("/proc/cpuinfo")
    data = {"cpuidle_driver": driver, "in_vm": in_vm}
    if driver == "haltpoll":
        ns = int(_read(HALT_POLL))
        data["guest_halt_poll_ns"] = ns
        if ns > 0:
            return True, f"cpuidle haltpoll: an idle vCPU polls up to {ns} ns before it halts", data
        return False, (f"cpuidle haltpoll with guest_halt_poll_ns 0: an idle vCPU halts at once "
                       f"(echo 200000 > {HALT_POLL} opens the kernel's default window)"), data
    if not in_vm:
        return True, f"bare metal (cpuidle driver {driver}): an idle CPU wakes without a VM exit", data
    return False, (f"a VM whose idle vCPUs halt (cpuidle driver {driver}): the cpuidle-haltpoll "
                   "driver (modprobe cpuidle-haltpoll force=1) polls first"), data


CAP_SYS_NICE = 23


@check("handler-follow", "a fault served by a handler thread (glibc's heaps, fault=thread) passes between "
       "two CPUs: the handler cannot wait beside the faulting thread at idle priority (fill_follow), "
       "since the kernel lets a thread back from SCHED_IDLE only with CAP_SYS_NICE or an RLIMIT_NICE of 20 "
       "(fault=thread's random rewrite 3.3 s against 2.4 s, bench/RESULTS.md)")
def check_handler_follow():
    """Whether this user's programs can have the handler follow (uffd/follow.h): more than one
    CPU, and a way back from SCHED_IDLE."""
    import resource
    cpus = len(os.sched_getaffinity(0))
    nice = resource.getrlimit(resource.RLIMIT_NICE)[0]
    cap = next((int(line.split()[1], 16) for line in _read("/proc/self/status").splitlines()
                if line.startswith("CapEff:")), 0)
    data = {"cpus": cpus, "rlimit_nice": nice, "cap_sys_nice": bool(cap >> CAP_SYS_NICE & 1)}
    if cpus < 2:
        return False, "one CPU: nothing to follow across", data
    if data["cap_sys_nice"]:
        return True, "CAP_SYS_NICE: the handler may go to SCHED_IDLE and back", data
    if nice == resource.RLIM_INFINITY or nice >= 20:
        return True, f"RLIMIT_NICE {nice}: the handler may go to SCHED_IDLE and back", data
    return False, (f"no CAP_SYS_NICE and RLIMIT_NICE {nice} (below 20): a handler at SCHED_IDLE could not "
                   "come back, so it does not follow"), data


# --- farmem's own build, the JVM ------------------------------------------------------------------

def _elf_type(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(18)
    if head[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    return struct.unpack_from("<H", head, 16)[0]


@check("farmem-memd", "farmem run without --memd and farmem memd refuse: run `make`")
def check_memd_binary():
    path = paths.memd_binary()
    if not path.exists():
        return False, f"{path} is missing (run `make`)"
    if not os.access(path, os.X_OK):
        return False, f"{path} is not executable"
    _elf_type(path)
    return True, str(path)


@check("farmem-preload", "farmem run refuses: run `make`")
def check_preload():
    path = paths.preload_lib()
    if not path.exists():
        return False, f"{path} is missing (run `make`)"
    if _elf_type(path) != 3:  # ET_DYN
        return False, f"{path} is not a shared object"
    return True, str(path)


@check("farmem-trace", "farmem top shows the residency maps only, farmem trace refuses, and kswap mode "
       "follows pagemap scans only: run `make` (and see the bpf lines)")
def check_trace_binary():
    """Built, and whether this machine lets it run: its probes need the bpf, bpf-btf and
    bpf-tracepoint lines (not a load of its own: that takes seconds)."""
    from farmem.tracer import trace_binary
    path = trace_binary()
    if not path.exists():
        return False, f"{path} is not built (run `make`)"
    if not os.access(path, os.X_OK) or _elf_type(path) not in (2, 3):  # ET_EXEC, ET_DYN (PIE)
        return False, f"{path} is not an executable"
    missing = [(n, r.detail) for n, r in ((n, run_check(n)) for n in ("bpf", "bpf-btf", "bpf-tracepoint"))
               if not r.available]
    if missing:
        return False, f"{path} is built but cannot run here: {missing[0][0]}: {missing[0][1]}"
    return True, f"{path}; eBPF tracepoints work here"


@check("farmem-agent", "farmem run -- java and farmem attach refuse: run `make` (and see the java line)")
def check_agent_lib():
    """Built (an ELF shared object that exports Agent_OnLoad), and whether a JVM is here to load it."""
    from farmem.java import agent_lib
    path = agent_lib()
    if not path.exists():
        return False, f"{path} is not built (run `make`)"
    if _elf_type(path) != 3 or b"Agent_OnLoad" not in path.read_bytes():
        return False, f"{path} is not a JVMTI agent (no Agent_OnLoad)"
    java = run_check("java")
    if not java.available:
        return False, f"{path} is built but no JVM can load it here: {java.detail}"
    return True, f"{path}; loads into {java.detail}"


def _tool(argv: list) -> tuple:
    exe = shutil.which(argv[0])
    if exe is None:
        return None, f"{argv[0]} is not on PATH"
    proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    first = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[:1]
    return proc.returncode, (first[0] if first else f"{exe}: no output")


@check("java", "farmem run still pages native programs; the JVM agent and the patched "
       "collector need a JDK 17")
def check_java():
    rc, line = _tool(["java", "-version"])
    if rc != 0:
        return False, line if rc is None else f"java -version exited {rc}: {line}"
    return True, line, {"version": line}


@check("jcmd", "farmem attach cannot find a running JVM's heap (jcmd comes with the JDK)")
def check_jcmd():
    rc, line = _tool(["jcmd", "-h"])
    if rc != 0:
        return False, line if rc is None else f"jcmd -h exited {rc}: {line}"
    return True, shutil.which("jcmd")
