"""The daemon's one seam to the backends and actuators: open a backend for a volume, and the file-level actuators
(discards, promotions) of a volume.

Backends come from ``cachepilot.backends.open_backend``; a volume of a kind it does not know gets a read-only
backend (samples through ``backends.inspect``; every control action fails with the reason, nothing is written).
Discards go through ``cachepilot.actuators.discard.Discarder`` (FITRIM of each freed range, paced), promotions
through ``cachepilot.actuators.promote.Promoter`` (reads by handle, paced); both defer what pacing does not allow
now. A build without them reports those actions as not carried out.
Nothing else in the daemon knows which is which.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from cachepilot.actions import DiscardRanges, Promote
from cachepilot.backends import inspect
from cachepilot.backends.base import FAILED, Backend, ControlAction, Outcome
from cachepilot.backends.host import Host
from cachepilot.errors import DeviceGone, UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample

NO_ACTUATOR = "not carried out: this build has no actuator for it yet"
PROMOTE_WORKERS = 8  # files read at once by a volume's promoter, off the loop (actuators/readpool.py)


class ReadOnlyBackend(Backend):
    """Samples the volume, changes nothing (for a kind without a backend in this build)."""

    kind = "read-only"

    def sample(self, now_ns: int) -> VolumeSample:
        if not (self.sysfs_root / "block" / self.info.name).exists():
            raise DeviceGone(f"{self.info.name} vanished")
        try:
            return inspect.sample_volume(self.info, host=self.host)
        except DeviceGone:
            raise
        except UserError:
            if not (self.sysfs_root / "block" / self.info.name).exists():
                raise DeviceGone(f"{self.info.name} vanished") from None
            raise

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        return Outcome(action, FAILED, dry_run=dry_run, detail=NO_ACTUATOR)

    def step(self, now_ns: int) -> list[Outcome]:
        return []

    def pending(self) -> list[ControlAction]:
        return []

    def restore(self) -> list[Outcome]:
        return []


def _optional(module: str, name: str) -> Callable[..., Any] | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return getattr(mod, name, None)


def has_real_backends() -> bool:
    return _optional("cachepilot.backends", "open_backend") is not None


def open_backend(info: VolumeInfo, host: Host | None = None) -> Backend:
    real = _optional("cachepilot.backends", "open_backend")
    if real is not None:
        try:
            return real(info, host=host)  # type: ignore[no-any-return]
        except UserError:
            pass  # a kind without a backend: watch it read-only
    return ReadOnlyBackend(info, host=host)


class FileActuators:
    """One volume's discarder (its token bucket lives across ticks) and promoter."""

    def __init__(self, info: VolumeInfo, discard_max_rate: int, promote_rate: int) -> None:
        self.info = info
        discarder = _optional("cachepilot.actuators.discard", "Discarder")
        self.discarder = discarder(info, max_rate=discard_max_rate) if discarder else None
        promoter = _optional("cachepilot.actuators.promote", "Promoter")
        self.promoter = promoter(info, rate=promote_rate, workers=PROMOTE_WORKERS) if promoter else None

    def run(self, action: Promote | DiscardRanges, dry_run: bool) -> Outcome:
        if isinstance(action, DiscardRanges):
            if self.discarder is None:
                return Outcome(action, FAILED, dry_run=dry_run, detail=NO_ACTUATOR)
            out: Outcome = self.discarder.run(action, dry_run=dry_run)
            return out
        if self.promoter is None:
            return Outcome(action, FAILED, dry_run=dry_run, detail=NO_ACTUATOR)
        out = self.promoter.run(action, dry_run=dry_run)
        return out

    def close(self) -> None:
        """Stop the promoter's reader threads: the daemon stops, or the volume is gone (a paced read of a large file
        runs minutes at a low rate; its threads would keep the process, or read a device no longer managed)."""
        if self.promoter is not None:
            self.promoter.close()
