"""Byte sizes and percentages, parsed exactly as the C side parses them (memd/common/fm_util.c)."""

import re

_SHIFTS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
# fm_parse_bytes: digits, then an optional k/m/g/t, an optional "i" after it, an optional "b".
_BYTES_RE = re.compile(r"([0-9]+)([kmgt]?)((?<=[kmgt])i)?(b?)", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """'64M', '1g', '512MiB', '4096' -> bytes. Raises ValueError with a sentence."""
    m = _BYTES_RE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64M, 1g, 512MiB)")
    value = int(m.group(1)) << _SHIFTS[m.group(2).lower()]
    if value >= 1 << 64:
        raise ValueError(f"{text!r} is too large")
    return value


def parse_percent(text: str, lo: int = 1, hi: int = 100) -> int:
    """'25%' or '25' -> 25, within [lo, hi]."""
    m = re.fullmatch(r"([0-9]+)%?", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a percentage (example: 25%)")
    value = int(m.group(1))
    if not lo <= value <= hi:
        raise ValueError(f"{text!r} is out of range: give {lo}% to {hi}%")
    return value


def parse_local(text: str) -> str:
    """The local budget as FARMEM_LOCAL spells it: a byte count, or 'NN%' (1..100)."""
    if text.strip().endswith("%"):
        return f"{parse_percent(text)}%"
    value = parse_bytes(text)
    if value < 1 << 20:
        raise ValueError(f"{text!r} is less than 1M, the smallest budget the pager takes")
    return str(value)


def fmt_bytes(n: int) -> str:
    """4194304 -> '4.0 MiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
