# SPDX-License-Identifier: Apache-2.0
"""One knob list (uffd/knobs.h) and its five readers: the pager's parser (config.c: knobs and
FARMEM_* variables), the agent's option parser (jvmti-agent/options.c), the flags of `farmem run`
and `farmem attach`, and the tables of docs/knobs.md and docs/jvm.md. build/tools/farmem-knobs
is the compiled list and drives the real C parsers; every test here fails when one reader
disagrees with the list."""

import json
import os
import subprocess
import sys

import pytest

from farmem import java, knob_table, knobs, main, units
from farmem.commands import run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BY_NAME = {k["name"]: k for k in knob_table.KNOBS}
# Flags of run and attach that are not knobs (nothing in C reads them).
NOT_KNOBS = {"run": {"--summary-json", "--user", "--gc", "--mode", "--epoch-churn", "--kswap-scan-ms", "--no-bpf"},
             "attach": set()}


@pytest.fixture(scope="module")
def knobs_bin(built):
    return built("build/tools/farmem-knobs")


def c(knobs_bin, *argv, env=None):
    """(status, parsed JSON or the refusal message) of farmem-knobs."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FARMEM_")}
    r = subprocess.run([str(knobs_bin), *argv], capture_output=True, text=True, env={**clean, **(env or {})})
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr.strip())


def test_generated_files_are_current(knobs_bin):
    """knob_table.py and the docs' tables are what the list makes (`make` rewrites them)."""
    r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "gen_knobs.py"), "--knobs", str(knobs_bin),
                        "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_committed_generated_files_are_current(knobs_bin):
    """What is committed, not only what make just wrote: make rewrites the generated files from the
    list, so a table edited by hand in docs/knobs.md (session 66) or a list changed without its
    regenerated files committed passed every check here and was silently put back by the next build.
    With uffd/knobs.h as committed, the files on disk (current, by the test above) must be the
    committed ones too."""
    def git(*argv):
        return subprocess.run(["git", "-C", REPO, *argv], capture_output=True, text=True)

    if git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout")
    if git("diff", "--quiet", "HEAD", "--", "uffd/knobs.h").returncode != 0:
        pytest.skip("uffd/knobs.h has changes not committed: its generated files are committed with it")
    stale = []
    for path in ("cli/src/farmem/knob_table.py", "docs/knobs.md", "docs/jvm.md"):
        committed = git("show", f"HEAD:{path}")
        assert committed.returncode == 0, committed.stderr
        with open(os.path.join(REPO, path)) as f:
            if f.read() != committed.stdout:
                stale.append(path)
    assert not stale, f"committed, these differ from what uffd/knobs.h makes (run make, commit them): {stale}"


def test_the_cli_table_is_the_compiled_list(knobs_bin):
    status, table = c(knobs_bin, "table")
    assert status == 0
    assert all(k.pop("in_pager") for k in table), "config.c's copy of the list differs from the header"
    assert table == knob_table.KNOBS


def canonical(k, text):
    """A value as farmem-knobs prints it back."""
    t = k["type"]
    if t in ("uint", "pct", "bool"):
        return int(text.rstrip("%"))
    if t == "size":
        return units.parse_bytes(text)
    if t == "local":
        return text if text.endswith("%") else str(units.parse_bytes(text))
    if t == "addrs":
        return text.replace(";", ",")
    return text


def test_defaults_are_what_the_parsers_start_from(knobs_bin):
    for verb in (["env"], ["agent"]):
        status, got = c(knobs_bin, *verb)
        assert status == 0, got
        for k in knob_table.KNOBS:
            if k["where"] == "cli" or (verb == ["env"] and k["where"] == "agent"):
                continue
            if k["default"]:
                want = canonical(k, k["default"])
            else:  # unset: a number is 0, a string empty
                want = 0 if k["type"] in ("uint", "pct", "bool", "flag") else ""
            if k["name"] == "threshold" and verb == ["agent"]:
                want = 4096  # the agent pages the heap whatever its size
            assert got[k["name"]] == want, (verb, k["name"])


def probes(k):
    """(value, accepted) pairs at the edges of knob k's range."""
    t = k["type"]
    if t in ("uint", "pct", "bool"):
        out = [(str(k["min"]), True), (str(k["max"]), True), (str(k["max"] + 1), False), ("x", False)]
        if k["min"] > 0:
            out.append((str(k["min"] - 1), False))
        if t == "pct":
            out.append((f"{k['max']}%", True))
        return out
    if t == "size":
        return [(str(k["min"]), True), (str(k["min"] - 1), False), ("64M", True), ("1x", False)]
    if t == "local":
        return [("1M", True), ("1048575", False), ("1%", True), ("100%", True), ("0%", False), ("101%", False)]
    if t == "enum":
        return [(c, True) for c in k["choices"].split("|")] + [("bogus", False)]
    return []


# evict_low must stay below evict_high: probe one with the other at the far end of its range.
PARTNER = {"evict_high": ("evict_low", "5"), "evict_low": ("evict_high", "100")}


@pytest.mark.parametrize("name", [k["name"] for k in knob_table.KNOBS if probes(k)])
def test_every_reader_takes_the_same_values(knobs_bin, name):
    k = BY_NAME[name]
    parser = main.get_command_parser()
    other, other_value = PARTNER.get(name, (None, None))
    other_env = {BY_NAME[other]["env"]: other_value} if other else {}
    other_opt = f",{other}={other_value}" if other else ""
    for value, ok in probes(k):
        if k["where"] == "cfg":
            status, got = c(knobs_bin, "set", name, value)
            assert (status == 0) == ok, ("fm_pager_cfg_set", name, value, got)
            if ok:
                assert got[name] == canonical(k, value)
        if k["env"]:
            status, got = c(knobs_bin, "env", env={k["env"]: value, **other_env})
            assert (status == 0) == ok, ("FARMEM_*", name, value, got)
            if not ok:
                assert k["env"] in got  # the message names the variable
        if k["opt"]:
            status, got = c(knobs_bin, "agent", f"{name}={value}{other_opt}")
            assert (status == 0) == ok, ("agent option", name, value, got)
            if ok:
                assert got[name] == canonical(k, value)
            else:
                assert name in got
        for command in ("run", "attach"):
            if k[command] and not k["flag"].startswith("--[no-]"):
                argv = [command, k["flag"], value] + (["--", "true"] if command == "run" else ["1"])
                try:
                    parser.parse_args(argv)
                    accepted = True
                except SystemExit:
                    accepted = False
                assert accepted == ok, (command, k["flag"], value)


def test_the_agent_reads_the_variables_of_its_options_only(knobs_bin):
    for k in knob_table.KNOBS:
        if not k["env"] or k["type"] in ("str", "addrs", "secret"):
            continue
        status, got = c(knobs_bin, "agent", env={k["env"]: "bogus"})
        assert (status != 0) == k["opt"], (k["name"], got)
    # the option wins over the variable
    status, got = c(knobs_bin, "agent", "prefetch=3", env={"FARMEM_PREFETCH": "5"})
    assert status == 0 and got["prefetch"] == 3


def test_the_agent_refuses_what_is_not_its_option(knobs_bin):
    for k in knob_table.KNOBS:
        if not k["opt"]:
            status, msg = c(knobs_bin, "agent", f"{k['name']}=1")
            assert status == 1 and k["name"] in msg and "not" in msg, msg
    status, msg = c(knobs_bin, "agent", "discard=all")
    assert status == 1 and "discard=all" in msg
    assert c(knobs_bin, "agent", "detach")[1]["detach"] == 1
    assert c(knobs_bin, "agent", "memd=unix:/a;unix:/b")[1]["memd"] == "unix:/a,unix:/b"


@pytest.mark.parametrize("command", ["run", "attach"])
def test_the_commands_have_a_flag_for_each_knob_and_no_other(command):
    parser = main.get_command_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    flags = {o for a in sub._actions for o in a.option_strings if o not in ("-h", "--help")}
    want = set()
    for k in knob_table.KNOBS:
        if k[command]:
            name = k["flag"].replace("[no-]", "")
            want |= {name, "--no-" + name[2:]} if "[no-]" in k["flag"] else {name}
    assert flags - NOT_KNOBS[command] == want


def test_every_flag_given_reaches_the_pager():
    """What farmem run hands the shim (FARMEM_*) and the agent (key=value), attach the agent."""
    parser = main.get_command_parser()
    for command in ("run", "attach"):
        argv, expect_env, expect_opts = [command], {}, []
        for k in knob_table.KNOBS:
            if not k[command] or k["name"] in knobs.OWN_KNOBS:
                continue
            if k["flag"].startswith("--[no-]"):
                argv.append("--no-" + k["flag"][7:])
                value = "0"
            else:
                value = next(v for v, ok in probes(k) if ok and v != k["default"])
                argv += [k["flag"], value]
            if k["env"]:
                expect_env[k["env"]] = str(canonical(k, value))
            if k["opt"]:
                expect_opts.append(f"{k['name']}={canonical(k, value)}")
        args = parser.parse_args(argv + (["--", "true"] if command == "run" else ["1"]))
        if command == "run":
            env = run.build_env(args, {}, "unix:/m", "s", "/c")
            assert {n: v for n, v in env.items() if n in expect_env} == expect_env
        assert java.knobs.agent_options(args, command) == expect_opts
