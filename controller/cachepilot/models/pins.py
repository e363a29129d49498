"""Pinned files of one volume (policy ``pin:``): kept in the cache whatever the workload does.

The daemon resolves the policy's patterns to files at adoption and at every reload (fsfiles.walk) and hands them
over (``PinSet.assign``). From then on, per tick (``PinSet.take``, called by the engine's promotion step, first and
within the volume's promotion budget):

* a pinned file that is not resident -- never promoted, written since (new blocks may be elsewhere), or the cache
  device was replaced or detached (the engine clears the resident bit of every file of the volume) -- is promoted;
* while the cache keeps missing reads (its cumulative miss or bypass count rose within the last 30 s,
  ``CHURN_WINDOW_NS``: bcache folds its counters up to ~14 s late), every pinned file is read again once per
  ``pin.refresh`` seconds. A scan evicts the least recently used blocks, and a hit makes a block recently used again
  (bcache resets its bucket's priority, dm-cache's smq counts the hit), so pinned files re-read faster than the cache
  turns over are never its coldest (measured in the lab: re-read only once per sample that showed a rise, a pin did
  not outlast a scan that turned a 64 MiB bcache over every ~4 s). A quiet cache reads nothing;
* a scan's end, a falling hit ratio or a new cache device (the engine's re-warm) re-queues them all at once.

Pinned files are exempt from the sieve (any size, written or not) and never members of the believed-cached set, so
no admission or eviction decision touches them; their bytes (at most the policy's cap, itself at most the cache's
room) are taken from that set's capacity. The probe cannot say per file whether a read hit (the kernels count
hits per device), which is why the rules above work from residency and from the device's miss counters.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cachepilot.actions import Action, Promote
from cachepilot.models.hotness import F_LIVE, F_READ, F_RESIDENT, HotnessTable
from cachepilot.models.volume import VolumeInfo

NS = 1_000_000_000
MAX_PIN_FILES = 10_000
CHURN_WINDOW_NS = 30 * NS
NOT_RESIDENT = "pinned by policy: not in the cache (new pin, written since, or the cache device changed)"
STATUS_FILES = 20  # pinned files listed by `status` (the counts cover them all)


@dataclass(frozen=True, slots=True)
class PinnedFile:
    path: str
    ino: int
    gen: int
    size: int


@dataclass
class PinSet:
    files: list[PinnedFile] = field(default_factory=list)
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bytes: int = 0
    refresh_ns: int = 10 * NS
    note: str = ""  # how the last resolution went (files over the cap, a truncated walk)
    queue: deque[tuple[int, str]] = field(default_factory=deque)
    queued: set[int] = field(default_factory=set)
    missed_seen: int | None = None  # the cache's cumulative misses + bypasses at the last sample
    missed_ns: int | None = None  # when a sample last showed that count risen
    last_read_ns: int | None = None
    promotions: int = 0
    promoted_bytes: int = 0
    gone: int = 0
    ident: dict[int, tuple[int, int]] = field(default_factory=dict)  # slot -> (inode, generation) pinned there

    def __len__(self) -> int:
        return len(self.files)

    def assign(self, t: HotnessTable, dev: int, files: Sequence[PinnedFile], refresh_s: float, note: str,
               now: int) -> None:
        """The files the patterns resolved to (within the cap): registered in the hotness table as read files of
        known size, queued when not resident (``take``)."""
        self.files = list(files[:MAX_PIN_FILES])
        slots = [t.update(dev, f.ino, f.gen, 0, 0, 0, now, f.size) for f in self.files]
        for s in slots:
            t.flags[s] |= F_READ
        self.slots = np.array(slots, dtype=np.int64)
        self.ident = {s: (f.ino, f.gen) for s, f in zip(slots, self.files, strict=True)}
        self.bytes = sum(max(0, f.size) for f in self.files)
        self.refresh_ns = int(refresh_s * NS)
        self.note = note
        self.queue.clear()
        self.queued.clear()

    def exclude(self, slots: np.ndarray) -> np.ndarray:
        """The touched slots the believed-cached set may consider: all but the pinned ones."""
        if not len(self.slots) or not len(slots):
            return slots
        return slots[~np.isin(slots, self.slots)]

    def sampled(self, misses: int, bypasses: int | None, ts_ns: int) -> None:
        missed = misses + (bypasses or 0)
        if self.missed_seen is not None and missed > self.missed_seen:
            self.missed_ns = ts_ns
        self.missed_seen = missed

    def requeue_all(self, reason: str) -> None:
        for s in self.slots.tolist():
            self._push(s, f"pinned by policy: {reason}")

    def _push(self, slot: int, reason: str) -> None:
        if slot not in self.queued:
            self.queued.add(slot)
            self.queue.append((slot, reason))

    def _due(self, t: HotnessTable, now: int) -> None:
        if not len(self.slots):
            return
        flags = np.frombuffer(t.flags, dtype=np.uint8)[self.slots]
        for s in self.slots[(flags & F_RESIDENT) == 0].tolist():
            self._push(s, NOT_RESIDENT)
        churning = self.missed_ns is not None and now - self.missed_ns <= CHURN_WINDOW_NS
        if churning and (self.last_read_ns is None or now - self.last_read_ns >= self.refresh_ns):
            self.last_read_ns = now
            for s in self.slots.tolist():
                self._push(s, "pinned by policy: the cache has been missing reads (within 30 s): "
                              "re-read so they stay recently used")

    def take(self, t: HotnessTable, info: VolumeInfo, now: int, tokens: float, cap: float,
             out: list[Action]) -> float:
        """Promotions of pinned files that are due, first in the volume's budget; the tokens left."""
        self._due(t, now)
        q = self.queue
        while q:
            slot, reason = q[0]
            if not self._alive(t, slot):
                q.popleft()
                self.queued.discard(slot)
                self.gone += 1
                continue
            size = max(0, t.size[slot])
            if size > tokens and tokens < cap:
                break  # as the engine's queue: a file larger than the bucket goes once it is full
            q.popleft()
            self.queued.discard(slot)
            tokens -= size
            t.flags[slot] |= F_RESIDENT
            self.promotions += 1
            self.promoted_bytes += size
            out.append(Promote(info.name, info.dev, t.ino[slot], t.gen[slot], ((0, size),), reason))
        return tokens

    def _alive(self, t: HotnessTable, slot: int) -> bool:
        """The slot still holds the pinned file (not deleted, its inode not reused)."""
        ident = self.ident.get(slot)
        return ident is not None and bool(t.flags[slot] & F_LIVE) and ident == (t.ino[slot], t.gen[slot])

    def status(self, t: HotnessTable) -> dict[str, object]:
        """Counts and residency for `status` (the first STATUS_FILES files listed)."""
        flags = np.frombuffer(t.flags, dtype=np.uint8)[self.slots] if len(self.slots) else np.zeros(0, np.uint8)
        res = (flags & F_RESIDENT) != 0
        sizes = np.array([max(0, f.size) for f in self.files], dtype=np.int64)
        return {
            "files": len(self.files), "bytes": self.bytes,
            "resident_files": int(res.sum()), "resident_bytes": int(sizes[res].sum()) if len(sizes) else 0,
            "promotions": self.promotions, "promoted_bytes": self.promoted_bytes, "gone": self.gone,
            "note": self.note,
            "list": [{"path": f.path, "size": f.size, "resident": bool(r)}
                     for f, r in zip(self.files[:STATUS_FILES], res[:STATUS_FILES].tolist(), strict=True)],
        }
