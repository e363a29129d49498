"""The daemon with 1 million tracked files (issue 32's goals: RSS <= 100 MiB and a steady tick's p99 <= 100 ms; issue
10's were 150 MiB and 100 ms).

The real daemon loop (`Daemon.tick`: drain feed, samples, engine tick, actions, snapshot for status/metrics, the
hot list for `top`, the state file every few seconds) on 16 volumes whose backends are in-memory stand-ins (no
cache on this host; the backends' own cost is a sysfs read, measured in the lab). Before each tick 10 000
hotness records arrive, as a drain of the probe's table would deliver them. Prints the tick's wall and CPU time
(median, p99, max over the steady ticks; CPU: the loop thread's), the process's RSS (VmRSS, VmHWM), the bytes the
engine holds per tracked file, the state file's size and the writer thread's time per state file.

Usage: .venv/bin/python tests/bench/bench_daemon_files.py [TICKS] [--exporter]

``--exporter``: with the Prometheus endpoint on (``metrics.listen`` on a free port of 127.0.0.1, as the shipped
config has it; nothing scrapes it): the exporter's modules and its server's thread are then in the process (since
h32f not prometheus_client, whose imports were ~4 MiB of it). Without it the endpoint is off and they are not
(exporter/__init__.py).
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cachepilot.backends.base import DONE, ControlAction, Outcome
from cachepilot.daemon.actuation import ReadOnlyBackend
from cachepilot.daemon.config import load_config
from cachepilot.daemon.daemon import Daemon
from cachepilot.daemon.volumes import Found
from cachepilot.events import kdev
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.volume import VolumeInfo, VolumeSample

FILES = 1_000_000
VOLUMES = 16
PER_TICK = 10_000
SCORES = np.array([64, 32, 16, 1])
NS = 1_000_000_000
POLICY = """version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 8MiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
  discard_on_delete: {enabled: true, interval: 5s, min_extent: 64KiB}
"""


class StandIn(ReadOnlyBackend):
    """A cache that is always clean and takes every action (the rest of the contract: ReadOnlyBackend's no-ops)."""

    kind = "bcache"

    def sample(self, now_ns: int) -> VolumeSample:
        return VolumeSample(self.info.dev, now_ns, "writeback", 0, 10, 5, 0, False, {})

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        return Outcome(action, DONE, dry_run=dry_run)


class NoFiles:
    def __init__(self, info: VolumeInfo, discard_rate: int, promote_rate: int) -> None:
        pass

    def run(self, action: object, dry_run: bool) -> Outcome:
        return Outcome(action, DONE, dry_run=dry_run)  # type: ignore[arg-type]


def records(j: np.ndarray, rs: np.ndarray, t: int) -> np.ndarray:
    """Hotness records of files ``j`` (16 KiB each, read with score ``rs`` at ``t``) as the probe's drain hands them
    to the daemon: one HOT_DTYPE array (the bench built them as Python tuples before: the tuples' churn was the
    bench's own RSS, not the daemon's)."""
    rec = np.zeros(len(j), dtype=HOT_DTYPE)
    rec["dev"] = np.array([kdev(252, v) for v in range(VOLUMES)])[j % VOLUMES]
    rec["ino"] = j + 12
    rec["gen"] = 1
    rec["rs"] = rs
    rec["rb"] = 16384
    rec["last"] = t
    rec["size"] = 16384
    return rec


def settle(d: Daemon, writes: list[float]) -> None:
    """The daemon's wait between ticks (1 s): where its writer thread writes a state file handed over by the tick.
    Back-to-back ticks would make the next tick wait for the thread's JSON encoding (it holds the GIL) -- a cost
    the daemon's loop does not have; the write's own time is reported apart."""
    w = getattr(d, "writer", None)  # (a daemon from before the writer thread wrote in its tick)
    if w is None or not w.busy:
        return
    deadline = time.monotonic() + 1.0
    while w.busy and time.monotonic() < deadline:
        time.sleep(0.002)
    writes.append(w.last_write_ns / 1e9)


def queue_bytes(d: Daemon) -> int:
    """Bytes held by the promotion queues' entries."""
    return sum(len(c.promo_queue.items) * c.promo_queue.items.itemsize for c in d.engine.vols.values())


def status_kib(*keys: str) -> tuple[int, ...]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(status[k].split()[0]) for k in keys)


def rss_kib() -> tuple[int, int]:
    rss, hwm = status_kib("VmRSS", "VmHWM")
    return rss, hwm


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--exporter"]
    ticks = int(args[0]) if args else 60
    listen = f"127.0.0.1:{free_port()}" if "--exporter" in sys.argv else ""
    tmp = Path(tempfile.mkdtemp(prefix="bench-daemon-files-"))
    (tmp / "p.yaml").write_text(POLICY)
    (tmp / "c.yaml").write_text("version: 1\npolicies: [p.yaml]\nstate_dir: st\nsocket: ctl.sock\n"
                                f"metrics: {{listen: '{listen}'}}\nstate_interval: 5s\n")
    vols = [Found(VolumeInfo(dev=kdev(252, i), name=f"bcache{i}", kind="bcache", fs_uuid=f"u-{i}",
                             mountpoint=f"/mnt/{i}", cache_bytes=8 << 30)) for i in range(VOLUMES)]
    d = Daemon(load_config(tmp / "c.yaml"), config_path=tmp / "c.yaml", discover=lambda: (list(vols), []),
               backend_factory=StandIn, actuators_factory=NoFiles)
    d.start()
    base = rss_kib()[0]
    rng = np.random.default_rng(1)
    t = d.started_ns
    for i in range(0, FILES, 65536):  # the first drains: every file seen once
        j = np.arange(i, min(FILES, i + 65536))
        d.engine.feed_hotness_array(records(j, 1 + (j * 7919) % 64, t))
    walls, cpus = [], []
    writes: list[float] = []
    stages: dict[str, list[float]] = {}
    for _ in range(ticks):
        t += NS
        d.engine.feed_hotness_array(records(rng.integers(0, FILES, PER_TICK), rng.choice(SCORES, PER_TICK), t))
        w0, c0 = time.perf_counter(), time.thread_time()
        d.tick(t)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
        settle(d, writes)
        for name, (_, c) in d.times.last.items():
            stages.setdefault(name, []).append(c / 1e6)
    rss, hwm = rss_kib()
    steady_w, steady_c = walls[2:], cpus[2:]  # the first tick admits a million files at once
    print(f"tracked files: {len(d.engine.hotness)} on {VOLUMES} volumes; {ticks} ticks, {PER_TICK} records/tick; "
          f"metrics endpoint {listen or 'off'}")
    print(f"first tick: {walls[0] * 1e3:.0f} ms wall, {cpus[0] * 1e3:.0f} ms CPU")
    print(f"steady tick wall: median {statistics.median(steady_w) * 1e3:.1f} ms, p99 {pct(steady_w, 0.99) * 1e3:.1f}"
          f" ms, max {max(steady_w) * 1e3:.1f} ms (goal: p99 <= 100 ms)")
    print(f"steady tick CPU: median {statistics.median(steady_c) * 1e3:.1f} ms, p99 {pct(steady_c, 0.99) * 1e3:.1f}"
          f" ms")
    print(f"RSS: {rss / 1024:.1f} MiB now, {hwm / 1024:.1f} MiB peak (goal <= 100 MiB); "
          f"{base / 1024:.1f} MiB after start, before the files")
    # apart: the file-backed part (libpython's, numpy's and OpenBLAS's mapped code) is not the daemon's own data, and
    # the total moved by ~2 MiB between runs an hour apart on both sides of a pair alike (h32f, 2026-11-29)
    anon, file = status_kib("RssAnon", "RssFile")
    print(f"RSS now: {anon / 1024:.1f} MiB anonymous, {file / 1024:.1f} MiB file-backed")
    if writes:
        print(f"state file writes (the writer thread, off the loop): {len(writes)}, median "
              f"{statistics.median(writes) * 1e3:.1f} ms, max {max(writes) * 1e3:.1f} ms")
    busy = sorted(((sum(v[2:]) / max(1, len(v[2:])), k) for k, v in stages.items()), reverse=True)
    print("steady tick CPU by stage (mean ms, max ms): " + ", ".join(
        f"{k} {m:.1f}/{max(stages[k][2:], default=0):.1f}" for m, k in busy if m >= 0.5))
    t = d.engine.hotness
    n = max(1, len(t))
    queued = sum(len(c.promo_queue) for c in d.engine.vols.values())
    index = sum(i.memory_bytes() for i in t.index.values())
    columns = t.column_bytes() if hasattr(t, "column_bytes") else t.memory_bytes() - index  # (a tree before h32c)
    print(f"per tracked file: {columns / n:.1f} B of columns, {index / n:.1f} B of inode index; "
          f"{queue_bytes(d) / max(1, queued):.1f} B per queued file ({queued} queued)")
    state = tmp / "st" / "state.json"
    print(f"state file: {state.stat().st_size / 1024:.0f} KiB" if state.exists() else "state file: not written")
    d.shutdown()


if __name__ == "__main__":
    main()
