"""Freed-extent queue, epoch tracker, volume state."""

from __future__ import annotations

import numpy as np
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
    q.freed(10, 5, ts_ns=100, tid=7)
    q.freed(50, 5, ts_ns=300, tid=8)
    assert q.take(1000) == []  # nothing committed yet
    q.commit(7, 200)
    assert q.take(1000) == [(10, 5)]
    assert q.pending_blocks == 5
    q.commit(8, 400)
    assert q.take(1000) == [(50, 5)]


def test_coalescing_neighbours_but_not_across_gaps() -> None:
    q = FreedExtentQueue()
    for block, count in [(0, 4), (4, 4), (20, 2), (8, 1), (22, 3), (30, 1)]:
        q.freed(block, count, 1, tid=3)
    q.commit(3, 1)
    assert q.ready() == [(0, 9), (20, 25), (30, 31)]
    assert q.take(2) == [(0, 9), (20, 5), (30, 1)]


def test_granularity_never_grows_a_range_and_fragments_wait() -> None:
    q = FreedExtentQueue(granularity_blocks=4, max_hold_ns=10 * NS)
    q.freed(2, 9, 0, tid=1)  # blocks 2..10 -> only 4..7 is a whole granule
    q.commit(1, 0)
    assert q.take(1) == [(4, 4)]
    assert q.ready() == [(2, 4), (8, 11)]
    q.freed(11, 1, 2, tid=2)  # completes 8..11
    q.commit(2, 2)
    assert q.take(3) == [(8, 4)]
    assert q.ready() == [(2, 4)]
    assert q.take(20 * NS) == []  # too small for too long: dropped and counted
    assert q.ready() == [] and q.stats.dropped_small_blocks == 2


def test_max_blocks_budget() -> None:
    q = FreedExtentQueue()
    q.freed(0, 100, 0, tid=1)
    q.commit(1, 0)
    assert q.take(1, max_blocks=30) == [(0, 30)]
    assert q.take(1, max_blocks=100) == [(30, 70)]


def test_reallocated_blocks_are_never_handed_out() -> None:
    q = FreedExtentQueue()
    q.freed(0, 10, 0, tid=1)
    q.freed(20, 10, 0, tid=1)
    q.allocated(5, 2)  # reused before the commit
    q.commit(1, 1)
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
                q.freed(run[0], len(run), i, tid=i)
                live -= set(run)
            run = [x] if x is not None else []
        if i % 3 == 0:
            q.commit(i, i)
    for b, n in reused:  # blocks the filesystem allocated again
        q.allocated(b, n)
        live |= set(range(b, b + n))
    q.commit(10**9, 10**9)
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


def test_exposure_age_is_time_since_known_clean_whatever_was_written() -> None:
    """Main estimated the age from bytes written (FIFO): overwrites of a dirty block and writes the cache bypasses
    made the oldest dirty byte look young. Now the age is bounded by the time since the cache was known clean."""
    v = VolumeState(VolumeInfo(1, "bcache0"))
    v.update(VolumeSample(1, 0, "writeback", 0, 0, 0, 0))
    for t in range(1, 120):  # one dirty block, overwritten / bypassed writes at 1 MiB/s: dirty stays 4 KiB
        v.update(VolumeSample(1, t * NS, "writeback", 4096, 0, 0, 0))
    assert v.exposure_age_s(119 * NS) == pytest.approx(119)
    v.cleaned(100 * NS)  # a drain that started at 100 s completed
    assert v.exposure_age_s(119 * NS) == pytest.approx(19)
    v.update(VolumeSample(1, 120 * NS, "writeback", 0, 0, 0, 0))
    assert v.exposure_age_s(121 * NS) == 0


def test_free_in_t_plus_1_waits_for_its_own_commit() -> None:
    """jbd2 opens T+1 before T's commit event fires: main released a T+1 free on T's commit (by timestamp)."""
    q = FreedExtentQueue()
    q.freed(100, 8, ts_ns=5, tid=41)  # freed in the running transaction T+1 = 41 ...
    q.commit(40, ts_ns=6)  # ... then T = 40's commit ends
    assert q.take(10) == [] and q.pending_blocks == 8
    q.commit(41, ts_ns=7)
    assert q.take(10) == [(100, 8)]


def test_transaction_ids_wrap_like_tid_geq() -> None:
    q = FreedExtentQueue()
    q.freed(0, 4, 1, tid=0xFFFFFFFE)
    q.freed(10, 4, 1, tid=1)  # after the wrap
    q.commit(0xFFFFFFFF, 2)
    assert q.take(3) == [(0, 4)]
    q.commit(0, 4)
    assert q.take(5) == []
    q.commit(2, 6)
    assert q.take(7) == [(10, 4)]


def test_frees_without_a_transaction() -> None:
    ext4 = FreedExtentQueue()  # a journaled filesystem (commits seen): data=writeback data frees are free at once
    ext4.commit(1, 0)
    ext4.freed(0, 4, 1)
    assert ext4.take(2) == [(0, 4)]
    xfs = FreedExtentQueue(unjournalled_hold_ns=30 * NS, max_pending=3)  # no commit events at all
    for i in range(5):
        xfs.freed(i * 10, 2, i * NS)
    assert xfs.stats.dropped_overflow_blocks == 4 and xfs.pending_blocks == 6  # bounded, drops counted
    assert xfs.take(32 * NS) == [(20, 2)]  # only what waited the hold
    assert xfs.take(40 * NS) == [(30, 2), (40, 2)]


def test_pending_is_bounded_when_commits_are_lost() -> None:
    q = FreedExtentQueue(max_pending=100)
    for i in range(1000):
        q.freed(i * 2, 1, i, tid=i)
    assert len(q.pending) == 100 and q.stats.dropped_overflow_blocks == 900
    q.commit(999, 1000)  # a later commit releases everything earlier
    assert q.pending == [] and q.ready_blocks == 100


def _insert_one_at_a_time(ivs: list[list[int]], s: int, e: int, t: int) -> None:
    """The oracle: insert [s, e) ready since t into sorted, disjoint, non-touching intervals, merging neighbours."""
    keep = []
    for a, b, u in ivs:
        if b >= s and a <= e:  # overlaps or touches
            s, e, t = min(s, a), max(e, b), min(t, u)
        else:
            keep.append([a, b, u])
    keep.append([s, e, t])
    ivs[:] = sorted(keep)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 20), st.integers(0, 50)), max_size=60),
       st.integers(0, 60))
def test_batched_merge_equals_one_at_a_time(extents: list[tuple[int, int, int]], read_at: int) -> None:
    """Extents made ready (by commits, re-queues) are merged in one batch when the ready set is next read; the
    result — the intervals and since when each is ready — is what inserting them one at a time gave."""
    q = FreedExtentQueue()
    oracle: list[list[int]] = []
    for k, (b, n, t) in enumerate(extents):
        q._insert(b, b + n, t)  # noqa: SLF001
        _insert_one_at_a_time(oracle, b, b + n, t)
        if k == read_at:  # a read in the middle settles what came so far
            assert q.ready() == [(x, y) for x, y, _ in oracle]
    assert q.ready() == [(x, y) for x, y, _ in oracle]
    assert q._since.tolist() == [u for _, _, u in oracle]  # noqa: SLF001


def test_a_budget_short_of_one_granule_keeps_an_old_large_extent() -> None:
    # a budget left smaller than the granularity once dropped an old extent as "too small to discard"
    q = FreedExtentQueue(granularity_blocks=8, max_hold_ns=10 * NS)
    q.freed(0, 64, 0, tid=1)
    q.commit(1, 0)
    assert q.take(20 * NS, max_blocks=4) == []
    assert q.ready() == [(0, 64)] and q.stats.dropped_small_blocks == 0
    assert q.take(21 * NS, max_blocks=64) == [(0, 64)]


def _take_one_at_a_time(ivs: list[list[int]], g: int, budget: int, now: int, hold: int) -> tuple[list, list, int]:
    """The oracle for take(): walk the ready intervals in order; returns (handed out, still ready, dropped)."""
    out, keep, dropped = [], [], 0
    for s, e, t in ivs:
        a, whole = -(-s // g) * g, (e // g) * g
        small = whole - a < g
        b = min(whole, a + (budget // g) * g) if budget > 0 and not small else a
        if b > a:
            out.append((a, b - a))
            budget -= b - a
            keep += [[s, a, t]] if s < a else []
            keep += [[b, e, t]] if b < e else []
        elif small and now - t > hold:
            dropped += e - s
        else:
            keep.append([s, e, t])
    return out, sorted(keep), dropped


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.integers(1, 40), st.integers(0, 50)), max_size=40),
       st.integers(1, 16), st.integers(0, 200), st.integers(0, 100))
def test_take_equals_the_one_at_a_time_walk(extents: list[tuple[int, int, int]], g: int, budget: int,
                                            now: int) -> None:
    """take() works on whole columns at once; what it hands out, keeps and drops is what the walk gives."""
    q = FreedExtentQueue(granularity_blocks=g, max_hold_ns=30)
    for b, n, t in extents:
        q._insert(b, b + n, t)  # noqa: SLF001
    q._settle()  # noqa: SLF001
    ivs = [list(x) for x in zip(q._starts.tolist(), q._ends.tolist(), q._since.tolist(), strict=True)]  # noqa: SLF001
    want_out, want_keep, want_dropped = _take_one_at_a_time(ivs, g, budget, now, 30)
    assert q.take(now, max_blocks=budget) == want_out
    got = list(zip(q._starts.tolist(), q._ends.tolist(), q._since.tolist(), strict=True))  # noqa: SLF001
    assert [list(x) for x in got] == want_keep
    assert q.stats.dropped_small_blocks == want_dropped
    assert q.stats.handed_blocks == sum(n for _, n in want_out)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 30)), max_size=30), st.integers(0, 320),
       st.integers(0, 60))
def test_allocated_removes_exactly_the_reused_blocks(extents: list[tuple[int, int]], b0: int, n: int) -> None:
    q = FreedExtentQueue()
    for b, k in extents:
        q._insert(b, b + k, 0)  # noqa: SLF001
    before = {x for s, e in q.ready() for x in range(s, e)}
    q.allocated(b0, n)
    after = {x for s, e in q.ready() for x in range(s, e)}
    assert after == before - set(range(b0, b0 + n))
    assert q.stats.reallocated_blocks == len(before & set(range(b0, b0 + n)))


FREE = st.tuples(st.sampled_from(["free", "free", "commit"]), st.integers(0, 200), st.integers(0, 12),
                 st.integers(-1, 5), st.integers(0, 50))


@settings(max_examples=200, deadline=None)
@given(st.lists(FREE, max_size=50), st.integers(1, 30))
def test_freed_in_batches_equals_one_at_a_time(ops: list[tuple[str, int, int, int, int]], max_pending: int) -> None:
    """A replay hands a block of freed extents over at once (freed_many): pending, dropped and ready extents are
    what one call per extent gives, across commits, extents without a transaction and the pending bound."""
    one, many = FreedExtentQueue(max_pending=max_pending), FreedExtentQueue(max_pending=max_pending)
    batch: list[tuple[int, int, int, int]] = []

    def flush() -> None:
        if batch:
            cols = np.array(batch, dtype=np.int64)
            many.freed_many(cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])
            batch.clear()

    for op, block, count, tid, ts in ops:
        if op == "free":
            one.freed(block, count, ts, tid)
            batch.append((block, count, ts, tid))
        else:
            flush()
            assert one.commit(tid & 0xFF, ts) == many.commit(tid & 0xFF, ts)
        if op == "commit":
            assert one.pending == many.pending and one.ready() == many.ready()
    flush()
    assert one.ready() == many.ready() and one.stats == many.stats


def test_commits_read_later_keep_each_extents_own_commit_time() -> None:
    # commits are applied when the queue is next read: an extent is still ready since the first commit that covered
    # it, not since the last one (a fragment's hold is counted from there)
    q = FreedExtentQueue(granularity_blocks=4, max_hold_ns=1000)
    q.freed(9, 2, ts_ns=100, tid=7)  # 9..10: no whole granule, a fragment
    q.freed(50, 2, ts_ns=300, tid=8)  # 50..51: likewise
    q.freed(70, 2, ts_ns=500, tid=9)  # not committed
    q.commit(7, 200)
    q.commit(8, 400)
    assert q.ready() == [(9, 11), (50, 52)] and q.pending_blocks == 2
    assert q.take(1300) == []  # 1300 - 200 > hold: dropped; 1300 - 400 is not: still waits
    assert q.ready() == [(50, 52)] and q.stats.dropped_small_blocks == 2


def test_commits_read_later_across_a_wrapping_transaction_id() -> None:
    q = FreedExtentQueue()
    for block, tid in ((0, 0xFFFFFFFE), (10, 0xFFFFFFFF), (20, 0), (30, 1), (40, 2)):
        q.freed(block, 5, ts_ns=1, tid=tid)
    q.commit(0xFFFFFFFF, 2)
    q.commit(0, 3)
    q.commit(1, 4)
    assert q.ready() == [(0, 5), (10, 15), (20, 25), (30, 35)]
    assert q.pending == [(1, 40, 45, 2)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 50)), max_size=40))
def test_commits_read_later_match_commits_applied_at_once(steps: list[tuple[bool, int, int]]) -> None:
    """The same ready set, pending set and ready-since times as reading the queue after every commit."""
    lazy, eager = FreedExtentQueue(granularity_blocks=2, max_hold_ns=5), FreedExtentQueue(granularity_blocks=2,
                                                                                          max_hold_ns=5)
    tid, ts = 0, 0
    for i, (is_commit, dt, block) in enumerate(steps):
        ts += dt
        for q in (lazy, eager):
            if is_commit:
                q.commit(tid, ts)
            else:
                q.freed(block * 3, 1 + i % 3, ts, tid=tid + i % 2)
        if is_commit:
            tid += 1
            eager.ready()  # applied now
    assert lazy.pending == eager.pending
    assert lazy.ready() == eager.ready()
    assert lazy.take(ts + 6) == eager.take(ts + 6)
    assert lazy.stats == eager.stats
