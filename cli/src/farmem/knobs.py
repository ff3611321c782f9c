"""How farmem run and attach pass the knob flags on (the list: uffd/knobs.h, as knob_table.py)."""

from farmem import knob_table

# Knobs the commands pass on themselves: memd and its secret as they found or made them, local always.
OWN_KNOBS = ("memd", "local", "secret", "secret_file")


def given(args, command: str):
    """(knob, value) for each knob flag of command ("run", "attach") on the command line."""
    for k in knob_table.KNOBS:
        value = getattr(args, k["name"], None)
        if k[command] and k["name"] not in OWN_KNOBS and value is not None:
            yield k, value


def _text(value) -> str:
    """A value as the pager parses it: a --[no-]x pair's True or False is 1 or 0."""
    return str(int(value)) if isinstance(value, bool) else str(value)


def env_vars(args, command: str = "run") -> dict:
    """FARMEM_<KNOB>=value for the preload shim."""
    return {k["env"]: _text(v) for k, v in given(args, command) if k["env"]}


def agent_options(args, command: str) -> list:
    """key=value for the JVMTI agent."""
    return [f"{k['name']}={_text(v)}" for k, v in given(args, command) if k["opt"]]
