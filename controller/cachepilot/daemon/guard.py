"""How the daemon meets trouble without stopping (tuned's ``_try_call``): each stage of a tick runs guarded; an
expected condition (a ``CachepilotError``: bad input, a device gone, the kernel refusing) is counted by stage and
said once; anything else is a bug: counted apart, logged once with its traceback, never mistaken for an input
error. Either way the tick goes on with the next stage."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from cachepilot.daemon.counters import Counters
from cachepilot.errors import CachepilotError

log = logging.getLogger("cachepilot")
SAID_MAX = 1000  # distinct messages remembered; then the memory starts over (a message may be said again)


class Guard:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._said: set[str] = set()

    def once(self, msg: str) -> None:
        """Log an expected problem once (it may recur every tick)."""
        if msg not in self._said:
            if len(self._said) > SAID_MAX:
                self._said.clear()
            self._said.add(msg)
            log.warning("%s", msg)

    def bug(self, what: str, counted_in: str = "events.bugs") -> None:
        """Log the exception being handled with its traceback, once per kind of failure (it may recur per event)."""
        exc = sys.exc_info()[1]
        key = f"bug {what}: {type(exc).__name__}: {exc}"
        if key not in self._said:
            self._said.add(key)
            log.exception("bug while %s (counted in %s; the daemon goes on)", what, counted_in)

    def call(self, stage: str, fn: Callable[[int], object], now: int) -> bool:
        """Run one stage; False if it failed (counted in ``stage_errors.<stage>`` or ``stage_bugs.<stage>``)."""
        try:
            fn(now)
        except CachepilotError as exc:
            self.counters.add("stage_errors", stage)
            self.once(f"{stage}: {exc}")
            return False
        except Exception:  # a bug: its traceback, once; the loop goes on
            self.counters.add("stage_bugs", stage)
            self.bug(stage, f"stage_bugs.{stage}")
            return False
        return True
