"""Guest: a backup scan over a Zipf-read hot set on the lab's cached volume (bcache or dm-cache).

usage: scan.py CONFIG WARM SCAN_MB AFTER [--seed N]     CONFIG: stock | cp-destructive (the shipped default policy)

A hot set of 256 files of 64 KiB (16 MiB, a quarter of the cache) is read with Zipf(1.1) picks, O_DIRECT 64 KiB,
for WARM seconds; then a backup reads SCAN_MB of cold 1 MiB files once (buffered, as tar would), while the Zipf
reads go on; then AFTER seconds of Zipf reads alone. A hot read is a hit when it returns in under HIT_MS = 4 ms
(the origin sits behind dm-delay 5 ms, the cache device has none). Result: per-second hot-set hit ratio, the
pre-scan ratio (last half of the warm phase), the minimum during the scan, and the recovery time (scan end →
the first second whose ratio is back to 90% of the pre-scan one). $LAB_OUT/scan.json."""

from __future__ import annotations

import mmap
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)

HOT_FILES, HOT_SIZE, HIT_MS = 256, 64 * 1024, 4.0


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    return [1 / (i + 1) ** s for i in range(n)]


def main() -> None:
    config, warm, scan_mb, after = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    hot, cold = g.MNT / "hot", g.MNT / "cold"
    hot.mkdir()
    cold.mkdir()
    for i in range(HOT_FILES):
        (hot / f"h{i:04d}").write_bytes(rnd.randbytes(HOT_SIZE))
    for i in range(scan_mb):
        (cold / f"c{i:05d}").write_bytes(rnd.randbytes(g.MIB))
    os.sync()
    g.drop_caches()
    daemon = g.Daemon([g.ROOT / "policies" / "default.yaml"]) if config.startswith("cp-") else None
    weights = zipf_weights(HOT_FILES)
    buf = mmap.mmap(-1, HOT_SIZE)
    per_s: dict[int, list[int]] = {}
    stop = threading.Event()
    marks: dict[str, float] = {}
    t0 = time.monotonic()

    def backup() -> None:
        marks["scan_start"] = time.monotonic() - t0
        for f in sorted(cold.iterdir()):
            with open(f, "rb") as fh:
                while fh.read(1 << 20):
                    pass
        marks["scan_end"] = time.monotonic() - t0
        g.log(f"scan done in {marks['scan_end'] - marks['scan_start']:.1f} s")

    scanner = threading.Thread(target=backup, daemon=True)
    while not stop.is_set():
        now = time.monotonic() - t0
        if now >= warm and "scan_start" not in marks:
            scanner.start()
        if "scan_end" in marks and now >= marks["scan_end"] + after:
            break
        i = rnd.choices(range(HOT_FILES), weights)[0]
        lat = g.timed_read_ms(hot / f"h{i:04d}", buf)
        per_s.setdefault(int(now), [0, 0])[0 if lat < HIT_MS else 1] += 1
        if daemon and int(now) % 5 == 0:
            daemon.sample()
    series = [(s, h / (h + m)) for s, (h, m) in sorted(per_s.items()) if h + m]
    start, end = marks["scan_start"], marks["scan_end"]
    pre = [r for s, r in series if warm / 2 <= s < start]
    pre_ratio = sum(pre) / max(1, len(pre))
    during = [r for s, r in series if int(start) <= s <= int(end)]
    never_below = all(r >= 0.9 * pre_ratio for s, r in series if s >= int(start))
    # seconds from the scan's end to the end of the first 1 s bucket (from the one the scan ended in) back at 90%
    rec = 0.0 if never_below else next((max(0.0, s + 1 - end) for s, r in series
                                        if s >= int(end) and r >= 0.9 * pre_ratio), None)
    res = {"config": config, "recipe": g.RECIPE, "series": series, "scan_start": start, "scan_end": end,
           "pre_ratio": pre_ratio, "during_mean": sum(during) / max(1, len(during)),
           "during_min": min(during, default=None), "after_mean": sum(r for s, r in series if s >= end)
           / max(1, sum(1 for s, _ in series if s >= end)), "recovery_s": rec,
           "never_below_90": never_below}
    if daemon:
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - daemon.cpu0) / (time.monotonic() - t0)
        res["daemon_rss_mib"] = daemon.rss_max / g.MIB
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["daemon_exit"] = daemon.stop()
    g.write_result("scan", res)
    g.log(f"{config}: pre {pre_ratio:.3f}, during {res['during_mean']:.3f} (min {res['during_min']}), "
        f"recovery {rec} s")


if __name__ == "__main__":
    main()
