"""Freed extents of one filesystem, waiting to become discards ("where does a delete become a discard").

Life of an extent (units: filesystem blocks):

1. ``freed()`` -- the kernel freed it (FreedExtent) in journal transaction ``tid``. It is *pending*: until that
   transaction commits, ext4 keeps the blocks out of its buddy bitmap, so a FITRIM would skip them.
2. ``commit()`` -- a JournalCommit of transaction T makes every extent freed in a transaction ``tid`` with
   ``tid_geq(T, tid)`` *ready* (jbd2 tids are u32 and wrap, compared as the kernel's ``tid_geq``). jbd2 opens
   T+1 before T's commit event fires, so a timestamp would not do: a free in T+1 waits for T+1's commit.
   Extents without a transaction (``tid`` -1):

   * on a filesystem whose journal commits we see (ext4 ``data=writeback`` data blocks, which ext4 frees at
     once) they are ready at once;
   * on one without commit events (XFS today: its FITRIM skips busy extents until the log checkpoint) they are
     ready after ``unjournalled_hold_ns``.

   Pending extents are bounded (``max_pending``): beyond it the oldest are dropped and counted, never an
   unbounded list (e.g. when commit events are lost).
3. Ready extents are kept as sorted, disjoint intervals and coalesced with touching neighbours (never across a
   gap). ``take()`` cuts them to the discard granularity (start rounded up, end rounded down, so a range never
   grows beyond what was freed) and hands them out. Fragments smaller than one granule stay (a later neighbour
   may complete them) until ``max_hold_ns``, then they are dropped and counted.
4. ``requeue()`` -- a discard whose FITRIM did not run goes back to ready, at most ``max_retries`` times.

``allocated()`` removes blocks that were reused before they were trimmed, from every stage.

Safety does not rest on this queue: FITRIM discards only blocks free in the bitmap, under the group lock, at the
time of the call. Releasing too early wastes a discard (the blocks are skipped); this queue makes them land.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cachepilot.errors import UserError

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class FreedStats:
    freed_blocks: int = 0
    handed_blocks: int = 0
    dropped_small_blocks: int = 0
    reallocated_blocks: int = 0
    dropped_overflow_blocks: int = 0  # pending beyond max_pending
    requeued_blocks: int = 0
    dropped_retry_blocks: int = 0  # a discard that failed more than max_retries times


TID_MASK = 0xFFFFFFFF


def tid_geq(x: int | np.ndarray, y: int | np.ndarray) -> np.ndarray:
    """jbd2's tid_geq: x is y or later, for u32 transaction ids that wrap (elementwise)."""
    return np.asarray(((x - y) & TID_MASK) < 0x80000000)


@dataclass(frozen=True)
class _Quiet:
    starts: np.ndarray  # the ready set it saw (by identity)
    granularity: int
    max_hold_ns: int
    drop_at_ns: int  # after this, its oldest small range would be dropped
    all_small: bool  # no range held a whole granule: no budget gives anything


class FreedExtentQueue:
    def __init__(self, granularity_blocks: int = 1, max_hold_ns: int = 60_000_000_000,
                 unjournalled_hold_ns: int = 30_000_000_000, max_pending: int = 1 << 16,
                 max_retries: int = 3) -> None:
        if granularity_blocks < 1:
            raise UserError(f"discard granularity must be at least one block, got {granularity_blocks}")
        self.granularity = granularity_blocks
        self.max_hold_ns = max_hold_ns
        self.unjournalled_hold_ns = unjournalled_hold_ns
        self.max_pending = max_pending
        self.max_retries = max_retries
        # pending extents, rows (ts_ns, start, end, tid) in arrival order: single ones (the daemon's events) in a
        # list, batches (a replay's blocks) as arrays; joined into one array when read
        self._plist: list[tuple[int, int, int, int]] = []
        self._pchunks: list[np.ndarray] = []
        self._npend = 0
        self.commits_seen = 0
        self._commits: list[tuple[int, int]] = []  # (transaction, ts_ns) not applied yet, in arrival order
        # ready intervals [start, end), sorted, disjoint, non-touching, and since when each is ready (its oldest
        # part): numpy columns, so that a tick's take() over thousands of small extents is a few array operations
        self._starts = _EMPTY
        self._ends = _EMPTY
        self._since = _EMPTY
        self._incoming: list[np.ndarray] = []  # rows (start, end, since) made ready, merged in by _settle()
        self._retries: dict[tuple[int, int], int] = {}
        self._now = 0
        self.stats = FreedStats()
        self._quiet: _Quiet | None = None  # the last take() that gave and dropped nothing (see _still_quiet)

    # ------------------------------------------------------------ input
    def freed(self, block: int, count: int, ts_ns: int, tid: int = -1) -> None:
        if block < 0 or count < 0:
            raise UserError(f"freed extent with negative block or count ({block}, {count})")
        if count == 0:
            return
        self.stats.freed_blocks += count
        self._now = max(self._now, ts_ns)
        if tid < 0 and self.commits_seen:  # journaled fs, no transaction: free at once (data=writeback)
            self._insert(block, block + count, ts_ns)
            return
        self._plist.append((ts_ns, block, block + count, tid & TID_MASK if tid >= 0 else -1))
        self._npend += 1
        if self._npend > self.max_pending:
            self._trim()

    def freed_many(self, blocks: np.ndarray, counts: np.ndarray, ts_ns: np.ndarray, tids: np.ndarray) -> None:
        """freed() for arrays of extents (int64 columns), in order."""
        if len(blocks) and (blocks.min() < 0 or counts.min() < 0):
            raise UserError("freed extent with negative block or count")
        some = counts > 0
        blocks, counts, ts_ns, tids = blocks[some], counts[some], ts_ns[some], tids[some]
        if not len(blocks):
            return
        self.stats.freed_blocks += int(counts.sum())
        self._now = max(self._now, int(ts_ns.max()))
        rows = np.column_stack([ts_ns, blocks, blocks + counts, np.where(tids >= 0, tids & TID_MASK, -1)])
        if self.commits_seen:  # journaled fs: extents without a transaction are free at once (data=writeback)
            now = rows[:, 3] < 0
            if now.any():
                self._incoming.append(rows[now][:, [1, 2, 0]])
            rows = rows[~now]
        self._pchunks.append(rows)
        self._npend += len(rows)
        if self._npend > self.max_pending:
            self._trim()

    def _pending(self) -> np.ndarray:
        """Every pending extent as one array of rows (ts_ns, start, end, tid)."""
        if self._plist:
            self._pchunks.append(np.array(self._plist, dtype=np.int64).reshape(-1, 4))
            self._plist = []
        if len(self._pchunks) != 1:
            self._pchunks = [np.concatenate(self._pchunks) if self._pchunks else np.zeros((0, 4), dtype=np.int64)]
        return self._pchunks[0]

    def _set_pending(self, rows: np.ndarray) -> None:
        self._pchunks, self._plist, self._npend = [rows], [], len(rows)

    def _trim(self) -> None:
        """Beyond max_pending the oldest are dropped and counted (lost commit events cannot grow it forever)."""
        self._apply_commits()
        rows = self._pending()
        drop = len(rows) - self.max_pending
        self.stats.dropped_overflow_blocks += int((rows[:drop, 2] - rows[:drop, 1]).sum())
        self._set_pending(rows[drop:])

    @property
    def pending(self) -> list[tuple[int, int, int, int]]:
        self._apply_commits()
        return [(a, b, c, d) for a, b, c, d in self._pending().tolist()]

    def commit(self, transaction: int, ts_ns: int) -> None:
        """Transaction ``transaction`` committed: extents it (or an earlier one) freed become ready, and so do
        extents without a transaction, ready since ``ts_ns``. Applied when the queue is next read (_apply_commits):
        a daemon sees a commit per fsync, and the array work per commit cost more than everything else it does with
        an event. Readiness depends on transaction ids, not on when the commit is applied."""
        self.commits_seen += 1
        self._now = max(self._now, ts_ns)
        if self._npend:
            self._commits.append((transaction & TID_MASK, ts_ns))

    def _apply_commits(self) -> None:
        """Every pending extent freed in a committed transaction is ready since the first commit that covered it."""
        commits, self._commits = self._commits, []
        if not commits or not self._npend:
            return
        rows = self._pending()
        tid = rows[:, 3]
        base = commits[0][0]
        # commits come in transaction order: ids relative to the first one's, so that wrapping ids sort; a tid
        # not after the first commit is covered by the first commit
        cids = np.array([t for t, _ in commits], dtype=np.int64)
        rel_commit = np.where(tid_geq(cids, base), (cids - base) & TID_MASK, 0)  # (out of order: as the first)
        rel = np.where((tid < 0) | ~tid_geq(tid, base), 0, (tid - base) & TID_MASK)
        first = np.searchsorted(np.maximum.accumulate(rel_commit), rel, side="left")
        ready = first < len(commits)
        since = np.array([ts for _, ts in commits], dtype=np.int64)[np.minimum(first, len(commits) - 1)]
        self._make_ready(rows, ready, since[ready])

    def _make_ready(self, rows: np.ndarray, ready: np.ndarray, since: int | np.ndarray) -> None:
        moved = rows[ready]
        if len(moved):
            inc = np.empty((len(moved), 3), dtype=np.int64)  # rows (start, end, since)
            inc[:, :2] = moved[:, 1:3]
            inc[:, 2] = since
            self._incoming.append(inc)
        self._set_pending(rows[~ready])

    def _release_unjournalled(self, now_ns: int) -> None:
        """Without commit events (XFS): extents without a transaction are ready after a bounded hold."""
        if self.commits_seen or not self._npend:
            return
        rows = self._pending()
        self._make_ready(rows, (rows[:, 3] < 0) & (rows[:, 0] <= now_ns - self.unjournalled_hold_ns), now_ns)

    def requeue(self, ranges: list[tuple[int, int]]) -> None:
        """Ranges (start, count) handed out whose FITRIM did not run: ready again, at most max_retries times."""
        if len(self._retries) > 4096:  # bounded bookkeeping: forget old attempts
            self._retries.clear()
        for start, count in ranges:
            if count <= 0:
                continue
            n = self._retries.get((start, count), 0) + 1
            if n > self.max_retries:
                self.stats.dropped_retry_blocks += count
                self._retries.pop((start, count), None)
                continue
            self._retries[(start, count)] = n
            self.stats.requeued_blocks += count
            self._insert(start, start + count, self._now)

    def _insert(self, s: int, e: int, now: int) -> None:
        """Ready [s, e) since now. Collected and merged once when the ready set is next read (_settle): a commit
        makes hundreds of extents ready at once, and inserting each into the sorted lists cost O(ready) apiece."""
        self._incoming.append(np.array([[s, e, now]], dtype=np.int64))

    def _settle(self) -> None:
        """Merge the incoming extents into the ready intervals: the union, where intervals that overlap or touch
        become one that is ready since the oldest of them (the same whatever order they came in)."""
        self._apply_commits()
        if not self._incoming:
            return
        inc = np.concatenate(self._incoming).astype(np.int64)
        self._incoming = []
        if not len(inc):
            return
        s = np.concatenate([self._starts, inc[:, 0]])
        e = np.concatenate([self._ends, inc[:, 1]])
        t = np.concatenate([self._since, inc[:, 2]])
        order = s.argsort(kind="stable")
        s, e, t = s[order], e[order], t[order]
        reach = np.maximum.accumulate(e)  # the furthest end so far: an interval starting beyond it is a new one
        first = np.ones(len(s), dtype=bool)
        first[1:] = s[1:] > reach[:-1]
        at = first.nonzero()[0]
        self._starts = s[at]
        self._ends = np.maximum.reduceat(e, at)
        self._since = np.minimum.reduceat(t, at)

    def allocated(self, block: int, count: int) -> None:
        """Blocks were reused: never hand them out."""
        s0, e0 = block, block + count
        newp: list[tuple[int, int, int, int]] = []
        for ts, s, e, tid in self.pending:
            if e <= s0 or s >= e0:
                newp.append((ts, s, e, tid))
                continue
            self.stats.reallocated_blocks += min(e, e0) - max(s, s0)
            if s < s0:
                newp.append((ts, s, s0, tid))
            if e > e0:
                newp.append((ts, e0, e, tid))
        self._set_pending(np.array(newp, dtype=np.int64).reshape(-1, 4))
        self._settle()
        i = int(np.searchsorted(self._ends, s0, side="right"))  # the first interval ending after s0
        j = int(np.searchsorted(self._starts, e0, side="left"))  # the first starting at or after e0
        if i >= j:
            return
        hs, he, ht = self._starts[i:j], self._ends[i:j], self._since[i:j]
        self.stats.reallocated_blocks += int((np.minimum(he, e0) - np.maximum(hs, s0)).sum())
        keep = [(int(hs[0]), s0, int(ht[0]))] if hs[0] < s0 else []
        if he[-1] > e0:
            keep.append((e0, int(he[-1]), int(ht[-1])))
        ks = np.array([k[0] for k in keep], dtype=np.int64)
        ke = np.array([k[1] for k in keep], dtype=np.int64)
        kt = np.array([k[2] for k in keep], dtype=np.int64)
        self._starts = np.concatenate([self._starts[:i], ks, self._starts[j:]])
        self._ends = np.concatenate([self._ends[:i], ke, self._ends[j:]])
        self._since = np.concatenate([self._since[:i], kt, self._since[j:]])

    # ------------------------------------------------------------ output
    @property
    def ready_blocks(self) -> int:
        self._settle()
        return int((self._ends - self._starts).sum())

    @property
    def pending_blocks(self) -> int:
        self._apply_commits()
        rows = self._pending()
        return int((rows[:, 2] - rows[:, 1]).sum())

    def ready(self) -> list[tuple[int, int]]:
        self._settle()
        return list(zip(self._starts.tolist(), self._ends.tolist(), strict=True))

    def take(self, now_ns: int, max_blocks: int | None = None) -> list[tuple[int, int]]:
        """Ranges (start, count) to trim now, aligned to the granularity; at most max_blocks in total."""
        self._now = max(self._now, now_ns)
        self._release_unjournalled(now_ns)
        self._settle()
        if not len(self._starts):  # nothing ready: the usual case after a commit that freed nothing (per poll)
            return []
        g = self.granularity
        budget = max_blocks if max_blocks is not None else 1 << 62
        if self._still_quiet(now_ns, budget):
            return []
        s, e, t = self._starts, self._ends, self._since
        a = -(-s // g) * g  # whole granules only: a range never grows beyond what was freed
        whole = (e // g) * g
        small = whole - a < g
        # hand out the whole granules in order until the budget (whole granules of it) is spent
        avail = np.where(small, 0, whole - a)
        give = np.minimum(np.maximum(max(budget, 0) // g * g - (avail.cumsum() - avail), 0), avail)
        given = give > 0
        # too small for too long: dropped and counted; the rest waits (a later neighbour may complete it)
        dropped = ~given & small & (now_ns - t > self.max_hold_ns)
        self._quiet = None
        if not given.any() and not dropped.any():  # nothing leaves: the ready set stays as it is, not rebuilt
            drop_at = int(t[small].min()) + self.max_hold_ns if small.any() else 1 << 62
            self._quiet = _Quiet(self._starts, g, self.max_hold_ns, drop_at, not avail.any())
            return []
        b = a + give
        self.stats.handed_blocks += int(give.sum())
        self.stats.dropped_small_blocks += int((e - s)[dropped].sum())
        waits = ~given & ~dropped
        head = given & (s < a)  # the unaligned ends of what was handed out stay ready
        tail = given & (b < e)
        ks = np.concatenate([s[waits], s[head], b[tail]])
        ke = np.concatenate([e[waits], a[head], e[tail]])
        kt = np.concatenate([t[waits], t[head], t[tail]])
        order = ks.argsort(kind="stable")
        self._starts, self._ends, self._since = ks[order], ke[order], kt[order]
        return list(zip(a[given].tolist(), give[given].tolist(), strict=True))

    def _still_quiet(self, now_ns: int, budget: int) -> bool:
        """Whether take() would give and drop nothing again, as the last one: the ready set is the same (every
        change replaces its arrays), no small range is old enough to drop, and the budget is still under a granule
        (or every range is small). Under an fsync load the daemon looks after every poll, ten times a second,
        while small ranges wait for their neighbours."""
        q = self._quiet
        return (q is not None and q.starts is self._starts and q.granularity == self.granularity
                and q.max_hold_ns == self.max_hold_ns and now_ns <= q.drop_at_ns
                and (q.all_small or max(budget, 0) // self.granularity == 0))
