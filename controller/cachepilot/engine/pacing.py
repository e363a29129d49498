"""Paced drains (issue 31, opt-in by ``exposure.pace``): hold the exposure bound with a short origin queue.

A periodic drain at the kernel's full rate (bcache: ``writeback_percent`` 0, so ``writeback_delay()`` returns 0 and
``read_dirty()`` keeps up to 64 write-backs in flight, ``sema_init(&dc->in_flight, 64)`` in writeback.c) fills the
origin's queue for the drain's length; every fsync's flush that lands then waits behind it (W1's fsync p99 of
520-600 ms, in every bounded stock configuration as in cachepilot's). A paced drain writes back at PACE_SHARE of the
volume's measured full write-back rate instead, through the kind's rate floor (Capabilities.pace_knob), so the
origin keeps room for the foreground; it takes 1/PACE_SHARE as long, so it starts that much earlier (Drains.lead).

An earlier lever, a rate floor *between* drains, was measured not to pay (one quick W1 round: 0.79x the ops/s,
more origin bytes, no better fsync tail: the drains still burst) and was replaced by this one."""

from __future__ import annotations

from cachepilot.engine.volumectl import NS, VolumeCtl

PACE_SHARE = 0.5  # of the measured full write-back rate: the origin keeps the other half for the foreground
MIN_PACE = 1 << 20  # bytes/s: the least rate a paced drain asks for (a drain must end)


def full_rate(c: VolumeCtl) -> float:
    """The volume's write-back rate at full speed, bytes/s, from its measured drains (Drains.measured keeps a
    paced drain's duration scaled to full speed); 0 before any drain was measured."""
    done = c.drains_done
    if not done:
        return 0.0
    return sum(b for b, _ in done) * NS / max(1, sum(t for _, t in done))


def paced(c: VolumeCtl) -> bool:
    """Whether the volume's periodic drains are paced: opted in, a kind with a rate floor the policy does not pin,
    and a measured full rate to take a share of (the first drain runs at full speed and measures it)."""
    knob = c.caps.pace_knob
    return (c.policy.exposure.pace and knob is not None and knob not in c.policy.knobs
            and full_rate(c) > 0)


def drain_rate(c: VolumeCtl) -> int:
    """The rate a periodic drain asks for, bytes/s; 0: the kernel's full rate."""
    if not paced(c):
        return 0
    return max(MIN_PACE, int(PACE_SHARE * full_rate(c)))
