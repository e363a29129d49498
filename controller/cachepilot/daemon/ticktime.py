"""Where a tick's time goes: each stage's wall and CPU time (this thread's), per tick and cumulative.

A stage whose wall time is far above its CPU time waited (for a lock, the disk, a subprocess, or the vCPU that
another process had); one whose CPU time is high did work. The cumulative times are counters (``tick_wall_ns.<stage>``
and ``tick_cpu_ns.<stage>`` in the status, ``cachepilot_tick_stage_*seconds_total`` in the metrics); a tick over
``SLOW_TICK_S`` is logged at DEBUG with its stages, one over the tick period (it made the loop skip ticks) at INFO,
at most once per ``OVERRUN_LOG_S`` (with how many more there were). Two clock reads per stage: cheap next to any
stage."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cachepilot.daemon.counters import Counters

log = logging.getLogger("cachepilot")
SLOW_TICK_S = 0.5  # a tick this long is logged with its stages (the soak's criterion is 1 s)
OVERRUN_LOG_S = 60.0
WALL, CPU = "tick_wall_ns", "tick_cpu_ns"


class StageTimes:
    def __init__(self, counters: Counters, *, wall_ns: Callable[[], int] = time.monotonic_ns,
                 cpu_ns: Callable[[], int] = time.thread_time_ns) -> None:
        self.counters = counters
        self.wall_ns, self.cpu_ns = wall_ns, cpu_ns
        self.last: dict[str, tuple[int, int]] = {}  # this tick's stages: name -> (wall ns, CPU ns)
        self._next_overrun_log = 0
        self._overruns_unsaid = 0

    def begin(self) -> None:
        self.last = {}

    def timed(self, name: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` (a stage, already guarded) and book its times under ``name``."""
        w0, c0 = self.wall_ns(), self.cpu_ns()
        try:
            fn()
        finally:
            w, c = self.wall_ns() - w0, self.cpu_ns() - c0
            pw, pc = self.last.get(name, (0, 0))
            self.last[name] = (pw + w, pc + c)
            self.counters.add(WALL, name, w)
            self.counters.add(CPU, name, c)

    def summary(self) -> str:
        """This tick's stages, longest first: ``sample 812/40 ms`` (wall/CPU), those under 1 ms left out."""
        rows = sorted(self.last.items(), key=lambda kv: -kv[1][0])
        return ", ".join(f"{name} {w / 1e6:.0f}/{c / 1e6:.0f} ms" for name, (w, c) in rows if w >= 1_000_000)

    def end(self, tick_ns: int, period_ns: int, now_ns: int) -> None:
        """The tick took ``tick_ns`` (ending at ``now_ns``): log it if slow."""
        if tick_ns >= period_ns:
            if now_ns >= self._next_overrun_log:
                more = f"; {self._overruns_unsaid} more since the last said" if self._overruns_unsaid else ""
                log.info("tick overran: %.2f s (wall/CPU: %s)%s", tick_ns / 1e9, self.summary() or "-", more)
                self._next_overrun_log = now_ns + int(OVERRUN_LOG_S * 1e9)
                self._overruns_unsaid = 0
                return
            self._overruns_unsaid += 1
        if tick_ns >= SLOW_TICK_S * 1e9 and log.isEnabledFor(logging.DEBUG):
            log.debug("slow tick: %.2f s (wall/CPU: %s)", tick_ns / 1e9, self.summary() or "no stage over 1 ms")
