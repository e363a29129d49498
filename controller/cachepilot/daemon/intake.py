"""What the probe reports, into the engine: discrete events as they arrive while the loop waits (at most every
``MIN_POLL_GAP_NS``), deletes and the per-tick aggregates once a tick. Each event is counted by kind; one the engine
does not know is "unhandled", one it refuses "rejected" (said once), and anything else a bug (its traceback once),
never mistaken for bad input."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from cachepilot.actions import Action
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.guard import Guard
from cachepilot.daemon.stopflag import StopFlag
from cachepilot.daemon.volume import VolumeTable
from cachepilot.engine.discards import DISCARD_GATHER_NS
from cachepilot.engine.dispatch import UnknownEvent
from cachepilot.engine.engine import Engine
from cachepilot.errors import UserError
from cachepilot.events import Barrier, Delete, Discard, Drops, FreedExtent, JournalCommit, MetadataDelta, SyncCalls

# The daemon takes the probe's rings at most this often. It decides once a tick; reading the rings as every kernel
# wakeup allowed (one per 20 ms under a commit storm, ~50 a second) cost the daemon more than the events themselves
# (measured in the lab's varmail run). The rings hold seconds of records even at a flush storm's rate. Few looks
# a second: each look costs the ring reads and the discard look after it whatever it brings (the headline
# fileserver's between-ticks stage, issue 23 item 5); a freed extent's discard waits at most this much longer.
# The discard gather's pace (one a second): a look sooner than DISCARD_GATHER_NS after the last one sends no discard
# (gather_due), so a poll between two gathers only read the rings early. Measured on the headline fileserver with
# py-spy: the ring reads were a tenth of the daemon's samples at four a second.
MIN_POLL_GAP_NS = DISCARD_GATHER_NS
# The event ring's wakeup pace for the daemon (Probe's wake_every_ns; the kernel's default is 20 ms, for `record` and
# `probe`, which show events as they come). The daemon reads the rings at most every MIN_POLL_GAP_NS, so a wakeup is
# of use only to end the wait after a gap: a quarter of the gap still puts one in every gap while records flow (the
# look is not later than with 20 ms), and a record after a quiet moment still wakes at once.
RING_WAKE_EVERY_NS = MIN_POLL_GAP_NS // 4
# The kinds whose handling reads and writes nothing a delete does (engine.dispatch: freed extents and commits go to
# the discard queue, barriers and sync calls to the epochs, metadata to its score, drops and discards to counters).
# Deletes wait for the tick (nothing between ticks reads what they change: the hotness table, the believed-cached
# sets, the delete ages) and go as one batch; fewer than this go one by one: the batch's array set-up costs more than
# it saves below ~5 (measured on this host: 1 a batch 60 us a delete against 16 one by one; 20 a batch 6.4 against
# 13). The headline fileserver brings ~1 delete a poll, ~10 a tick; a tree removal, thousands.
DELETE_BATCH_MIN = 6
# The probe's hotness table is taken at most this often, not every tick: each take is a swap of the kernel table's
# halves (an RCU grace period) and an array pass into the engine's table, and with it go admission and the scan
# detector's rates (Engine.tick's ``hot_fresh``); a file touched twice in the period is one record. Hotness feeds
# promotion, which acts over seconds; the headline fileserver's daemon spent about a sixth of its CPU on the take,
# its apply and admission at one a second (issue 23 item 5). A tick's lateness must not skip a take: a tick up to
# HOTNESS_EARLY_NS early takes it.
HOTNESS_EVERY_NS = 2_000_000_000
HOTNESS_EARLY_NS = HOTNESS_EVERY_NS // 4
DELETES_HELD_MAX = 16384  # held beyond this, they go at once
APART_FROM_DELETES = frozenset({FreedExtent, JournalCommit, Barrier, SyncCalls, MetadataDelta, Discard, Drops})


class Intake:
    def __init__(self, engine: Engine, vols: VolumeTable, counters: Counters, guard: Guard,
                 stop_event: StopFlag, probe: Callable[[], Any], act: Callable[[Action, int], None]) -> None:
        self.engine = engine
        self.vols = vols
        self.counters = counters
        self.guard = guard
        self.stop_event = stop_event
        self.probe = probe  # the loaded probe, or None
        self.act = act  # carries out an action (the daemon's execute)
        self.drops: Drops | None = None  # the probe's last drop counts
        self._next_poll = 0  # time.monotonic_ns() of the earliest next look at the rings (MIN_POLL_GAP_NS)
        self._deletes: list[Delete] = []  # polled, for the engine at the next tick (or before a kind they touch)
        self._next_hot = 0  # the loop's clock at which the hotness table is next taken (HOTNESS_EVERY_NS)
        self.hot_fresh = True  # whether this tick's drain took the hotness table (or there is no probe to take)

    def wait(self, seconds: float) -> None:
        """The loop's wait between ticks: on the probe's rings (feeding what comes), or on the stop event."""
        probe = self.probe()
        if probe is None:
            self.stop_event.wait(seconds)
            return
        early = (self._next_poll - time.monotonic_ns()) / 1e9
        if early > 0:  # looked less than MIN_POLL_GAP_NS ago: let records gather (a stop request ends the wait)
            if self.stop_event.wait(min(early, seconds)) or early >= seconds:
                return
            seconds -= early
        began = time.monotonic_ns()  # the loop's clock
        self._next_poll = began + MIN_POLL_GAP_NS
        probe.wake_on(self.stop_event.fileno())  # the loop gives this wait the whole tick: a stop must end it
        # records that came during the gap are read now: the wakeup they would have made may have been paced away
        # (a commit a few ms after the freed extent that woke the last look), and waiting for the next one held a
        # delete's discard until the tick (delete -> discard p50 1.3 s, tests/bpf/test_daemon_host.py)
        self.feed_all(probe.poll(0 if probe.unread() else int(seconds * 1000)))
        # the look is dated when the poll began, not when it returned: looks are then at least the gather window
        # apart however long each poll waited for a wakeup, and none is skipped as too soon after the last
        self.guard.call("discards", self.discards, began)

    def discards(self, now: int) -> None:
        """The discards the commits just polled made ready: out right after the commit that freed them, not at the
        next tick."""
        for action in self.engine.discards(now):
            self.act(action, now)

    def feed_all(self, events: Iterable[Any]) -> None:
        """A poll's events; its deletes are kept for the tick's batch (one index lookup per filesystem, not one per
        file). Every unlink comes with its freed extents, so the deletes wait past the kinds that touch none of what
        a delete touches (the hotness table and the delete ages); any other kind takes them first: the same as
        feeding each. Consecutive events of one of those kinds go as a run (see _feed_run)."""
        run: list[Any] = []
        for ev in events:
            kind = type(ev)
            if run and kind is not type(run[0]):
                self._feed_run(run)
                run = []
            if kind is Delete:
                self._deletes.append(ev)
                if len(self._deletes) >= DELETES_HELD_MAX:  # a tree removal: bounded memory, no wait
                    self.flush_deletes()
            elif kind in APART_FROM_DELETES:
                run.append(ev)
            else:
                self.flush_deletes()
                self.feed(ev)
        if run:
            self._feed_run(run)

    def _feed_run(self, evs: list[Any]) -> None:
        """Events of one kind, in order, as feeding each would: counted once, and one guard for the run while no
        event fails (a failing one is counted as feed counts it, and the rest of the run goes on). A flush storm
        brings hundreds of barriers a second; the per-event layers cost more than the epochs' own work (issue 23
        item 5)."""
        kind = type(evs[0]).__name__
        self.counters.add("events", kind, len(evs))
        route, engine = self.vols.route, self.engine
        rest = iter(evs)
        while not self._guarded(kind, lambda: engine.feed_each(map(route, rest))):
            pass

    def flush_deletes(self) -> None:
        """The deletes polled since the last flush, to the engine."""
        if self._deletes:
            run, self._deletes = self._deletes, []
            self._feed_deletes(run)

    def _feed_deletes(self, evs: list[Delete]) -> None:
        if len(evs) < DELETE_BATCH_MIN:
            for ev in evs:
                self.feed(ev)
            return
        self.counters.add("events", "Delete", len(evs))
        # (deletes are keyed by the filesystem already: vols.route leaves them as they are)
        recs: list[tuple[int, ...]] = [(e.key.dev, e.key.ino, e.key.gen, e.size, e.ts_ns) for e in evs]
        self._guarded("Delete", lambda: self.engine.feed_deletes(recs))

    def _take_deletes(self, probe: Any) -> None:
        """The deletes the kernel aggregated since the last tick (the probe's bulk_deletes), as one array: the
        same batch the polled ones make, with no object per file (issue 32: a file's end was the ring's one record
        per unlinked file)."""
        arr = probe.take_deletes()
        if len(arr):
            self.counters.add("events", "Delete", len(arr))
            self.counters.add("bulk", "Delete", len(arr))  # of those, taken from the kernel's map (not the ring)
            self._guarded("Delete", lambda: self.engine.feed_deletes_array(arr))

    def feed(self, ev: Any) -> None:
        self.counters.add("events", type(ev).__name__)
        ev = self.vols.route(ev)
        self._guarded(type(ev).__name__, lambda: self.engine.feed(ev))

    def _guarded(self, kind: str, fn: Callable[[], None]) -> bool:
        """``fn`` run; False when it raised (counted, said once or as a bug)."""
        try:
            fn()
            return True
        except UnknownEvent:  # an event kind this engine does not know yet
            self.counters.add("events", "unhandled")
        except UserError as exc:
            self.counters.add("events", "rejected")
            self.guard.once(f"event rejected: {exc}")
        except Exception:  # a bug (e.g. a TypeError inside a known kind's handler): never mistaken for input
            self.counters.add("events", "bugs")
            self.guard.bug(f"handling {kind}")
        return False

    def drain(self, now: int) -> None:
        """The tick's stage: the deletes polled since the last tick, the probe's hotness table when due
        (HOTNESS_EVERY_NS; ``hot_fresh`` says so), then its per-tick aggregates."""
        self.flush_deletes()
        probe = self.probe()
        self.hot_fresh = probe is None or now >= self._next_hot
        if probe is None:
            return
        self._take_deletes(probe)
        if self.hot_fresh:
            self._next_hot = now + HOTNESS_EVERY_NS - HOTNESS_EARLY_NS
            arr = probe.drain_hotness_array()
            if len(arr):
                self.counters.add("events", "HotnessDelta", len(arr))
                self.engine.feed_hotness_array(arr)
        for ev in probe.drain_aggregates():  # metadata deltas, durability calls, drops
            if isinstance(ev, Drops):
                self.drops = ev
            self.feed(ev)
