"""The farmem command line: one parser, one _add_<cmd>() per subcommand, one cli() for exit codes.

Exit codes (docs/knobs.md has the table): a command's own (farmem run passes its program's
through), a FarmemError's (1, or 78 for what this machine or the memd given cannot serve), 2 for
a usage error, 130 for Ctrl-C.
"""

import argparse
import logging
import re
import sys

from farmem import __version__, knob_table
from farmem.errors import FarmemError
from farmem.units import parse_bytes, parse_local, parse_percent

LOG_LEVELS = ("error", "warn", "info", "debug")  # fm_log_level_parse() in memd/common/fm_util.c


# --- argument types: each raises ArgumentTypeError with the reason --------------------------

def _typed(fn, name):
    def parse(text):
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name  # argparse names the type in "invalid <name> value"
    return parse


def size_at_least(minimum: int):
    def parse(text):
        value = parse_bytes(text)
        if value < minimum:
            raise ValueError(f"{text!r} is less than {minimum} bytes")
        return value
    return _typed(parse, "size")


def int_range(lo: int, hi: int):
    def parse(text):
        if not re.fullmatch(r"[0-9]+", text.strip()):
            raise ValueError(f"{text!r} is not a whole number")
        value = int(text)
        if not lo <= value <= hi:
            raise ValueError(f"{text!r} is out of range: give {lo} to {hi}")
        return value
    return _typed(parse, "number")


def _log_level(text):
    if text.lower() not in LOG_LEVELS:
        raise ValueError(f"{text!r} is not a log level: give one of {', '.join(LOG_LEVELS)}")
    return text.lower()


_HOST_PORT_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
_LISTEN_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):([0-9]{1,5})")  # empty host: all


def memd_address(text: str) -> str:
    """One memd address as the pager takes it: unix:PATH, tcp:HOST:PORT or HOST:PORT."""
    if text.startswith("unix:"):
        if len(text) == len("unix:"):
            raise ValueError(f"{text!r}: unix: needs a socket path")
        return text
    if text.startswith("rdma://"):  # one-sided verbs; control over TCP on the same HOST:PORT
        m = _HOST_PORT_RE.fullmatch(text.removeprefix("rdma://"))
        if not m or not 1 <= int(m.group(2)) <= 65535:
            raise ValueError(f"{text!r}: want rdma://ADDR:PORT")
        return text
    m = _HOST_PORT_RE.fullmatch(text.removeprefix("tcp:"))
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{text!r} is not a memd address (unix:PATH, tcp:HOST:PORT or HOST:PORT)")
    return text


def _memd_list(text: str) -> list:
    addrs = [a.strip() for a in text.split(",")]
    if not all(addrs):
        raise ValueError(f"{text!r}: empty address in the list")
    return [memd_address(a) for a in addrs]


def _listen(text: str) -> str:
    m = _LISTEN_RE.fullmatch(text)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (an empty HOST listens on every address)")
    return text


local_type = _typed(parse_local, "local size")
def percent_range(lo: int, hi: int):
    return _typed(lambda text: parse_percent(text, lo, hi), "percentage")


log_type = _typed(_log_level, "log level")
memd_list_type = _typed(_memd_list, "memd address list")
listen_type = _typed(_listen, "listen address")


# --- the knobs' flags: uffd/knobs.h, through knob_table.py (tools/gen_knobs.py) --------------------

def _enum(choices: str):
    names = choices.split("|")

    def parse(text):
        if text.lower() not in names:
            raise ValueError(f"{text!r}: give one of {', '.join(names)}")
        return text.lower()
    return _typed(parse, "choice")


def knob_type(k: dict):
    """The argparse type that takes what the C parser takes for knob k."""
    t = k["type"]
    if t == "uint":
        return int_range(k["min"], k["max"])
    if t == "pct":
        return percent_range(k["min"], k["max"])
    if t == "size":
        return size_at_least(k["min"])
    if t == "local":
        return local_type
    if t == "enum":
        return _enum(k["choices"])
    if t == "addrs":
        return memd_list_type
    if t in ("path", "str"):
        return str
    raise AssertionError(f"knob {k['name']}: no flag for a {t}")


def add_knob_flags(p, command: str) -> None:
    """The flags of `farmem run` or `farmem attach` that set knobs; dest is the knob's name."""
    for k in knob_table.KNOBS:
        if not k[command]:
            continue
        default = f" (default {k['default']})" if k["default"] and k["type"] != "bool" else ""
        text = (k["help"] + default).replace("%", "%%")
        if k["flag"].startswith("--[no-]"):
            on = k["default"] == "1"
            p.add_argument("--" + k["flag"][7:], dest=k["name"], action=argparse.BooleanOptionalAction,
                           default=None, help=f"{text} (default {'on' if on else 'off'})")
            continue
        # local has a value whatever the command line says: farmem passes it on always.
        p.add_argument(k["flag"], dest=k["name"], type=knob_type(k), metavar=k["metavar"] or None,
                       default=k["default"] if k["name"] == "local" else None, help=text)


# --- the parser ---------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """A usage error is one line that says what is wrong and where the help is: argparse's own
    usage block buries the message under every flag of the command."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


RUN_EXAMPLES = """\
examples:
  farmem run --local 25% -- ./app --big-input      embedded memd, a quarter of the memory local
  farmem run --local 2G --memd 10.0.0.2:7070 --secret-file memd.secret -- java -Xmx8g -jar app.jar
  farmem run --summary-json s.json -- build/tests/pagetest --size 512M

Without --memd, farmem starts a private memory server (build/bin/farmem-memd) on a Unix
socket and stops it when CMD ends. The exit status is CMD's (128+N if a signal N killed it).
"""


def _add_run(sub) -> None:
    from farmem.commands import run
    p = sub.add_parser("run", help="run a program with most of its memory in memd",
                       description="Run CMD under the farmem pager (LD_PRELOAD shim).",
                       epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_knob_flags(p, "run")
    p.add_argument("--summary-json", metavar="FILE", help="write the end-of-run figures as JSON")
    p.add_argument("--user", metavar="NAME",
                   help="run CMD as this user (farmem run itself as root): its processes reach the private memd "
                        "and get a user-mode-only userfaultfd, so a server that refuses root (PostgreSQL) is paged "
                        "in the default fault mode")
    p.add_argument("--gc", choices=("stock", "farmem", "memliner", "swapva", "memliner+swapva"), default=None,
                   help="java: run the farmem JDK (`make jdk`; docs/patched-jdk.md): farmem = everything it does "
                        "for far memory (MemLiner marking, and full GCs that move objects on remote pages inside "
                        "memd), memliner = MemLiner marking only (G1 postpones objects on remote pages), swapva = "
                        "G1's full GC moves the pages of large objects instead of copying them, memliner+swapva = "
                        "both")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the program and its arguments")
    p.set_defaults(func=run.cmd_run, validate=run.validate, parser=p)
    from farmem.commands import run_kswap
    run_kswap.add_mode_args(p)


def _add_memd(sub) -> None:
    from farmem.commands import memd
    p = sub.add_parser("memd", help="run a memory server in the foreground",
                       description="Run build/bin/farmem-memd in the foreground.",
                       epilog="example:\n  farmem memd --listen 10.0.0.2:7070 --capacity 64G",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=listen_type, action="append", metavar="HOST:PORT",
                   help=f"TCP address to serve (repeatable; default {memd.DEFAULT_LISTEN} when "
                        "--unix is not given)")
    p.add_argument("--unix", metavar="PATH", help="Unix socket to serve")
    p.add_argument("--rdma", type=listen_type, metavar="ADDR:PORT",
                   help="serve RDMA clients (rdma://ADDR:PORT) on an RDMA device's address; "
                        "their control connection is TCP on the same ADDR:PORT")
    p.add_argument("--capacity", type=size_at_least(1 << 20), metavar="SIZE",
                   help="memory to hold pages in (default: half the physical memory)")
    p.add_argument("--secret-file", metavar="FILE",
                   help="clients' shared secret; default: a new one, its path printed")
    p.add_argument("--session-quota", type=size_at_least(1 << 20), metavar="SIZE",
                   help="most one client session may hold (default: the capacity)")
    p.add_argument("--threads", type=int_range(1, 64), metavar="N", help="event-loop threads, 1 to 64")
    p.add_argument("--spin-us", type=int_range(0, 10000), metavar="US",
                   help="after serving, poll for the next request this long before sleeping "
                        "(default 0: sleep at once); for a memory server whose CPUs its clients' "
                        "programs do not need")
    p.add_argument("--log", type=log_type, metavar="LEVEL", help="error, warn, info or debug")
    p.add_argument("--numa-node", type=int_range(0, 1023), metavar="N",
                   help="keep the page store on NUMA node N (e.g. a CPU-less CXL memory node)")
    p.add_argument("--idmap", action="store_true",
                   help="keep the page store in identity-mapped memory (VA == PA) from /dev/swapva "
                        "(kmod-swapva, root); stream transports only")
    p.set_defaults(func=memd.cmd_memd, parser=p)


def _add_stat(sub) -> None:
    from farmem.commands import stat
    p = sub.add_parser("stat", help="figures of a process under farmem",
                       description="Read a paged process's residency map and counters.")
    p.add_argument("pid", type=int_range(1, 1 << 22), metavar="PID")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=stat.cmd_stat, parser=p)


def _add_doctor(sub) -> None:
    from farmem.commands import doctor
    p = sub.add_parser("doctor", help="what this machine can do, and what each missing piece costs",
                       description="Try each kernel feature and tool farmem uses; one line each.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--require", metavar="FEATURE[,FEATURE...]",
                   help="check only these; exit 78 with the refusal message if one is missing")
    p.set_defaults(func=doctor.cmd_doctor, parser=p)


def _add_top(sub) -> None:
    from farmem.commands import top
    top.add_parser(sub)


def _add_trace(sub) -> None:
    from farmem.commands import trace
    p = sub.add_parser("trace", help="fault trace of a process: MemLiner's figure 2",
                       description="Record every page fault of PID for a while; plot sequence "
                                   "number against page, GC against application threads.")
    p.add_argument("pid", type=int_range(1, 1 << 22), metavar="PID")
    p.add_argument("--duration", type=_typed(trace.parse_duration, "duration"), default=10.0,
                   metavar="TIME", help="how long to record (10s, 500ms, 2m; default 10s)")
    p.add_argument("--plot", metavar="FILE.png", help="write the figure")
    p.add_argument("--csv", metavar="FILE.csv", help="write one row per fault")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=trace.cmd_trace, parser=p)


ATTACH_EXAMPLES = """\
examples:
  farmem attach 4242 --local 50%%       page half of the heap of the JVM with pid 4242
  farmem stat 4242 --json              its figures
  farmem detach 4242                   bring every page home, stop the pager and its memd

The JVM must be HotSpot (JDK 17+) with G1 or Parallel, its heap sized as it was started (any -Xms,
-Xmx or none): the heap is paged as HotSpot grows and shrinks it, and a percentage is of -Xmx.
Without --memd, a private memd is started that stops with `farmem detach` or with the JVM.
"""


def _add_attach(sub) -> None:
    from farmem.commands import attach
    p = sub.add_parser("attach", help="page the heap of a running JVM",
                       description="Load the farmem JVMTI agent into a running HotSpot JVM.",
                       epilog=ATTACH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", type=int_range(1, 1 << 22), metavar="PID")
    add_knob_flags(p, "attach")
    p.set_defaults(func=attach.cmd_attach, parser=p)


def _add_detach(sub) -> None:
    from farmem.commands import attach
    p = sub.add_parser("detach", help="bring a JVM's heap home and stop paging it",
                       description="Bring every remote page of a JVM's heap back, stop the pager "
                                   "(the agent stays loaded, idle) and the memd `farmem attach` started.")
    p.add_argument("pid", type=int_range(1, 1 << 22), metavar="PID")
    p.set_defaults(func=attach.cmd_detach, parser=p)


_COMMANDS = {"run": _add_run, "memd": _add_memd, "stat": _add_stat, "doctor": _add_doctor, "top": _add_top,
             "trace": _add_trace, "attach": _add_attach, "detach": _add_detach}


def get_command_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only the one named (`farmem run` is in front of every program it
    runs: importing the other commands' modules would add to each program's start)."""
    parser = Parser(
        prog="farmem", description="farmem: run programs with most of their memory far away.")
    parser.add_argument("--version", action="version", version=f"farmem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if only in (None, name):
            add(sub)
    return parser


def command_list(parser) -> str:
    """What bare `farmem` prints: every command with its one-line help."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    width = max(len(c.dest) for c in sub._choices_actions)
    lines = ["farmem: give a command:"]
    lines += [f"  {c.dest:<{width}}  {c.help}" for c in sub._choices_actions]
    lines.append("`farmem COMMAND --help` explains each; docs/ and the README say more.")
    return "\n".join(lines) + "\n"


class _Formatter(logging.Formatter):
    def format(self, record):
        level = {"WARNING": "warning"}.get(record.levelname, record.levelname.lower())
        return f"farmem: {level}: {record.getMessage()}"


def setup_logging(level: str | None) -> None:
    logger = logging.getLogger("farmem")
    for h in list(logger.handlers):  # in-process callers (tests) must not stack handlers
        logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel({"error": logging.ERROR, "warn": logging.WARNING, "info": logging.INFO,
                     "debug": logging.DEBUG}.get(level or "warn"))


def cli(argv=None) -> int:
    """The entry point of `farmem` and `python -m farmem`. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    parser = get_command_parser(argv[0] if argv and argv[0] in _COMMANDS else None)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name them under the subcommand's usage, not the top-level one
            getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            print(command_list(parser), file=sys.stderr, end="")
            return 2
        validate = getattr(args, "validate", None)
        if validate:
            validate(args, args.parser)
    except SystemExit as e:  # argparse: usage errors are 2, --help is 0
        return e.code if isinstance(e.code, int) else 2
    setup_logging(getattr(args, "log", None))
    try:
        return args.func(args)
    except FarmemError as e:
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("farmem: interrupted", file=sys.stderr)
        return 130
