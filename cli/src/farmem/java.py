"""`farmem run -- java ...`: recognise a Java command and put its heap under the JVMTI agent.

The shim pages malloc and mmap; a JVM's memory that matters is its heap, which the agent
(build/lib/libfarmem_agent.so, jvmti-agent/) finds and registers itself. So for a java
command `farmem run` does not LD_PRELOAD the shim; it adds
`-agentpath:<build>/lib/libfarmem_agent.so=memd=...,local=...,control=...` and passes the
secret in $FARMEM_SECRET, so that it never shows on a command line. docs/jvm.md is the
user's side of this.
"""

import os
import re
import subprocess
import sys

from farmem import knobs, paths
from farmem import gcmode
from farmem.errors import FarmemError
from farmem.units import fmt_bytes

AGENT_NAME = "libfarmem_agent.so"

# Launcher options that take their value as the next argument (java --help, JDK 17).
_WITH_VALUE = {"-cp", "-classpath", "--class-path", "-p", "--module-path", "--upgrade-module-path",
               "--add-modules", "--limit-modules", "--add-reads", "--add-exports", "--add-opens",
               "--patch-module", "--enable-native-access", "--source", "--describe-module", "-d"}
_SIZE_RE = re.compile(r"([0-9]+)([kKmMgGtT]?)")
_UNSUPPORTED_GCS = {"UseZGC": "ZGC"}


def agent_lib():
    return paths.build_dir() / "lib" / AGENT_NAME


def is_java(cmd: list) -> bool:
    """`java`, or a path to any JDK's bin/java."""
    return bool(cmd) and os.path.basename(cmd[0]) == "java"


def java_size(text: str) -> int | None:
    """-Xmx512m, -XX:MaxHeapSize=1g: HotSpot's units (k, m, g, t; powers of 1024)."""
    m = _SIZE_RE.fullmatch(text)
    if not m:
        return None
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]


def _unescape_mount(text: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def fs_type(path: str) -> str | None:
    """The file system type of the mount that holds directory path (per /proc/self/mountinfo),
    or None when it is not a directory."""
    if not os.path.isdir(path):
        return None
    real = os.path.realpath(path)
    best, best_type = "", "unknown"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mount_point = _unescape_mount(left.split()[4])
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best):
                best, best_type = mount_point, right.split()[0]
    return best_type


class JvmArgs:
    # A plain class: every `farmem run` imports this module, and dataclasses costs it 7 ms.
    def __init__(self):
        self.xmx: int | None = None
        self.xms: int | None = None
        self.xmx_text = ""
        self.gc_flags: dict = {}  # UseXGC -> bool
        self.allocate_heap_at: str | None = None
        self.large_pages = False

    def is_g1(self) -> bool:
        """G1: the default, unless another collector is chosen or G1 is turned off."""
        return not any(v for k, v in self.gc_flags.items() if k != "UseG1GC") and self.gc_flags.get("UseG1GC") is not False


def scan(jvm_opts: list) -> JvmArgs:
    """The heap and GC options among the JVM's options (the last one wins, as in HotSpot)."""
    a = JvmArgs()
    for opt in jvm_opts:
        if opt.startswith("-Xmx") and java_size(opt[4:]) is not None:
            a.xmx, a.xmx_text = java_size(opt[4:]), opt[4:]
        elif opt.startswith("-XX:MaxHeapSize=") and java_size(opt[16:]) is not None:
            a.xmx, a.xmx_text = java_size(opt[16:]), opt[16:]
        elif opt.startswith("-Xms") and java_size(opt[4:]) is not None:
            a.xms = java_size(opt[4:])
        elif opt.startswith("-XX:InitialHeapSize=") and java_size(opt[20:]) is not None:
            a.xms = java_size(opt[20:])
        elif opt.startswith("-XX:AllocateHeapAt="):
            a.allocate_heap_at = opt[19:] or None
        elif re.fullmatch(r"-XX:[+-]Use[A-Za-z0-9]+GC", opt):
            a.gc_flags[opt[5:]] = opt[4] == "+"
        elif re.fullmatch(r"-XX:[+-]UseLargePages", opt):
            a.large_pages = opt[4] == "+"
    return a


def split_jvm_options(argv: list) -> int:
    """Index in argv (argv[0] is java) of the first argument that is not a JVM option."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-jar", "-m", "--module") or not arg.startswith("-"):
            return i
        if arg in _WITH_VALUE:
            i += 1
        i += 1
    return i


def collector(cmd: list) -> str:
    """The collector the java command line (with $JAVA_TOOL_OPTIONS and $JDK_JAVA_OPTIONS) runs: "G1",
    "Shenandoah", or another's flag name."""
    env_opts = (os.environ.get("JAVA_TOOL_OPTIONS", "") + " " + os.environ.get("JDK_JAVA_OPTIONS", "")).split()
    jvm = scan(env_opts + list(cmd[1:split_jvm_options(cmd)]))
    if jvm.is_g1():
        return "G1"
    chosen = [k for k, v in jvm.gc_flags.items() if v and k != "UseG1GC"]
    return "Shenandoah" if chosen[-1:] == ["UseShenandoahGC"] else (chosen[-1] if chosen else "none")


def java_size_text(n: int) -> str:
    """A byte count as java writes it: 6g, 512m, 4k or bytes."""
    for unit, shift in (("g", 30), ("m", 20), ("k", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def hotspot_choices(argv: list, end: int) -> dict | None:
    """What HotSpot picks for this java command by itself where its options leave it free: the
    maximum heap ("MaxHeapSize", a share of the machine's or the container's memory) and the
    collector ("gc", e.g. "UseG1GC"; Serial on a machine or container with one CPU or less than
    1792 MiB), asked of the JVM itself with only the options that decide them."""
    opts = [o for o in argv[1:end] if re.fullmatch(r"-XX:[+-]?\w*RAM\w*(=.*)?|-XX:[+-]Use\w+GC", o)]
    try:
        r = subprocess.run([argv[0], *opts, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"^\s*size_t MaxHeapSize\s+=\s+(\d+)", r.stdout, re.M)
    gcs = re.findall(r"^\s*bool (Use(?:G1|Parallel|Serial|Z|Shenandoah|Epsilon)GC)\s+=\s+true\b", r.stdout, re.M)
    if r.returncode != 0 or not m:
        return None
    return {"MaxHeapSize": int(m.group(1)), "gc": gcs[0] if len(gcs) == 1 else None}


def default_max_heap(argv: list, end: int) -> int | None:
    """The -Xmx HotSpot picks for this java command when it gives none."""
    c = hotspot_choices(argv, end)
    return c["MaxHeapSize"] if c else None


def same_heap_as_the_pager(argv: list) -> tuple[list, int | None]:
    """A java command line for Linux swap under a memory cgroup (`farmem run --mode kswap`), with what
    the JVM would otherwise decide from the cgroup's limit made as it is under the pager, where the JVM
    sees the machine: the collector (HotSpot picks Serial in a cgroup under 1792 MiB, G1 outside it),
    -Xmx (a share of the cgroup's memory) and -Xms (farmem run makes it -Xmx). Options given are
    kept. Returns the command line and its -Xmx in bytes (None when the JVM did not say it)."""
    argv = list(argv)
    end = split_jvm_options(argv)
    env_opts = (os.environ.get("JAVA_TOOL_OPTIONS", "") + " " + os.environ.get("JDK_JAVA_OPTIONS", "")).split()
    jvm = scan(env_opts + argv[1:end])
    chosen = jvm.gc_flags.get("UseG1GC") is not None or any(jvm.gc_flags.values())
    choices = None if chosen and jvm.xmx is not None else hotspot_choices(argv, end)
    added = []
    if not chosen and choices and choices["gc"]:
        added.append(f"-XX:+{choices['gc']}")
    if jvm.xmx is None and choices:
        jvm.xmx, jvm.xmx_text = choices["MaxHeapSize"], java_size_text(choices["MaxHeapSize"])
        added.append(f"-Xmx{jvm.xmx_text}")
    if jvm.xms is None and jvm.xmx is not None:
        added.append(f"-Xms{jvm.xmx_text}")
    if added:
        argv[1:1] = added
        print(f"farmem: kswap: adding {' '.join(added)}: what this JVM takes under the pager, which does not "
              "limit it by a cgroup; in the memory cgroup of Linux swap HotSpot would size its heap and pick its "
              "collector from the cgroup's limit (Serial below 1792 MiB); give them to choose yourself",
              file=sys.stderr)
    return argv, jvm.xmx


def prepare(args, address: str, control_path: str, quiet: bool = False) -> list:
    """The java command line with the agent added, or a FarmemError that says what to change.
    quiet: only check (farmem run calls it once before it starts memd, then for real)."""
    say = (lambda _msg: None) if quiet else (lambda msg: print(msg, file=sys.stderr))
    argv = list(args.cmd)
    lib = agent_lib()
    if not lib.exists():
        raise FarmemError(f"the JVMTI agent {lib} is missing: build it with `make c`")
    end = split_jvm_options(argv)
    env_opts = (os.environ.get("JAVA_TOOL_OPTIONS", "") + " " + os.environ.get("JDK_JAVA_OPTIONS", "")).split()
    jvm = scan(env_opts + argv[1:end])
    argv, end = gcmode.apply(args, argv, end, jvm.gc_flags)  # --gc memliner: the farmem JDK
    if any(o.startswith("-agentpath:") and AGENT_NAME in o for o in argv[1:end]):
        raise FarmemError(f"the command already loads {AGENT_NAME}: farmem run adds it itself")
    for flag, name in _UNSUPPORTED_GCS.items():
        if jvm.gc_flags.get(flag):
            raise FarmemError(f"{name} is not supported: its heap is multi-mapped, which the pager cannot "
                              "serve; use G1 (the default), -XX:+UseParallelGC or -XX:+UseShenandoahGC")
    if jvm.allocate_heap_at:
        fstype = fs_type(jvm.allocate_heap_at)
        if fstype is None:
            raise FarmemError(f"-XX:AllocateHeapAt={jvm.allocate_heap_at}: no such directory")
        if fstype != "tmpfs":
            raise FarmemError(f"-XX:AllocateHeapAt={jvm.allocate_heap_at} is on {fstype}, not tmpfs: farmem "
                              "pages a heap in shared memory (e.g. -XX:AllocateHeapAt=/dev/shm), not one on "
                              "a DAX/NVDIMM or disk file system; use /dev/shm or drop the flag")
        say(f"farmem: the heap is shared memory in {jvm.allocate_heap_at}: paging it in minor-fault mode")
    if jvm.large_pages:
        raise FarmemError("-XX:+UseLargePages is not supported: the pager pages 4 KiB pages; drop the flag")
    if jvm.xmx is None:
        # HotSpot's own maximum, made explicit: the budget's share and -Xms are taken from it.
        if getattr(args, "default_xmx", None) is None:
            args.default_xmx = default_max_heap(argv, end)
        if not args.default_xmx:
            raise FarmemError("farmem run -- java needs -Xmx here: the local budget is a share of the heap's "
                              f"maximum, and {argv[0]} did not say its default (e.g. java -Xmx2g ...)")
        jvm.xmx, jvm.xmx_text = args.default_xmx, java_size_text(args.default_xmx)
        argv.insert(1, f"-Xmx{jvm.xmx_text}")
        end += 1
        say(f"farmem: adding -Xmx{jvm.xmx_text}: the largest heap HotSpot chose for this machine's memory "
            "(-XX:MaxRAMPercentage), which a --local percentage is a share of; give -Xmx to size it yourself")
    if jvm.xms is None:
        # Committed in full, the heap costs no more than the budget (untouched pages are no memory under
        # the pager) and never resizes: the agent follows a heap that does (docs/jvm.md), but each resize
        # is a GC's worth of work for the JVM and a registration for the pager. An -Xms given is kept.
        argv.insert(1, f"-Xms{jvm.xmx_text}")
        end += 1
        say(f"farmem: adding -Xms{jvm.xmx_text} (equal to -Xmx): a heap committed in full costs only the local "
            "budget under farmem and never has to grow; give -Xms to size it yourself")
    local = str(args.local)
    if not local.endswith("%"):
        from farmem.units import parse_bytes
        if parse_bytes(local) > jvm.xmx:
            raise FarmemError(f"--local {fmt_bytes(parse_bytes(local))} is larger than the heap (-Xmx{jvm.xmx_text}): nothing would "
                              "ever be remote; give a smaller size or a percentage")
    opts = agent_options(args, address, control_path)
    if getattr(args, "threshold", None) is not None:
        say("farmem: warning: --threshold is a knob of the preload shim; for java the agent pages the "
            "heap, whatever its size")
    argv.insert(1, f"-agentpath:{lib}={','.join(opts)}")
    return argv


def agent_options(args, address: str, control_path: str) -> list:
    """The agent's options for farmem run's memd, budget and knobs."""
    return ([f"memd={address.replace(',', ';')}", f"local={args.local}", f"control={control_path}"]
            + knobs.agent_options(args, "run"))


def tool_options(args, env: dict, address: str, control_path: str) -> str | None:
    """JAVA_TOOL_OPTIONS for a command that is not java itself (a script, a build tool, a server
    that starts JVMs): every JVM it starts loads the agent, which pages its heap, and the preload
    shim stands aside in it. onerror=continue: a JVM the agent cannot serve (ZGC, a JDK it does not
    know) runs unpaged with a warning rather than not at all, deep inside someone else's script.
    None when the agent is not built, is already there, or its path would not survive the
    variable's splitting at white space."""
    lib, old = agent_lib(), env.get("JAVA_TOOL_OPTIONS", "")
    agent = f"-agentpath:{lib}={','.join(agent_options(args, address, control_path) + ['onerror=continue'])}"
    if not lib.exists() or AGENT_NAME in old or any(c.isspace() for c in agent) or any(c in ",=" for c in str(lib)):
        return None
    return " ".join([old, agent]).strip()


def build_env(base, secret: str) -> dict:
    """The JVM's environment: the secret, and no farmem shim (the agent pages the heap)."""
    env = dict(base)
    env["FARMEM_SECRET"] = secret
    pre = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "libfarmem_preload" not in p]
    if pre:
        env["LD_PRELOAD"] = ":".join(pre)
    else:
        env.pop("LD_PRELOAD", None)
    return env
