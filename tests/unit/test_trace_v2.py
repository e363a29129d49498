"""Trace format v2: the full Barrier record, SyncCalls, FreedExtent.tid; version 1 still reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cachepilot.events import Barrier, BarrierKind, FreedExtent, SyncCalls, kdev
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import DEFAULT_POLICY
from cachepilot.trace import Tick, TraceReader, TraceWriter, replay
from cachepilot.trace.format import VERSION

DEV = kdev(252, 0)
VOL = VolumeInfo(dev=DEV, name="bcache0", cache_bytes=1 << 30, fs_uuid="abcd-1234", mountpoint="/srv")
V1 = Path(__file__).parent / "data" / "v1-fsync-flush.cptrace"
NS = 1_000_000_000


def test_v2_round_trip_keeps_every_field(tmp_path: Path) -> None:
    evs = [
        Barrier(DEV, BarrierKind.FSYNC, 12, 4242, 65536, 1, 61440, 4096, 0, 0, False),
        Barrier(DEV, BarrierKind.PREFLUSH, 0, 0, 69632, 2, 65536, 4096, 1, 4096, True),
        Barrier(DEV, BarrierKind.FUA, 0, 0, 0, 3, 0, 0, 2, 4096, False),
        Barrier(DEV, BarrierKind.SYNC_FILE_RANGE, 13, 1, 0, 4, 0, 0, 0, 7, False),
        SyncCalls(DEV, BarrierKind.MSYNC, 1_000_000, 77, 14, 5),
        FreedExtent(DEV, 12, 100, 8, True, 6, tid=4711),
        FreedExtent(DEV, 12, 200, 8, False, 7),
        Tick(8),
    ]
    f = tmp_path / "t.cptrace"
    with TraceWriter(f, [VOL]) as w:
        w.write_many(evs * 3)
    r = TraceReader(f)
    assert r.version == VERSION == 2
    assert list(r.events()) == evs * 3


def test_v1_file_still_reads() -> None:
    """A file written by the v1 writer (checked in): barriers gain closes_epoch from their kind, frees tid -1."""
    r = TraceReader(V1)
    assert r.version == 1 and r.volumes[0].name == "bcache0"
    evs = list(r.events())
    barriers = [e for e in evs if isinstance(e, Barrier)]
    assert [b.closes_epoch for b in barriers] == [False, True, True] * 3
    assert [e.tid for e in evs if isinstance(e, FreedExtent)] == [-1]


def test_v1_and_v2_replay_to_the_same_epochs(tmp_path: Path) -> None:
    """The v1 file and the same stream in v2 (as the kernel now reports it) give the same epochs: one per
    block barrier, each fsync annotating the epoch its flush closes."""
    res1 = replay(V1, DEFAULT_POLICY)
    f = tmp_path / "v2.cptrace"
    with TraceWriter(f, TraceReader(V1).volumes) as w:
        for ev in TraceReader(V1).events():
            w.write(ev)
    res2 = replay(f, DEFAULT_POLICY)
    e1 = res1.engine.volume("bcache0").epochs  # type: ignore[union-attr]
    e2 = res2.engine.volume("bcache0").epochs  # type: ignore[union-attr]
    assert list(e1.window) == list(e2.window)
    assert len(e1.window) == 6 and sum(ep.syncs for ep in e1.window) == 3
    assert [d.line() for d in res1.decisions] == [d.line() for d in res2.decisions]


def test_a_sample_carries_the_optional_bypass_counters() -> None:
    from cachepilot.models.volume import VolumeSample
    from cachepilot.trace.format import event_to_record, volume_sample

    s = VolumeSample(dev=1, ts_ns=2, mode="writeback", dirty_bytes=3, hits=4, misses=5, io_errors=0,
                     bypasses=6, bypassed_bytes=7 << 12)
    assert volume_sample(event_to_record(s)[1]) == s
    dm = VolumeSample(dev=1, ts_ns=2, mode="writeback", dirty_bytes=3, hits=4, misses=5, io_errors=0)
    assert volume_sample(event_to_record(dm)[1]) == dm  # None: the cache has no such counter
    with pytest.raises(ValueError, match=re.escape("field 'bypasses' must be int | None")):
        volume_sample({**event_to_record(s)[1], "bypasses": "6"})
    with pytest.raises(ValueError, match="out of range"):
        volume_sample({**event_to_record(s)[1], "bypasses": -1})
