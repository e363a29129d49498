"""Barrier epochs of one volume (Qin et al.): one epoch contract, as the kernel delivers it.

- A **block barrier** (a PREFLUSH, FUA or empty-flush bio: ``Barrier`` with ``closes_epoch``) closes the
  volume's open epoch. Its ``epoch_bytes`` (with the data/metadata split) are the bytes written since the
  previous block barrier, counted in the kernel: the epoch's size.
- A **file-level durability call** (fsync, fdatasync, sync_file_range, syncfs, sync, O_SYNC writes, msync)
  only *annotates* the open epoch with who synced: the kernel counts them per volume and kind and delivers
  :class:`~cachepilot.events.SyncCalls`; an older producer delivers one ``Barrier`` of a file-level kind
  per call (``closes_epoch`` False). Either way it never closes an epoch: the flush it causes does, so an
  fsync and its journal flush are one epoch, and its bytes count once.

Per closed epoch we keep start, end, bytes (data/metadata), bytes that became dirty in the cache, the
closing barrier's kind and the file-level syncs that annotated it, in a bounded window;
:meth:`EpochTracker.stats` summarises the window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from cachepilot.events import Barrier, BarrierKind, SyncCalls

BLOCK_BARRIERS = frozenset({BarrierKind.PREFLUSH, BarrierKind.FUA, BarrierKind.EMPTY_FLUSH})
"""The barrier kinds that are bios (and so may close an epoch); every other kind is a file-level call."""


def closes(ev: Barrier) -> bool:
    """Whether a barrier closes the open epoch: only block barriers that say so."""
    return ev.closes_epoch and ev.kind in BLOCK_BARRIERS


class Epoch(NamedTuple):
    """One closed epoch. A named tuple, not a frozen dataclass: one is made per flush, and a frozen dataclass's
    field-by-field construction cost four times as much (a flush storm brings hundreds a second)."""

    start_ns: int
    end_ns: int
    bytes: int
    dirty_bytes: int
    kind: BarrierKind  # the block barrier that closed it
    pid: int  # the last file-level syncer while it was open (0: none; the flush came from elsewhere)
    data_bytes: int = 0
    meta_bytes: int = 0
    syncs: int = 0  # file-level durability calls that annotated it
    sync_kind: BarrierKind | None = None  # the last of them


@dataclass(frozen=True, slots=True)
class EpochStats:
    epochs: int
    barrier_rate: float  # epochs closed per second over the window
    mean_bytes: float
    p95_bytes: int
    mean_dirty_bytes: float
    mean_duration_s: float
    file_syncs: int  # file-level durability calls (fsync & co.) over the window's epochs
    synced_epochs: int = 0  # epochs that at least one file-level call asked for


class EpochTracker:
    def __init__(self, window: int = 256, start_ns: int = 0) -> None:
        self.window: deque[Epoch] = deque(maxlen=window)
        self.current_start = start_ns
        self.current_dirty = 0
        self.current_syncs = 0
        self.current_pid = 0
        self.current_sync_kind: BarrierKind | None = None
        self.total_barriers = 0  # epochs closed
        self.total_syncs = 0  # file-level calls seen
        self.total_bytes = 0  # bytes of all closed epochs

    def note_dirty(self, nbytes: int) -> None:
        if nbytes > 0:
            self.current_dirty += nbytes

    def feed(self, ev: Barrier | SyncCalls) -> Epoch | None:
        """Either kind of durability event; the closed epoch, if this closed one."""
        if isinstance(ev, SyncCalls):
            self.sync_calls(ev)
            return None
        return self.barrier(ev)

    def sync_calls(self, ev: SyncCalls) -> None:
        if ev.calls < 0:
            raise ValueError("negative sync call count")
        if ev.calls:
            self._annotate(ev.calls, ev.last_pid, ev.kind)

    def _annotate(self, calls: int, pid: int, kind: BarrierKind) -> None:
        self.current_syncs += calls
        self.total_syncs += calls
        self.current_pid = pid
        self.current_sync_kind = kind

    def barrier(self, ev: Barrier) -> Epoch | None:
        """A block barrier closes the open epoch (returned); a file-level one annotates it (None)."""
        if ev.epoch_bytes < 0:
            raise ValueError("negative epoch bytes")
        if not closes(ev):
            self._annotate(1, ev.pid, ev.kind)
            return None
        ep = Epoch(self.current_start, ev.ts_ns, ev.epoch_bytes, self.current_dirty, ev.kind,
                   self.current_pid, ev.epoch_data_bytes, ev.epoch_meta_bytes, self.current_syncs,
                   self.current_sync_kind)
        self.window.append(ep)
        self.current_start = ev.ts_ns
        self.current_dirty = 0
        self.current_syncs = 0
        self.current_pid = 0
        self.current_sync_kind = None
        self.total_barriers += 1
        self.total_bytes += ev.epoch_bytes
        return ep

    def summary(self) -> str:
        """Totals, one line: what a live run and a replay of its trace must agree on."""
        return f"{self.total_barriers} epochs, {self.total_syncs} file-level syncs, {self.total_bytes} bytes"

    def stats(self, now_ns: int | None = None) -> EpochStats:
        w = self.window
        n = len(w)
        if n == 0:
            return EpochStats(0, 0.0, 0.0, 0, 0.0, 0.0, self.current_syncs, 0)
        end = now_ns if now_ns is not None and now_ns > w[-1].end_ns else w[-1].end_ns
        span = (end - w[0].start_ns) / 1e9
        sizes = sorted(e.bytes for e in w)
        return EpochStats(
            epochs=n,
            barrier_rate=n / span if span > 0 else float(n),
            mean_bytes=sum(sizes) / n,
            p95_bytes=sizes[min(n - 1, (95 * n) // 100)],
            mean_dirty_bytes=sum(e.dirty_bytes for e in w) / n,
            mean_duration_s=sum(e.end_ns - e.start_ns for e in w) / n / 1e9,
            file_syncs=sum(e.syncs for e in w),
            synced_epochs=sum(1 for e in w if e.syncs),
        )
