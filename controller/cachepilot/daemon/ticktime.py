"""Where a tick's time goes: each stage's wall and CPU time (this thread's), per tick and cumulative.

A stage whose wall time is far above its CPU time waited (for a lock, the disk, a subprocess, or the vCPU that
another process had); one whose CPU time is high did work. The cumulative times are counters (``tick_wall_ns.<stage>``
and ``tick_cpu_ns.<stage>`` in the status, ``cachepilot_tick_stage_*seconds_total`` in the metrics); a tick over
``SLOW_TICK_S`` is logged at DEBUG with its stages, one over the tick period (it made the loop skip ticks) at INFO,
at most once per ``OVERRUN_LOG_S`` (with how many more there were). Two clock reads per stage: cheap next to any
stage.

:class:`TickBudget` is the part of a tick that work which can wait may use (see there)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cachepilot.daemon.counters import Counters

log = logging.getLogger("cachepilot")
SLOW_TICK_S = 0.5  # a tick this long is logged with its stages (the soak's criterion is 1 s)
OVERRUN_LOG_S = 60.0
WALL, CPU = "tick_wall_ns", "tick_cpu_ns"
# Work that can wait starts only while the tick is younger than this share of its period. The soak's criterion is a
# tick under 1 s; in its slow ticks (30 min, issue 21) the stages that always run (drain, sample, decide's control
# actions, step, publish, state) took up to ~0.45 s wall on the shared vCPU, and one file action already started
# runs to its end (a FITRIM or a file's open and FIEMAP: tens of ms there): half the period leaves them room.
DEFERRABLE_SHARE = 0.5


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


class TickBudget:
    """How long into a tick work that can wait may still start: file actions (promotions, discards), whether pacing
    deferred them, the engine decided them this tick or a retry brings them back, start only until the tick has run
    ``DEFERRABLE_SHARE`` of its period; the rest waits on its volume's deferred list for the next tick, in order.
    Safety work (drains, write-policy switches, knobs, latches) is never under it. Between ticks nothing is spent:
    the discards a commit makes ready go as they come."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.clock_ns = clock_ns
        self.until_ns: int | None = None  # None: not in a tick

    def open(self, start_ns: int, period_ns: int) -> None:
        """A tick began at ``start_ns`` (on ``clock_ns``) and should end within ``period_ns``."""
        self.until_ns = start_ns + int(period_ns * DEFERRABLE_SHARE)

    def close(self) -> None:
        self.until_ns = None

    def spent(self) -> bool:
        return self.until_ns is not None and self.clock_ns() >= self.until_ns
