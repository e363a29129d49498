"""Which devices the kernel watches: each volume's devices (the volume, its filesystem's device, the devices below it)
with their roles, placed in the kernel's open-addressed "watched" table and published as a whole (two halves, a grace
period between)."""

from __future__ import annotations

import ctypes as C
import itertools
import random
from collections.abc import Callable, Iterable

from cachepilot import bpf_layout as L
from cachepilot.errors import UserError
from cachepilot.mountinfo import ProcMounts
from cachepilot.probe.counters import VolumeCounters
from cachepilot.probe.kconfig import KernelConfig

STACKED, NOT_EXT4 = "stacked volume", "not ext4"  # what makes a deferred program attach (Loader.attach_deferred)


def watch_home(dev: int, mul: int) -> int:
    """dev's first index in a half of the kernel's watched table (find_watch in bpf/common.bpf.h)."""
    return ((dev * mul) & 0xFFFFFFFF) >> (32 - L.WATCH_BITS)


def _place(devs: list[int], mul: int) -> dict[int, int] | None:
    """Linear probing as find_watch reads it (from the home index, at most WATCH_PROBES entries, an empty one ends
    the search): dev -> index, or None if some device does not fit."""
    at: dict[int, int] = {}
    taken: set[int] = set()
    for d in devs:
        home = watch_home(d, mul)
        k = next((k for k in ((home + i) % L.WATCH_SLOTS for i in range(L.WATCH_PROBES)) if k not in taken), None)
        if k is None:
            return None
        at[d] = k
        taken.add(k)
    return at


def watch_layout(devs: Iterable[int], current: int) -> tuple[int, dict[int, int]]:
    """An odd multiplier and each device's index under it: the current multiplier if everything still fits. At
    most 256 devices in 1024 entries with 4 probes each: a random multiplier fits within a few tries."""
    order = sorted(devs)
    if len(order) > L.WATCH_SLOTS // 4:
        raise UserError(f"too many watched devices ({len(order)}; at most {L.WATCH_SLOTS // 4})")
    rng = random.Random(len(order))  # noqa: S311 - a hash multiplier, not a secret
    candidates = itertools.chain([current | 1] if current else [], (rng.getrandbits(32) | 1 for _ in range(10_000)))
    for mul in candidates:
        at = _place(order, mul)
        if at is not None:
            return mul, at
    raise UserError(f"cannot place {len(order)} watched devices in the kernel's table of {L.WATCH_SLOTS}")


class WatchTable:
    """The watched devices (``volumes``: every watched device -> its watch entry) and each volume's slot in the
    kernel's "volumes" array (``slots``, the probe's, shared with its counters). ``attach_deferred(trigger)`` attaches
    the programs a watch needs (STACKED, NOT_EXT4)."""

    def __init__(self, config: KernelConfig, counters: VolumeCounters, slots: dict[int, int], mounts: ProcMounts,
                 attach_deferred: Callable[[str], None]) -> None:
        self._config = config
        self._counters = counters
        self._slots = slots
        self.mounts = mounts
        self._attach_deferred = attach_deferred
        self.volumes: dict[int, L.cp_watch] = {}  # every watched device -> its watch entry
        self._half_used: list[set[int]] = [set(), set()]  # occupied indexes of each half of the kernel's table
        self._members: dict[int, dict[int, int]] = {}  # watched device -> {volume dev: its roles for that volume}
        self._fs_of: dict[int, int] = {}  # volume dev -> the s_dev of its filesystem (itself, or stacked on it)

    def watch_volume(self, dev: int, *, fs_dev: int | None = None, lower: Iterable[int] = ()) -> None:
        """Watch a cached volume: `dev` the cached block device (kernel dev_t), `fs_dev` the s_dev of the filesystem
        on it (defaults to dev; a device stacked on the volume — LVM, dm-linear, dm-crypt, a direct-I/O loop device —
        when the filesystem is there), `lower` its backing and cache devices (their discards are reported and counted
        for every volume they belong to)."""
        new = dev not in self._slots
        fs_before = self._fs_of.get(dev)
        if new:
            free = sorted(set(range(L.MAX_VOLUMES)) - set(self._slots.values()))
            if not free:
                raise UserError(f"too many watched volumes (at most {L.MAX_VOLUMES})")
            self._slots[dev] = free[0]
            self._counters.fresh(dev, free[0])
        self._fs_of[dev] = dev if fs_dev is None else fs_dev
        if self._fs_of[dev] != dev:
            self._attach_deferred(STACKED)
        if self.mounts.fs_type(self._fs_of[dev]) != "ext4":
            self._attach_deferred(NOT_EXT4)
        touched = {dev: L.ROLE_VOLUME}
        touched[self._fs_of[dev]] = touched.get(self._fs_of[dev], 0) | L.ROLE_FS
        for low in lower:
            touched[low] = touched.get(low, 0) | L.ROLE_LOWER
        members = {d: dict(of) for d, of in self._members.items()}
        watches = dict(self.volumes)
        for d, roles in touched.items():
            of = self._members.setdefault(d, {})
            of[dev] = of.get(dev, 0) | roles
            self._sync_watch(d)
        try:
            self._publish_watches()  # once for all of this volume's devices (a grace period each time)
        except UserError:  # the kernel's table is full: it still holds the old watches, and so do we
            self._members, self.volumes = members, watches
            if new:
                self._forget_volume(dev)
            elif fs_before is not None:
                self._fs_of[dev] = fs_before
            raise

    def _sync_watch(self, d: int) -> None:
        """Device d's entry from every volume it belongs to (a cache device may serve several); the kernel gets the
        entries at the next _publish_watches()."""
        of = self._members.get(d)
        if not of:
            self._members.pop(d, None)
            self.volumes.pop(d, None)
            return
        # the entry's own volume: the one it is the volume or the filesystem of, else the first it is below
        primary = min(of, key=lambda v: (not of[v] & (L.ROLE_VOLUME | L.ROLE_FS), self._slots[v]))
        lower_of = sum(1 << self._slots[v] for v, r in of.items() if r & L.ROLE_LOWER)
        roles = 0
        for r in of.values():
            roles |= r
        w = L.cp_watch(dev=d, roles=roles, volume=primary, slot=self._slots[primary], fs_dev=self._fs_of[primary],
                       lower_of=lower_of)
        self.volumes[d] = w

    def _publish_watches(self) -> None:
        """Write every watch into the inactive half of the kernel's table, switch to it, wait out a grace period (see
        "watched" in bpf/cachepilot.h): a program sees the old table or the new one, never a mix."""
        mul, at = watch_layout(self.volumes, int(self._config.cfg.watch_sel) & 0xFFFFFFFF)
        half = 1 - (int(self._config.cfg.watch_sel) >> 32)
        base = half * L.WATCH_SLOTS
        want = {at[d]: w for d, w in self.volumes.items()}
        for k in self._half_used[half] - set(want):
            self._config.maps.update("watched", C.c_uint32(base + k), L.cp_watch())
        for k, w in want.items():
            self._config.maps.update("watched", C.c_uint32(base + k), w)
        self._half_used[half] = set(want)
        self._config.cfg.watch_sel = mul | half << 32
        self._config.switch()

    def unwatch(self, dev: int) -> None:
        """Stop watching a volume and the devices watched on its behalf only (a device shared with another watched
        volume stays watched for it); its counters are dropped."""
        for d in [d for d, of in self._members.items() if dev in of]:
            del self._members[d][dev]
            self._sync_watch(d)
        self._publish_watches()
        self._forget_volume(dev)

    def _forget_volume(self, dev: int) -> None:
        self._fs_of.pop(dev, None)
        self._slots.pop(dev, None)
        self._counters.forget(dev)
