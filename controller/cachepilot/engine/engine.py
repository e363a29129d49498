"""The decision engine: events and backend samples in, actions out, once per tick.

Per tick the work is proportional to what changed (files touched since the last tick, freed extents,
samples), never to the number of tracked files:

1. files touched since the last tick are sieved and offered to their volume's believed-cached set
   (admission against the last evicted counter); newly admitted ones queue for promotion -- on a cache that
   inserts its own read misses (bcache) only what it did not keep: files not already resident, and only while it
   has been bypassing reads (:mod:`cachepilot.engine.admission`);
2. a falling hit ratio (a scan polluted the cache) queues the whole believed-cached set for re-warming;
3. promotions leave the queue within the volume's byte budget per second;
4. freed extents whose journal transaction committed leave as discards at once, paced by the volume's discard
   budget (the daemon also asks between ticks, right after the poll that brought the commit: :meth:`discards`);
5. the write policy follows the failure latch first (a failed or degraded cache stays out of write-back until
   its cache device is replaced or an operator clears it), then the failure model, with hysteresis;
6. destructive volumes drain: dirty data is driven to zero at least once per ``exposure.max_age``
   (see :meth:`Drains.plan` for the guarantee); a drain that misses its deadline is a breach. Where the kernel
   can keep the bound itself (dm-writecache's max_age and watermarks) it is delegated to it and a drain comes
   only on a measured breach (:mod:`cachepilot.engine.nativebound`);
7. pinned knobs are set when the backend reports a different value (only knobs the cache kind has).

How each action ended comes back through :meth:`Engine.outcome`: drains complete or breach, failed discards
are re-queued, failed switches and knobs are asked again after ``REQUEST_RETRY_NS``.

Each step is a collaborator in its own module (admission, promotion, discards, writepolicy, drains, knobs; events
go through dispatch); the engine owns the volumes and sequences the steps. One volume's state is a ``VolumeCtl``
(volumectl).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from cachepilot.actions import DONE, FAILED, Action, Detach, DiscardRanges, Drain, Outcome, PutBackKnobs, SetKnob
from cachepilot.engine import operatordetach, operatordrain
from cachepilot.engine.admission import Admission
from cachepilot.engine.discards import gather_due, plan_discards, requeue_failed
from cachepilot.engine.dispatch import EventDispatch
from cachepilot.engine.drains import Drains, drain_at_risk
from cachepilot.engine.exposure import Exposure
from cachepilot.engine.handoff import queue_imported
from cachepilot.engine.knobs import KnobPins
from cachepilot.engine.lifetime import Lifetimes
from cachepilot.engine.nativebound import NativeBound
from cachepilot.engine.promotion import Promoter
from cachepilot.engine.seqcutoff import KNOB as SEQ_KNOB
from cachepilot.engine.seqcutoff import SequentialSteering
from cachepilot.engine.volumectl import NS, RUNNING, Latch, VolumeCtl, caps_of, normalise_mode
from cachepilot.engine.writepolicy import WritePolicy
from cachepilot.errors import UserError
from cachepilot.events import Delete, Event
from cachepilot.models.admission import CachedSet
from cachepilot.models.epochs import EpochTracker
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.hotness import F_QUEUED, F_READ, HotnessTable
from cachepilot.models.pins import PinnedFile
from cachepilot.models.sizing import Advisors
from cachepilot.models.volume import WRITEBACK, Health, VolumeInfo, VolumeSample, VolumeState
from cachepilot.models.writeback import Finding
from cachepilot.policy.model import DEFAULT_POLICY, Policy, VolumePolicy

FINDINGS_KEPT = 256


class Engine:
    """Owns the volumes (``vols`` by the filesystem's device, ``by_name``) and sequences each tick's steps through
    its collaborators; the public methods are what the daemon, replay and the simulator call."""

    def __init__(self, policy: Policy = DEFAULT_POLICY, volumes: Iterable[VolumeInfo] = (),
                 start_ns: int = 0, advisor: bool = False) -> None:
        self.policy = policy
        self.hotness = HotnessTable(policy.half_life_s, start_ns)
        # the cache-sizing advisor's samplers, fed the same drains (opt-in: its cost grows with the files touched)
        self.sizing: Advisors | None = Advisors() if advisor else None
        self.vols: dict[int, VolumeCtl] = {}
        self.by_name: dict[str, VolumeCtl] = {}
        self.now_ns = start_ns
        self.events = EventDispatch(self.hotness, self.vols)
        self.admission = Admission(self.hotness, self.vols)
        self.promoter = Promoter(self.hotness)
        exposure = Exposure(self.hotness)
        self.writes = WritePolicy(exposure)
        self.native = NativeBound()  # the exposure bound delegated to the kernel where it can keep it
        self.drains = Drains(exposure, self.native)
        self.knobs = KnobPins(exposure)
        self.seq = SequentialSteering()  # bcache's sequential_cutoff, by what the bypassed runs are made of
        self.events.hotness_readers.append(self.seq.written)
        self.lifetimes = Lifetimes()  # delete ages and the lifetime hold (engine.lifetime)
        # stalls and all-dirty caches found or ended since the daemon last took them (bounded: replay and the
        # simulator never take them)
        self.findings: deque[Finding] = deque(maxlen=FINDINGS_KEPT)
        self.events.delete_readers.append(
            lambda dev, recs, slots: self.lifetimes.deleted_many(self.hotness, dev, recs, slots))
        if self.sizing is not None:
            sizing = self.sizing
            self.events.hotness_readers.append(lambda recs: sizing.observe(recs, self.vols))
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
        if SEQ_KNOB in ctl.caps.knobs():
            self.seq.track(info.dev)
        return ctl

    def remove_volume(self, dev: int) -> VolumeCtl | None:
        """Forget a volume that vanished: its queued promotions and pending discards go with it (its files'
        counters stay, so a volume that comes back is not cold)."""
        c = self.vols.pop(dev, None)
        if c is None:
            return None
        self.by_name.pop(c.info.name, None)
        self.seq.forget(dev)
        self.native.forget(dev)
        if self.sizing is not None:
            self.sizing.forget(self.vols)
        flags = self.hotness.flags
        for slot in c.promo_queue.clear():
            flags[slot] &= ~F_QUEUED & 0xFF
        for slot in c.cached.members():
            c.cached.discard(slot)
        return c

    def set_pins(self, name: str, files: list[PinnedFile], note: str = "") -> None:
        """The files the volume's pin patterns resolved to (the daemon walks the mount; models/pins.py)."""
        c = self.volume(name)
        c.pins.assign(self.hotness, c.info.dev, files, c.policy.pin.refresh_s, note, self.now_ns)
        for slot in c.pins.slots.tolist():
            c.cached.discard(slot)  # a pinned file is no member: no admission or eviction decision touches it
        c.cached.capacity_bytes = c.set_room()

    def import_hot(self, name: str, files: list[tuple[int, int, int, int]]) -> tuple[int, int]:
        """A warm handoff's hot list (ino, gen, score, size), hottest first: engine/handoff.py."""
        return queue_imported(self.volume(name), self.hotness, self.now_ns, files)

    @staticmethod
    def _granularity(info: VolumeInfo, vp: VolumePolicy) -> int:
        """Discards go in whole multiples of the largest of the filesystem block, the cache's discard unit (a smaller
        discard is lost on the cache: dm-cache's discard block) and the policy's min_extent, in filesystem blocks."""
        bs = max(1, info.fs_block_size)
        return max(1, -(-max(info.discard_unit, vp.discard_on_delete.min_extent) // bs))

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
            c.cached.capacity_bytes = c.set_room()
            c.freed.granularity = self._granularity(c.info, vp)
            c.state.error_threshold = vp.health.error_threshold

    # ------------------------------------------------------------ input (see dispatch)
    @property
    def unknown_events(self) -> int:
        """Events (and samples) for a volume the engine does not know, or of a kind it does not handle."""
        return self.events.unknown_events

    def feed(self, ev: Event) -> None:
        self.events.feed(ev)

    def feed_each(self, evs: Iterator[Event]) -> None:
        """feed() for each event the iterator yields; one that raises leaves the rest in the iterator."""
        self.events.feed_each(evs)

    def feed_hotness_records(self, records: list[tuple[int, ...]]) -> None:
        """HotnessDelta records as tuples in trace layout (see cachepilot.trace.format)."""
        self.events.feed_hotness_records(records)

    def feed_hotness_array(self, records: np.ndarray) -> None:
        """Fastest path: a numpy array of HOT_DTYPE records (a trace block or a raw BPF drain)."""
        self.events.feed_hotness_array(records)

    def feed_deletes(self, recs: list[tuple[int, ...]]) -> None:
        """Delete records in trace layout (dev, ino, gen, size, ts_ns), in one index lookup per filesystem."""
        self.events.feed_deletes(recs)

    def feed_deletes_array(self, arr: np.ndarray) -> None:
        """Deletes as one DELETE_DTYPE array (the probe's bulk take), in one index lookup per filesystem."""
        self.events.feed_deletes_array(arr)

    def feed_freed(self, recs: list[tuple[int, ...]]) -> None:
        """FreedExtent records in trace layout (dev, ino, block, count, metadata, ts_ns, tid), as arrays."""
        self.events.feed_freed(recs)

    def delete(self, ev: Delete) -> None:
        self.events.delete(ev)

    def sample(self, s: VolumeSample) -> None:
        c = self.vols.get(s.dev)
        if c is None:
            self.events.unknown_events += 1
            return
        if self.sizing is not None:  # the advisor calibrates by the cache's own ratio
            self.sizing.note_sample(s.dev, s.hits, s.misses)
        st = c.state
        grew = st.update(VolumeSample(
            s.dev, s.ts_ns, normalise_mode(s.mode), s.dirty_bytes, s.hits, s.misses, s.io_errors, s.failed,
            s.knobs, s.cache_id, in_use_percent=s.in_use_percent, written_bytes=s.written_bytes,
        ))
        c.epochs.note_dirty(grew)
        c.pins.sampled(s.misses, s.bypasses, s.ts_ns)
        self.seq.sampled(s.dev, s.knobs, s.bypassed_bytes)
        if s.bypasses is not None:
            prev, c.bypasses_seen = c.bypasses_seen, s.bypasses
            if prev is not None and s.bypasses > prev:
                c.bypass_rose_ns = s.ts_ns
        if st.dirty_bytes == 0:
            c.breach = None
        self._watch_writeback(c, s)
        self._latch(c, s.ts_ns)
        self.promoter.replaced(c, s.cache_id, self.now_ns)

    def _watch_writeback(self, c: VolumeCtl, s: VolumeSample) -> None:
        """Is write-back making progress (models/writeback.py)? A drain in flight -- the policy's or an operator's
        -- is write-back that must run whatever the kind would hold."""
        draining = c.drain is not None or (c.operator is not None and c.operator.state == RUNNING)
        written = self.hotness.dev_bytes.get(c.info.dev, (0, 0))[1]
        self.findings.extend(c.writeback.observe(c.info.name, s.ts_ns, s.dirty_bytes, s.writeback, draining,
                                                 c.policy.health.stall_after_s, written))

    def take_findings(self) -> list[Finding]:
        """The stalls and all-dirty caches found or ended since the last call, oldest first."""
        out = list(self.findings)
        self.findings.clear()
        return out

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

    def writeback_carried(self, dev: int) -> dict[str, float] | None:
        """The volume's stretch without write-back progress, for the state file (models/writeback.py)."""
        c = self.vols.get(dev)
        return c.writeback.carried() if c is not None else None

    def resume_writeback_watch(self, dev: int, stalled_s: float, dirty: int, now_ns: int) -> None:
        c = self.vols.get(dev)
        if c is not None:
            c.writeback.resume(stalled_s, dirty, now_ns)

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
            self.drains.ended(c, a, ok, o.detail, self.now_ns)
            operatordrain.drain_ended(c, a, ok, o.detail, self.now_ns)
        elif isinstance(a, Detach):
            operatordetach.ended(c, a, ok, f"{o.detail}: {o.error}" if o.error else o.detail, o.writes)
        elif isinstance(a, DiscardRanges) and not ok:
            requeue_failed(c, a)
        # a failed switch or knob is asked again after REQUEST_RETRY_NS (the request stays recorded until then)


    def rewarm(self, name: str, reason: str = "re-warm requested") -> int:
        """Queue a volume's whole believed-cached set for promotion, hottest first."""
        c = self.volume(name)
        return self.promoter.rewarm(c, reason)

    # ------------------------------------------------------------ the tick
    def tick(self, now_ns: int, *, hot_fresh: bool = True) -> list[Action]:
        """The decisions of a tick. ``hot_fresh`` False: no hotness came since the last tick (the daemon takes the
        probe's table every few ticks): admission and the scan detector wait for the tick that brings it, so the
        detector's rates span whole takes (a tick without one would read as a rate of nothing)."""
        if now_ns > self.now_ns:
            self.now_ns = now_ns
        now = self.now_ns
        t = self.hotness
        t.advance(now)
        out: list[Action] = []
        if hot_fresh:
            self.admission.admit(t, now)
        for c in self.vols.values():
            if hot_fresh:
                self.promoter.scan_pollution(c, now)
            self.admission.bypass_gate(c, now)
            self.promoter.promote(c, now, out)
            if gather_due(c, now, prompted=False):
                plan_discards(c, now, out)
            self.drains.track(c, now)
            operatordrain.step(c, now, out)
            operatordetach.step(c, now, out)
            # an operator's drain or detach: the policy stays off
            held = c.operator is not None and c.operator.active or c.detach is not None and c.detach.holds
            if not held:
                self.writes.decide(c, now, out)
            self.knobs.pin(c, now, out)
            self._steer(c, now, out)
            if not held:
                self._native_bound(c, now, out)  # first: its put-back on a model change precedes the hold's request
                self._lifetime_hold(c, now, out)
                self.drains.plan(c, now, out)
            c.last_tick_ns = now
        return out

    def operator_drain(self, name: str, deadline_s: float, end: str, rate: int = 0, number: int = 0,
                       now_ns: int = 0) -> dict[str, object]:
        """``cachepilot drain``: start an operator's drain of a volume (engine/operatordrain.py); its status.
        ``now_ns``: the daemon's time for this tick, taken before the tick itself -- the deadline runs from it, not
        from the last tick's time, which a slow tick (a table reload, an lvchange under TCG) leaves seconds behind
        (lab: a 1 s drain on dm-writecache taken up 5 s late expired before any flush was sent)."""
        self.now_ns = max(self.now_ns, now_ns)
        c = self.volume(name)
        op = operatordrain.request(c, self.now_ns, deadline_s, end, rate, number)
        return op.to_json(c.state.dirty_bytes, self.now_ns)

    def operator_detach(self, name: str, deadline_s: float, accept_loss: bool, number: int = 0,
                        now_ns: int = 0) -> dict[str, object]:
        """``cachepilot detach``: drain, then detach the volume's cache (engine/operatordetach.py); its status.
        ``number`` and ``now_ns`` as for :meth:`operator_drain`."""
        self.now_ns = max(self.now_ns, now_ns)
        c = self.volume(name)
        return operatordetach.request(c, self.now_ns, deadline_s, accept_loss, number).to_json(self.now_ns)

    def detached(self) -> list[VolumeCtl]:
        """The volumes whose cache an operator's detach took away: the daemon releases each from management."""
        return [c for c in self.vols.values() if c.detach is not None and c.detach.state == operatordetach.DETACHED]

    def operator_release(self, name: str) -> str:
        """``cachepilot drain --release``: the policy takes the volume back."""
        return operatordrain.release(self.volume(name))

    def _steer(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        steer = self.seq.decide(c.info.dev, c.policy.sequential_steering, SEQ_KNOB in c.policy.knobs, now)
        if steer is not None:
            self.knobs.request(c, SEQ_KNOB, steer[0], steer[1], now, out, put_back=False)  # seq restores its own

    def _lifetime_hold(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """Recoverable write-back volumes hold young data dirty (engine.lifetime); not while latched or draining."""
        vp, st = c.policy, c.state
        active = (vp.lifetime_hold.enabled and c.latch is None and c.drain is None and st.samples > 0
                  and normalise_mode(st.mode) == WRITEBACK
                  and self.knobs.exposure.failure_model(c, now)[0] == "recoverable")
        self.lifetimes.steer(c.info, vp, st, self.hotness.dev_bytes.get(c.info.dev, (0, 0))[1], now, active,
                             lambda k, v, why: self.knobs.request(c, k, v, why, now, out, put_back=True))

    def _native_bound(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """Destructive volumes of a kind that can keep the exposure bound itself get the table arguments for it
        (engine.nativebound), together, put back on exit or when the model changes; not while latched."""
        self.native.steer(c, self.knobs.exposure.failure_model(c, now), c.latch is not None,
                          lambda wants: self.knobs.request_many(c, wants, now, out, put_back=True),
                          lambda knobs, why: out.append(PutBackKnobs(c.info.name, knobs, why)))

    def steered_knobs(self, dev: int) -> dict[str, tuple[str, str]]:
        """The knobs the engine itself steered and would put back at stop (knob -> (found at start, ours))."""
        got = self.seq.steered(dev)
        return {} if got is None else {SEQ_KNOB: got}

    def restore_knobs(self) -> list[Action]:
        """At stop: the knobs the engine steered (not pinned ones) back to the values found at start."""
        out: list[Action] = []
        for c in self.vols.values():
            back = self.seq.restore(c.info.dev)
            if back is not None:
                out.append(SetKnob(c.info.name, SEQ_KNOB, back[0], back[1]))
        return out

    def discards(self, now_ns: int) -> list[Action]:
        """The discards that the commits seen since the last look made ready, now (within each volume's budget).
        The daemon asks after every poll of the probe's rings: a freed extent's discard goes out right after the
        commit that freed it, not at the next tick -- dead data that waits is data the cache may write back.
        At most one look per volume every DISCARD_GATHER_NS: the commits in between leave together."""
        out: list[Action] = []
        now = max(now_ns, self.now_ns)
        for c in self.vols.values():
            if gather_due(c, now):
                plan_discards(c, now, out)
        return out

    # ------------------------------------------------------------ drains
    def before_ready(self, now_ns: int) -> list[Action]:
        """What the exposure guarantee needs in place before the daemon says it is ready (after one sample of each
        volume): the write-back thread's sleep held within the drain window. bcache's thread reads
        writeback_delay when a scan of the dirty keys ends and sleeps that long whatever is written later; asked
        only at the first tick (a tick after ready), the stock 30 s could be the sleep a workload started at
        ready met, and the first drain waited for it (W1's 36.7 s round, docs/benchmarks.md, "Headline W1")."""
        out: list[Action] = []
        now = max(now_ns, self.now_ns)
        for c in self.vols.values():
            if c.state.samples:
                self.knobs.drain_sleep(c, now, out)
        return out

    def holds_promotions(self, name: str) -> bool:
        """Whether promotions on the volume wait (its drain is at risk), including those already under way."""
        c = self.by_name.get(name)
        return c is not None and drain_at_risk(c, self.now_ns)

