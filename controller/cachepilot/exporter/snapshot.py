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
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger("cachepilot.exporter")

# Tick durations: the engine's steady tick is ~30 ms, the goal ≤ 100 ms; a first tick can take seconds.
TICK_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Epoch sizes (bytes written between two barriers): 4 KiB .. 1 GiB in powers of 4.
EPOCH_BUCKETS: tuple[float, ...] = tuple(float(4096 * 4**i) for i in range(10))

MODES = ("writeback", "writethrough", "bypass")  # the backend-neutral modes (models/volume.py)
# Every decision kind (actions.py Action.kind) and failure class (errors.py CachepilotError.kind): exported
# from the first scrape with 0, so rate() and the dashboard's panels have a series before the first one happens.
DECISION_KINDS = ("promote", "discard", "set_write_policy", "set_knob", "drain", "detach", "attach")
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


@dataclass(frozen=True)
class VolumeMetric:
    """How a field of :class:`VolumeSnapshot` is exported: by which collector (its ``kind`` label), as a counter
    (cumulative, ``_total``) or a gauge, under which name and help. A field that is None for a volume (its backend
    has no such counter) leaves that volume out of the metric; a bool is exported as 0/1."""

    collector: str  # volume, exposure, cache, actuation, epochs (collectors.COLLECTORS)
    counter: bool
    name: str
    help: str


def _gauge(collector: str, name: str, help_: str) -> Any:
    return field(metadata={"metric": VolumeMetric(collector, False, name, help_)})


def _counter(collector: str, name: str, help_: str) -> Any:
    return field(metadata={"metric": VolumeMetric(collector, True, name, help_)})


@dataclass(frozen=True, slots=True, kw_only=True)
class VolumeSnapshot:
    """One adopted volume at the end of a tick. Every counter is cumulative since the daemon started.

    Adding a metric: a field here with its metric (the collectors read the rows off the fields, in this order),
    and its value where the daemon builds the snapshot from the volume's state (daemon/status.volume_snapshot). No
    field has a default, so a builder that forgets one fails (tests/unit/test_volume_snapshot.py)."""

    # identity (labels)
    volume: str  # the volume's name: the dm name (lab-cached), else the kernel name (bcache0)
    device: str  # kernel block device name under /sys/block: bcache0, dm-3
    kind: str  # cache kind: bcache | dm-cache | dm-writecache
    # mode (collectors.volume's state sets)
    mode: str  # current write mode, one of MODES (as read back from the cache)
    target_mode: str  # the mode the engine wants (equal to mode when settled), one of MODES
    # health (models.volume.Health: 0 ok, 1 degraded (cache errors rising), 2 failed)
    health: int = _gauge("volume", "cachepilot_volume_health", "0 ok, 1 degraded (cache errors), 2 failed.")
    # the failure latch: out of write-back until the cache is replaced or an operator clears it
    latched: bool = _gauge("volume", "cachepilot_volume_latched",
                           "1 while the failure latch keeps the volume out of write-back.")
    # a drain (or a writeback→writethrough switch, which drains) is in progress
    draining: bool = _gauge("volume", "cachepilot_volume_draining", "1 while a drain is in progress.")
    cache_bytes: int = _gauge("volume", "cachepilot_volume_cache_size_bytes", "Size of the cache device.")
    # cache-device I/O errors: what the stock cache's count has risen by (bcache's io_errors decays; this never goes
    # down); None where the kernel keeps no count (dm-cache: its status says Fail, nothing counts)
    cache_io_errors: int | None = _counter(
        "volume", "cachepilot_volume_cache_io_errors_total", "I/O errors of the cache device: what the stock cache's "
        "count rose by (bcache's decays; this never goes down). Absent for dm-cache, which keeps no count.")
    # exposure (the destructive failure model's bound)
    dirty_bytes: int = _gauge("exposure", "cachepilot_volume_dirty_bytes", "Data only on the cache device.")
    dirty_age_seconds: float = _gauge("exposure", "cachepilot_volume_dirty_age_seconds",
                                      "Age of the oldest dirty data.")  # 0 when clean
    # policy exposure.max_dirty; None when the volume has no bound (recoverable)
    dirty_bound_bytes: int | None = _gauge("exposure", "cachepilot_volume_dirty_bound_bytes",
                                           "Exposure bound on dirty data (destructive failure model).")
    # policy exposure.max_age: the age guarantee; None when unbounded
    age_bound_seconds: float | None = _gauge(
        "exposure", "cachepilot_volume_dirty_age_bound_seconds",
        "Age guarantee: no dirty data older than this (destructive failure model).")
    drains: int = _counter("exposure", "cachepilot_volume_drains_total", "Drains completed.")
    # drains that failed or missed their deadline (the engine's VolumeCtl.breaches)
    exposure_breaches: int = _counter("exposure", "cachepilot_volume_exposure_breaches_total",
                                      "Exposure breaches: drains that failed or missed their deadline.")
    # the stock cache's own counters (cumulative as the cache reports them; None where it has none)
    hits: int = _counter("cache", "cachepilot_volume_cache_hits_total", "Stock cache hits.")
    misses: int = _counter("cache", "cachepilot_volume_cache_misses_total", "Stock cache misses.")
    # bcache cache_bypass_hits + cache_bypass_misses; dm-cache/dm-writecache: None
    bypasses: int | None = _counter("cache", "cachepilot_volume_cache_bypasses_total",
                                    "I/Os the stock cache sent around itself (bcache only).")
    # what cachepilot did
    promoted_bytes: int = _counter("actuation", "cachepilot_volume_promoted_bytes_total",
                                   "Bytes read in by promotions.")  # read through the volume
    discard_issued_bytes: int = _counter("actuation", "cachepilot_volume_discard_issued_bytes_total",
                                         "Bytes of freed ranges handed to FITRIM.")
    discard_landed_bytes: int = _counter("actuation", "cachepilot_volume_discard_landed_bytes_total",
                                         "Bytes of discards seen reaching the devices below.")
    # barriers and epochs
    barriers: int = _counter("epochs", "cachepilot_volume_barriers_total",
                             "Block barriers that closed an epoch.")  # PREFLUSH/FUA, empty flush
    epoch_bytes: Histogram  # bytes per epoch (collectors.epochs)
    # bcache stats_total/bypassed (bytes of the bypasses); others: None
    bypassed_bytes: int | None = _counter("cache", "cachepilot_volume_cache_bypassed_bytes_total",
                                          "Bytes the stock cache sent around itself (bcache only).")
    cache_set: str | None  # bcache: its cache set's UUID, node_exporter's node_bcache_*{uuid}; others: None
    # bcache: read-miss inserts its cache refused (bcache_alloc_fail); else None
    alloc_failures: int | None = _counter(
        "actuation", "cachepilot_bcache_alloc_failures_total", "Read-miss inserts the volume's bcache cache refused "
        "(free list empty: bcache_alloc_fail); each halves the promotion rate for a tick.")
    # the promoter's current rate in bytes/s (None: no promoter)
    promotion_rate: float | None = _gauge(
        "actuation", "cachepilot_volume_promotion_rate_bytes", "The promoter's current rate in bytes per second (on "
        "bcache it backs off on allocation failures and recovers slowly).")
    # while `cachepilot drain` runs: dirty bytes left, and its rate so far (bytes/s); None otherwise
    operator_drain_remaining_bytes: int | None = _gauge(
        "exposure", "cachepilot_volume_operator_drain_remaining_bytes",
        "While an operator's drain (cachepilot drain) runs: the dirty data it has left.")
    operator_drain_rate_bytes: float | None = _gauge(
        "exposure", "cachepilot_volume_operator_drain_rate_bytes",
        "While an operator's drain runs: its write-back rate so far, in bytes per second.")
    # is write-back making progress (models/writeback.py)
    # dirty data has not fallen for health.stall_after while write-back should run
    writeback_stalled: bool = _gauge(
        "exposure", "cachepilot_volume_writeback_stalled", "1 while dirty data has not fallen for the policy's "
        "health.stall_after although write-back should run (cachepilot explain says why).")
    # how long it has not fallen so far while it should (0 otherwise)
    writeback_stalled_seconds: float = _gauge(
        "exposure", "cachepilot_volume_writeback_stalled_seconds", "How long dirty data has not fallen while "
        "write-back should run (0 when it falls or need not run).")
    # dm-cache/lvmcache: every mapped block dirty (unclean shutdown); others None
    all_dirty: bool | None = _gauge(
        "exposure", "cachepilot_volume_all_dirty", "dm-cache: 1 while (nearly) every mapped block is dirty, as "
        "dm-cache loads them after an unclean shutdown.")
    # seconds to clean at the measured write-back rate; None: not measured
    clean_eta_seconds: float | None = _gauge(
        "exposure", "cachepilot_volume_clean_eta_seconds", "Seconds to write back the dirty data at the write-back "
        "rate measured from its fall (absent until measured).")
    # the sizing advisor's points: (size bytes, hit ratio, its error, origin read bytes, origin write bytes)
    # (collectors.advisor)
    advice: tuple[tuple[int, float, float, int, int], ...]

    def __post_init__(self) -> None:
        check_label_value("volume", self.volume)
        if self.cache_set is not None:
            check_label_value("cache_set", self.cache_set)
        check_label_value("device", self.device)
        check_label_value("kind", self.kind)
        for what, mode in (("mode", self.mode), ("target_mode", self.target_mode)):
            if mode not in MODES:
                raise ValueError(f"{self.volume}: {what} {mode!r} is not one of {', '.join(MODES)}")


def volume_metrics(collector: str) -> tuple[tuple[str, VolumeMetric], ...]:
    """The fields of :class:`VolumeSnapshot` ``collector`` exports, with their metric, in declaration order."""
    return tuple((f.name, m) for f in fields(VolumeSnapshot)
                 if (m := f.metadata.get("metric")) is not None and m.collector == collector)


UNMANAGED_REASONS = ("describe", "backend", "policy", "watch")
DETACHED_REASONS = ("operator", "no_cache")


@dataclass(frozen=True, slots=True)
class DetachedVolume:
    """A cached device without its cache, not managed, on purpose: ``operator`` (`cachepilot detach` released it,
    attach puts the cache back) or ``no_cache`` (found with no cache: a bcache backing device with no cache set)."""

    volume: str  # as VolumeSnapshot.volume
    device: str  # as VolumeSnapshot.device
    kind: str
    reason: str  # one of DETACHED_REASONS

    def __post_init__(self) -> None:
        for what in ("volume", "device", "kind"):
            check_label_value(what, getattr(self, what))
        if self.reason not in DETACHED_REASONS:
            raise ValueError(f"{self.volume}: reason {self.reason!r} is not one of {', '.join(DETACHED_REASONS)}")


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
    detached: tuple[DetachedVolume, ...] = ()
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
