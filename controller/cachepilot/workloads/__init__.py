"""Workload generators: parameterised, seeded, file-level operation streams.

A workload is a list of operations ``(op, file_id, offset, length, tag)`` issued one every
``op_interval_ns`` of simulated time. ``tag`` marks reads of the hot set (1) and of a backup scan (2) so
the simulator can measure them apart. The simulator (:mod:`cachepilot.sim`) maps files to blocks and
turns the operations into cache accesses and controller events; ``cachepilot simulate --trace-out``
writes those events as a trace.

Generators (same seed, same parameters -> same list):

* :func:`fileserver` — Filebench's fileserver shape: create+write whole file, append, read whole file,
  delete, in a loop over a file set.
* :func:`webserver` — Filebench's webserver: uniform whole-file reads of 1 000 files of 16 KiB, 16 KiB log
  appends.
* :func:`webserver_backup` — whole-file reads of a Zipf-popular set plus log appends; in the middle a
  backup reads every file once.
* :func:`fileserver_lifetimes` — a fileserver whose new files die by a lifetime mix: a share young (seconds to
  a minute), the rest long-lived (the oldest deleted once the long-lived set is full).
* :func:`varmail` — small files: create+write+fsync, append 16 KiB+fsync, read, delete.
* :func:`warm_restart` — Zipf reads; the cache is emptied midway (device replaced / re-attached).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from cachepilot.errors import UserError

CREATE, WRITE, READ, APPEND, DELETE, FSYNC, DROP_CACHE = range(7)
OP_NAMES = ("create", "write", "read", "append", "delete", "fsync", "drop_cache")
TAG_NONE, TAG_HOT, TAG_SCAN = 0, 1, 2
KiB = 1024

Op = tuple[int, int, int, int, int]


@dataclass
class Workload:
    name: str
    ops: list[Op]
    op_interval_ns: int = 1_000_000
    params: dict[str, object] = field(default_factory=dict)
    scan: tuple[int, int] | None = None  # op index range of the backup scan
    drop_at: int | None = None  # op index where the cache is emptied


def _check(**kw: float) -> None:
    for k, v in kw.items():
        if v is None or v < 0:
            raise UserError(f"workload parameter {k} must be non-negative, got {v}")


def _size(rng: random.Random, mean: int) -> int:
    """File size: gamma-ish around the mean (Filebench uses a gamma distribution), 4 KiB aligned, >= 4 KiB."""
    s = int(rng.gammavariate(1.5, mean / 1.5))
    return max(4 * KiB, (s + 4095) // 4096 * 4096)


def _zipf_files(nfiles: int, zipf_s: float, hot_files: int, mean_size: int,
                seed: int) -> tuple[random.Random, _Zipf, set[int], list[int]]:
    """The seeded generator, the Zipf popularity, the hot set and the file sizes shared by the Zipf workloads
    (drawn in this order, so a seed always yields the same workload)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible workloads, not crypto
    z = _Zipf(nfiles, zipf_s, rng)
    hot = {z.perm[i] for i in range(min(hot_files, nfiles))}
    sizes = [_size(rng, mean_size) for _ in range(nfiles)]
    return rng, z, hot, sizes


class _Zipf:
    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        w = [1.0 / (i + 1) ** s for i in range(n)]
        self.cdf = list(itertools.accumulate(w))
        self.total = self.cdf[-1]
        self.rng = rng
        self.perm = list(range(n))
        rng.shuffle(self.perm)  # popularity rank -> file id, so hot files are not contiguous

    def rank(self) -> int:
        return bisect.bisect_left(self.cdf, self.rng.random() * self.total)

    def draw(self) -> int:
        return self.perm[self.rank()]


def fileserver(iterations: int = 12000, nfiles: int = 1000, mean_size: int = 64 * KiB,
               append_size: int = 16 * KiB, op_interval_ms: float = 1.0, seed: int = 1) -> Workload:
    _check(iterations=iterations, nfiles=nfiles, mean_size=mean_size, append_size=append_size)
    rng = random.Random(seed)  # noqa: S311 - reproducible workloads, not crypto
    ops: list[Op] = []
    sizes: dict[int, int] = {}
    live: list[int] = []
    next_id = 0
    for _ in range(nfiles):  # the initial file set
        fid, next_id = next_id, next_id + 1
        sizes[fid] = _size(rng, mean_size)
        live.append(fid)
        ops.append((CREATE, fid, 0, 0, 0))
        ops.append((WRITE, fid, 0, sizes[fid], 0))
    for _ in range(iterations):
        fid, next_id = next_id, next_id + 1
        sizes[fid] = _size(rng, mean_size)
        live.append(fid)
        ops.append((CREATE, fid, 0, 0, 0))
        ops.append((WRITE, fid, 0, sizes[fid], 0))
        _append_then_read(rng, ops, sizes, live, append_size)
        i = rng.randrange(len(live))
        d = live[i]
        live[i] = live[-1]
        live.pop()
        ops.append((DELETE, d, 0, sizes.pop(d), 0))
    return Workload("fileserver-with-deletes", ops, op_interval_ns=int(op_interval_ms * 1e6), params=dict(
        iterations=iterations, nfiles=nfiles, mean_size=mean_size, append_size=append_size,
        op_interval_ms=op_interval_ms, seed=seed))


def _append_then_read(rng: random.Random, ops: list[Op], sizes: dict[int, int], files: Sequence[int],
                      append_size: int) -> None:
    """Append to one of ``files`` (exponential size, whole blocks), then read one of them whole."""
    a = files[rng.randrange(len(files))]
    n = max(4 * KiB, int(rng.expovariate(1 / append_size)) // 4096 * 4096)
    ops.append((APPEND, a, sizes[a], n, 0))
    sizes[a] += n
    r = files[rng.randrange(len(files))]
    ops.append((READ, r, 0, sizes[r], 0))


def fileserver_lifetimes(iterations: int = 8000, nfiles: int = 1000, mean_size: int = 64 * KiB,
                         append_size: int = 16 * KiB, short_share: float = 0.4, short_min_s: float = 2.0,
                         short_max_s: float = 60.0, op_interval_ms: float = 10.0, seed: int = 5) -> Workload:
    """Each iteration: create and write a whole file, append to a long-lived one, read a long-lived one whole, delete
    the files whose lifetime is up. A new file dies young with probability ``short_share``, its lifetime
    log-uniform in [short_min_s, short_max_s] (file-system traces find short lifetimes spread over orders of
    magnitude, not memoryless; the headline lab benchmark W1 uses the same mix); the others are long-lived: once
    there are more than ``nfiles``, the oldest goes."""
    _check(iterations=iterations, nfiles=nfiles, mean_size=mean_size, append_size=append_size,
           short_share=short_share, short_min_s=short_min_s, short_max_s=short_max_s, op_interval_ms=op_interval_ms)
    if not (short_share <= 1.0 and 0.0 < short_min_s <= short_max_s and op_interval_ms > 0):
        raise UserError("lifetime mix: need short_share <= 1, 0 < short_min_s <= short_max_s, op_interval_ms > 0")
    rng = random.Random(seed)  # noqa: S311 - reproducible workloads, not crypto
    ops: list[Op] = []
    sizes: dict[int, int] = {}
    long: deque[int] = deque()
    dies: list[tuple[int, int]] = []  # (op index at which it dies, file)
    per_s = 1000.0 / op_interval_ms
    lo, hi = math.log(short_min_s), math.log(short_max_s)
    for fid in range(nfiles):  # the initial long-lived set
        sizes[fid] = _size(rng, mean_size)
        long.append(fid)
        ops += [(CREATE, fid, 0, 0, 0), (WRITE, fid, 0, sizes[fid], 0)]
    for fid in range(nfiles, nfiles + iterations):
        sizes[fid] = _size(rng, mean_size)
        ops += [(CREATE, fid, 0, 0, 0), (WRITE, fid, 0, sizes[fid], 0)]
        if rng.random() < short_share:
            heapq.heappush(dies, (len(ops) + int(math.exp(rng.uniform(lo, hi)) * per_s), fid))
        else:
            long.append(fid)
        _append_then_read(rng, ops, sizes, long, append_size)
        while dies and dies[0][0] <= len(ops):
            d = heapq.heappop(dies)[1]
            ops.append((DELETE, d, 0, sizes.pop(d), 0))
        while len(long) > nfiles:
            d = long.popleft()
            ops.append((DELETE, d, 0, sizes.pop(d), 0))
    return Workload("fileserver-lifetimes", ops, op_interval_ns=int(op_interval_ms * 1e6), params=dict(
        iterations=iterations, nfiles=nfiles, mean_size=mean_size, append_size=append_size, short_share=short_share,
        short_min_s=short_min_s, short_max_s=short_max_s, op_interval_ms=op_interval_ms, seed=seed))


def webserver_backup(reads: int = 120000, nfiles: int = 6000, mean_size: int = 16 * KiB,
                     zipf_s: float = 1.0, hot_files: int = 600, log_every: int = 10, scan_burst: int = 8,
                     seed: int = 2) -> Workload:
    _check(reads=reads, nfiles=nfiles, mean_size=mean_size, zipf_s=zipf_s, hot_files=hot_files)
    if nfiles < 1:
        raise UserError("webserver needs at least one file")
    rng, z, hot, sizes = _zipf_files(nfiles, zipf_s, hot_files, mean_size, seed)
    log = nfiles
    ops: list[Op] = [(CREATE, log, 0, 0, 0)]
    for f in range(nfiles):
        ops.append((CREATE, f, 0, 0, 0))
        ops.append((WRITE, f, 0, sizes[f], 0))
    log_size = 0
    scan_at = len(ops) + reads // 2
    scan: tuple[int, int] | None = None
    i = 0
    while i < reads:
        if scan is None and len(ops) >= scan_at:
            start = len(ops)
            # the backup: every file once, in file-id order, scan_burst scan reads per web read
            for f in range(nfiles):
                ops.append((READ, f, 0, sizes[f], TAG_SCAN))
                if f % max(1, scan_burst) == 0:
                    fid = z.draw()
                    ops.append((READ, fid, 0, sizes[fid], TAG_HOT if fid in hot else 0))
                    i += 1
            scan = (start, len(ops))
            continue
        fid = z.draw()
        ops.append((READ, fid, 0, sizes[fid], TAG_HOT if fid in hot else 0))
        i += 1
        if log_every and i % log_every == 0:
            ops.append((APPEND, log, log_size, 4 * KiB, 0))
            log_size += 4 * KiB
    return Workload("webserver+backup", ops, scan=scan, params=dict(
        reads=reads, nfiles=nfiles, mean_size=mean_size, zipf_s=zipf_s, hot_files=hot_files,
        scan_burst=scan_burst, seed=seed))


def webserver(reads: int = 100000, nfiles: int = 1000, mean_size: int = 16 * KiB, log_every: int = 10,
              append_size: int = 16 * KiB, seed: int = 5) -> Workload:
    """Filebench's webserver: whole-file reads of files picked uniformly at random from the file set, and a
    16 KiB append to a shared log after every ``log_every`` reads."""
    _check(reads=reads, nfiles=nfiles, mean_size=mean_size, append_size=append_size)
    if nfiles < 1:
        raise UserError("webserver needs at least one file")
    rng = random.Random(seed)  # noqa: S311 - reproducible workloads, not crypto
    sizes = [_size(rng, mean_size) for _ in range(nfiles)]
    log = nfiles
    ops: list[Op] = [(CREATE, log, 0, 0, 0)]
    for f in range(nfiles):
        ops += [(CREATE, f, 0, 0, 0), (WRITE, f, 0, sizes[f], 0)]
    log_size = 0
    for i in range(1, reads + 1):
        fid = rng.randrange(nfiles)
        ops.append((READ, fid, 0, sizes[fid], 0))
        if log_every and i % log_every == 0:
            ops.append((APPEND, log, log_size, append_size, 0))
            log_size += append_size
    return Workload("webserver", ops, params=dict(reads=reads, nfiles=nfiles, mean_size=mean_size,
                                                   log_every=log_every, append_size=append_size, seed=seed))


def varmail(iterations: int = 20000, nfiles: int = 1000, mean_size: int = 16 * KiB,
            append_size: int = 16 * KiB, seed: int = 3) -> Workload:
    """Filebench's varmail: delete a file; create, write and fsync one; append 16 KiB (Filebench's
    iosize) to one and fsync it; read one whole."""
    _check(iterations=iterations, nfiles=nfiles, mean_size=mean_size, append_size=append_size)
    rng = random.Random(seed)  # noqa: S311 - reproducible workloads, not crypto
    ops: list[Op] = []
    sizes: dict[int, int] = {}
    live: list[int] = []
    next_id = 0
    for _ in range(nfiles):
        fid, next_id = next_id, next_id + 1
        sizes[fid] = _size(rng, mean_size)
        live.append(fid)
        ops += [(CREATE, fid, 0, 0, 0), (WRITE, fid, 0, sizes[fid], 0)]
    for _ in range(iterations):
        i = rng.randrange(len(live))
        d = live[i]
        live[i] = live[-1]
        live.pop()
        ops.append((DELETE, d, 0, sizes.pop(d), 0))
        fid, next_id = next_id, next_id + 1
        sizes[fid] = _size(rng, mean_size)
        live.append(fid)
        ops += [(CREATE, fid, 0, 0, 0), (WRITE, fid, 0, sizes[fid], 0), (FSYNC, fid, 0, 0, 0)]
        a = live[rng.randrange(len(live))]
        ops += [(APPEND, a, sizes[a], append_size, 0), (FSYNC, a, 0, 0, 0)]
        sizes[a] += append_size
        r = live[rng.randrange(len(live))]
        ops.append((READ, r, 0, sizes[r], 0))
    return Workload("varmail", ops, params=dict(iterations=iterations, nfiles=nfiles, mean_size=mean_size,
                                                 append_size=append_size, seed=seed))


def warm_restart(reads: int = 100000, nfiles: int = 8000, mean_size: int = 16 * KiB, zipf_s: float = 1.0,
                 hot_files: int = 800, seed: int = 4) -> Workload:
    _check(reads=reads, nfiles=nfiles, mean_size=mean_size, zipf_s=zipf_s)
    if nfiles < 1:
        raise UserError("warm restart needs at least one file")
    rng, z, hot, sizes = _zipf_files(nfiles, zipf_s, hot_files, mean_size, seed)
    ops: list[Op] = []
    for f in range(nfiles):
        ops += [(CREATE, f, 0, 0, 0), (WRITE, f, 0, sizes[f], 0)]
    drop_at = None
    for i in range(reads):
        if i == reads // 2:
            drop_at = len(ops)
            ops.append((DROP_CACHE, 0, 0, 0, 0))
        fid = z.draw()
        ops.append((READ, fid, 0, sizes[fid], TAG_HOT if fid in hot else 0))
    return Workload("warm-restart", ops, drop_at=drop_at, params=dict(
        reads=reads, nfiles=nfiles, mean_size=mean_size, zipf_s=zipf_s, hot_files=hot_files, seed=seed))


GENERATORS = {
    "fileserver": fileserver,
    "fileserver-lifetimes": fileserver_lifetimes,
    "webserver": webserver,
    "webserver-backup": webserver_backup,
    "varmail": varmail,
    "warm-restart": warm_restart,
}
