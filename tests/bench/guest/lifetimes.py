"""The pure parts of the headline fileserver (no guest, no devices): the lifetime mix of new files and the
delete -> discard bookkeeping, so that both can be unit-tested on the host.

Lifetime mix (docs/benchmarks.md, "W1"): a share of the new bytes dies young, its lifetime drawn log-uniformly
between a few seconds and a minute (file-system traces find short lifetimes spread over orders of magnitude, not
memoryless); the rest is long-lived: it stays until the live set passes its target, then the oldest goes first."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

Extents = Sequence[tuple[int, int]]  # (start sector, sectors)


@dataclass(frozen=True)
class LifetimeMix:
    short_share: float = 0.5  # share of new files (sizes are drawn independently, so also of new bytes)
    short_min_s: float = 2.0
    short_max_s: float = 60.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.short_share <= 1.0 and 0.0 < self.short_min_s <= self.short_max_s):
            raise ValueError(f"bad lifetime mix {self}")

    def draw(self, rnd: random.Random) -> float | None:
        """Seconds this new file lives, or None for a long-lived one."""
        if rnd.random() >= self.short_share:
            return None
        lo, hi = math.log(self.short_min_s), math.log(self.short_max_s)
        return math.exp(rnd.uniform(lo, hi))

    def median_short_s(self) -> float:
        return math.sqrt(self.short_min_s * self.short_max_s)


@dataclass(frozen=True)
class WallClockMix:
    """Issue 31: every new file's death time drawn at its birth, in seconds of wall-clock time, from lifetime
    classes (share, shortest, longest; log-uniform within a class), so a faster configuration does not kill its data
    younger (the live-set target did: ~42 s under cachepilot, ~64 s under stock write-back). Besides, a share of
    the loop's steps overwrites a live file whole (its old blocks die: the deaths by overwrite of trace studies).

    The default classes follow the one figure the project's sources quote: "about 50% of files are deleted within 5
    minutes, with 20% existing for less than half a minute in certain local file system workloads" (the Loris
    thesis, shared/seeds/002, citing Ousterhout et al., SOSP '85; second-hand). Baker et al. '91, Roselli et al.
    '00 and Wang & Hu FAST '02 are not in the search corpus: their figures are unverified here and not used."""

    classes: tuple[tuple[float, float, float], ...] = ((0.2, 2.0, 30.0), (0.3, 30.0, 300.0), (0.5, 300.0, 3600.0))
    overwrite_share: float = 0.1  # of the loop's steps: one live file rewritten whole (O_TRUNC) and fsync'ed

    def __post_init__(self) -> None:
        total = sum(c[0] for c in self.classes)
        if abs(total - 1.0) > 1e-9 or any(not (0 < lo <= hi) or share < 0 for share, lo, hi in self.classes) \
                or not 0.0 <= self.overwrite_share <= 1.0:
            raise ValueError(f"bad wall-clock lifetime mix {self}")

    def draw(self, rnd: random.Random) -> float:
        """Seconds this new file lives."""
        x = rnd.random()
        for share, lo, hi in self.classes:
            if x < share:
                return math.exp(rnd.uniform(math.log(lo), math.log(hi)))
            x -= share
        _, lo, hi = self.classes[-1]
        return math.exp(rnd.uniform(math.log(lo), math.log(hi)))

    def share_within(self, seconds: float) -> float:
        """The share of new files that die within ``seconds`` (the mix's own CDF)."""
        out = 0.0
        for share, lo, hi in self.classes:
            if seconds >= hi:
                out += share
            elif seconds > lo:
                out += share * (math.log(seconds) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return out


@dataclass
class Outcomes:
    latencies: list[float]  # delete -> first overlapping discard, seconds
    never: int  # deletes no discard reached
    reused_first: int  # of those, deletes whose blocks a later file took before any discard came


class ExtentIndex:
    """Files' extents with their creation time, searchable by sector (sorted by start)."""

    def __init__(self, created: Sequence[tuple[float, Extents]]) -> None:
        rows = sorted((s, n, t) for t, ext in created for s, n in ext)
        self.starts = [r[0] for r in rows]
        self.rows = rows
        self.longest = max((r[1] for r in rows), default=0)

    def first_after(self, ext: Extents, after: float) -> float | None:
        """The earliest creation after `after` of a file that overlaps ext."""
        best: float | None = None
        for s, n in ext:
            i = bisect.bisect_left(self.starts, s - self.longest)
            for rs, rn, t in self.rows[i:bisect.bisect_left(self.starts, s + n)]:
                if rs < s + n and s < rs + rn and t > after and (best is None or t < best):
                    best = t
        return best


def discard_outcomes(deletes: Sequence[tuple[float, Extents]], discards: Sequence[tuple[float, int, int]],
                     created: Sequence[tuple[float, Extents]]) -> Outcomes:
    """Per delete: the first discard bio (time, sector, sectors) at or after it overlapping its extents, unless a
    file created after the delete took one of its blocks first: that discard was the new file's, not this delete's.
    A delete no discard reached before such a reuse counts as never reached, and as reused first when one came."""
    disc = ExtentIndex([(d, [(s, n)]) for d, s, n in discards])
    index = ExtentIndex(created)
    out = Outcomes([], 0, 0)
    for t, ext in deletes:
        hit = disc.first_after(ext, t - 1e-9)
        reuse = index.first_after(ext, t)
        if hit is not None and (reuse is None or hit <= reuse):
            out.latencies.append(hit - t)
            continue
        out.never += 1
        out.reused_first += reuse is not None
    return out


def reach_share(o: Outcomes) -> float:
    """Discards' reach: deletes a discard reached / deletes whose blocks were not reused before any discard."""
    eligible = len(o.latencies) + o.never - o.reused_first
    return len(o.latencies) / eligible if eligible else float("nan")


BLOCK = 8  # sectors: ext4's 4 KiB block, the unit in which the exposure witness tracks dirty data


def oldest_dirty_age(events: Sequence[tuple[float, str, int, int]], end: float) -> float:
    """The age of the oldest dirty data seen, from bcache's own events (time, kind, start sector, sectors): "w" a
    write bcache cached as dirty (its blocks' age starts, a rewrite restarts it), "wb" a key bcache wrote back (its
    blocks written before that are clean), "d" a discard (its blocks are dead), "c" a write bcache sent to the
    origin (write-through or bypassed: it replaces whatever was dirty there). Evaluated just before every event and
    at `end`; blocks still dirty at the end count with their age then."""
    import heapq

    born: dict[int, float] = {}
    heap: list[tuple[float, int]] = []
    worst = 0.0

    def oldest(now: float) -> float:
        while heap and born.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: that block was cleaned or rewritten since
        return now - heap[0][0] if heap else 0.0

    for t, kind, start, n in sorted(events):
        worst = max(worst, oldest(t))  # just before the event: the age its clean-up ends
        for b in range(start // BLOCK, (start + n + BLOCK - 1) // BLOCK):
            if kind == "w":
                born[b] = t
                heapq.heappush(heap, (t, b))
            elif kind in ("d", "c") or (b in born and born[b] < t):
                born.pop(b, None)
    return max(worst, oldest(end))


def surviving_share(mix: LifetimeMix, ops_s: float, bound_s: float, target: int, seconds: float = 1200.0,
                    warm_s: float = 300.0, seed: int = 1) -> float:
    """The share of the loop's new data bytes (files and appends, written after warm_s) still alive bound_s after
    they were written: what even a perfect per-byte, age-ordered write-back under an age bound must send to the
    origin, while write-through sends all of them. A model of headline_fileserver's loop without I/O (a new file of
    64-192 KiB, 16 KiB appended to a long-lived file, the short ones die on schedule, the oldest long ones go when
    the live set passes target), four ops a step as the loop counts them."""
    import heapq

    rnd = random.Random(seed)  # noqa: S311 - a reproducible model, not a secret
    step_s = 4.0 / ops_s
    size: dict[int, int] = {}
    writes: dict[int, list[tuple[float, int]]] = {}
    long: list[int] = []
    short: list[tuple[float, int]] = []
    n, now, live, total, alive = 0, 0.0, 0, 0, 0

    def new(nbytes: int) -> int:
        nonlocal n, live
        size[n], writes[n], live, n = nbytes, [(now, nbytes)], live + nbytes, n + 1
        return n - 1

    def die(f: int, at: float) -> None:
        nonlocal total, alive, live
        for t, b in writes.pop(f):
            if warm_s <= t <= seconds - bound_s:
                total, alive = total + b, alive + (b if at - t >= bound_s else 0)
        live -= size.pop(f)

    while live < target:
        long.append(new(rnd.randrange(64, 193) * 1024))
        writes[long[-1]] = []  # the initial set is written before the loop: not the loop's new bytes
    while now < seconds:
        f = new(rnd.randrange(64, 193) * 1024)
        life = mix.draw(rnd)
        if life is None:
            long.append(f)
        else:
            heapq.heappush(short, (now + life, f))
        tgt = long[rnd.randrange(len(long))]
        writes[tgt].append((now, 16 * 1024))
        size[tgt] += 16 * 1024
        live += 16 * 1024
        while short and short[0][0] <= now:
            die(heapq.heappop(short)[1], now)
        while live > target and len(long) > 1:
            die(long.pop(0), now)
        now += step_s
    for f in list(writes):
        die(f, float("inf"))
    return alive / total if total else float("nan")
