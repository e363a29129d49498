"""Guest: the headline fileserver (W1) on bcache under one configuration.

usage: headline_fileserver.py CONFIG WARMUP_S WINDOW_S [--seed N] [--cpu-tax-pct P]
CONFIG: wt (stock write-through) | wb (stock write-back, defaults) | discard (wb + ext4 -o discard) | tuned (discard +
writeback_percent 40) | cp-destructive (the daemon, shipped default policy) | cp-recoverable (the same with
failure_model: recoverable) | cpu-tax (wb + a busy loop taking P % of the vCPU).

The live file set (a third of the cache, files of 64-192 KiB) is written in writethrough, the cache goes to the
configuration's mode and settles (dirty 0, clean), then the loop runs WARMUP_S (not measured) and WINDOW_S
(measured). Each iteration: create and write a whole file and fsync it (its lifetime drawn from the mix, see
lifetimes.LifetimeMix), append 16 KiB to a long-lived file, read a live file whole (its pages dropped first), stat
one, delete the files whose lifetime is over, then the oldest long-lived files while the live set is over target.
Result: $LAB_OUT/headline_fileserver.json."""

from __future__ import annotations

import heapq
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    BCACHE,
    MIB,
    MNT,
    ROOT,
    CpuTax,
    Daemon,
    DirtyAge,
    DirtyTrace,
    DiscardWitness,
    Sampler,
    WorkloadHits,
    cache_in_use_pct,
    dirty_bytes,
    drop_caches,
    log,
    origin_io_ticks_ms,
    origin_written,
    percentile,
    set_cache_mode,
    settle_clean,
    write_result,
)
from lifetimes import LifetimeMix, discard_outcomes, oldest_dirty_age, reach_share  # noqa: E402
from soak import profile  # noqa: E402 - with $SOAK_PYSPY: a py-spy profile of the daemon over the window

CONFIGS = ("wt", "wb", "discard", "tuned", "cp-destructive", "cp-recoverable", "cpu-tax")
MIX = LifetimeMix(short_share=0.4, short_min_s=2.0, short_max_s=60.0)  # README: W1, the lifetime mix
APPEND = 16 * 1024
WITNESS_TAIL = 3.0  # seconds after the window for the last deletes' discards (not measured otherwise)


def recoverable_policy() -> Path:
    text = (ROOT / "policies" / "default.yaml").read_text().replace("failure_model: destructive",
                                                                     "failure_model: recoverable")
    p = Path("/tmp/recoverable.yaml")
    p.write_text(text)
    return p


def extents(path: Path) -> list[tuple[int, int]]:
    from cachepilot.actuators.extents import fiemap

    fd = os.open(path, os.O_RDONLY)
    try:
        return [(e.physical // 512, e.length // 512) for e in fiemap(fd) if e.on_disk]
    finally:
        os.close(fd)


class Load:
    """The file set and the loop; latencies and deletes are recorded only while `recording`."""

    def __init__(self, rnd: random.Random, target: int, witness: DiscardWitness) -> None:
        self.d = MNT / "fs"
        self.d.mkdir()
        self.rnd, self.target, self.witness = rnd, target, witness
        self.long: list[tuple[Path, float]] = []  # oldest first
        self.short: list[tuple[float, int, Path]] = []  # heap by death time
        self.size: dict[Path, int] = {}
        self.n, self.live = 0, 0
        self.created: list[tuple[float, list[tuple[int, int]]]] = []
        self.fsync_ms: list[float] = []
        self.read_ms: list[float] = []
        self.long_lifetimes: list[float] = []
        self.ops, self.recording = 0, False

    def _new(self, sync: bool) -> Path:
        p = self.d / f"f{self.n:07d}"
        self.n += 1
        size = self.rnd.randrange(64, 193) * 1024
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self.rnd.randbytes(size))
            t = time.perf_counter()
            if sync:
                os.fsync(fd)
                if self.recording:
                    self.fsync_ms.append((time.perf_counter() - t) * 1e3)
        finally:
            os.close(fd)
        self.size[p] = size
        self.live += size
        return p

    def initial(self) -> None:
        """The long-lived set up to the target, in writethrough (clean); born long ago for the lifetimes."""
        while self.live < self.target:
            self.long.append((self._new(sync=False), float("-inf")))
        os.sync()

    def _delete(self, p: Path) -> None:
        if self.recording:
            self.witness.deleting(p)
        os.unlink(p)
        self.live -= self.size.pop(p)
        self.ops += 1

    def _pick(self) -> Path:
        i = self.rnd.randrange(len(self.long) + len(self.short))
        return self.long[i][0] if i < len(self.long) else self.short[i - len(self.long)][2]

    def _read(self, p: Path) -> None:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t = time.perf_counter()
            while os.read(fd, 1 << 20):
                pass
            if self.recording:
                self.read_ms.append((time.perf_counter() - t) * 1e3)
        finally:
            os.close(fd)

    def step(self) -> None:
        now = time.monotonic()
        p = self._new(sync=True)
        self.created.append((now, extents(p)))
        life = MIX.draw(self.rnd)
        if life is None:
            self.long.append((p, now))
        else:
            heapq.heappush(self.short, (now + life, self.n, p))
        tgt = self.long[self.rnd.randrange(len(self.long))][0]
        with open(tgt, "ab") as f:
            f.write(self.rnd.randbytes(APPEND))
        self.size[tgt] += APPEND
        self.live += APPEND
        self._read(self._pick())
        os.stat(self._pick())
        self.ops += 4
        while self.short and self.short[0][0] <= now:
            self._delete(heapq.heappop(self.short)[2])
        while self.live > self.target and len(self.long) > 1:
            old, born = self.long.pop(0)
            if self.recording and born != float("-inf"):
                self.long_lifetimes.append(now - born)
            self._delete(old)

    def run(self, seconds: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            self.step()
        return time.monotonic() - t0


def configure(config: str, tax_pct: float) -> tuple[Daemon | None, CpuTax | None]:
    """The configuration's mode and knobs on a settled (clean) cache, then its daemon or busy loop."""
    set_cache_mode("writethrough" if config == "wt" else "writeback")
    # every configuration: no congestion bypass. Under TCG the emulated cache device answers in milliseconds, over
    # bcache's 2 ms read / 20 ms write congestion thresholds, so stock bcache sent most of the workload's I/O
    # around the cache (301 of its requests in a 25 s development window); a real SSD answers in ~0.1 ms
    cset = Path(os.environ["LAB_BCACHE_CSET"])
    for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
        (cset / knob).write_text("0")
    settle_clean()
    if config in ("discard", "tuned"):
        subprocess.run(["mount", "-o", "remount,discard", str(MNT)], check=True)
    if config == "tuned":
        (BCACHE / "writeback_percent").write_text("40")
    if config.startswith("cp-"):
        pol = ROOT / "policies" / "default.yaml" if config == "cp-destructive" else recoverable_policy()
        return Daemon([pol]), None
    return None, (CpuTax(tax_pct) if config == "cpu-tax" else None)


def counters() -> dict:
    return {"t": time.monotonic(), "origin": origin_written(), "ticks": origin_io_ticks_ms(), "dirty": dirty_bytes()}


def window_metrics(load: Load, a: dict, b: dict, ops: int) -> dict:
    secs = b["t"] - a["t"]
    return {
        "window_s": secs, "ops": ops, "ops_s": ops / secs,
        "origin_window_mib": (b["origin"] - a["origin"]) / MIB,
        "origin_bytes_per_op": (b["origin"] - a["origin"]) / ops,
        "dirty_owed_mib": b["dirty"] / MIB,
        "debt_bytes_per_op": (b["origin"] - a["origin"] + b["dirty"] - a["dirty"]) / ops,
        "origin_busy_ms_per_op": (b["ticks"] - a["ticks"]) / ops,
        "origin_busy_pct": 100 * (b["ticks"] - a["ticks"]) / 1e3 / secs,
        "fsync_p50_ms": percentile(load.fsync_ms, 50), "fsync_p99_ms": percentile(load.fsync_ms, 99),
        "read_p50_ms": percentile(load.read_ms, 50), "read_p99_ms": percentile(load.read_ms, 99),
        "long_lifetime_p50_s": percentile(load.long_lifetimes, 50),
    }


def discard_metrics(load: Load, witness: DiscardWitness) -> dict:
    o = discard_outcomes(witness.deletes, witness.discards(), load.created)
    return {"deletes": len(witness.deletes), "discarded": len(o.latencies), "never_discarded": o.never,
            "reused_first": o.reused_first, "discard_reach": reach_share(o),
            "delete_discard_p50_s": percentile(o.latencies, 50), "delete_discard_p90_s": percentile(o.latencies, 90)}


def daemon_metrics(daemon: Daemon, cpu0: float, secs: float, first: dict) -> dict:
    """first: the daemon's status counters when the window began (where its loop's time went in the window)."""
    last = daemon.ask("status").get("counters") or {}
    res = {"daemon_cpu_pct": 100 * (daemon.cpu_s() - cpu0) / secs,
           "daemon_sys_pct": 100 * (daemon.sys_s() - daemon.sys0) / secs, "daemon_rss_mib": daemon.rss_max / MIB,
           "daemon_ready_s": daemon.ready_s, "stage_ms_per_tick": stage_ms(first, last),
           # the probe's events a second by kind (what the daemon's per-event work scales with)
           "events_per_s": {k.split(".", 1)[1]: round((n - first.get(k, 0)) / secs, 1) for k, n in last.items()
                            if k.startswith("events.")}}
    dec = daemon.explain()
    res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
    res["decisions_tail"] = dec[-6:]
    res["daemon_exit"] = daemon.stop(keep_log=os.environ.get("BENCH_KEEP_LOG", ""))
    res["daemon_log_tail"] = daemon.log()[-1200:]
    return res


def stage_ms(c0: dict, c1: dict) -> dict:
    """Each loop stage's wall and CPU milliseconds per tick between two counter sets ("between": the wait for the
    next tick, where the probe's ring events are taken)."""
    ticks = max(1, c1.get("ticks", 0) - c0.get("ticks", 0))
    stages = sorted(k.split(".", 1)[1] for k in c1 if k.startswith("tick_wall_ns."))
    return {s: [round((c1.get(f"tick_{w}_ns.{s}", 0) - c0.get(f"tick_{w}_ns.{s}", 0)) / 1e6 / ticks, 2)
                for w in ("wall", "cpu")] for s in stages}


def main() -> None:
    config, warmup, window = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    if config not in CONFIGS:
        raise SystemExit(f"unknown configuration {config!r}: one of {', '.join(CONFIGS)}")
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    tax = float(sys.argv[sys.argv.index("--cpu-tax-pct") + 1]) if "--cpu-tax-pct" in sys.argv else 0.0
    cache = int(os.environ.get("BENCH_CACHE_MB", "256")) * MIB
    witness = DiscardWitness(os.environ["LAB_CACHED_DEV"])
    set_cache_mode("writethrough")
    load = Load(random.Random(seed), cache // 3, witness)  # noqa: S311 - a reproducible workload, not a secret
    load.initial()
    log(f"live set: {len(load.long)} files, {load.live / MIB:.1f} MiB")
    daemon, busy = configure(config, tax)
    drop_caches()
    age, dirty_trace = DirtyAge(), DirtyTrace()
    t_start, w_start = time.monotonic(), origin_written()

    def row() -> dict:
        d = dirty_bytes()
        age.see(d)
        if daemon:
            daemon.sample()
        return {"origin_mib": (origin_written() - w_start) / MIB, "dirty_mib": d / MIB,
                "in_use_pct": cache_in_use_pct()}

    sampler = Sampler(row)
    sampler.start()
    load.run(warmup)
    hits = WorkloadHits(os.environ["LAB_CACHED_DEV"], os.getpid())
    a, ops0, load.recording = counters(), load.ops, True
    cpu0 = daemon.cpu_s() if daemon else (busy.cpu_s() if busy else 0.0)
    if daemon:
        daemon.sys0 = daemon.sys_s()
    first = (daemon.ask("status").get("counters") or {}) if daemon else {}
    spy = profile(daemon.proc.pid) if daemon else None
    load.run(window)
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
        spy.wait(timeout=60)
    b, load.recording = counters(), False
    res = {"config": config, "warmup_s": warmup, "seed": seed, "cpu_tax_pct": tax, "live_target_mib": cache / 3 / MIB,
           "mix": {"short_share": MIX.short_share, "short_min_s": MIX.short_min_s, "short_max_s": MIX.short_max_s},
           **window_metrics(load, a, b, load.ops - ops0), **hits.counts()}
    res["hit_ratio"] = res["hits"] / max(1, res["hits"] + res["misses"])
    if busy:
        res["cpu_tax_measured_pct"] = 100 * (busy.cpu_s() - cpu0) / res["window_s"]
        busy.stop()
    res["timeline"] = sampler.stop()  # before the daemon stops: the sampler reads its RSS
    if daemon:
        res.update(daemon_metrics(daemon, cpu0, res["window_s"], first))
    time.sleep(WITNESS_TAIL)
    events, overrun = dirty_trace.events()
    disc = [(t, "d", s + res["offset"], n) for t, s, n in witness.discards()]
    res.update(discard_metrics(load, witness))
    res.update({"exposure_max_dirty_mib": age.max_bytes / MIB, "exposure_dirty_since_clean_max_s": age.max_age_s,
                "exposure_oldest_dirty_s": oldest_dirty_age(events + disc, b["t"]), "dirty_trace_overrun": overrun,
                "dirty_trace_samples": dirty_trace.samples, "run_s": time.monotonic() - t_start})
    write_result("headline_fileserver", res)
    log(f"{config}: {res['ops_s']:.1f} ops/s, origin {res['origin_bytes_per_op'] / 1024:.1f} KiB/op, owed "
        f"{res['dirty_owed_mib']:.1f} MiB, hit {res['hit_ratio']:.3f}, fsync p99 {res['fsync_p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
