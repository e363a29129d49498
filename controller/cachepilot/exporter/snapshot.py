"""What the exporter knows about the daemon: one immutable snapshot, built by the daemon once per tick.

The daemon loop fills a :class:`DaemonSnapshot` (with one :class:`VolumeSnapshot` per adopted volume) at the end
of every tick and hands it to :meth:`SnapshotBox.publish`. Scrapes (HTTP or the textfile writer) only ever read
the last published snapshot, so a scrape never waits for the loop and the loop never waits for a scrape: the box
holds one reference, swapped atomically.

Conventions, so the metrics come out right without the collectors guessing:

- Counters are cumulative since the daemon started (never reset while it runs, never negative). Sizes are bytes,
  durations seconds, times Unix seconds (``time.time()``), never nanoseconds or MiB.
- ``volume`` is the volume's name for people: the dm name of a dm volume (``lab-cached``), else the kernel
  name (``bcache0``; ``daemon.volumes.Found.label``); ``device`` is the kernel block device name under
  ``/sys/block`` (``bcache0``, ``dm-3``), the same value node_exporter's ``node_disk_*{device=...}`` carry, so
  the two join. Neither is ever a path: a value containing ``/`` is refused (:func:`check_label_value`).
- A value the backend cannot know is ``None`` and its metric is left out (e.g. dm-cache has no bypass counter; a
  ``recoverable`` volume has no exposure bound). Absent is honest; a made-up 0 is not.
- Kinds (the ``kind`` label) are short fixed words: event kinds (``freed_extent``, ``delete``, ``barrier``,
  ``discard``, ``journal_commit``, ``sync_calls``...), drop kinds (the probe's ``ringbuf_full``,
  ``hotness_map_full``, ``other``), decision kinds (``Action.kind``: ``promote``, ``discard``,
  ``set_write_policy``, ``set_knob``, ``drain``), failure classes (``CachepilotError.kind``: ``config``,
  ``rejected``, ``gone``, ``retry``, ``fatal``).
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger("cachepilot.exporter")

# Tick durations: the engine's steady tick is ~30 ms, the goal ≤ 100 ms; a first tick can take seconds.
TICK_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Epoch sizes (bytes written between two barriers): 4 KiB .. 1 GiB in powers of 4.
EPOCH_BUCKETS: tuple[float, ...] = tuple(float(4096 * 4**i) for i in range(10))

MODES = ("writeback", "writethrough", "bypass")  # the backend-neutral modes (models/volume.py)
# Every decision kind (actions.py Action.kind) and failure class (errors.py CachepilotError.kind): exported
# from the first scrape with 0, so rate() and the dashboard's panels have a series before the first one happens.
DECISION_KINDS = ("promote", "discard", "set_write_policy", "set_knob", "drain")
FAILURE_KINDS = ("config", "rejected", "gone", "retry", "fatal")


def check_label_value(what: str, value: str) -> str:
    """A label value must be a short name, never a path (paths are for humans only, design.md)."""
    if not value or "/" in value or any(c in value for c in "\n\r\"\\") or len(value) > 128:
        raise ValueError(f"{what}: {value!r} is not a usable label value (a short name, no '/', no quotes)")
    return value


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram as Prometheus wants it: ``counts[i]`` observations were ``<= bounds[i]``;
    ``count`` is every observation (the implicit ``+Inf`` bucket), ``sum`` their total."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int = 0
    sum: float = 0.0

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> Histogram:
        return cls(tuple(bounds), (0,) * len(bounds))

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("histogram: one count per bound")
        if list(self.bounds) != sorted(set(self.bounds)) or any(math.isinf(b) for b in self.bounds):
            raise ValueError("histogram: bounds must be finite and strictly increasing (+Inf is implicit)")
        if list(self.counts) != sorted(self.counts) or (self.counts and self.counts[-1] > self.count):
            raise ValueError("histogram: counts must be cumulative and at most count")


class HistogramAccumulator:
    """What the daemon keeps between ticks to fill a :class:`Histogram` (``observe`` each value, ``freeze``
    at publish time). Not thread-safe: only the loop touches it."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self._per_bucket = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._per_bucket[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def freeze(self) -> Histogram:
        cumulative, total = [], 0
        for n in self._per_bucket[:-1]:
            total += n
            cumulative.append(total)
        return Histogram(self.bounds, tuple(cumulative), self.count, self.sum)


@dataclass(frozen=True, slots=True)
class VolumeSnapshot:
    """One adopted volume at the end of a tick. Every counter is cumulative since the daemon started."""

    # identity (labels)
    volume: str  # the volume's name: the dm name (lab-cached), else the kernel name (bcache0)
    device: str  # kernel block device name under /sys/block: bcache0, dm-3
    kind: str  # cache kind: bcache | dm-cache | dm-writecache
    # mode and health
    mode: str  # current write mode, one of MODES (as read back from the cache)
    target_mode: str  # the mode the engine wants (equal to mode when settled), one of MODES
    health: int  # models.volume.Health: 0 ok, 1 degraded (cache errors rising), 2 failed
    latched: bool  # the failure latch: out of write-back until the cache is replaced or an operator clears it
    draining: bool  # a drain (or a writeback→writethrough switch, which drains) is in progress
    cache_bytes: int  # size of the cache device
    # cache-device I/O errors: what the stock cache's count has risen by (bcache's io_errors decays; this never goes
    # down); None where the kernel keeps no count (dm-cache: its status says Fail, nothing counts)
    cache_io_errors: int | None
    # exposure (the destructive failure model's bound)
    dirty_bytes: int  # data only on the cache device now
    dirty_age_seconds: float  # age of the oldest dirty data (0 when clean)
    dirty_bound_bytes: int | None  # policy exposure.max_dirty; None when the volume has no bound (recoverable)
    age_bound_seconds: float | None  # policy exposure.max_age: the age guarantee; None when unbounded
    drains: int  # drains completed
    exposure_breaches: int  # drains that failed or missed their deadline (the engine's VolumeCtl.breaches)
    # the stock cache's own counters (cumulative as the cache reports them; None where it has none)
    hits: int
    misses: int
    bypasses: int | None  # bcache cache_bypass_hits + cache_bypass_misses; dm-cache/dm-writecache: None
    # what cachepilot did
    promoted_bytes: int  # bytes read through the volume by promotions
    discard_issued_bytes: int  # bytes of freed ranges handed to FITRIM
    discard_landed_bytes: int  # bytes of discards the probe saw reach the devices below
    # barriers and epochs
    barriers: int  # block barriers (PREFLUSH/FUA, empty flush) that closed an epoch
    epoch_bytes: Histogram = field(default_factory=lambda: Histogram.empty(EPOCH_BUCKETS))  # bytes per epoch
    bypassed_bytes: int | None = None  # bcache stats_total/bypassed (bytes of the bypasses); others: None
    cache_set: str | None = None  # bcache: its cache set's UUID, node_exporter's node_bcache_*{uuid}; others: None
    alloc_failures: int | None = None  # bcache: read-miss inserts its cache refused (bcache_alloc_fail); else None
    promotion_rate: float | None = None  # the promoter's current rate in bytes/s (None: no promoter)
    operator_drain_remaining_bytes: int | None = None  # while `cachepilot drain` runs: dirty bytes left
    operator_drain_rate_bytes: float | None = None  # ... and its rate so far (bytes/s)
    # is write-back making progress (models/writeback.py)
    writeback_stalled: bool = False  # dirty data has not fallen for health.stall_after while write-back should run
    writeback_stalled_seconds: float = 0.0  # how long it has not fallen so far while it should (0 otherwise)
    all_dirty: bool | None = None  # dm-cache/lvmcache: every mapped block dirty (unclean shutdown); others None
    clean_eta_seconds: float | None = None  # seconds to clean at the measured write-back rate; None: not measured
    # the sizing advisor's points: (size bytes, hit ratio, its error, origin read bytes, origin write bytes)
    advice: tuple[tuple[int, float, float, int, int], ...] = ()

    def __post_init__(self) -> None:
        check_label_value("volume", self.volume)
        if self.cache_set is not None:
            check_label_value("cache_set", self.cache_set)
        check_label_value("device", self.device)
        check_label_value("kind", self.kind)
        for what, mode in (("mode", self.mode), ("target_mode", self.target_mode)):
            if mode not in MODES:
                raise ValueError(f"{self.volume}: {what} {mode!r} is not one of {', '.join(MODES)}")


UNMANAGED_REASONS = ("describe", "backend", "policy", "watch")


@dataclass(frozen=True, slots=True)
class UnmanagedVolume:
    """A cached volume the daemon found but cannot manage (its caching runs on as the kernel has it, unbounded)."""

    volume: str  # as VolumeSnapshot.volume
    device: str  # as VolumeSnapshot.device
    reason: str  # one of UNMANAGED_REASONS: not describable, its backend would not open, the policy refused it
    # (rules of several files select it), the probe cannot watch it

    def __post_init__(self) -> None:
        check_label_value("volume", self.volume)
        check_label_value("device", self.device)
        if self.reason not in UNMANAGED_REASONS:
            raise ValueError(f"{self.volume}: reason {self.reason!r} is not one of {', '.join(UNMANAGED_REASONS)}")


@dataclass(frozen=True, slots=True)
class DaemonSnapshot:
    """The daemon at the end of a tick. Counters are cumulative since the daemon started; mappings are by kind
    (see the module's docstring for the words)."""

    timestamp: float  # Unix seconds when this snapshot was built
    start_time: float  # Unix seconds when the daemon started
    ready: bool  # readiness was reported (probe attached, volumes adopted)
    dry_run: bool
    observe_only: bool  # no cached volume: the daemon only watches
    events: dict[str, int] = field(default_factory=dict)  # events received from the probe, by kind
    drops: dict[str, int] = field(default_factory=dict)  # events the kernel side lost, by drop kind
    ticks: int = 0
    tick_duration: Histogram = field(default_factory=lambda: Histogram.empty(TICK_BUCKETS))
    last_tick_timestamp: float = 0.0  # Unix seconds when the last tick finished (a stuck loop stops it)
    # where the loop's time went, by stage of the tick ("between": waiting for the next, events taken meanwhile)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    stage_cpu_seconds: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)  # actions the engine decided, by action kind
    action_failures: dict[str, int] = field(default_factory=dict)  # failed actions, by error class
    policy_reloads: int = 0  # successful reloads (SIGHUP)
    policy_reload_failures: int = 0  # reloads refused (the last good policy stayed)
    policy_last_reload_success: bool = True
    state_writes: int = 0
    state_write_failures: int = 0
    volumes: tuple[VolumeSnapshot, ...] = ()
    unmanaged: tuple[UnmanagedVolume, ...] = ()
    # what runs: cachepilot's version, the kernel's release, the loaded BPF object (a short hash; "none": no probe)
    version: str = ""
    kernel: str = ""
    bpf_object: str = "none"
    capture: str = "none"  # the probe's capture path: core, bcc, none (no probe)

    def __post_init__(self) -> None:
        for what, table in (("events", self.events), ("drops", self.drops), ("decisions", self.decisions),
                            ("action_failures", self.action_failures), ("stage", self.stage_seconds),
                            ("stage", self.stage_cpu_seconds)):
            for kind in table:
                check_label_value(f"{what} kind", kind)
        names = [v.volume for v in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError(f"volumes: duplicate volume names in {names}")


class SnapshotBox:
    """The hand-over point between the loop (``publish``) and scrapes (``latest``). One reference, replaced
    whole: a reader gets either the old or the new snapshot, never a mix, and never waits on the loop.

    ``publish_lazy`` hands over how to build the snapshot instead (from the loop's immutable status): the first
    scrape after it builds it, on the scrape's thread, and later ones reuse it. A daemon scraped every 15 s then
    builds one snapshot in 15, not one a tick (issue 23 item 5: the daemon's CPU)."""

    def __init__(self) -> None:
        self._snapshot: DaemonSnapshot | None = None
        self._build: Callable[[], DaemonSnapshot] | None = None
        self._failed: set[str] = set()  # why builds failed (each said once)
        self._lock = threading.Lock()  # only guards the swap; held for nanoseconds

    def publish(self, snapshot: DaemonSnapshot) -> None:
        with self._lock:
            self._snapshot, self._build = snapshot, None

    def publish_lazy(self, build: Callable[[], DaemonSnapshot]) -> None:
        """``build`` must read only what does not change after this call (it runs later, on another thread)."""
        with self._lock:
            self._build = build

    def latest(self) -> DaemonSnapshot | None:
        with self._lock:
            snapshot, build = self._snapshot, self._build
        if build is None:
            return snapshot
        try:
            built: DaemonSnapshot | None = build()  # outside the lock: the loop's publish never waits for a build
        except Exception as exc:  # noqa: BLE001 - a snapshot that cannot be built: scrapes keep the last good one
            said = f"{type(exc).__name__}: {exc}"
            if said not in self._failed:
                self._failed.add(said)
                log.error("metrics: snapshot not built, the last one is served: %s", said)
            built = snapshot
        with self._lock:
            if self._build is build:  # not replaced meanwhile (else this reader still gets a whole snapshot)
                self._snapshot, self._build = built, None
        return built
