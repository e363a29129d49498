"""Once a tick, each bcache volume's promoter hears how many read-miss inserts its cache refused
(``bcache_alloc_fail``, counted by the probe per cache device): it slows down, and what it read while they were
refused is read once more (cachepilot.actuators.allocpace)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cachepilot.daemon.volume import ManagedVolume


def pace_promotions(vols: Iterable[ManagedVolume], probe: Any, now: int) -> None:
    """``probe``: the loaded probe (None: not loaded, nothing is counted)."""
    count_of = getattr(probe, "alloc_failures", None)
    if count_of is None:
        return
    for v in vols:
        promoter = getattr(v.files, "promoter", None)
        if promoter is None or promoter.backoff is None:
            continue
        # the tracepoint names the cache device; the backing device below the volume never fails an insert
        count = sum(count_of(d) for d in v.found.lower)
        v.deferred.extend(promoter.alloc_failures(count, now))
