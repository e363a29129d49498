"""Guest: the headline fileserver (W1) on bcache under one configuration.

usage: headline_fileserver.py CONFIG WARMUP_S WINDOW_S [--seed N] [--cpu-tax-pct P] [--burst S]
CONFIG: wt (stock write-through) | wb (stock write-back, defaults) | discard (wb + ext4 -o discard) | tuned (discard +
writeback_percent 40) | stock:wp=P,wd=D,discard=0|1 (stock write-back with writeback_percent P, writeback_delay D,
ext4 -o discard or not: the grid's points) | cp-destructive (the daemon, shipped default policy) | cp-recoverable
(the same with failure_model: recoverable) | cp-paced (the shipped default with exposure.pace: true) | cpu-tax (wb +
a busy loop taking P % of the vCPU).

The initial live file set (a third of the cache, files of 64-192 KiB) is written in writethrough, the cache goes to
the configuration's mode and settles (dirty 0, clean), then the loop runs WARMUP_S (not measured) and WINDOW_S
(measured). Each iteration: create and write a whole file and fsync it, its death time drawn at its birth in
wall-clock seconds (lifetimes.WallClockMix: no live-set target decides who dies, so no configuration kills its data
younger by being faster), append 16 KiB to a live file, in a stated share of the iterations overwrite a live file
whole and fsync it (deaths by overwrite), read a live file whole (its pages dropped first), stat one, delete the
files whose time has come. With --burst S, a burst phase follows the window: S seconds of 1 MiB fsync'ed writes as
fast as the volume takes them (writes outrun any write-back), its exposure witnessed apart (burst_*).
Result: $LAB_OUT/headline_fileserver.json."""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)
from lifetimes import WallClockMix, discard_outcomes, oldest_dirty_age, reach_share  # noqa: E402
from soak import profile  # noqa: E402 - with $SOAK_PYSPY: a py-spy profile of the daemon over the window

CONFIGS = ("wt", "wb", "discard", "tuned", "cp-destructive", "cp-recoverable", "cp-paced", "cpu-tax")
MIX = WallClockMix()  # docs/benchmarks.md: W1, the lifetime mix
APPEND = 16 * 1024
LIVE_CAP = 1 << 30  # a safety cap on the live set (the 2 GiB origin); deaths by it are counted (capped_deaths)
BURST_CHUNK = 1 << 20


def stock_knobs(config: str) -> dict[str, int]:
    """``stock:wp=0,wd=10,discard=1`` -> {"wp": 0, "wd": 10, "discard": 1}; the named stock rows as the same."""
    named = {"wb": "", "discard": "discard=1", "tuned": "wp=40,discard=1"}
    body = named[config] if config in named else config.removeprefix("stock:")
    out: dict[str, int] = {}
    for word in filter(None, body.split(",")):
        k, sep, v = word.partition("=")
        if not sep or k not in ("wp", "wd", "discard") or not v.isdigit():
            raise SystemExit(f"bad stock configuration {config!r}: expected stock:wp=N,wd=N,discard=0|1")
        out[k] = int(v)
    return out


def valid(config: str) -> bool:
    return config in CONFIGS or config.startswith("stock:")
WITNESS_TAIL = 3.0  # seconds after the window for the last deletes' discards (not measured otherwise)
BURST_TAIL_S = 40.0  # after a burst: how long the witness waits for the cache to read clean


def recoverable_policy() -> Path:
    text = (g.ROOT / "policies" / "default.yaml").read_text().replace("failure_model: destructive",
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

    def __init__(self, rnd: random.Random, target: int, witness: g.DiscardWitness) -> None:
        self.d = g.MNT / "fs"
        self.d.mkdir()
        self.rnd, self.target, self.witness = rnd, target, witness
        self.files: list[Path] = []  # the live files, for uniform picks (swap-removed)
        self.where: dict[Path, int] = {}
        self.deaths: list[tuple[float, int, Path]] = []  # heap by death time
        self.born: dict[Path, float] = {}
        self.size: dict[Path, int] = {}
        self.n, self.live = 0, 0
        self.created: list[tuple[float, list[tuple[int, int]]]] = []
        self.fsync_ms: list[float] = []
        self.fsync_at: list[tuple[float, float]] = []  # (monotonic time, ms): the per-fsync trace
        self.read_ms: list[float] = []
        self.lifetimes: list[float] = []  # age at death of files born in the run
        self.overwrites, self.capped = 0, 0
        self.ops, self.recording = 0, False

    def _write(self, p: Path, size: int, sync: bool, flags: int = os.O_CREAT | os.O_TRUNC) -> None:
        fd = os.open(p, os.O_WRONLY | flags, 0o644)
        try:
            os.write(fd, self.rnd.randbytes(size))
            t = time.perf_counter()
            if sync:
                os.fsync(fd)
                if self.recording:
                    ms = (time.perf_counter() - t) * 1e3
                    self.fsync_ms.append(ms)
                    self.fsync_at.append((time.monotonic(), ms))
        finally:
            os.close(fd)

    def _new(self, sync: bool, born: float, life: float) -> Path:
        p = self.d / f"f{self.n:07d}"
        self.n += 1
        size = self.rnd.randrange(64, 193) * 1024
        self._write(p, size, sync)
        self.size[p] = size
        self.live += size
        self.where[p] = len(self.files)
        self.files.append(p)
        self.born[p] = born
        heapq.heappush(self.deaths, (time.monotonic() + life, self.n, p))
        return p

    def initial(self) -> None:
        """The initial set up to the target, in writethrough (clean), born long ago: its death times are drawn from
        the longest class (their ages are unknown)."""
        _, lo, hi = MIX.classes[-1]
        while self.live < self.target:
            self._new(False, float("-inf"), math.exp(self.rnd.uniform(math.log(lo), math.log(hi))))
        os.sync()

    def _delete(self, p: Path) -> None:
        if self.recording:
            self.witness.deleting(p)
            if self.born[p] != float("-inf"):
                self.lifetimes.append(time.monotonic() - self.born[p])
        os.unlink(p)
        self.live -= self.size.pop(p)
        del self.born[p]
        i = self.where.pop(p)
        last = self.files.pop()
        if last != p:
            self.files[i], self.where[last] = last, i
        self.ops += 1

    def _pick(self) -> Path:
        return self.files[self.rnd.randrange(len(self.files))]

    def _overwrite(self) -> None:
        """A live file rewritten whole: its old blocks die (ext4 frees them at the truncate), new ones are written."""
        p = self._pick()
        if self.recording:
            self.witness.deleting(p)
        size = self.size[p]
        self._write(p, size, True)
        self.overwrites += self.recording
        self.ops += 1

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
        p = self._new(True, now, MIX.draw(self.rnd))
        self.created.append((now, extents(p)))
        tgt = self._pick()
        with open(tgt, "ab") as f:
            f.write(self.rnd.randbytes(APPEND))
        self.size[tgt] += APPEND
        self.live += APPEND
        if self.rnd.random() < MIX.overwrite_share:
            self._overwrite()
            self.created.append((time.monotonic(), extents(tgt)))
        self._read(self._pick())
        os.stat(self._pick())
        self.ops += 4
        while self.deaths and (self.deaths[0][0] <= now or self.live > LIVE_CAP):
            due, _, old = heapq.heappop(self.deaths)
            self.capped += due > now  # died by the safety cap, before its time
            self._delete(old)

    def burst(self, seconds: float) -> tuple[int, float]:
        """Writes outrunning any write-back: 1 MiB fsync'ed appends to one file for ``seconds``; (bytes, s)."""
        p = self.d / "burst"
        t0, n = time.monotonic(), 0
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = self.rnd.randbytes(BURST_CHUNK)
            while time.monotonic() - t0 < seconds:
                os.write(fd, chunk)
                os.fsync(fd)
                n += BURST_CHUNK
        finally:
            os.close(fd)
        return n, time.monotonic() - t0

    def run(self, seconds: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            self.step()
        return time.monotonic() - t0


def configure(config: str, tax_pct: float) -> tuple[g.Daemon | None, g.CpuTax | None]:
    """The configuration's mode and knobs on a settled (clean) cache, then its daemon or busy loop."""
    g.set_cache_mode("writethrough" if config == "wt" else "writeback")
    # every configuration: no congestion bypass. Under TCG the emulated cache device answers in milliseconds, over
    # bcache's 2 ms read / 20 ms write congestion thresholds, so stock bcache sent most of the workload's I/O
    # around the cache (301 of its requests in a 25 s development window); a real SSD answers in ~0.1 ms
    cset = Path(os.environ["LAB_BCACHE_CSET"])
    for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
        (cset / knob).write_text("0")
    g.settle_clean()
    knobs = stock_knobs(config) if config in ("wb", "discard", "tuned") or config.startswith("stock:") else {}
    if knobs.get("discard"):
        subprocess.run(["mount", "-o", "remount,discard", str(g.MNT)], check=True)
    for key, knob in (("wp", "writeback_percent"), ("wd", "writeback_delay")):
        if key in knobs:
            (g.BCACHE / knob).write_text(str(knobs[key]))
    if config.startswith("cp-"):
        pol = {"cp-destructive": lambda: g.ROOT / "policies" / "default.yaml", "cp-recoverable": recoverable_policy,
               "cp-paced": lambda: g.shipped_variant("max_age: 30s", "max_age: 30s\n    pace: true")}[config]()
        return g.Daemon([pol]), None
    return None, (g.CpuTax(tax_pct) if config == "cpu-tax" else None)


def counters() -> dict:
    return {"t": time.monotonic(), "origin": g.origin_written(), "ticks": g.origin_io_ticks_ms(),
            "dirty": g.dirty_bytes()}


def window_metrics(load: Load, a: dict, b: dict, ops: int) -> dict:
    secs = b["t"] - a["t"]
    return {
        "window_s": secs, "ops": ops, "ops_s": ops / secs,
        "origin_window_mib": (b["origin"] - a["origin"]) / g.MIB,
        "origin_bytes_per_op": (b["origin"] - a["origin"]) / ops,
        "dirty_owed_mib": b["dirty"] / g.MIB,
        "debt_bytes_per_op": (b["origin"] - a["origin"] + b["dirty"] - a["dirty"]) / ops,
        "origin_busy_ms_per_op": (b["ticks"] - a["ticks"]) / ops,
        "origin_busy_pct": 100 * (b["ticks"] - a["ticks"]) / 1e3 / secs,
        "fsync_p50_ms": g.percentile(load.fsync_ms, 50), "fsync_p99_ms": g.percentile(load.fsync_ms, 99),
        "read_p50_ms": g.percentile(load.read_ms, 50), "read_p99_ms": g.percentile(load.read_ms, 99),
        "lifetime_p50_s": g.percentile(load.lifetimes, 50), "lifetime_p90_s": g.percentile(load.lifetimes, 90),
        "overwrites": load.overwrites, "capped_deaths": load.capped,
        "fsync_trace": [(round(t - a["t"], 3), round(ms, 2)) for t, ms in load.fsync_at],
    }


def discard_metrics(load: Load, witness: g.DiscardWitness) -> dict:
    o = discard_outcomes(witness.deletes, witness.discards(), load.created)
    return {"deletes": len(witness.deletes), "discarded": len(o.latencies), "never_discarded": o.never,
            "reused_first": o.reused_first, "discard_reach": reach_share(o),
            "delete_discard_p50_s": g.percentile(o.latencies, 50),
            "delete_discard_p90_s": g.percentile(o.latencies, 90)}


def window_end(daemon: g.Daemon) -> tuple[float, float, dict]:
    """The daemon's CPU, system CPU and status counters when the window ends (a burst phase may follow)."""
    return daemon.cpu_s(), daemon.sys_s(), daemon.ask("status").get("counters") or {}


def daemon_metrics(daemon: g.Daemon, cpu0: float, secs: float, first: dict, end: tuple[float, float, dict],
                   wall0: float) -> dict:
    """first: the daemon's status counters when the window began (where its loop's time went in the window); end:
    window_end(); wall0: the wall-clock time the window began (the decision log's clock), so that drains and
    switches line up with the per-fsync trace (its times are from the window's start too)."""
    cpu1, sys1, last = end
    res = {"daemon_cpu_pct": 100 * (cpu1 - cpu0) / secs,
           "daemon_sys_pct": 100 * (sys1 - daemon.sys0) / secs, "daemon_rss_mib": daemon.rss_max / g.MIB,
           "daemon_ready_s": daemon.ready_s, "stage_ms_per_tick": stage_ms(first, last),
           # the probe's events a second by kind (what the daemon's per-event work scales with)
           "events_per_s": {k.split(".", 1)[1]: round((n - first.get(k, 0)) / secs, 1) for k, n in last.items()
                            if k.startswith("events.")}}
    dec = daemon.explain()
    res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
    res["control_trace"] = [(round(x["ts"] - wall0, 2), x["kind"], x["status"], (x.get("action") or "")[:80])
                            for x in dec if x["kind"] in ("drain", "set_write_policy")]
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


def burst_phase(load: Load, age: g.DirtyAge, seconds: float) -> dict:
    """The burst after the window, witnessed apart: the dirty data and its age from the burst's start until the
    cache reads clean or BURST_TAIL_S after it (the sampler's DirtyAge, restarted for the phase)."""
    age.restart()
    t0 = time.monotonic()
    nbytes, took = load.burst(seconds)
    end = time.monotonic() + BURST_TAIL_S
    while time.monotonic() < end and g.dirty_bytes() > 0:
        time.sleep(0.5)
    return {"burst_s": took, "burst_mib": nbytes / g.MIB, "burst_mib_s": nbytes / g.MIB / max(took, 1e-9),
            "burst_max_dirty_mib": age.max_bytes / g.MIB, "burst_dirty_since_clean_max_s": age.max_age_s,
            "burst_phase_s": time.monotonic() - t0}


def main() -> None:
    with contextlib.ExitStack() as traces:  # every trace instance removed, however the run ends
        measure(traces)


def measure(traces: contextlib.ExitStack) -> None:
    config, warmup, window = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    if not valid(config):
        raise SystemExit(f"unknown configuration {config!r}: one of {', '.join(CONFIGS)} or"
                         " stock:wp=N,wd=N,discard=0|1")
    if config.startswith("stock:"):
        stock_knobs(config)  # refused before any set-up
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    burst_s = float(sys.argv[sys.argv.index("--burst") + 1]) if "--burst" in sys.argv else 0.0
    tax = float(sys.argv[sys.argv.index("--cpu-tax-pct") + 1]) if "--cpu-tax-pct" in sys.argv else 0.0
    cache = int(os.environ.get("BENCH_CACHE_MB", "256")) * g.MIB
    witness = traces.enter_context(g.DiscardWitness(os.environ["LAB_CACHED_DEV"]))
    g.set_cache_mode("writethrough")
    load = Load(random.Random(seed), cache // 3, witness)  # noqa: S311 - a reproducible workload, not a secret
    load.initial()
    g.log(f"live set: {len(load.files)} files, {load.live / g.MIB:.1f} MiB")
    daemon, busy = configure(config, tax)
    g.drop_caches()
    age, dirty_trace = g.DirtyAge(), traces.enter_context(g.DirtyTrace())
    t_start, w_start = time.monotonic(), g.origin_written()

    def row() -> dict:
        d = g.dirty_bytes()
        age.see(d)
        if daemon:
            daemon.sample()
        return {"origin_mib": (g.origin_written() - w_start) / g.MIB, "dirty_mib": d / g.MIB,
                "in_use_pct": g.cache_in_use_pct()}

    sampler = g.Sampler(row)
    sampler.start()
    load.run(warmup)
    hits = traces.enter_context(g.WorkloadHits(os.environ["LAB_CACHED_DEV"], os.getpid()))
    a, ops0, load.recording = counters(), load.ops, True
    wall0 = time.time() - (time.monotonic() - a["t"])
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
    window_age = (age.max_bytes, age.max_age_s)
    end = window_end(daemon) if daemon else None
    tax_cpu1 = busy.cpu_s() if busy else 0.0
    res = {"config": config, "warmup_s": warmup, "seed": seed, "cpu_tax_pct": tax,
           "initial_live_mib": cache / 3 / g.MIB,
           "live_end_mib": load.live / g.MIB,
           "mix": {"classes": MIX.classes, "overwrite_share": MIX.overwrite_share},
           **window_metrics(load, a, b, load.ops - ops0), **hits.counts()}
    res["hit_ratio"] = res["hits"] / max(1, res["hits"] + res["misses"])
    if burst_s > 0:
        res.update(burst_phase(load, age, burst_s))
    if busy:
        res["cpu_tax_measured_pct"] = 100 * (tax_cpu1 - cpu0) / res["window_s"]
        busy.stop()
    res["timeline"] = sampler.stop()  # before the daemon stops: the sampler reads its RSS
    if daemon and end is not None:
        res.update(daemon_metrics(daemon, cpu0, res["window_s"], first, end, wall0))
    time.sleep(WITNESS_TAIL)
    events, overrun = dirty_trace.events()
    disc = [(t, "d", s + res["offset"], n) for t, s, n in witness.discards()]
    res.update(discard_metrics(load, witness))
    in_window = [e for e in events + disc if e[0] <= b["t"]]
    if burst_s > 0:
        res["burst_oldest_dirty_s"] = oldest_dirty_age(events + disc, b["t"] + res["burst_phase_s"])
    res.update({"exposure_max_dirty_mib": window_age[0] / g.MIB, "exposure_dirty_since_clean_max_s": window_age[1],
                "exposure_oldest_dirty_s": oldest_dirty_age(in_window, b["t"]), "dirty_trace_overrun": overrun,
                "dirty_trace_samples": dirty_trace.samples, "run_s": time.monotonic() - t_start})
    g.write_result("headline_fileserver", res)
    g.log(f"{config}: {res['ops_s']:.1f} ops/s, origin {res['origin_bytes_per_op'] / 1024:.1f} KiB/op, owed "
        f"{res['dirty_owed_mib']:.1f} MiB, hit {res['hit_ratio']:.3f}, fsync p99 {res['fsync_p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
