"""The decisions `explain` shows and the state file keeps. File actions (promotions, discards) come tens a tick when
a hot list re-warms or a directory is deleted; switches, drains, knob writes and latches come a few an hour and are
the ones an operator asks about. Each class has its own bound, so a storm of the first never pushes the second out
(W3: a thousand promotions had taken every slot, and the mode switch they followed was gone from `explain`); read
back, they come in the order they were made."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any

FILE_KINDS = frozenset({"promote", "discard"})


class DecisionLog:
    def __init__(self, keep: int) -> None:
        self._files: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._other: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._seq = 0

    def append(self, d: dict[str, Any]) -> None:
        self._seq += 1
        (self._files if d.get("kind") in FILE_KINDS else self._other).append((self._seq, d))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (d for _, d in heapq.merge(self._files, self._other, key=lambda e: e[0]))

    def __len__(self) -> int:
        return len(self._files) + len(self._other)

    def last(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` of each class, in order (what the state file keeps: at most 2n)."""
        tail = (list(q)[-n:] if n > 0 else [] for q in (self._files, self._other))
        return [d for _, d in heapq.merge(*tail, key=lambda e: e[0])]
