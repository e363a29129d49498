"""A volume's promotion queue: which files wait for a promotion read, and why."""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np

ADMITTED = 0  # reason id: admitted against the last evicted counter (text made when emitted)
# the consumed head is cut off once it is this share of the array (and more than COMPACT_MIN entries): a half kept
# 2 MiB of consumed entries with 1 M files queued on 16 volumes (bench_daemon_files.py, issue 32); a compaction
# moves the rest once per that many pops, a few hundred microseconds
COMPACT_SHARE = 4
COMPACT_MIN = 4096


class PromoQueue:
    """FIFO of slots (u32: 4 bytes per queued file, no Python objects) with their reasons as runs (a reason id from
    an index on: files queued together share one, so a run costs 12 bytes, not 4 a file -- 4 MiB less with 1 M
    files queued, issue 32). Whether a slot is queued is the F_QUEUED bit of the hotness table."""

    def __init__(self) -> None:
        self.items = array("I")
        self.head = 0
        self._starts = array("q")  # where each run of one reason starts in items (ascending)
        self._rids = array("I")  # its reason id
        self._k = 0  # the run rid_at found last
        self.reasons: list[str] = ["admitted"]
        self._reason_ids: dict[str, int] = {"admitted": ADMITTED}

    def reason_id(self, text: str) -> int:
        rid = self._reason_ids.get(text)
        if rid is None:
            if len(self.reasons) > 4096:  # bounded: forget old texts
                self.reasons = self.reasons[:1]
                self._reason_ids = {"admitted": ADMITTED}
            rid = self._reason_ids[text] = len(self.reasons)
            self.reasons.append(text)
        return rid

    def __len__(self) -> int:
        return len(self.items) - self.head

    def _run(self, rid: int) -> None:
        if not self._rids or self._rids[-1] != rid:
            self._starts.append(len(self.items))
            self._rids.append(rid)

    def push(self, slot: int, rid: int) -> None:
        self._run(rid)
        self.items.append(slot)

    def push_many(self, slots: np.ndarray, rid: int) -> None:
        if len(slots):
            self._run(rid)
            self.items.frombytes(slots.astype(np.uint32).tobytes())

    def rid_at(self, i: int) -> int:
        """The reason id of the entry at index i of items (the queue is read in order: the run of the last call is
        tried first, a search only at a run's end)."""
        k, starts = self._k, self._starts
        if not (k < len(starts) and starts[k] <= i and (k + 1 == len(starts) or i < starts[k + 1])):
            k = self._k = bisect_right(starts, i) - 1
        return self._rids[k]

    def runs(self) -> tuple[array[int], array[int]]:
        """(where each run of one reason starts in items, its reason id): for a reader going through in order."""
        return self._starts, self._rids

    def pop(self) -> None:
        self.head += 1
        if self.head > COMPACT_MIN and self.head * COMPACT_SHARE >= len(self.items):
            head = self.head
            k = bisect_right(self._starts, head) - 1  # the run holding the new first entry stays
            del self._starts[:max(0, k)]
            del self._rids[:max(0, k)]
            self._starts = array("q", (max(0, s - head) for s in self._starts))
            del self.items[:head]
            self.head = self._k = 0

    def clear(self) -> list[int]:
        slots = self.items[self.head:].tolist()
        self.items = array("I")
        self.head = 0
        self._starts = array("q")
        self._rids = array("I")
        self._k = 0
        return slots
