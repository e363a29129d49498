"""The decision engine: events and backend samples in, actions out, once per tick.

Per tick the work is proportional to what changed (files touched since the last tick, freed extents,
samples), never to the number of tracked files:

1. files touched since the last tick are sieved and offered to their volume's believed-cached set
   (admission against the last evicted counter); newly admitted ones queue for promotion -- on a cache that
   inserts its own read misses (bcache) only what it did not keep: files not already resident, and only while it
   has been bypassing reads (:meth:`Engine._gate_inserted`);
2. a falling hit ratio (a scan polluted the cache) queues the whole believed-cached set for re-warming;
3. promotions leave the queue within the volume's byte budget per second;
4. freed extents whose journal transaction committed leave as discards at once, paced by the volume's discard
   budget (the daemon also asks between ticks, right after the poll that brought the commit: :meth:`discards`);
5. the write policy follows the failure latch first (a failed or degraded cache stays out of write-back until
   its cache device is replaced or an operator clears it), then the failure model, with hysteresis;
6. destructive volumes drain: dirty data is driven to zero at least once per ``exposure.max_age``
   (see :meth:`Engine._plan_drain` for the guarantee); a drain that misses its deadline is a breach;
7. pinned knobs are set when the backend reports a different value (only knobs the cache kind has).

How each action ended comes back through :meth:`Engine.outcome`: drains complete or breach, failed discards
are re-queued, failed switches and knobs are asked again after ``REQUEST_RETRY_NS``.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cachepilot import records
from cachepilot.actions import (
    DONE,
    FAILED,
    Action,
    DiscardRanges,
    Drain,
    Outcome,
    Promote,
    SetKnob,
    SetWritePolicy,
)
from cachepilot.capabilities import CAPABILITIES, KNOBS, Capabilities
from cachepilot.errors import UserError
from cachepilot.events import (
    Barrier,
    Delete,
    Discard,
    Drops,
    Event,
    FreedExtent,
    HotnessDelta,
    JournalCommit,
    MetadataDelta,
    SyncCalls,
)
from cachepilot.models.admission import CachedSet
from cachepilot.models.epochs import EpochTracker
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.hotness import F_MEMBER, F_QUEUED, F_READ, F_RESIDENT, HOT_DTYPE, HotnessTable
from cachepilot.models.pins import PinnedFile, PinSet
from cachepilot.models.volume import (
    BYPASS,
    BYPASS_NAMES,
    WRITEBACK,
    WRITETHROUGH,
    Health,
    VolumeInfo,
    VolumeSample,
    VolumeState,
)
from cachepilot.policy.model import DEFAULT_POLICY, Policy, VolumePolicy

NS = 1_000_000_000
REQUEST_RETRY_NS = 60 * NS  # re-issue an unanswered mode/knob request after this long


ADMITTED = 0  # reason id: admitted against the last evicted counter (text made when emitted)

# bcache folds its stats counters every 300/22 s (accounting_delay, drivers/md/bcache/stats.c): a bypassed read
# shows in cache_bypass_* up to ~14 s after it happened. A rise seen within this long of a file's admission may be
# its reads; none in that time means the cache bypassed no read, so it inserted the file's misses itself.
BYPASS_WINDOW_NS = 30 * NS
MAX_BYPASS_WAIT = 1 << 16  # admitted files waiting on the bypass rule (beyond: the oldest taken as inserted)
SKIP_RESIDENT = "resident: promoted (or inserted by the cache) since the cache last changed, not written since"
SKIP_INSERTED = "inserted by the cache itself: no read bypassed within 30 s of its admission"
BYPASSED_LATER = "admitted, and the cache bypassed reads within 30 s of its admission (it did not keep them)"



class UnknownEvent(TypeError):
    """An event kind this engine does not handle (a newer probe's). A TypeError, so a replay reports it as a bad
    record; the daemon counts it apart from a TypeError raised *while* handling a known kind, which is a bug."""


class PromoQueue:
    """FIFO of (slot, reason id) packed in one u64 array: 8 bytes per queued file, no Python objects.
    Whether a slot is queued is the F_QUEUED bit of the hotness table."""

    def __init__(self) -> None:
        self.items = array("Q")
        self.head = 0
        self.reasons: list[str] = ["admitted"]
        self._reason_ids: dict[str, int] = {"admitted": ADMITTED}

    def reason_id(self, text: str) -> int:
        rid = self._reason_ids.get(text)
        if rid is None:
            if len(self.reasons) > 4096:  # bounded: forget old texts
                self.reasons = self.reasons[:1]
                self._reason_ids = {"admitted": ADMITTED}
            rid = self._reason_ids[text] = len(self.reasons)
            self.reasons.append(text)
        return rid

    def __len__(self) -> int:
        return len(self.items) - self.head

    def push(self, slot: int, rid: int) -> None:
        self.items.append(slot | rid << 32)

    def push_many(self, slots: np.ndarray, rid: int) -> None:
        self.items.frombytes((slots.astype(np.uint64) | np.uint64(rid << 32)).tobytes())

    def pop(self) -> None:
        self.head += 1
        if self.head > 4096 and self.head * 2 >= len(self.items):
            del self.items[:self.head]
            self.head = 0

    def clear(self) -> list[int]:
        slots = [v & 0xFFFFFFFF for v in self.items[self.head:]]
        self.items = array("Q")
        self.head = 0
        return slots


def normalise_mode(mode: str) -> str:
    return BYPASS if mode in BYPASS_NAMES else mode


_ANY_KIND = Capabilities("unknown", frozenset({WRITEBACK, WRITETHROUGH, BYPASS}), {}, drain="", destructive="")


def caps_of(kind: str) -> Capabilities:
    """The kind's capabilities; an unknown kind (e.g. a trace of a plain device) is assumed to take every mode."""
    return CAPABILITIES.get(kind, _ANY_KIND)


@dataclass(frozen=True, slots=True)
class Latch:
    """A failed or degraded cache, kept out of write-back until its cache device changes or an operator clears it."""

    reason: str
    since_ns: int
    cache_id: str  # the cache device that failed ("" = unknown: only an operator can clear it)


@dataclass(frozen=True, slots=True)
class DrainInFlight:
    action: Drain
    start_ns: int


@dataclass
class VolumeCtl:
    info: VolumeInfo
    policy: VolumePolicy
    chosen_by: str
    state: VolumeState
    cached: CachedSet
    freed: FreedExtentQueue
    epochs: EpochTracker
    promo_queue: PromoQueue = field(default_factory=lambda: PromoQueue())
    tokens: float = 0.0
    last_tick_ns: int | None = None
    last_switch_ns: int | None = None
    last_discard_ns: int = 0
    discard_tokens: float = -1.0  # bytes the discard budget allows now (-1: not started, a full bucket)
    discard_refill_ns: int = 0
    discard_due: bool = False  # a commit came since the last look: extents it freed may be ready
    bypasses_seen: int | None = None  # the cache's cumulative bypassed reads at the last sample (bcache)
    bypass_rose_ns: int | None = None  # the sample time at which that count last rose
    # admitted files (slot, generation, admitted at) that wait for a bypass within BYPASS_WINDOW_NS (oldest first)
    bypass_wait: deque[tuple[int, int, int]] = field(default_factory=deque)
    promotions_skipped: dict[str, int] = field(default_factory=dict)  # by reason (status)
    last_rewarm_ns: int | None = None
    cache_seen: str = ""  # the last cache device (set) seen attached: a different one is a replacement
    detached: bool = False  # the last sample saw no cache device behind the volume
    last_refresh_ns: int = 0
    requested_mode: tuple[str, int] | None = None
    requested_knobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    meta_score: int = 0
    meta_bytes: int = 0
    held_switches: int = 0
    touched_now: int = 0  # files outside the believed-cached set touched in the current tick
    touched_baseline: float = 0.0  # EWMA of files touched per tick outside scans
    scanning: bool = False
    caps: Capabilities = _ANY_KIND
    latch: Latch | None = None
    drain: DrainInFlight | None = None
    drain_clean_ns: int | None = None  # when a sample last ended a drain (its backend may still be putting back)
    breach: str | None = None  # an unresolved exposure breach (cleared when the cache is seen clean)
    # until then the kind may still be in a pre-drain sleep begun before the engine shortened it (see _drain_sleep)
    drain_sleep_until_ns: int = 0
    breaches: int = 0
    last_failure: str = ""  # the last action that failed, for humans
    pins: PinSet = field(default_factory=PinSet)  # pinned files (models/pins.py)


class Engine:
    def __init__(self, policy: Policy = DEFAULT_POLICY, volumes: Iterable[VolumeInfo] = (),
                 start_ns: int = 0) -> None:
        self.policy = policy
        self.hotness = HotnessTable(policy.half_life_s, start_ns)
        self.vols: dict[int, VolumeCtl] = {}
        self.by_name: dict[str, VolumeCtl] = {}
        self.now_ns = start_ns
        self.unknown_events = 0
        self.drops: Drops | None = None
        self.external_discards = 0
        handlers: dict[str, Callable[[Any], None]] = {
            records.HOTNESS.name: self._feed_hotness, records.FREED.name: self._feed_freed_extent,
            records.COMMIT.name: self._feed_commit, records.DELETE.name: self.delete,
            records.BARRIER.name: self._feed_epochs, records.SYNC.name: self._feed_epochs,
            records.METADATA.name: self._feed_metadata, records.DISCARD.name: self._feed_discard,
            records.DROPS.name: self._feed_drops,
        }
        # every kind of the records table has its handler (a kind added there without one fails here, at once)
        self._handlers = {k.event: handlers[k.name] for k in records.KINDS}
        for v in volumes:
            self.add_volume(v)

    # ------------------------------------------------------------ configuration
    def add_volume(self, info: VolumeInfo) -> VolumeCtl:
        if info.dev in self.vols:
            raise UserError(f"volume {info.name}: device {info.dev} already known")
        vp, chosen = self.policy.resolve(info)
        vp.pin.check_room(info)
        ctl = VolumeCtl(
            info=info,
            policy=vp,
            chosen_by=chosen,
            state=VolumeState(info, error_threshold=vp.health.error_threshold),
            cached=CachedSet(int(info.cache_bytes * vp.promotion.max_cache_fraction), self.hotness,
                             dev=info.dev, low_water=0.95),
            freed=FreedExtentQueue(self._granularity(info, vp)),
            epochs=EpochTracker(start_ns=self.now_ns),
            caps=caps_of(info.kind),
        )
        self.vols[info.dev] = ctl
        self.by_name[info.name] = ctl
        self.hotness.register_dev(info.dev)
        return ctl

    def remove_volume(self, dev: int) -> VolumeCtl | None:
        """Forget a volume that vanished: its queued promotions and pending discards go with it (its files'
        counters stay, so a volume that comes back is not cold)."""
        c = self.vols.pop(dev, None)
        if c is None:
            return None
        self.by_name.pop(c.info.name, None)
        flags = self.hotness.flags
        for slot in c.promo_queue.clear():
            flags[slot] &= ~F_QUEUED & 0xFF
        for slot in c.cached.members():
            c.cached.discard(slot)
        return c

    @staticmethod
    def _set_room(c: VolumeCtl) -> int:
        """The believed-cached set's capacity: its share of the cache less what pinned files take."""
        return max(0, int(c.info.cache_bytes * c.policy.promotion.max_cache_fraction) - c.pins.bytes)

    def set_pins(self, name: str, files: list[PinnedFile], note: str = "") -> None:
        """The files the volume's pin patterns resolved to (the daemon walks the mount; models/pins.py)."""
        c = self.volume(name)
        c.pins.assign(self.hotness, c.info.dev, files, c.policy.pin.refresh_s, note, self.now_ns)
        for slot in c.pins.slots.tolist():
            c.cached.discard(slot)  # a pinned file is no member: no admission or eviction decision touches it
        c.cached.capacity_bytes = self._set_room(c)

    @staticmethod
    def _granularity(info: VolumeInfo, vp: VolumePolicy) -> int:
        return max(1, vp.discard_on_delete.min_extent // max(1, info.fs_block_size))

    def volume(self, name: str) -> VolumeCtl:
        try:
            return self.by_name[name]
        except KeyError:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise UserError(f"unknown volume {name!r} (known: {known})") from None

    def set_policy(self, policy: Policy) -> None:
        """Apply a new policy (already validated). Resolution errors leave the old one in place."""
        resolved = {dev: policy.resolve(c.info) for dev, c in self.vols.items()}
        for dev, (vp, _) in resolved.items():
            vp.pin.check_room(self.vols[dev].info)
        self.policy = policy
        for dev, (vp, chosen) in resolved.items():
            c = self.vols[dev]
            c.policy, c.chosen_by = vp, chosen
            c.cached.capacity_bytes = self._set_room(c)
            c.freed.granularity = self._granularity(c.info, vp)
            c.state.error_threshold = vp.health.error_threshold

    # ------------------------------------------------------------ input
    def feed(self, ev: Event) -> None:
        handler = self._handlers.get(type(ev))
        if handler is None:
            raise UnknownEvent(f"not an event: {ev!r}")
        handler(ev)

    def _feed_hotness(self, ev: HotnessDelta) -> None:
        self.feed_hotness_records([records.HOTNESS.to_record(ev)])  # one rule for every path: the vectorised update

    def _feed_freed_extent(self, ev: FreedExtent) -> None:
        c = self._vol(ev.dev)
        if c is not None:
            c.freed.freed(ev.block, ev.count, ev.ts_ns, ev.tid)

    def _feed_commit(self, ev: JournalCommit) -> None:
        c = self._vol(ev.dev)
        if c is not None:
            c.freed.commit(ev.transaction, ev.ts_ns)
            c.discard_due = True

    def _feed_epochs(self, ev: Barrier | SyncCalls) -> None:
        c = self._vol(ev.dev)  # block barriers close epochs, file-level calls annotate
        if c is not None:
            c.epochs.feed(ev)

    def _feed_metadata(self, ev: MetadataDelta) -> None:
        c = self._vol(ev.dev)
        if c is not None:
            c.meta_score += ev.score
            c.meta_bytes += ev.bytes

    def _feed_discard(self, ev: Discard) -> None:
        self.external_discards += 1

    def _feed_drops(self, ev: Drops) -> None:
        self.drops = ev

    def feed_hotness_records(self, records: list[tuple[int, ...]]) -> None:
        """HotnessDelta records as tuples in trace layout (see cachepilot.trace.format)."""
        try:
            arr = np.array(records, dtype=HOT_DTYPE)
        except (OverflowError, ValueError, TypeError) as exc:
            raise UserError(f"bad hotness record: {exc}") from None
        self.feed_hotness_array(arr)

    def feed_hotness_array(self, records: np.ndarray) -> None:
        """Fastest path: a numpy array of HOT_DTYPE records (a trace block or a raw BPF drain)."""
        self.unknown_events += self.hotness.apply_array(records, known_only=True)

    def _vol(self, dev: int) -> VolumeCtl | None:
        c = self.vols.get(dev)
        if c is None:
            self.unknown_events += 1
        return c

    def feed_deletes(self, recs: list[tuple[int, ...]]) -> None:
        """Delete records in trace layout (dev, ino, gen, size, ts_ns), as feeding each Delete would, per
        filesystem in one index lookup (a replay's deletes come by the hundred thousand)."""
        by_dev: dict[int, list[tuple[int, int]]] = {}
        for r in recs:
            by_dev.setdefault(r[0], []).append((r[1], r[2]))
        for dev, files in by_dev.items():
            arr = np.array(files, dtype=np.uint64).reshape(-1, 2)
            self.hotness.forget_many(dev, arr[:, 0], arr[:, 1].astype(np.uint32))  # as delete() does, per batch

    def feed_freed(self, recs: list[tuple[int, ...]]) -> None:
        """FreedExtent records in trace layout (dev, ino, block, count, metadata, ts_ns, tid), as feeding each would,
        per filesystem as arrays."""
        if not recs:
            return
        cols = np.array(recs, dtype=np.int64).reshape(-1, 7)
        for dev in np.unique(cols[:, 0]).tolist():
            rows = cols[cols[:, 0] == dev]
            c = self.vols.get(dev)
            if c is None:
                self.unknown_events += len(rows)
                continue
            c.freed.freed_many(rows[:, 2], rows[:, 3], rows[:, 5], rows[:, 6])

    def delete(self, ev: Delete) -> None:
        # a member leaves its believed-cached set through the table (the set owns its dev's slots); a queued
        # promotion of it is dropped when it reaches the head
        self.hotness.delete(ev)

    def sample(self, s: VolumeSample) -> None:
        c = self.vols.get(s.dev)
        if c is None:
            self.unknown_events += 1
            return
        st = c.state
        grew = st.update(VolumeSample(
            s.dev, s.ts_ns, normalise_mode(s.mode), s.dirty_bytes, s.hits, s.misses, s.io_errors, s.failed,
            s.knobs, s.cache_id,
        ))
        c.epochs.note_dirty(grew)
        c.pins.sampled(s.misses, s.bypasses, s.ts_ns)
        if s.bypasses is not None:
            prev, c.bypasses_seen = c.bypasses_seen, s.bypasses
            if prev is not None and s.bypasses > prev:
                c.bypass_rose_ns = s.ts_ns
        if st.dirty_bytes == 0:
            c.breach = None
        self._latch(c, s.ts_ns)
        self._replaced(c, s.cache_id)

    def _replaced(self, c: VolumeCtl, cache_id: str) -> None:
        """A new cache device behind the volume starts empty: re-warm the believed-cached set at once, hottest
        first, instead of waiting for the workload's misses (the stock cache's only way back)."""
        if not cache_id:
            if c.cache_seen and not c.detached:  # detached: bcache drops a detached device's cached data
                c.detached = True
                self._forget_resident(c)
            return  # detached, or the kind does not say
        c.detached = False
        old, c.cache_seen = c.cache_seen, cache_id
        if old and old != cache_id:
            self._forget_resident(c)
        if old and old != cache_id and c.policy.promotion.enabled:
            c.last_rewarm_ns = self.now_ns
            self._rewarm(c, f"cache device replaced ({old[:8]} -> {cache_id[:8]}): re-warming the hot set")

    def _forget_resident(self, c: VolumeCtl) -> None:
        """A different (or re-attached) cache holds none of the volume's files: nothing is resident any more."""
        t = self.hotness
        flags = np.frombuffer(t.flags, dtype=np.uint8)
        flags[np.frombuffer(t.dev, dtype=np.uint32) == c.info.dev] &= ~F_RESIDENT & 0xFF
        del flags
        c.bypass_wait.clear()  # the re-warm queues every member

    # ------------------------------------------------------------ the failure latch
    def _latch(self, c: VolumeCtl, ts: int) -> None:
        st, latch = c.state, c.latch
        if latch is not None and latch.cache_id and st.cache_id and st.cache_id != latch.cache_id:
            c.latch = latch = None  # the cache device was replaced
        if latch is not None or st.health is Health.OK:
            return
        what = "cache device failed" if st.health is Health.FAILED else f"{st.recent_errors()} cache I/O errors"
        dev = f" on cache {st.cache_id}" if st.cache_id else ""
        c.latch = Latch(f"{what}{dev} at {ts / NS:.0f} s", ts, st.cache_id)

    def clear_latch(self, name: str, who: str = "operator") -> str | None:
        """Let a latched volume back into write-back (the daemon's control socket calls this). Errors seen so far
        are forgiven; new ones latch it again. Returns the reason that was cleared, or None if none was set."""
        c = self.volume(name)
        latch, c.latch = c.latch, None
        c.state.forgive_errors()
        return None if latch is None else f"{latch.reason} (cleared by {who})"

    def restore_latch(self, dev: int, reason: str, since_ns: int, cache_id: str) -> Latch | None:
        """Latch a volume as a previous run left it (the daemon's state file), unless it is latched already; the
        latch it now has, or None for a volume the engine does not know."""
        c = self.vols.get(dev)
        if c is None:
            return None
        if c.latch is None:
            c.latch = Latch(reason, since_ns, cache_id)
        return c.latch

    def latch_of(self, dev: int) -> Latch | None:
        c = self.vols.get(dev)
        return c.latch if c is not None else None

    def health_of(self, dev: int) -> str:
        """The volume's health word (UNKNOWN for a volume the engine does not know)."""
        c = self.vols.get(dev)
        return c.state.health.name if c is not None else "UNKNOWN"

    def rewarm_file(self, dev: int, ino: int, gen: int, score: int, size: int, now_ns: int) -> None:
        """A file a previous run found hot, back in the hotness table as read-hot: admitted and promoted at the
        volume's promotion rate like any other."""
        slot = self.hotness.update(dev, ino, gen, score, 0, 0, now_ns, size)
        self.hotness.flags[slot] |= F_READ

    def import_hot(self, name: str, files: list[tuple[int, int, int, int]]) -> tuple[int, int]:
        """A warm handoff's hot list (ino, gen, score, size), hottest first: engine/handoff.py."""
        from cachepilot.engine.handoff import queue_imported

        return queue_imported(self, name, files)

    def latched(self) -> dict[str, str]:
        return {c.info.name: c.latch.reason for c in self.vols.values() if c.latch is not None}

    # ------------------------------------------------------------ how actions ended
    def outcome(self, o: Outcome) -> None:
        """Learn how an action ended. Pending and skipped ones are ignored."""
        a = o.action
        c = self.by_name.get(a.volume)
        if c is None or o.status not in (DONE, FAILED):
            return
        ok = o.status == DONE
        if not ok:
            c.last_failure = f"{a.line()}: {o.detail or 'failed'}"
        if isinstance(a, Drain):
            self._drain_ended(c, a, ok, o.detail)
        elif isinstance(a, DiscardRanges) and not ok:
            bs = c.info.fs_block_size
            c.freed.requeue([(off // bs, n // bs) for off, n in a.ranges])
        # a failed switch or knob is asked again after REQUEST_RETRY_NS (the request stays recorded until then)

    def _drain_ended(self, c: VolumeCtl, a: Drain, ok: bool, detail: str) -> None:
        d = c.drain
        if d is None or d.action != a:
            return
        c.drain = None
        if ok:
            # A backend reports a drain done when it reads the cache clean, which it does after this tick began:
            # every byte dirty now was written after the tick's time.
            c.state.cleaned(max(d.start_ns, self.now_ns))
            c.breach = None  # the bound holds again (write-back resumes after the hysteresis interval)
        else:
            self._set_breach(c, f"drain started at {d.start_ns / NS:.0f} s failed: {detail or 'no reason given'}")

    def _set_breach(self, c: VolumeCtl, why: str) -> None:
        c.breach = why
        c.breaches += 1

    def rewarm(self, name: str, reason: str = "re-warm requested") -> int:
        """Queue a volume's whole believed-cached set for promotion, hottest first."""
        c = self.volume(name)
        return self._rewarm(c, reason)

    def _rewarm(self, c: VolumeCtl, reason: str, idle_since_ns: int | None = None) -> int:
        """Queue members (hottest first); with idle_since_ns only those not accessed since then."""
        n = 0
        t = self.hotness
        last, flags = t.last, t.flags
        q = c.promo_queue
        rid = q.reason_id(reason)
        if idle_since_ns is None:
            c.pins.requeue_all(reason)
        for slot in c.cached.hottest_members():
            if idle_since_ns is not None and last[slot] >= idle_since_ns:
                continue
            f = flags[slot]
            if not f & F_QUEUED:
                flags[slot] = f | F_QUEUED
                q.push(slot, rid)
                n += 1
        return n

    # ------------------------------------------------------------ the tick
    def tick(self, now_ns: int) -> list[Action]:
        if now_ns > self.now_ns:
            self.now_ns = now_ns
        now = self.now_ns
        t = self.hotness
        t.advance(now)
        out: list[Action] = []
        self._admit(t)
        for c in self.vols.values():
            self._scan_pollution(c, now)
            self._bypass_gate(c, now)
            self._promote(c, now, out)
            self._discard(c, now, out)
            self._track_drain(c, now)
            self._write_policy(c, now, out)
            self._knobs(c, now, out)
            self._plan_drain(c, now, out)
            c.last_tick_ns = now
        return out

    def _admit(self, t: HotnessTable) -> None:
        """Offer every file touched since the last tick to its volume's believed-cached set, one vectorised pass
        per volume (1 M files in one tick must not cost a Python loop)."""
        slots = t.drain_touched_array()
        if not len(slots):
            return
        devs = np.frombuffer(t.dev, dtype=np.uint32)[slots]
        if devs.min() == devs.max():
            groups = [slots]
        else:  # group by volume: small keys sort by radix (stable), ~10x faster than sorting dev_t values
            known = np.array(sorted(self.vols), dtype=np.uint32)
            key = np.searchsorted(known, devs).clip(0, len(known) - 1)
            mine = known[key] == devs  # files of filesystems that are not volumes are not offered
            if not mine.all():
                slots, key = slots[mine], key[mine]
                if not len(slots):
                    return
            key = key.astype(np.uint16 if len(known) < 65536 else np.uint32)
            order = np.argsort(key, kind="stable")
            cuts = np.flatnonzero(np.diff(key[order])) + 1
            groups = np.split(slots[order], cuts)
        for g in groups:
            c = self.vols.get(int(t.dev[int(g[0])]))
            if c is not None:
                self._admit_volume(c, g)

    def _admit_volume(self, c: VolumeCtl, s: np.ndarray) -> None:
        """Sieve (size, write-only, append-only; see HotnessTable.sieve), re-charge members, admit the rest against
        the last evicted counter; queue the new members for promotion in the order they were touched."""
        t = self.hotness
        s = c.pins.exclude(s)  # pinned files are not sieved nor admitted: models/pins.py
        f = np.frombuffer(t.flags, dtype=np.uint8)[s]
        member = (f & F_MEMBER) != 0
        c.touched_now += len(s) - int(member.sum())
        promo = c.policy.promotion
        if not promo.enabled:
            return
        size = np.frombuffer(t.size, dtype=np.int64)[s]
        ok = t.sieve_mask(s, promo.sieve_size)
        c.cached.discard_many(s[member & ~ok])  # e.g. it grew past the sieve: invalidate
        keep = member & ok
        if keep.any():
            c.cached.recharge(s[keep], size[keep])
        cand = ~member & ok
        admitted = c.cached.admit_many(s[cand], size[cand])
        if len(admitted):
            flags = np.frombuffer(t.flags, dtype=np.uint8)
            fresh = admitted[(flags[admitted] & F_QUEUED) == 0]
            if c.caps.inserts_read_misses and promo.only_uncached:
                fresh = self._gate_inserted(c, fresh, flags)
            flags[fresh] |= F_QUEUED
            del flags
            c.promo_queue.push_many(fresh, ADMITTED)

    def _gate_inserted(self, c: VolumeCtl, slots: np.ndarray, flags: np.ndarray) -> np.ndarray:
        """On a cache that inserts its own read misses (bcache: readahead and O_DIRECT ones too), the newly
        admitted files worth a promotion read now: a file already resident is never promoted again (until a write
        or a cache change); the others only while the cache has been bypassing reads (its bypass count rose within
        BYPASS_WINDOW_NS) -- else they wait for a rise within that window of their admission (_bypass_gate).
        Without bypass counters (none sampled yet) only the residency rule applies."""
        resident = (flags[slots] & F_RESIDENT) != 0
        if resident.any():
            self._skipped(c, SKIP_RESIDENT, int(resident.sum()))
            slots = slots[~resident]
        now = self.now_ns
        rose = c.bypass_rose_ns
        if c.bypasses_seen is None or (rose is not None and now - rose <= BYPASS_WINDOW_NS):
            return slots
        gen = self.hotness.gen
        c.bypass_wait.extend((s, gen[s], now) for s in slots.tolist())
        over = len(c.bypass_wait) - MAX_BYPASS_WAIT
        if over > 0:
            for _ in range(over):
                c.bypass_wait.popleft()
            self._skipped(c, SKIP_INSERTED, over)
        return slots[:0]

    def _bypass_gate(self, c: VolumeCtl, now: int) -> None:
        """Admitted files that waited on the bypass rule: promoted if the cache's bypass count rose within
        BYPASS_WINDOW_NS of their admission; once that window is over without one, taken as inserted by the cache
        (resident). Oldest first: a file not yet decided means no later one is."""
        w = c.bypass_wait
        rose = c.bypass_rose_ns
        t = self.hotness
        flags, gen = t.flags, t.gen
        rid = -1
        while w:
            slot, g, at = w[0]
            alive = gen[slot] == g and flags[slot] & F_MEMBER
            if rose is not None and at - BYPASS_WINDOW_NS <= rose <= at + BYPASS_WINDOW_NS:
                if alive and not flags[slot] & F_QUEUED:
                    rid = c.promo_queue.reason_id(BYPASSED_LATER) if rid < 0 else rid
                    flags[slot] |= F_QUEUED
                    c.promo_queue.push(slot, rid)
            elif now - at > BYPASS_WINDOW_NS:
                if alive:
                    flags[slot] |= F_RESIDENT
                self._skipped(c, SKIP_INSERTED, 1)
            else:
                break
            w.popleft()

    @staticmethod
    def _skipped(c: VolumeCtl, reason: str, n: int) -> None:
        c.promotions_skipped[reason] = c.promotions_skipped.get(reason, 0) + n

    def _scan_pollution(self, c: VolumeCtl, now: int) -> None:
        """Two signals of a polluted cache: a scan (far more cold files -- outside the believed-cached set --
        touched per tick than usual) and a falling hit ratio. A scan re-warms when it ends; a hit-ratio drop
        re-warms at once (at most once a minute)."""
        n, c.touched_now = c.touched_now, 0
        base = c.touched_baseline
        if not c.scanning:
            if base >= 8 and n > 2.5 * base:
                c.scanning = True
            else:
                c.touched_baseline = n if base == 0 else 0.9 * base + 0.1 * n
        elif n < 1.5 * base:
            c.scanning = False
            if c.policy.promotion.enabled:
                c.last_rewarm_ns = now
                self._rewarm(c, f"scan ended ({n} files/tick, usual {base:.0f}): re-warming the hot set")
            return
        drop = c.state.hit_trend()
        if not c.policy.promotion.enabled or c.scanning or drop >= -c.policy.health.scan_drop:
            return
        if c.last_rewarm_ns is not None and now - c.last_rewarm_ns < 60 * NS:
            return
        c.last_rewarm_ns = now
        self._rewarm(c, f"hit ratio fell by {-drop:.0%}: re-warming after pollution")

    def _promote(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        promo = c.policy.promotion
        t = self.hotness
        if not promo.enabled:
            for slot in c.promo_queue.clear():
                t.flags[slot] &= ~F_QUEUED
            return
        if c.latch is not None:
            return  # reading hot files into a failed cache helps nobody; the queue waits
        if self._drain_at_risk(c, now):
            return  # the queue waits: promotion reads keep the origin busy, and this kind cleans best when it idles
        if (promo.refresh_interval_s > 0 and not c.scanning
                and now - c.last_refresh_ns >= promo.refresh_interval_s * NS):
            c.last_refresh_ns = now
            self._rewarm(c, "refresh: hot file idle for a refresh interval",
                         idle_since_ns=now - int(promo.refresh_interval_s * NS))
        dt = (now - c.last_tick_ns) / NS if c.last_tick_ns is not None else 1.0
        cap = promo.rate * 2.0  # bytes over any window T stay <= rate * T + cap + the largest file
        c.tokens = min(cap, c.tokens + promo.rate * max(0.0, dt))
        c.tokens = c.pins.take(t, c.info, now, c.tokens, cap, out)  # pinned files first
        q = c.promo_queue
        flags, tsize, tdev, tino, tgen = t.flags, t.size, t.dev, t.ino, t.gen
        name = c.info.name
        bar = c.cached.admission_bar(t.epoch)
        items, head, end = q.items, q.head, len(q.items)
        tokens = c.tokens
        score = t.score
        texts: dict[int, str] = {}  # reason texts by counter: thousands of promotions share a few
        append = out.append
        not_queued = ~F_QUEUED & 0xFF
        gated = c.caps.inserts_read_misses and promo.only_uncached
        resident = F_RESIDENT if gated else 0  # a promoted file is not read again
        why = self._why_admitted(c, now) if gated else ""
        while head < end:
            v = items[head]
            slot = v & 0xFFFFFFFF
            f = flags[slot]
            if not f & F_MEMBER:
                head += 1
                flags[slot] = f & not_queued
                continue
            size = tsize[slot]
            if size > tokens and tokens < cap:
                break  # a file larger than the bucket goes once the bucket is full, leaving a debt
            head += 1
            flags[slot] = (f & not_queued) | resident
            tokens -= size
            rid = v >> 32
            if rid == ADMITTED:
                sc = score(slot)
                reason = texts.get(sc)
                if reason is None:
                    reason = texts[sc] = f"counter {sc} > last evicted {bar}{why}"
            else:
                reason = q.reasons[rid] if rid < len(q.reasons) else "re-warm"
            append(Promote(name, tdev[slot], tino[slot], tgen[slot], ((0, size),), reason))
        c.tokens = tokens
        q.head = head - 1
        q.pop()  # compacts the array when the consumed head is large

    @staticmethod
    def _why_admitted(c: VolumeCtl, now: int) -> str:
        """What let an admitted file through on a cache that inserts its own misses (the reason's tail)."""
        if c.bypass_rose_ns is None:
            return "; no bypass counters sampled yet"
        return f"; the cache bypassed reads {max(0, now - c.bypass_rose_ns) / NS:.0f} s ago (it keeps only its misses)"

    def discards(self, now_ns: int) -> list[Action]:
        """The discards that the commits seen since the last look made ready, now (within each volume's budget).
        The daemon asks after every poll of the probe's rings: a freed extent's discard goes out right after the
        commit that freed it, not at the next tick -- dead data that waits is data the cache may write back."""
        out: list[Action] = []
        for c in self.vols.values():
            if c.discard_due:
                self._discard(c, max(now_ns, self.now_ns), out)
        return out

    def _discard(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """Ready extents leave as one action (coalesced: extents that touch become one range), within a token
        bucket of ``max_rate`` bytes per second holding at most max(1 s, interval) of it. A policy ``interval``
        above 0 batches: at most one look per interval (the old behaviour, for operators who want it)."""
        c.discard_due = False
        d = c.policy.discard_on_delete
        if not d.enabled or c.info.fs_discard:
            return
        if d.interval_s > 0:
            if now - c.last_discard_ns < d.interval_s * NS:
                return
            c.last_discard_ns = now
        cap = d.max_rate * max(1.0, d.interval_s)
        if c.discard_tokens < 0:
            c.discard_tokens = cap
        else:
            c.discard_tokens = min(cap, c.discard_tokens + d.max_rate * max(0, now - c.discard_refill_ns) / NS)
        c.discard_refill_ns = now
        bs = c.info.fs_block_size
        ranges = c.freed.take(now, int(c.discard_tokens) // bs)
        if not ranges:
            return
        total = sum(n for _, n in ranges) * bs
        c.discard_tokens -= total
        out.append(DiscardRanges(
            c.info.name, c.info.dev, tuple((s * bs, n * bs) for s, n in ranges),
            f"{len(ranges)} extent(s), {total} bytes freed by deletes and committed by the journal",
        ))

    def _tick_ns(self, c: VolumeCtl, now: int) -> int:
        """The tick length, as last observed (1 s before the second tick)."""
        return max(1, now - c.last_tick_ns) if c.last_tick_ns is not None and now > c.last_tick_ns else NS

    def _fm(self, c: VolumeCtl, now: int) -> tuple[str, str]:
        """The failure model in effect (auto resolved) and why."""
        fm = c.policy.failure_model
        if fm != "auto":
            return fm, f"failure model {fm}"
        rb, wb = self.hotness.dev_bytes.get(c.info.dev, (0, 0))
        total = rb + wb
        wfrac = wb / total if total else 0.0
        rate = c.epochs.stats(now).barrier_rate
        if wfrac < 0.1 and rate < 1.0 and WRITETHROUGH in c.caps.modes:
            return "read-mostly", f"auto: read-mostly ({wfrac:.0%} writes, {rate:.1f} barriers/s)"
        return "destructive", "auto: destructive"

    def _projected_dirty(self, c: VolumeCtl, now: int) -> tuple[int, float]:
        """Dirty bytes the next sample may show: the last one plus the peak growth rate over the time from that
        sample to the next tick. (projected, rate in bytes/s)."""
        st = c.state
        rate = st.dirty_rate()
        horizon_ns = max(0, now - st.last_ts) + self._tick_ns(c, now)
        return st.dirty_bytes + int(rate * horizon_ns / NS), rate

    def _target_mode(self, c: VolumeCtl, now: int) -> tuple[str, str, bool]:
        """(mode, reason, forced): forced switches ignore the hysteresis interval."""
        st = c.state
        cur = normalise_mode(st.mode)
        if c.latch is not None:
            what = f"latched: {c.latch.reason}; stays out of write-back until the cache device is replaced or cleared"
            if st.dirty_bytes > 0:
                return WRITETHROUGH, f"{what}: write-through and drain {st.dirty_bytes} dirty bytes", True
            if cur == WRITEBACK:
                return WRITETHROUGH, f"{what}: write-through first", True
            return BYPASS, f"{what}: cache clean, taking it out of the path", True
        fm, why = self._fm(c, now)
        if fm == "read-mostly":
            return WRITETHROUGH, why, False
        if fm == "recoverable":
            return WRITEBACK, f"{why}: write-back is safe", False
        ex = c.policy.exposure
        if c.breach is not None:
            return WRITETHROUGH, f"exposure breach: {c.breach}", True
        projected, rate = self._projected_dirty(c, now)
        if projected > ex.max_dirty:
            if cur == WRITEBACK:
                return WRITETHROUGH, (
                    f"exposure bound: {st.dirty_bytes} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                    f" by the next sample (bound {ex.max_dirty} bytes)"), True
            return WRITETHROUGH, "holding write-through: write-back could cross the byte bound", False
        if cur != WRITEBACK and st.dirty_bytes > c.policy.hysteresis.resume_below * ex.max_dirty:
            return WRITETHROUGH, "waiting for dirty data to drain below the resume mark", False
        return WRITEBACK, f"{why}: within exposure bound", False

    def _write_policy(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        st = c.state
        if st.samples == 0:
            return  # never act on a volume whose state we have not read
        cur = normalise_mode(st.mode)
        target, reason, forced = self._target_mode(c, now)
        if target == WRITEBACK and (c.drain is not None or self._drain_putting_back(c, now)):
            return  # a drain puts back the mode it found (bcache closes a drain in write-through)
        if target == BYPASS and st.dirty_bytes > 0:  # the invariant, whatever the rules above say
            target, reason = WRITETHROUGH, f"not bypassing a dirty cache ({st.dirty_bytes} bytes): {reason}"
        if target == cur or target not in c.caps.modes:
            c.requested_mode = None
            return  # e.g. dm-writecache: write-back only; its bound is kept by drains (_plan_drain)
        req = c.requested_mode
        if req is not None and req[0] == target and now - req[1] < REQUEST_RETRY_NS:
            return
        if not forced and c.last_switch_ns is not None:
            hold = c.policy.hysteresis.min_switch_interval_s * NS
            if now - c.last_switch_ns < hold:
                c.held_switches += 1
                return
        out.append(SetWritePolicy(c.info.name, target, reason))
        c.requested_mode = (target, now)
        c.last_switch_ns = now

    # ------------------------------------------------------------ drains
    def holds_promotions(self, name: str) -> bool:
        """Whether promotions on the volume wait (its drain is at risk), including those already under way."""
        c = self.by_name.get(name)
        return c is not None and self._drain_at_risk(c, self.now_ns)

    @staticmethod
    def _drain_at_risk(c: VolumeCtl, now: int) -> bool:
        """A drain past half its window on a kind whose write-back needs the origin idle (dm-cache writes back
        recently written blocks only after a second without I/O): promotion reads must not keep it busy."""
        d = c.drain
        return (d is not None and c.caps.drain_needs_idle
                and now - d.start_ns >= (d.action.deadline_ns - d.start_ns) // 2)

    def _drain_putting_back(self, c: VolumeCtl, now: int) -> bool:
        """A sample saw the cache clean, which ends the drain for the exposure bound; the backend puts its saved
        settings back at its next step. Two ticks for that before the engine asks for a mode itself."""
        return c.drain_clean_ns is not None and now - c.drain_clean_ns < 2 * self._tick_ns(c, now)

    def _track_drain(self, c: VolumeCtl, now: int) -> None:
        """A drain is done once a sample taken after it started shows no dirty data (or the backend said so);
        past its deadline it is a breach."""
        d = c.drain
        if d is None:
            return
        st = c.state
        if st.clean_ns is not None and st.clean_ns >= d.start_ns:
            c.drain, c.drain_clean_ns = None, now
        elif now >= d.action.deadline_ns:
            c.drain = None
            self._set_breach(c, (
                f"drain started at {d.start_ns / NS:.0f} s missed its deadline"
                f" ({d.action.deadline_ns / NS:.0f} s; {st.dirty_bytes} bytes still dirty)"))

    def _plan_drain(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """The exposure guarantee. Let A = exposure.max_age, P = A/2, C = the last time the cache was known clean
        (a sample with no dirty data, or the tick in which a drain's backend read it clean). Every dirty byte was
        written after C. A drain starts no later than C + P (a tick early, so a late tick cannot delay it) with
        deadline C + A. When it completes, every byte dirty at its start is written back. So no byte
        stays dirty longer than A, provided each drain completes within P (the backing device absorbs the
        write-back, the samples or outcomes report it; dm-cache writes back recently written blocks only when the
        device idles, see Capabilities.drain_needs_idle); a drain that does not is a breach: write-through
        (where the kind has it), a new drain, and an alert-worthy reason."""
        st = c.state
        if st.samples == 0 or c.drain is not None:
            return
        ex = c.policy.exposure
        half = int(ex.max_age_s * NS / 2)
        why = self._drain_reason(c, now, half)
        if why is None:
            return
        base = st.clean_ns
        deadline = now + half if base is None else max(base + 2 * half, now + half)
        deadline = max(deadline, c.drain_sleep_until_ns + half)
        a = Drain(c.info.name, deadline, why)
        out.append(a)
        c.drain = DrainInFlight(a, now)

    def _drain_reason(self, c: VolumeCtl, now: int, half: int) -> str | None:
        st = c.state
        dirty = st.dirty_bytes
        if c.latch is not None:
            return f"latched: {c.latch.reason}: draining {dirty} dirty bytes" if dirty > 0 else None
        if c.breach is not None:
            return f"exposure breach: {c.breach}: draining {dirty} dirty bytes" if dirty > 0 else None
        fm, _ = self._fm(c, now)  # auto is destructive about what it leaves dirty, read-mostly or not
        if fm == "recoverable" or (dirty == 0 and normalise_mode(st.mode) != WRITEBACK):
            return None
        ex = c.policy.exposure
        if WRITETHROUGH not in c.caps.modes:
            projected, rate = self._projected_dirty(c, now)
            if projected > ex.max_dirty:
                return (f"exposure bound: {dirty} dirty bytes growing {rate:.0f} B/s may reach {projected}"
                        f" (bound {ex.max_dirty}); {c.info.kind} has no write-through: flushing")
        base = st.clean_ns
        if base is None:
            return f"periodic drain: dirty data of unknown age ({dirty} bytes)"
        if now + self._tick_ns(c, now) >= base + half:
            return (f"periodic drain: last known clean {(now - base) / NS:.0f} s ago; every dirty byte written back"
                    f" within max_age {ex.max_age_s:g} s")
        return None

    def _knobs(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        kinds_knobs = c.caps.knobs() if c.caps is not _ANY_KIND else KNOBS
        for knob, value in c.policy.knobs.items():
            if knob in kinds_knobs:  # else a defaults knob for another kind of cache
                self._request_knob(c, knob, value, f"pinned by policy ({c.chosen_by})", now, out)
        self._drain_sleep(c, now, out)

    def _drain_sleep(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """The exposure guarantee needs every drain to finish within max_age/2. Where the kind may sleep before a
        drain's write-back starts (bcache: writeback_delay, 30 s by default, longer than the default 15 s window),
        hold that sleep to at most a third of the window under the destructive model, unless the policy pins it.
        A sleep already begun keeps its old length: drains planned before it can have ended get a deadline that
        allows for it (the guarantee holds from the first completed drain)."""
        knob = c.caps.drain_sleep_knob
        if knob is None or knob in c.policy.knobs or self._fm(c, now)[0] != "destructive":
            return
        limit = max(1, int(c.policy.exposure.max_age_s / 6))
        have = c.state.knobs.get(knob)
        try:
            was = KNOBS[knob].parse(have) if have is not None else 0
        except UserError:
            return  # an unreadable value: not ours to guess at
        if was <= limit:
            c.requested_knobs.pop(knob, None)
            return
        c.drain_sleep_until_ns = max(c.drain_sleep_until_ns, now + was * NS)
        self._request_knob(c, knob, str(limit), (
            f"exposure guarantee: a drain must finish within max_age/2 = {c.policy.exposure.max_age_s / 2:g} s"
            f" and the write-back thread's {knob} sleep is not cut short"), now, out)

    def _request_knob(self, c: VolumeCtl, knob: str, value: str, why: str, now: int, out: list[Action]) -> None:
        if _same_knob_value(knob, c.state.knobs.get(knob), value):
            c.requested_knobs.pop(knob, None)
            return
        req = c.requested_knobs.get(knob)
        if req is not None and req[0] == value and now - req[1] < REQUEST_RETRY_NS:
            return
        was = c.state.knobs.get(knob, "unknown")
        out.append(SetKnob(c.info.name, knob, value, f"{why}; was {was}"))
        c.requested_knobs[knob] = (value, now)


def _same_knob_value(knob: str, have: str | None, want: str) -> bool:
    """Compare as the knob's typed value ("4.0M" from bcache's sysfs equals "4MiB" and 4194304)."""
    if have is None:
        return False
    if have == want:
        return True
    k = KNOBS.get(knob)
    if k is None:
        return False
    try:
        return k.parse(have) == k.parse(want)
    except UserError:
        return False
