"""Per-volume kernel counters: each watched volume's slot in the "volumes" array (metadata activity, the open epoch),
its per-CPU durability calls and drops; turned into deltas once per tick."""

from __future__ import annotations

import ctypes as C

import numpy as np

from cachepilot import bpf_layout as L
from cachepilot import records
from cachepilot.events import BarrierKind, Drops, Event, MetadataDelta, SyncCalls
from cachepilot.probe.maps import MapAccess

# durability calls counted in the kernel (SyncCalls), by kind
SYNC_KINDS = (
    BarrierKind.FSYNC,
    BarrierKind.FDATASYNC,
    BarrierKind.SYNC_FILE_RANGE,
    BarrierKind.SYNCFS,
    BarrierKind.SYNC,
    BarrierKind.SYNC_WRITE,
    BarrierKind.MSYNC,
)
# the kinds are consecutive: a volume's counters are read as one range of the "sync_calls" array
_SYNC_FIRST = int(SYNC_KINDS[0])
assert [int(k) for k in SYNC_KINDS] == list(range(_SYNC_FIRST, _SYNC_FIRST + len(SYNC_KINDS)))
# what a per-(volume, kind) drop counter counts (probe.drops_by_volume())
DROP_KIND_NAMES = {**{t: k.name for t, k in records.BY_RING.items()}, L.DROP_SYNC: "sync_call"}


class VolumeCounters:
    """``slots`` is the probe's (volume dev -> its index in the "volumes" array), shared: volumes come and go there."""

    def __init__(self, maps: MapAccess, slots: dict[int, int]) -> None:
        self._maps = maps
        self._slots = slots
        self._meta_prev: dict[int, tuple[int, int]] = {}
        self._sync_prev: dict[tuple[int, int], int] = {}  # (volume dev, kind) -> calls already reported

    def fresh(self, dev: int, slot: int) -> None:
        """Zero a volume slot's counters (its entry, durability calls, drops) before the slot is (re)used."""
        self._maps.update("volumes", C.c_uint32(slot), L.cp_volume())
        self._maps.zero_percpu("sync_calls", range(slot * L.SYNC_KINDS, (slot + 1) * L.SYNC_KINDS),
                               C.sizeof(L.cp_sync))
        self._maps.zero_percpu("vol_drops", range(slot * L.DROP_KINDS, (slot + 1) * L.DROP_KINDS), 8)
        self._meta_prev[dev] = (0, 0)

    def forget(self, dev: int) -> None:
        self._meta_prev.pop(dev, None)
        for key in [k for k in self._sync_prev if k[0] == dev]:
            del self._sync_prev[key]

    def deltas(self) -> list[Event]:
        """One MetadataDelta per volume with metadata activity, the durability calls counted in the kernel, the
        Drops."""
        events: list[Event] = []
        for dev in list(self._meta_prev):
            vol = self.volume_state(dev)
            if vol is None:
                continue
            prev_score, prev_bytes = self._meta_prev[dev]
            if vol.meta_score != prev_score or vol.meta_bytes != prev_bytes:
                events.append(MetadataDelta(dev, vol.meta_score - prev_score, vol.meta_bytes - prev_bytes))
                self._meta_prev[dev] = (vol.meta_score, vol.meta_bytes)
        events += self._sync_deltas()
        events.append(self.drops())
        return events

    def _sync_deltas(self) -> list[SyncCalls]:
        """One SyncCalls per (volume, kind) with calls that succeeded since the last drain."""
        out: list[SyncCalls] = []
        for dev, slot in self._slots.items():
            rows = self._maps.percpu_rows("sync_calls", slot * L.SYNC_KINDS + _SYNC_FIRST, len(SYNC_KINDS), L.cp_sync)
            totals = rows["calls"].sum(axis=1).tolist()
            for i, kind in enumerate(SYNC_KINDS):
                calls = totals[i]
                prev = self._sync_prev.get((dev, kind), 0)
                if calls == prev:
                    continue
                self._sync_prev[(dev, kind)] = calls
                cpus = rows[i]
                j = int(np.argmax(cpus["ts_ns"]))  # the CPU that saw the latest call (the first such, as max())
                out.append(SyncCalls(dev, kind, calls - prev, int(cpus["last_pid"][j]), int(cpus["last_ino"][j]),
                                     int(cpus["ts_ns"][j])))
        return out

    def drops_by_volume(self) -> dict[tuple[int, str], int]:
        """See Probe.drops_by_volume."""
        out: dict[tuple[int, str], int] = {}
        for dev, slot in self._slots.items():
            for kind, name in DROP_KIND_NAMES.items():
                n = sum(v.value for v in self._maps.percpu("vol_drops", slot * L.DROP_KINDS + kind, C.c_uint64))
                if n:
                    out[(dev, name)] = n
        return out

    def volume_state(self, dev: int) -> L.cp_volume | None:
        """The kernel's counters of a watched volume (cumulative totals and the open epoch)."""
        if dev not in self._slots:
            return None
        vol = L.cp_volume()
        return vol if self._maps.lookup("volumes", C.c_uint32(self._slots[dev]), vol) else None

    def drops(self) -> Drops:
        d = L.cp_drops()
        self._maps.lookup("drops", C.c_uint32(0), d)
        return Drops(ringbuf_full=d.ringbuf_full, hotness_map_full=d.hot_full, other=d.other)
