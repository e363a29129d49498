"""The decisions `explain` shows and the state file keeps. File actions (promotions, discards) come tens a tick when
a hot list re-warms or a directory is deleted; switches, drains, knob writes and latches come a few an hour and are
the ones an operator asks about. Each class has its own bound, so a storm of the first never pushes the second out
(W3: a thousand promotions had taken every slot, and the mode switch they followed was gone from `explain`); read
back, they come in the order they were made."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

FILE_KINDS = frozenset({"promote", "discard"})
Entry = tuple[int, dict[str, Any]]


def _merged(*queues: Iterator[Entry] | tuple[Entry, ...]) -> Iterator[dict[str, Any]]:
    return (d for _, d in heapq.merge(*queues, key=lambda e: e[0]))


@dataclass(frozen=True)
class DecisionView:
    """The log as it was at one moment, for the published snapshot: two tuple copies (C-speed), merged into order
    only when read (`explain`). The snapshot is built every tick and read rarely; merging up to 2 x DECISIONS_KEPT
    entries each tick cost the publish stage milliseconds a tick on the lab's TCG guest (issue 23 item 5)."""

    files: tuple[Entry, ...] = ()
    other: tuple[Entry, ...] = ()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _merged(self.files, self.other)

    def __len__(self) -> int:
        return len(self.files) + len(self.other)


class DecisionLog:
    def __init__(self, keep: int) -> None:
        self._files: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._other: deque[tuple[int, dict[str, Any]]] = deque(maxlen=keep)
        self._seq = 0

    def append(self, d: dict[str, Any]) -> None:
        self._seq += 1
        (self._files if d.get("kind") in FILE_KINDS else self._other).append((self._seq, d))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _merged(iter(self._files), iter(self._other))

    def view(self) -> DecisionView:
        return DecisionView(tuple(self._files), tuple(self._other))

    def __len__(self) -> int:
        return len(self._files) + len(self._other)

    def last(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` of each class, in order (what the state file keeps: at most 2n)."""
        tail = (list(q)[-n:] if n > 0 else [] for q in (self._files, self._other))
        return [d for _, d in heapq.merge(*tail, key=lambda e: e[0])]
