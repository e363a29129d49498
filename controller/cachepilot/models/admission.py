"""The "believed cached" set of one volume, with Loris' admission rule.

A file enters the set only if its (aged) counter is higher than the counter of the last file evicted
from the set, and only if it passes sieving (checked by the caller). The set holds at most
``capacity_bytes``; when over, the coldest member (lowest counter, least recent on ties) is evicted and
its counter becomes the new admission bar.

Membership lives in the hotness table's per-slot arrays (a flag bit, the charged size in pages and the
entry version), so a member costs no Python objects but one int in a min-heap:
``key << 96 | (last_ms & 2^32-1) << 64 | version << 32 | slot``, where ``key`` is the counter scaled to a
common aging base (``counter << (epoch - base)``) so entries pushed at different aging epochs compare
correctly without touching them, and ``version`` is the slot's entry version (an entry is valid only while
it matches). Stale entries (re-scored or removed members) are skipped lazily; the heap is rebuilt when
it grows past twice the membership.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from cachepilot.models.hotness import COUNTER_MAX, F_MEMBER, PAGE, HotnessTable

_SLOT_MASK = (1 << 32) - 1
_LAST_MASK = (1 << 32) - 1
_REBASE = 24  # rebase when epoch - base exceeds this many half-lives


class CachedSet:
    def __init__(self, capacity_bytes: int, table: HotnessTable) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity must not be negative")
        self.capacity_bytes = capacity_bytes
        self.t = table
        self.count = 0
        self.used_bytes = 0
        self._heap: list[int] = []
        self.base = table.epoch
        self.last_evicted = 0  # counter of the last evicted file, at epoch last_evicted_epoch
        self.last_evicted_epoch = 0
        self.evictions = 0

    def __contains__(self, slot: int) -> bool:
        return bool(self.t.flags[slot] & F_MEMBER)

    def __len__(self) -> int:
        return self.count

    def admission_bar(self, epoch: int) -> int:
        return self.last_evicted >> max(0, epoch - self.last_evicted_epoch)

    def _valid(self, entry: int) -> bool:
        t = self.t
        slot = entry & _SLOT_MASK
        return bool(t.flags[slot] & F_MEMBER) and t.mver[slot] == (entry >> 32) & _SLOT_MASK

    def _push(self, slot: int) -> None:
        t = self.t
        e = t.epoch
        if e - self.base > _REBASE:
            self._rebase()
        ver = (t.mver[slot] + 1) & _SLOT_MASK
        t.mver[slot] = ver
        sh = e - t.stamp[slot]
        score = (t.rscore[slot] >> sh) + (t.wscore[slot] >> sh)
        if score > COUNTER_MAX:
            score = COUNTER_MAX
        heapq.heappush(self._heap, ((score << (e - self.base)) << 96)
                       | (((t.last[slot] >> 20) & _LAST_MASK) << 64) | (ver << 32) | slot)

    def _entry(self, slot: int, key: int, ver: int) -> int:
        return (key << 96) | (((self.t.last[slot] >> 20) & _LAST_MASK) << 64) | (ver << 32) | slot

    def _rebase(self) -> None:
        t = self.t
        members = list(self.members())
        self.base = t.epoch
        self._heap = []
        for slot in members:
            ver = (t.mver[slot] + 1) & _SLOT_MASK
            t.mver[slot] = ver
            self._heap.append(self._entry(slot, t.score(slot), ver))
        heapq.heapify(self._heap)

    def consider(self, slot: int, size: int) -> tuple[bool, list[int]]:
        """Offer a (sieved) file. Returns (is a member now and was not before, evicted slots)."""
        t = self.t
        evicted: list[int] = []
        pages = (size + PAGE - 1) // PAGE
        if t.flags[slot] & F_MEMBER:
            self._push(slot)
            old = t.charged[slot]
            if pages != old:
                self.used_bytes += (pages - old) * PAGE
                t.charged[slot] = pages
                self._shrink(evicted)
            return False, evicted
        if pages * PAGE > self.capacity_bytes or t.score(slot) <= self.admission_bar(t.epoch):
            return False, evicted
        t.flags[slot] |= F_MEMBER
        t.charged[slot] = pages
        self.used_bytes += pages * PAGE
        self.count += 1
        self._push(slot)
        self._shrink(evicted)
        if len(self._heap) > 2 * self.count + 1024:
            self._heap = [e for e in self._heap if self._valid(e)]
            heapq.heapify(self._heap)
        return bool(t.flags[slot] & F_MEMBER), evicted

    def _remove(self, slot: int) -> int:
        t = self.t
        t.flags[slot] &= ~F_MEMBER
        freed = t.charged[slot] * PAGE
        t.charged[slot] = 0
        self.used_bytes -= freed
        self.count -= 1
        return freed

    def _shrink(self, evicted: list[int]) -> None:
        heap = self._heap
        t = self.t
        while self.used_bytes > self.capacity_bytes and heap:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            slot = entry & _SLOT_MASK
            self._remove(slot)
            self.last_evicted = t.score(slot)
            self.last_evicted_epoch = t.epoch
            self.evictions += 1
            evicted.append(slot)

    def discard(self, slot: int) -> int:
        """Remove a member without counting it as an eviction (file deleted, sieved). Returns bytes."""
        if not self.t.flags[slot] & F_MEMBER:
            return 0
        return self._remove(slot)

    def members(self) -> Iterator[int]:
        """Current members (each once, in no particular order)."""
        seen: set[int] = set()
        for entry in self._heap:
            if self._valid(entry):
                slot = entry & _SLOT_MASK
                if slot not in seen:
                    seen.add(slot)
                    yield slot

    def coldest(self) -> int | None:
        heap = self._heap
        while heap:
            if self._valid(heap[0]):
                return heap[0] & _SLOT_MASK
            heapq.heappop(heap)
        return None

    def hottest_members(self, k: int | None = None) -> list[int]:
        """Members, hottest first (most recent on ties)."""
        valid = [e for e in self._heap if self._valid(e)]
        valid.sort(reverse=True)
        order = list(dict.fromkeys(e & _SLOT_MASK for e in valid))
        return order if k is None else order[:k]
