"""What a kind of stock cache can do: its write modes, how it drains, and its knobs with type and range. Each
kind declares its own in its module (backends/<kind>.py, collected by backends.kinds); the table is used by the
policy checker (a rule may not ask for a mode or knob that a kind it can match cannot take), by the engine
(which modes exist, what "destructive" means for a kind) and by the backends (the range a setter enforces before
it writes). Ranges are the kernel's own (confirmed in drivers/md/bcache/sysfs.c,
dm-cache-target.c, dm-writecache.c of 6.1): a value outside is an error here rather than a silent clamp there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from cachepilot.errors import UserError

# Backend-neutral write modes (the same strings as models.volume).
WRITEBACK, WRITETHROUGH, BYPASS = "writeback", "writethrough", "bypass"

UINT_MAX = (1 << 32) - 1

_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) ?(B|K|M|G|T|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$")
_SIZE_UNITS = {None: 1, "B": 1, "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30,
               "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40, "KB": 1000, "MB": 10**6, "GB": 10**9, "TB": 10**12}


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    kinds: frozenset[str]
    type: str  # "int" (a plain count, percent, µs, sectors) or "size" (bytes; a unit allowed)
    min: int
    max: int
    unit: str  # for humans: "percent", "bytes", "seconds", "sectors/s", "µs", "ms", "blocks", "jobs"
    doc: str

    def parse(self, value: object) -> int:
        """The knob's value as an integer in its unit, or UserError naming the knob and the range."""
        n = _to_int(self, value)
        if not self.min <= n <= self.max:
            raise UserError(f"knob {self.name}: {n} is outside {self.min}..{self.max} ({self.unit})")
        return n


def _to_int(knob: Knob, value: object) -> int:
    if isinstance(value, bool):
        raise UserError(f"knob {knob.name}: expected a number, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise UserError(f"knob {knob.name}: expected a whole number, got {value!r}")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if knob.type == "int" and re.fullmatch(r"[0-9]{1,20}", text):
            return int(text)
        m = _SIZE.match(text) if knob.type == "size" else None
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    what = "a size (e.g. 4MiB)" if knob.type == "size" else "a whole number"
    raise UserError(f"knob {knob.name}: expected {what}, got {str(value)[:40]!r}")


@dataclass(frozen=True, slots=True)
class Capabilities:
    kind: str
    modes: frozenset[str]
    kernel_mode_names: dict[str, str]  # backend-neutral mode -> what the kernel calls it
    drain: str  # how a drain is carried out, for humans and logs
    destructive: str  # what the destructive failure model means for this kind
    # A knob (seconds) for which a drain may have to wait before any write-back starts: bcache's write-back
    # thread sleeps writeback_delay after each full scan of the dirty keys and no sysfs write cuts that sleep
    # short (drivers/md/bcache/writeback.c, bch_writeback_thread). The engine bounds it under the destructive
    # model so that a drain fits its window.
    drain_sleep_knob: str | None = None
    # Whether the kind writes back recently written dirty blocks only once the device has been idle (no I/O for
    # a second): dm-cache (spare_migration_bandwidth() in drivers/md/dm-cache-target.c; under load smq and the
    # cleaner take only blocks behind a writeback sentinel, which move every WRITEBACK_PERIOD, 10 s, and a block
    # written again goes back to the end of the queue; in writethrough a write to a dirty block keeps it dirty).
    # Measured in the lab (6.1): with the cleaner loaded and 4 KiB random reads on the origin, the last 101 dirty
    # blocks stayed dirty 20.4 s; under the fileserver benchmark 9 blocks stayed dirty for the whole 29 s of a
    # drain; with the origin idle, 155 were clean within 2 s. The engine holds promotions (reads that keep the
    # device busy) while such a drain is at risk.
    drain_needs_idle: bool = False

    knob_table: tuple[Knob, ...] = ()  # the kind's knobs, as its module declares them (backends.kinds)

    def knobs(self) -> dict[str, Knob]:
        return {k.name: k for k in self.knob_table}


def capabilities(kind: str) -> Capabilities:
    """The capabilities a kind declares (backends/<kind>.py); UserError for a kind that is not in the table."""
    from cachepilot.backends import kinds  # the table loads the kind modules, which import this one

    return kinds.kind(kind).caps
