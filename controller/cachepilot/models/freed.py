"""Freed extents of one filesystem, waiting to become discards ("where does a delete become a discard").

Life of an extent (units: filesystem blocks):

1. ``freed()`` — the kernel freed it (FreedExtent). It is *pending*: the journal transaction that freed it
   has not committed, so the blocks may not be discarded yet.
2. ``commit()`` — a JournalCommit at time T makes every extent freed at or before T *ready*. Ready extents
   are kept as sorted, disjoint intervals and coalesced with touching neighbours (never across a gap).
3. ``take()`` — ready intervals are cut to the discard granularity (start rounded up, end rounded down,
   so a range never grows beyond what was freed) and handed out. Fragments smaller than one granule stay
   (a later neighbour may complete them) until ``max_hold_ns``, then they are dropped and counted.

``allocated()`` removes blocks that were reused before they were trimmed, from both stages.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from cachepilot.errors import UserError


@dataclass(slots=True)
class FreedStats:
    freed_blocks: int = 0
    handed_blocks: int = 0
    dropped_small_blocks: int = 0
    reallocated_blocks: int = 0


class FreedExtentQueue:
    def __init__(self, granularity_blocks: int = 1, max_hold_ns: int = 60_000_000_000) -> None:
        if granularity_blocks < 1:
            raise UserError(f"discard granularity must be at least one block, got {granularity_blocks}")
        self.granularity = granularity_blocks
        self.max_hold_ns = max_hold_ns
        self.pending: list[tuple[int, int, int]] = []  # (ts_ns, start, end) in arrival order
        self._starts: list[int] = []  # ready intervals [start, end), sorted, disjoint, non-touching
        self._ends: list[int] = []
        self._since: list[int] = []  # when each ready interval became ready (oldest part)
        self.stats = FreedStats()

    # ------------------------------------------------------------ input
    def freed(self, block: int, count: int, ts_ns: int) -> None:
        if block < 0 or count < 0:
            raise UserError(f"freed extent with negative block or count ({block}, {count})")
        if count == 0:
            return
        self.pending.append((ts_ns, block, block + count))
        self.stats.freed_blocks += count

    def commit(self, ts_ns: int) -> int:
        """Journal committed at ts_ns: extents freed up to then become ready. Returns blocks made ready."""
        keep: list[tuple[int, int, int]] = []
        moved = 0
        for item in self.pending:
            ts, s, e = item
            if ts <= ts_ns:
                self._insert(s, e, ts_ns)
                moved += e - s
            else:
                keep.append(item)
        self.pending = keep
        return moved

    def _insert(self, s: int, e: int, now: int) -> None:
        starts, ends, since = self._starts, self._ends, self._since
        i = bisect.bisect_left(ends, s)  # first interval whose end >= s (touching or overlapping)
        j = i
        ts = now
        while j < len(starts) and starts[j] <= e:
            s = min(s, starts[j])
            e = max(e, ends[j])
            ts = min(ts, since[j])
            j += 1
        starts[i:j] = [s]
        ends[i:j] = [e]
        since[i:j] = [ts]

    def allocated(self, block: int, count: int) -> None:
        """Blocks were reused: never hand them out."""
        s0, e0 = block, block + count
        newp = []
        for ts, s, e in self.pending:
            if e <= s0 or s >= e0:
                newp.append((ts, s, e))
                continue
            self.stats.reallocated_blocks += min(e, e0) - max(s, s0)
            if s < s0:
                newp.append((ts, s, s0))
            if e > e0:
                newp.append((ts, e0, e))
        self.pending = newp
        starts, ends, since = self._starts, self._ends, self._since
        i = bisect.bisect_right(ends, s0)
        j = i
        repl_s: list[int] = []
        repl_e: list[int] = []
        repl_t: list[int] = []
        while j < len(starts) and starts[j] < e0:
            s, e, t = starts[j], ends[j], since[j]
            self.stats.reallocated_blocks += min(e, e0) - max(s, s0)
            if s < s0:
                repl_s.append(s)
                repl_e.append(s0)
                repl_t.append(t)
            if e > e0:
                repl_s.append(e0)
                repl_e.append(e)
                repl_t.append(t)
            j += 1
        starts[i:j] = repl_s
        ends[i:j] = repl_e
        since[i:j] = repl_t

    # ------------------------------------------------------------ output
    @property
    def ready_blocks(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    @property
    def pending_blocks(self) -> int:
        return sum(e - s for _, s, e in self.pending)

    def ready(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def take(self, now_ns: int, max_blocks: int | None = None) -> list[tuple[int, int]]:
        """Ranges (start, count) to trim now, aligned to the granularity; at most max_blocks in total."""
        g = self.granularity
        out: list[tuple[int, int]] = []
        budget = max_blocks if max_blocks is not None else 1 << 62
        ks: list[int] = []
        ke: list[int] = []
        kt: list[int] = []
        for s, e, t in zip(self._starts, self._ends, self._since, strict=True):
            a = -(-s // g) * g
            b = (e // g) * g
            if budget > 0 and b - a >= g:
                if b - a > budget:
                    b = a + (budget // g) * g
                if b > a:
                    out.append((a, b - a))
                    budget -= b - a
                    self.stats.handed_blocks += b - a
                    if s < a:
                        ks.append(s)
                        ke.append(a)
                        kt.append(t)
                    if b < e:
                        ks.append(b)
                        ke.append(e)
                        kt.append(t)
                    continue
            if now_ns - t > self.max_hold_ns and (b - a < g):
                self.stats.dropped_small_blocks += e - s
                continue
            ks.append(s)
            ke.append(e)
            kt.append(t)
        self._starts, self._ends, self._since = ks, ke, kt
        return out
