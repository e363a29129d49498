"""The cache-sizing advisor: an LRU miss-ratio curve of a volume's workload, estimated in bounded memory by
spatially hashed sampling (SHARDS, Waldspurger et al., FAST'15), with an error estimate.

What is sampled: the objects of the stream the probe delivers, which is per file and per tick (the hotness drain:
bytes read and written below the page cache). An object is a file (dev, ino, gen) weighted by the bytes of it the
workload touched; its reuse distance is the bytes of the distinct objects touched since its last access, plus its
own. A file is sampled when the hash of its identity falls under a threshold T (rate R = T / 2^24), so a sampled
file is seen at every access; its reuse distances, measured among sampled files only, estimate the full stream's
when scaled by 1/R. Fixed-size SHARDS: past ``max_objects`` sampled files, the one of the highest hash leaves and
T drops to its hash, so memory stays bounded whatever the stream; each access counts 1/R of the rate of its time.

Within a tick the order of accesses is lost: a file read more than once in a tick (bytes read beyond its touched
size) counts the extra reads as hits at any size (their distance is under one tick's traffic, far below a cache).
Reads count towards the hit ratio (byte-weighted: bcache and dm-cache count requests, which for whole-file reads
is proportional); writes are accesses too (written blocks enter bcache and dm-cache alike) but not hits or misses.

The estimate is the mean of SEEDS independent samplers (different hash seeds); the error is their spread (half the
range). LRU only: bcache's eviction and dm-cache's smq differ from LRU, so the error against a real cache is measured
(docs/benchmarks.md, tests/bench/bench_lab_advisor.py), not implied by the spread.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachepilot.models.hotness import HOT_DTYPE

HASH_BITS = 24
HASH_SPACE = 1 << HASH_BITS
BLOCK = 4096
SEEDS = 3
MAX_OBJECTS = 4096  # per sampler: SEEDS x this many files at most, whatever the stream
STEPS_PER_OCTAVE = 16  # histogram resolution: distances within 2^(1/16) (4.4%) share a bucket
MAX_BUCKET = 64 * STEPS_PER_OCTAVE
FACTORS = (0.5, 1.0, 2.0, 4.0)
ACHIEVABLE_SHARE = 0.9
MIN_EFFICIENCY, MAX_EFFICIENCY = 0.25, 4.0  # a calibration past these is not a cache behaving like an LRU


def spatial_hash(dev: np.ndarray, ino: np.ndarray, gen: np.ndarray, seed: int) -> np.ndarray:
    """A file identity's HASH_BITS-bit hash under ``seed`` (splitmix64's finaliser over the mixed fields), for a
    whole drain at once: the samplers look at a record only when its hash is under their threshold."""
    with np.errstate(over="ignore"):
        x = (ino.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             ^ (dev.astype(np.uint64) << np.uint64(32) | gen.astype(np.uint64))
             ^ np.uint64(seed * 0xD1B54A32D192ED03 & 0xFFFFFFFFFFFFFFFF))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return np.asarray(x >> np.uint64(64 - HASH_BITS))


def _bucket(distance: float) -> int:
    return min(MAX_BUCKET - 1, max(0, math.ceil(math.log2(max(distance, 1.0)) * STEPS_PER_OCTAVE)))


def _touched(read: np.ndarray, written: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Each file's weight in the cache for one tick: the bytes it moved, at most its size (when known), in whole
    blocks, at least one."""
    moved = np.maximum(read, written)
    moved = np.where(size > 0, np.minimum(moved, size), moved)
    return np.asarray(np.maximum(BLOCK, -(-moved // BLOCK) * BLOCK))


def _upto(size: float) -> int:
    """How many buckets hold distances a cache of ``size`` bytes fits: those of bucket sizes up to it."""
    if size < 1:
        return 0
    return min(MAX_BUCKET, math.floor(math.log2(size) * STEPS_PER_OCTAVE + 1e-9) + 1)


def _bucket_bytes(b: int) -> float:
    return float(2.0 ** (b / STEPS_PER_OCTAVE))


class _Fenwick:
    """Bytes of the sampled objects by recency position: the sum over positions after p is a reuse distance."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.t = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i <= self.n:
            self.t[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:  # positions [0, i)
        s = 0
        while i > 0:
            s += self.t[i]
            i -= i & -i
        return s


class Sampler:
    """One fixed-size SHARDS sampler (one hash seed)."""

    def __init__(self, seed: int, max_objects: int = MAX_OBJECTS) -> None:
        self.seed = seed
        self.max_objects = max_objects
        self.threshold = HASH_SPACE  # T: start at rate 1 (every object) and lower it as objects come
        self.capacity = 4 * max_objects  # recency positions before a renumbering
        self.tree = _Fenwick(self.capacity)
        self.clock = 0
        self.objects: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # key -> (hash, position, bytes)
        self.by_hash: list[tuple[int, tuple[int, int, int]]] = []  # max-heap (negated hash) of the sampled objects
        self.total = 0  # bytes of the sampled objects (the tree's whole sum)
        self.hist = np.zeros(MAX_BUCKET, dtype=np.float64)  # read bytes (scaled) by reuse-distance bucket
        self.near = 0.0  # re-reads within a tick: hits at any size
        self.read = 0.0
        self.written = 0.0
        self.samples = 0

    @property
    def rate(self) -> float:
        return self.threshold / HASH_SPACE

    def access(self, key: tuple[int, int, int], h: int, touched: int, read: int, written: int) -> None:
        """One tick's access to a file of hash ``h`` (under the threshold: sampled): ``touched`` bytes of it (its
        weight), ``read`` and ``written`` bytes."""
        scale = 1.0 / self.rate
        self.written += written * scale
        old = self.objects.get(key)
        if old is not None:
            _, pos, weight = old
            distance = self.total - self.tree.prefix(pos + 1) + touched
            self.tree.add(pos, -weight)
            self.total -= weight
        if read:
            self.samples += 1
            first = min(read, touched)
            self.read += read * scale
            self.near += (read - first) * scale
            if old is not None:  # a first access is a miss at any size: in the total only
                self.hist[_bucket(distance * scale)] += first * scale
        if self.clock >= self.capacity:
            self._renumber()
        self.tree.add(self.clock, touched)
        self.total += touched
        if old is None:
            heapq.heappush(self.by_hash, (-h, key))
        self.objects[key] = (h, self.clock, touched)
        self.clock += 1
        if len(self.objects) > self.max_objects:
            self._shrink()

    def _shrink(self) -> None:
        """Lower T to the highest sampled hash and drop every object at or above it."""
        top = -self.by_hash[0][0]
        self.threshold = top
        while self.by_hash and -self.by_hash[0][0] >= top:
            _, pos, weight = self.objects.pop(heapq.heappop(self.by_hash)[1])
            self.tree.add(pos, -weight)
            self.total -= weight

    def _renumber(self) -> None:
        """Positions ran out: the live objects, in recency order, get positions 0..n-1 again."""
        live = sorted(self.objects.items(), key=lambda kv: kv[1][1])
        self.tree = _Fenwick(self.capacity)
        for i, (k, (h, _, weight)) in enumerate(live):
            self.objects[k] = (h, i, weight)
            self.tree.add(i, weight)
        self.clock = len(live)

    def curve(self) -> np.ndarray:
        """The hit ratio at each bucket's size (index b: a cache of 2^(b/16) bytes)."""
        if self.read <= 0:
            return np.zeros(MAX_BUCKET)
        return np.asarray((np.cumsum(self.hist) + self.near) / self.read)

    def achievable(self) -> float:
        return float((self.hist.sum() + self.near) / self.read) if self.read > 0 else 0.0


@dataclass(frozen=True)
class Point:
    size_bytes: int
    hit_ratio: float
    error: float  # half the range across the samplers
    origin_read_bytes: int  # read misses
    origin_write_bytes: int  # written bytes reach the origin at any size (write-through now, write-back later)

    def to_json(self) -> dict[str, float | int]:
        return {"size_bytes": self.size_bytes, "hit_ratio": round(self.hit_ratio, 4), "error": round(self.error, 4),
                "origin_read_bytes": self.origin_read_bytes, "origin_write_bytes": self.origin_write_bytes}


MIN_REQUESTS = 100  # fewer reads counted by the cache calibrate nothing


class Measured:
    """The cache's own read hits and misses over the advisor's window: its first and last cumulative counts."""

    def __init__(self) -> None:
        self.first: tuple[int, int] | None = None
        self.last: tuple[int, int] | None = None

    def note(self, hits: int, misses: int) -> None:
        if self.first is None or hits < self.first[0] or misses < self.first[1]:  # new counters (cache replaced)
            self.first = (hits, misses)
        self.last = (hits, misses)

    def ratio(self) -> float | None:
        """The read hit ratio over the window (None: too few reads to calibrate by)."""
        if self.first is None or self.last is None:
            return None
        hits, misses = self.last[0] - self.first[0], self.last[1] - self.first[1]
        return hits / (hits + misses) if hits + misses >= MIN_REQUESTS else None


class Curve:
    """An advisor's curve frozen at one moment (the daemon publishes it with its snapshot; the control socket's
    thread reads it): each sampler's hit ratio by size bucket, and the mean bytes read and written."""

    def __init__(self, samplers: list[Sampler], measured: float | None = None) -> None:
        self.measured = measured  # the cache's own read hit ratio over the same window, if known
        self.ratios = np.stack([s.curve() for s in samplers]) if samplers else np.zeros((1, MAX_BUCKET))
        self.best = [s.achievable() for s in samplers] or [0.0]
        self.read = sum(s.read for s in samplers) / max(1, len(samplers))
        self.written = sum(s.written for s in samplers) / max(1, len(samplers))
        self.samples = min((s.samples for s in samplers), default=0)
        self.rate = min((s.rate for s in samplers), default=1.0)
        self.seeds = len(samplers)

    def point(self, size: int, efficiency: float = 1.0) -> Point:
        """The estimate at a cache of ``size`` bytes that behaves like an LRU of ``efficiency`` x its size."""
        upto = _upto(size * efficiency)
        ratios = self.ratios[:, upto - 1] if upto else np.zeros(len(self.ratios))
        ratio = float(ratios.mean())
        return Point(size, ratio, float(ratios.max() - ratios.min()) / 2, int(self.read * (1 - ratio)),
                     int(self.written))

    def efficiency(self, cache_bytes: int, measured: float) -> float:
        """How large an LRU the real cache behaves like, as a share of its size: the LRU size whose estimated hit
        ratio is the one the cache itself measured over the same window (bucket reserves, metadata, bucket-granular
        eviction and partial hits counted as misses make bcache smaller than an LRU of its size), within
        [MIN_EFFICIENCY, MAX_EFFICIENCY]."""
        b = int(np.searchsorted(self.ratios.mean(axis=0), measured - 1e-12))
        share = _bucket_bytes(min(b, MAX_BUCKET - 1)) / max(1, cache_bytes)
        return min(MAX_EFFICIENCY, max(MIN_EFFICIENCY, share))

    def calibration(self, cache_bytes: int) -> float:
        """The efficiency the cache's measured ratio gives (1: not measured, the plain LRU estimate)."""
        return 1.0 if self.measured is None or not self.samples else self.efficiency(cache_bytes, self.measured)

    def size_for(self, share: float = ACHIEVABLE_SHARE, efficiency: float = 1.0) -> int:
        """The smallest size whose (mean) hit ratio reaches ``share`` of the achievable one (0: nothing to hit)."""
        goal = share * sum(self.best) / len(self.best)
        if goal <= 0:
            return 0
        b = int(np.searchsorted(self.ratios.mean(axis=0), goal - 1e-12))
        return int(math.ceil(_bucket_bytes(min(b, MAX_BUCKET - 1)) / efficiency))

    def points(self, cache_bytes: int, efficiency: float = 1.0) -> list[Point]:
        """The points the advisor reports: FACTORS x the current cache, then the size for 90% of the achievable
        hits (sorted by size, one point per size)."""
        sizes = {int(cache_bytes * f) for f in FACTORS if cache_bytes > 0}
        sizes.add(self.size_for(efficiency=efficiency))
        return [self.point(s, efficiency) for s in sorted(sizes) if s > 0]

    def advice(self, cache_bytes: int, measured: float | None = None) -> dict[str, Any]:
        """The JSON the control socket and ``cachepilot advise`` show for one volume. With ``measured`` (the
        cache's own read hit ratio over the advisor's window) the points are calibrated: the cache is taken for an
        LRU of the size that gives that ratio, scaled with it (``lru_points``: the plain LRU estimate)."""
        out: dict[str, Any] = {"cache_bytes": cache_bytes, "samples": self.samples, "seeds": self.seeds,
                               "rate": round(self.rate, 6), "size_for_90pct": 0, "points": []}
        if not self.samples:
            return out
        eff = 1.0 if measured is None else self.efficiency(cache_bytes, measured)
        out.update(size_for_90pct=self.size_for(efficiency=eff),
                   points=[p.to_json() for p in self.points(cache_bytes, eff)])
        if measured is not None:
            out.update(measured_hit_ratio=round(measured, 4), efficiency=round(eff, 4),
                       lru_points=[p.to_json() for p in self.points(cache_bytes)])
        return out


EMPTY = Curve([])


class Advisor:
    """A volume's sampled LRU miss-ratio curve: SEEDS samplers fed the same accesses."""

    def __init__(self, max_objects: int = MAX_OBJECTS, seeds: int = SEEDS) -> None:
        self.samplers = [Sampler(s + 1, max_objects) for s in range(seeds)]

    def access(self, key: tuple[int, int, int], size: int, read: int, written: int) -> None:
        """A file's bytes read and written in one tick (``size``: the file's size, -1 when unknown)."""
        one = np.array([(key[0], key[1], key[2], 0, 0, read, written, 0, size)], dtype=HOT_DTYPE)
        self.observe(one)

    def observe(self, recs: np.ndarray) -> None:
        """One drain's records of this volume (HOT_DTYPE): each sampler takes those under its threshold."""
        read = np.maximum(recs["rb"].astype(np.int64), 0)
        written = np.maximum(recs["wb"].astype(np.int64), 0)
        touched = _touched(read, written, recs["size"].astype(np.int64))
        live = (read > 0) | (written > 0)
        for s in self.samplers:
            hashes = spatial_hash(recs["dev"], recs["ino"], recs["gen"], s.seed)
            pick = live & (hashes < s.threshold)
            rows = zip(recs["dev"][pick].tolist(), recs["ino"][pick].tolist(), recs["gen"][pick].tolist(),
                       hashes[pick].tolist(), touched[pick].tolist(), read[pick].tolist(), written[pick].tolist(),
                       strict=True)
            for dev, ino, gen, h, weight, rb, wb in rows:
                s.access((dev, ino, gen), h, weight, rb, wb)

    def freeze(self, measured: float | None = None) -> Curve:
        return Curve(self.samplers, measured)

    def point(self, size: int) -> Point:
        return self.freeze().point(size)

    def size_for(self, share: float = ACHIEVABLE_SHARE) -> int:
        return self.freeze().size_for(share)

    def curve(self, cache_bytes: int) -> list[Point]:
        return self.freeze().points(cache_bytes)


class Advisors:
    """One advisor per volume (by the filesystem's dev), fed from hotness drains (HOT_DTYPE arrays)."""

    def __init__(self, max_objects: int = MAX_OBJECTS) -> None:
        self.max_objects = max_objects
        self.by_dev: dict[int, Advisor] = {}
        self.measured: dict[int, Measured] = {}

    def observe(self, records: np.ndarray, devs: Collection[int]) -> None:
        """A drain's records; files of devices not in ``devs`` (no managed volume) are left out, so the advisors
        stay as many as the volumes."""
        if not records.size:
            return
        for dev in np.unique(records["dev"]).tolist():
            if dev not in devs:
                continue
            adv = self.by_dev.get(dev)
            if adv is None:
                adv = self.by_dev[dev] = Advisor(self.max_objects)
            adv.observe(records[records["dev"] == dev])

    def note_sample(self, dev: int, hits: int, misses: int) -> None:
        """The cache's own cumulative read hits and misses (a volume sample), to calibrate by."""
        self.measured.setdefault(dev, Measured()).note(hits, misses)

    def forget(self, keep: Collection[int]) -> None:
        """Volumes gone: their advisors go too."""
        for dev in [d for d in self.by_dev if d not in keep]:
            del self.by_dev[dev]
        for dev in [d for d in self.measured if d not in keep]:
            del self.measured[dev]

    def curve_of(self, dev: int) -> Curve:
        adv = self.by_dev.get(dev)
        m = self.measured.get(dev)
        return adv.freeze(m.ratio() if m is not None else None) if adv is not None else EMPTY

    def advice(self, dev: int, cache_bytes: int, calibrate: bool = True) -> dict[str, Any]:
        curve = self.curve_of(dev)
        return curve.advice(cache_bytes, curve.measured if calibrate else None)
