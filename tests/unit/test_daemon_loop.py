"""The tick loop (daemon/loop.py): ticks on time, overruns skipped, a stop from another thread, a deadline."""

from __future__ import annotations

import threading
import time

from cachepilot.daemon.loop import TickLoop
from tests.unit.daemon_rig import (
    NS,
)


def test_loop_ticks_on_time_and_skips_overruns() -> None:
    clock = [0]
    ticks: list[int] = []

    def wait(s: float) -> None:
        clock[0] += int(s * NS)

    def on_tick(now: int) -> None:
        ticks.append(now)
        if len(ticks) == 3:
            clock[0] += int(3.5 * NS)  # a tick that overran by three and a half periods
        if len(ticks) == 6:
            loop.stop()

    loop = TickLoop(1.0, on_tick, wait, clock_ns=lambda: clock[0])
    loop.run()
    assert ticks[:3] == [1 * NS, 2 * NS, 3 * NS]
    assert ticks[3] == 7 * NS  # 4, 5, 6 skipped rather than run back to back
    assert loop.skipped == 3 and loop.ticks == 6


def test_loop_stops_from_another_thread_within_a_wait() -> None:
    loop = TickLoop(10.0, lambda now: None)
    threading.Timer(0.1, loop.stop).start()
    t0 = time.monotonic()
    loop.run()
    assert time.monotonic() - t0 < 1.0


def test_loop_deadline() -> None:
    n = []
    loop = TickLoop(0.05, n.append)
    t0 = time.monotonic()
    loop.run(deadline_ns=loop.clock_ns() + int(0.3 * NS))
    assert time.monotonic() - t0 < 1.0 and 1 <= len(n) <= 7  # ends at the deadline (ticks: fewer on a busy host)
