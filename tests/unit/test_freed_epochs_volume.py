"""Freed-extent queue, epoch tracker, volume state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.errors import UserError
from cachepilot.events import Barrier, BarrierKind
from cachepilot.models.epochs import EpochTracker
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.volume import Health, VolumeInfo, VolumeSample, VolumeState

NS = 1_000_000_000


def test_extents_wait_for_their_commit() -> None:
    q = FreedExtentQueue()
    q.freed(10, 5, ts_ns=100)
    q.freed(50, 5, ts_ns=300)
    assert q.take(1000) == []  # nothing committed yet
    q.commit(200)
    assert q.take(1000) == [(10, 5)]
    assert q.pending_blocks == 5
    q.commit(400)
    assert q.take(1000) == [(50, 5)]


def test_coalescing_neighbours_but_not_across_gaps() -> None:
    q = FreedExtentQueue()
    for block, count in [(0, 4), (4, 4), (20, 2), (8, 1), (22, 3), (30, 1)]:
        q.freed(block, count, 1)
    q.commit(1)
    assert q.ready() == [(0, 9), (20, 25), (30, 31)]
    assert q.take(2) == [(0, 9), (20, 5), (30, 1)]


def test_granularity_never_grows_a_range_and_fragments_wait() -> None:
    q = FreedExtentQueue(granularity_blocks=4, max_hold_ns=10 * NS)
    q.freed(2, 9, 0)  # blocks 2..10 -> only 4..7 is a whole granule
    q.commit(0)
    assert q.take(1) == [(4, 4)]
    assert q.ready() == [(2, 4), (8, 11)]
    q.freed(11, 1, 2)  # completes 8..11
    q.commit(2)
    assert q.take(3) == [(8, 4)]
    assert q.ready() == [(2, 4)]
    assert q.take(20 * NS) == []  # too small for too long: dropped and counted
    assert q.ready() == [] and q.stats.dropped_small_blocks == 2


def test_max_blocks_budget() -> None:
    q = FreedExtentQueue()
    q.freed(0, 100, 0)
    q.commit(0)
    assert q.take(1, max_blocks=30) == [(0, 30)]
    assert q.take(1, max_blocks=100) == [(30, 70)]


def test_reallocated_blocks_are_never_handed_out() -> None:
    q = FreedExtentQueue()
    q.freed(0, 10, 0)
    q.freed(20, 10, 0)
    q.allocated(5, 2)  # reused before the commit
    q.commit(1)
    q.allocated(22, 20)  # reused after it
    assert q.take(2) == [(0, 5), (7, 3), (20, 2)]


def test_negative_extent_rejected() -> None:
    with pytest.raises(UserError):
        FreedExtentQueue().freed(-1, 3, 0)
    with pytest.raises(UserError):
        FreedExtentQueue(granularity_blocks=0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 12)), max_size=30),
    st.lists(st.tuples(st.integers(0, 200), st.integers(1, 12)), max_size=10),
    st.integers(1, 8),
)
def test_coalescing_never_overlaps_live(freed: list[tuple[int, int]], reused: list[tuple[int, int]],
                                        gran: int) -> None:
    live = set(range(0, 240))
    q = FreedExtentQueue(granularity_blocks=gran)
    for i, (b, n) in enumerate(freed):
        blocks = set(range(b, b + n)) & live
        # free only blocks that are live, as runs
        run: list[int] = []
        for x in sorted(blocks) + [None]:  # type: ignore[list-item]
            if x is not None and (not run or x == run[-1] + 1):
                run.append(x)
                continue
            if run:
                q.freed(run[0], len(run), i)
                live -= set(run)
            run = [x] if x is not None else []
        if i % 3 == 0:
            q.commit(i)
    for b, n in reused:  # blocks the filesystem allocated again
        q.allocated(b, n)
        live |= set(range(b, b + n))
    q.commit(10**9)
    out = q.take(10**9)
    for start, count in out:
        assert count > 0 and start % gran == 0 and count % gran == 0
        assert not set(range(start, start + count)) & live
    starts = sorted(out)
    for (s1, c1), (s2, _) in zip(starts, starts[1:], strict=False):
        assert s1 + c1 <= s2


def test_epochs() -> None:
    e = EpochTracker(window=4)
    e.note_dirty(100)
    assert e.barrier(Barrier(1, BarrierKind.FSYNC, 5, 9, 4096, 1 * NS, closes_epoch=False)) is None  # annotates
    ep = e.barrier(Barrier(1, BarrierKind.PREFLUSH, 0, 0, 4096, 1 * NS))
    assert ep is not None and ep.bytes == 4096 and ep.dirty_bytes == 100 and ep.start_ns == 0
    assert ep.syncs == 1 and ep.pid == 9 and ep.sync_kind is BarrierKind.FSYNC
    for i in range(2, 8):
        e.barrier(Barrier(1, BarrierKind.PREFLUSH, 0, 0, 1000 * i, i * NS))
    st_ = e.stats()
    assert st_.epochs == 4  # window
    assert st_.barrier_rate == pytest.approx(4 / 4.0)
    assert st_.mean_bytes == pytest.approx((4000 + 5000 + 6000 + 7000) / 4)
    assert st_.p95_bytes == 7000
    assert st_.file_syncs == 0
    assert st_.mean_dirty_bytes == 0
    assert EpochTracker().stats().epochs == 0


def _s(ts: int, hits: int, misses: int, errors: int = 0, dirty: int = 0, failed: bool = False) -> VolumeSample:
    return VolumeSample(1, ts * NS, "writeback", dirty, hits, misses, errors, failed)


def test_volume_hit_ratio_trend_and_health() -> None:
    v = VolumeState(VolumeInfo(1, "bcache0"), window=30)
    assert v.hit_ratio is None and v.health is Health.OK
    h = m = 0
    for t in range(20):
        h += 90
        m += 10
        v.update(_s(t, h, m))
    assert v.hit_ratio == pytest.approx(0.9)
    assert abs(v.hit_trend()) < 1e-9
    for t in range(20, 26):
        h += 30
        m += 70
        v.update(_s(t, h, m))
    assert v.hit_trend() < -0.3
    v.update(_s(27, h, m, errors=3))
    assert v.health is Health.DEGRADED
    v.update(_s(28, h, m, errors=3, failed=True))
    assert v.health is Health.FAILED


def test_volume_exposure_age() -> None:
    v = VolumeState(VolumeInfo(1, "bcache0"))
    v.update(_s(1, 0, 0, dirty=10))
    v.update(_s(5, 0, 0, dirty=20))
    assert v.exposure_age_s(6 * NS) == pytest.approx(5)
    v.update(_s(7, 0, 0, dirty=0))
    assert v.exposure_age_s(8 * NS) == 0
    with pytest.raises(ValueError):
        v.update(_s(8, -1, 0))


def test_exposure_age_fifo_estimate_under_sustained_writes() -> None:
    v = VolumeState(VolumeInfo(1, "bcache0"))
    mib = 1 << 20
    for t in range(1, 120):  # 10 MiB/s written, the cache keeps 20 MiB dirty: the oldest is ~2 s old
        v.update(VolumeSample(1, t * NS, "writeback", 20 * mib, 0, 0, 0), cum_written=10 * mib * t)
    assert 1.0 <= v.exposure_age_s(119 * NS) <= 3.0
    # writes stop and nothing is written back: the dirty data ages
    for t in range(120, 140):
        v.update(VolumeSample(1, t * NS, "writeback", 20 * mib, 0, 0, 0), cum_written=10 * mib * 119)
    assert v.exposure_age_s(139 * NS) >= 20.0
