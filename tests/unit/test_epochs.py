"""One epoch contract: block barriers close epochs, file-level durability calls annotate the open one."""

from __future__ import annotations

import pytest

from cachepilot.engine import Engine
from cachepilot.events import Barrier, BarrierKind, SyncCalls, kdev
from cachepilot.models.epochs import BLOCK_BARRIERS, EpochTracker, closes
from cachepilot.models.volume import VolumeInfo

NS = 1_000_000_000
DEV = kdev(252, 0)


def _fsync_then_flush(t: int, nbytes: int = 65536) -> list[Barrier]:
    """What the kernel half reports for one fsync: the call (epoch still open), then its journal flush."""
    return [Barrier(DEV, BarrierKind.FSYNC, 12, 4242, nbytes, t * NS, nbytes, 0, closes_epoch=False),
            Barrier(DEV, BarrierKind.PREFLUSH, 0, 0, nbytes + 4096, t * NS + 1000, nbytes, 4096, flags=1)]


def test_sixty_fsyncs_in_sixty_seconds_are_sixty_epochs() -> None:
    """Today's main: 120 epochs at 1.97/s with every byte counted twice (it flips `auto` to write-back)."""
    e = EpochTracker(window=256)
    for t in range(1, 61):
        for b in _fsync_then_flush(t):
            e.barrier(b)
    st = e.stats(now_ns=60 * NS + 1000)
    assert st.epochs == 60 and e.total_barriers == 60
    assert st.barrier_rate == pytest.approx(1.0, rel=0.01)
    assert st.mean_bytes == 65536 + 4096  # the flush's count, once
    assert st.file_syncs == 60 and st.synced_epochs == 60
    ep = e.window[-1]
    assert ep.data_bytes == 65536 and ep.meta_bytes == 4096 and ep.pid == 4242 and ep.kind is BarrierKind.PREFLUSH


def test_old_style_file_level_barrier_never_closes() -> None:
    """A file-level kind annotates even when its producer left closes_epoch at its default (True)."""
    e = EpochTracker()
    for kind in set(BarrierKind) - BLOCK_BARRIERS:
        assert not closes(Barrier(DEV, kind, 1, 1, 10, 1))
        assert e.barrier(Barrier(DEV, kind, 1, 1, 10, 1)) is None
    assert e.stats().epochs == 0 and e.current_syncs == len(BarrierKind) - len(BLOCK_BARRIERS)
    assert e.barrier(Barrier(DEV, BarrierKind.FUA, 0, 0, 10, 2, closes_epoch=False)) is None  # a FUA write
    assert e.barrier(Barrier(DEV, BarrierKind.EMPTY_FLUSH, 0, 0, 10, 3)) is not None


def test_sync_calls_annotate() -> None:
    e = EpochTracker()
    e.feed(SyncCalls(DEV, BarrierKind.FDATASYNC, 1000, 77, 12, 1 * NS))
    e.feed(SyncCalls(DEV, BarrierKind.SYNC_WRITE, 5, 78, 13, 1 * NS))
    assert e.stats().epochs == 0
    ep = e.feed(Barrier(DEV, BarrierKind.PREFLUSH, 0, 0, 8192, 2 * NS))
    assert ep is not None and ep.syncs == 1005 and ep.pid == 78 and ep.sync_kind is BarrierKind.SYNC_WRITE
    ep2 = e.feed(Barrier(DEV, BarrierKind.PREFLUSH, 0, 0, 8192, 3 * NS))
    assert ep2 is not None and ep2.syncs == 0 and ep2.pid == 0  # a flush nobody asked for (writeback)
    with pytest.raises(ValueError):
        e.feed(SyncCalls(DEV, BarrierKind.FSYNC, -1, 0, 0, 0))


def test_engine_routes_sync_calls_and_barriers_to_one_tracker() -> None:
    eng = Engine(volumes=[VolumeInfo(DEV, "bcache0", cache_bytes=1 << 30)])
    for t in range(1, 11):
        eng.feed(SyncCalls(DEV, BarrierKind.FSYNC, 3, 99, 12, t * NS))
        eng.feed(_fsync_then_flush(t)[1])
    st = eng.volume("bcache0").epochs.stats(10 * NS)
    assert st.epochs == 10 and st.file_syncs == 30
