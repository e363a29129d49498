"""The backend contract: one class per kind of stock cache, one instance per volume (tuned's plugin shape).

A backend reads its volume (``sample``), says what it can do (``caps``) and carries out the engine's control
actions (``apply``): write-policy switches, knob settings and drains. Every control write is a :class:`Write`:
the value before, the value written, and what the kernel reads back afterwards; a write that does not read back
as requested is a failure. ``apply(..., dry_run=True)`` runs the same code path and returns the writes it would
make, writing nothing.

Some actions take time (a drain waits for dirty data to reach zero; writeback→writethrough drains first). Those
return an :class:`Outcome` with status ``pending``; the daemon calls ``step`` every tick, which advances them and
returns the outcomes that finished (``done``) or failed. ``restore`` puts back what unfinished operations saved
(e.g. bcache's ``writeback_percent`` raised to 0 for a drain) so that a stopping daemon leaves every cache in a
safe, stable state.

The host (its sysfs root and dmsetup runner, backends.host) is a constructor parameter, so unit tests run on
fixture trees and fakes.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import ClassVar

from cachepilot.actions import DONE, FAILED, PENDING, SKIPPED, ControlAction, Outcome, Write
from cachepilot.backends.host import DmRunner, Host
from cachepilot.capabilities import Capabilities, capabilities
from cachepilot.models.volume import VolumeInfo, VolumeSample

__all__ = ["DONE", "FAILED", "PENDING", "SKIPPED", "Backend", "ControlAction", "DmRunner", "Outcome", "Write"]


class Backend(abc.ABC):
    kind: ClassVar[str]

    def __init__(self, info: VolumeInfo, *, host: Host | None = None) -> None:
        self.info = info
        self.host = Host() if host is None else host

    @property
    def sysfs_root(self) -> Path:
        return self.host.sysfs

    @property
    def caps(self) -> Capabilities:
        return capabilities(self.kind)

    @abc.abstractmethod
    def sample(self, now_ns: int) -> VolumeSample:
        """One reading of the volume's state. DeviceGone if it vanished."""

    @abc.abstractmethod
    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        """Carry out (or, dry, describe) a control action; never raises for an expected condition."""

    @abc.abstractmethod
    def step(self, now_ns: int) -> list[Outcome]:
        """Advance pending operations; return those that finished or failed since the last call."""

    @abc.abstractmethod
    def pending(self) -> list[ControlAction]:
        """Actions still in progress."""

    @abc.abstractmethod
    def restore(self) -> list[Outcome]:
        """Abandon pending operations, putting back every value they saved; the cache is left safe and stable."""

    def io_failed(self) -> None:
        """The volume answered one of the daemon's own I/Os (a promotion read, a FITRIM) with an I/O error: its
        cache device may have died. Default: nothing (a kind whose status shows that at once)."""
        return

    def steered_knobs(self) -> dict[str, tuple[str, str]]:
        """Knobs :meth:`restore` would put back: knob -> (the value found before the first steer, the value last
        written). The state file keeps them so that a daemon killed before it could restore puts them back at its
        next start. Default: none."""
        return {}
