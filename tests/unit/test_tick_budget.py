"""The tick's budget for work that can wait (issue 21 item 6: the soak's ticks over 1 s were mostly the deferred
stage): file actions stop once the tick has run its share, the rest waits for the next tick in order, none lost
and none run twice; control actions (a drain, a write-policy switch) are never postponed."""

from __future__ import annotations

from typing import cast

from cachepilot.actions import DONE, PENDING, Action, DiscardRanges, Drain, Outcome, Promote, SetWritePolicy
from cachepilot.backends.base import Backend
from cachepilot.daemon.acting import POSTPONED, Actor
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.ticktime import DEFERRABLE_SHARE, TickBudget
from cachepilot.daemon.volume import ManagedVolume, VolumeTable
from cachepilot.daemon.volumes import Found
from cachepilot.engine.engine import Engine
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo

MS = 1_000_000
PERIOD = 1000 * MS
FS, FS2 = kdev(252, 1), kdev(252, 2)
INFO = VolumeInfo(dev=FS, name="bcache0", kind="bcache", fs_uuid="u-1", mountpoint="/mnt/x", cache_id="c-1")
INFO2 = VolumeInfo(dev=FS2, name="bcache1", kind="bcache", fs_uuid="u-2", mountpoint="/mnt/y", cache_id="c-2")


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


class SlowFiles:
    """File actuators whose every action takes ``cost_ms`` on the clock and is done."""

    def __init__(self, clock: Clock, cost_ms: int = 50) -> None:
        self.clock, self.cost = clock, cost_ms * MS
        self.ran: list[Action] = []

    def run(self, action: Promote | DiscardRanges, dry_run: bool) -> Outcome:
        self.clock.ns += self.cost
        self.ran.append(action)
        return Outcome(action, DONE, dry_run, actuated=True)


class SlowBackend:
    """A backend whose every control action takes ``cost_ms`` on the clock and is done."""

    def __init__(self, clock: Clock, cost_ms: int = 50) -> None:
        self.clock, self.cost = clock, cost_ms * MS
        self.applied: list[Action] = []

    def apply(self, action: Action, *, dry_run: bool = False) -> Outcome:
        self.clock.ns += self.cost
        self.applied.append(action)
        return Outcome(action, DONE, dry_run)


def promotions(n: int, volume: str = "bcache0", dev: int = FS) -> list[Action]:
    return [Promote(volume, dev, 100 + i, 1, ((0, 65536),), "hot") for i in range(n)]


def setup(clock: Clock, *infos: VolumeInfo) -> tuple[Actor, list[ManagedVolume], Counters, TickBudget]:
    vols = VolumeTable()
    made = []
    for info in infos:
        v = ManagedVolume(Found(info), backend=cast(Backend, SlowBackend(clock)), files=SlowFiles(clock))
        vols.add(v)
        made.append(v)
    counters = Counters()
    budget = TickBudget(clock)
    return Actor(Engine(), vols, counters, lambda dev, why: None, lambda msg: None, budget), made, counters, budget


def tick(actor: Actor, budget: TickBudget, clock: Clock, stage: str = "deferred") -> int:
    """One tick's deferred (or decide) stage on the fake clock; returns how long it took."""
    start = clock.ns
    budget.open(start, PERIOD)
    try:
        if stage == "deferred":
            actor.deferred(start, dry_run=False)
    finally:
        budget.close()
    return clock.ns - start


def test_forty_deferred_actions_of_50_ms_stop_within_the_budget_and_the_rest_go_next_tick_in_order() -> None:
    clock = Clock()
    actor, (v,), counters, budget = setup(clock, INFO)
    queued = promotions(40)
    v.deferred = list(queued)
    files = cast(SlowFiles, v.files)
    took = tick(actor, budget, clock)
    assert took <= PERIOD * DEFERRABLE_SHARE  # 10 of 50 ms: 500 ms, not the 2 s all 40 take
    assert files.ran == queued[:10] and v.deferred == queued[10:]  # the rest queued, in order
    assert counters["deferred_left"] == 30
    clock.ns += PERIOD
    tick(actor, budget, clock)
    assert files.ran == queued[:20] and v.deferred == queued[20:]
    while v.deferred:
        clock.ns += PERIOD
        tick(actor, budget, clock)
    assert files.ran == queued  # each once, in order, none lost
    assert counters["decisions.promote"] == 0  # carried on, not decided again


def test_what_was_not_reached_goes_ahead_of_what_was_deferred_again() -> None:
    clock = Clock()
    actor, (v,), _, budget = setup(clock, INFO)
    queued = promotions(12)
    v.deferred = list(queued)
    files = cast(SlowFiles, v.files)
    files.run = lambda action, dry_run: (  # type: ignore[method-assign]
        clock.__setattr__("ns", clock.ns + 50 * MS),
        files.ran.append(action),
        Outcome(action, PENDING, dry_run, deferred=action, actuated=True, reads=1, read_bytes=4096))[-1]
    tick(actor, budget, clock)
    assert v.deferred == queued[10:] + queued[:10]  # the two not reached first, then the ten it read a part of


def test_at_least_one_deferred_action_runs_even_when_the_tick_is_already_over_its_budget() -> None:
    clock = Clock()
    actor, (v,), _, budget = setup(clock, INFO)
    queued = promotions(3)
    v.deferred = list(queued)
    budget.open(clock.ns - PERIOD, PERIOD)  # the stages before took the whole period
    actor.deferred(clock.ns, dry_run=False)
    assert cast(SlowFiles, v.files).ran == queued[:1] and v.deferred == queued[1:]


def test_the_volumes_take_turns_at_going_first() -> None:
    clock = Clock()
    actor, (v1, v2), _, budget = setup(clock, INFO, INFO2)
    v1.deferred = promotions(20)
    v2.deferred = promotions(20, "bcache1", FS2)
    tick(actor, budget, clock)
    assert len(cast(SlowFiles, v1.files).ran) == 10 and cast(SlowFiles, v2.files).ran == []
    tick(actor, budget, clock)
    assert len(cast(SlowFiles, v2.files).ran) == 10  # its turn first: not starved by the other's queue


def test_past_the_budget_a_decided_promotion_is_postponed_once_and_a_drain_or_switch_still_runs() -> None:
    clock = Clock()
    actor, (v,), counters, budget = setup(clock, INFO)
    files, backend = cast(SlowFiles, v.files), cast(SlowBackend, v.backend)
    budget.open(clock.ns - PERIOD, PERIOD)  # spent
    p = Promote("bcache0", FS, 7, 1, ((0, 65536),), "hot")
    d = DiscardRanges("bcache0", FS, ((0, 65536),), "freed")
    drain = Drain("bcache0", 10**12, "periodic drain")
    switch = SetWritePolicy("bcache0", "writethrough", "latch")
    for a in (p, drain, d, switch):
        actor.execute(a, clock.ns, dry_run=False)
    budget.close()
    assert backend.applied == [drain, switch]  # safety actions are never postponed
    assert files.ran == [] and v.deferred == [p, d]  # the file actions wait, in the order decided
    assert counters["postponed"] == 2 and counters["decisions.promote"] == 1 and counters["decisions.discard"] == 1
    said = [x for x in actor.decisions if x["kind"] in ("promote", "discard")]
    assert [x["detail"] for x in said] == [POSTPONED, POSTPONED] and [x["status"] for x in said] == ["pending"] * 2
    clock.ns += PERIOD
    tick(actor, budget, clock)
    assert files.ran == [p, d] and v.deferred == []  # carried out next tick, once each
    assert counters["decisions.promote"] == 1 and counters["decisions.discard"] == 1  # one decision each


def test_between_ticks_nothing_is_postponed() -> None:
    clock = Clock()
    actor, (v,), counters, _ = setup(clock, INFO)
    d = DiscardRanges("bcache0", FS, ((0, 65536),), "freed")
    clock.ns = 10 * PERIOD
    actor.execute(d, clock.ns, dry_run=False)  # a commit's discards, out as they come
    assert cast(SlowFiles, v.files).ran == [d] and counters["postponed"] == 0
