"""Block caches for offline evaluation: LRU, an smq-like multiqueue, and Belady's OPT.

All three allocate on write and on read miss (OPT may decline: that is part of being optimal) and share
the write-back model: a block written in write-back mode is dirty; dirty blocks are written to the origin
when evicted, when dirty data exceeds ``writeback_percent`` of the cache (oldest dirtied first, like
bcache's writeback_percent target), when the cache is emptied, and at the end of the run (what would
eventually be written). A discard drops a block, dirty or not, without writing it back (bcache).

Simplifications of the smq-like policy, compared with dm-cache's smq: 8 levels of LRU queues; a miss
enters level 0, each hit moves a block one level up; every ``capacity`` accesses every level is demoted by
one; eviction takes the least recent block of the lowest non-empty level. No hotspot blocks, sentinels,
or separate clean/dirty queues, and no promotion threshold: every miss is admitted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

INF = 1 << 62


class BlockCache:
    name = "base"

    def __init__(self, capacity: int, writeback_percent: float = 10.0) -> None:
        if capacity < 1:
            raise ValueError("cache capacity must be at least one block")
        self.capacity = capacity
        self.dirty: OrderedDict[int, None] = OrderedDict()
        self.dirty_cap = max(1, int(capacity * writeback_percent / 100))
        self.writeback = True
        self.written_back = 0  # blocks written to the origin from the cache
        self.written_through = 0  # blocks written to the origin directly
        self.discarded = 0
        self.dirty_dropped = 0

    # subclasses: contains, _touch(blk, pos) -> hit, _insert(blk, pos) -> inserted, _evict() -> blk,
    # _remove(blk), __len__, clear_all()
    def write(self, blk: int, pos: int) -> None:
        self.access(blk, pos)
        if blk not in self:
            self.written_through += 1
            return
        if self.writeback:
            d = self.dirty
            if blk in d:
                d.move_to_end(blk)
            else:
                d[blk] = None
                if len(d) > self.dirty_cap:
                    d.popitem(last=False)
                    self.written_back += 1
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

    def __init__(self, capacity: int, writeback_percent: float = 10.0) -> None:
        super().__init__(capacity, writeback_percent)
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
    name = "smq"
    LEVELS = 8

    def __init__(self, capacity: int, writeback_percent: float = 10.0) -> None:
        super().__init__(capacity, writeback_percent)
        self.levels: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.LEVELS)]
        self.where: dict[int, int] = {}
        self.ticks = 0

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
