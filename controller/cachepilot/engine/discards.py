"""Discard scheduling: freed extents whose journal transaction committed leave as discards, paced by the
volume's discard budget; failed ones go back to the queue."""

from __future__ import annotations

from cachepilot.actions import Action, DiscardRanges
from cachepilot.engine.volumectl import NS, VolumeCtl


def plan_discards(c: VolumeCtl, now: int, out: list[Action]) -> None:
    """Ready extents leave as one action (coalesced: extents that touch become one range), within a token
    bucket of ``max_rate`` bytes per second holding at most max(1 s, interval) of it. A policy ``interval``
    above 0 batches: at most one look per interval (the old behaviour, for operators who want it)."""
    c.discard_due = False
    d = c.policy.discard_on_delete
    if not d.enabled or c.info.fs_discard:
        return
    if d.interval_s > 0:
        if now - c.last_discard_ns < d.interval_s * NS:
            return
        c.last_discard_ns = now
    cap = d.max_rate * max(1.0, d.interval_s)
    if c.discard_tokens < 0:
        c.discard_tokens = cap
    else:
        c.discard_tokens = min(cap, c.discard_tokens + d.max_rate * max(0, now - c.discard_refill_ns) / NS)
    c.discard_refill_ns = now
    bs = c.info.fs_block_size
    ranges = c.freed.take(now, int(c.discard_tokens) // bs)
    if not ranges:
        return
    total = sum(n for _, n in ranges) * bs
    c.discard_tokens -= total
    out.append(DiscardRanges(
        c.info.name, c.info.dev, tuple((s * bs, n * bs) for s, n in ranges),
        f"{len(ranges)} extent(s), {total} bytes freed by deletes and committed by the journal",
    ))


def requeue_failed(c: VolumeCtl, a: DiscardRanges) -> None:
    """A failed discard's ranges are freed extents again (the next look takes them)."""
    bs = c.info.fs_block_size
    c.freed.requeue([(off // bs, n // bs) for off, n in a.ranges])
