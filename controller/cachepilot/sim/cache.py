"""Block caches for offline evaluation: LRU, an smq-like multiqueue, and Belady's OPT.

Write-back, modelled on bcache's writeback controller (and used for all three): a block written in
write-back mode is dirty. Once per simulated tick (:meth:`BlockCache.tick`) dirty blocks are written to
the origin in LBA order (a cursor that sweeps the block numbers, like bcache's refill of dirty keys):
above the ``writeback_percent`` target as many as it takes to get back to the target (bcache's PD
controller raises the rate until it converges); below the target at ``writeback_rate_minimum`` blocks a
second (bcache's default 8 sectors/s = one 4 KiB block a second); in a tick without foreground I/O at
``idle_rate`` (bcache writes back at full speed when the backing device is idle). Dirty blocks are also
written when evicted, when the cache is emptied, and at the end of the run (what would eventually be
written). A discard drops a block, dirty or not, without writing it back (bcache) -- unless the cache
stands for dm-cache (``keep_on_discard``): dm-cache only marks the origin blocks discarded; cached copies,
dirty ones included, survive and are written back.

Simplifications of the smq-like policy, compared with dm-cache's smq: 8 levels of LRU queues; each hit
moves a block one level up; every ``capacity`` accesses every level is demoted by one; eviction takes the
least recent block of the lowest non-empty level. Admission follows smq's hotspot rule in its simplest
form: a read miss only counts towards the block's hotspot (``HOTSPOT_BLOCKS`` consecutive blocks); the
block is promoted into the cache once its hotspot has missed ``promote_threshold`` times (recent
hotspot counts, bounded); a write to an uncached block goes to the origin (no allocation on write). No
sentinels and no separate clean/dirty queues.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict

INF = 1 << 62


class BlockCache:
    name = "base"

    keep_on_discard = False

    def __init__(self, capacity: int, writeback_percent: float = 10.0, rate_minimum: float = 1.0,
                 idle_rate: float = 1 << 30) -> None:
        if capacity < 1:
            raise ValueError("cache capacity must be at least one block")
        self.capacity = capacity
        self.dirty: OrderedDict[int, None] = OrderedDict()
        self.dirty_cap = max(1, int(capacity * writeback_percent / 100))
        self.rate_minimum = rate_minimum  # blocks per second below the target
        self.idle_rate = idle_rate  # blocks per second when there was no foreground I/O
        self.cursor = 0  # LBA-order write-back sweeps from here
        self.credit = 0.0  # fractional blocks of write-back owed at the minimum rate
        self.writeback = True
        self.written_back = 0  # blocks written to the origin from the cache
        self.written_through = 0  # blocks written to the origin directly
        self.discarded = 0
        self.dirty_dropped = 0

    def tick(self, dt_s: float, idle: bool) -> int:
        """Background write-back for dt_s seconds of simulated time; returns blocks written."""
        d = self.dirty
        if not d:
            self.credit = 0.0
            return 0
        if len(d) > self.dirty_cap:
            n = len(d) - self.dirty_cap
        else:
            self.credit += (self.idle_rate if idle else self.rate_minimum) * dt_s
            n = int(self.credit)
            self.credit -= n
        n = min(n, len(d))
        if n == 0:
            return 0
        order = sorted(d)
        i = bisect.bisect_left(order, self.cursor)
        pick = (order[i:] + order[:i])[:n]
        for b in pick:
            del d[b]
        self.cursor = pick[-1] + 1
        self.written_back += n
        return n

    # subclasses: contains, _touch(blk, pos) -> hit, _insert(blk, pos) -> inserted, _evict() -> blk,
    # _remove(blk), __len__, clear_all()
    def write(self, blk: int, pos: int) -> None:
        self.access(blk, pos)
        if blk not in self:
            self.written_through += 1
            return
        if self.writeback:
            self.dirty[blk] = None  # written back by tick(), in LBA order
        else:
            self.written_through += 1
            self.dirty.pop(blk, None)

    def read(self, blk: int, pos: int) -> bool:
        return self.access(blk, pos)

    def access(self, blk: int, pos: int) -> bool:
        if blk in self:
            self._touch(blk, pos)
            return True
        if len(self) >= self.capacity:
            if not self._admit(blk, pos):
                return False
            victim = self._evict()
            if self.dirty.pop(victim, 0) is None:
                self.written_back += 1
        self._insert(blk, pos)
        return False

    def _admit(self, blk: int, pos: int) -> bool:
        return True

    def discard(self, blk: int) -> None:
        if self.keep_on_discard:
            return  # dm-cache: discard bits on the origin; the cached copy (dirty or not) stays
        if blk in self:
            self._remove(blk)
            self.discarded += 1
            if self.dirty.pop(blk, 0) is None:
                self.dirty_dropped += 1

    def flush(self) -> None:
        self.written_back += len(self.dirty)
        self.dirty.clear()

    def empty(self) -> None:
        self.flush()
        self.clear_all()

    def set_writeback(self, on: bool) -> None:
        self.writeback = on
        if not on:
            self.flush()

    # abstract
    def __contains__(self, blk: int) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def _touch(self, blk: int, pos: int) -> None:
        raise NotImplementedError

    def _insert(self, blk: int, pos: int) -> None:
        raise NotImplementedError

    def _evict(self) -> int:
        raise NotImplementedError

    def _remove(self, blk: int) -> None:
        raise NotImplementedError

    def clear_all(self) -> None:
        raise NotImplementedError


class LRU(BlockCache):
    name = "lru"

    def __init__(self, capacity: int, writeback_percent: float = 10.0, **kw: float) -> None:
        super().__init__(capacity, writeback_percent, **kw)
        self.od: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, blk: int) -> bool:
        return blk in self.od

    def __len__(self) -> int:
        return len(self.od)

    def access(self, blk: int, pos: int) -> bool:  # inlined for speed
        od = self.od
        if blk in od:
            od.move_to_end(blk)
            return True
        if len(od) >= self.capacity:
            victim, _ = od.popitem(last=False)
            if self.dirty.pop(victim, 0) is None:
                self.written_back += 1
        od[blk] = None
        return False

    def _touch(self, blk: int, pos: int) -> None:
        self.od.move_to_end(blk)

    def _insert(self, blk: int, pos: int) -> None:
        self.od[blk] = None

    def _evict(self) -> int:
        return self.od.popitem(last=False)[0]

    def _remove(self, blk: int) -> None:
        del self.od[blk]

    def clear_all(self) -> None:
        self.od.clear()


class SMQ(BlockCache):
    """The smq-like cache, standing for dm-cache: hotspot admission, copies kept on discard."""

    name = "smq"
    LEVELS = 8
    HOTSPOT_BLOCKS = 16
    keep_on_discard = True

    def __init__(self, capacity: int, writeback_percent: float = 10.0, promote_threshold: int = 2,
                 **kw: float) -> None:
        super().__init__(capacity, writeback_percent, **kw)
        self.levels: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.LEVELS)]
        self.where: dict[int, int] = {}
        self.ticks = 0
        self.promote_threshold = promote_threshold
        self.hotspots: OrderedDict[int, int] = OrderedDict()  # hotspot -> recent misses (bounded, LRU)
        self.max_hotspots = max(1024, capacity // self.HOTSPOT_BLOCKS * 4)

    def access(self, blk: int, pos: int) -> bool:
        if blk in self.where:
            self._touch(blk, pos)
            return True
        hs = self.hotspots
        h = blk // self.HOTSPOT_BLOCKS
        n = hs.pop(h, 0) + 1
        if n < self.promote_threshold:
            hs[h] = n
            if len(hs) > self.max_hotspots:
                hs.popitem(last=False)
            return False
        hs[h] = n
        return super().access(blk, pos)

    def write(self, blk: int, pos: int) -> None:
        if blk not in self.where:  # dm-cache: a write miss goes to the origin, it does not allocate
            self.written_through += 1
            return
        super().write(blk, pos)

    def prefetch(self, blk: int, pos: int) -> None:
        """A promotion read by the controller: dm-cache promotes what is read often enough; the
        controller reads a file promote_threshold times, so it lands in the cache."""
        for _ in range(self.promote_threshold):
            if self.access(blk, pos):
                return

    def __contains__(self, blk: int) -> bool:
        return blk in self.where

    def __len__(self) -> int:
        return len(self.where)

    def _age(self) -> None:
        self.ticks += 1
        if self.ticks < self.capacity:
            return
        self.ticks = 0
        lv = self.levels
        where = self.where
        for i in range(1, self.LEVELS):
            for b in lv[i]:
                where[b] = i - 1
            lv[i - 1].update(lv[i])
            lv[i].clear()

    def _touch(self, blk: int, pos: int) -> None:
        self._age()
        lvl = self.where[blk]
        up = lvl + 1 if lvl + 1 < self.LEVELS else lvl
        del self.levels[lvl][blk]
        self.levels[up][blk] = None
        self.where[blk] = up

    def _insert(self, blk: int, pos: int) -> None:
        self._age()
        self.levels[0][blk] = None
        self.where[blk] = 0

    def _evict(self) -> int:
        for q in self.levels:
            if q:
                blk, _ = q.popitem(last=False)
                del self.where[blk]
                return blk
        raise RuntimeError("evict from an empty cache")

    def _remove(self, blk: int) -> None:
        del self.levels[self.where.pop(blk)][blk]

    def clear_all(self) -> None:
        for q in self.levels:
            q.clear()
        self.where.clear()
        self.hotspots.clear()


class OPT(BlockCache):
    """Belady: evict the block whose next read is farthest; decline to cache a block read later than that.

    ``next_use[pos]`` is the stream position of the next read of the block accessed at ``pos`` (INF if the
    block is overwritten or freed first). ``next_read(blk, pos)`` answers the same for prefetches.
    """

    name = "opt"

    def __init__(self, capacity: int, next_use: list[int], next_read: object,
                 writeback_percent: float = 10.0) -> None:
        super().__init__(capacity, writeback_percent)
        self.nu = next_use
        self.next_read = next_read
        self.cur: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []

    def __contains__(self, blk: int) -> bool:
        return blk in self.cur

    def __len__(self) -> int:
        return len(self.cur)

    def _farthest(self) -> tuple[int, int]:
        h = self.heap
        cur = self.cur
        while True:
            neg, blk = h[0]
            if cur.get(blk) == -neg:
                return blk, -neg
            heapq.heappop(h)

    def _set(self, blk: int, nu: int) -> None:
        self.cur[blk] = nu
        heapq.heappush(self.heap, (-nu, blk))
        if len(self.heap) > 4 * self.capacity + 1024:
            self.heap = [(-v, b) for b, v in self.cur.items()]
            heapq.heapify(self.heap)

    def _admit(self, blk: int, pos: int) -> bool:
        _, far = self._farthest()
        return self.nu[pos] < far

    def _touch(self, blk: int, pos: int) -> None:
        self._set(blk, self.nu[pos])

    def _insert(self, blk: int, pos: int) -> None:
        self._set(blk, self.nu[pos])

    def _evict(self) -> int:
        blk, _ = self._farthest()
        heapq.heappop(self.heap)
        del self.cur[blk]
        return blk

    def _remove(self, blk: int) -> None:
        del self.cur[blk]

    def clear_all(self) -> None:
        self.cur.clear()
        self.heap.clear()

    def prefetch(self, blk: int, pos: int) -> None:
        nu = self.next_read(blk, pos)  # type: ignore[operator]
        if blk in self.cur:
            self._set(blk, nu)
            return
        if nu >= INF:
            return
        if len(self.cur) >= self.capacity:
            _, far = self._farthest()
            if nu >= far:
                return
            victim = self._evict()
            if self.dirty.pop(victim, 0) is None:
                self.written_back += 1
        self._set(blk, nu)
