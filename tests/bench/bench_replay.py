"""`cachepilot replay` end to end (goal: >= 1 M records/s on one core).

Generates a trace shaped like a recording of a busy file server (per simulated second, on 4 volumes:
hotness deltas of the files touched, freed extents and deletes, block barriers with file-level sync
calls annotating them, journal commits, metadata deltas, one sample per volume and the tick), then runs
the real CLI (`.venv/bin/cachepilot replay -q TRACE`) and divides the records by the wall time of the
whole process (start-up, decoding, models, engine, output). Run: python tests/bench/bench_replay.py [M]
with M million records (default 3), for a steady-state and a churning file set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cachepilot.events import BarrierKind, kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.trace.format import (
    DTYPES,
    T_BARRIER,
    T_COMMIT,
    T_DELETE,
    T_FREED,
    T_HOT,
    T_META_DELTA,
    T_SYNC,
    T_TICK,
    TraceWriter,
)

NS = 1_000_000_000
VOLS = [VolumeInfo(dev=kdev(252, i), name=f"bcache{i}", cache_bytes=8 << 30, fs_uuid=f"0000000{i}-0000",
                   mountpoint=f"/srv/{i}") for i in range(4)]
ROOT = Path(__file__).resolve().parents[2]


def _arr(t: int, n: int) -> np.ndarray:
    return np.zeros(n, dtype=DTYPES[t])


def generate(path: str, records: int, seed: int = 7, universe: int = 100_000, churn: int = 0) -> int:
    """Write the trace; returns the number of records (meta excluded). Per volume the hot records are drawn
    (skewed) from a window of ``universe`` files; ``churn`` 0: the window stays put and the set settles after a few
    ticks into files the models already track (steady state); ``churn`` N: the window slides by N files a tick --
    N new files each second all run long -- and the N files that left it are deleted (a file server's creates and
    deletes: the tracked set stays about the window's size, as on a real volume, and replay's cap on files tracked
    at once, 2^19, holds)."""
    rng = np.random.default_rng(seed)
    per_tick = 50_000  # records per simulated second, all volumes
    ticks = max(1, records // per_tick)
    n = 0
    with TraceWriter(path, VOLS, {"source": "bench_replay"}) as w:
        for k in range(ticks):
            ts = (k + 1) * NS
            for v in VOLS:
                dev = v.dev
                # one record per file per drain (the kernel aggregates); a skewed (squared) pick of files
                base = k * churn
                inos = np.unique((rng.random(16_000) ** 2 * universe).astype(np.uint64)) + base
                hot = _arr(T_HOT, min(11_000, len(inos)))
                hot["dev"] = dev
                hot["ino"] = rng.permutation(inos)[:len(hot)] + 12
                hot["gen"] = 1
                hot["rs"] = rng.integers(0, 256, len(hot))
                hot["ws"] = rng.integers(0, 4, len(hot))
                hot["rb"] = hot["rs"].astype(np.uint64) * 4096
                hot["wb"] = hot["ws"].astype(np.uint64) * 4096
                hot["last"] = ts - rng.integers(0, NS, len(hot))
                hot["size"] = rng.integers(4096, 4 << 20, len(hot))
                w.write_array(T_HOT, hot)
                md = _arr(T_META_DELTA, 1)
                md["f0"], md["f1"], md["f2"] = dev, 50, 200_000
                w.write_array(T_META_DELTA, md)
                gone = np.arange(base - churn, base, dtype=np.uint64) + 12 if churn and k else \
                    rng.integers(12, universe, 300).astype(np.uint64)
                dele = _arr(T_DELETE, len(gone))
                dele["f0"], dele["f1"], dele["f2"] = dev, gone, 1
                dele["f3"], dele["f4"] = rng.integers(0, 1 << 20, len(dele)), ts - NS // 2
                w.write_array(T_DELETE, dele)
                fr = _arr(T_FREED, 600)
                fr["f0"], fr["f1"] = dev, rng.integers(12, universe, len(fr))
                fr["f2"], fr["f3"] = rng.integers(0, 1 << 28, len(fr)), rng.integers(1, 256, len(fr))
                fr["f5"], fr["f6"] = ts - NS // 2, k
                w.write_array(T_FREED, fr)
                sc = _arr(T_SYNC, 2)
                sc["f0"], sc["f1"], sc["f2"], sc["f3"], sc["f4"], sc["f5"] = dev, int(BarrierKind.FSYNC), 40, 99, 12, ts
                w.write_array(T_SYNC, sc)
                br = _arr(T_BARRIER, 40)
                br["f0"], br["f1"], br["f4"] = dev, int(BarrierKind.PREFLUSH), rng.integers(0, 1 << 20, len(br))
                br["f5"] = ts - NS + np.arange(len(br)) * (NS // len(br))
                br["f10"] = 1
                w.write_array(T_BARRIER, br)
                cm = _arr(T_COMMIT, 1)
                cm["f0"], cm["f1"], cm["f2"] = dev, k, ts
                w.write_array(T_COMMIT, cm)
                w.write(VolumeSample(dev, ts, "writeback", 1 << 20, 1000 * k, 100 * k, 0))
                n += len(hot) + len(md) + len(dele) + len(fr) + len(sc) + len(br) + len(cm) + 1
            tick = _arr(T_TICK, 1)
            tick["f0"] = ts
            w.write_array(T_TICK, tick)
            n += 1
        return n


def measure(cli: str, millions: float, universe: int, churn: int = 0) -> bool:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.cptrace")
        t0 = time.perf_counter()
        n = generate(path, int(millions * 1e6), universe=universe, churn=churn)
        gen_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        t0 = time.perf_counter()
        r0 = os.times()
        proc = subprocess.run([cli, "replay", "-q", path], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        r1 = os.times()
        cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    if proc.returncode != 0:
        print(f"replay failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return False
    rate, cpu_rate = n / wall, n / cpu
    shape = f"churn: {churn} new files and deletes a second" if churn else "steady state: files mostly known"
    print(f"trace ({shape}, a window of {universe} files per volume): {n} records, {size / n:.1f} B/record, "
          f"generated in {gen_s:.1f} s")
    print(f"  cachepilot replay -q: {wall:.2f} s wall, {cpu:.2f} s CPU (one process, one core)")
    print(f"  end to end: {rate / 1e6:.2f} M records/s wall, {cpu_rate / 1e6:.2f} M records/s CPU "
          f"(goal >= 1 M/s: {'PASS' if cpu_rate >= 1e6 else 'FAIL'})")
    print(f"  {proc.stdout.strip().splitlines()[-1]}")
    return True


def main() -> int:
    millions = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    cli = str(ROOT / ".venv" / "bin" / "cachepilot")
    ok = measure(cli, millions, 100_000) and measure(cli, millions, 100_000, churn=5_000)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
