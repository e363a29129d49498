"""Guest: a varmail-like sync-heavy load (Filebench's varmail shape) on the lab's cached volume, under one
configuration, with the dirty exposure sampled every second.

usage: varmail.py CONFIG SECONDS [--warmup S] [--threads N] [--seed N]
CONFIG: writethrough (stock cache in write-through) | writeback (stock cache in write-back) | cp-destructive (stock
write-back + the daemon under the shipped default policy: destructive, exposure <= 64 MiB / 30 s).

The file set: 1 000 files of 4-28 KiB (16 KiB mean), written clean. Each of N threads (default 4) loops for SECONDS
over one varmail iteration: delete a file; create one, append 16 KiB, fsync; open another, append 16 KiB, fsync;
read two others whole (page cache dropped first, so the reads reach the cache). One op = one iteration (2 fsyncs).
The loop first runs S seconds of warm-up (default 0; ops, fsyncs and origin bytes not counted), then the
measured window of SECONDS. With the daemon, the loop starts once it has held bcache's writeback_delay within its
drain window (its first tick): the steady state of a host where it runs, not the race of its first second.
Every second: the cache's dirty bytes and the exposure age, measured here as an upper bound independent of the
daemon: the time since dirty data last read 0 (polled every 50 ms; every dirty byte was written after that).
Result: $LAB_OUT/varmail.json."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)

NFILES, APPEND = 1000, 16 * 1024


class FileSet:
    """The mail spool: names handed out under a lock so threads never pick a file another just deleted."""

    def __init__(self, root: Path, rnd: random.Random) -> None:
        self.root, self.rnd, self.lock, self.next = root, rnd, threading.Lock(), 0
        self.live: list[Path] = []

    def new(self) -> Path:
        with self.lock:
            self.next += 1
            return self.root / f"m{self.next:07d}"

    def add(self, p: Path) -> None:
        with self.lock:
            self.live.append(p)

    def pick(self, pop: bool = False) -> Path:
        with self.lock:
            i = self.rnd.randrange(len(self.live))
            return self.live.pop(i) if pop else self.live[i]


def append_sync(path: Path, data: bytes, create: bool) -> float:
    """Append and fsync; the fsync's latency in seconds. A file deleted by another thread meanwhile is skipped."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
    except FileNotFoundError:
        return -1.0
    try:
        os.write(fd, data)
        t = time.perf_counter()
        os.fsync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def worker(fs: FileSet, seed: int, span: tuple[float, float], fsyncs: list[float], ops: list[int]) -> None:
    """Loop until span's end; only iterations that start inside the window (span's start onwards) count."""
    measure, stop = span
    n = 0
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    data = rnd.randbytes(APPEND)
    while (now := time.monotonic()) < stop:
        victim = fs.pick(pop=True)
        victim.unlink(missing_ok=True)
        p = fs.new()
        lat = [append_sync(p, data, create=True)]
        fs.add(p)
        lat.append(append_sync(fs.pick(), data, create=False))
        g.read_whole(fs.pick(), missing_ok=True)
        g.read_whole(fs.pick(), missing_ok=True)
        if now >= measure:
            fsyncs.extend(x for x in lat if x >= 0)
            n += 1
    ops.append(n)


class Exposure:
    """The exposure witness: a thread polls the cache's dirty bytes every 50 ms and remembers the last time it read
    0 (a drain's clean moment can be shorter than a second); the per-second rows carry dirty bytes and the age
    bound, the time since that moment."""

    POLL = 0.05

    def __init__(self, daemon: g.Daemon | None) -> None:
        self.daemon, self.t0 = daemon, time.monotonic()
        self.last_clean = self.t0
        self.w0 = g.origin_written()
        self.stopped = threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True)
        self.poller.start()

    def _poll(self) -> None:
        while not self.stopped.wait(self.POLL):
            if g.dirty_bytes() == 0:
                self.last_clean = time.monotonic()

    def __call__(self) -> dict:
        now, dirty = time.monotonic(), g.dirty_bytes()
        if dirty == 0:
            self.last_clean = now
        if self.daemon:
            self.daemon.sample()
        return {"dirty_mib": dirty / g.MIB, "age_s": round(now - self.last_clean, 2), "mode": g.cache_mode(),
                "origin_mib": (g.origin_written() - self.w0) / g.MIB}


def main() -> None:
    config, seconds = sys.argv[1], float(sys.argv[2])
    nthreads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 4
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    warmup = float(sys.argv[sys.argv.index("--warmup") + 1]) if "--warmup" in sys.argv else 0.0
    rnd = random.Random(seed)  # noqa: S311
    spool = g.MNT / "spool"
    spool.mkdir()
    fs = FileSet(spool, rnd)
    g.set_cache_mode("writethrough")  # the file set starts clean: every dirty byte below was written by the loop
    for _ in range(NFILES):
        p = fs.new()
        p.write_bytes(rnd.randbytes(rnd.randrange(4, 29) * 1024))
        fs.add(p)
    os.sync()
    if g.RECIPE == "bcache":
        # issue 31: no congestion bypass, in every configuration, as in W1 (the TCG-emulated cache device answers
        # over bcache's 2 ms / 20 ms thresholds; a real SSD does not)
        cset = Path(os.environ["LAB_BCACHE_CSET"])
        for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
            (cset / knob).write_text("0")
    g.settle_clean()
    if config != "writethrough":
        g.set_cache_mode("writeback")
    daemon = g.Daemon([g.ROOT / "policies" / "default.yaml"]) if config.startswith("cp-") else None
    if daemon and g.RECIPE == "bcache" and not g.wait(lambda: int((g.BCACHE / "writeback_delay").read_text()) <= 5, 30):
        raise SystemExit("the daemon did not hold writeback_delay within its drain window in 30 s")
    g.drop_caches()
    exposure = Exposure(daemon)
    sampler = g.Sampler(exposure)
    sampler.start()
    fsyncs: list[float] = []
    ops: list[int] = []
    t0 = time.monotonic() + warmup
    threads = [threading.Thread(target=worker, args=(fs, seed * 100 + i, (t0, t0 + seconds), fsyncs, ops))
               for i in range(nthreads)]
    elapsed, window_origin, cpu0 = g.run_window(threads, t0, warmup, daemon)
    rows = sampler.stop()
    exposure.stopped.set()
    res = {
        "config": config, "seconds": elapsed, "threads": nthreads, "ops": sum(ops), "ops_s": sum(ops) / elapsed,
        "fsyncs": len(fsyncs), "fsync_p50_ms": g.percentile(fsyncs, 50) * 1e3,
        "fsync_p99_ms": g.percentile(fsyncs, 99) * 1e3,
        "max_dirty_mib": max((r["dirty_mib"] for r in rows), default=0.0),
        "max_age_s": max((r["age_s"] for r in rows), default=0.0),
        "warmup_s": warmup, "origin_written_mib": window_origin,
        "origin_mib_per_kop": 1000 * window_origin / max(1, sum(ops)), "dirty_owed_mib": g.dirty_bytes() / g.MIB,
        "modes": sorted({r["mode"] for r in rows}), "timeline": rows,
    }
    if daemon:
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - cpu0) / elapsed
        res["daemon_rss_mib"] = daemon.rss_max / g.MIB
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["daemon_exit"] = daemon.stop(keep_log="varmail")
        res["not_promotions"] = [line.split(" ", 2)[-1][:300] for line in daemon.log().splitlines()
                                 if any(k in line for k in (" drain ", "set_write_policy", "set_knob", "breach"))]
    g.write_result("varmail", res)
    g.log(f"{config}: {res['ops_s']:.1f} ops/s, fsync p99 {res['fsync_p99_ms']:.1f} ms, max dirty "
        f"{res['max_dirty_mib']:.1f} MiB, max age {res['max_age_s']:.0f} s")


if __name__ == "__main__":
    main()
