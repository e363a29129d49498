"""Volume state and health, from periodic backend samples.

A :class:`VolumeInfo` is what discovery found (names, filesystem, cache kind); a :class:`VolumeSample` is
one reading of the backend (mode, dirty bytes, cumulative hit/miss/error counters). :class:`VolumeState`
turns samples into hit ratio, its trend, error rate, dirty growth rate, the last point the cache was known
clean, and a health verdict.

Exposure age is not estimated from writes (a write the cache bypasses, or an overwrite of a dirty block, tells
nothing about the oldest dirty byte): it is bounded by the time since the cache was last *known* clean -- a
sample showing no dirty data, or the start of a drain that completed (:meth:`VolumeState.cleaned`).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from cachepilot.capabilities import KIND_BCACHE
from cachepilot.models.writeback import WritebackView


class Health(enum.IntEnum):
    OK = 0
    DEGRADED = 1  # cache I/O errors are rising
    FAILED = 2  # the cache device failed or went away


# Write modes, backend-neutral. BYPASS is bcache "none" / dm-cache "passthrough".
WRITEBACK = "writeback"
WRITETHROUGH = "writethrough"
BYPASS = "bypass"
MODES = (WRITEBACK, WRITETHROUGH, BYPASS)
BYPASS_NAMES = frozenset({BYPASS, "none", "passthrough"})


@dataclass(frozen=True, slots=True)
class VolumeInfo:
    dev: int  # kernel dev_t of the cached volume (== the filesystem's dev)
    name: str  # e.g. bcache0, dm-3
    kind: str = KIND_BCACHE  # a kind of the table (cachepilot.capabilities.KINDS)
    fs_uuid: str = ""
    mountpoint: str = ""
    cache_bytes: int = 0
    fs_block_size: int = 4096
    fs_discard: bool = False  # filesystem mounted with -o discard: do not duplicate
    # The smallest discard (bytes) that changes what the cache writes back: bcache a sector, dm-writecache its block,
    # dm-cache its discard block (backends.dmcache.discard_block_bytes). 0: not known.
    discard_unit: int = 0
    cache_id: str = ""
    """Identity of the cache device: bcache cache-set UUID, dm-cache / dm-writecache cache device dev_t
    ("major:minor"); "" = unknown. A new identity means the cache device was replaced (clears a failure latch)."""


@dataclass(frozen=True, slots=True)
class VolumeSample:
    dev: int
    ts_ns: int
    mode: str
    dirty_bytes: int
    hits: int  # cumulative
    misses: int  # cumulative
    io_errors: int  # cumulative cache-device errors
    failed: bool = False
    knobs: dict[str, str] = field(default_factory=dict)
    cache_id: str = ""  # as VolumeInfo.cache_id, read with this sample ("" = unknown or detached)
    bypasses: int | None = None  # cumulative I/Os the cache sent around itself (bcache); None: no such counter
    bypassed_bytes: int | None = None  # cumulative bytes of those (bcache, to the precision it prints)
    # bcache: the cache set's in-use share at its last GC (dirty and metadata buckets, buckets allocated since),
    # 100 - cache_available_percent; what its write cutoffs compare (engine.lifetime). None: not known
    in_use_percent: int | None = None
    # cumulative bytes written to the cache target (dm-writecache's write statistic; restarts at a table reload).
    # None: not known
    written_bytes: int | None = None
    # what the kind says about its write-back beyond dirty bytes (models/writeback.py); None: nothing
    writeback: WritebackView | None = None


class VolumeState:
    def __init__(self, info: VolumeInfo, window: int = 60, error_threshold: int = 1, rate_window: int = 8) -> None:
        self.info = info
        self.mode = WRITETHROUGH
        self.dirty_bytes = 0
        self.clean_ns: int | None = None  # last time the cache was known to hold no dirty data
        self.io_errors = 0
        # The kernel's error count may go down (bcache's io_errors decays): what it has risen by, never less.
        self.io_errors_risen = 0
        self.failed = False
        # Dirty bytes at the last sample before the cache failed: a failed dm-cache reports no figures ("Fail"), so
        # what it still held is known only from before (the loss a detach would cause, engine/operatordetach.py).
        self.dirty_before_failure = 0
        self.knobs: dict[str, str] = {}
        self.in_use_percent: int | None = None
        self.written_bytes: int | None = None
        self.cache_id = info.cache_id
        self.error_threshold = error_threshold
        self._hist: deque[tuple[int, int, int, int]] = deque(maxlen=window)  # ts, hits, misses, errors
        self._ratios: deque[float] = deque(maxlen=window)
        self._dirty: deque[tuple[int, int]] = deque(maxlen=rate_window)  # (ts, dirty bytes)
        self._error_base = 0  # errors up to here are forgiven (operator cleared, or another device)
        self.last_ts = 0
        self.samples = 0

    def update(self, s: VolumeSample) -> int:
        """Apply a sample; returns the increase in dirty bytes since the previous one."""
        if s.dirty_bytes < 0 or s.hits < 0 or s.misses < 0 or s.io_errors < 0:
            raise ValueError(f"negative counter in sample for {self.info.name}")
        before = self.dirty_bytes if self.samples else 0
        grew = s.dirty_bytes - before
        if s.cache_id and s.cache_id != self.cache_id:
            if self.cache_id:
                self._new_cache_device()
            self.cache_id = s.cache_id
        if self._hist:
            _, h0, m0, _ = self._hist[-1]
            dh, dm = s.hits - h0, s.misses - m0
            if dh >= 0 and dm >= 0 and dh + dm > 0:
                self._ratios.append(dh / (dh + dm))
        self._hist.append((s.ts_ns, s.hits, s.misses, s.io_errors))
        self._dirty.append((s.ts_ns, s.dirty_bytes))
        self.mode = s.mode
        self.dirty_bytes = s.dirty_bytes
        if s.dirty_bytes == 0:
            self.clean_ns = s.ts_ns
        self.io_errors_risen += s.io_errors if self.samples == 0 else max(0, s.io_errors - self.io_errors)
        self.io_errors = s.io_errors
        if s.failed and not self.failed:
            self.dirty_before_failure = max(before, s.dirty_bytes)
        elif not s.failed:
            self.dirty_before_failure = 0
        self.failed = s.failed
        self.knobs = dict(s.knobs)
        self.in_use_percent = s.in_use_percent
        self.written_bytes = s.written_bytes
        self.last_ts = s.ts_ns
        self.samples += 1
        return max(0, grew)

    def _new_cache_device(self) -> None:
        """Another cache device: its counters start afresh; history of the old one means nothing."""
        self._hist.clear()
        self._ratios.clear()
        self._dirty.clear()
        self._error_base = 0
        self.io_errors = 0  # the new device's count rises from nothing (io_errors_risen counts all of it)

    def cleaned(self, since_ns: int) -> None:
        """Everything dirty at since_ns has been written back (a drain that started then completed)."""
        if self.clean_ns is None or since_ns > self.clean_ns:
            self.clean_ns = since_ns

    def forgive_errors(self) -> None:
        """Count only errors after this point (an operator cleared the failure)."""
        self._error_base = self._hist[-1][3] if self._hist else self.io_errors

    @property
    def hit_ratio(self) -> float | None:
        if len(self._hist) < 2:
            return None
        _, h0, m0, _ = self._hist[0]
        _, h1, m1, _ = self._hist[-1]
        tot = (h1 - h0) + (m1 - m0)
        return (h1 - h0) / tot if tot > 0 else None

    def hit_trend(self, short: int = 5) -> float:
        """Recent hit ratio minus the window's: negative when the cache got worse (a scan polluted it)."""
        r = list(self._ratios)
        if len(r) < short + 2:
            return 0.0
        recent = sum(r[-short:]) / short
        older = r[:-short]
        return recent - sum(older) / len(older)

    def recent_errors(self) -> int:
        if len(self._hist) < 2:
            return 0
        return max(0, self._hist[-1][3] - max(self._hist[0][3], self._error_base))

    def dirty_rate(self) -> float:
        """Peak growth of dirty data (bytes/s) between consecutive recent samples; 0 when it only shrank."""
        peak = 0.0
        prev: tuple[int, int] | None = None
        for ts, d in self._dirty:
            if prev is not None and ts > prev[0] and d > prev[1]:
                peak = max(peak, (d - prev[1]) * 1e9 / (ts - prev[0]))
            prev = (ts, d)
        return peak

    def exposure_age_s(self, now_ns: int) -> float:
        """Upper bound on the age of the oldest dirty byte: time since the cache was last known clean
        (since the first sample when it was never seen clean)."""
        if self.dirty_bytes == 0 and self.clean_ns is not None and self.clean_ns >= self.last_ts:
            return 0.0
        since = self.clean_ns if self.clean_ns is not None else self._first_ts()
        return max(0.0, (now_ns - since) / 1e9)

    def _first_ts(self) -> int:
        return self._hist[0][0] if self._hist else self.last_ts

    @property
    def health(self) -> Health:
        if self.failed:
            return Health.FAILED
        if self.recent_errors() >= self.error_threshold:
            return Health.DEGRADED
        return Health.OK
