"""Volume state and health, from periodic backend samples.

A :class:`VolumeInfo` is what discovery found (names, filesystem, cache kind); a :class:`VolumeSample` is
one reading of the backend (mode, dirty bytes, cumulative hit/miss/error counters). :class:`VolumeState`
turns samples into hit ratio, its trend, error rate, exposure age and a health verdict.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


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
    kind: str = "bcache"  # bcache | dm-cache | dm-writecache
    fs_uuid: str = ""
    mountpoint: str = ""
    cache_bytes: int = 0
    fs_block_size: int = 4096
    fs_discard: bool = False  # filesystem mounted with -o discard: do not duplicate


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


class VolumeState:
    def __init__(self, info: VolumeInfo, window: int = 60, error_threshold: int = 1) -> None:
        self.info = info
        self.mode = WRITETHROUGH
        self.dirty_bytes = 0
        self.dirty_since_ns: int | None = None
        self.io_errors = 0
        self.failed = False
        self.knobs: dict[str, str] = {}
        self.error_threshold = error_threshold
        self._hist: deque[tuple[int, int, int, int]] = deque(maxlen=window)  # ts, hits, misses, errors
        self._ratios: deque[float] = deque(maxlen=window)
        self.last_ts = 0
        self.samples = 0
        self._dirtied: deque[tuple[int, int]] = deque()  # (ts, cumulative bytes dirtied by then)
        self._cum_dirtied = 0
        self._base_written: int | None = None

    def update(self, s: VolumeSample, cum_written: int | None = None) -> int:
        """Apply a sample; returns the increase in dirty bytes since the previous one.

        ``cum_written`` is the volume's cumulative bytes written (from the hotness deltas); with it the
        age of the oldest dirty byte is estimated first-in-first-out (bytes written while in write-back
        become dirty; what is no longer dirty was written back oldest first). Without it, the age is the
        time since the cache was last clean."""
        if s.dirty_bytes < 0 or s.hits < 0 or s.misses < 0 or s.io_errors < 0:
            raise ValueError(f"negative counter in sample for {self.info.name}")
        grew = s.dirty_bytes - self.dirty_bytes if self.samples else s.dirty_bytes
        if cum_written is not None:
            if self._base_written is None:
                self._base_written = cum_written - s.dirty_bytes
            dirtied = max(cum_written - self._base_written, s.dirty_bytes)
            if dirtied > self._cum_dirtied:
                self._cum_dirtied = dirtied
                self._dirtied.append((s.ts_ns, dirtied))
            cleaned = self._cum_dirtied - s.dirty_bytes
            d = self._dirtied
            while len(d) > 1 and d[0][1] <= cleaned:
                d.popleft()
        if self._hist:
            _, h0, m0, _ = self._hist[-1]
            dh, dm = s.hits - h0, s.misses - m0
            if dh >= 0 and dm >= 0 and dh + dm > 0:
                self._ratios.append(dh / (dh + dm))
        self._hist.append((s.ts_ns, s.hits, s.misses, s.io_errors))
        self.mode = s.mode
        self.dirty_bytes = s.dirty_bytes
        if s.dirty_bytes > 0:
            if self.dirty_since_ns is None:
                self.dirty_since_ns = s.ts_ns
        else:
            self.dirty_since_ns = None
        self.io_errors = s.io_errors
        self.failed = s.failed
        self.knobs = dict(s.knobs)
        self.last_ts = s.ts_ns
        self.samples += 1
        return max(0, grew)

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
        return self._hist[-1][3] - self._hist[0][3]

    def exposure_age_s(self, now_ns: int) -> float:
        """Estimated age of the oldest dirty byte."""
        if self.dirty_since_ns is None:
            return 0.0
        since = self.dirty_since_ns
        if self._dirtied:
            since = max(since, self._dirtied[0][0])
        return max(0.0, (now_ns - since) / 1e9)

    @property
    def health(self) -> Health:
        if self.failed:
            return Health.FAILED
        if self.recent_errors() >= self.error_threshold:
            return Health.DEGRADED
        return Health.OK
