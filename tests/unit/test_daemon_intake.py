"""The probe's events into the engine (daemon/intake.py): the hotness table every other second, the rings at most
every poll gap, a commit's discards at the poll that brought it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypeVar

from cachepilot.actions import DiscardRanges
from cachepilot.events import FileKey, HotnessDelta
from tests.unit.daemon_rig import (
    DEV,
    POLICY_DESTRUCTIVE,
    VOL,
    CountingProbe,
    FakeBackend,
    Rig,
)


def test_the_probes_hotness_table_is_taken_every_other_second(tmp_path: Path) -> None:
    """At most one take a tick, and at most one per HOTNESS_EVERY_NS (2 s; a tick a little early still takes it):
    at 1 s ticks, every other tick (each take is a swap of the kernel table's halves, an RCU grace period, and an
    array pass with admission after it; issue 23 item 5). The ticks between say so to the engine (hot_fresh)."""
    seen: dict[str, object] = {}
    r = Rig(tmp_path)
    r.d.probe_factory = lambda n: CountingProbe(seen, r.backend(VOL))
    r.d.start()
    fresh = []
    for t in (1, 2, 3, 3.9, 5, 6.8):
        r.tick(t)
        fresh.append(r.d.intake.hot_fresh)
    assert seen["probe"].table_drains == 4  # type: ignore[attr-defined]  # 6 before
    assert fresh == [True, False, True, False, True, True]
    r.d.shutdown()


P = TypeVar("P", bound=CountingProbe)


def started(tmp_path: Path, probe: type[P]) -> tuple[Rig, P]:
    """A daemon rig on one fake bcache volume, started with ``probe`` as its probe; the rig and that probe."""
    seen: dict[str, object] = {}
    r = Rig(tmp_path)
    b = FakeBackend(VOL)
    r.backends["bcache0"] = b
    r.d.probe_factory = lambda n: probe(seen, b)
    r.d.start()
    p = seen["probe"]
    assert isinstance(p, probe)
    return r, p


class BusyProbe(CountingProbe):
    """A probe whose rings always have something: every poll returns at once with an event."""

    def __init__(self, seen: dict[str, object], backend: FakeBackend) -> None:
        super().__init__(seen, backend)
        self.polls = 0

    def poll(self, timeout_ms: int) -> list[object]:
        self.polls += 1
        return [HotnessDelta(FileKey(DEV, 12, 1), 1, 0, 4096, 0, 1, 4096)]


def test_the_daemon_takes_the_rings_at_most_every_poll_gap(tmp_path: Path) -> None:
    """Under a storm the kernel may wake the daemon every 20 ms; it looks at most every MIN_POLL_GAP_NS (1 s, the
    discard gather's pace) and lets records gather in between (before: one look per wakeup, ~50 a second; then
    ten, four, then two a second, which cost the headline fileserver's daemon a ring read and a discard look each)."""
    r, p = started(tmp_path, BusyProbe)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.1:
        r.d._wait(0.2)
    assert 2 <= p.polls <= 3, p.polls  # 2.1 s / 1 s, not one per call (nor one per 0.5 s: 4 or 5)
    r.d.request_stop()
    t1 = time.monotonic()
    r.d._wait(0.2)  # a stop request ends a gap's wait at once
    assert time.monotonic() - t1 < 0.05
    r.d.shutdown()


class CommitProbe(CountingProbe):
    """A probe whose next poll brings a freed extent and the commit of its transaction."""

    def __init__(self, seen: dict[str, object], backend: FakeBackend) -> None:
        super().__init__(seen, backend)
        self.events: list[object] = []

    def poll(self, timeout_ms: int) -> list[object]:
        out, self.events = self.events, []
        return out


def test_a_commit_polled_between_ticks_is_discarded_at_that_poll(tmp_path: Path) -> None:
    """The discard goes out right after the poll that brought the commit, not at the next tick."""
    from cachepilot.events import FreedExtent, JournalCommit

    seen: dict[str, object] = {}
    r = Rig(tmp_path, POLICY_DESTRUCTIVE.replace("{enabled: false}", "{enabled: true, min_extent: 4KiB}"))
    r.d.probe_factory = lambda n: CommitProbe(seen, r.backend(VOL))
    r.d.start()
    r.tick(1)
    probe = seen["probe"]
    probe.events = [FreedExtent(DEV, 5, 100, 10, False, 1, tid=3), JournalCommit(DEV, 3, 2)]  # type: ignore[attr-defined]
    r.d.intake._next_poll = 0.0  # noqa: SLF001 (the poll gap has passed)
    r.d._wait(0.01)  # noqa: SLF001 (the loop's wait between ticks)
    ran = [a for a, _ in r.d.vols[DEV].files.ran if isinstance(a, DiscardRanges)]
    assert [a.ranges for a in ran] == [((100 * 4096, 10 * 4096),)]
    r.d.shutdown()


class WaitingProbe(CountingProbe):
    """Records wait in its rings (they came within the wake period of the last wakeup: none woke a poll)."""

    def __init__(self, seen: dict[str, object], backend: FakeBackend) -> None:
        super().__init__(seen, backend)
        self.timeouts: list[int] = []
        self.waiting = True

    def unread(self) -> bool:
        return self.waiting

    def poll(self, timeout_ms: int) -> list[object]:
        self.timeouts.append(timeout_ms)
        return []


def test_records_that_came_during_the_gap_are_read_at_its_end_without_waiting_for_a_wakeup(tmp_path: Path) -> None:
    """The ring wakes the daemon at most every RING_WAKE_EVERY_NS: a commit a few ms after the freed extent whose
    wakeup ended the last look makes none. At the gap's end the daemon reads what waits at once (poll 0), and waits
    for a wakeup only when nothing does (before: it waited until the tick, delete -> discard p50 1.3 s)."""
    r, p = started(tmp_path, WaitingProbe)
    r.d.intake._next_poll = 0  # the gap has passed
    r.d._wait(0.5)
    p.waiting = False
    r.d.intake._next_poll = 0
    r.d._wait(0.5)
    assert p.timeouts == [0, 500]
    r.d.shutdown()
