"""Adopting and dropping volumes: each rescan compares what discovery finds (and the configured observe-only
filesystems) with the managed volumes; a volume that vanished or changed is dropped (its unfinished operations put
back where the device still answers), a new one adopted: its backend opened, the engine told, the probe asked to
watch it, its latch and hot list restored from the state file. A cached volume that cannot be managed is kept in
``unmanaged`` with a reason word (exporter.snapshot.UNMANAGED_REASONS): a metric and an alert, not only a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from cachepilot.backends.base import Backend
from cachepilot.daemon import pinning, volumes
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.guard import Guard
from cachepilot.daemon.lifecycle import Detached
from cachepilot.daemon.persist import Persistence
from cachepilot.daemon.volume import ManagedVolume, VolumeTable, devname
from cachepilot.engine.engine import Engine
from cachepilot.errors import CachepilotError, UserError

log = logging.getLogger("cachepilot")

Discover = Callable[[], tuple[list[volumes.Found], list[str]]]
BackendFactory = Callable[[Any], Backend]
ActuatorsFactory = Callable[[Any, int, int], Any]  # (info, discard max rate, promote rate) -> .run(action, dry)


def no_cache(f: volumes.Found) -> bool:
    """A cached device with no cache behind it (describe reads a cache of 0 bytes: bcache with no cache set)."""
    return f.info.kind != volumes.OBSERVE and f.info.cache_bytes == 0


def cache_unreadable(f: volumes.Found, v: ManagedVolume) -> bool:
    """The same volume whose cache now reads 0 bytes and nothing else changed: a failed dm-cache reports "Fail" with
    no figures. It stays the volume it was (its latch, its samples: the dirty data it held before it failed, which a
    detach would lose); dropping and adopting it again would start it afresh, knowing none of that."""
    return f.info.cache_bytes == 0 and replace(f.info, cache_bytes=v.info.cache_bytes) == v.info

class Adopter:
    def __init__(self, engine: Engine, vols: VolumeTable, counters: Counters, guard: Guard, persist: Persistence,
                 *, discover: Discover, backend_factory: BackendFactory, actuators_factory: ActuatorsFactory,
                 epochs: bool) -> None:
        self.engine = engine
        self.vols = vols
        self.counters = counters
        self.guard = guard
        self.persist = persist
        self.discover = discover
        self.backend_factory = backend_factory
        self.actuators_factory = actuators_factory
        self.epochs = epochs  # the exporter is configured: count bytes per epoch
        self.pins = pinning.PinWalks()  # pin walks off the loop thread; the daemon collects them every tick
        self.probe: Any = None  # set once loaded
        # Cached volumes found but not managed, refound at every rescan: kernel name -> (volume label, reason word
        # of exporter.snapshot.UNMANAGED_REASONS). Each is a metric and an alert, not only a log line said once.
        self.unmanaged: dict[str, tuple[str, str]] = {}
        # Cached devices found with no cache behind them (a bcache device with no cache set: `state` "no cache"),
        # refound at every rescan: not managed and not alerted on -- nothing to steer, nothing at risk; status lists
        # them (daemon/lifecycle.py), `cachepilot attach` puts a cache back.
        self.uncached: dict[str, Detached] = {}
        # whether `cachepilot detach` released this device (daemon/lifecycle.py's records; set by the daemon)
        self.released: Callable[[str], bool] = lambda name: False
        self._said_observe_only = False

    def rescan(self, now: int, observe: Iterable[str]) -> None:
        found, problems = self.discover()
        self.unmanaged, self.uncached = {}, {}
        managed_before = set(self.vols)
        for p in problems:
            self.guard.once(f"volume not adopted: {p}")
            name = p.partition(": ")[0]  # discover's problems are "<kernel name>: <why>"
            self.unmanaged[name] = (name, "describe")
        want: dict[int, volumes.Found] = {f.info.dev: f for f in found}
        for spec in observe:
            try:
                f = volumes.observed(spec)
            except UserError as exc:
                self.guard.once(str(exc))
                continue
            want.setdefault(f.info.dev, f)
        for dev in [d for d in self.vols if d not in want]:
            self.drop(dev, "vanished")
        for dev in [d for d, v in self.vols.items() if want[d].info != v.info and not cache_unreadable(want[d], v)]:
            self.drop(dev, f"changed (now {want[dev].info.kind}, mounted at {want[dev].info.mountpoint!r})")
        for dev, f in want.items():
            if dev in self.vols:
                continue
            if no_cache(f) and dev not in managed_before and (self.released(f.info.name)
                                                               or self.persist.saved_volume(f.info) is None):
                # A managed volume that lost its cache (a failed cache device bcache unregistered) is adopted again
                # as before, to be latched and alerted on -- also when it was lost while the daemon was down (the
                # last run's state file has it); one released after a detach, or never managed, is not.
                self.uncached[f.info.name] = Detached(f.info.name, f.label, f.info.kind, "", "no cache")
                continue
            self.adopt(f, now)
        cached = [v for v in self.vols.values() if not v.observe_only]
        if not cached and not self._said_observe_only:
            self._said_observe_only = True
            log.warning("no cached volume on this host: observe-only (nothing will be changed)")
        elif cached:
            self._said_observe_only = False

    def adopt(self, f: volumes.Found, now: int) -> None:
        info = f.info
        backend = None
        if info.kind != volumes.OBSERVE:
            try:
                backend = self.backend_factory(info)
            except CachepilotError as exc:
                self.guard.once(f"{info.name}: cannot open its backend: {exc}")
                self.unmanaged[info.name] = (f.label, "backend")
                return
        try:
            ctl = self.engine.add_volume(info)
        except UserError as exc:  # e.g. the volume matches overlapping rules: keep going without it
            self.guard.once(f"{info.name}: not adopted: {exc}")
            self.unmanaged[info.name] = (f.label, "policy")
            return
        if not self.watch(f):
            self.engine.remove_volume(info.dev)
            self.unmanaged[info.name] = (f.label, "watch")
            return
        self.unmanaged.pop(info.name, None)
        v = ManagedVolume(f, backend, ctl=ctl)
        if backend is not None:
            v.files = self.actuators_factory(info, ctl.policy.discard_on_delete.max_rate, ctl.policy.promotion.rate)
        if self.epochs:
            try:
                from cachepilot.exporter import EPOCH_BUCKETS, HistogramAccumulator
                v.epoch_bytes = HistogramAccumulator(EPOCH_BUCKETS)
            except ImportError:
                pass
        self.vols.add(v)
        self.counters["volumes.adopted"] += 1
        how = "observe only" if v.observe_only else info.kind
        stack = f", filesystem on {devname(info.dev)} stacked on it" if f.block_dev is not None else ""
        log.info("adopted %s (%s, %s%s, mounted at %r)", info.name, how, devname(f.volume_dev), stack,
                 info.mountpoint)
        self.persist.adopted(v, now)
        self.pins.submit(self.engine, info)

    def watch_all(self) -> None:
        """The probe just loaded: watch every volume adopted before it."""
        for dev, v in list(self.vols.items()):
            if not self.watch(v.found):
                self.drop(dev, "cannot be watched")
                if not v.observe_only:
                    self.unmanaged[v.info.name] = (v.found.label, "watch")

    def watch(self, f: volumes.Found) -> bool:
        """Ask the probe (if loaded) to watch a volume; False (said once) if it cannot."""
        if self.probe is None:
            return True
        try:
            fs_dev = f.info.dev if f.block_dev is not None else None
            self.probe.watch_volume(f.volume_dev, fs_dev=fs_dev, lower=f.lower)
        except (UserError, OSError) as exc:
            self.guard.once(f"{f.info.name}: cannot watch it: {exc}")
            return False
        return True

    def drop(self, dev: int, why: str) -> None:
        v = self.vols.pop(dev)
        if v is None:
            return
        cancelled = len(v.in_flight) + len(v.retries)
        if v.backend is not None:
            try:
                v.backend.restore()
            except CachepilotError:
                pass  # it is gone: nothing to put back
        close = getattr(v.files, "close", None)
        if close is not None:
            close()
        self.engine.remove_volume(dev)
        if self.probe is not None:
            self.probe.unwatch(v.found.volume_dev)
        self.counters["volumes.dropped"] += 1
        log.warning("dropped %s: %s; %d pending action(s) cancelled", v.info.name, why, cancelled)
