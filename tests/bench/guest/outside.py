"""Guest: a workload no one here wrote (issue 31) on bcache under one configuration.

usage: outside.py TOOL CONFIG WARMUP_S WINDOW_S [--seed N]
TOOL: dbench (Debian's dbench 4.0, its own client.txt load, 4 clients: a file server) | dbench-fsync (the same,
fsync after every write: the origin-bound variant) | fio-fileset (tests/bench/fio/fileset.fio: create, write,
fsync, unlink) | fio-db (tests/bench/fio/dbrandwrite.fio: 8 KiB random read/write with an fsync per write).
CONFIG: as headline_fileserver.py (wt | wb | stock:wp=P,wd=D,discard=0|1 | cp-destructive ...).

The cache is configured and settled exactly as W1's (congestion thresholds off, every row), the tool runs WARMUP_S
(not measured; dbench's own warm-up, a fio run of its own) and WINDOW_S; throughput is the tool's own figure. Beside it:
the origin's busy share over the run (io_ticks: near 100% means the origin is the bottleneck, below it the guest's
CPU or the tool is), origin bytes written, the exposure witness (max dirty, seconds since clean), the daemon's CPU
and its mode switches. Result: $LAB_OUT/outside.json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)
from headline_fileserver import configure, valid  # noqa: E402

TOOLS = ("dbench", "dbench-fsync", "fio-fileset", "fio-db")
FIO = g.ROOT / "tests" / "bench" / "fio"
DBENCH_CLIENTS = 4


def dbench(fsync: bool, warmup: float, window: float, where: Path) -> dict:
    """dbench's Throughput line (MB/s over its execute phase; its warm-up is not counted)."""
    cmd = ["dbench", "-D", str(where), "-t", f"{int(warmup + window)}", *(["-F"] if fsync else []),
           str(DBENCH_CLIENTS)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=warmup + window + 600).stdout
    m = re.search(r"Throughput ([0-9.]+) MB/sec .* max_latency=([0-9.]+) ms", out)
    if not m:
        raise SystemExit(f"dbench printed no Throughput line:\n{out[-1500:]}")
    return {"throughput_mb_s": float(m.group(1)), "max_latency_ms": float(m.group(2))}


def fio(job: str, warmup: float, window: float, where: Path, seed: int) -> dict:
    """fio's JSON: bytes/s and operations/s of reads and writes together, and the 99th percentile of completion
    latency."""
    base = ["fio", str(FIO / job), f"--directory={where}", f"--randseed={seed}", "--output-format=json"]
    # the warm-up is a run of its own, not fio's ramp_time: fio 3.33 (Debian 12) never ends the file-set job after a
    # ramp_time ("job 'fileset' hasn't exited in 300 seconds, it appears to be stuck"; reproduced on the host, where
    # the same job without ramp_time ends on time)
    subprocess.run([*base, f"--runtime={int(warmup)}"], capture_output=True, check=True, timeout=warmup + 300)
    doc = json.loads(subprocess.run([*base, f"--runtime={int(window)}"], capture_output=True, text=True, check=True,
                                    timeout=window + 300).stdout)
    j = doc["jobs"][0]
    bw = sum(j[d]["bw_bytes"] for d in ("read", "write"))
    iops = sum(j[d]["iops"] for d in ("read", "write"))
    p99 = max(j[d].get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) for d in ("read", "write"))
    sync = j.get("sync", {}).get("lat_ns", {}).get("percentile", {}).get("99.000000", 0)
    return {"throughput_mb_s": bw / 1e6, "iops": iops, "clat_p99_ms": p99 / 1e6, "fsync_p99_ms": sync / 1e6}


FIO_JOBS = {"fio-fileset": "fileset.fio", "fio-db": "dbrandwrite.fio"}


def prepare(tool: str) -> Path:
    """The tool's directory; fio's files laid out before anything is measured (the database job's 2 x 256 MiB
    tables would otherwise be most of a short window's origin writes), then synced."""
    where = g.MNT / "outside"
    where.mkdir()
    if tool in FIO_JOBS:
        subprocess.run(["fio", str(FIO / FIO_JOBS[tool]), f"--directory={where}", "--create_only=1",
                        "--output-format=terse"], capture_output=True, check=True, timeout=1800)
        os.sync()
    return where


def run_tool(tool: str, where: Path, warmup: float, window: float, seed: int) -> dict:
    if tool.startswith("dbench"):
        return dbench(tool == "dbench-fsync", warmup, window, where)
    return fio(FIO_JOBS[tool], warmup, window, where, seed)


def main() -> None:
    tool, config, warmup, window = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    if tool not in TOOLS:
        raise SystemExit(f"unknown tool {tool!r}: one of {', '.join(TOOLS)}")
    if not valid(config):
        raise SystemExit(f"unknown configuration {config!r}")
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    g.set_cache_mode("writethrough")
    where = prepare(tool)  # written through, before the configuration: every row starts from the same clean files
    daemon, _ = configure(config, 0.0)
    g.drop_caches()
    age = g.DirtyAge()

    def row() -> dict:
        d = g.dirty_bytes()
        age.see(d)
        if daemon:
            daemon.sample()
        return {"dirty_mib": d / g.MIB}

    sampler = g.Sampler(row)
    sampler.start()
    t0, w0, busy0 = time.monotonic(), g.origin_written(), g.origin_io_ticks_ms()
    cpu0 = daemon.cpu_s() if daemon else 0.0
    res = {"tool": tool, "config": config, "seed": seed, "warmup_s": warmup, "window_s": window,
           **run_tool(tool, where, warmup, window, seed)}
    secs = time.monotonic() - t0
    res.update({"run_s": secs, "origin_busy_pct": 100 * (g.origin_io_ticks_ms() - busy0) / 1e3 / secs,
                "origin_written_mib": (g.origin_written() - w0) / g.MIB, "dirty_end_mib": g.dirty_bytes() / g.MIB,
                "exposure_max_dirty_mib": age.max_bytes / g.MIB, "exposure_dirty_since_clean_max_s": age.max_age_s})
    res["timeline"] = sampler.stop()
    if daemon:
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - cpu0) / secs
        dec = daemon.explain()
        res["switches"] = [(x.get("ts"), x.get("status"), x.get("reason", "")[:160]) for x in dec
                           if x["kind"] == "set_write_policy"]
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["daemon_exit"] = daemon.stop()
    g.write_result("outside", res)
    g.log(f"{tool} {config}: {res['throughput_mb_s']:.2f} MB/s, origin busy {res['origin_busy_pct']:.0f}%")


if __name__ == "__main__":
    main()
