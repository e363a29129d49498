"""Guest: warm restart on bcache -- Zipf reads over data twice the cache; midway the cache device is replaced (the
cache set detached and unregistered, the device formatted as a fresh cache set, attached); how long until the hit
ratio is back to 90% of its steady state.

usage: warm.py CONFIG WARM AFTER [--seed N]     CONFIG: stock | cp-destructive (the shipped default policy)

The data: 2 × the cache in 64 KiB files (written while the cache is in writethrough, so the detach has nothing to
flush), read with Zipf(1.1) picks, O_DIRECT 64 KiB, for WARM seconds; then the replacement; then AFTER seconds.
A read is a hit when it returns in under HIT_MS = 4 ms (the origin sits behind dm-delay 5 ms). Result: per-second
hit ratio, the steady ratio (second half of the warm phase), the replacement's duration and the recovery time
(attach -> the end of the first second back at 90% of steady). $LAB_OUT/warm.json."""

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
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)

FILE_SIZE, HIT_MS = 64 * 1024, 4.0
SYS = Path("/sys/block/bcache0/bcache")


def replace_cache() -> None:
    """Detach and unregister the cache set, format the cache device as a fresh one, register and attach it."""
    cache_dev = os.environ["LAB_CACHE_DEV"]
    old = Path(os.environ["LAB_BCACHE_CSET"])
    (SYS / "detach").write_text("1")
    if not g.wait(lambda: (SYS / "state").read_text().strip() == "no cache", 120, 0.1):
        raise SystemExit(f"detach did not finish: state {(SYS / 'state').read_text().strip()}")
    (old / "unregister").write_text("1")
    if not g.wait(lambda: not old.exists(), 60, 0.1):
        raise SystemExit("the old cache set did not go away")
    for _ in range(50):  # the device may stay open a moment after the cache set went away
        # the cached data looks like other signatures (the filesystem's) to make-bcache: a fresh device has none
        subprocess.run(["wipefs", "-a", "-q", cache_dev], capture_output=True)
        mk = subprocess.run(["make-bcache", "--wipe-bcache", "--bucket", "64k", "-C", cache_dev],
                            capture_output=True, text=True)
        if mk.returncode == 0:
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"make-bcache failed: {mk.stdout} {mk.stderr}")
    Path("/sys/fs/bcache/register").write_text(cache_dev)
    show = subprocess.run(["bcache-super-show", cache_dev], check=True, capture_output=True, text=True).stdout
    uuid = next(line.split()[1] for line in show.splitlines() if line.startswith("cset.uuid"))
    (SYS / "attach").write_text(uuid)
    if not g.wait(lambda: (SYS / "state").read_text().strip() in ("clean", "dirty"), 60, 0.1):
        raise SystemExit(f"attach did not finish: state {(SYS / 'state').read_text().strip()}")


def main() -> None:
    config, warm, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    cache_mb = int(os.environ.get("BENCH_CACHE_MB", "64"))
    nfiles = 2 * cache_mb * g.MIB // FILE_SIZE
    data = g.MNT / "data"
    data.mkdir()
    g.set_cache_mode("writethrough")  # clean: the detach has nothing to write back
    for i in range(nfiles):
        (data / f"f{i:05d}").write_bytes(rnd.randbytes(FILE_SIZE))
    os.sync()
    g.set_cache_mode("writeback")
    g.drop_caches()
    daemon = g.Daemon([g.ROOT / "policies" / "default.yaml"]) if config.startswith("cp-") else None
    order = list(range(nfiles))
    rnd.shuffle(order)  # the hot files are spread over the disk, not its first blocks
    weights = [1 / (i + 1) ** 1.1 for i in range(nfiles)]
    buf = mmap.mmap(-1, FILE_SIZE)
    per_s: dict[int, list[int]] = {}
    marks: dict[str, float] = {}
    t0 = time.monotonic()

    failed: list[BaseException] = []

    def swap() -> None:
        marks["replace_start"] = time.monotonic() - t0
        try:
            replace_cache()
        except BaseException as exc:  # noqa: BLE001 - reported by the main loop
            failed.append(exc)
            return
        marks["attached"] = time.monotonic() - t0
        g.log(f"cache replaced in {marks['attached'] - marks['replace_start']:.1f} s")

    swapper = threading.Thread(target=swap, daemon=True)
    while True:
        now = time.monotonic() - t0
        if now >= warm and "replace_start" not in marks:
            swapper.start()
        if "attached" in marks and now >= marks["attached"] + after:
            break
        if failed or now > warm + after + 300:
            raise SystemExit(f"the replacement failed: {failed[0] if failed else 'timed out'}")
        i = order[rnd.choices(range(nfiles), weights)[0]]
        lat = g.timed_read_ms(data / f"f{i:05d}", buf)
        per_s.setdefault(int(now), [0, 0])[0 if lat < HIT_MS else 1] += 1
        if daemon and int(now) % 5 == 0:
            daemon.sample()
    series = [(s, h / (h + m)) for s, (h, m) in sorted(per_s.items()) if h + m]
    attached = marks["attached"]
    steady = [r for s, r in series if warm / 2 <= s < marks["replace_start"]]
    steady_ratio = sum(steady) / max(1, len(steady))
    # from the attach to the end of the first 1 s bucket (from the one the attach fell in) back at 90% of steady
    rec = next((max(0.0, s + 1 - attached) for s, r in series if s >= int(attached) and r >= 0.9 * steady_ratio),
               None)
    res = {"config": config, "series": series, "replace_start": marks["replace_start"], "attached": attached,
           "steady_ratio": steady_ratio, "recovery_s": rec, "files": nfiles,
           "after_mean": sum(r for s, r in series if s >= attached) / max(1, sum(1 for s, _ in series
                                                                                  if s >= attached))}
    if daemon:
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - daemon.cpu0) / (time.monotonic() - t0)
        res["daemon_rss_mib"] = daemon.rss_max / g.MIB
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["rewarm_decisions"] = sum(1 for x in dec if "cache device replaced" in x.get("action", "")
                                      + x.get("reason", ""))
        res["daemon_exit"] = daemon.stop()
    g.write_result("warm", res)
    g.log(f"{config}: steady {steady_ratio:.3f}, recovery {rec} s, after {res['after_mean']:.3f}")


if __name__ == "__main__":
    main()
