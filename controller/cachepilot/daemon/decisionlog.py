"""The decisions `explain` shows and the state file keeps. File actions (promotions, discards) come tens a tick when
a hot list re-warms or a directory is deleted; switches, drains, knob writes and latches come a few an hour and are
the ones an operator asks about. Each class has its own bound, so a storm of the first never pushes the second out
(W3: a thousand promotions had taken every slot, and the mode switch they followed was gone from `explain`); read
back, they come in the order they were made.

A file action's record is kept as the outcome it came from and made into its dict only when read (``FileDecision``):
with 16 volumes re-warming, 8 192 promotions a tick were recorded and all but the last thousand dropped unread, and
building their dicts was a third of the tick (bench_daemon_files.py, issue 32). Actions and outcomes are frozen, so
the dict made later is the one that would have been made at once (the time is taken at once)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cachepilot.actions import DiscardRanges, Outcome

FILE_KINDS = frozenset({"promote", "discard"})


def decision(out: Outcome, ts: float, attempt: int = 0, note: str = "") -> dict[str, Any]:
    """An outcome as the decision record `explain` shows and the state file keeps."""
    a = out.action
    err = out.error
    return {
        "ts": ts,
        "volume": a.volume,
        "kind": a.kind,
        "action": a.line(),
        "reason": a.reason,
        "status": out.status,
        "dry_run": out.dry_run,
        "writes": [{"target": w.target, "before": w.before, "value": w.value, "readback": w.readback}
                   for w in out.writes],
        "error": str(err) if err else None,
        "error_kind": err.kind if err else None,
        "detail": detail(out, note),
        "attempt": attempt,
    }


def detail(out: Outcome, note: str = "") -> str:
    """The record's ``detail``: the caller's note, the outcome's own detail, what a discard's FITRIM did."""
    return " ".join(x for x in (note, out.detail, _discard_note(out)) if x)


def _discard_note(out: Outcome) -> str:
    if not isinstance(out.action, DiscardRanges) or not out.actuated:
        return ""
    later = f", {sum(n for _, n in out.deferred.ranges)} bytes deferred" if out.deferred else ""
    return (f"FITRIM issued {len(out.issued)} range(s), {out.issued_bytes} bytes; "
            f"filesystem trimmed {out.trimmed_bytes} bytes{later}")


class FileDecision:
    """A file action's decision record, made into its dict (:func:`decision`) when first read."""

    __slots__ = ("ts", "out", "attempt", "note", "_made")

    def __init__(self, out: Outcome, ts: float, attempt: int = 0, note: str = "") -> None:
        self.out, self.ts, self.attempt, self.note = out, ts, attempt, note
        self._made: dict[str, Any] | None = None

    def made(self) -> dict[str, Any]:
        if self._made is None:
            self._made = decision(self.out, self.ts, self.attempt, self.note)
        return self._made


Record = dict[str, Any] | FileDecision
Entry = tuple[int, Record]


def _made(r: Record) -> dict[str, Any]:
    return r if isinstance(r, dict) else r.made()


def _merged(*queues: Iterator[Entry] | tuple[Entry, ...]) -> Iterator[dict[str, Any]]:
    return (_made(d) for _, d in heapq.merge(*queues, key=lambda e: e[0]))


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
        self._files: deque[Entry] = deque(maxlen=keep)
        self._other: deque[Entry] = deque(maxlen=keep)
        self._seq = 0

    def append(self, d: Record) -> None:
        self._seq += 1
        kind = d.out.action.kind if isinstance(d, FileDecision) else d.get("kind")
        (self._files if kind in FILE_KINDS else self._other).append((self._seq, d))

    def append_file(self, d: FileDecision) -> None:
        """append() of a file action's record (the per-promotion path: no kind to look up)."""
        self._seq += 1
        self._files.append((self._seq, d))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return _merged(iter(self._files), iter(self._other))

    def view(self) -> DecisionView:
        return DecisionView(tuple(self._files), tuple(self._other))

    def __len__(self) -> int:
        return len(self._files) + len(self._other)

    def last(self, n: int) -> list[dict[str, Any]]:
        """The last ``n`` of each class, in order (what the state file keeps: at most 2n)."""
        tail = (list(q)[-n:] if n > 0 else [] for q in (self._files, self._other))
        return [_made(d) for _, d in heapq.merge(*tail, key=lambda e: e[0])]
