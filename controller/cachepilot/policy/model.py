"""Typed policy: what one volume gets, and the rules that select volumes."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Exposure:
    max_dirty: int = 64 * MiB
    max_age_s: float = 30.0
    # periodic drains write back at half the measured full rate (engine/pacing.py), so the origin's queue stays
    # short for the foreground's fsyncs, where the kind has a rate floor (Capabilities.pace_knob)
    pace: bool = False


@dataclass(frozen=True, slots=True)
class LifetimeHold:
    """Recoverable model: hold new data dirty while the volume's deletes say it is likely to die (engine.lifetime)."""

    enabled: bool = True
    share: float = 0.9  # hold until the age by which this share of the deleted bytes had died
    max_hold_s: float = 600.0
    headroom: float = 0.1  # share of the cache kept below its write cutoff (bcache: 40% in use)


@dataclass(frozen=True, slots=True)
class LargeFiles:
    """The sieve's second size class: a file above ``sieve_size`` and at most ``max_size`` is admitted once it has
    been read whole ``min_reads`` times below the page cache (aged with the counters' half-life). For hot large files
    that bcache's sequential cutoff sends around the cache however often they are read (issue 37); a file read once
    (a stream, a backup) never qualifies."""

    enabled: bool = True
    min_reads: float = 2.0
    max_size: int = 256 * MiB


@dataclass(frozen=True, slots=True)
class Promotion:
    enabled: bool = True
    rate: int = 4 * MiB  # bytes per second
    max_cache_fraction: float = 0.25
    sieve_size: int = 1 * MiB
    refresh_interval_s: float = 0.0  # 0 = never re-read the believed-cached set
    # on a cache that inserts its own read misses (bcache): promote only while it bypasses reads, never a file
    # already resident (false: every admitted file, e.g. where the allocator drops read-miss inserts); on dm-cache,
    # whose smq promotes from the workload's own misses, no admitted file (false: every one)
    only_uncached: bool = True
    large_files: LargeFiles = field(default_factory=LargeFiles)

    @property
    def sieve_args(self) -> tuple[int, int, float]:
        """The sieve's size classes (HotnessTable.sieve_mask's arguments): the small-file bound, the large-file
        class's upper bound (0: the class is off) and its whole reads."""
        large = self.large_files
        return self.sieve_size, large.max_size if large.enabled else 0, large.min_reads


@dataclass(frozen=True, slots=True)
class DiscardOnDelete:
    enabled: bool = True
    interval_s: float = 0.0  # 0: each commit's freed extents go at once; > 0: batched, one look per interval
    # 0: the cache's own discard unit (VolumeInfo.discard_unit) and at least one filesystem block; a size: at least
    # that much as well
    min_extent: int = 0
    max_rate: int = 256 * MiB  # bytes per second


@dataclass(frozen=True, slots=True)
class Hysteresis:
    min_switch_interval_s: float = 300.0
    resume_below: float = 0.5  # back to write-back only below this fraction of the exposure bound


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    error_threshold: int = 1  # cache I/O errors within the sample window that make a volume DEGRADED
    scan_drop: float = 0.2  # hit-ratio drop (absolute) that triggers re-warming
    # dirty data that has not fallen this long while write-back should run is a stall (models/writeback.py); 0: off
    stall_after_s: float = 600.0


@dataclass(frozen=True, slots=True)
class SequentialSteering:
    """bcache: raise ``sequential_cutoff`` while a volume's bypassed sequential runs are small-file creates, lower
    it back while they are streams (cachepilot.engine.seqcutoff). A pinned ``knobs: sequential_cutoff`` wins."""

    enabled: bool = True
    max_cutoff: int = 64 * MiB  # never raised above this
    window_s: float = 30.0  # evidence is judged (and the knob moved one step) at most once per window


@dataclass(frozen=True, slots=True)
class Pin:
    """Files kept in the cache whatever happens (models/pins.py): path prefixes or globs relative to the mount
    point, at most ``max_bytes`` of them (refused past the cache's room), re-read at most every ``refresh_s``
    while the cache is missing reads."""

    paths: tuple[str, ...] = ()
    max_bytes: int = 0
    refresh_s: float = 10.0

    def check_room(self, info: VolumeInfo) -> None:
        """A cap larger than the cache could never hold: refused (UserError), where the cache's size is known."""
        if self.paths and info.cache_bytes > 0 and self.max_bytes > info.cache_bytes:
            raise UserError(f"volume {info.name}: pin.max_bytes {self.max_bytes} is more than its cache holds "
                            f"({info.cache_bytes} bytes)")


@dataclass(frozen=True, slots=True)
class VolumePolicy:
    failure_model: str = "destructive"
    exposure: Exposure = field(default_factory=Exposure)
    lifetime_hold: LifetimeHold = field(default_factory=LifetimeHold)
    promotion: Promotion = field(default_factory=Promotion)
    discard_on_delete: DiscardOnDelete = field(default_factory=DiscardOnDelete)
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    knobs: dict[str, str] = field(default_factory=dict)
    sequential_steering: SequentialSteering = field(default_factory=SequentialSteering)
    pin: Pin = field(default_factory=Pin)


@dataclass(frozen=True, slots=True)
class Selector:
    device: str | None = None
    fs_uuid: str | None = None
    mountpoint: str | None = None
    kind: str | None = None  # bcache | dm-cache | dm-writecache

    def matches(self, v: VolumeInfo) -> bool:
        if self.kind is not None and self.kind != v.kind:
            return False
        if self.device is not None and not fnmatch.fnmatchcase(v.name, self.device):
            return False
        if self.fs_uuid is not None and self.fs_uuid.lower() != v.fs_uuid.lower():
            return False
        if self.mountpoint is not None and self.mountpoint.rstrip("/") != (v.mountpoint.rstrip("/")):
            return False
        return True

    def __str__(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("kind", "device", "fs_uuid", "mountpoint") if getattr(self, k)]
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    selector: Selector
    policy: VolumePolicy
    line: int


@dataclass(frozen=True, slots=True)
class Policy:
    source: str
    defaults: VolumePolicy
    rules: tuple[Rule, ...] = ()
    half_life_s: float = 600.0
    dry_run: bool = False

    def resolve(self, v: VolumeInfo) -> tuple[VolumePolicy, str]:
        """The policy for a volume and the name of what chose it. Two matching rules are an error."""
        hits = [r for r in self.rules if r.selector.matches(v)]
        if len(hits) > 1:
            where = ", ".join(f"{r.name!r} (line {r.line})" for r in hits)
            raise UserError(f"{self.source}: volume {v.name} matches overlapping selectors: {where}")
        if hits:
            return hits[0].policy, hits[0].name
        return self.defaults, "defaults"


DEFAULT_POLICY = Policy(source="<built-in>", defaults=VolumePolicy())
"""The built-in policy: the same settings as the shipped policies/default.yaml (a unit test checks)."""
