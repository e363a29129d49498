"""Run a prepared workload through a block cache, with or without the controller in the loop.

"With controller" means the real :class:`~cachepilot.engine.Engine` gets the tick's events and a volume
sample every simulated second, and its actions are applied to the simulated cache: ``Promote`` reads the
file's blocks through the cache (OPT prefetches optimally), ``DiscardRanges`` drops the blocks that are
still free (what FITRIM would do; dirty ones are never written back), ``SetWritePolicy`` switches
write-back on or off, ``Drain`` writes every dirty block back at once and reports the drain done (as a backend
does once it reads the cache clean; without that report the engine would see the drain complete only at a sample
with no dirty data, which a steady write load never gives, and count a breach). When the cache is emptied (warm
restart) the daemon would notice the re-attached cache device; the simulator tells the engine to re-warm.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cachepilot import records
from cachepilot.actions import DONE, Outcome
from cachepilot.capabilities import KIND_BCACHE, KIND_DMCACHE
from cachepilot.engine import Action, DiscardRanges, Drain, Engine, Promote, SetWritePolicy
from cachepilot.events import HotnessDelta
from cachepilot.models.volume import WRITEBACK, VolumeInfo, VolumeSample
from cachepilot.policy.model import (
    DiscardOnDelete,
    HealthPolicy,
    Policy,
    Promotion,
    VolumePolicy,
)
from cachepilot.sim.cache import INF, LRU, OPT, SMQ, BlockCache
from cachepilot.sim.prepare import BLOCK, K_DROP, K_FREE, K_READ, K_WRITE, SIM_DEV, Prepared
from cachepilot.trace.format import Tick, TraceWriter

POLICIES = ("lru", "smq", "opt")

SIM_POLICY = Policy(
    source="<simulator>",
    defaults=VolumePolicy(
        failure_model="recoverable",
        promotion=Promotion(enabled=True, rate=32 << 20, max_cache_fraction=0.8, sieve_size=1 << 20,
                            refresh_interval_s=1.0),
        discard_on_delete=DiscardOnDelete(enabled=True, interval_s=5.0, min_extent=BLOCK, max_rate=1 << 40),
        health=HealthPolicy(error_threshold=1, scan_drop=0.1),
    ),
    half_life_s=120.0,
)


@dataclass
class SimResult:
    workload: str
    policy: str
    controller: bool
    reads: int = 0
    read_hits: int = 0
    scan_reads: int = 0  # reads tagged as a backup scan (not part of the Zipf popularity)
    scan_hits: int = 0
    origin_write_bytes: int = 0
    origin_read_bytes: int = 0
    promoted_bytes: int = 0
    dirty_mean_bytes: float = 0.0
    dirty_max_bytes: int = 0
    exposure_age_max_s: float = 0.0  # the witness: longest time dirty data was seen since the cache was last clean
    discarded_blocks: int = 0
    dirty_dropped_blocks: int = 0
    hot_per_tick: list[tuple[int, int]] = field(default_factory=list)  # (hot reads, hot hits)
    actions: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0
    ctl_name: str = "ctl"  # which controller policy (CONTROLLERS) drove it

    @property
    def label(self) -> str:
        return self.policy + (f"+{self.ctl_name}" if self.controller else "")

    @property
    def hit_ratio(self) -> float:
        return self.read_hits / self.reads if self.reads else 0.0

    @property
    def zipf_hit_ratio(self) -> float:
        """Hit ratio of the reads that follow the workload's popularity (backup-scan reads excluded)."""
        n = self.reads - self.scan_reads
        return (self.read_hits - self.scan_hits) / n if n else 0.0


def sim_volume(capacity_blocks: int, kind: str = KIND_BCACHE) -> VolumeInfo:
    return VolumeInfo(dev=SIM_DEV, name="sim0", kind=kind, fs_uuid="5151510e-0000-4000-8000-000000000000",
                      mountpoint="/srv/sim", cache_bytes=capacity_blocks * BLOCK, fs_block_size=BLOCK)


def next_uses(p: Prepared) -> list[int]:
    n = len(p.blk)
    nu = [INF] * n
    nxt: dict[int, int] = {}
    blk, kind = p.blk, p.kind
    for i in range(n - 1, -1, -1):
        k = kind[i]
        if k == K_DROP:
            continue
        b = blk[i]
        nu[i] = nxt.get(b, INF)
        nxt[b] = i if k == K_READ else INF
    return nu


class _NextRead:
    """Next read of a block after a position, for prefetches (built once per stream)."""

    def __init__(self, p: Prepared) -> None:
        pos: dict[int, array] = {}
        for i, b in enumerate(p.blk):
            a = pos.get(b)
            if a is None:
                a = pos[b] = array("I")
            a.append(i)
        self.pos = pos
        self.kind = p.kind

    def __call__(self, blk: int, at: int) -> int:
        a = self.pos.get(blk)
        if a is None:
            return INF
        j = bisect.bisect_left(a, at)
        if j == len(a):
            return INF
        i = a[j]
        return i if self.kind[i] == K_READ else INF


def make_cache(name: str, p: Prepared, capacity: int, writeback_percent: float,
               opt_aux: tuple[list[int], _NextRead] | None = None) -> BlockCache:
    if name == "lru":
        return LRU(capacity, writeback_percent)
    if name == "smq":
        return SMQ(capacity, writeback_percent)
    if name == "opt":
        nu, nr = opt_aux if opt_aux is not None else (next_uses(p), _NextRead(p))
        return OPT(capacity, nu, nr, writeback_percent)
    raise ValueError(f"unknown cache policy {name!r} (choose from {', '.join(POLICIES)})")


def run(p: Prepared, policy: str, controller: bool, capacity: int, writeback_percent: float = 10.0,
        ctl_policy: Policy = SIM_POLICY, opt_aux: tuple[list[int], _NextRead] | None = None,
        trace: TraceWriter | None = None, ctl_name: str = "ctl") -> SimResult:
    """Simulate; with ``trace`` also write every tick's events, a volume sample and the tick itself."""
    t0 = time.process_time()
    cache = make_cache(policy, p, capacity, writeback_percent, opt_aux)
    res = SimResult(p.workload.name, policy, controller, ctl_name=ctl_name)
    engine = None
    if controller:  # the smq-like cache stands for dm-cache
        engine = Engine(ctl_policy, [sim_volume(capacity, KIND_DMCACHE if policy == "smq" else KIND_BCACHE)])
    sim = _Sim(p, cache, res, engine)
    dt_s = p.tick_ns / 1e9
    dirty_sum = 0
    clean_at = 0  # the witness: the last sample time (or drain) at which the cache held no dirty block
    start = 0
    for k, end in enumerate(p.tick_end):
        res.hot_per_tick.append(sim.ops(start, end))
        cache.tick(dt_s, idle=start == end)
        start = end
        d = len(cache.dirty) * BLOCK
        dirty_sum += d
        res.dirty_max_bytes = max(res.dirty_max_bytes, d)
        ts = (k + 1) * p.tick_ns
        if d == 0:
            clean_at = ts
        res.exposure_age_max_s = max(res.exposure_age_max_s, (ts - clean_at) / 1e9)
        sample = VolumeSample(SIM_DEV, ts, WRITEBACK if cache.writeback else "writethrough", d,
                              sim.hits, sim.reads - sim.hits, 0)
        if trace is not None:
            trace.write_many(p.tick_events[k])
            trace.write(sample)
            trace.write(Tick(ts))
        if engine is not None:
            sim.control(k, end, sample)
            if not cache.dirty:  # a drain emptied it at this tick
                clean_at = ts
    cache.flush()  # what would eventually be written back
    res.reads, res.read_hits = sim.reads, sim.hits
    res.scan_reads, res.scan_hits = sim.sreads, sim.shits
    res.origin_write_bytes = (cache.written_back + cache.written_through) * BLOCK
    res.origin_read_bytes = (sim.reads - sim.hits) * BLOCK + res.promoted_bytes
    res.dirty_mean_bytes = dirty_sum / max(1, len(p.tick_end))
    res.discarded_blocks = cache.discarded
    res.dirty_dropped_blocks = cache.dirty_dropped
    res.cpu_s = time.process_time() - t0
    return res


class _Sim:
    """One simulation's running state: the block operations of a tick, and the controller's step after it."""

    def __init__(self, p: Prepared, cache: Any, res: SimResult, engine: Engine | None) -> None:
        self.p, self.cache, self.res, self.engine = p, cache, res, engine
        self.dead = bytearray(p.volume_blocks + 1)
        self.file_blocks: dict[int, tuple[int, ...]] = {}
        self.reads = self.hits = self.sreads = self.shits = 0

    def ops(self, start: int, end: int) -> tuple[int, int]:
        """Carry out the block operations [start, end); returns the hot set's (reads, hits) in them."""
        blk, kind, tag, dead, cache = self.p.blk, self.p.kind, self.p.tag, self.dead, self.cache
        read, write = cache.read, cache.write
        reads = hits = sreads = shits = hr = hh = 0
        for i in range(start, end):
            kd = kind[i]
            b = blk[i]
            if kd == K_READ:
                h = read(b, i)
                reads += 1
                hits += h
                tg = tag[i]
                if tg == 1:
                    hr += 1
                    hh += h
                elif tg == 2:
                    sreads += 1
                    shits += h
            elif kd == K_WRITE:
                write(b, i)
                dead[b] = 0
            elif kd == K_FREE:
                dead[b] = 1
            else:
                cache.empty()
                if self.engine is not None:
                    self.engine.rewarm("sim0", "cache device re-attached empty: re-warming")
        self.reads += reads
        self.hits += hits
        self.sreads += sreads
        self.shits += shits
        return hr, hh

    def control(self, k: int, end: int, sample: VolumeSample) -> None:
        """The controller's view of tick k (its events, the sample) and what it decides, carried out."""
        engine = self.engine
        assert engine is not None
        hot: list[tuple[int, ...]] = []  # runs of hotness deltas go in as one batch (the daemon's drain path)
        for ev in self.p.tick_events[k]:
            if isinstance(ev, HotnessDelta):
                hot.append(records.HOTNESS.to_record(ev))
                continue
            if hot:
                engine.feed_hotness_records(hot)
                hot = []
            engine.feed(ev)
        if hot:
            engine.feed_hotness_records(hot)
        for fid, blocks in self.p.tick_files[k].items():
            if blocks is None:
                self.file_blocks.pop(fid, None)
            else:
                self.file_blocks[fid] = blocks
        engine.sample(sample)
        for a in engine.tick(sample.ts_ns):
            self.res.actions[a.kind] += 1
            self.act(a, end)

    def act(self, a: Action, end: int) -> None:
        cache = self.cache
        if isinstance(a, Promote):
            fb = self.file_blocks.get(self.p.fid(a.ino))
            if not fb:
                return
            prefetch = getattr(cache, "prefetch", cache.access)
            for off, n in a.ranges:
                for b in fb[off // BLOCK:(off + n + BLOCK - 1) // BLOCK]:
                    if b not in cache:
                        self.res.promoted_bytes += BLOCK
                    prefetch(b, end)
        elif isinstance(a, DiscardRanges):
            dead = self.dead
            for off, n in a.ranges:
                for b in range(off // BLOCK, (off + n) // BLOCK):
                    if b < len(dead) and dead[b]:
                        cache.discard(b)
        elif isinstance(a, SetWritePolicy):
            cache.set_writeback(a.mode == WRITEBACK)
        elif isinstance(a, Drain):  # write every dirty block back now (bcache writeback_percent 0 ...)
            cache.flush()
            assert self.engine is not None
            self.engine.outcome(Outcome(a, DONE))


def recovery_ticks(r: SimResult, scan_end_tick: int, pre: tuple[int, int], frac: float = 0.9) -> int | None:
    """Ticks after scan_end_tick until the hot set's hit ratio (over a 3-tick window) is back to frac of
    its pre-scan value; 0 if it never fell below; None if it never recovered."""
    reads = sum(x[0] for x in r.hot_per_tick[pre[0]:pre[1]])
    hits = sum(x[1] for x in r.hot_per_tick[pre[0]:pre[1]])
    if reads == 0:
        return None
    target = frac * hits / reads
    w = 3
    for k in range(scan_end_tick, len(r.hot_per_tick)):
        win = r.hot_per_tick[max(scan_end_tick, k - w + 1):k + 1]
        rr = sum(x[0] for x in win)
        hh = sum(x[1] for x in win)
        if rr and hh / rr >= target:
            return k - scan_end_tick
    return None
