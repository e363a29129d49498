"""Sizes with units: the one table of what each suffix is worth and the one parser, for every place that reads a
size — policies and the configuration (``4MiB``, ``10MB``), knob values (``sequential_cutoff: 4M``) and what bcache
prints in sysfs (``5.8M``, ``64.0k``, ``-1.2k``).

Each reader accepts its own set of suffixes from the one table: an operator writes ``K``/``KiB`` (binary) or ``KB``
(decimal) but never bcache's lower-case ``k``; bcache prints ``k M G T P E`` (binary, ``bch_hprint``) and may print
a negative number.
"""

from __future__ import annotations

import re

BYTES: dict[str, int] = {
    "": 1, "B": 1,
    "k": 1 << 10, "K": 1 << 10, "KiB": 1 << 10, "KB": 1000,
    "M": 1 << 20, "MiB": 1 << 20, "MB": 1000**2,
    "G": 1 << 30, "GiB": 1 << 30, "GB": 1000**3,
    "T": 1 << 40, "TiB": 1 << 40, "TB": 1000**4,
    "P": 1 << 50, "E": 1 << 60,
}  # fmt: skip

OPERATOR = frozenset({"", "B", "K", "KiB", "KB", "M", "MiB", "MB", "G", "GiB", "GB", "T", "TiB", "TB"})
BCACHE = frozenset({"", "k", "M", "G", "T", "P", "E"})

# Bounded digit counts: longer strings are not sizes (and float() of them is slow).
_SIZE = re.compile(r"(-?)([0-9]{1,30}(?:\.[0-9]{1,9})?) ?([A-Za-z]*)")


def parse_size(text: str, suffixes: frozenset[str] = OPERATOR, *, signed: bool = False) -> int:
    """``text`` in bytes (to the precision written); ValueError if it is not a number with one of ``suffixes``."""
    m = _SIZE.fullmatch(text.strip())
    if not m or m.group(3) not in suffixes or (m.group(1) and not signed):
        raise ValueError(f"not a size: {text!r}")
    n = int(float(m.group(2)) * BYTES[m.group(3)])
    return -n if m.group(1) else n


def suffix_bytes(text: str) -> int:
    """What the unit at the end of a printed size is worth (1 without one), for comparing at printed precision."""
    m = _SIZE.fullmatch(text.strip())
    return BYTES.get(m.group(3), 1) if m else 1


def printed_matches(printed: str, want: int) -> bool:
    """Whether bcache's rounded print of a size (``bch_hprint``: ``0.0k``, ``4.0M``, ``5.8M``) is ``want`` bytes,
    within one unit of its last printed digit. False when ``printed`` is not a size bcache prints."""
    try:
        got = parse_size(printed, BCACHE, signed=True)
    except ValueError:
        return False
    text = printed.strip()
    unit = suffix_bytes(text)
    step = unit // 10 if "." in text else unit
    return abs(got - want) <= step
