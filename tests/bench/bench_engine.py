"""Engine and model benchmark (issue 4 speed goals). Run: python tests/bench/bench_engine.py

1. an engine tick with 1 million tracked files on 16 volumes: <= 100 ms CPU; <= 200 B of user-space
   memory per tracked file (tracemalloc, everything the engine holds);
2. model update from a replayed trace: >= 1 million events per second on one core (decode + update).
"""

from __future__ import annotations

import gc
import os
import random
import sys
import tempfile
import time
import tracemalloc

from cachepilot.engine import Engine
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from cachepilot.trace import TraceReader, TraceWriter
from cachepilot.trace.format import T_HOT, Tick

FILES = 1_000_000
VOLUMES = 16
NS = 1_000_000_000
POLICY = parse_policy("""
version: 1
defaults:
  failure_model: destructive
  promotion: {enabled: true, rate: 8MiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
  discard_on_delete: {enabled: true, interval: 5s, min_extent: 64KiB}
  knobs: {sequential_cutoff: 4194304}
""", "<bench>")


def volumes() -> list[VolumeInfo]:
    # 16 volumes with 8 GiB caches: each believed-cached set holds ~10% of its files (16 KiB files)
    return [VolumeInfo(dev=kdev(252, i), name=f"bcache{i}", cache_bytes=8 << 30) for i in range(VOLUMES)]


def records(n: int, rng: random.Random, t_ns: int, inos: int = FILES) -> list[tuple[int, ...]]:
    out = []
    for _ in range(n):
        ino = rng.randrange(inos)
        rs = rng.choice((64, 32, 16, 1, 0))
        out.append((kdev(252, ino % VOLUMES), ino + 12, 1, rs, 0 if rs else 64, 16384, 0, t_ns, 16384))
    return out


def build(rng: random.Random) -> Engine:
    e = Engine(POLICY, volumes())
    recs = [(kdev(252, i % VOLUMES), i + 12, 1, 1 + (i * 7919) % 64, 0, 16384, 0, 1, 16384)
            for i in range(FILES)]
    for i in range(0, FILES, 65536):
        e.feed_hotness_records(recs[i:i + 65536])
    for v in e.vols.values():
        e.sample(VolumeSample(v.info.dev, 1, "writeback", 0, 0, 0, 0))
    return e


def bench_tick() -> list[tuple[str, float, str, bool]]:
    rng = random.Random(1)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    e = build(rng)
    e.tick(1 * NS)  # the first tick admits every file once
    mem = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    per_file = mem / len(e.hotness)
    t0 = time.process_time()
    e2 = build(rng)
    build_s = time.process_time() - t0
    t0 = time.process_time()
    e2.tick(1 * NS)
    first = time.process_time() - t0
    rows = []
    worst = 0.0
    total = 0.0
    ticks = 10
    for k in range(ticks):  # steady state: 20 000 files active per 1 s tick (2% of the tracked set)
        ts = (k + 2) * NS
        e2.feed_hotness_records(records(20_000, rng, ts))
        for v in e2.vols.values():
            e2.sample(VolumeSample(v.info.dev, ts, "writeback", 1 << 20, k * 100, k * 10, 0))
        t0 = time.process_time()
        e2.tick(ts)
        dt = time.process_time() - t0
        worst = max(worst, dt)
        total += dt
    rows.append(("tracked files", float(len(e2.hotness)), f"{len(e2.hotness)} on {VOLUMES} volumes", True))
    rows.append(("memory per tracked file", per_file, f"{per_file:.0f} B (goal <= 200 B)", per_file <= 200))
    rows.append(("build 1M files (feed)", build_s, f"{build_s * 1000:.0f} ms CPU", True))
    rows.append(("first tick (admits 1M files)", first, f"{first * 1000:.0f} ms CPU (one-off)", True))
    rows.append(("steady tick, 20k active files", total / ticks,
                 f"mean {total / ticks * 1000:.1f} ms, worst {worst * 1000:.1f} ms CPU (goal <= 100 ms)",
                 worst <= 0.1))
    t0 = time.process_time()
    e2._rewarm(next(iter(e2.vols.values())), "bench")
    rw = time.process_time() - t0
    rows.append(("re-warm one volume (sort its set)", rw, f"{rw * 1000:.0f} ms CPU (on demand)", True))
    return rows


def bench_replay() -> list[tuple[str, float, str, bool]]:
    rng = random.Random(2)
    n = 2_000_000
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.cptrace")
        with TraceWriter(path, volumes(), {"source": "bench"}) as w:
            for k in range(n // 100_000):
                ts = (k + 1) * NS
                for r in records(100_000, rng, ts, inos=200_000):
                    w.write_record(T_HOT, r)
                w.write(Tick(ts))
        size = os.path.getsize(path)
        e = Engine(POLICY, volumes())
        t0 = time.process_time()
        reader = TraceReader(path)
        count = 0
        for t, recs in reader.blocks():
            if t == T_HOT:
                e.feed_hotness_records(recs)
                count += len(recs)
        dt = time.process_time() - t0
    rate = count / dt
    return [
        ("trace size", float(size), f"{size / count:.1f} B/event on disk ({count} hotness events)", True),
        ("model update from replay", rate, f"{rate / 1e6:.2f} M events/s (goal >= 1 M/s)", rate >= 1e6),
    ]


def main() -> int:
    rows = bench_tick() + bench_replay()
    print(f"{'measure':38} {'result':60} goal")
    for name, _, text, ok in rows:
        print(f"{name:38} {text:60} {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
