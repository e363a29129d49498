"""Guest: a fileserver-like load with a documented lifetime mix on the lab's dm-writecache volume, under one
configuration: dm-writecache's own age bound against cachepilot keeping the same bound on stock dm-writecache.

usage: wcfiles.py CONFIG SECONDS [--warmup S] [--threads N] [--seed N]
CONFIG: max-age (the table reloaded with `max_age` AGE_S * 1000 ms: dm-writecache writes back every block older than
that) | max-age-best (the same with `pause_writeback` 0 and ext4 -o discard: the best stock table arguments at the
same age bound, issue 31) | cp-default (the stock table, no max_age, + the daemon under the shipped default policy:
destructive, exposure <= 64 MiB / 30 s, discards of deleted files' extents after the journal commit that freed
them) | cp-age (the same without the byte bound: max_dirty 1 GiB; run by hand, not by the benchmark) |
stock:age=A,pause=P,wm=H/L,discard=0|1 (a point of the stock grid, issue 31: max_age A s (AGE_S if left out),
pause_writeback P ms, high/low watermarks H/L percent, ext4 -o discard or not).

Each of N threads (default 4) loops: create a file of 64-192 KiB, write it and fsync it (its data and the journal
commit reach the cache device); append 16 KiB to a live file; read another live file whole (page cache dropped
first); stat a third; in a share of the steps rewrite a live file whole and fsync it (a death by overwrite); delete
every file whose death time has come. Lifetimes are wall-clock seconds drawn at each file's birth (issue 31:
lifetimes.WallClockMix, the same mix as W1: no live-set target decides who dies, so a faster configuration does not
kill its data younger). S seconds of warm-up, then the window of SECONDS. Every second: dirty bytes (the cache's
used blocks: dm-writecache frees a block once written back) and the time since they last read 0.
Result: $LAB_OUT/wcfiles.json."""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)
from lifetimes import WallClockMix, oldest_dirty_age  # noqa: E402

from cachepilot.backends.dmstatus import parse_dm_writecache_status  # noqa: E402
from cachepilot.backends.writecache import WritecacheTable  # noqa: E402

AGE_S = 30  # the shipped default's exposure.max_age: the same bound on both sides
MIX = WallClockMix()  # W1's lifetime classes and overwrite share (lifetimes.py says where they come from)
APPEND = 16 * 1024
DM_ENV = {**os.environ, "DM_DISABLE_UDEV": "1"}


def dm(*args: str) -> str:
    return subprocess.run(["dmsetup", *args], capture_output=True, text=True, check=True, env=DM_ENV).stdout


def dirty() -> int:
    s = parse_dm_writecache_status(dm("status", g.DM_NAME))
    return s.used_blocks * 4096  # the lab's table: 4 KiB blocks


def set_table(max_age_ms: int, **args: int) -> None:
    """The table reloaded with max_age (a table argument only: no message changes it) and the other table arguments
    given (pause_writeback in ms, 0: write back at once; high/low_watermark in percent), then suspend + resume."""
    table = WritecacheTable.parse(dm("table", g.DM_NAME)).with_("max_age", str(max_age_ms))
    for key, value in args.items():
        table = table.with_(key, str(value))
    dm("reload", g.DM_NAME, "--table", table.line())
    dm("suspend", g.DM_NAME)
    dm("resume", g.DM_NAME)
    g.log(f"table now: {dm('table', g.DM_NAME).strip()}")


def stock_point(config: str) -> dict[str, int]:
    """``stock:age=15,pause=0,wm=25/20,discard=1`` -> {"age": 15, "pause": 0, "high": 25, "low": 20, "discard": 1}
    (``age`` AGE_S when left out); the named stock rows as the same. One line naming the problem otherwise."""
    named = {"max-age": "pause=3000,wm=50/45,discard=0", "max-age-best": "pause=0,wm=50/45,discard=1"}
    body = named.get(config, config.removeprefix("stock:"))
    usage = f"bad stock configuration {config!r}: expected stock:age=S,pause=MS,wm=H/L,discard=0|1"
    try:
        kv = dict(part.split("=", 1) for part in body.split(","))
        high, low = (int(x) for x in kv["wm"].split("/"))
        out = {"age": int(kv.get("age", AGE_S)), "pause": int(kv["pause"]), "high": high, "low": low,
               "discard": int(kv["discard"])}
    except (KeyError, ValueError):
        raise SystemExit(usage) from None
    if not {"pause", "wm", "discard"} <= set(kv) <= {"age", "pause", "wm", "discard"} or not 0 <= low <= high <= 100 \
            or out["discard"] not in (0, 1) or not 0 < out["age"] <= 3600:
        raise SystemExit(usage)
    return out


class Files:
    """Live files and their death times (wall clock, drawn at birth)."""

    def __init__(self, root: Path, rnd: random.Random) -> None:
        self.root, self.rnd, self.lock, self.n = root, rnd, threading.Lock(), 0
        self.live: list[Path] = []  # for uniform picks (swap-removed)
        self.where: dict[Path, int] = {}
        self.deaths: list[tuple[float, int, Path]] = []  # heap by death time
        self.overwrites = 0

    def create(self) -> tuple[Path, int]:
        with self.lock:
            self.n += 1
            return self.root / f"f{self.n:07d}", self.rnd.randrange(64, 193) * 1024

    def born(self, p: Path, now: float) -> list[Path]:
        """Book a new file with its death time; the files whose death time has come (taken off the live set)."""
        with self.lock:
            heapq.heappush(self.deaths, (now + MIX.draw(self.rnd), self.n, p))
            self.where[p] = len(self.live)
            self.live.append(p)
            due = []
            while self.deaths and self.deaths[0][0] <= now:
                q = heapq.heappop(self.deaths)[2]
                i = self.where.pop(q)
                last = self.live.pop()
                if last != q:
                    self.live[i], self.where[last] = last, i
                due.append(q)
            return due

    def pick(self) -> Path | None:
        with self.lock:
            return self.live[self.rnd.randrange(len(self.live))] if self.live else None

    def overwrite_size(self) -> int | None:
        """The new size of a live file rewritten whole in this step, or None (most steps)."""
        with self.lock:
            return self.rnd.randrange(64, 193) * 1024 if self.rnd.random() < MIX.overwrite_share else None


def op(files: Files, data: bytes) -> list[Path]:
    """One iteration; the files it deleted."""
    p, size = files.create()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data[:size])
        os.fsync(fd)
    finally:
        os.close(fd)
    due = files.born(p, time.monotonic())
    try:
        if (a := files.pick()) is not None:
            fd = os.open(a, os.O_WRONLY | os.O_APPEND)  # no O_CREAT: a file deleted meanwhile stays deleted
            try:
                os.write(fd, data[:APPEND])
            finally:
                os.close(fd)
        if (r := files.pick()) is not None:
            g.read_whole(r, missing_ok=True)
        if (st := files.pick()) is not None:
            st.stat()
        if (new_size := files.overwrite_size()) is not None and (w := files.pick()) is not None:
            _overwrite(w, data[:new_size])
            files.overwrites += 1
    except FileNotFoundError:
        pass  # another thread deleted it meanwhile
    for q in due:
        q.unlink(missing_ok=True)
    return due


def _overwrite(p: Path, data: bytes) -> None:
    """A live file rewritten whole and fsync'ed (its old blocks die at the truncate)."""
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)  # no O_CREAT: a file deleted meanwhile stays deleted
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def worker(files: Files, seed: int, span: tuple[float, float], ops: list[int]) -> None:
    data = random.Random(seed).randbytes(192 * 1024)  # noqa: S311 - a reproducible workload
    n = 0
    while (now := time.monotonic()) < span[1]:
        op(files, data)
        n += now >= span[0]
    ops.append(n)


class Exposure:
    """Dirty bytes every second and the time since they last read 0 (polled every 100 ms in between)."""

    def __init__(self) -> None:
        self.last_clean, self.w0 = time.monotonic(), g.origin_written()
        self.stopped = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.stopped.wait(0.1):
            if dirty() == 0:
                self.last_clean = time.monotonic()

    def __call__(self) -> dict:
        d, now = dirty(), time.monotonic()
        if d == 0:
            self.last_clean = now
        return {"dirty_mib": d / g.MIB, "age_s": round(now - self.last_clean, 2),
                "origin_mib": (g.origin_written() - self.w0) / g.MIB}


def arg(name: str, default: float) -> float:
    return float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def policy(config: str) -> Path:
    """The shipped default; for cp-age a copy without its byte bound (max_dirty 1 GiB, more than the cache): the
    age bound alone, as stock max_age has it."""
    if config != "cp-age":
        return g.ROOT / "policies" / "default.yaml"
    return g.shipped_variant("max_dirty: 64MiB", "max_dirty: 1GiB")


def main() -> None:
    with contextlib.ExitStack() as traces:  # every trace instance removed, however the run ends
        measure(traces)


def measure(traces: contextlib.ExitStack) -> None:
    config, seconds = sys.argv[1], float(sys.argv[2])
    warmup, nthreads, seed = arg("--warmup", 0.0), int(arg("--threads", 4)), int(arg("--seed", 1))
    if config in ("max-age", "max-age-best") or config.startswith("stock:"):
        pt = stock_point(config)
        set_table(pt["age"] * 1000, pause_writeback=pt["pause"], high_watermark=pt["high"], low_watermark=pt["low"])
        if pt["discard"]:
            # dm-writecache drops dirty blocks a discard covers: what the daemon's FITRIM gets, from ext4 itself
            subprocess.run(["mount", "-o", "remount,discard", str(g.MNT)], check=True)
    elif not config.startswith("cp-"):
        raise SystemExit(f"unknown configuration {config!r}")
    dm("message", g.DM_NAME, "0", "flush")  # what mkfs and the mount left: every run starts clean
    if not g.wait(lambda: dirty() == 0, 120, 0.5):
        raise SystemExit(f"still {dirty()} dirty bytes after the flush")
    # the witness: the age of the oldest dirty block from the bios on the volume and its origin (W1 reads bcache's
    # own events; dm-writecache has none)
    vol = os.stat(g.MNT).st_dev
    trace = traces.enter_context(g.BioTrace(f"{os.major(vol)}:{os.minor(vol)}",
                                          WritecacheTable.parse(dm("table", g.DM_NAME)).head[4]))
    root = g.MNT / "fs"
    root.mkdir()
    files = Files(root, random.Random(seed))  # noqa: S311
    daemon = g.Daemon([policy(config)]) if config.startswith("cp-") else None
    exposure = Exposure()
    sampler = g.Sampler(exposure)
    sampler.start()
    ops: list[int] = []
    t0 = time.monotonic() + warmup
    threads = [threading.Thread(target=worker, args=(files, seed * 100 + i, (t0, t0 + seconds), ops))
               for i in range(nthreads)]
    elapsed, origin, cpu0 = g.run_window(threads, t0, warmup, daemon)
    rows = sampler.stop()
    exposure.stopped.set()
    events, overrun = trace.events()
    oldest = oldest_dirty_age(events, time.monotonic())
    window = [r for r in rows if r["t"] >= warmup]
    res = {
        "config": config, "seconds": elapsed, "warmup_s": warmup, "threads": nthreads, "age_bound_s": AGE_S,
        "ops": sum(ops), "ops_s": sum(ops) / elapsed, "origin_written_mib": origin,
        "origin_mib_per_kop": 1000 * origin / max(1, sum(ops)), "dirty_owed_mib": dirty() / g.MIB,
        "max_dirty_mib": max((r["dirty_mib"] for r in window), default=0.0),
        "max_age_s": max((r["age_s"] for r in window), default=0.0), "overwrites": files.overwrites,
        "dirty_p50_mib": g.percentile([r["dirty_mib"] for r in window], 50), "timeline": rows,
        "table": dm("table", g.DM_NAME).strip(),
    }
    # the stock grid judges a point by the same witness names as W1's (stockgrid.within_bound)
    res.update({"exposure_max_dirty_mib": res["max_dirty_mib"], "exposure_oldest_dirty_s": oldest,
                "dirty_trace_overrun": overrun, "dirty_trace_events": len(events)})
    if daemon:
        daemon.sample()
        res["daemon_cpu_pct"] = 100 * (daemon.cpu_s() - cpu0) / elapsed
        res["daemon_rss_mib"] = daemon.rss_max / g.MIB
        dec = daemon.explain()
        res["decisions"] = {k: sum(1 for x in dec if x["kind"] == k) for k in {x["kind"] for x in dec}}
        res["daemon_exit"] = daemon.stop(keep_log="wcfiles")
    g.write_result("wcfiles", res)
    g.log(f"{config}: {res['ops_s']:.1f} ops/s, origin {origin:.1f} MiB, owed {res['dirty_owed_mib']:.1f} MiB, "
        f"max dirty {res['max_dirty_mib']:.1f} MiB")


if __name__ == "__main__":
    main()
