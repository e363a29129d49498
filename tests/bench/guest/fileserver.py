"""Guest: Filebench's fileserver shape with deletes on the lab's cached volume, under one configuration.

usage: fileserver.py CONFIG SECONDS [--fstrim-every S] [--seed N]
CONFIG: stock | discard (ext4 -o discard) | fstrim (fstrim every S seconds) | cp-destructive (the daemon, shipped
default policy) | cp-recoverable (the daemon, the shipped default policy with failure_model: recoverable) | cp-hold
(cp-recoverable with writeback_percent 40 pinned).

The file set (files of 64-192 KiB, about 1.25x the cache) is written in writethrough (clean, cached), then the cache
goes to writeback and the loop runs for SECONDS: each iteration creates and writes a whole file and fsyncs it (the
commit), appends 16 KiB to another, reads a third whole (its page cache dropped first, so the read reaches the
cache), deletes a fourth and stats a fifth. After the loop: sync, TAIL seconds idle, then the origin's written bytes
and the dirty bytes still to be written are read. Delete -> discard latency: see common.DiscardWitness (a delete
whose blocks were reused before any discard reached them counts as never discarded).
Result: $LAB_OUT/fileserver.json."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    MIB,
    MNT,
    ROOT,
    Daemon,
    DiscardWitness,
    Sampler,
    cache_in_use_pct,
    dirty_bytes,
    drop_caches,
    hits_misses,
    log,
    origin_written,
    percentile,
    read_whole,
    set_cache_mode,
    write_result,
)

TAIL = 12.0  # seconds idle after the loop: one shipped discard interval (10 s) plus a tick


def recoverable_policy(hold: bool = False) -> Path:
    """The shipped default with failure_model: recoverable; with hold, also writeback_percent 40 pinned (bcache's
    largest: dirty data up to 40% of the cache is written back at the minimum rate, so a delete can discard it
    before it reaches the origin)."""
    text = (ROOT / "policies" / "default.yaml").read_text().replace("failure_model: destructive",
                                                                     "failure_model: recoverable")
    if hold:
        text = text.replace("\n  hysteresis:", "\n  knobs: {writeback_percent: 40}\n  hysteresis:", 1)
    p = Path("/tmp/recoverable-hold.yaml" if hold else "/tmp/recoverable.yaml")
    p.write_text(text)
    return p


def write_file(path: Path, size: int, rnd: random.Random, sync: bool = True) -> float:
    """Write a whole file and fsync it; the fsync's latency is returned (the commit)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, rnd.randbytes(size))
        t = time.perf_counter()
        if sync:
            os.fsync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def main() -> None:
    config, seconds = sys.argv[1], float(sys.argv[2])
    fstrim_every = float(sys.argv[sys.argv.index("--fstrim-every") + 1]) if "--fstrim-every" in sys.argv else 60.0
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    cache_bytes = int(os.environ.get("BENCH_CACHE_MB", "64")) * MIB
    d = MNT / "fs"
    d.mkdir()
    set_cache_mode("writethrough")
    files: list[Path] = []
    total, n = 0, 0
    while total < cache_bytes * 5 // 4:
        p = d / f"f{n:06d}"
        size = rnd.randrange(64, 193) * 1024
        write_file(p, size, rnd, sync=False)
        files.append(p)
        total, n = total + size, n + 1
    os.sync()
    log(f"file set: {len(files)} files, {total / MIB:.1f} MiB")
    set_cache_mode("writeback")
    if config == "discard":
        subprocess.run(["mount", "-o", "remount,discard", str(MNT)], check=True)
    daemon = None
    if config.startswith("cp-"):
        pol = (ROOT / "policies" / "default.yaml" if config == "cp-destructive"
               else recoverable_policy(hold=config == "cp-hold"))
        daemon = Daemon([pol])
    drop_caches()
    time.sleep(1)
    w0, (h0, m0) = origin_written(), hits_misses()

    def row() -> dict:
        h, m = hits_misses()
        r = {"origin_mib": (origin_written() - w0) / MIB, "dirty_mib": dirty_bytes() / MIB, "hits": h - h0,
             "misses": m - m0, "in_use_pct": cache_in_use_pct()}
        if daemon:
            daemon.sample()
        return r

    sampler = Sampler(row)
    sampler.start()
    witness = DiscardWitness(os.environ["LAB_CACHED_DEV"])
    commits: list[float] = []
    deletes: list[float] = []
    ops, nxt, last_trim, trims = 0, n, time.monotonic(), 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        p = d / f"f{nxt:06d}"
        nxt += 1
        commits.append(write_file(p, rnd.randrange(64, 193) * 1024, rnd))
        files.append(p)
        with open(rnd.choice(files), "ab") as f:
            f.write(rnd.randbytes(16 * 1024))
        read_whole(rnd.choice(files))
        victim = files.pop(rnd.randrange(len(files)))
        witness.deleting(victim)
        t = time.perf_counter()
        os.unlink(victim)
        deletes.append(time.perf_counter() - t)
        os.stat(rnd.choice(files))
        ops += 5
        if config == "fstrim" and time.monotonic() - last_trim >= fstrim_every:
            subprocess.run(["fstrim", str(MNT)], check=True)
            last_trim, trims = time.monotonic(), trims + 1
    elapsed = time.monotonic() - t0
    os.sync()
    if config == "fstrim":
        subprocess.run(["fstrim", str(MNT)], check=True)  # the run ends on a trim, as a cron job's would
        trims += 1
    time.sleep(TAIL)
    rows = sampler.stop()
    h, m = hits_misses()
    to_discard, never = witness.latencies()
    res = {
        "config": config, "seconds": elapsed, "ops": ops, "ops_s": ops / elapsed,
        "origin_written_mib": (origin_written() - w0) / MIB, "dirty_left_mib": dirty_bytes() / MIB,
        "hits": h - h0, "misses": m - m0, "hit_ratio": (h - h0) / max(1, h - h0 + m - m0),
        "delete_p50_ms": percentile(deletes, 50) * 1e3, "delete_p99_ms": percentile(deletes, 99) * 1e3,
        "commit_p50_ms": percentile(commits, 50) * 1e3, "commit_p99_ms": percentile(commits, 99) * 1e3,
        "fstrims": trims, "fstrim_every_s": fstrim_every if config == "fstrim" else None,
        "fileset_mib": total / MIB, "timeline": rows,
        "deletes": len(deletes), "discarded": len(to_discard), "never_discarded": never,
        "delete_discard_p50_s": percentile(to_discard, 50), "delete_discard_p90_s": percentile(to_discard, 90),
    }
    res["origin_debt_mib"] = res["origin_written_mib"] + res["dirty_left_mib"]
    if daemon:
        res["daemon_cpu_s"] = daemon.cpu_s() - daemon.cpu0
        res["daemon_cpu_pct"] = 100 * res["daemon_cpu_s"] / (elapsed + TAIL)
        res["daemon_rss_mib"] = daemon.rss_max / MIB
        res["daemon_ready_s"] = daemon.ready_s
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["decisions_tail"] = dec[-8:]
        res["daemon_exit"] = daemon.stop(keep_log=os.environ.get("BENCH_KEEP_LOG", ""))
        res["daemon_log_tail"] = daemon.log()[-1500:]
    write_result("fileserver", res)
    log(f"{config}: {res['ops_s']:.1f} ops/s, origin {res['origin_written_mib']:.1f} MiB + dirty "
        f"{res['dirty_left_mib']:.1f} MiB, hit {res['hit_ratio']:.3f}")


if __name__ == "__main__":
    main()
