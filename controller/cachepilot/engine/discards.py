"""Discard scheduling: freed extents whose journal transaction committed leave as discards, paced by the
volume's discard budget; failed ones go back to the queue."""

from __future__ import annotations

from cachepilot.actions import Action, DiscardRanges
from cachepilot.engine.volumectl import NS, VolumeCtl

# A commit's freed extents are looked for at most this often per volume (engine.discards): under an fsync load
# commits come several times a second, and each look cost an array pass over the ready set and a FITRIM action of
# its own (the headline fileserver: ~8 a second, a fifth of the daemon's CPU; issue 23 item 5). What the commits
# within this window made ready leaves in one action; a freed extent's discard waits at most this much longer
# (the first commit after a quiet spell is looked at at once). One second, the tick: each look costs a ring read and
# an array pass whatever it brings, and at 0.5 s the looks were still a third of the headline fileserver's daemon
# CPU under TCG; the delete -> discard p50 (goal <= 1 s) grows by about a quarter second.
DISCARD_GATHER_NS = 1_000_000_000


def gather_due(c: VolumeCtl, now: int, *, prompted: bool = True) -> bool:
    """Whether a look at the volume's freed extents is due now. A commit-prompted one (``prompted``: only when a
    commit came; ``discard_due`` stays set until a look that the policy's interval lets through) at most once per
    DISCARD_GATHER_NS, and counted as made. The tick's own look (which hands out what the budget or a granule held
    back) is skipped within a window after a commit-prompted one: that look took what was ready, and the next
    commit's look takes what came since."""
    recent = c.discard_look_ns is not None and 0 <= now - c.discard_look_ns < DISCARD_GATHER_NS
    if not prompted or recent or not c.discard_due:
        return not prompted and not recent
    c.discard_look_ns = now
    return True


def plan_discards(c: VolumeCtl, now: int, out: list[Action]) -> None:
    """Ready extents leave as one action (coalesced: extents that touch become one range), within a token
    bucket of ``max_rate`` bytes per second holding at most max(1 s, interval) of it. A policy ``interval``
    above 0 batches: at most one look per interval (the old behaviour, for operators who want it); a commit that
    came within it stays due (``discard_due``), so that the first look after the interval takes what it freed."""
    d = c.policy.discard_on_delete
    if not d.enabled or c.info.fs_discard:
        c.discard_due = False
        return
    if d.interval_s > 0:
        if now - c.last_discard_ns < d.interval_s * NS:
            return
        c.last_discard_ns = now
    c.discard_due = False
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
