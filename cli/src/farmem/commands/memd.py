"""`farmem memd`: run build/bin/farmem-memd in the foreground; the flags translate one to one."""

import os
import secrets
import sys
import tempfile

from farmem import doctor, paths
from farmem.errors import FarmemError

DEFAULT_LISTEN = "127.0.0.1:7070"


def new_secret_file() -> str:
    """A fresh secret in a new 0700 directory; it outlives this process (clients need it)."""
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
    if args.log:
        argv += ["--log", args.log]
    if getattr(args, "numa_node", None) is not None:
        argv += ["--numa-node", str(args.numa_node)]
    if getattr(args, "idmap", False):
        argv.append("--idmap")
    return argv


def cmd_memd(args) -> int:
    doctor.require("farmem-memd")
    if args.secret_file:
        if not os.path.isfile(args.secret_file):
            raise FarmemError(f"the secret file {args.secret_file} does not exist")
        secret_file = args.secret_file
    else:
        secret_file = new_secret_file()
        print(f"farmem: memd secret written to {secret_file} (clients: --secret-file {secret_file}, "
              f"or FARMEM_SECRET=$(cat {secret_file}))", file=sys.stderr)
    argv = memd_argv(args, str(paths.memd_binary()), secret_file)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        raise FarmemError(f"cannot run {argv[0]}: {e.strerror or e}") from None
    return 1  # not reached
