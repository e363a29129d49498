"""The probe's per-volume kernel counters turned into deltas once a tick (probe/counters.py), on a fake map access:
a volume's durability-call counters are read as one range (one batch lookup), not one lookup per kind."""

from __future__ import annotations

import ctypes as C
from typing import Any

import numpy as np

from cachepilot import bpf_layout as L
from cachepilot.events import BarrierKind, SyncCalls
from cachepilot.probe.counters import SYNC_KINDS, VolumeCounters
from cachepilot.probe.maps import _row_dtype

NCPUS = 3


class FakeMaps:
    """The "sync_calls" per-CPU array as numpy rows; every read counted by kind of read."""

    def __init__(self) -> None:
        self.sync = np.zeros((L.MAX_VOLUMES * L.SYNC_KINDS, NCPUS), dtype=_row_dtype(L.cp_sync))
        self.reads = {"percpu": 0, "percpu_rows": 0}

    def percpu(self, name: str, key: int, value_type: Any) -> list[Any]:
        self.reads["percpu"] += 1
        return [value_type.from_buffer_copy(self.sync[key][c].tobytes()[:C.sizeof(value_type)])
                for c in range(NCPUS)] if name == "sync_calls" else []

    def percpu_rows(self, name: str, first: int, count: int, value_type: Any) -> Any:
        self.reads["percpu_rows"] += 1
        assert name == "sync_calls"
        return self.sync[first:first + count].copy()

    def lookup(self, name: str, key: Any, value: Any) -> bool:
        return False  # no volume entry, no drop counts: only the durability calls here


def test_a_volumes_durability_counters_are_one_read_a_tick() -> None:
    maps = FakeMaps()
    slots = {0x800010: 2, 0x800020: 5}
    vc = VolumeCounters(maps, slots)  # type: ignore[arg-type]
    fsync = 2 * L.SYNC_KINDS + int(BarrierKind.FSYNC)
    maps.sync[fsync]["calls"] = [3, 0, 4]
    maps.sync[fsync]["ts_ns"] = [50, 10, 90]
    maps.sync[fsync]["last_pid"] = [11, 12, 13]
    maps.sync[fsync]["last_ino"] = [21, 22, 23]
    msync = 5 * L.SYNC_KINDS + int(BarrierKind.MSYNC)
    maps.sync[msync]["calls"] = [0, 2, 0]
    maps.sync[msync]["ts_ns"] = [7, 7, 0]  # a tie: the first CPU's, as max() picks
    maps.sync[msync]["last_pid"] = [31, 32, 33]
    syncs = [e for e in vc.deltas() if isinstance(e, SyncCalls)]
    assert syncs == [SyncCalls(0x800010, BarrierKind.FSYNC, 7, 13, 23, 90),
                     SyncCalls(0x800020, BarrierKind.MSYNC, 2, 31, 0, 7)]
    assert maps.reads == {"percpu": 0, "percpu_rows": 2}  # one range a volume (before: 7 lookups each, 14)
    maps.sync[fsync]["calls"] = [3, 1, 4]
    again = [e for e in vc.deltas() if isinstance(e, SyncCalls)]
    assert again == [SyncCalls(0x800010, BarrierKind.FSYNC, 1, 13, 23, 90)]
    assert len(SYNC_KINDS) == 7
