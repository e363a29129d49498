"""Pacing (issue 31): hold the exposure bound with a short origin queue. Between the periodic drains a destructive
volume's cache writes back at about the volume's own write rate instead of letting dirty data sit until the drain
bursts it out, so each drain finds little to write and the fsyncs that land during it wait behind little.

The lever is the kind's write-back rate floor (Capabilities.pace_knob; bcache's writeback_rate_minimum): set to
PACE_FACTOR x the write rate the probe measures (Exposure.write_rate), at least MIN_PACE, changed only when it moves
by more than CHANGE from the value last asked for (no churn of sysfs writes), put back when pacing ends (the model, a
latch, a breach, write-back left) and when the daemon stops. Opt-in per volume (``exposure.pace``) until the
benchmark says it pays; a knob the policy pins is left to the policy."""

from __future__ import annotations

from collections.abc import Callable

from cachepilot.engine.exposure import Exposure
from cachepilot.engine.volumectl import VolumeCtl, normalise_mode
from cachepilot.models.volume import WRITEBACK

SECTOR = 512
PACE_FACTOR = 1.25  # write back a little faster than the volume writes: dirty data shrinks between drains
MIN_PACE = 1 << 20  # bytes/s: the floor's least value while pacing (a trickle of writes still moves)
CHANGE = 0.25  # a new floor only when it differs from the one read back by more than this share


class Pacer:
    def __init__(self, exposure: Exposure) -> None:
        self.exposure = exposure
        # volumes (dev) whose floor this run asked for and has not put back -> the value asked for (sectors/s;
        # the floor is not among a sample's knobs: one sysfs read a tick less)
        self.paced: dict[int, int] = {}

    def steer(self, c: VolumeCtl, now: int, request: Callable[[str, str, str], None],
              put_back: Callable[[str, str], None]) -> None:
        """Ask for the floor (request(knob, value, why)), or put it back (put_back(knob, why)) when pacing ends."""
        knob = c.caps.pace_knob
        if knob is None or knob in c.policy.knobs:
            return
        why_not = self._off(c, now)
        if why_not:
            if self.paced.pop(c.info.dev, None) is not None:
                put_back(knob, f"pacing ends: {why_not}")
            return
        w = self.exposure.write_rate(c, now)
        pace = max(MIN_PACE, PACE_FACTOR * w)
        sectors = -(-int(pace) // SECTOR)
        have = self.paced.get(c.info.dev)
        if have is not None and abs(have - sectors) <= CHANGE * max(have, sectors):
            return
        self.paced[c.info.dev] = sectors
        request(knob, str(sectors), (
            f"pacing: write back at {sectors * SECTOR / (1 << 20):.2f} MiB/s between drains ({PACE_FACTOR:g}x the"
            f" volume's writes, {w / (1 << 20):.2f} MiB/s over the last 10 s), so a drain finds little dirty data and"
            f" the fsyncs during it wait behind a short origin queue"))

    def _off(self, c: VolumeCtl, now: int) -> str:
        """Why the volume is not paced now ("" when it is)."""
        if not c.policy.exposure.pace:
            return "exposure.pace is off"
        if c.latch is not None or c.breach is not None:
            return "latched" if c.latch is not None else "an exposure breach is being answered"
        if c.state.samples == 0 or normalise_mode(c.state.mode) != WRITEBACK:
            return "not in write-back"
        fm, _ = self.exposure.failure_model(c, now)
        return "" if fm == "destructive" else f"failure model {fm}"
