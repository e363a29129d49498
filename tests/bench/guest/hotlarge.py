"""Guest (W5): a hot set of large files read whole again and again on bcache (or dm-cache: issue 37 item 2) while a
backup streams cold data.

usage: hotlarge.py CONFIG ROUNDS INTERVAL STREAM_X [--seed N] [--backup-round K]
       CONFIG on bcache: stock (sequential_cutoff 4 MiB) | cutoff0 (sequential_cutoff 0) | cutoff16 (16 MiB, between
       the two: above one hot file, below the backup's runs) | cp-default (stock + cachepilot, the shipped default)
       CONFIG on dm-cache: smq (stock smq, migration_threshold 2048 sectors) | smq-mt (migration_threshold 32768
       sectors: 16 MiB of migration in flight, one hot file -- the stock lever for promoting faster) | cp-default

The hot set is HOT_FILES files of HOT_MIB MiB (64 MiB: the shipped default's max_cache_fraction, 0.25 of the 256 MiB
cache -- the most the daemon's believed-cached set holds), each read whole, O_DIRECT in 1 MiB requests (an
application that bypasses the page cache, as qemu's cache=none or a database does: what reaches the volume is every
read), once every INTERVAL seconds, ROUNDS times. A backup reads STREAM_X times the cache of cold data once, buffered
(as tar), from round K on (default 3: once the hot set has been read whole twice, i.e. when any cache has had its
chance to hold it -- the issue's case is a backup that evicts an established hot set; started with round 1 it ended in
~2 s, before anything was hot, and tested nothing); each file once: it stays cold; it ends when read, or with the last
round.
The cache starts empty for the volume (bcache: the backing device detached and attached again after the set-up's
writes; dm-cache: passthrough, every cache block invalidated, back to the lab's mode -- smq's hit statistics stay).

Per round and hot file: its read time (ms). Per round: the origin bytes the hot set cost, i.e. the origin's read
bytes over the round minus what the backup read meanwhile (every backup read misses: read once), so the daemon's
promotion reads are charged to the hot set. The backup's throughput. The daemon's CPU share. $LAB_OUT/hotlarge.json.
"""

from __future__ import annotations

import mmap
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vm"))  # bcache_trace (the lab's tracefs helper)
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)
from bcache_trace import ALLOC_FAIL, Trace  # noqa: E402

HOT_FILES, HOT_MIB, REQ = 4, 16, g.MIB
# bcache's own counters per round (stats_total; folded every few seconds, so a round's share may lag into the next)
STATS = ("cache_hits", "cache_misses", "cache_bypass_hits", "cache_bypass_misses", "cache_miss_collisions")
# dm-cache's own counters per round (its status line: read hits, read misses, demotions, promotions)
DM_STATS = {"read_hits": 7, "read_misses": 8, "demotions": 11, "promotions": 12}
CONFIGS = ("stock", "cutoff0", "cutoff16", "smq", "smq-mt", "cp-default")
DM_ENV = {**os.environ, "DM_DISABLE_UDEV": "1"}


def write(path: Path, size: int, rnd: random.Random) -> None:
    with open(path, "wb") as f:
        for _ in range(size // g.MIB):
            f.write(rnd.randbytes(g.MIB))
        os.fsync(f.fileno())


def reattach() -> None:
    """The same cache, empty for this volume: what the set-up's writes left cached is gone."""
    if g.RECIPE != "bcache":
        _invalidate_dm_cache()
        return
    cset = os.path.basename(os.readlink(g.BCACHE / "cache"))
    (g.BCACHE / "detach").write_text("1\n")
    while (g.BCACHE / "cache").exists():
        time.sleep(0.1)
    (g.BCACHE / "attach").write_text(cset + "\n")
    while not (g.BCACHE / "cache").exists():
        time.sleep(0.1)


def _invalidate_dm_cache() -> None:
    """dm-cache takes invalidate_cblocks only in passthrough mode, which it enters only clean (dm-cache-target.c)."""
    g.settle_clean()
    mode = cache_mode_dm()
    g.set_cache_mode("passthrough")
    total = int(g.dmstatus()[6].split("/")[1])  # <used>/<total> cache blocks; the range's end is exclusive
    subprocess.run(["dmsetup", "message", g.DM_NAME, "0", "invalidate_cblocks", f"0-{total}"], check=True, env=DM_ENV)
    used = int(g.dmstatus()[6].split("/")[0])
    g.set_cache_mode(mode)
    g.log(f"dm-cache emptied: {used} of {total} blocks in use after invalidate_cblocks; mode back to {mode}")


def cache_mode_dm() -> str:
    """The dm-cache table's io mode (writeback / writethrough / passthrough)."""
    table = subprocess.run(["dmsetup", "table", g.DM_NAME], capture_output=True, text=True, check=True).stdout.split()
    return next(t for t in table if t in ("writeback", "writethrough", "passthrough"))


def read_direct(path: Path, buf: mmap.mmap) -> float:
    """One whole read of the file, O_DIRECT, in order, REQ at a time; ms."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    t = time.perf_counter()
    try:
        off = 0
        while os.preadv(fd, [buf], off) == REQ:
            off += REQ
    finally:
        os.close(fd)
    return (time.perf_counter() - t) * 1e3


class Backup(threading.Thread):
    """Reads the cold files once each, buffered, until stopped; counts bytes and time."""

    def __init__(self, files: list[Path]) -> None:
        super().__init__(daemon=True)
        self.files, self.stop, self.bytes, self.seconds = files, threading.Event(), 0, 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        for f in self.files:
            with open(f, "rb") as fh:
                while not self.stop.is_set() and (got := len(fh.read(g.MIB))):
                    self.bytes += got
            if self.stop.is_set():
                break
        self.seconds = time.monotonic() - t0


def stats() -> list[int]:
    if g.RECIPE != "bcache":
        f = g.dmstatus()
        return [int(f[i]) for i in DM_STATS.values()]
    return [int((g.BCACHE / "stats_total" / k).read_text()) for k in STATS]


def configure(config: str) -> g.Daemon | None:
    kind_configs = ("smq", "smq-mt", "cp-default") if g.RECIPE != "bcache" else ("stock", "cutoff0", "cutoff16",
                                                                               "cp-default")
    if config not in kind_configs:
        raise SystemExit(f"configuration {config!r} is not one for {g.RECIPE} (one of {', '.join(kind_configs)})")
    if config == "smq-mt":
        subprocess.run(["dmsetup", "message", g.DM_NAME, "0", "migration_threshold", "32768"], check=True, env=DM_ENV)
    elif config == "cutoff0":
        (g.BCACHE / "sequential_cutoff").write_text("0")
    elif config == "cutoff16":
        (g.BCACHE / "sequential_cutoff").write_text(str(16 * g.MIB))
    elif config == "cp-default":
        return g.Daemon([g.ROOT / "policies" / "default.yaml"])
    return None


def main() -> None:
    config, rounds, interval, stream_x = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    backup_round = int(sys.argv[sys.argv.index("--backup-round") + 1]) if "--backup-round" in sys.argv else 3
    rnd = random.Random(seed)  # noqa: S311 - reproducible data, not a secret
    cache_mib = int(os.environ.get("BENCH_CACHE_MB", "256"))
    hot = [g.MNT / f"hot{i}" for i in range(HOT_FILES)]
    cold = [g.MNT / f"cold{i:03d}" for i in range(int(stream_x * cache_mib) // 64)]
    for p in hot:
        write(p, HOT_MIB * g.MIB, rnd)
    for p in cold:
        write(p, 64 * g.MIB, rnd)
    reattach()
    Path("/proc/sys/vm/drop_caches").write_text("3")
    daemon = configure(config)
    buf = mmap.mmap(-1, REQ)
    backup = Backup(cold)
    # bcache's refused read-miss inserts (bcache_alloc_fail: no ready bucket), counted per round for every
    # configuration -- with the stats, why a configuration keeps or loses the hot set while the backup streams
    refusals = Trace((ALLOC_FAIL,)) if g.RECIPE == "bcache" else None
    if refusals is not None:
        refusals.start()
    t0 = time.monotonic()
    per_round: list[dict] = []
    second_ended = float("nan")
    for r in range(rounds):
        start = t0 + r * interval
        time.sleep(max(0.0, start - time.monotonic()))
        if r + 1 == backup_round:
            backup.start()
        o0, b0, s0 = g.origin_read(), backup.bytes, stats()
        times = [read_direct(p, buf) for p in hot]
        if r == 1:
            second_ended = time.time()  # wall clock, as the daemon's decisions' "ts"
        # the round's window runs to the next round's start: the daemon's promotion reads land there
        end = t0 + (r + 1) * interval
        time.sleep(max(0.0, end - time.monotonic()))
        hot_origin = max(0, g.origin_read() - o0 - (backup.bytes - b0))
        names = STATS if g.RECIPE == "bcache" else tuple(DM_STATS)
        counts = dict(zip(names, (b - a for a, b in zip(s0, stats(), strict=True)), strict=True))
        if refusals is not None:
            counts["alloc_fail"] = sum(1 for x in refusals.take() if x.event == ALLOC_FAIL)
        per_round.append({"round": r + 1, "t": start - t0, "read_ms": times,
                          "origin_bytes_per_read": hot_origin / HOT_FILES, "bcache": counts,
                          "backup_bytes": backup.bytes - b0})
        g.log(f"{config} round {r + 1}: hot read ms {[round(x) for x in times]}, "
            f"origin {hot_origin / g.MIB:.1f} MiB for the hot set, backup {(backup.bytes - b0) / g.MIB:.0f} MiB, "
            f"bcache {counts}")
        if daemon:
            daemon.sample()
    backup.stop.set()
    if backup.ident is not None:  # started
        backup.join()
    if refusals is not None:
        refusals.stop()
    res = {"config": config, "rounds": per_round, "hot_files": HOT_FILES, "hot_mib": HOT_MIB,
           "interval_s": interval, "backup_round": backup_round, "stream_bytes": backup.bytes,
           "stream_s": backup.seconds,
           "stream_mib_s": backup.bytes / g.MIB / max(backup.seconds, 1e-9),
           "kind": g.RECIPE,
           "sequential_cutoff": (g.BCACHE / "sequential_cutoff").read_text().strip() if g.RECIPE == "bcache" else None}
    if daemon:
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - daemon.cpu0) / (time.monotonic() - t0)
        dec = daemon.explain()
        done = [x for x in dec if x["kind"] == "promote" and x["status"] == "done"]
        res["promotions"] = len(done)
        # when each promotion was done, seconds after the second round's reads ended (the admission's earliest)
        res["promoted_after_round2_s"] = sorted(round(float(x["ts"]) - second_ended, 1) for x in done)
        vol = (daemon.ask("status").get("volumes") or [{}])[0]
        pace = vol.get("promotion") or {}
        res["alloc_failures"], res["promotion_rate"] = pace.get("alloc_failures"), pace.get("promotion_rate")
        res["daemon_exit"] = daemon.stop()
    g.write_result("hotlarge", res)


if __name__ == "__main__":
    main()
