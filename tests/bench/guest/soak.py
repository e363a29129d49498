"""Guest: the soak. The daemon (shipped default policy) on the lab's bcache write-back volume over a dm-delay origin,
under a fileserver-shaped load, for SECONDS, with a SIGHUP every minute, one cache-device error and one removal and
re-adding of the volume.

usage: soak.py SECONDS [--seed N]

The load (one thread): create a file of 64-192 KiB and fsync it (acknowledged: its SHA-256 is recorded only once
the fsync returned), append 16 KiB to another and fsync it, read a third whole and check it against its record
(page cache dropped first, so the read reaches the volume), delete a fourth once the file set is 1.25x the cache,
stat a fifth. A write that fails is not acknowledged; a file whose append failed is no longer checked (its
content is undefined), and both are counted.

Disruptions, in this order (the order is a choice; see docs/benchmarks.md, "Soak"):
- at 40%: a cache-device error. The load stops and the daemon drains the dirty data (the shipped policy's
  exposure bound, max_age 30 s) — with dirty data on it a failing cache loses acknowledged writes by definition,
  and bcache then stops the volume (stop_when_cache_set_failed=auto). Then the cache device's dm table becomes
  dm-error (tests/vm/guest/lab-fail-cache, as test_fault_lab does), reads provoke the errors, the daemon must
  latch the volume out of write-back (status: latched), and the load resumes on the volume, now without a
  working cache.
- at 70%: the volume is removed and re-added, which also replaces the failed cache: the load stops, the file
  system is unmounted, the bcache device stopped and its cache set unregistered; a rescan later the cache device
  is healthy again, gets a fresh cache set (make-bcache -C), the backing device is registered and attached to it,
  set to write-back as the lab's recipe does, mounted, and the load resumes.
Every 60 s (own thread) SIGHUP; a reload counts as ok when the daemon's `reloads` counter rises within 20 s and
`reloads_failed` does not. Every 10 s: the daemon's VmRSS, its tick-duration histogram (/metrics) and its
last tick (status). At the end: SIGTERM, every acknowledged undeleted file checked, the daemon log grepped for
"Traceback". Result: $LAB_OUT/soak.json, and the same JSON on stdout; the daemon's log in $LAB_OUT/soak-daemon.log."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as g  # noqa: E402  (g.X: the lab benchmarks' guest helpers, common.py)

CACHE_DEV = os.environ.get("LAB_CACHE_DEV", "/dev/mapper/lab-cache")
ORIGIN_DEV = os.environ.get("LAB_ORIGIN_DEV", "/dev/mapper/lab-origin")
HUP_EVERY = 60.0
SAMPLE_EVERY = 10.0
CLEAN_WAIT = 120.0  # the daemon drains once per max_age (30 s); this is the bound on waiting for it
TICK_METRIC = "cachepilot_tick_duration_seconds"
METRICS = "127.0.0.1:9854"  # the shipped default listener


def bcache_sysfs() -> Path | None:
    """The cached volume's bcache directory (its name can change when it is re-added), or None."""
    found = sorted(Path("/sys/block").glob("bcache*/bcache"))
    return found[0] if found else None


def dirty() -> int:
    s = bcache_sysfs()
    return g.parse_size((s / "dirty_data").read_text()) if s else 0


def clean() -> bool:
    """No dirty byte, and the backing device's superblock says clean: bcache's dirty_data reaches 0 before its
    write-back thread's next pass clears ``has_dirty`` (``state`` then reads clean), and a cache set that fails
    while it is set stops the volume ("stop_when_cache_set_failed ... is auto and cache is dirty, stop it"): a
    6-minute soak hit that 1.6 s after dirty_data read 0, and the latch, the re-add and the file check all failed."""
    s = bcache_sysfs()
    return s is None or (dirty() == 0 and (s / "state").read_text().strip() == "clean")


def cache_state() -> str:
    """The bcache volume's cache mode, 'detached' once it has no cache set, 'gone' without a bcache device."""
    s = bcache_sysfs()
    if s is None:
        return "gone"
    if not (s / "cache").exists():
        return "detached"
    return (s / "cache_mode").read_text().split("[")[1].split("]")[0]


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


class Load:
    """The fileserver-shaped load and its record of acknowledged files; start()/stop() may be called repeatedly."""

    def __init__(self, d: Path, target_bytes: int, seed: int) -> None:
        self.d, self.target = d, target_bytes
        self.rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
        self.files: dict[str, tuple[hashlib._Hash, int]] = {}  # name -> (SHA-256 so far, size), acknowledged
        self.total = self.next = self.ops = self.deleted = self.unacked = self.dropped = 0
        self.bad_live: list[str] = []
        self.errors: dict[str, int] = {}
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.stopping.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()
        self.thread = None

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except OSError as exc:  # an error is allowed (that write is not acknowledged); losing acked data is not
                key = exc.strerror or type(exc).__name__
                self.errors[key] = self.errors.get(key, 0) + 1
                time.sleep(0.2)

    def _pick(self) -> str:
        return self.rnd.choice(list(self.files))

    def step(self) -> None:
        self.create()
        if self.files:
            self.append(self._pick())
            self.verify(self._pick(), live=True)
            while self.total > self.target and len(self.files) > 1:
                self.delete(self._pick())
            os.stat(self.d / self._pick())
        self.ops += 5

    def create(self) -> None:
        name = f"f{self.next:07d}"
        self.next += 1
        data = self.rnd.randbytes(self.rnd.randrange(64, 193) * 1024)
        try:
            self._write(name, data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError:
            self.unacked += 1
            raise
        self.files[name] = (hashlib.sha256(data), len(data))
        self.total += len(data)

    def append(self, name: str) -> None:
        h, size = self.files[name]
        if size >= 256 * 1024:
            return
        data = self.rnd.randbytes(16 * 1024)
        try:
            self._write(name, data, os.O_WRONLY | os.O_APPEND)
        except OSError:
            del self.files[name]  # neither the old nor the new content is promised any more
            self.total -= size
            self.dropped += 1
            raise
        h.update(data)
        self.files[name] = (h, size + len(data))
        self.total += len(data)

    def _write(self, name: str, data: bytes, flags: int) -> None:
        fd = os.open(self.d / name, flags, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        os.unlink(self.d / name)
        self.total -= self.files.pop(name)[1]
        self.deleted += 1

    def verify(self, name: str, live: bool = False) -> bool:
        """Read the whole file from the volume (its cached pages dropped first) and compare it with the record."""
        fd = os.open(self.d / name, os.O_RDONLY | os.O_NOATIME)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            h = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        ok = h.hexdigest() == self.files[name][0].hexdigest()
        if not ok and live:
            self.bad_live.append(name)
        return ok

    def check_all(self) -> list[str]:
        g.drop_caches()
        bad = []
        for name in sorted(self.files):
            try:
                if not self.verify(name):
                    bad.append(name)
            except OSError as exc:
                bad.append(f"{name}: {exc.strerror}")
        return bad


class Soak:
    def __init__(self, seconds: float, seed: int) -> None:
        self.seconds = seconds
        self.events: list[dict] = []
        cache_bytes = int(os.environ.get("BENCH_CACHE_MB", "64")) * g.MIB
        (g.MNT / "soak").mkdir()
        self.load = Load(g.MNT / "soak", cache_bytes * 5 // 4, seed)
        # the shipped configuration's exporter: HTTP on loopback, rendered only when scraped (a textfile would be
        # rendered on the loop thread every tick, and lengthen the ticks this run measures)
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        self.daemon = g.Daemon([g.ROOT / "policies" / "default.yaml"], metrics_listen=METRICS)
        self.t0 = time.monotonic()  # the run's clock starts with the daemon ready
        self.profiler = profile(self.daemon.proc.pid)
        self.hups_sent = self.hups_ok = 0
        self.hup_failures: list[str] = []
        self.done = threading.Event()
        self.failed: str | None = None  # a disruption that could not be carried out

    def event(self, what: str, **extra: object) -> None:
        row = {"t": round(time.monotonic() - self.t0, 1), "event": what, **extra}
        self.events.append(row)
        g.log(json.dumps(row))

    def status(self) -> dict:
        try:
            return self.daemon.ask("status")
        except (OSError, ValueError, KeyError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

    def volume_status(self) -> dict:
        vols = self.status().get("volumes") or [{}]
        return {k: vols[0].get(k) for k in ("name", "mode", "latched", "latch_reason", "health", "dirty_bytes")}

    # ------------------------------------------------------------------ samples
    def sample(self) -> dict:
        row: dict[str, object] = {"rss_kib": self.rss_kib(), "acked_files": len(self.load.files),
                                  "ops": self.load.ops}
        try:  # the volume can be half-gone while it is removed
            row.update(dirty_mib=round(dirty() / g.MIB, 2), cache=cache_state())
        except OSError as exc:
            row["cache"] = f"unreadable: {exc.strerror}"
        row.update(tick_histogram(scrape()))
        st = self.status()
        vol = (st.get("volumes") or [{}])[0]
        row.update(mode=vol.get("mode"), latched=vol.get("latched"), counters=st.get("counters"))
        try:
            row["daemon_cpu_s"] = round(self.daemon.cpu_s(), 2)  # against the wall time: a slow tick starved?
        except OSError:
            pass
        last = st.get("last_tick") or {}
        row["last_tick_s"] = last.get("duration_s")
        row["ticks_skipped"] = last.get("skipped")
        return row

    def rss_kib(self) -> int | None:
        try:
            return self.daemon.rss() // 1024
        except OSError:
            return None

    # ------------------------------------------------------------------ SIGHUP
    def hupper(self) -> None:
        while not self.done.wait(HUP_EVERY):
            before = (self.status().get("counters") or {})
            self.daemon.proc.send_signal(signal.SIGHUP)
            self.hups_sent += 1
            ok = g.wait(lambda b=before: self._reloaded(b), 20, 0.5)
            self.hups_ok += ok
            if not ok:
                self.hup_failures.append(f"t={time.monotonic() - self.t0:.0f}: {self.status().get('counters')}")

    def _reloaded(self, before: dict) -> bool:
        now = self.status().get("counters") or {}
        return (now.get("reloads", 0) > before.get("reloads", 0)
                and now.get("reloads_failed", 0) == before.get("reloads_failed", 0))

    # ------------------------------------------------------------------ disruptions
    def until(self, frac: float) -> None:
        self.done.wait(max(0.0, self.t0 + frac * self.seconds - time.monotonic()))

    def cache_error(self) -> None:
        self.load.stop()
        os.sync()
        self.event("load stopped for the cache error", dirty_mib=round(dirty() / g.MIB, 2))
        ok = g.wait(clean, CLEAN_WAIT, 0.5)
        self.event("clean" if ok else f"still dirty after {CLEAN_WAIT:.0f} s", dirty_mib=round(dirty() / g.MIB, 2),
                   **self.volume_status())
        run("lab-fail-cache", "error")
        self.event("cache device now dm-error")
        latched = g.wait(self._provoke_and_latched, 90, 0.5)
        out = g.wait(lambda: cache_state() in ("writethrough", "none", "detached", "gone"), 60, 0.5)
        self.event("latched" if latched else "NOT latched within 90 s", cache=cache_state(), out_of_writeback=out,
                   **self.volume_status())
        self.load.start()
        self.event("load resumed", cache=cache_state())

    def _provoke_and_latched(self) -> bool:
        """Read a few acknowledged files (the reads reach the failing cache; bcache recovers clean data from the
        origin); whether the daemon has latched the volume."""
        for name in list(self.load.files)[:4]:
            try:
                self.load.verify(name, live=True)
            except OSError as exc:
                self.load.errors[f"read: {exc.strerror}"] = self.load.errors.get(f"read: {exc.strerror}", 0) + 1
        return bool(self.volume_status().get("latched"))

    def remove_volume(self) -> None:
        self.load.stop()
        os.sync()
        run("umount", str(g.MNT))
        s = bcache_sysfs()
        if s is not None:
            (s / "stop").write_text("1")
        for cset in Path("/sys/fs/bcache").glob("*-*-*-*-*"):
            try:
                (cset / "unregister").write_text("1")
            except OSError as exc:  # a failed set may be going away on its own
                self.event(f"unregister {cset.name}: {exc.strerror}")
        gone = g.wait(lambda: bcache_sysfs() is None and not list(Path("/sys/fs/bcache").glob("*-*-*-*-*")), 60, 0.5)
        self.event("volume removed" if gone else "volume NOT removed within 60 s", **self.volume_status())

    def readd_volume(self) -> None:
        run("lab-fail-cache", "restore")
        # the old cache's content can look like another file system's superblock to make-bcache's probe
        run("wipefs", "-a", CACHE_DEV)
        run("make-bcache", "--wipe-bcache", "--bucket", "64k", "-C", CACHE_DEV)
        Path("/sys/fs/bcache/register").write_text(CACHE_DEV)
        Path("/sys/fs/bcache/register").write_text(ORIGIN_DEV)
        st = os.stat(ORIGIN_DEV)  # a node, not a link, without udev: its sysfs directory by number
        backing = Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}/bcache")
        if not g.wait(backing.exists, 30):
            raise OSError(f"{ORIGIN_DEV} registered but {backing} did not appear")
        if not (backing / "cache").exists():
            cset = next(Path("/sys/fs/bcache").glob("*-*-*-*-*")).name
            (backing / "attach").write_text(cset)
        g.wait(lambda: (s := bcache_sysfs()) is not None and (s / "cache").exists(), 30)
        s = bcache_sysfs()
        assert s is not None, "the bcache device did not come back"
        mode_found = cache_state()
        (s / "cache_mode").write_text("writeback")  # as the lab's recipe sets it up
        dev = f"/dev/{s.parent.name}"
        g.wait(lambda: os.path.exists(dev), 30)
        run("mount", dev, str(g.MNT))
        self.event("volume re-added", dev=dev, mode_found=mode_found, cache=cache_state())
        self.load.start()
        self.event("load resumed")

    def remove_and_readd(self) -> None:
        self.remove_volume()
        self.done.wait(15)  # a rescan (10 s) sees the volume gone
        self.event("after a rescan", **self.volume_status())
        self.readd_volume()
        g.wait(lambda: bool(self.volume_status().get("name")), 30, 1)
        self.event("daemon sees the volume", **self.volume_status())

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        self.load.start()
        self.event("load started")
        sampler = g.Sampler(self.sample, SAMPLE_EVERY)
        sampler.start()
        hup = threading.Thread(target=self.hupper, daemon=True)
        hup.start()
        try:
            self.until(0.4)
            self.cache_error()
            self.until(0.7)
            self.remove_and_readd()
            self.until(1.0)
        except (OSError, subprocess.CalledProcessError, StopIteration, AssertionError) as exc:
            # the result still says what happened up to here, with the daemon's log
            self.failed = f"{type(exc).__name__}: {exc}"
            self.event(f"FAILED: {self.failed}", stderr=getattr(exc, "stderr", None))
        self.load.stop()
        self.done.set()
        hup.join()
        rows = sampler.stop()
        rows.append({**self.sample(), "t": round(time.monotonic() - sampler.t0, 2)})
        self.event("load stopped", **self.volume_status())
        return self.result(rows)

    def result(self, rows: list[dict]) -> dict:
        if self.profiler is not None:
            self.profiler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            self.profiler.wait(timeout=60)
        rc = self.daemon.stop(keep_log="soak")
        daemon_log = self.daemon.log()
        bad = self.load.check_all()
        warmup = min(300.0, 0.2 * self.seconds)
        rss = [(r["t"], r["rss_kib"]) for r in rows if r.get("rss_kib")]
        start = next((v for t, v in rss if t >= warmup), rss[0][1] if rss else None)
        end = rss[-1][1] if rss else None
        final = rows[-1]
        at_warmup = next((r for r in rows if r["t"] >= warmup and "tick_count" in r), final)
        return {
            "seconds": self.seconds, "warmup_s": warmup, "completed": self.failed is None, "failed": self.failed,
            "rss_start_kib": start, "rss_end_kib": end,
            "rss_max_kib": max((v for _, v in rss), default=None),
            "rss_growth_ratio": round(end / start, 4) if start and end else None,
            "ticks": final.get("tick_count"), "ticks_over_1s": final.get("ticks_over_1s"),
            "ticks_after_warmup": final.get("tick_count", 0) - at_warmup.get("tick_count", 0),
            "ticks_over_1s_after_warmup": final.get("ticks_over_1s", 0) - at_warmup.get("ticks_over_1s", 0),
            "max_tick_seconds": final.get("max_tick_bound_s"),
            "max_last_tick_sampled_s": max((r["last_tick_s"] for r in rows if r.get("last_tick_s")), default=None),
            "tracebacks": daemon_log.count("Traceback"), "daemon_exit": rc,
            "files_checked": len(self.load.files), "files_bad": len(bad) + len(self.load.bad_live),
            "bad_files": (bad + self.load.bad_live)[:20], "files_deleted": self.load.deleted,
            "writes_not_acked": self.load.unacked, "files_dropped_after_failed_append": self.load.dropped,
            "load_errors": self.load.errors, "ops": self.load.ops,
            **cost(at_warmup, final),
            "hups_sent": self.hups_sent, "hups_ok": self.hups_ok, "hup_failures": self.hup_failures,
            "events": self.events, "samples": rows,
        }


def cost(first: dict, last: dict) -> dict:
    """Between two samples: the daemon's CPU as a share of the (one) vCPU, and where its loop's time went — each
    stage's wall and CPU milliseconds per tick (the daemon's tick_wall_ns/tick_cpu_ns counters; "between" is the
    wait for the next tick, where the probe's events are taken)."""
    c0, c1 = first.get("counters") or {}, last.get("counters") or {}
    ticks = max(1, c1.get("ticks", 0) - c0.get("ticks", 0))
    stages = {k.split(".", 1)[1] for k in c1 if k.startswith("tick_wall_ns.")}
    per_tick = {s: [round((c1.get(f"tick_{w}_ns.{s}", 0) - c0.get(f"tick_{w}_ns.{s}", 0)) / 1e6 / ticks, 2)
                    for w in ("wall", "cpu")] for s in sorted(stages)}
    span = last.get("t", 0) - first.get("t", 0)
    cpu = last.get("daemon_cpu_s", 0) - first.get("daemon_cpu_s", 0)
    return {"daemon_cpu_pct_after_warmup": round(100 * cpu / span, 1) if span > 0 else None,
            "stage_ms_per_tick_after_warmup": per_tick}


def profile(pid: int) -> subprocess.Popen | None:
    """With $SOAK_PYSPY (a py-spy binary; not a project dependency): a wall-clock profile of the daemon, idle
    time included, as collapsed stacks in $LAB_OUT/daemon-profile.txt — where a slow tick spends its time. With
    $SOAK_PYSPY_ONCPU set too: on-CPU samples only (where the daemon's CPU goes); $SOAK_PYSPY_RATE: samples a
    second (20)."""
    spy = os.environ.get("SOAK_PYSPY")
    if not spy:
        return None
    out = os.environ.get("LAB_OUT", "/tmp")
    idle = [] if os.environ.get("SOAK_PYSPY_ONCPU") else ["--idle"]
    rate = os.environ.get("SOAK_PYSPY_RATE", "20")  # samples a second: 100 for a profile of a 60 s window
    return subprocess.Popen([spy, "record", *idle, "--threads", "--rate", rate, "--format", "raw", "--nonblocking",
                             "-o", f"{out}/daemon-profile.txt", "--pid", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def scrape() -> str:
    """The daemon's /metrics, or "" when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=5) as r:  # noqa: S310 - a fixed http URL
            return r.read().decode()
    except OSError:
        return ""


def tick_histogram(text: str) -> dict:
    """From the daemon's metrics: ticks so far, ticks over 1 s, and the bound of the highest non-empty bucket (the
    histogram's best statement of the longest tick: it was at most this)."""
    if TICK_METRIC not in text:
        return {}
    buckets: list[tuple[float, int]] = []
    count = 0
    for line in text.splitlines():
        if line.startswith(f"{TICK_METRIC}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), int(float(line.rsplit(" ", 1)[1]))))
        elif line.startswith(f"{TICK_METRIC}_count"):
            count = int(float(line.rsplit(" ", 1)[1]))
    le1 = next((n for b, n in buckets if b == 1.0), 0)
    # None past the last finite bucket (JSON has no Infinity); ticks_over_1s still counts those ticks
    bound = next((b for b, n in sorted(buckets) if n >= count and b != float("inf")), None)
    return {"tick_count": count, "ticks_over_1s": count - le1, "max_tick_bound_s": bound}


def main() -> None:
    seconds = float(sys.argv[1])
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    res = Soak(seconds, seed).run()
    g.write_result("soak", res)
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=1))


if __name__ == "__main__":
    main()
