"""The "believed cached" set of one volume, with Loris' admission rule.

A file enters the set only if its (aged) counter is higher than the counter of the last file evicted
from the set, and only if it passes sieving (checked by the caller). The set holds at most
``capacity_bytes``; when over, the coldest member (lowest counter, least recent on ties) is evicted and
its counter becomes the new admission bar.

Members sit in a min-heap of plain ints (no tuples): ``key << 96 | (last_ms & 2^32-1) << 64 | slot``
where ``key`` is the counter scaled to a common aging base (``counter << (epoch - base)``), so entries
pushed at different aging epochs compare correctly without touching them. Stale heap entries (a member
that was re-scored or removed) are skipped lazily and the heap is rebuilt when it doubles.
"""

from __future__ import annotations

import heapq

from cachepilot.models.hotness import HotnessTable

_SLOT_MASK = (1 << 64) - 1
_LAST_MASK = (1 << 32) - 1
_REBASE = 24  # rebase when epoch - base exceeds this many half-lives


class CachedSet:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity must not be negative")
        self.capacity_bytes = capacity_bytes
        self.members: dict[int, int] = {}  # slot -> heap entry currently valid for it
        self.sizes: dict[int, int] = {}  # slot -> bytes charged
        self.used_bytes = 0
        self._heap: list[int] = []
        self.base = 0
        self.last_evicted = 0  # counter of the last evicted file, at epoch last_evicted_epoch
        self.last_evicted_epoch = 0
        self.evictions = 0

    def __contains__(self, slot: int) -> bool:
        return slot in self.members

    def __len__(self) -> int:
        return len(self.members)

    def admission_bar(self, epoch: int) -> int:
        return self.last_evicted >> max(0, epoch - self.last_evicted_epoch)

    def _entry(self, t: HotnessTable, slot: int) -> int:
        e = t.epoch
        if e - self.base > _REBASE:
            self._rebase(t)
        key = t.score(slot) << (e - self.base)
        return (key << 96) | (((t.last[slot] >> 20) & _LAST_MASK) << 64) | slot

    def _rebase(self, t: HotnessTable) -> None:
        self.base = t.epoch
        self._heap = []
        for slot in self.members:
            key = t.score(slot)
            entry = (key << 96) | (((t.last[slot] >> 20) & _LAST_MASK) << 64) | slot
            self.members[slot] = entry
            self._heap.append(entry)
        heapq.heapify(self._heap)

    def consider(self, t: HotnessTable, slot: int, size: int) -> tuple[bool, list[int]]:
        """Offer a (sieved) file. Returns (is a member now and was not before, evicted slots)."""
        evicted: list[int] = []
        if slot in self.members:
            entry = self._entry(t, slot)
            self.members[slot] = entry
            heapq.heappush(self._heap, entry)
            if size != self.sizes[slot]:
                self.used_bytes += size - self.sizes[slot]
                self.sizes[slot] = size
                self._shrink(t, evicted)
            return False, evicted
        if size > self.capacity_bytes or t.score(slot) <= self.admission_bar(t.epoch):
            return False, evicted
        entry = self._entry(t, slot)
        self.members[slot] = entry
        self.sizes[slot] = size
        self.used_bytes += size
        heapq.heappush(self._heap, entry)
        self._shrink(t, evicted)
        if len(self._heap) > 2 * len(self.members) + 1024:
            self._heap = list(self.members.values())
            heapq.heapify(self._heap)
        return slot in self.members, evicted

    def _shrink(self, t: HotnessTable, evicted: list[int]) -> None:
        heap = self._heap
        members = self.members
        while self.used_bytes > self.capacity_bytes and heap:
            entry = heapq.heappop(heap)
            slot = entry & _SLOT_MASK
            if members.get(slot) != entry:
                continue
            del members[slot]
            self.used_bytes -= self.sizes.pop(slot)
            self.last_evicted = t.score(slot)
            self.last_evicted_epoch = t.epoch
            self.evictions += 1
            evicted.append(slot)

    def discard(self, slot: int) -> int:
        """Remove a member without counting it as an eviction (file deleted). Returns bytes freed."""
        if slot not in self.members:
            return 0
        del self.members[slot]
        size = self.sizes.pop(slot)
        self.used_bytes -= size
        return size

    def coldest(self) -> int | None:
        heap = self._heap
        while heap:
            entry = heap[0]
            slot = entry & _SLOT_MASK
            if self.members.get(slot) == entry:
                return slot
            heapq.heappop(heap)
        return None

    def hottest_members(self, t: HotnessTable, k: int | None = None) -> list[int]:
        """Members, hottest first (most recent on ties)."""
        order = sorted(self.members, key=lambda s: (t.score(s), t.last[s]), reverse=True)
        return order if k is None else order[:k]
