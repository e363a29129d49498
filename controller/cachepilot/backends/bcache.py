"""bcache: one instance per /dev/bcacheN, through its sysfs (``block/bcacheN/bcache`` and its cache set).

What the kernel does (drivers/md/bcache/sysfs.c, writeback.c, 6.1): writing ``cache_mode`` only rewrites the
superblock — dirty data stays dirty and drains at the write-back controller's pace. So every switch that must
not leave dirty data behind drains first: ``writeback_percent`` 0 (no throttling) until ``dirty_data`` is 0 and
``state`` is clean, then the old percent is put back. The write-back thread also sleeps ``writeback_delay``
(default 30 s) after every full scan of the dirty keys, and that sleep is not cut short by any sysfs write: a
drain sets it to 0 for its duration, and a policy that needs quick drains pins it low.
writeback→writethrough switches the mode first (so no new dirty data appears and the drain converges under
load), then drains; bypass (``none``) is written only once the cache is clean, from writethrough.
Sizes in sysfs are human-readable (``4.0M``); a read-back is compared at the precision it is printed with.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cachepilot import units
from cachepilot.actions import ControlAction, Detach, Drain, SetWritePolicy
from cachepilot.backends.base import Outcome, Write
from cachepilot.backends.host import BlockDev, Host
from cachepilot.backends.inspect import parse_bcache_size
from cachepilot.backends.kernelio import read_attr, write_attr
from cachepilot.backends.kinds import Described, Kind, KnobDef, Reattach
from cachepilot.backends.operation import CLOSE_BELOW, Operation, OperationBackend, Setting
from cachepilot.capabilities import BYPASS, KIND_BCACHE, KNOBS, WRITEBACK, WRITETHROUGH, Knob, capabilities
from cachepilot.errors import DeviceGone, KernelRejected, UserError
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.models.writeback import WritebackView

NS = 1_000_000_000

NAME = KIND_BCACHE
NO_CACHE = "no cache"  # a backing device's ``state`` with no cache set attached (sysfs.c, bdev_state)
log = logging.getLogger("cachepilot.backends")

# Knobs that live on the cache set rather than on the backing device.
_CSET_KNOBS = frozenset({"congested_read_threshold_us", "congested_write_threshold_us"})


def bracketed(line: str) -> str:
    """``writethrough [writeback] writearound none`` -> ``writeback``."""
    return next((w.strip("[]") for w in line.split() if w.startswith("[")), line.strip())


def size_matches(readback: str, wanted: str) -> bool:
    """bcache prints sizes rounded (``4.0M``): equal within one unit of the last printed digit. ``wanted`` may itself
    be such a print (a value found before steering, put back on exit)."""
    try:
        want = int(wanted)
    except ValueError:
        if readback == wanted:
            return True
        if readback.strip().isdigit():
            return units.printed_matches(wanted, int(readback))
        try:
            return units.printed_matches(readback, parse_bcache_size(wanted))
        except UserError:
            return False
    return units.printed_matches(readback, want) or readback == wanted


def size_text(value: str) -> str:
    """What a size knob's sysfs file takes: bytes. bcache's parser (util.c ``bch_strtoul_h``) takes an integer with
    an optional unit and refuses its own rounded print (``4.0M``), which is what a value found before steering is."""
    text = value.strip()
    return text if text.isdigit() else str(parse_bcache_size(text))


class BcacheBackend(OperationBackend):
    kind = NAME
    # a drain writes writeback_running, _delay and _percent (and cache_mode for its last stretch), a switch
    # cache_mode: none of these
    knobs_beside_operations = frozenset({"sequential_cutoff", "readahead", "congested_read_threshold_us",
                                         "congested_write_threshold_us", "writeback_rate_minimum"})

    @property
    def dir(self) -> Path:
        return self.sysfs_root / "block" / self.info.name / "bcache"

    _slow: SlowReads | None = None  # the slow part of the last sample (sample_with)

    def sample(self, now_ns: int) -> VolumeSample:
        """The slow part is read again after SLOW_EVERY_NS, at once after any action, and every tick while an
        operation is in flight (a drain writes knobs over several ticks)."""
        last = self._slow
        fresh = last is not None and not self._ops and 0 <= now_ns - last.ts_ns < SLOW_EVERY_NS
        out, self._slow = sample_with(self.host, self.info, now_ns, last if fresh else None)
        return out

    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        self._slow = None  # whatever it writes, the next sample reads it back
        return super().apply(action, dry_run=dry_run)

    def restore(self) -> list[Outcome]:
        self._slow = None
        return super().restore()

    # -------------------------------------------------------------- settings
    def _attr(self, name: str, base: Path | None = None) -> Setting:
        path = (base or self.dir) / name
        return Setting(f"{self.info.name} {name}", lambda: read_attr(path), lambda v: write_attr(path, v))

    def mode_setting(self) -> Setting:
        path = self.dir / "cache_mode"
        return Setting(f"{self.info.name} cache_mode", lambda: bracketed(read_attr(path)),
                       lambda v: write_attr(path, v))

    def knob_setting(self, knob: Knob) -> Setting:
        name = knob.name
        base = self.dir / "cache" if name in _CSET_KNOBS else self.dir
        path = base / name
        target = f"{self.info.name} {name}"
        if name == "writeback_rate":  # read as bytes/s (human), written in sectors/s
            return Setting(target, lambda: str(parse_bcache_size(read_attr(path))),
                           lambda v: write_attr(path, str(max(1, int(v) // 512))),
                           lambda rb, want: abs(int(rb) - int(want)) <= max(512, int(want) // 10))
        if knob.type == "size":
            return Setting(target, lambda: read_attr(path), lambda v: write_attr(path, size_text(v)), size_matches)
        return self._attr(name, base)

    def dirty_bytes(self) -> int:
        return parse_bcache_size(read_attr(self.dir / "dirty_data"))

    def clean(self) -> bool:
        """No dirty data and the superblock says clean (or there is no cache at all)."""
        return self._clean(self.dirty_bytes())

    def _clean(self, dirty: int) -> bool:
        """clean() with dirty_data already read (``dirty`` bytes): the state is read only when it is 0."""
        return dirty == 0 and read_attr(self.dir / "state") in ("clean", NO_CACHE)

    # -------------------------------------------------------------- operations
    def _start(self, op: Operation) -> bool:
        a = op.action
        if isinstance(a, Drain):
            return self._begin_drain(op, a.reason)
        if isinstance(a, Detach):
            return self._begin_detach(op, a)
        assert isinstance(a, SetWritePolicy)
        if a.mode not in self.caps.modes:
            raise KernelRejected(f"bcache has no write mode {a.mode!r}")
        kernel_mode = self.caps.kernel_mode_names[a.mode]
        mode = self.mode_setting()
        if a.mode == WRITEBACK:
            op.put(mode, kernel_mode, a.reason)
            return True
        current = mode.get()
        if a.mode == WRITETHROUGH or current == "writeback":
            # Stop new dirty data first: in writethrough every write goes to the backing device.
            op.put(mode, "writethrough", a.reason if a.mode == WRITETHROUGH else f"{a.reason} (clean first)")
        if self._begin_drain(op, a.reason):
            return self._finish_switch(op)
        return False

    def _begin_drain(self, op: Operation, reason: str) -> bool:
        dirty = self.dirty_bytes()
        if self._clean(dirty):
            op.phase = "clean"
            return True
        op.phase = "draining"
        op.data["start_dirty"] = str(dirty)
        op.save(self._attr("writeback_running"), "1", f"drain: {reason}")
        # No sleep after each full scan of the dirty keys (a sleep already begun cannot be cut short; under the
        # destructive model the engine keeps writeback_delay within the drain window for that reason).
        op.save(self._attr("writeback_delay"), "0", f"drain: {reason}")
        rate = op.action.rate if isinstance(op.action, Drain) else 0
        if rate:
            self._pace(op, rate, reason)
        else:
            op.save(self._attr("writeback_percent"), "0", f"drain: {reason}")
        return False

    def _pace(self, op: Operation, rate: int, reason: str) -> None:
        """A paced drain (engine/pacing.py): write-back throttled to ``rate`` bytes/s instead of unthrottled. With
        writeback_percent > 0 read_dirty() sleeps bch_next_delay() between write-backs at writeback_rate, which
        __update_writeback_rate() keeps at or above writeback_rate_minimum (below the dirty target it *is* the
        minimum, so the drain goes on to 0). The rate is written too, because the controller only recomputes it
        every writeback_rate_update_seconds (5 s by default; 1 s while the drain runs); it is not put back: the
        controller recomputes it from the settings put back."""
        why = f"paced drain: {reason}"
        op.data["paced"] = str(rate)
        sectors = str(max(1, rate // 512))
        op.put(self.knob_setting(KNOBS["writeback_rate"]), str(rate), why)
        op.save(self._attr("writeback_percent"), "1", why)
        op.save(self._attr("writeback_rate_minimum"), sectors, why)
        op.save(self._attr("writeback_rate_update_seconds"), "1", why)

    def _fold_writethrough(self, op: Operation, reason: str) -> bool:
        """A write-through switch asked for during a drain: cache_mode writethrough now (no new dirty data), and
        not put back when the drain ends -- the drain's own write-back settings are. The drain goes on at its
        full rate; one operation, so the switch never collides with it."""
        mode = self.mode_setting()
        op.saved = [(s, before) for s, before in op.saved if s.target != mode.target]
        op.put(mode, "writethrough", f"{reason} (folded into the drain in flight)")
        op.phase = "closing"
        op.data["end_mode"] = "writethrough"
        return True

    def _begin_detach(self, op: Operation, a: Detach) -> bool:
        """``detach`` written (super.c bch_cached_dev_detach: the write-back thread writes back what is still dirty,
        then cached_dev_detach_finish unlinks the cache set); done once ``state`` reads "no cache", polled each tick
        until the action's deadline. The bcacheN device and its mount keep serving throughout."""
        state = read_attr(self.dir / "state")
        if state == NO_CACHE:
            op.phase = NO_CACHE
            return True
        target = f"{self.info.name} detach"
        if op.dry_run:
            op.writes.append(Write(target, state, "1", "(dry run)"))
            return True
        write_attr(self.dir / "detach", "1")
        after = read_attr(self.dir / "state")
        op.writes.append(Write(target, state, "1", after))
        log.info("%s: %s -> 1 (state %s, read back %s): %s", target, state, state, after, a.reason)
        op.phase = f"detaching (state {after}, {self.dirty_bytes()} dirty bytes to write back first)"
        return after == NO_CACHE

    def _advance_detach(self, op: Operation) -> bool:
        state = read_attr(self.dir / "state")
        if state == NO_CACHE:
            op.writes.append(Write(f"{self.info.name} state", op.writes[-1].readback if op.writes else "", NO_CACHE,
                                   state))
            op.phase = f"{NO_CACHE}: the backing device serves alone"
            return True
        op.phase = f"detaching (state {state}, {self.dirty_bytes()} dirty bytes to write back first)"
        return False

    def _advance(self, op: Operation, now_ns: int) -> bool:
        if isinstance(op.action, Detach):
            return self._advance_detach(op)
        dirty = self.dirty_bytes()  # one read a step (issue 32 item 3): the clean test and the close test share it
        if not self._clean(dirty):
            self._unpace_if_behind(op, now_ns, dirty)
            if op.phase == "draining" and isinstance(op.action, Drain) and \
                    op.close_due(now_ns, dirty, CLOSE_BELOW):
                op.phase = "closing"  # the saved mode is put back with the other settings
                op.save(self.mode_setting(), "writethrough", f"drain, last stretch: {op.action.reason}")
            return False
        self._put_back(op, f"drained: {op.action.reason}")
        op.phase = "clean"
        if isinstance(op.action, SetWritePolicy):
            return self._finish_switch(op)
        if op.data.get("end_mode") and not op.dry_run and self.mode_setting().get() != op.data["end_mode"]:
            raise KernelRejected(f"{self.info.name}: not {op.data['end_mode']} after the drain it was folded into")
        return True

    def _unpace_if_behind(self, op: Operation, now_ns: int, dirty: int) -> None:
        """A paced drain that could not end by its deadline at its pace goes to the full rate (writeback_percent 0;
        the value saved when it began is what is put back): the exposure bound comes first. Behind: the dirty data
        left would take more than half the time left at the paced rate (a burst of writes outran the pace)."""
        rate = int(op.data.get("paced", "0"))
        if not rate or op.phase != "draining":
            return
        left_ns = op.deadline_ns - now_ns
        if dirty * NS // rate <= left_ns // 2:
            return
        del op.data["paced"]
        op.put(self._attr("writeback_percent"), "0", (
            f"paced drain behind: {dirty} dirty bytes at {rate} B/s would take {dirty / rate:.1f} s of the"
            f" {left_ns / NS:.1f} s left; full rate: {op.action.reason if isinstance(op.action, Drain) else ''}"))

    def _finish_switch(self, op: Operation) -> bool:
        """The cache is clean: write the target mode (bypass only now), then verify mode and cleanliness."""
        a = op.action
        assert isinstance(a, SetWritePolicy)
        want = self.caps.kernel_mode_names[a.mode]
        if a.mode == BYPASS:
            op.put(self.mode_setting(), want, a.reason)
        if not op.dry_run and (self.mode_setting().get() != want or not self.clean()):
            raise KernelRejected(f"{self.info.name}: not {want} and clean after the switch")
        op.phase = f"{want}, clean"
        return True


# ------------------------------------------------------------------ the kind: discovery, description, samples
def detect(dev: BlockDev) -> bool:
    """A bcache device (bcacheN; a cache device also has a ``bcache`` directory, but is not a volume)."""
    return dev.name.startswith("bcache") and (dev.sysdir / "bcache").is_dir()


def _cache_id(sysfs: Path | str) -> str:
    """The cache set's UUID (the directory ``bcache/cache`` links to), or "" when detached. A new cache device
    makes a new cache set, so a new UUID: this is what lets a failure latch end when the device is replaced."""
    link = os.path.join(sysfs, "cache")
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return ""


def describe(host: Host, dev: BlockDev) -> Described:
    sysfs = dev.sysdir / "bcache"
    cset = sysfs / "cache"
    if not cset.exists():
        return Described(0, _cache_id(sysfs))  # detached: no cache
    cache_dev = (cset / "cache0").resolve().parent  # .../block/<cache device>/bcache -> the device
    # discard_unit: a sector (bch_data_invalidate covers the discard's sectors exactly)
    return Described(int(read_attr(cache_dev / "size")) * 512, _cache_id(sysfs), 512)


SAMPLED_KNOBS = ("sequential_cutoff", "writeback_percent", "writeback_delay")


@functools.lru_cache(maxsize=256)
def _sample_paths(sys_block: Path, name: str) -> dict[str, str]:
    """The attributes a sample reads, as strings, built once per volume: joining pathlib paths cost more than
    the reads themselves (21 joins a sample, 60% of its CPU; a tick samples every volume; issue 23 item 5)."""
    sysfs = sys_block / name / "bcache"
    paths = {k: str(sysfs / k) for k in ("cache_mode", "cache", "dirty_data", *SAMPLED_KNOBS)}
    paths |= {k: str(sysfs / "stats_total" / k)
              for k in ("cache_hits", "cache_misses", "cache_bypass_hits", "cache_bypass_misses", "bypassed")}
    paths |= {k: str(sysfs / k) for k in ("writeback_running", "writeback_rate")}
    paths |= {"io_errors": str(sysfs / "cache" / "cache0" / "io_errors"),
              "cache_available_percent": str(sysfs / "cache" / "cache_available_percent"), "sysfs": str(sysfs)}
    return paths


# What a sample need not read every tick (issue 32: one read per volume per tick where several were made): bcache
# folds its hit/miss/bypass counters into stats_total only every 300/22 s (stats.c, accounting_delay), and the knobs
# and the write-back thread's running/rate change at a write -- ours (a backend that acted reads them again at once)
# or an operator's (seen within this long).
SLOW_EVERY_NS = 5_000_000_000


@dataclass(frozen=True)
class SlowReads:
    """The part of a sample read every SLOW_EVERY_NS (and after any action of this backend's)."""

    ts_ns: int
    knobs: dict[str, str]
    hits: int
    misses: int
    bypasses: int
    bypassed_bytes: int
    running: str | None  # writeback_running
    rate: str | None  # writeback_rate


def _slow_reads(p: dict[str, str], now: int) -> SlowReads:
    return SlowReads(
        now, {k: read_attr(p[k]) for k in SAMPLED_KNOBS}, int(read_attr(p["cache_hits"])),
        int(read_attr(p["cache_misses"])),
        # a bypass "hit" is a bypassed I/O whose data was in the cache anyway; both went around it
        int(read_attr(p["cache_bypass_hits"])) + int(read_attr(p["cache_bypass_misses"])),
        parse_bcache_size(read_attr(p["bypassed"])), _optional(p["writeback_running"]),
        _optional(p["writeback_rate"]))


def sample(host: Host, info: VolumeInfo, now: int) -> VolumeSample:
    """Every attribute read now (the CLI's one-off look; the daemon's backends use :func:`sample_with`)."""
    return sample_with(host, info, now, None)[0]


def sample_with(host: Host, info: VolumeInfo, now: int, slow: SlowReads | None) -> tuple[VolumeSample, SlowReads]:
    """A sample: the mode, the cache's presence and health and the dirty data read now; the rest from ``slow``
    when it is given (else read now, and returned for the next samples)."""
    p = _sample_paths(host.sys_block, info.name)
    mode = bracketed(read_attr(p["cache_mode"]))
    attached = os.path.exists(p["cache"])
    errors, in_use = 0, None
    if attached:
        try:
            errors = int(read_attr(p["io_errors"]))
            avail = p["cache_available_percent"]
            in_use = 100 - int(read_attr(avail)) if os.path.exists(avail) else None
        except DeviceGone:
            attached = False  # the cache set went away between the two reads
    dirty = parse_bcache_size(read_attr(p["dirty_data"]))
    s = slow if slow is not None else _slow_reads(p, now)
    return VolumeSample(
        dev=info.dev, ts_ns=now, mode=mode, dirty_bytes=dirty, hits=s.hits, misses=s.misses,
        io_errors=errors, failed=not attached, cache_id=_cache_id(p["sysfs"]) if attached else "",
        knobs=dict(s.knobs), writeback=_writeback(s, info) if attached else None,
        bypasses=s.bypasses, bypassed_bytes=s.bypassed_bytes, in_use_percent=in_use,
    ), s


def _optional(path: str) -> str | None:
    """An attribute an older kernel or a fixture tree may lack (None then)."""
    try:
        return read_attr(path)
    except (DeviceGone, KernelRejected, OSError):
        return None


def _writeback(s: SlowReads, info: VolumeInfo) -> WritebackView:
    """What the stall watch needs (models/writeback.py): whether the write-back thread may run, its rate, and the
    dirty data bcache holds on purpose -- below its target (cache size x writeback_percent / 100, this device's share
    of it: the whole when it is the set's only backing device, less otherwise, so the watch may miss a stall between
    the two) the controller writes back at writeback_rate_minimum; writeback_percent 0 holds nothing. The thread
    sleeps writeback_delay after each full scan: twice that may pass with nothing written back."""
    running, rate, knobs = s.running, s.rate, s.knobs
    try:
        percent, delay = int(knobs["writeback_percent"]), float(knobs["writeback_delay"])
    except (KeyError, ValueError):
        percent, delay = 0, 0.0
    try:
        rate_bytes = parse_bcache_size(rate) if rate is not None else None
    except UserError:
        rate_bytes = None
    return WritebackView(running=None if running is None else running.strip() != "0", rate_bytes=rate_bytes,
                         hold_bytes=info.cache_bytes * percent // 100, quiet_s=2 * delay)


def _knob(knob: Knob) -> KnobDef:
    return KnobDef(knob.name, lambda b: b.knob_setting(knob))


# Modes, drain and knobs with their ranges: cachepilot.capabilities; every knob is a sysfs attribute.
def cache_devices(host: Host, name: str) -> tuple[int, ...]:
    """The cache set's cache device (``.../block/<dev>/bcache``), which ``slaves`` does not list."""
    cache0 = host.sys_block / name / "bcache" / "cache" / "cache0"
    d = host.dev_of(cache0.resolve().parent) if cache0.exists() else None
    return () if d is None else (d,)


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def attach(host: Host, name: str, dm_name: str, cset: str) -> Write:  # noqa: ARG001 (a bcache device has no dm name)
    """``attach`` with the cache set's UUID (super.c bch_cached_dev_attach runs in the write: EINVAL/ENOENT for a
    set it cannot attach to); read back from the ``cache`` link, which names the set."""
    d = host.sys_block / name / "bcache"
    before = read_attr(d / "state")
    write_attr(d / "attach", cset)
    after = _cache_id(d)
    if after != cset:
        raise KernelRejected(f"{name}: attached to {cset}, the cache link reads {after or 'nothing'}")
    log.info("%s attach: state %s -> %s (the cache link reads %s, state %s): operator attach", name, before, cset,
             after, read_attr(d / "state"))
    return Write(f"{name} attach", before, cset, after)


REATTACH = Reattach("the cache set's UUID (ls /sys/fs/bcache)", lambda c: bool(_UUID.match(c)), attach,
                    lambda cache_id, writes: cache_id)

KIND = Kind(NAME, BcacheBackend, detect, describe, sample,
            knobs=tuple(_knob(k) for k in capabilities(NAME).knobs().values()), cache_devices=cache_devices,
            reattach=REATTACH)
