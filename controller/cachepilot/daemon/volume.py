"""One managed volume and the daemon's table of them.

A :class:`ManagedVolume` is the one per-volume object of the daemon: its backend (None: observe only), its file
actuators, the actions in flight and their retries, the work pacing deferred to the next tick, the cumulative
counts the exporter shows, and the engine's state of the same volume (``ctl``, the ``VolumeCtl`` the engine made when
it was adopted; the engine sits below the daemon, so that part is the engine's class). The daemon reads ``ctl`` for
status and changes it through engine methods only.

The :class:`VolumeTable` is the one index of them: by the filesystem's device (the engine's key), by kernel name
(the actions' ``volume``), by a device below the volume (where the probe sees discards land) and from the cached
device to the filesystem stacked on it (block-level events carry the former).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cachepilot.actions import FILE_ACTIONS, IMPORTED, Action, Attach, Drain, Promote
from cachepilot.backends.base import DONE, FAILED, PENDING, Backend, Outcome
from cachepilot.daemon import volumes
from cachepilot.engine.volumectl import VolumeCtl
from cachepilot.errors import CachepilotError, classify_errno
from cachepilot.events import Barrier, Discard, kdev_major_minor

NS = 1_000_000_000
BACKOFF_MAX_S = 60.0


def devname(dev: int) -> str:
    major, minor = kdev_major_minor(dev)
    return f"{major}:{minor}"


@dataclass
class ManagedVolume:
    found: volumes.Found
    backend: Backend | None  # None: observe only
    files: Any = None  # FileActuators: discards and promotions
    in_flight: dict[Any, dict[str, Any]] = field(default_factory=dict)  # action -> its decision (with writes)
    retries: list[tuple[int, int, Action]] = field(default_factory=list)  # (due ns, attempt, action)
    deferred: list[Action] = field(default_factory=list)  # what pacing left for the next tick
    last_sample: Any = None
    # cumulative, for the exporter
    promoted_bytes: int = 0
    discard_issued_bytes: int = 0
    discard_trimmed_bytes: int = 0
    discard_landed_bytes: int = 0
    barriers: int = 0
    drains: int = 0
    epoch_bytes: Any = None  # exporter HistogramAccumulator when the exporter is in this build
    ctl: VolumeCtl | None = None  # the engine's state of this volume (None only for a handle made outside adoption)

    @property
    def info(self) -> Any:
        return self.found.info

    @property
    def observe_only(self) -> bool:
        return self.backend is None

    def run(self, action: Action, dry_run: bool) -> Outcome:
        """Carry out one action: file actions by the actuators, the rest by the backend; errors become outcomes."""
        try:
            if isinstance(action, FILE_ACTIONS):
                return self.files.run(action, dry_run)  # type: ignore[no-any-return]
            assert self.backend is not None and not isinstance(action, Attach)  # attach: daemon/lifecycle.py
            return self.backend.apply(action, dry_run=dry_run)
        except CachepilotError as exc:
            return Outcome(action, FAILED, dry_run=dry_run, error=exc)
        except OSError as exc:
            what = str(exc.filename or action.kind)
            return Outcome(action, FAILED, dry_run=dry_run, error=classify_errno(exc.errno, what))

    def settle(self, out: Outcome, decision: dict[str, Any]) -> None:
        """Book an outcome: bytes moved, what pacing deferred, an operation now in flight, a drain done."""
        a = out.action
        if isinstance(a, FILE_ACTIONS):
            if not out.dry_run:
                self.discard_issued_bytes += out.issued_bytes
                self.discard_trimmed_bytes += out.trimmed_bytes
                self.promoted_bytes += out.read_bytes
            if out.deferred is not None:
                self.deferred.append(out.deferred)  # paced: the rest goes next tick
        elif out.status == PENDING:
            self.in_flight[a] = decision
        elif isinstance(a, Drain) and out.status == DONE and not out.dry_run:
            self.drains += 1

    def retry_later(self, now: int, attempt: int, action: Action) -> None:
        delay = min(BACKOFF_MAX_S, 2.0 ** attempt)
        self.retries.append((now + int(delay * NS), attempt + 1, action))

    def due_retries(self, now: int) -> list[tuple[int, Action]]:
        """The retries due by ``now`` (attempt, action), taken off the list."""
        due = [(attempt, action) for at, attempt, action in self.retries if at <= now]
        if due:
            self.retries = [r for r in self.retries if r[0] > now]
        return due

    def take_deferred(self, held: bool) -> list[Action]:
        """What pacing deferred, to carry out now; promotions stay deferred while ``held`` (a drain at risk)."""
        deferred, self.deferred = self.deferred, []
        if held:
            self.deferred = [a for a in deferred if isinstance(a, Promote)]
            return [a for a in deferred if not isinstance(a, Promote)]
        return deferred

    def importing(self) -> int:
        """Files of an imported hot list not re-warmed yet: in the promotion queue (while its credit lasts: it lets
        them all out at the next tick) or being read (the rounds, the reader threads, the budget: deferred)."""
        c = self.ctl
        queued = len(c.promo_queue) if c is not None and c.import_credit else 0
        return queued + sum(1 for a in self.deferred if isinstance(a, Promote) and IMPORTED in a.reason)

    def forget(self) -> None:
        """After a restore: nothing is in flight or to be retried any more."""
        self.in_flight.clear()
        self.retries.clear()

    def saw(self, ev: Any, below: bool) -> None:
        """Count a probe event for the exporter (``below``: it landed on a device below the volume)."""
        if below and isinstance(ev, Discard):
            self.discard_landed_bytes += ev.nr_sectors * 512
        elif not below and isinstance(ev, Barrier) and ev.closes_epoch:
            self.barriers += 1
            if self.epoch_bytes is not None:
                self.epoch_bytes.observe(ev.epoch_bytes)


class VolumeTable(Mapping[int, ManagedVolume]):
    """The managed volumes by the filesystem's device, with the other indexes kept in step on add and pop."""

    def __init__(self) -> None:
        self._by_dev: dict[int, ManagedVolume] = {}
        self._by_name: dict[str, ManagedVolume] = {}
        self._by_lower: dict[int, int] = {}  # a device below a volume -> the volume's dev
        self._remap: dict[int, int] = {}  # cached device -> the filesystem stacked on it (the engine's key)

    def __getitem__(self, dev: int) -> ManagedVolume:
        return self._by_dev[dev]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_dev)

    def __len__(self) -> int:
        return len(self._by_dev)

    def add(self, v: ManagedVolume) -> None:
        f = v.found
        self._by_dev[f.info.dev] = v
        self._by_name[f.info.name] = v
        for low in f.lower:
            self._by_lower[low] = f.info.dev
        if f.block_dev is not None:  # block-level events carry the cached device; the engine knows the filesystem's
            self._remap[f.block_dev] = f.info.dev

    def pop(self, dev: int) -> ManagedVolume | None:
        v = self._by_dev.pop(dev, None)
        if v is None:
            return None
        if self._by_name.get(v.info.name) is v:
            del self._by_name[v.info.name]
        for low in v.found.lower:
            self._by_lower.pop(low, None)
        self._remap.pop(v.found.volume_dev, None)
        return v

    def named(self, name: str) -> ManagedVolume | None:
        return self._by_name.get(name)

    def route(self, ev: Any) -> Any:
        """An event as the engine keys it (a block event's cached device -> its filesystem), counted on its
        volume."""
        dev = getattr(ev, "dev", None)
        if dev is None:
            return ev
        to = self._remap.get(dev)
        if to is not None:
            ev = replace(ev, dev=to)
            dev = to
        if isinstance(ev, Discard):
            v = self._by_dev.get(self._by_lower.get(dev, -1))
            if v is not None:
                v.saw(ev, below=True)
        else:
            v = self._by_dev.get(dev)
            if v is not None:
                v.saw(ev, below=False)
        return ev
