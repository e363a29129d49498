"""The table of cache kinds (tuned's plugin repository), its working half: every module
``cachepilot/backends/<kind>.py`` that declares ``KIND = Kind(...)`` is a kind of cache. Discovery, describe,
samples, the one set-knob path and the backends' construction read this table.

A kind's declarative half (its name, write modes, drain, knobs with type and range, promotion rounds, device
prefix) is its entry in ``cachepilot.capabilities``, below the engine and the backends, so that the engine,
promotion, the policy checker, the schema and the trace format read it without importing a backend. Here a kind
adds ``detect`` (is this block device one of mine?), ``describe`` (its cache's size and identity), ``sample`` (one
reading of its state), its backend class and a get/set pair for each declared knob (:class:`KnobDef`). The
declaration is checked when the module is imported, and the loaded table against the declarative one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachepilot.capabilities import CAPABILITIES, Capabilities, capabilities
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample

if TYPE_CHECKING:
    from cachepilot.actions import Write
    from cachepilot.backends.host import BlockDev, Host
    from cachepilot.backends.operation import OperationBackend, Setting

@dataclass(frozen=True)
class KnobDef:
    """A knob of a kind: its name (declared with its type and range in ``cachepilot.capabilities``) and its
    get/set pair on a backend instance."""

    name: str
    setting: Callable[[Any], Setting]  # backend -> Setting (get, put, matches)


@dataclass(frozen=True)
class Described:
    """What ``describe`` reads of a volume's cache."""

    cache_bytes: int
    cache_id: str  # changes when the cache device is replaced (ends a failure latch)
    # The smallest discard (bytes) that changes what the cache writes back; a smaller one is lost on it
    # (VolumeInfo.discard_unit).
    discard_unit: int = 512


@dataclass(frozen=True)
class Reattach:
    """How a kind puts a cache back under a device whose cache ``cachepilot detach`` took away (issue 36), and what
    the detach saved for it (daemon/lifecycle.py)."""

    what: str  # what the CACHE argument is, for people
    valid: Callable[[str], bool]  # a CACHE argument of the right form (nothing of it reaches a shell)
    attach: Callable[[Host, str, str, str], Write]  # (host, kernel name, dm name or "", cache) -> the read-back Write
    saved: Callable[[str, tuple[Write, ...]], str]  # (cache id, the Detach's writes) -> the CACHE attach puts back


@dataclass(frozen=True)
class Kind:
    name: str
    backend: type[OperationBackend]
    detect: Callable[[BlockDev], bool]
    describe: Callable[[Host, BlockDev], Described]
    sample: Callable[[Host, VolumeInfo, int], VolumeSample]
    knobs: tuple[KnobDef, ...] = ()
    precedence: int = 0  # detect is asked in descending precedence (a more specific kind before a general one)
    # one get/set pair for several of its knobs at once (backend, knobs) -> Setting (operation.grouped), where
    # changing them one by one costs more than once (dm-writecache: a table reload suspends the device each time)
    group: Callable[[Any, tuple[str, ...]], Setting] | None = None
    # the devices of a volume's cache the kernel does not list among the volume's slaves (host, volume name) ->
    # their dev numbers (bcache: the cache set's cache device)
    cache_devices: Callable[[Host, str], tuple[int, ...]] = lambda host, name: ()  # noqa: ARG005 (none)
    reattach: Reattach | None = None  # `cachepilot attach` (None: the kind cannot)
    caps: Capabilities = field(init=False)  # the declarative half (cachepilot.capabilities)
    settings: dict[str, Callable[[Any], Setting]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """The declaration's own checks: a kind that breaks one fails at import, not at its first write."""
        object.__setattr__(self, "caps", capabilities(self.name))
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise TypeError(f"kind {self.name}: a knob is given twice: {names}")
        declared = set(self.caps.knobs())
        if set(names) != declared or not all(callable(k.setting) for k in self.knobs):
            raise TypeError(f"kind {self.name}: get/set pairs for {sorted(names)}, but it declares {sorted(declared)}")
        if getattr(self.backend, "kind", None) != self.name:
            raise TypeError(f"kind {self.name}: its backend {self.backend.__name__} says {self.backend.kind!r}")
        object.__setattr__(self, "settings", {k.name: k.setting for k in self.knobs})

    def open(self, info: VolumeInfo, host: Host | None = None) -> OperationBackend:
        """The backend of one volume of this kind, built with its kind (its knobs' get/set pairs, its group)."""
        return self.backend(info, host=host, kind=self)

    @property
    def promote_rounds(self) -> int:
        return self.caps.promote_rounds

    @property
    def device_prefix(self) -> str:
        return self.caps.device_prefix


_TABLE: dict[str, Kind] = {}


def _load() -> dict[str, Kind]:
    if _TABLE:
        return _TABLE
    found: list[Kind] = []  # this package's modules, by path: the package's __init__ imports this module
    for mod in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        declared = getattr(importlib.import_module(f"{__package__}.{mod}"), "KIND", None)
        if isinstance(declared, Kind):
            found.append(declared)
    table = {k.name: k for k in found}
    if len(table) != len(found):
        raise TypeError(f"two cache kinds with one name: {[k.name for k in found]}")
    check_declared(table, CAPABILITIES)
    _TABLE.update(table)
    return _TABLE


def check_declared(table: dict[str, Kind], declared: dict[str, Capabilities]) -> None:
    """Every kind declared in cachepilot.capabilities has its module here, and no module declares a kind that is
    not declared there."""
    if set(table) != set(declared):
        raise TypeError(f"kinds with a module {sorted(table)} are not the kinds declared {sorted(declared)}")


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


def by_precedence() -> list[Kind]:
    return sorted(_load().values(), key=lambda k: -k.precedence)


def detect(dev: BlockDev) -> Kind | None:
    """The kind of a block device, or None if it is not a cache of any known kind."""
    return next((k for k in by_precedence() if k.detect(dev)), None)
