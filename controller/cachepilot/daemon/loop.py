"""The tick loop, shared by `cachepilot run`, `record` and `probe` (tuned's daemon loop: wait on a stop event with a
time-out, do the periodic work, repeat).

Between ticks the loop *waits*: by default on its stop event; a caller with a probe passes a ``wait`` that polls the
probe's ring buffer instead, so discrete events are handled as they come and the loop still wakes for every tick.
A tick that overruns does not make the next ones bunch up: missed ticks are skipped and counted.

A ``wait`` that may ignore a stop request is given at most MAX_WAIT_S at a time (the loop looks at the flag between);
one that returns at a stop request (``wait_sees_stop``: the daemon's, whose probe wakes on the stop flag) is given
the whole time to the next tick. Each return costs a wake-up of the process and the wait's own work; five a second
were a fifth of the daemon's between-ticks CPU under the lab's TCG vCPU (issue 32).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachepilot.daemon.stopflag import StopFlag

MAX_WAIT_S = 0.2  # a stop request (signal) is seen within this long even if ``wait`` ignores it


class TickLoop:
    def __init__(
        self,
        tick_s: float,
        on_tick: Callable[[int], None],
        wait: Callable[[float], None] | None = None,
        *,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wait_sees_stop: bool = False,
    ) -> None:
        if tick_s <= 0:
            raise ValueError("tick must be > 0")
        self.tick_ns = int(tick_s * 1e9)
        self.on_tick = on_tick
        self.stop_event = StopFlag()  # set from signal handlers: threading.Event can deadlock there
        self._wait = wait
        # the longest single wait: the whole tick when the wait itself returns at a stop request (or is the loop's own)
        self.max_wait_s = float("inf") if wait is None or wait_sees_stop else MAX_WAIT_S
        self.waits = 0  # waits so far (each one a return to this loop: what wait_sees_stop saves)
        self.clock_ns = clock_ns
        self.ticks = 0
        self.skipped = 0
        self.last_tick_ns = 0
        self.last_duration_ns = 0

    def stop(self) -> None:
        """Safe from a signal handler or another thread."""
        self.stop_event.set()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def wait(self, seconds: float) -> None:
        if self._wait is None:
            self.stop_event.wait(seconds)
        else:
            self._wait(seconds)

    def run(self, *, deadline_ns: int | None = None) -> None:
        """Tick until stopped (or until ``deadline_ns`` on the loop's clock)."""
        next_ns = self.clock_ns() + self.tick_ns
        while not self.stop_event.is_set():
            now = self.clock_ns()
            if deadline_ns is not None and now >= deadline_ns:
                return
            if now < next_ns:
                until = next_ns if deadline_ns is None else min(next_ns, deadline_ns)
                self.waits += 1
                self.wait(min(self.max_wait_s, (until - now) / 1e9))
                continue
            self.on_tick(now)
            done = self.clock_ns()
            self.ticks += 1
            self.last_tick_ns = now
            self.last_duration_ns = done - now
            next_ns += self.tick_ns
            if next_ns <= done:  # overran: skip what was missed rather than tick back to back
                missed = (done - next_ns) // self.tick_ns + 1
                self.skipped += missed
                next_ns += missed * self.tick_ns
