"""Cumulative counters over a sliding time window: how much they grew in about the last ``window_ns``.

Kept as marks (time, counts): the newest mark at least ``window_ns`` old and every one since, so the growth from
the first mark to the last spans at least the window once there is a mark that old (bounded by the marks taken in
one window). A count that goes back (the counter restarted, e.g. dm statistics at a table reload) forgets them."""

from __future__ import annotations

from collections import deque


class CounterWindow:
    def __init__(self) -> None:
        self.marks: deque[tuple[int, tuple[int, ...]]] = deque()

    def note(self, ts: int, counts: tuple[int, ...], window_ns: int) -> None:
        last = self.marks[-1] if self.marks else None
        if last is not None and (ts < last[0] or any(c < p for c, p in zip(counts, last[1], strict=True))):
            self.marks.clear()
            last = None
        if last is None or ts > last[0]:
            self.marks.append((ts, counts))
        while len(self.marks) > 2 and self.marks[1][0] <= ts - window_ns:
            self.marks.popleft()

    def clear(self) -> None:
        self.marks.clear()

    def growth(self) -> tuple[int, ...]:
        """Growth of each counter from the oldest mark kept to the newest (all 0 without marks)."""
        if not self.marks:
            return ()
        (_, first), (_, last) = self.marks[0], self.marks[-1]
        return tuple(b - a for a, b in zip(first, last, strict=True))

    def spans(self, ts: int, window_ns: int) -> bool:
        """Whether the oldest mark kept is at least ``window_ns`` before ``ts``."""
        return bool(self.marks) and self.marks[0][0] <= ts - window_ns
