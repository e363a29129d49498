"""Where a tick's time goes (daemon/ticktime.py): each stage's wall and CPU time booked, the slow tick said."""

from __future__ import annotations

import logging

import pytest

from cachepilot.daemon.counters import Counters
from cachepilot.daemon.ticktime import StageTimes
from cachepilot.exporter import DaemonSnapshot, SnapshotBox, make_registry
from cachepilot.exporter.exposition import text as render


class Clocks:
    def __init__(self) -> None:
        self.wall = self.cpu = 0

    def work(self, wall_ms: int, cpu_ms: int) -> None:
        self.wall += wall_ms * 1_000_000
        self.cpu += cpu_ms * 1_000_000


def times(c: Counters, clocks: Clocks) -> StageTimes:
    return StageTimes(c, wall_ns=lambda: clocks.wall, cpu_ns=lambda: clocks.cpu)


def test_each_stage_books_its_wall_and_cpu_time_per_tick_and_cumulatively() -> None:
    c, clocks = Counters(), Clocks()
    t = times(c, clocks)
    for _ in range(2):
        t.begin()
        t.timed("sample", lambda: clocks.work(800, 40))  # waited: wall far above CPU
        t.timed("decide", lambda: clocks.work(30, 30))
    assert t.last == {"sample": (800_000_000, 40_000_000), "decide": (30_000_000, 30_000_000)}
    assert c.group("tick_wall_ns") == {"sample": 1_600_000_000, "decide": 60_000_000}
    assert c.group("tick_cpu_ns") == {"sample": 80_000_000, "decide": 60_000_000}
    assert t.summary() == "sample 800/40 ms, decide 30/30 ms"


def test_a_failing_stage_is_still_booked() -> None:
    c, clocks = Counters(), Clocks()
    t = times(c, clocks)

    def boom() -> None:
        clocks.work(5, 5)
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        t.timed("step", boom)
    assert c["tick_wall_ns.step"] == 5_000_000


def test_an_overrun_is_said_at_info_once_a_minute_with_the_count_of_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    c, clocks = Counters(), Clocks()
    t = times(c, clocks)
    t.begin()
    t.timed("sample", lambda: clocks.work(1500, 10))
    caplog.set_level(logging.INFO, logger="cachepilot")
    s = 1_000_000_000
    for now in (10 * s, 11 * s, 12 * s, 80 * s):
        t.end(int(1.5 * s), s, now)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["tick overran: 1.50 s (wall/CPU: sample 1500/10 ms)",
                    "tick overran: 1.50 s (wall/CPU: sample 1500/10 ms); 2 more since the last said"]
    caplog.clear()
    t.end(int(0.2 * s), s, 81 * s)  # within the period: nothing at INFO
    assert not caplog.records


def test_the_stage_times_are_exported_as_counters_by_stage() -> None:
    box = SnapshotBox()
    box.publish(DaemonSnapshot(timestamp=0.0, start_time=0.0, ready=True, dry_run=False, observe_only=False,
                               stage_seconds={"sample": 1.5, "between": 20.0}, stage_cpu_seconds={"sample": 0.25}))
    text = render(make_registry(box).collect()).decode()
    assert 'cachepilot_tick_stage_seconds_total{kind="sample"} 1.5' in text
    assert 'cachepilot_tick_stage_seconds_total{kind="between"} 20.0' in text
    assert 'cachepilot_tick_stage_cpu_seconds_total{kind="sample"} 0.25' in text
