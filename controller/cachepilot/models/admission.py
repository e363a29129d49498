"""The "believed cached" set of one volume, with Loris' admission rule.

A file enters the set only if its (aged) counter is higher than the counter of the last file evicted
from the set, and only if it passes sieving (checked by the caller). The set holds at most
``capacity_bytes``; when it is over, the coldest members (lowest counter, least recent on ties) are
evicted until it is down to ``low_water`` of its capacity, and the counter of the last one evicted
becomes the new admission bar. (With ``low_water=1.0`` this is Loris' one-at-a-time rule; the engine
uses 0.95 so that the O(members) eviction pass runs once per 5% of capacity admitted, not per file.)

Membership lives in the hotness table's per-slot arrays (a flag bit and the charged size in pages) and
nowhere else: the members are read back from the flags (one vectorised pass over the table's flag and
device columns, in slot order) when an eviction pass or a re-warm needs them, so a member costs nothing
here (a u32 member list had been 4 MiB with 1 M members, issue 32). Eviction picks the coldest with one
vectorised sort.
"""

from __future__ import annotations

import numpy as np

from cachepilot.models.hotness import COUNTER_MAX, F_MEMBER, PAGE, HotnessTable


class CachedSet:
    def __init__(self, capacity_bytes: int, table: HotnessTable, dev: int | None = None,
                 low_water: float = 1.0) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity must not be negative")
        if not 0 < low_water <= 1:
            raise ValueError("low_water must be in (0, 1]")
        self.capacity_bytes = capacity_bytes
        self.t = table
        self.dev = dev
        self.low_water = low_water
        self.count = 0
        self.used_bytes = 0
        self.last_evicted = 0  # counter of the last evicted file, at epoch last_evicted_epoch
        self.last_evicted_epoch = 0
        self.evictions = 0
        table.owners[dev] = self  # the table hands back members whose inode was reused or deleted

    def __contains__(self, slot: int) -> bool:
        return bool(self.t.flags[slot] & F_MEMBER) and (self.dev is None or self.t.dev[slot] == self.dev)

    def __len__(self) -> int:
        return self.count

    def admission_bar(self, epoch: int) -> int:
        return self.last_evicted >> max(0, epoch - self.last_evicted_epoch)

    def consider(self, slot: int, size: int) -> tuple[bool, list[int]]:
        """Offer a (sieved) file. Returns (is a member now and was not before, evicted slots)."""
        t = self.t
        evicted: list[int] = []
        pages = (size + PAGE - 1) // PAGE
        if t.flags[slot] & F_MEMBER:
            old = t.charged[slot]
            if pages != old:
                self.used_bytes += (pages - old) * PAGE
                t.charged[slot] = pages
                if self.used_bytes > self.capacity_bytes:
                    self._shrink(evicted)
            return False, evicted
        if pages * PAGE > self.capacity_bytes or t.score(slot) <= self.admission_bar(t.epoch):
            return False, evicted
        t.flags[slot] |= F_MEMBER
        t.charged[slot] = pages
        self.used_bytes += pages * PAGE
        self.count += 1
        if self.used_bytes > self.capacity_bytes:
            self._shrink(evicted)
        return bool(t.flags[slot] & F_MEMBER), evicted

    def admit_many(self, slots: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Offer many sieved non-member files at once (the engine's per-tick path): every one whose counter beats
        the admission bar enters, then one eviction pass brings the set back under capacity (so the survivors are
        the hottest, and the bar is the counter of the last one evicted, as one at a time). Returns the new members
        that survived, hottest first (most recent on ties)."""
        t = self.t
        if not len(slots):
            return slots
        pages = (sizes.astype(np.int64) + PAGE - 1) // PAGE
        score = self._score_only(slots)
        ok = (pages * PAGE <= self.capacity_bytes) & (score > self.admission_bar(t.epoch))
        slots, pages = slots[ok], pages[ok]
        if not len(slots):
            return slots
        flags = np.frombuffer(t.flags, dtype=np.uint8)
        flags[slots] |= F_MEMBER
        t.charged.put(slots, pages)
        self.used_bytes += int(pages.sum()) * PAGE
        self.count += len(slots)
        if self.used_bytes > self.capacity_bytes:
            self._shrink([])
            slots = slots[(flags[slots] & F_MEMBER) != 0]
        del flags
        return slots

    def recharge(self, slots: np.ndarray, sizes: np.ndarray) -> None:
        """Members whose size changed: charge the new size (evicting if the set is now over capacity)."""
        pages = (sizes.astype(np.int64) + PAGE - 1) // PAGE
        charged = self.t.charged
        diff = pages - charged.take(slots)
        if diff.any():
            charged.put(slots, pages)
            self.used_bytes += int(diff.sum()) * PAGE
        if self.used_bytes > self.capacity_bytes:
            self._shrink([])

    def _live(self) -> np.ndarray:
        """The members' slots, ascending (int64): the F_MEMBER bits of this set's filesystem (of the whole table for
        a set of any filesystem, ``dev`` None: one such set a table)."""
        t = self.t
        member = (np.frombuffer(t.flags, dtype=np.uint8) & F_MEMBER) != 0
        if self.dev is not None:
            member &= t.dev_mask(self.dev)
        return np.flatnonzero(member)

    def _score_only(self, live: np.ndarray) -> np.ndarray:
        t = self.t
        sh = (t.epoch - t.stamp.take(live)).clip(0, 63)
        sh = sh.astype(np.uint64)
        r = np.frombuffer(t.rscore, dtype=np.uint32)[live].astype(np.uint64) >> sh
        w = np.frombuffer(t.wscore, dtype=np.uint32)[live].astype(np.uint64) >> sh
        return np.minimum(r + w, COUNTER_MAX).astype(np.int64)

    def _scores(self, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._score_only(live), self.t.last.take(live)

    def _shrink(self, evicted: list[int]) -> None:
        t = self.t
        live = self._live()
        score, last = self._scores(live)
        order = np.lexsort((last, score))  # coldest first; least recent first on ties
        charged = t.charged.take(live[order]) * PAGE
        cum = np.cumsum(charged)
        target = min(self.capacity_bytes, int(self.capacity_bytes * self.low_water))
        need = self.used_bytes - target
        k = int(np.searchsorted(cum, need, side="left")) + 1 if need > 0 else 0
        k = min(k, len(order))
        gone = live[order[:k]]
        flags = np.frombuffer(t.flags, dtype=np.uint8)
        flags[gone] &= ~F_MEMBER & 0xFF
        t.charged.put(gone, 0)
        del flags  # release the buffers: the table's arrays may grow again
        if k:
            self.used_bytes -= int(cum[k - 1])
            self.count -= k
            self.last_evicted = int(score[order[k - 1]])
            self.last_evicted_epoch = t.epoch
            self.evictions += k
            evicted.extend(gone.tolist())

    def discard(self, slot: int) -> int:
        """Remove a member without counting it as an eviction (file deleted, sieved). Returns bytes."""
        t = self.t
        if not t.flags[slot] & F_MEMBER:
            return 0
        t.flags[slot] &= ~F_MEMBER & 0xFF
        freed = t.charged[slot] * PAGE
        t.charged[slot] = 0
        self.used_bytes -= freed
        self.count -= 1
        return freed

    def discard_many(self, slots: np.ndarray) -> int:
        """discard() for a batch (a slot listed twice counts once). Returns bytes."""
        t = self.t
        flags = np.frombuffer(t.flags, dtype=np.uint8)
        s = np.unique(slots)
        s = s[(flags[s] & F_MEMBER) != 0]
        freed = int(t.charged.take(s).sum()) * PAGE
        flags[s] &= ~F_MEMBER & 0xFF
        t.charged.put(s, 0)
        del flags
        self.used_bytes -= freed
        self.count -= len(s)
        return freed

    def members(self) -> list[int]:
        return self._live().tolist()

    def _ordered(self) -> np.ndarray:
        live = self._live()
        score, last = self._scores(live)
        return live[np.lexsort((last, score))]

    def coldest(self) -> int | None:
        o = self._ordered()
        return int(o[0]) if len(o) else None

    def hottest_members(self, k: int | None = None) -> list[int]:
        """Members, hottest first (most recent on ties)."""
        o = self._ordered()[::-1]
        return (o if k is None else o[:k]).tolist()
