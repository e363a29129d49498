"""The daemon's costs under load (issue 23 item 5): a deferred promotion that waits on is one decision, said once; a
poll's many deletes are one batch, its barriers one run; a discard look that would find nothing again does no array
work; the exporter's snapshot is built only when a scrape wants it."""

from __future__ import annotations

import dataclasses
import logging
import random
from typing import cast

import numpy as np
import pytest

from cachepilot.actions import DONE, FAILED, PENDING, DiscardRanges, Outcome, Promote, SetKnob
from cachepilot.backends.base import Backend
from cachepilot.daemon.acting import Actor
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.guard import Guard
from cachepilot.daemon.intake import DELETE_BATCH_MIN, Intake
from cachepilot.daemon.loglimit import LineBudget
from cachepilot.daemon.stopflag import StopFlag
from cachepilot.daemon.volume import ManagedVolume, VolumeTable
from cachepilot.daemon.volumes import Found
from cachepilot.engine.engine import Engine
from cachepilot.errors import RetryLater
from cachepilot.events import Barrier, BarrierKind, Delete, FileKey, FreedExtent, HotnessDelta, JournalCommit, kdev
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.hotness import HOT_DTYPE, deletes_array
from cachepilot.models.volume import VolumeInfo

FS = kdev(252, 1)
INFO = VolumeInfo(dev=FS, name="bcache0", kind="bcache", fs_uuid="u-1", mountpoint="/mnt/x", cache_id="c-1")


class SpentPromoter:
    """The promoter's answer when this second's read time is spent: the action back whole, deferred."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, action: Promote, dry_run: bool) -> Outcome:
        self.calls += 1
        return Outcome(action, PENDING, dry_run, deferred=action, actuated=True,
                       detail="this second's read time is spent")



def _intake_counting_batches(engine: Engine, batches: list[int]) -> tuple[Intake, Counters]:
    """An intake over ``engine`` (no probe, actions dropped) whose delete batches are recorded in ``batches``."""
    feed_deletes = engine.feed_deletes
    engine.feed_deletes = lambda recs: (batches.append(len(recs)), feed_deletes(recs))[-1]  # type: ignore[method-assign]
    counters = Counters()
    return Intake(engine, VolumeTable(), counters, Guard(counters), StopFlag(), lambda: None,
                  lambda action, now: None), counters

def test_a_deferred_promotion_that_waits_is_one_decision_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    files = SpentPromoter()
    v = ManagedVolume(Found(INFO), backend=cast(Backend, object()), files=files)  # managed
    vols = VolumeTable()
    vols.add(v)
    counters = Counters()
    actor = Actor(Engine(), vols, counters, lambda dev, why: None, lambda msg: None)
    p = Promote("bcache0", FS, 12, 1, ((0, 65536),), "hot")
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        actor.execute(p, 0, dry_run=False)  # the engine's decision: deferred at once, said
        for tick in range(1, 6):
            actor.deferred(tick, dry_run=False)  # each tick it is tried again, and waits on
    assert files.calls == 6 and v.deferred == [p]  # still tried every tick, still waiting
    assert len(actor.decisions) == 1 and counters["decisions.promote"] == 1
    assert len([r for r in caplog.records if "promote bcache0" in r.getMessage()]) == 1
    assert counters["deferred_waits"] == 5


class ReaderThreadPromoter:
    """The promoter with reader threads: the first call hands the file over (pending, nothing read yet), the next
    while it is read waits on, the one after collects the read (done)."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, action: Promote, dry_run: bool) -> Outcome:
        self.calls += 1
        if self.calls == 1:
            return Outcome(action, PENDING, dry_run, deferred=action, actuated=True,
                           detail="1 chunk(s) handed to a reader thread")
        if self.calls == 2:
            return Outcome(action, PENDING, dry_run, deferred=action, actuated=True,
                           detail="being read by a reader thread")
        return Outcome(action, DONE, dry_run, actuated=True, read_bytes=65536, reads=1)


def acting_on(files: object) -> tuple[ManagedVolume, Counters, Actor]:
    """A volume whose file actions ``files`` carries out, its counters, and the actor that runs them."""
    v = ManagedVolume(Found(INFO), backend=cast(Backend, object()), files=files)
    vols = VolumeTable()
    vols.add(v)
    counters = Counters()
    return v, counters, Actor(Engine(), vols, counters, lambda dev, why: None, lambda msg: None)


def test_a_promotion_read_by_a_reader_thread_is_counted_once_and_recorded_pending_then_done() -> None:
    files = ReaderThreadPromoter()
    v, counters, actor = acting_on(files)
    actor.execute(Promote("bcache0", FS, 12, 1, ((0, 65536),), "hot"), 0, dry_run=False)
    for tick in range(1, 4):
        actor.deferred(tick, dry_run=False)
    assert files.calls == 3 and v.deferred == [] and v.promoted_bytes == 65536
    assert [d["status"] for d in actor.decisions] == ["pending", "done"]  # the trail of both states
    assert counters["decisions.promote"] == 1 and counters.group("decisions") == {"promote": 1}


class BusyOncePromoter:
    """A read that found the device busy (EAGAIN: retried later by the daemon), then done."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, action: Promote, dry_run: bool) -> Outcome:
        self.calls += 1
        if self.calls == 1:
            return Outcome(action, FAILED, dry_run, error=RetryLater("promote ino 12: busy"), actuated=True)
        return Outcome(action, DONE, dry_run, actuated=True, read_bytes=65536, reads=1)


def test_a_retried_promotion_is_counted_once() -> None:
    files = BusyOncePromoter()
    v, counters, actor = acting_on(files)
    actor.execute(Promote("bcache0", FS, 12, 1, ((0, 65536),), "hot"), 0, dry_run=False)
    actor.retry_due(10**12, dry_run=False)
    assert files.calls == 2 and [d["status"] for d in actor.decisions] == ["failed", "done"]
    assert counters["decisions.promote"] == 1 and counters["failed.retry"] == 1 and counters["retries"] == 1


def _engine_with_files(n: int) -> Engine:
    engine = Engine()
    engine.add_volume(INFO)
    for ino in range(1, n + 1):
        engine.hotness.update(FS, ino, 1, 0, 0, 0, 7, 8192)
    return engine


def test_a_polls_deletes_go_to_the_engine_in_runs_with_the_same_result_as_one_by_one() -> None:
    # an unlink's delete comes with its freed extents; a run waits past those and commits, not past hotness
    n = DELETE_BATCH_MIN
    events: list[object] = [JournalCommit(FS, 5, 1)]
    for ino in range(1, n + 1):
        events += [Delete(FileKey(FS, ino, 1), 8192, 10 + ino), FreedExtent(FS, ino, 100 * ino, 2, False, 10, 5)]
    events += [HotnessDelta(FileKey(FS, 1000, 1), 1, 0, 4096, 0, 13, 4096), Delete(FileKey(FS, n + 1, 1), 8192, 90),
               Delete(FileKey(FS, n + 2, 9), 8192, 91)]  # another generation: not the tracked file
    one_by_one = _engine_with_files(n + 3)
    for ev in events:
        one_by_one.feed(ev)  # type: ignore[arg-type]
    engine = _engine_with_files(n + 3)
    batches: list[int] = []
    intake, counters = _intake_counting_batches(engine, batches)
    intake.feed_all(events)
    assert batches == [n]  # the hotness delta ended the run; the two after it wait for the tick
    assert counters["events.Delete"] == n
    intake.drain(0)  # the tick: the two held ones, one by one (fewer than a batch)
    assert batches == [n]
    assert counters["events.Delete"] == n + 2 and counters["events.FreedExtent"] == n
    assert len(engine.hotness) == len(one_by_one.hotness) == 3
    assert sorted(engine.hotness.index[FS]) == sorted(one_by_one.hotness.index[FS]) == [n + 2, n + 3, 1000]
    assert engine.volume("bcache0").freed.pending == one_by_one.volume("bcache0").freed.pending


def test_deletes_polled_between_ticks_go_to_the_engine_as_one_batch_at_the_tick() -> None:
    """The headline fileserver's polls bring ~1 delete each: one by one they cost the engine's per-delete work ten
    times a second; held for the tick they are one batch (and nothing between ticks reads what they change)."""
    engine = _engine_with_files(DELETE_BATCH_MIN + 1)
    batches: list[int] = []
    intake, counters = _intake_counting_batches(engine, batches)
    for ino in range(1, DELETE_BATCH_MIN + 1):  # one delete and its freed extent a poll
        intake.feed_all([Delete(FileKey(FS, ino, 1), 8192, 10 + ino), FreedExtent(FS, ino, 100 * ino, 2, False, 10, 5)])
    assert batches == [] and len(engine.hotness) == DELETE_BATCH_MIN + 1  # nothing deleted yet
    intake.drain(0)
    assert batches == [DELETE_BATCH_MIN] and len(engine.hotness) == 1
    assert counters["events.Delete"] == DELETE_BATCH_MIN


def test_commits_within_the_gather_window_make_one_discard_look() -> None:
    """Commits under an fsync load come several times a second; their freed extents leave together, one look (one
    FITRIM action) per DISCARD_GATHER_NS, the first at once and the rest when the window has passed."""
    from cachepilot.engine.discards import DISCARD_GATHER_NS

    engine = Engine()
    c = engine.add_volume(INFO)  # the default policy: discards on, 64 KiB extents at least
    step = DISCARD_GATHER_NS // 5
    looks: list[int] = []
    for i in range(10):  # a commit every fifth of the window, each freeing one extent; the daemon looks after each
        now = 10**9 + i * step
        engine.feed(FreedExtent(FS, 1, 1024 * (i + 1), 16, False, now - 1, i + 1))
        engine.feed(JournalCommit(FS, i + 1, now))
        looks += [i] * len(engine.discards(now))
    assert looks == [0, 5]  # two looks in two windows, not ten
    later = engine.discards(10**9 + 10 * step)  # the window after the last look: the rest, at once
    assert len(later) == 1 and len(later[0].ranges) == 4 and c.freed.ready_blocks == 0


def test_a_tick_right_after_a_commits_look_does_not_look_again() -> None:
    """The tick's own look at the freed extents is skipped within the gather window after a commit-prompted one
    (that look took what was ready); past the window the tick looks as before."""
    from cachepilot.engine.discards import DISCARD_GATHER_NS

    engine = Engine()
    c = engine.add_volume(INFO)
    takes: list[int] = []
    take = c.freed.take
    c.freed.take = lambda now, most=None: (takes.append(now), take(now, most))[-1]  # type: ignore[method-assign]
    t0 = 10**9
    engine.feed(FreedExtent(FS, 1, 1024, 16, False, t0 - 1, 1))
    engine.feed(JournalCommit(FS, 1, t0))
    assert len(engine.discards(t0)) == 1 and takes == [t0]
    engine.tick(t0 + DISCARD_GATHER_NS // 2)
    assert takes == [t0]  # within the window: no second look
    engine.tick(t0 + DISCARD_GATHER_NS)
    assert takes == [t0, t0 + DISCARD_GATHER_NS]
    engine.feed(FreedExtent(FS, 1, 2048, 16, False, t0 + DISCARD_GATHER_NS, 2))
    engine.feed(JournalCommit(FS, 2, t0 + DISCARD_GATHER_NS + 1))
    assert len(engine.discards(t0 + DISCARD_GATHER_NS + 2)) == 1  # the tick's look does not hold a commit's back


def test_a_take_that_would_find_nothing_again_does_no_array_work() -> None:
    q = FreedExtentQueue(granularity_blocks=128, max_hold_ns=1000)
    q.commit(1, 0)
    for i in range(50):
        q.freed(i * 1000, 2, 1, 1)  # small ranges: each waits for its neighbours to make a whole granule
    q.commit(2, 2)
    assert q.take(10, 1 << 20) == []
    ready = q._starts
    assert q.take(11, 1 << 20) == [] and q._starts is ready  # nothing rebuilt
    assert q.take(1 << 20, 1 << 20) == [] and q.stats.dropped_small_blocks == 100  # held too long: dropped


def _random_run(rng: random.Random, quiet: bool) -> list[object]:
    q = FreedExtentQueue(granularity_blocks=8, max_hold_ns=50)
    if not quiet:
        q._still_quiet = lambda now, budget: False  # type: ignore[method-assign]
    seen: list[object] = []
    tid, now = 1, 0
    for _ in range(300):
        now += rng.randrange(0, 20)
        op = rng.random()
        if op < 0.4:
            q.freed(rng.randrange(0, 400), rng.choice((1, 2, 3, 8, 16)), now, tid)
        elif op < 0.5:
            q.commit(tid, now)
            tid += 1
        elif op < 0.55:
            q.allocated(rng.randrange(0, 400), rng.randrange(1, 10))
        else:
            seen.append(q.take(now, rng.choice((0, 3, 8, 24, None))))
        seen.append((q.ready(), dataclasses.astuple(q.stats)))
    return seen


def test_the_quiet_take_gives_what_the_full_one_does() -> None:
    for seed in range(20):
        assert _random_run(random.Random(seed), True) == _random_run(random.Random(seed), False)  # noqa: S311 - reproducible sequences, not secrets


def test_a_polls_barriers_go_to_the_engine_as_one_run_and_a_bad_one_stops_only_itself() -> None:
    """A flush storm brings hundreds of barriers a poll: they go to the engine in one call, counted once, not
    through the per-event layers each; a barrier the engine fails on is counted and the rest of the run goes on."""
    engine = Engine()
    c = engine.add_volume(INFO)
    calls: list[int] = []
    feed_each = engine.feed_each
    engine.feed_each = lambda evs: (calls.append(0), feed_each(evs))[-1]  # type: ignore[method-assign]
    counters = Counters()
    intake = Intake(engine, VolumeTable(), counters, Guard(counters), StopFlag(), lambda: None, lambda a, now: None)
    good = [Barrier(FS, BarrierKind.EMPTY_FLUSH, 0, 0, 4096, 10 + i) for i in range(5)]
    bad = Barrier(FS, BarrierKind.EMPTY_FLUSH, 0, 0, -1, 20)  # negative epoch bytes: refused (a ValueError)
    intake.feed_all([*good[:2], bad, *good[2:], JournalCommit(FS, 1, 30)])
    assert calls == [0, 0, 0]  # the barriers' run (resumed once past the bad one), then the commit's
    assert c.epochs.total_barriers == 5 and counters["events.Barrier"] == 6 and counters["events.bugs"] == 1
    assert counters["events.JournalCommit"] == 1 and c.freed.commits_seen == 1


def test_a_snapshot_that_cannot_be_built_leaves_the_last_one_served(caplog: pytest.LogCaptureFixture) -> None:
    from cachepilot.exporter import DaemonSnapshot, SnapshotBox

    box = SnapshotBox()
    good = DaemonSnapshot(timestamp=0.0, start_time=0.0, ready=True, dry_run=False, observe_only=False)
    box.publish(good)

    def broken() -> DaemonSnapshot:
        raise ValueError("bad label")

    for _ in range(3):
        box.publish_lazy(broken)
        assert box.latest() is good
    assert len([r for r in caplog.records if "bad label" in r.getMessage()]) == 1


class WakingProbe:
    """A probe whose polls wait for a wakeup as long as ``waits`` says (then return at once), each bringing one
    extent freed by a transaction and that transaction's commit."""

    def __init__(self, waits: list[float]) -> None:
        self.waits = waits
        self.polls = 0

    def wake_on(self, fd: int) -> None:
        pass

    def unread(self) -> bool:
        return False

    def poll(self, timeout_ms: int) -> list[object]:
        import time

        time.sleep(self.waits[self.polls % len(self.waits)])
        self.polls += 1
        now = time.monotonic_ns()
        return [FreedExtent(FS, 1, 1024 * self.polls, 16, False, now - 1, self.polls),
                JournalCommit(FS, self.polls, now)]


def test_a_poll_that_waited_for_a_wakeup_does_not_hold_the_next_polls_discard_back() -> None:
    """The rings are read at most every MIN_POLL_GAP_NS, the discard gather's pace (a poll in between could send no
    discard). Each poll's discard look is dated when the poll began: a poll that waited 0.3 s for a wakeup followed
    by one that returned at once are still a gather window apart, and each commit's extents leave after its own poll
    (dated at the return, the second look came 0.2 s after the first and waited for the third poll)."""
    import time

    from cachepilot.daemon.intake import MIN_POLL_GAP_NS
    from cachepilot.engine.discards import DISCARD_GATHER_NS

    assert MIN_POLL_GAP_NS >= DISCARD_GATHER_NS
    engine = Engine()
    engine.add_volume(INFO)
    probe = WakingProbe([0.3, 0.0])
    counters = Counters()
    sent: list[int] = []
    intake = Intake(engine, VolumeTable(), counters, Guard(counters), StopFlag(), lambda: probe,
                    lambda a, now: sent.append(probe.polls))
    t0 = time.monotonic()
    while probe.polls < 3:
        intake.wait(0.6)
    assert sent == [1, 2, 3]  # one FITRIM action per poll, each right after it
    assert time.monotonic() - t0 >= 2 * MIN_POLL_GAP_NS / 1e9  # the three polls a gap apart


class BulkDeletesProbe:
    """A probe whose kernel aggregated the deletes in its map (bulk_deletes): take_deletes hands them over once."""

    def __init__(self, recs: list[tuple[int, ...]]) -> None:
        self.arr = deletes_array(recs)
        self.takes = 0

    def take_deletes(self) -> np.ndarray:
        self.takes += 1
        arr, self.arr = self.arr, deletes_array([])
        return arr

    def drain_hotness_array(self) -> np.ndarray:
        return np.zeros(0, dtype=HOT_DTYPE)

    def drain_aggregates(self) -> list[object]:
        return []


def test_the_ticks_drain_takes_the_kernels_deletes_as_one_array_as_one_by_one_would() -> None:
    """Issue 32: the kernel keeps the deletes in a map and the tick's drain takes them all at once, before the
    hotness table (as the polled ones, held for the tick, went): no Delete object per file, the same engine state."""
    recs = [(FS, ino, 1 if ino != 4 else 9, 8192, 10 + ino) for ino in range(1, 9)]  # ino 4: another generation
    one_by_one = _engine_with_files(10)
    for r in recs:
        one_by_one.feed(Delete(FileKey(FS, r[1], r[2]), r[3], r[4]))
    engine = _engine_with_files(10)
    probe = BulkDeletesProbe(recs)
    counters = Counters()
    intake = Intake(engine, VolumeTable(), counters, Guard(counters), StopFlag(), lambda: probe,
                    lambda action, now: None)
    intake.drain(0)
    assert probe.takes == 1 and counters["events.Delete"] == len(recs)
    assert sorted(engine.hotness.index[FS]) == sorted(one_by_one.hotness.index[FS]) == [4, 9, 10]
    intake.drain(2_000_000_000)  # nothing new: nothing counted
    assert probe.takes == 2 and counters["events.Delete"] == len(recs)


def test_a_storm_of_file_decisions_is_logged_within_a_budget_and_the_rest_summed_up(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32 item 3: a tree removal decides discards by the hundred a tick; their INFO lines are held to the
    budget (20 per kind per 10 s) and the rest said as one line when the next window opens; every decision is still
    in the decision log, and control actions and failures are always said."""
    vols = VolumeTable()
    v = ManagedVolume(Found(INFO), backend=cast(Backend, object()), files=SpentPromoter())
    vols.add(v)
    actor = Actor(Engine(), vols, Counters(), lambda dev, why: None, lambda msg: None)
    clock = [0.0]
    actor.lines = LineBudget(clock=lambda: clock[0])
    trim = DiscardRanges("bcache0", FS, ((0, 4096),), "deleted")
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        for _ in range(500):
            actor.record(v, Outcome(trim, DONE))
        for i in range(3):
            actor.record(v, Outcome(SetKnob("bcache0", "writeback_percent", str(i), "hold"), DONE))
        actor.record(v, Outcome(trim, FAILED, error=RetryLater("busy")))
        lines = [r.getMessage() for r in caplog.records]
        assert len([m for m in lines if "discard" in m and "writeback" not in m]) == 20 + 1  # the budget + failure
        assert len([m for m in lines if "writeback_percent" in m]) == 3
        assert len(actor.decisions) == 504  # explain has every one
        clock[0] = 10.0  # the next window: the held-back ones said in one line, then this one
        caplog.clear()
        actor.record(v, Outcome(trim, DONE))
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2 and said[0].startswith("480 more discard decisions in 10 s"), said
