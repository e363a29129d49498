"""The garbage collector's pauses, kept out of the ticks.

CPython's full collection (generation 2) walks every tracked object; after start-up that is the whole of the
loaded code (the policy schema, the exporter, the probe's bindings: ~40 000 objects): 30-60 ms on the 2-core
development host, and the lab's emulated vCPU runs Python an order of magnitude slower: a pause of that size
lands inside whichever tick allocates past the threshold. The start-up objects live as long as the daemon, so
they are frozen once the daemon is ready (``gc.freeze``: moved to a generation the collector does not walk); later
collections walk only what was made since. Each full collection's pause is counted (``gc_ns.full``, ``gc.full``
in the status) so that the cost stays visible."""

from __future__ import annotations

import gc
import time
from typing import Any

from cachepilot.daemon.counters import Counters


class GcPauses:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._started = 0

    def freeze(self) -> None:
        """Everything alive now (start-up's objects) out of the collector's walks for good."""
        gc.collect()  # start-up's garbage first, so that it is not kept frozen
        gc.freeze()

    def watch(self) -> None:
        gc.callbacks.append(self._callback)

    def unwatch(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return  # young collections are short and frequent: not worth a clock read each
        if phase == "start":
            self._started = time.monotonic_ns()
        elif self._started:
            self.counters.add("gc_ns", "full", time.monotonic_ns() - self._started)
            self.counters.add("gc", "full")
            self._started = 0
