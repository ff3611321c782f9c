"""`farmem memd`: run build/bin/farmem-memd in the foreground; the flags translate one to one.

memd runs as a child, not in place of this process, so that the secret directory made for it
goes when it stops: SIGINT, SIGTERM and SIGHUP are passed on to memd, and memd gets SIGTERM if
this process dies first. The exit status is memd's (128+N when signal N stopped it).
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

from farmem import doctor, paths
from farmem.embedded_memd import die_with_parent
from farmem.errors import FarmemError

DEFAULT_LISTEN = "127.0.0.1:7070"


def new_secret_file() -> str:
    """A fresh secret in a new 0700 directory, for as long as memd runs (clients read it)."""
    directory = tempfile.mkdtemp(prefix="farmem-memd-")
    path = os.path.join(directory, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def memd_argv(args, binary: str, secret_file: str) -> list:
    argv = [binary]
    rdma = getattr(args, "rdma", None)
    listen = args.listen or ([] if (args.unix or rdma) else [DEFAULT_LISTEN])
    for addr in listen:
        argv += ["--listen", addr]
    if rdma:  # memd also listens on TCP ADDR:PORT for the rdma clients' control
        argv += ["--rdma", rdma]
    if args.unix:
        argv += ["--unix", args.unix]
    if args.capacity:
        argv += ["--capacity", str(args.capacity)]
    argv += ["--secret-file", secret_file]
    if args.session_quota:
        argv += ["--session-quota", str(args.session_quota)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if getattr(args, "spin_us", None) is not None:
        argv += ["--spin-us", str(args.spin_us)]
    if args.log:
        argv += ["--log", args.log]
    if getattr(args, "numa_node", None) is not None:
        argv += ["--numa-node", str(args.numa_node)]
    if getattr(args, "idmap", False):
        argv.append("--idmap")
    return argv


def cmd_memd(args) -> int:
    doctor.require("farmem-memd")
    made = None
    if args.secret_file:
        if not os.path.isfile(args.secret_file):
            raise FarmemError(f"the secret file {args.secret_file} does not exist")
        secret_file = args.secret_file
    else:
        secret_file = new_secret_file()
        made = os.path.dirname(secret_file)
        print(f"farmem: memd secret written to {secret_file} (clients: --secret-file {secret_file}, "
              f"or FARMEM_SECRET=$(cat {secret_file})); it is removed when memd stops", file=sys.stderr)
    try:
        return run_foreground(memd_argv(args, str(paths.memd_binary()), secret_file))
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)


def run_foreground(argv: list) -> int:
    """memd as a child that gets our signals; its status, shell-style."""
    proc = None
    pending = []

    def forward(signo, _frame):
        # A signal while Popen has not returned yet (memd may be listening by then) is passed on
        # after it: dropped, memd ran on and `farmem memd` never stopped (a loaded CI machine).
        if proc is None:
            pending.append(signo)
        elif proc.poll() is None:
            proc.send_signal(signo)
    saved = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        except OSError as e:
            raise FarmemError(f"cannot run {argv[0]}: {e.strerror or e}") from None
        for signo in pending:
            proc.send_signal(signo)
        rc = proc.wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return 128 - rc if rc < 0 else rc
