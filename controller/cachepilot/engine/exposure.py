"""The exposure estimate the write policy, drains and knobs share: the failure model in effect and the dirty
bytes the next sample may show."""

from __future__ import annotations

from cachepilot.engine.pacing import full_rate
from cachepilot.engine.volumectl import NS, VolumeCtl
from cachepilot.models.hotness import HotnessTable
from cachepilot.models.volume import WRITETHROUGH

READ_MOSTLY_WRITE_SHARE = 0.1  # a volume is read-mostly below this share of written bytes ...
READ_MOSTLY_BARRIERS = 1.0  # ... and this many journal commits/flush epochs per second
LEAVE_FACTOR = 2.0  # hysteresis: it stops being read-mostly only at twice both marks
RECENT_IO_NS = 120 * NS  # the window of the recent write share
WRITE_RATE_NS = 10 * NS  # the window of the write rate that decides whether write-back can keep the bound
MIN_RECENT_IO = 16 << 20  # bytes a window must see before it says anything about the volume


def read_mostly(write_share: float, barrier_rate: float, leaving: bool = False) -> bool:
    """Whether a volume's I/O is read-mostly: few of its bytes are writes and it seldom asks for durability. With
    ``leaving`` (it is being treated as read-mostly now) the marks are LEAVE_FACTOR higher, so a volume near them
    does not flap."""
    k = LEAVE_FACTOR if leaving else 1.0
    return write_share < k * READ_MOSTLY_WRITE_SHARE and barrier_rate < k * READ_MOSTLY_BARRIERS


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
        if read_mostly(wfrac, rate) and WRITETHROUGH in c.caps.modes:
            return "read-mostly", f"auto: read-mostly ({wfrac:.0%} writes, {rate:.1f} barriers/s)"
        return "destructive", "auto: destructive"

    def recent_io(self, c: VolumeCtl, now: int) -> tuple[int, int]:
        """(read bytes, write bytes) the volume's files saw over about the last RECENT_IO_NS (the probe's counts;
        once a tick: each call records a mark)."""
        counts = tuple(self.hotness.dev_bytes.get(c.info.dev, (0, 0)))  # a copy: the table's list keeps growing
        c.recent_io.note(now, counts, RECENT_IO_NS)
        rb, wb = c.recent_io.growth()
        return rb, wb

    def write_rate(self, c: VolumeCtl, now: int) -> float:
        """Bytes/s the volume's files wrote below the page cache over about the last WRITE_RATE_NS (the probe's
        counts; once a tick): what lands in the cache as new dirty data in write-back."""
        c.write_io.note(now, (self.hotness.dev_bytes.get(c.info.dev, (0, 0))[1],), WRITE_RATE_NS)
        if len(c.write_io.marks) < 2:
            return 0.0
        span = c.write_io.marks[-1][0] - c.write_io.marks[0][0]
        return c.write_io.growth()[0] * NS / span if span > 0 else 0.0

    @staticmethod
    def writeback_rate(c: VolumeCtl, now: int) -> float:
        """Bytes/s the volume writes back at full rate, as measured: the last drains (their bytes over their
        durations) or, in a write-through stretch the bound forced, how fast dirty data fell since it began (a
        switch to write-through drains at full rate); the larger. 0: not measured yet."""
        drains = full_rate(c)
        fell = 0.0
        b = c.bound_wt
        if b is not None:
            st = c.state
            if b.clean_ns is None and st.dirty_bytes == 0 and st.last_ts >= b.since_ns:
                b.clean_ns = st.last_ts
            until = b.clean_ns if b.clean_ns is not None else now
            gone = b.dirty_bytes if b.clean_ns is not None else max(0, b.dirty_bytes - st.dirty_bytes)
            fell = gone * NS / max(tick_ns(c, now), until - b.since_ns)
        return max(drains, fell)

    def projected_dirty(self, c: VolumeCtl, now: int) -> tuple[int, float]:
        """Dirty bytes the next sample may show: the last one plus the peak growth rate over the time from that
        sample to the next tick. (projected, rate in bytes/s)."""
        st = c.state
        rate = st.dirty_rate()
        horizon_ns = max(0, now - st.last_ts) + tick_ns(c, now)
        return st.dirty_bytes + int(rate * horizon_ns / NS), rate
