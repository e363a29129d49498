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
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cachepilot.backends.capabilities import Capabilities, capabilities
from cachepilot.backends.host import DmRunner, Host
from cachepilot.engine.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.errors import CachepilotError
from cachepilot.models.volume import VolumeInfo, VolumeSample

ControlAction = SetWritePolicy | SetKnob | Drain

__all__ = ["DONE", "FAILED", "PENDING", "Backend", "ControlAction", "DmRunner", "Outcome", "Write"]

DONE, PENDING, FAILED = "done", "pending", "failed"


@dataclass(frozen=True, slots=True)
class Write:
    """One control write: where, the value before, the value written, and what the kernel read back."""

    target: str  # e.g. "bcache0 cache_mode" or "lab-cached message 0 flush" (names only, never from events)
    before: str
    value: str
    readback: str


@dataclass(frozen=True, slots=True)
class Outcome:
    action: ControlAction
    status: str  # DONE | PENDING | FAILED
    dry_run: bool = False
    writes: tuple[Write, ...] = ()
    error: CachepilotError | None = None
    detail: str = ""

    def line(self, action_line: str | None = None) -> str:
        """The outcome for a log; ``action_line`` is the action's own line when the caller has it already."""
        what = "; ".join(f"{w.target}: {w.before} -> {w.value} (read back {w.readback})" for w in self.writes)
        err = f" error[{self.error.kind}]: {self.error}" if self.error else ""
        dry = " (dry run)" if self.dry_run else ""
        head = self.action.line() if action_line is None else action_line
        return f"{head} => {self.status}{dry}{': ' + what if what else ''}{err}"


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
