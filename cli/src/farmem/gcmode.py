"""`farmem run --gc farmem|memliner|swapva|memliner+swapva -- java ...`: run the farmem JDK (hotspot/,
docs/patched-jdk.md).

The farmem JDK is Debian's OpenJDK 17 with a patched HotSpot, built by `make jdk`
(hotspot/build.sh) into ~/.cache/farmem-jdk17/<version>-<key>/jdk, where the key hashes the
build script and hotspot/patches/. `--gc memliner` swaps the command's `java` for that JDK's and
adds -XX:+UseFarmemMemLiner: G1's concurrent marking then postpones objects on pages the pager
has sent to memd (MemLiner). `--gc swapva` adds -XX:+UseFarmemSwapVA: G1's full GC moves the
whole pages of large objects through the pager (fm_pager_move) instead of copying them (SVAGC's
SwapVA). `memliner+swapva` does both. `--gc farmem` is what the farmem JDK does for far memory:
MemLiner marking and -XX:+UseFarmemInPlace (what G1 would do on pages that are in memd, the pager
does there: a full GC's moves and header reads and writes, promotions of primitive arrays while
local memory is full).
$FARMEM_JDK names another farmem JDK home.
"""

import os
import subprocess
from pathlib import Path

from farmem import paths
from farmem.errors import FarmemError

GC_FLAGS = {
    "farmem": ["-XX:+UseFarmemMemLiner", "-XX:+UseFarmemInPlace"],
    "memliner": ["-XX:+UseFarmemMemLiner"],
    "swapva": ["-XX:+UseFarmemSwapVA"],
    "memliner+swapva": ["-XX:+UseFarmemMemLiner", "-XX:+UseFarmemSwapVA"],
}
# What each mode changes in G1, for the refusal of another collector.
_CHANGES = {"farmem": "G1's marking and full-GC compaction", "memliner": "G1's marking",
            "swapva": "G1's full-GC compaction",
            "memliner+swapva": "G1's marking and full-GC compaction"}
_OTHER_GCS = ("UseParallelGC", "UseSerialGC", "UseZGC", "UseShenandoahGC", "UseEpsilonGC")


def build_script() -> Path:
    return paths.repo_root() / "hotspot" / "build.sh"


def farmem_jdk_home() -> Path | None:
    """The built farmem JDK for this checkout's patches, or None."""
    env = os.environ.get("FARMEM_JDK")
    if env:
        return Path(env)
    script = build_script()
    if not script.exists():
        return None
    r = subprocess.run(["bash", str(script), "--home"], capture_output=True, text=True)
    home = r.stdout.strip()
    return Path(home) if r.returncode == 0 and home else None


def is_farmem_jdk(java: str, flags=("-XX:+UseFarmemMemLiner",)) -> bool:
    """Whether this java knows the flags (a stock JDK says 'Unrecognized VM option')."""
    try:
        r = subprocess.run([java, *flags, "-version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def apply(args, argv: list, end: int, gc_flags: dict) -> tuple:
    """argv with the farmem JDK's java and the mode's flags; (argv, end). FarmemError if it cannot be."""
    mode = getattr(args, "gc", None)
    if not mode or mode == "stock":
        return argv, end
    others = [f for f in _OTHER_GCS if gc_flags.get(f)]
    if others or gc_flags.get("UseG1GC") is False:
        bad = f"-XX:+{others[0]}" if others else "-XX:-UseG1GC"
        raise FarmemError(f"--gc {mode} changes {_CHANGES[mode]}: drop {bad} (G1 is the default)")
    if argv[0] == "java":
        home = farmem_jdk_home()
        if home is None or not (home / "bin" / "java").exists():
            raise FarmemError(f"--gc {mode} needs the farmem JDK (a patched HotSpot), which is not built for "
                              "this checkout: run `make jdk` (about 15 minutes the first time; "
                              "docs/patched-jdk.md), or set $FARMEM_JDK to a farmem JDK home")
        argv = [str(home / "bin" / "java")] + argv[1:]
    elif not is_farmem_jdk(argv[0], GC_FLAGS[mode]):
        raise FarmemError(f"--gc {mode} needs the farmem JDK, and {argv[0]} is a stock JDK or an older farmem "
                          f"JDK (it does not know {' '.join(GC_FLAGS[mode])}): write plain `java` so that "
                          "farmem uses the JDK `make jdk` builds, or give a farmem JDK's bin/java")
    flags = [f for f in GC_FLAGS[mode] if f not in argv[1:end]]
    return argv[:1] + flags + argv[1:], end + len(flags)
