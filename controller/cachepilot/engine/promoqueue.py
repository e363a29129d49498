"""A volume's promotion queue: which files wait for a promotion read, and why."""

from __future__ import annotations

from array import array

import numpy as np

ADMITTED = 0  # reason id: admitted against the last evicted counter (text made when emitted)


class PromoQueue:
    """FIFO of (slot, reason id) packed in one u64 array: 8 bytes per queued file, no Python objects.
    Whether a slot is queued is the F_QUEUED bit of the hotness table."""

    def __init__(self) -> None:
        self.items = array("Q")
        self.head = 0
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

    def push(self, slot: int, rid: int) -> None:
        self.items.append(slot | rid << 32)

    def push_many(self, slots: np.ndarray, rid: int) -> None:
        self.items.frombytes((slots.astype(np.uint64) | np.uint64(rid << 32)).tobytes())

    def pop(self) -> None:
        self.head += 1
        if self.head > 4096 and self.head * 2 >= len(self.items):
            del self.items[:self.head]
            self.head = 0

    def clear(self) -> list[int]:
        slots = [v & 0xFFFFFFFF for v in self.items[self.head:]]
        self.items = array("Q")
        self.head = 0
        return slots
