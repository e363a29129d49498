"""The exposure estimate the write policy, drains and knobs share: the failure model in effect and the dirty
bytes the next sample may show."""

from __future__ import annotations

from cachepilot.engine.volumectl import NS, VolumeCtl
from cachepilot.models.hotness import HotnessTable
from cachepilot.models.volume import WRITETHROUGH


def tick_ns(c: VolumeCtl, now: int) -> int:
    """The tick length, as last observed (1 s before the second tick)."""
    return max(1, now - c.last_tick_ns) if c.last_tick_ns is not None and now > c.last_tick_ns else NS


class Exposure:
    """The failure model (``auto`` resolved from the volume's write share and barrier rate) and the dirty projection."""

    def __init__(self, hotness: HotnessTable) -> None:
        self.hotness = hotness

    def failure_model(self, c: VolumeCtl, now: int) -> tuple[str, str]:
        """The failure model in effect (auto resolved) and why."""
        fm = c.policy.failure_model
        if fm != "auto":
            return fm, f"failure model {fm}"
        rb, wb = self.hotness.dev_bytes.get(c.info.dev, (0, 0))
        total = rb + wb
        wfrac = wb / total if total else 0.0
        rate = c.epochs.stats(now).barrier_rate
        if wfrac < 0.1 and rate < 1.0 and WRITETHROUGH in c.caps.modes:
            return "read-mostly", f"auto: read-mostly ({wfrac:.0%} writes, {rate:.1f} barriers/s)"
        return "destructive", "auto: destructive"

    def projected_dirty(self, c: VolumeCtl, now: int) -> tuple[int, float]:
        """Dirty bytes the next sample may show: the last one plus the peak growth rate over the time from that
        sample to the next tick. (projected, rate in bytes/s)."""
        st = c.state
        rate = st.dirty_rate()
        horizon_ns = max(0, now - st.last_ts) + tick_ns(c, now)
        return st.dirty_bytes + int(rate * horizon_ns / NS), rate
