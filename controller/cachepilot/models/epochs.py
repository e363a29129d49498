"""Barrier epochs of one volume (Qin et al.): each barrier closes the current epoch.

Per closed epoch we keep start, end, bytes written, bytes that became dirty in the cache, the barrier
kind and who synced, in a bounded window; :meth:`EpochTracker.stats` summarises the window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cachepilot.events import Barrier, BarrierKind


@dataclass(frozen=True, slots=True)
class Epoch:
    start_ns: int
    end_ns: int
    bytes: int
    dirty_bytes: int
    kind: BarrierKind
    pid: int


@dataclass(frozen=True, slots=True)
class EpochStats:
    epochs: int
    barrier_rate: float  # barriers per second over the window
    mean_bytes: float
    p95_bytes: int
    mean_dirty_bytes: float
    mean_duration_s: float
    file_syncs: int  # barriers that came from fsync & co. (not block-level flushes)


class EpochTracker:
    def __init__(self, window: int = 256, start_ns: int = 0) -> None:
        self.window: deque[Epoch] = deque(maxlen=window)
        self.current_start = start_ns
        self.current_dirty = 0
        self.total_barriers = 0

    def note_dirty(self, nbytes: int) -> None:
        if nbytes > 0:
            self.current_dirty += nbytes

    def barrier(self, ev: Barrier) -> Epoch:
        if ev.epoch_bytes < 0:
            raise ValueError("negative epoch bytes")
        ep = Epoch(self.current_start, ev.ts_ns, ev.epoch_bytes, self.current_dirty, ev.kind, ev.pid)
        self.window.append(ep)
        self.current_start = ev.ts_ns
        self.current_dirty = 0
        self.total_barriers += 1
        return ep

    def stats(self, now_ns: int | None = None) -> EpochStats:
        w = self.window
        n = len(w)
        if n == 0:
            return EpochStats(0, 0.0, 0.0, 0, 0.0, 0.0, 0)
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
            file_syncs=sum(1 for e in w if e.kind >= BarrierKind.FSYNC),
        )
