"""The table of cache kinds (tuned's plugin repository): every module ``cachepilot/backends/<kind>.py`` that
declares ``KIND = Kind(...)`` is a kind of cache. Discovery, the backends, promotion, the trace format, the
policy checker and the policy schema read this table; adding a kind is adding one module (and its tests).

A kind declares its name, its capabilities (write modes, drain, knobs), ``detect`` (is this block device one of
mine?), ``describe`` (its cache's size and identity), ``sample`` (one reading of its state), its backend class and
its knobs as declared get/set pairs (:class:`KnobDef`). The declaration is checked when the module is imported.
The modules are loaded on the first look-up, so the modules that only read the table (engine, policy, trace) do
not import the backends.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cachepilot.backends.capabilities import Capabilities, Knob
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample

if TYPE_CHECKING:
    from cachepilot.backends.base import Backend
    from cachepilot.backends.host import BlockDev, Host
    from cachepilot.backends.operation import Setting

KNOB_TYPES = ("int", "size")


@dataclass(frozen=True)
class KnobDef:
    """A knob of a kind: its type and range (:class:`Knob`) and its get/set pair on a backend instance."""

    knob: Knob
    setting: Callable[[Any], Setting]  # backend -> Setting (get, put, matches)


@dataclass(frozen=True)
class Described:
    """What ``describe`` reads of a volume's cache."""

    cache_bytes: int
    cache_id: str  # changes when the cache device is replaced (ends a failure latch)


@dataclass(frozen=True)
class Kind:
    name: str
    caps: Capabilities
    backend: type[Backend]
    detect: Callable[[BlockDev], bool]
    describe: Callable[[Host, BlockDev], Described]
    sample: Callable[[Host, VolumeInfo, int], VolumeSample]
    knobs: tuple[KnobDef, ...] = ()
    promote_rounds: int = 1  # rounds of promotion reads the cache needs before it admits a block (0: never)
    device_prefix: str = "dm-"  # how the kernel names its devices (what a policy's device glob can match)
    precedence: int = 0  # detect is asked in descending precedence (a more specific kind before a general one)
    settings: dict[str, Callable[[Any], Setting]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """The declaration's own checks: a kind that breaks one fails at import, not at its first write."""
        names = [k.knob.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise TypeError(f"kind {self.name}: a knob is declared twice: {names}")
        for k in self.knobs:
            if k.knob.type not in KNOB_TYPES or k.knob.min > k.knob.max or not callable(k.setting):
                raise TypeError(f"kind {self.name}: knob {k.knob.name} is not a typed, ranged get/set pair")
        if self.caps.drain_sleep_knob is not None and self.caps.drain_sleep_knob not in names:
            raise TypeError(f"kind {self.name}: drain_sleep_knob {self.caps.drain_sleep_knob} is not a knob of it")
        if not self.caps.modes <= set(self.caps.kernel_mode_names):
            raise TypeError(f"kind {self.name}: a write mode without a kernel name")
        if getattr(self.backend, "kind", None) != self.name:
            raise TypeError(f"kind {self.name}: its backend {self.backend.__name__} says {self.backend.kind!r}")
        knobs = tuple(replace(k.knob, kinds=frozenset({self.name})) for k in self.knobs)
        object.__setattr__(self, "caps", replace(self.caps, kind=self.name, knob_table=knobs))
        object.__setattr__(self, "settings", {k.knob.name: k.setting for k in self.knobs})


def knob(name: str, typ: str, lo: int, hi: int, unit: str, doc: str) -> Knob:
    """A knob's type and range, for a kind's :class:`KnobDef` (its kinds are filled in by the table)."""
    return Knob(name, frozenset(), typ, lo, hi, unit, doc)


_TABLE: dict[str, Kind] = {}
_KNOBS: dict[str, Knob] = {}


def _load() -> dict[str, Kind]:
    if _TABLE:
        return _TABLE
    import cachepilot.backends as pkg

    found: list[Kind] = []
    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        declared = getattr(importlib.import_module(f"{pkg.__name__}.{mod}"), "KIND", None)
        if isinstance(declared, Kind):
            found.append(declared)
    table = {k.name: k for k in found}
    if len(table) != len(found):
        raise TypeError(f"two cache kinds with one name: {[k.name for k in found]}")
    _check_knobs(found)
    _TABLE.update(table)
    return _TABLE


def _check_knobs(found: list[Kind]) -> None:
    """A knob name means one thing: kinds that share one (dm-cache and lvmcache) declare it alike."""
    seen: dict[str, Knob] = {}
    for k in found:
        for d in k.knobs:
            other = seen.setdefault(d.knob.name, d.knob)
            if (other.type, other.min, other.max, other.unit) != (d.knob.type, d.knob.min, d.knob.max, d.knob.unit):
                raise TypeError(f"knob {d.knob.name} is declared differently by two kinds")


def table() -> dict[str, Kind]:
    """Every kind, in a stable order (by module name)."""
    return dict(_load())


def names() -> tuple[str, ...]:
    return tuple(_load())


def get(name: str) -> Kind | None:
    return _load().get(name)


def kind(name: str) -> Kind:
    """The kind called ``name``; UserError naming the known ones otherwise."""
    k = get(name)
    if k is None:
        raise UserError(f"unknown cache kind {name!r} (known: {', '.join(names())})")
    return k


def capabilities_table() -> dict[str, Capabilities]:
    return {n: k.caps for n, k in _load().items()}


def all_knobs() -> dict[str, Knob]:
    """Every knob of every kind by name, its ``kinds`` the kinds that have it (declaration order)."""
    if _KNOBS:
        return _KNOBS
    out: dict[str, Knob] = {}
    for k in _load().values():
        for d in k.knobs:
            have = out.get(d.knob.name)
            kinds = (have.kinds if have else frozenset()) | {k.name}
            out[d.knob.name] = replace(d.knob, kinds=kinds)
    _KNOBS.update(out)
    return _KNOBS


def by_precedence() -> list[Kind]:
    return sorted(_load().values(), key=lambda k: -k.precedence)


def detect(dev: BlockDev) -> Kind | None:
    """The kind of a block device, or None if it is not a cache of any known kind."""
    return next((k for k in by_precedence() if k.detect(dev)), None)
