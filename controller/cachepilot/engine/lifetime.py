"""Lifetime-aware write-back: keep new data dirty in the cache as long as the volume's deletes say it is likely to
die, so that the delete's discard kills it there instead of the cache writing it back (recoverable model).

The evidence: each delete of a file whose first write the probe saw gives one age (delete time minus that first
write, ``HotnessTable.born``), weighted by the file's bytes, in a per-volume histogram of log-spaced buckets
(``FIRST_EDGE_S`` x 2^i), decayed with a half-life of ``DECAY_S`` so that a change of workload shows within the
hour. The hold is the age by which ``share`` of the deleted bytes had died (that bucket's upper edge), at most
``max_hold``. A file that existed before the daemon saw its first write looks younger than it is: the hold errs
short, towards stock behaviour.

The lever, as the 6.1 sources have it (drivers/md/bcache/writeback.c): bcache writes dirty keys back in LBA order,
not age order; its PI controller aims dirty data at ``writeback_percent`` of the cache (times the device's share)
and below that target writes at ``writeback_rate_minimum`` (8 sectors/s): data below the target *sits*.
``writeback_delay`` only sleeps after a full pass over the dirty keys, and ``writeback_rate`` is recomputed every
``writeback_rate_update_seconds`` unless ``writeback_percent`` is 0: neither holds data back by its age. So the
hold is a target: a byte written at R bytes/s stays dirty about target / R (Little's law, when write-back takes
keys in an order unrelated to their age); the target is ``SLACK`` x R x hold. The room: bcache caches writes only
while its in-use share is below ``bch_cutoff_writeback`` (40%; only REQ_SYNC writes up to
``bch_cutoff_writeback_sync``, 70%), module parameters fixed at load and not readable in sysfs; "in use" also
counts metadata and buckets allocated since the last GC, so the target stays ``headroom`` below 40%, and never
below the stock 10%. dm-writecache writes back only above ``high_watermark`` (50% by default) or past ``max_age``
(unset by default): its hold is ``high_watermark``, which 6.1 changes only by a table reload (its messages are
flush, flush_on_suspend, cleaner and clear_stats), kept ``headroom`` below full (writes wait for a free block
there); it moves only by a few points or more, since each change suspends the device. Each kind's knob, stock
value, write cutoff and step are its declared ``hold`` (``cachepilot.capabilities.HoldKnob``).

Every change is a knob request with its reason (the quantile, the write rate, the room), read back by the backend
and put back when the daemon stops (``SetKnob.put_back_on_exit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from cachepilot.capabilities import CAPABILITIES, KNOBS, HoldKnob
from cachepilot.engine.knobs import knob_value
from cachepilot.models.hotness import HotnessTable, deletes_array
from cachepilot.models.volume import VolumeInfo, VolumeState
from cachepilot.policy.model import LifetimeHold, VolumePolicy

NS = 1_000_000_000
FIRST_EDGE_S = 0.5  # upper edge of the first bucket; bucket i holds ages up to FIRST_EDGE_S * 2**i
BUCKETS = 20  # the last one (up to ~3 days) also takes every older age
DECAY_S = 1800.0  # half-life of the histogram's weights
MIN_EVIDENCE = 4 << 20  # deleted bytes (decayed) before the histogram says anything
RATE_TAU_S = 60.0  # time constant of the write-rate average
SLACK = 2.0  # write-back order is not age order: hold twice the bytes Little's law asks for


class DeleteAges:
    """Bytes deleted by age at delete: log-spaced buckets, weights halving every DECAY_S (bounded: BUCKETS floats)."""

    def __init__(self) -> None:
        self.bytes = [0.0] * BUCKETS
        self.at_ns = 0

    def _decay(self, now_ns: int) -> None:
        if now_ns > self.at_ns:
            if self.at_ns:
                f = 0.5 ** ((now_ns - self.at_ns) / NS / DECAY_S)
                self.bytes = [b * f for b in self.bytes]
            self.at_ns = now_ns

    def add(self, age_ns: int, nbytes: int, now_ns: int) -> None:
        self._decay(now_ns)
        age = max(0.0, age_ns / NS)
        i = 0 if age <= FIRST_EDGE_S else min(BUCKETS - 1, math.ceil(math.log2(age / FIRST_EDGE_S)))
        self.bytes[i] += max(0, nbytes)

    def total(self) -> float:
        return sum(self.bytes)

    def quantile(self, share: float) -> float | None:
        """The age (s) by which ``share`` of the deleted bytes had died: the upper edge of the bucket where the
        running sum reaches it; None without MIN_EVIDENCE bytes."""
        total = self.total()
        if total < MIN_EVIDENCE:
            return None
        run = 0.0
        for i, b in enumerate(self.bytes):
            run += b
            if run >= share * total:
                return FIRST_EDGE_S * 2.0 ** i
        return FIRST_EDGE_S * 2.0 ** (BUCKETS - 1)


@dataclass
class VolumeLifetimes:
    ages: DeleteAges = field(default_factory=DeleteAges)
    rate: float = 0.0  # bytes/s written to the volume (exponential average, RATE_TAU_S)
    written: int | None = None  # the volume's cumulative write bytes at the last tick
    at_ns: int = 0
    found: int | None = None  # the knob's value when the rule first looked: the floor (an operator's choice stays)
    why: str = ""  # the last decision, for status and explain

    def note_written(self, total: int, now_ns: int) -> None:
        if self.written is not None and now_ns > self.at_ns and total >= self.written:
            dt = (now_ns - self.at_ns) / NS
            a = 1.0 - math.exp(-dt / RATE_TAU_S)
            self.rate += a * ((total - self.written) / dt - self.rate)
        self.written, self.at_ns = total, now_ns


Request = Callable[[str, str, str], None]  # (knob, value, reason): the engine's knob request, put back on exit


@dataclass(frozen=True, slots=True)
class Hold:
    knob: str
    value: int
    reason: str


def hold_for(kind: str, cache_bytes: int, lt: VolumeLifetimes, pol: LifetimeHold,
             overhead: int = 0) -> Hold | None:
    """The knob value that holds the volume's young data dirty, and why; None when the rule has nothing to say
    (a kind without such a knob, or too few deletes seen). ``overhead``: bcache's in-use share beyond its dirty
    share, in percent (metadata, buckets partly dirty or allocated since the last GC), taken off the room."""
    trait = _hold(kind)
    if trait is None or cache_bytes <= 0:
        return None
    knob, floor = trait.knob, max(trait.stock, lt.found or 0)
    q = lt.ages.quantile(pol.share)
    if q is None:
        return None
    hold = min(q, pol.max_hold_s)
    need = SLACK * lt.rate * hold
    pct = math.ceil(100 * need / cache_bytes)
    if trait.write_cutoff is not None:
        room = int(trait.write_cutoff - 100 * pol.headroom) - overhead
        where = (f"{kind} caches writes below {trait.write_cutoff}% in use, less headroom {pol.headroom:g}"
                 f" and {overhead}% in use beyond the dirty data")
    else:
        room = int(100 - 100 * pol.headroom)
        where = f"full less headroom {pol.headroom:g}"
    room = max(0, min(room, KNOBS[knob].max))
    value = max(floor, min(pct, room))
    capped = " (capped by max_hold)" if q > pol.max_hold_s else ""
    reason = (f"lifetime hold {hold:g} s{capped}: {pol.share:.0%} of {lt.ages.total() / (1 << 20):.1f} MiB deleted"
              f" died by {q:g} s; at {lt.rate / (1 << 20):.2f} MiB/s written that needs {SLACK:g} x rate x hold ="
              f" {need / (1 << 20):.1f} MiB dirty ({pct}% of the cache); room {room}% ({where}); floor {floor}%")
    return Hold(knob, value, reason)


class Lifetimes:
    """Every volume's delete-age histogram and write rate, and the hold rule on them (the engine owns one)."""

    def __init__(self) -> None:
        self.vols: dict[int, VolumeLifetimes] = {}

    def of(self, dev: int) -> VolumeLifetimes:
        lt = self.vols.get(dev)
        if lt is None:
            lt = self.vols[dev] = VolumeLifetimes()
        return lt

    def deleted_many(self, table: HotnessTable, dev: int, recs: np.ndarray | list[tuple[int, ...]],
                     slots: np.ndarray | None = None) -> None:
        """Deletes of one volume (DELETE_DTYPE records, or tuples dev, ino, gen, size, ts_ns; gen 0: any), before
        the table forgets them: each file whose first write was seen adds its age at delete, in order (one index
        lookup and array tests for the batch: only those files cost a Python step; ``slots``: that lookup's result
        when the caller made it)."""
        idx = table.index.get(dev)
        if idx is None or not len(recs):
            return
        arr = deletes_array(recs) if isinstance(recs, list) else recs
        if slots is None:
            slots = idx.lookup_many(np.ascontiguousarray(arr["ino"], dtype=np.uint64))
        found = slots >= 0
        if not found.any():
            return
        arr, at = arr[found], slots[found]
        gen, born = np.frombuffer(table.gen, dtype=np.uint32)[at], table.born.take(at)
        size, ts = arr["size"], arr["ts_ns"]
        ok = ((arr["gen"] == 0) | (gen == arr["gen"])) & (born > 0) & (size > 0) & (ts >= born)
        ages = self.of(dev).ages
        for age, nbytes, now in zip((ts[ok] - born[ok]).tolist(), size[ok].tolist(), ts[ok].tolist(), strict=True):
            ages.add(age, nbytes, now)

    def steer(self, info: VolumeInfo, vp: VolumePolicy, st: VolumeState, written: int, now_ns: int,
              active: bool, request: Request) -> None:
        """One tick: follow the volume's write rate; when ``active`` (a write-back volume under the recoverable model)
        and the policy does not pin the knob, request the hold's value."""
        lt = self.of(info.dev)
        lt.note_written(written, now_ns)
        knobs = st.knobs
        trait = _hold(info.kind)
        knob = trait.knob if trait is not None else ""
        if lt.found is None and knobs.get(knob) is not None:
            lt.found = knob_value(knob, knobs[knob])
        pol = vp.lifetime_hold
        h = hold_for(info.kind, info.cache_bytes, lt, pol, _overhead(st, info.cache_bytes)) if active else None
        if h is None or h.knob in vp.knobs:
            return
        lt.why = h.reason
        have = knobs.get(h.knob)
        if trait is not None and trait.min_step and have is not None and _near(h.knob, have, h.value, trait.min_step):
            return
        request(h.knob, str(h.value), h.reason)


def _overhead(st: VolumeState, cache_bytes: int) -> int:
    """bcache's last in-use share (at its last GC) beyond the share of the cache that is dirty now, in percent."""
    if st.in_use_percent is None or cache_bytes <= 0:
        return 0
    return max(0, st.in_use_percent - st.dirty_bytes * 100 // cache_bytes)


def _hold(kind: str) -> HoldKnob | None:
    caps = CAPABILITIES.get(kind)
    return caps.hold if caps is not None else None


def _near(knob: str, have: str, want: int, step: int) -> bool:
    v = knob_value(knob, have)
    return v is not None and abs(v - want) < step
