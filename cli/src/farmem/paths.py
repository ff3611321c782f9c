"""Where the C components live: <repo>/build, from the source checkout this package runs from, and the
environment they run in."""

import os
from pathlib import Path


def repo_root() -> Path:
    """The farmem checkout: $FARMEM_ROOT, else the tree that holds cli/src/farmem."""
    env = os.environ.get("FARMEM_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[3]


def build_dir() -> Path:
    """$FARMEM_BUILD, else <repo>/build (what `make` fills)."""
    env = os.environ.get("FARMEM_BUILD")
    return Path(env).resolve() if env else repo_root() / "build"


def memd_binary() -> Path:
    return build_dir() / "bin" / "farmem-memd"


def preload_lib() -> Path:
    return build_dir() / "lib" / "libfarmem_preload.so"


def helper_env() -> dict:
    """The environment for farmem's own programs (the embedded memd, farmem-trace): the user's, less
    LD_PRELOAD, which is meant for CMD (`LD_PRELOAD=libmimalloc.so.2 farmem run -- CMD` ran memd on
    mimalloc too)."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
