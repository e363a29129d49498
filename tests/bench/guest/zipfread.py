"""Guest: buffered readers with Zipf file popularity on the lab's dm-cache volume (promotion's home ground), under
one configuration.

usage: zipfread.py CONFIG SECONDS [--warmup S] [--origin-read-ms MS] [--threads N] [--seed N]
CONFIG: smq (stock dm-cache, smq) | cp-default (the same + the daemon under the shipped default policy) |
cp-promote (the shipped default with promotion.only_uncached false: admitted files promoted on dm-cache too).

The file set: NFILES files of FILE_KIB each (3x the cache), written once, synced, the cache settled to 0 dirty and
the page cache dropped. N threads (default 4) then loop: draw a file's popularity rank from Zipf(EXPONENT) (the
rank -> file map is a seeded shuffle, so hot files are scattered over the disk), drop that file's pages
(posix_fadvise DONTNEED) and read it whole through the page cache, so every read reaches the block layer as the
kernel's own readahead bios. S seconds of warm-up (not counted), then the window of SECONDS.
The workload's own hit ratio: a file read that completed faster than the origin's read delay (MS) cannot have
touched the origin (dm-delay holds every origin read MS): it is a hit; any slower read counts as a miss, so CPU
contention (the daemon's included) can only lower this ratio, never raise it. The daemon's promotion reads are not
the workload's reads and never enter it. dm-cache's own read hit/miss counters (which do include the promoter's
reads), its promotions and the daemon's promoted bytes are reported beside it, and dm-cache's ratio with the promoter's
bios taken out (as if every one of them hit: a lower bound for the workload's own ratio at bio level).
Result: $LAB_OUT/zipfread.json."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)
from zipfgen import Zipf  # noqa: E402

FILE_KIB = 128
NFILES = 6144  # 768 MiB: 3x the 256 MiB cache, half the guest's RAM (reads bypass the page cache anyway)
# Breslau et al., "Web caching and Zipf-like distributions" (INFOCOM 1999): request popularity over documents is
# Zipf-like with exponents 0.64-0.83 across six traces; 0.8 sits in that range, and leaves an ideal cache of this
# size room above an LRU-like one (top_share below: what the best possible choice of cached files would hit).
EXPONENT = 0.8


def arg(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def make_files(root: Path, rnd: random.Random) -> list[Path]:
    root.mkdir()
    body = rnd.randbytes(FILE_KIB * 1024)
    files = []
    for i in range(NFILES):
        p = root / f"f{i:05d}"
        p.write_bytes(i.to_bytes(8, "little") + body[8:])
        files.append(p)
    os.sync()
    return files


def counters() -> tuple[int, int, int]:
    """dm-cache's read hits, read misses, promotions."""
    f = g.dmstatus()
    return int(f[7]), int(f[8]), int(f[12])


def block_bytes() -> int:
    return int(g.dmstatus()[5]) * 512


def workload_dm_ratio(hits: int, misses: int, promoter_bios: int) -> float | None:
    """dm-cache's read hit ratio with the promoter's bios taken out, counting them all as hits (the lower bound:
    which of them hit is not known). dm core splits every bio at the cache block, and the promoter reads aligned
    chunks, so its bios are its bytes / the block size."""
    total = hits + misses - promoter_bios
    return max(0, hits - promoter_bios) / total if total > 0 else None


def reader(pick: Zipf, lock: threading.Lock, files: list[Path], span: tuple[float, float],
           lat: list[tuple[float, float]]) -> None:
    """Read until span's end; every read's (start time, latency in ms), warm-up included."""
    while (now := time.monotonic()) < span[1]:
        with lock:  # one generator for all threads: the draw sequence is the seed's, whatever the scheduling
            path = files[pick()]
        t = time.perf_counter()
        g.read_whole(path)
        lat.append((now, (time.perf_counter() - t) * 1e3))


def timeline(lat: list[tuple[float, float]], start: float, read_ms: float, step: float = 5.0) -> list[dict]:
    """The hit ratio per `step` seconds from `start` (the warm-up's start)."""
    buckets: dict[int, list[float]] = {}
    for t, x in lat:
        buckets.setdefault(int((t - start) // step), []).append(x)
    return [{"t": (k + 1) * step, "hit_ratio": sum(1 for x in xs if x < read_ms) / len(xs), "reads": len(xs)}
            for k, xs in sorted(buckets.items())]


# Rank bands whose residency is measured after the window: the daemon's believed-cached set on the shipped default
# (max_cache_fraction 0.25 of 256 MiB: the 512 hottest files), then the rest of what an ideal cache would hold.
BANDS = ((0, 512), (512, 2048))


def cached_shares(files: list[Path]) -> dict[str, float]:
    """Per rank band, the share of files the cache holds whole at the end: one O_DIRECT read of each, in rank order,
    faster than the origin's read delay (hottest first, so a read cannot have been preceded by one that promoted
    the file; smq needs hotspot hits in two ticks to promote, so one read changes no later file's answer). Shows
    whether the stock policy keeps the hot files by itself, i.e. what promotion reads could add."""
    import mmap

    buf = mmap.mmap(-1, FILE_KIB * 1024)
    read_ms = arg("--origin-read-ms", 4.0)
    try:
        return {f"{lo}-{hi}": sum(1 for p in files[lo:hi] if g.timed_read_ms(p, buf) < read_ms) / (hi - lo)
                for lo, hi in BANDS}
    finally:
        buf.close()


METRICS = "127.0.0.1:9477"  # the daemon's exporter, inside the guest only (no network leaves it)


def promoted_bytes() -> int | None:
    """The daemon's cachepilot_volume_promoted_bytes_total, summed over volumes, from its exporter (None: the
    exporter did not answer; the run's other numbers stand)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as r:  # noqa: S310 - fixed local URL
            text = r.read().decode()
    except OSError as exc:
        g.log(f"no metrics from the daemon's exporter: {exc}")
        return None
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("cachepilot_volume_promoted_bytes_total")))


def policy(config: str) -> Path:
    """The shipped default policy; for cp-promote with only_uncached false (admitted files promoted on dm-cache,
    as before smq was left to promote them itself: the comparison that shows what the promotion reads cost)."""
    if config != "cp-promote":
        return g.ROOT / "policies" / "default.yaml"
    return g.shipped_variant("only_uncached: true", "only_uncached: false")


def main() -> None:
    config, seconds = sys.argv[1], float(sys.argv[2])
    warmup, read_ms = arg("--warmup", 0.0), arg("--origin-read-ms", 4.0)
    nthreads, seed = int(arg("--threads", 4)), int(arg("--seed", 1))
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    files = make_files(g.MNT / "set", rnd)
    rnd.shuffle(files)  # rank k -> files[k]: popularity independent of the on-disk order
    g.settle_clean()
    g.drop_caches()
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # the exporter listens on loopback
    daemon = g.Daemon([policy(config)], metrics_listen=METRICS) if config.startswith("cp-") else None
    pick, lock, every = Zipf(NFILES, EXPONENT, rnd), threading.Lock(), []  # type: ignore[var-annotated]
    start = time.monotonic()
    t0 = start + warmup
    threads = [threading.Thread(target=reader, args=(pick, lock, files, (t0, t0 + seconds), every))
               for _ in range(nthreads)]
    for t in threads:
        t.start()
    time.sleep(warmup)
    c0, cpu0 = counters(), daemon.cpu_s() if daemon else 0.0
    p0 = promoted_bytes() if daemon else 0
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    c1 = counters()
    lat = [x for t, x in every if t >= t0]
    hits, misses, promotions = (b - a for a, b in zip(c0, c1, strict=True))
    fast = sum(1 for x in lat if x < read_ms)
    res = {
        "config": config, "seconds": elapsed, "warmup_s": warmup, "threads": nthreads, "files": NFILES,
        "file_kib": FILE_KIB, "exponent": EXPONENT, "ideal_hit_ratio": pick.top_share(256 * 1024 // FILE_KIB),
        "reads": len(lat), "ops_s": len(lat) / elapsed, "read_p50_ms": g.percentile(lat, 50),
        "read_p99_ms": g.percentile(lat, 99), "hit_ratio": fast / len(lat) if lat else None,
        "hit_threshold_ms": read_ms, "dm_read_hits": hits, "dm_read_misses": misses,
        "dm_hit_ratio": hits / (hits + misses) if hits + misses else None, "dm_promotions": promotions,
        "dm_workload_hit_ratio": workload_dm_ratio(hits, misses, 0), "read_mib": len(lat) * FILE_KIB / 1024,
        "latency_deciles_ms": [round(g.percentile(lat, p), 2) for p in range(10, 100, 10)],
        "timeline": timeline(every, start, read_ms),
    }
    if daemon:
        p1 = promoted_bytes()
        promoted = None if p0 is None or p1 is None else p1 - p0
        res["promoted_mib"] = None if promoted is None else promoted / g.MIB
        res["dm_workload_hit_ratio"] = (None if promoted is None
                                        else workload_dm_ratio(hits, misses, -(-promoted // block_bytes())))
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - cpu0) / elapsed
        daemon.sample()
        res["daemon_rss_mib"] = daemon.rss_max / g.MIB
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["daemon_exit"] = daemon.stop(keep_log="zipfread")
    res["cached_share_by_rank"] = cached_shares(files)  # after the daemon stopped: nothing promotes meanwhile
    g.write_result("zipfread", res)
    g.log(f"{config}: {res['ops_s']:.1f} reads/s, hit ratio {res['hit_ratio']}, p99 {res['read_p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
