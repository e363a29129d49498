"""Guest: a workload recorded on the lab's bcache volume, with the stock cache's own read hit ratio measured -- the
ground truth the sizing advisor's prediction is checked against (tests/bench/bench_lab_advisor.py).

usage: advisor.py WORKLOAD [--seed N]     WORKLOAD: zipf | fileserver

The workload is a seeded generator of cachepilot.workloads run on real files (the same operations at any cache
size): zipf = the warm-restart generator's Zipf(1.0) whole-file reads over 5 000 files of ~64 KiB (~310 MiB), without
its cache drop; fileserver = Filebench's fileserver shape (an initial set of 4 000 files of ~64 KiB, then create +
write, append, whole-file read, delete per iteration). Reads drop the file's page cache first (so they reach the
cache); `cachepilot record` records from before the first write (written data enters bcache: the advisor counts it).
bcache is set to cache everything (sequential_cutoff 0, congestion thresholds 0: nothing bypasses), in writethrough.
Measured: the read hit ratio of the workload's phase from bcache's stats_total (cache_hits, cache_misses: reads
only), read 6 s after each phase (bcache moves its counters into stats_total on a 5 s timer).
Result: $LAB_OUT/advisor.json; the trace: $LAB_OUT/advisor.cptrace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)

from cachepilot.workloads import APPEND, CREATE, DELETE, DROP_CACHE, FSYNC, READ, WRITE, Op, fileserver, warm_restart

KiB = 1024
STATS_SETTLE_S = 6.0  # bcache folds its counters into stats_total every 5 s


def ops_of(name: str, seed: int) -> tuple[list[Op], int]:
    """The workload's operations and the index of its first measured one (after the initial file set)."""
    if name == "zipf":
        w = warm_restart(reads=10000, nfiles=5000, mean_size=64 * KiB, zipf_s=1.0, hot_files=0, seed=seed)
        ops = [op for op in w.ops if op[0] != DROP_CACHE]
        return ops, 2 * 5000
    if name == "fileserver":
        w = fileserver(iterations=3000, nfiles=4000, mean_size=64 * KiB, seed=seed)
        return w.ops, 2 * 4000
    raise SystemExit(f"unknown workload {name!r} (zipf, fileserver)")


def run(ops: list[Op], data: Path) -> int:
    """Run the operations on real files; bytes read."""
    read = 0
    block = os.urandom(1 << 20)
    for op, fid, off, length, _tag in ops:
        path = data / f"f{fid:06d}"
        if op == CREATE:
            path.touch()
        elif op in (WRITE, APPEND):
            fd = os.open(path, os.O_WRONLY)
            try:
                done = 0
                while done < length:
                    done += os.pwrite(fd, block[:min(len(block), length - done)], off + done)
            finally:
                os.close(fd)
        elif op == READ:
            read += g.read_whole(path)
        elif op == DELETE:
            path.unlink()
        elif op == FSYNC:
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return read


def settled_stats() -> tuple[int, int, int]:
    os.sync()
    time.sleep(STATS_SETTLE_S)
    h, m = g.hits_misses()
    s = g.BCACHE / "stats_total"
    return h, m, int((s / "cache_bypass_hits").read_text()) + int((s / "cache_bypass_misses").read_text())


def cache_everything() -> None:
    (g.BCACHE / "sequential_cutoff").write_text("0")
    cset = Path(os.environ["LAB_BCACHE_CSET"])
    for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
        (cset / knob).write_text("0")
    g.set_cache_mode("writethrough")


def main() -> None:
    name = sys.argv[1]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    ops, first = ops_of(name, seed)
    cache_everything()
    data = g.MNT / "data"
    data.mkdir()
    trace = g.OUT / "advisor.cptrace"
    cli = str(Path(sys.executable).with_name("cachepilot"))
    err = open(g.OUT / "record.err", "w+")  # noqa: SIM115 - the recorder's stderr, for the whole run
    rec = subprocess.Popen([cli, "record", "--out", str(trace), "--volume", str(g.MNT), "--tick", "1"],
                           stderr=err, stdout=subprocess.DEVNULL)
    if not g.wait(lambda: "recording" in Path(err.name).read_text(), 240):
        raise SystemExit(f"record did not start: {Path(err.name).read_text()[-2000:]}")
    t0 = time.monotonic()
    run(ops[:first], data)
    h0, m0, b0 = settled_stats()
    g.log(f"{name}: file set written in {time.monotonic() - t0:.0f} s (stats_total {h0} hits, {m0} misses)")
    t1 = time.monotonic()
    read = run(ops[first:], data)
    h1, m1, b1 = settled_stats()
    rec.send_signal(signal.SIGINT)
    rc = rec.wait(timeout=120)
    hits, misses = h1 - h0, m1 - m0
    res = {"workload": name, "seed": seed, "cache_mb": int(os.environ.get("BENCH_CACHE_MB", "0")),
           "ops": len(ops), "measured_ops": len(ops) - first, "read_bytes": read, "hits": hits, "misses": misses,
           "hit_ratio": hits / max(1, hits + misses), "bypasses": b1 - b0, "setup_hits": h0, "setup_misses": m0,
           "run_s": time.monotonic() - t1, "record_rc": rc, "trace_bytes": trace.stat().st_size}
    g.write_result("advisor", res)
    g.log(f"{name}: measured read hit ratio {res['hit_ratio']:.3f} ({hits} hits, {misses} misses, "
        f"{b1 - b0} bypassed) in {res['run_s']:.0f} s; record rc {rc}")


if __name__ == "__main__":
    main()
