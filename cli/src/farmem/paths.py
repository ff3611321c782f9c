"""Where the C components live: <repo>/build, from the source checkout this package runs from."""

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
