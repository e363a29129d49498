"""Typed policy: what one volume gets, and the rules that select volumes.

Every policy key is declared here, once, on its field (:func:`~cachepilot.policy.values.setting`): its YAML key,
kind of value, default and meaning. ``policy/fields.py`` reads them into the table that the schema
(``policies/schema.json``), the loader's conversion, the Ansible role's early check and ``docs/policy-reference.md``
are generated from.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from cachepilot.capabilities import KINDS, KNOBS
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy.values import (
    BOOLEAN,
    DURATION,
    FRACTION,
    GLOB,
    SIZE,
    enum,
    integer,
    knobs,
    number,
    pattern,
    section,
    setting,
    setting_from,
    strings,
)

MiB = 1 << 20
FAILURE_MODELS = ("recoverable", "destructive", "auto")


@dataclass(frozen=True, slots=True)
class Exposure:
    max_dirty: int = setting(64 * MiB, SIZE, "destructive: never more fsync-acknowledged data than this only on "
                             "the cache device")
    max_age_s: float = setting(30.0, DURATION, "destructive: nor older than this (a drain at least once per max_age)",
                               key="max_age")
    # periodic drains write back at half the measured full rate (engine/pacing.py), so the origin's queue stays
    # short for the foreground's fsyncs, where the kind has a rate floor (Capabilities.pace_knob)
    pace: bool = setting(False, BOOLEAN, "periodic drains write back at half the measured full rate")


@dataclass(frozen=True, slots=True)
class LifetimeHold:
    """Recoverable model: hold new data dirty while the volume's deletes say it is likely to die (engine.lifetime)."""

    enabled: bool = setting(True, BOOLEAN, "recoverable: hold new data dirty while it is likely to die")
    share: float = setting(0.9, FRACTION, "hold until this share of deleted bytes had died")
    max_hold_s: float = setting(600.0, DURATION, "the hold never exceeds this", key="max_hold")
    # bcache: 40% in use
    headroom: float = setting(0.1, FRACTION, "cache share kept below its write cutoff")


@dataclass(frozen=True, slots=True)
class LargeFiles:
    """The sieve's second size class: a file above ``sieve_size`` and at most ``max_size`` is admitted once it has
    been read whole ``min_reads`` times below the page cache (aged with the counters' half-life). For hot large files
    that bcache's sequential cutoff sends around the cache however often they are read (issue 37); a file read once
    (a stream, a backup) never qualifies."""

    enabled: bool = setting(True, BOOLEAN, "admit files above sieve_size once read whole min_reads times (bcache "
                            "bypasses them as sequential however often they are read)")
    min_reads: float = setting(2.0, number(1), "whole reads below the page cache (aged with the half-life)")
    max_size: int = setting(256 * MiB, SIZE, "larger files are never promoted")


@dataclass(frozen=True, slots=True)
class Promotion:
    enabled: bool = setting(True, BOOLEAN, "promote hot files by reading them through the cache")
    rate: int = setting(4 * MiB, SIZE, "bytes per second read to promote")
    max_cache_fraction: float = setting(0.25, FRACTION, "share of the cache that promotions may fill")
    sieve_size: int = setting(1 * MiB, SIZE, "files up to this size are promoted on their counter")
    refresh_interval_s: float = setting(0.0, DURATION, "re-read the believed-cached set this often so the cache "
                                        "keeps it (0 = never)", key="refresh_interval")
    # on a cache that inserts its own read misses (bcache): promote only while it bypasses reads, never a file
    # already resident (false: every admitted file, e.g. where the allocator drops read-miss inserts); on dm-cache,
    # whose smq promotes from the workload's own misses, no admitted file (false: every one)
    only_uncached: bool = setting(True, BOOLEAN, "bcache: promote only while the cache bypasses reads, never a "
                                  "resident file; dm-cache: leave admitted files to smq")
    large_files: LargeFiles = section(LargeFiles, "the sieve's second size class")

    @property
    def sieve_args(self) -> tuple[int, int, float]:
        """The sieve's size classes (HotnessTable.sieve_mask's arguments): the small-file bound, the large-file
        class's upper bound (0: the class is off) and its whole reads."""
        large = self.large_files
        return self.sieve_size, large.max_size if large.enabled else 0, large.min_reads


@dataclass(frozen=True, slots=True)
class DiscardOnDelete:
    enabled: bool = setting(True, BOOLEAN, "discard the extents a committed delete freed (FITRIM of those ranges)")
    interval_s: float = setting(0.0, DURATION, "0: each journal commit's freed extents go at once; more: batched, "
                                "one look per interval", key="interval")
    # 0: the cache's own discard unit (VolumeInfo.discard_unit) and at least one filesystem block; a size: at least
    # that much as well
    min_extent: int = setting(0, SIZE, "discards go in multiples of at least this; 0: the cache's own discard unit "
                              "(and one filesystem block)")
    max_rate: int = setting(256 * MiB, SIZE, "bytes per second trimmed at most")


@dataclass(frozen=True, slots=True)
class Hysteresis:
    min_switch_interval_s: float = setting(300.0, DURATION, "write-mode switches at least this far apart",
                                           key="min_switch_interval")
    resume_below: float = setting(0.5, FRACTION, "back to write-back only below this share of the exposure bound")


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    error_threshold: int = setting(1, integer(1), "cache I/O errors within the sample window that make a volume "
                                   "degraded")
    scan_drop: float = setting(0.2, FRACTION, "hit-ratio drop (absolute) that triggers re-warming")
    # dirty data that has not fallen this long while write-back should run is a stall (models/writeback.py)
    stall_after_s: float = setting(600.0, DURATION, "dirty data that has not fallen this long while write-back "
                                   "should run is a stall (metric, alert, explain); 0: not looked for",
                                   key="stall_after")


@dataclass(frozen=True, slots=True)
class SequentialSteering:
    """bcache: raise ``sequential_cutoff`` while a volume's bypassed sequential runs are small-file creates, lower
    it back while they are streams (cachepilot.engine.seqcutoff). A pinned ``knobs: sequential_cutoff`` wins."""

    enabled: bool = setting(True, BOOLEAN, "bcache: raise sequential_cutoff while bypassed sequential runs are "
                            "small-file creates, lower it back for streams (a pinned knob wins)")
    max_cutoff: int = setting(64 * MiB, SIZE, "never raised above this")
    # evidence is judged (and the knob moved one step) at most once per window
    window_s: float = setting(30.0, DURATION, "at most one step per window", key="window")


@dataclass(frozen=True, slots=True)
class Pin:
    """Files kept in the cache whatever happens (models/pins.py): path prefixes or globs relative to the mount
    point, at most ``max_bytes`` of them (refused past the cache's room), re-read at most every ``refresh_s``
    while the cache is missing reads."""

    paths: tuple[str, ...] = setting((), strings(256, 4096), "path prefixes or file globs relative to the mount point")
    max_bytes: int = setting(0, SIZE, "bytes pinned at most (within the cache's room)")
    refresh_s: float = setting(10.0, DURATION, "re-read pinned files at most this often while the cache misses reads",
                               key="refresh")

    def check_room(self, info: VolumeInfo) -> None:
        """A cap larger than the cache could never hold: refused (UserError), where the cache's size is known."""
        if self.paths and info.cache_bytes > 0 and self.max_bytes > info.cache_bytes:
            raise UserError(f"volume {info.name}: pin.max_bytes {self.max_bytes} is more than its cache holds "
                            f"({info.cache_bytes} bytes)")


@dataclass(frozen=True, slots=True)
class VolumePolicy:
    failure_model: str = setting("destructive", enum(FAILURE_MODELS), "the failure the operator plans for: the "
                                 "cache device survives a crash (recoverable), may be lost (destructive), or chosen "
                                 "from the workload (auto)")
    exposure: Exposure = section(Exposure, "destructive: the bound on data that exists only on the cache device")
    lifetime_hold: LifetimeHold = section(LifetimeHold, "recoverable: hold new data dirty while this volume's deletes "
                                          "say it will die")
    promotion: Promotion = section(Promotion, "promotion of hot files by reading them through the cache")
    discard_on_delete: DiscardOnDelete = section(DiscardOnDelete, "deletes stand in for TRIM")
    hysteresis: Hysteresis = section(Hysteresis, "how often the write mode may switch")
    health: HealthPolicy = section(HealthPolicy, "cache errors and re-warming")
    knobs: dict[str, str] = setting_from(dict, knobs(tuple(KNOBS)), "knobs pinned to a value (cachepilot never "
                                         "moves them; each checked against its knob and the kinds a rule can match)")
    sequential_steering: SequentialSteering = section(SequentialSteering, "bcache: steering of sequential_cutoff")
    pin: Pin = section(Pin, "files kept in the cache whatever happens (no default)", required=["paths", "max_bytes"])


@dataclass(frozen=True, slots=True)
class Selector:
    device: str | None = setting(None, GLOB, "glob on the device name")
    fs_uuid: str | None = setting(None, pattern("^[0-9a-fA-F-]{8,36}$", "filesystem UUID"), "the filesystem's UUID")
    mountpoint: str | None = setting(None, pattern("^/", "absolute path"), "where the filesystem is mounted")
    kind: str | None = setting(None, enum(KINDS), "the kind of cache (knobs and modes are checked against it)")

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
    half_life_s: float = setting(600.0, DURATION, "hotness counters halve every half-life without I/O (at least 1 s)",
                                 key="hotness.half_life")
    dry_run: bool = setting(False, BOOLEAN, "decide and log, never act")

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
