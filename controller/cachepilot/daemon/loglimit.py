"""Log lines under storms: at most ``burst`` lines of one key (a file action's kind) per window; the rest are
counted and said in one line when the key's next window opens. A re-warm or a tree removal decides promotions and
discards by the hundred a tick: a line each cost the daemon its formatting and the journal its space, and buried the
rare control decisions an operator looks for. Every decision stays in the decision log (``explain``)."""

from __future__ import annotations

import time
from collections.abc import Callable

WINDOW_S = 10.0
BURST = 20


class LineBudget:
    def __init__(self, window_s: float = WINDOW_S, burst: int = BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.burst, self.clock = window_s, burst, clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, lines said, lines held back)

    def take(self, key: str) -> tuple[bool, int]:
        """(whether a line of ``key`` may be said now, how many were held back in the key's window that just
        ended: to be said first, as one line)."""
        now = self.clock()
        start, said, held = self._windows.get(key, (now, 0, 0))
        ended = 0
        if now - start >= self.window_s:
            start, said, ended, held = now, 0, held, 0
        ok = said < self.burst
        self._windows[key] = (start, said + ok, held + (not ok))
        return ok, ended
