"""What each kind of stock cache can do: its write modes, how it drains, its knobs with type and range, how many
rounds of reads promote a block and how the kernel names its devices.

This is the declarative half of the table of cache kinds; the other half (detect, describe, sample, the backend
class and each knob's get/set pair) is each kind's module ``backends/<kind>.py`` (collected by ``backends.kinds``,
which checks at import that the two halves name the same kinds and knobs). The declarations live here, below the
engine and the backends, so that the policy checker and schema (a rule may not ask for a mode or knob that a kind
it can match cannot take), the engine (which modes exist, what "destructive" means for a kind), promotion and the
trace format read them without importing the backends, and the backends read the range a setter enforces before
it writes. Ranges are the kernel's own (confirmed in drivers/md/bcache/sysfs.c,
dm-cache-target.c, dm-writecache.c of 6.1): a value outside is an error here rather than a silent clamp there.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass

from cachepilot import units
from cachepilot.errors import UserError

KIND_BCACHE, KIND_DMCACHE, KIND_WRITECACHE = "bcache", "dm-cache", "dm-writecache"
# A dm-cache LV managed by LVM: the same target, changed only through lvchange (backends/lvmcache.py).
KIND_LVMCACHE = "lvmcache"

# Backend-neutral write modes (the same strings as models.volume).
WRITEBACK, WRITETHROUGH, BYPASS = "writeback", "writethrough", "bypass"

UINT_MAX = (1 << 32) - 1

@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    kinds: frozenset[str]
    type: str  # "int" (a plain count, percent, µs, sectors) or "size" (bytes; a unit allowed)
    min: int
    max: int
    unit: str  # for humans: "percent", "bytes", "seconds", "sectors/s", "µs", "ms", "blocks", "jobs"
    doc: str

    def parse(self, value: object) -> int:
        """The knob's value as an integer in its unit, or UserError naming the knob and the range."""
        n = _to_int(self, value)
        if not self.min <= n <= self.max:
            raise UserError(f"knob {self.name}: {n} is outside {self.min}..{self.max} ({self.unit})")
        return n


def _to_int(knob: Knob, value: object) -> int:
    if isinstance(value, bool):
        raise UserError(f"knob {knob.name}: expected a number, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise UserError(f"knob {knob.name}: expected a whole number, got {value!r}")
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if knob.type == "int" and re.fullmatch(r"[0-9]{1,20}", text):
            return int(text)
        if knob.type == "size":
            with contextlib.suppress(ValueError):
                return units.parse_size(text)
    what = "a size (e.g. 4MiB)" if knob.type == "size" else "a whole number"
    raise UserError(f"knob {knob.name}: expected {what}, got {str(value)[:40]!r}")


def _k(name: str, kinds: tuple[str, ...], typ: str, lo: int, hi: int, unit: str, doc: str) -> Knob:
    return Knob(name, frozenset(kinds), typ, lo, hi, unit, doc)


B, D, W = (KIND_BCACHE,), (KIND_DMCACHE, KIND_LVMCACHE), (KIND_WRITECACHE,)
KNOBS: dict[str, Knob] = {k.name: k for k in (
    _k("sequential_cutoff", B, "size", 0, UINT_MAX, "bytes", "sequential runs longer than this bypass the cache"),
    _k("writeback_percent", B, "int", 0, 40, "percent", "dirty target as a share of the cache (kernel clamps 0..40)"),
    _k("writeback_delay", B, "int", 0, UINT_MAX, "seconds", "sleep after each full write-back scan"),
    _k("writeback_rate", B, "size", 512, UINT_MAX * 512, "bytes/s", "write-back rate when not throttled by percent"),
    _k("writeback_rate_minimum", B, "int", 1, UINT_MAX, "sectors/s", "write-back rate floor below the target"),
    _k("readahead", B, "size", 0, UINT_MAX, "bytes", "extra read-ahead on a read miss"),
    _k("congested_read_threshold_us", B, "int", 0, UINT_MAX, "µs", "cache-set read latency that counts as congested"),
    _k("congested_write_threshold_us", B, "int", 0, UINT_MAX, "µs", "cache-set write latency that counts as congested"),
    _k("migration_threshold", D, "int", 1, UINT_MAX, "sectors", "cap on in-flight promotion/demotion I/O"),
    _k("high_watermark", W, "int", 0, 100, "percent", "start writing back above this fill level"),
    _k("low_watermark", W, "int", 0, 100, "percent", "stop writing back below this fill level"),
    _k("max_age", W, "int", 1, 86_400_000, "ms", "write back every block first written longer ago than this"),
    _k("pause_writeback", W, "int", 0, 60_000, "ms", "write-back waits until no write went to the origin this long"),
    _k("writeback_jobs", W, "int", 1, UINT_MAX, "jobs", "cap on concurrent write-back jobs"),
    _k("autocommit_blocks", W, "int", 1, UINT_MAX, "blocks", "commit after this many written blocks"),
    _k("autocommit_time", W, "int", 1, UINT_MAX, "ms", "commit after this long"),
)}


@dataclass(frozen=True, slots=True)
class HoldKnob:
    """The knob that holds written data dirty for the lifetime rule (engine/lifetime.py): the kind writes back what
    is above a dirty target the knob sets, in percent of the cache."""

    knob: str
    stock: int  # its stock value: the hold never goes below it (nor below the value found at start)
    # The kind caches writes only below this share of the cache in use (bcache: bch_cutoff_writeback, 40%, in
    # drivers/md/bcache/writeback.h; above it writes go write-through): the room a hold has. None: the whole cache.
    write_cutoff: int | None = None
    # Percent points a new value must move from the one it has: a change reloads the device's table, which
    # suspends it (dm-writecache's watermarks are table arguments). 0: every change is cheap.
    min_step: int = 0


@dataclass(frozen=True, slots=True)
class ReadyReserve:
    """A kind whose read-miss inserts never wait for space: reads faster than its allocator refills the free list
    are served but not cached. bcache: ``bch_bucket_alloc`` with wait false for a cache miss, each refusal the
    ``bcache_alloc_fail`` tracepoint of the module named here; the free list holds ``roundup_pow_of_two(nbuckets)
    >> 10`` buckets (``cache_alloc`` in super.c), at least 1/1024 of the cache. The promoter paces on the refusals
    (actuators/allocpace.py) and reads no more at once than the reserve (actuators/promote.default_burst)."""

    module: str  # the kernel module whose tracepoint reports a refused insert (the probe attaches when it is loaded)
    shift: int  # the reserve is at least cache bytes >> shift


@dataclass(frozen=True, slots=True)
class Capabilities:
    kind: str
    modes: frozenset[str]
    kernel_mode_names: dict[str, str]  # backend-neutral mode -> what the kernel calls it
    drain: str  # how a drain is carried out, for humans and logs
    destructive: str  # what the destructive failure model means for this kind
    # A knob (seconds) for which a drain may have to wait before any write-back starts: bcache's write-back
    # thread sleeps writeback_delay after each full scan of the dirty keys and no sysfs write cuts that sleep
    # short (drivers/md/bcache/writeback.c, bch_writeback_thread). The engine bounds it under the destructive
    # model so that a drain fits its window.
    drain_sleep_knob: str | None = None
    # Whether the kind writes back recently written dirty blocks only once the device has been idle (no I/O for
    # a second): dm-cache (spare_migration_bandwidth() in drivers/md/dm-cache-target.c; under load smq and the
    # cleaner take only blocks behind a writeback sentinel, which move every WRITEBACK_PERIOD, 10 s, and a block
    # written again goes back to the end of the queue; in writethrough a write to a dirty block keeps it dirty).
    # Measured in the lab (6.1): with the cleaner loaded and 4 KiB random reads on the origin, the last 101 dirty
    # blocks stayed dirty 20.4 s; under the fileserver benchmark 9 blocks stayed dirty for the whole 29 s of a
    # drain; with the origin idle, 155 were clean within 2 s. The engine holds promotions (reads that keep the
    # device busy) while such a drain is at risk.
    drain_needs_idle: bool = False
    # Whether a drain swaps the cache's replacement policy out and back, and so costs the policy what it learnt:
    # dm-cache drains with the cleaner policy (a table reload and back). smq's hotspot queue (which origin regions
    # are hot, what drives its promotions) and its hit statistics live only in memory (__smq_create in
    # drivers/md/dm-cache-policy-smq.c builds them empty for every table); its per-block levels survive a reload
    # only as hints saved under the policy's name (write_hints at suspend, policy_unchanged at load in
    # dm-cache-metadata.c): smq -> smq keeps them, smq -> cleaner -> smq finds "cleaner" and starts every cached
    # block at a random level (smq_load_mapping). The engine keeps such a volume write-through while its writes
    # are a trickle (engine/writepolicy.py), so that the destructive bound needs no drains there.
    drain_replaces_policy: bool = False
    # The knob that sets a floor under the kind's own write-back rate, in sectors/s, for pacing (engine/pacing.py).
    # bcache: with writeback_percent > 0, read_dirty() sleeps bch_next_delay() between batches at a rate the PI
    # controller keeps at or above writeback_rate_minimum (__update_writeback_rate; below its dirty target the rate
    # *is* the minimum, 8 sectors/s by default: dirty data sits until a drain). A drain (writeback_percent 0) has
    # no rate limit -- writeback_delay() returns 0 -- and up to 64 write-backs in flight (dc->in_flight) at idle
    # priority, so the fsyncs during it queue behind a burst (W1: fsync p99 1.98x write-through's). Written back
    # at the write rate between drains, the dirty data a drain finds stays small (drivers/md/bcache/writeback.c).
    pace_knob: str | None = None
    # Why the kind has no write-back rate for ``cachepilot drain --rate`` when it has no pace_knob (what it has
    # instead): dm-cache's migration_threshold caps the sectors of migration I/O in flight (spare_migration_bandwidth),
    # dm-writecache's writeback_jobs the write-backs in flight; neither is a rate.
    no_rate: str = ""
    # Rounds of promotion reads the cache needs before it admits a block (actuators.promote; 0: it never caches
    # reads).
    promote_rounds: int = 1
    # Whether the kernel can hold the exposure bound itself, so that the destructive model delegates it instead of
    # draining everything every max_age/2 (engine.nativebound): dm-writecache's max_age writes back, oldest first,
    # every block first written 15/16 of it ago (writecache_writeback, re-queued every max_age/16 by
    # writecache_max_age_timer) and its high/low_watermark write back above a fill level; both are table arguments.
    native_bound: bool = False
    # Whether a completed drain means "every block dirty when it started is clean", not "the cache read clean":
    # dm-writecache's flush message returns once writecache_writeback, under writeback_all, has walked the whole
    # tree and waited for every write-back (process_flush_mesg); blocks written meanwhile may be dirty again. The
    # engine then moves the clean point to the drain's start, and a drain under a steady load ends.
    drain_done_as_of_start: bool = False
    device_prefix: str = "dm-"  # how the kernel names its devices (what a policy's device glob can match)
    # Whether the kernel reports the cache device's I/O errors (bcache: cache0/io_errors, a decaying count;
    # dm-writecache: its status's error field). dm-cache keeps none: its status only turns to Fail.
    error_counts: bool = False
    # Whether the kind's status shows a dead cache device only once its metadata is committed, so that a status
    # read without a commit (the daemon's, backends/dmioctl.py) can show a healthy cache for as long as nothing
    # commits. dm-cache (drivers/md/dm-cache-target.c, 6.1): the cache turns read-only/failed (status "Error" or
    # "Fail") only when a metadata operation fails (metadata_operation_failed); its own commits run only when the
    # metadata changed (commit_op: dm_cache_changed_this_transaction; do_waker's schedule_commit each second
    # commits only for bios waiting on one, and commit_op skips dm_cache_commit with no change), and writes to
    # cached blocks, I/O errors and failed copies change none; cache_status commits first unless asked with
    # DM_NOFLUSH. Lab (6.1): both cache devices dead, data I/O errors and an fsync left the status unchanged for
    # 30 s. The backend reads status with a commit every FAILURE_COMMIT_S instead (backends/operation.py).
    failure_seen_at_commit: bool = False
    # Whether the kind inserts its own read misses, readahead and O_DIRECT ones included: bcache does
    # (check_should_bypass in drivers/md/bcache/request.c bypasses readahead only when cache_readahead_policy is
    # not "all", and "all" is the default; lab 6.1: 2 056 of 2 087 readahead bios hit). A promotion there adds only
    # what it bypassed (sequential runs, congestion), which its read bypass counters show. dm-cache's smq
    # promotes only on repeated hotspot hits: not this rule, but promotes_own_misses below.
    inserts_read_misses: bool = False
    # Whether the kind's replacement policy promotes hot blocks from the workload's own read misses, so that a
    # promotion read of a file the workload keeps reading only repeats what the policy does anyway, at a cost:
    # dm-cache's smq counts read misses per hotspot and copies a block in once its level passes the promote level
    # (smq_lookup_with_work -> should_promote, dm-cache-policy-smq.c). A promotion read there takes two rounds of
    # reads per block (promote_rounds) before smq's own copy, each a miss on the origin while the block is not
    # cached -- measured in the lab's W3 (Zipf readers, a 150-IOPS origin): the daemon's promotion reads of its
    # hottest files lowered the workload's hit ratio (docs/benchmarks.md, W3). Admitted files are then left to the
    # policy (promotion.only_uncached); pins, imported hot lists and re-warms are still read.
    promotes_own_misses: bool = False
    # The knob the lifetime rule holds young data dirty with (engine/lifetime.py); None: the kind has none.
    hold: HoldKnob | None = None
    # Read-miss inserts refused when the allocator's free list is empty (None: the kind waits for space).
    ready_reserve: ReadyReserve | None = None
    # Whether the kind bypasses by a per-task history of I/O runs that a new thread inherits from its creator:
    # bcache's sequential_io_avg (check_should_bypass), not reset by copy_process when bcache is a module
    # (actuators/taskruns.py). The promoter's reader threads shed it before their first read.
    inherits_run_history: bool = False
    # Whether the volume's cache identity (VolumeInfo.cache_id) names a cache set that several volumes may share
    # (bcache: the cache set's UUID; status shows it as cache_set). dm caches have one cache device per volume.
    shared_cache_set: bool = False

    def knobs(self) -> dict[str, Knob]:
        return {n: k for n, k in KNOBS.items() if self.kind in k.kinds}


_MIGRATION_CAP = "migration_threshold caps the sectors of migration I/O in flight, not a rate: set it as a knob"

CAPABILITIES: dict[str, Capabilities] = {
    KIND_BCACHE: Capabilities(
        KIND_BCACHE, frozenset({WRITEBACK, WRITETHROUGH, BYPASS}),
        {WRITEBACK: "writeback", WRITETHROUGH: "writethrough", BYPASS: "none"},
        drain="writeback_percent 0 until dirty_data is 0, then restore",
        destructive="write-back with a periodic drain; write-through before the byte bound",
        drain_sleep_knob="writeback_delay", pace_knob="writeback_rate_minimum",
        promote_rounds=1, device_prefix="bcache", error_counts=True, inserts_read_misses=True,
        hold=HoldKnob("writeback_percent", 10, write_cutoff=40), ready_reserve=ReadyReserve("bcache", 10),
        shared_cache_set=True, inherits_run_history=True,
    ),
    KIND_DMCACHE: Capabilities(
        KIND_DMCACHE, frozenset({WRITEBACK, WRITETHROUGH, BYPASS}),
        {WRITEBACK: "writeback", WRITETHROUGH: "writethrough", BYPASS: "passthrough"},
        drain="table reload to writethrough with the cleaner policy until dirty is 0, then the previous table",
        destructive="write-back with a periodic drain; write-through before the byte bound",
        drain_needs_idle=True, drain_replaces_policy=True, promotes_own_misses=True,
        promote_rounds=2,  # smq promotes a block once its hotspot has been hit in two of its one-second ticks
        no_rate=_MIGRATION_CAP,
        failure_seen_at_commit=True,
    ),
    KIND_LVMCACHE: Capabilities(
        KIND_LVMCACHE, frozenset({WRITEBACK, WRITETHROUGH, BYPASS}),
        {WRITEBACK: "writeback", WRITETHROUGH: "writethrough", BYPASS: "passthrough"},
        drain="lvchange --cachepolicy cleaner until dirty is 0, then lvchange back to the saved mode and policy",
        destructive="write-back with a periodic drain; write-through before the byte bound",
        drain_needs_idle=True, drain_replaces_policy=True, promotes_own_misses=True,
        promote_rounds=2,  # smq, as dm-cache
        no_rate=_MIGRATION_CAP,
        failure_seen_at_commit=True,
    ),
    KIND_WRITECACHE: Capabilities(
        KIND_WRITECACHE, frozenset({WRITEBACK}), {WRITEBACK: "writeback"},
        drain="the flush message (returns when every block is written back)",
        destructive="write-back only: the bound is kept by flushing, never by a mode switch",
        promote_rounds=0,  # dm-writecache never caches reads
        error_counts=True, native_bound=True, drain_done_as_of_start=True,
        hold=HoldKnob("high_watermark", 50, min_step=5),
        no_rate="writeback_jobs caps the write-backs in flight, not a rate: set it as a knob",
    ),
}
KNOB_TYPES = ("int", "size")


def check(table: dict[str, Capabilities], knobs: dict[str, Knob]) -> None:
    """The declarations' own checks, run when this module is imported: a kind that breaks one fails at once, not at
    its first write."""
    for k in knobs.values():
        if k.type not in KNOB_TYPES or k.min > k.max or not k.kinds <= table.keys():
            raise TypeError(f"knob {k.name} is not a typed, ranged knob of declared kinds")
    for name, c in table.items():
        if c.kind != name:
            raise TypeError(f"kind {name}: its capabilities say {c.kind!r}")
        if not c.modes <= set(c.kernel_mode_names):
            raise TypeError(f"kind {name}: a write mode without a kernel name")
        sleep = knobs.get(c.drain_sleep_knob or "")
        if c.drain_sleep_knob is not None and (sleep is None or name not in sleep.kinds):
            raise TypeError(f"kind {name}: drain_sleep_knob {c.drain_sleep_knob} is not a knob of it")
        hold = knobs.get(c.hold.knob) if c.hold is not None else None
        if c.hold is not None and (hold is None or name not in hold.kinds or not hold.min <= c.hold.stock <= hold.max):
            raise TypeError(f"kind {name}: hold knob {c.hold.knob} is not a knob of it, or its stock value is out "
                            "of the knob's range")


check(CAPABILITIES, KNOBS)
KINDS = tuple(CAPABILITIES)
ERROR_COUNTS = frozenset(k for k, c in CAPABILITIES.items() if c.error_counts)
SHARED_CACHE_SETS = frozenset(k for k, c in CAPABILITIES.items() if c.shared_cache_set)


def capabilities(kind: str) -> Capabilities:
    try:
        return CAPABILITIES[kind]
    except KeyError:
        raise UserError(f"unknown cache kind {kind!r} (known: {', '.join(KINDS)})") from None
