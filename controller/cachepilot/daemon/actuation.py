"""The daemon's one seam to the backends and actuators: open a backend for a volume, carry out a file-level action
(promotion, discard).

The real backends (``cachepilot.backends.open_backend``) and actuators (``cachepilot.actuators.discard`` /
``.promote``) are used when this build has them; until then a volume gets a read-only backend (samples through
``backends.inspect``; every control action fails with the reason, nothing is written) and file actions are
reported as not carried out. Nothing else in the daemon knows which is which.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.backends import inspect
from cachepilot.backends.base import FAILED, Backend, ControlAction, Outcome
from cachepilot.engine.actions import DiscardRanges, Promote
from cachepilot.errors import DeviceGone, UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample

NO_ACTUATORS = "not carried out: this build has no actuators for it yet"


class ReadOnlyBackend(Backend):
    """Samples the volume, changes nothing (the stand-in until the real backends are in this build)."""

    kind = "read-only"

    def sample(self, now_ns: int) -> VolumeSample:
        if not (self.sysfs_root / "block" / self.info.name).exists():
            raise DeviceGone(f"{self.info.name} vanished")
        try:
            return inspect.sample_volume(self.info)
        except DeviceGone:
            raise
        except UserError as exc:
            if not (self.sysfs_root / "block" / self.info.name).exists():
                raise DeviceGone(f"{self.info.name} vanished") from None
            raise exc

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        return Outcome(action, FAILED, dry_run=dry_run, detail=NO_ACTUATORS)

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


def open_backend(info: VolumeInfo, sysfs_root: Path = Path("/sys")) -> Backend:
    real = _optional("cachepilot.backends", "open_backend")
    if real is not None:
        return real(info, sysfs_root=sysfs_root)  # type: ignore[no-any-return]
    return ReadOnlyBackend(info, sysfs_root=sysfs_root)


FileAction = Promote | DiscardRanges


def carry_out(action: FileAction, info: VolumeInfo, dry_run: bool) -> Outcome:
    """Promote or discard through the actuators (``apply(action, info, dry_run=...) -> Outcome``)."""
    module = "cachepilot.actuators.promote" if isinstance(action, Promote) else "cachepilot.actuators.discard"
    fn = _optional(module, "apply")
    if fn is None:
        return Outcome(action, FAILED, dry_run=dry_run, detail=NO_ACTUATORS)  # type: ignore[arg-type]
    return fn(action, info, dry_run=dry_run)  # type: ignore[no-any-return]
