"""Event dispatch: each probe event kind to the model it updates (hotness, freed extents, epochs, metadata)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from cachepilot import records
from cachepilot.engine.volumectl import VolumeCtl
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
from cachepilot.models.hotness import HOT_DTYPE, HotnessTable, deletes_array


class UnknownEvent(TypeError):
    """An event kind this engine does not handle (a newer probe's). A TypeError, so a replay reports it as a bad
    record; the daemon counts it apart from a TypeError raised *while* handling a known kind, which is a bug."""


class EventDispatch:
    """Routes events to the volume models they update; counts the ones for unknown volumes or kinds."""

    def __init__(self, hotness: HotnessTable, vols: dict[int, VolumeCtl]) -> None:
        self.hotness = hotness
        self.vols = vols  # the engine's, shared: volumes come and go there
        self.unknown_events = 0
        self.drops: Drops | None = None
        self.external_discards = 0
        # models beside the hotness table that read every drain (sequential-cutoff steering, the sizing advisor)
        self.hotness_readers: list[Callable[[np.ndarray], None]] = []
        # models that learn from deletes before the table forgets the file (the lifetime hold: its age at delete);
        # each reads one filesystem's deletes as a DELETE_DTYPE array, with their slots in the table (the one index
        # lookup of the batch; None: not looked up)
        self.delete_readers: list[Callable[[int, np.ndarray, np.ndarray | None], None]] = []
        handlers: dict[str, Callable[[Any], None]] = {
            records.HOTNESS.name: self._feed_hotness, records.FREED.name: self._feed_freed_extent,
            records.COMMIT.name: self._feed_commit, records.DELETE.name: self.delete,
            records.BARRIER.name: self._feed_epochs, records.SYNC.name: self._feed_epochs,
            records.METADATA.name: self._feed_metadata, records.DISCARD.name: self._feed_discard,
            records.DROPS.name: self._feed_drops,
        }
        # every kind of the records table has its handler (a kind added there without one fails here, at once)
        self._handlers = {k.event: handlers[k.name] for k in records.KINDS}

    def feed(self, ev: Event) -> None:
        handler = self._handlers.get(type(ev))
        if handler is None:
            raise UnknownEvent(f"not an event: {ev!r}")
        handler(ev)

    def feed_each(self, evs: Iterator[Event]) -> None:
        """feed() for each event, without a call per event from the caller (a poll brings hundreds)."""
        handlers = self._handlers
        for ev in evs:
            handler = handlers.get(type(ev))
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
        for read in self.hotness_readers:
            read(records)

    def _vol(self, dev: int) -> VolumeCtl | None:
        c = self.vols.get(dev)
        if c is None:
            self.unknown_events += 1
        return c

    def feed_deletes(self, recs: list[tuple[int, ...]]) -> None:
        """Delete records in trace layout (dev, ino, gen, size, ts_ns), as feeding each Delete would, per
        filesystem in one index lookup (a replay's deletes come by the hundred thousand)."""
        if recs:
            self.feed_deletes_array(deletes_array(recs))

    def feed_deletes_array(self, arr: np.ndarray) -> None:
        """Deletes as one DELETE_DTYPE array (the probe's bulk take: no object per file), as feeding each Delete
        would: per filesystem, in the order the filesystems first come, in one index lookup each."""
        if not len(arr):
            return
        devs = arr["dev"]
        uniq, first = np.unique(devs, return_index=True)
        for dev in uniq[np.argsort(first)].tolist():
            mine = arr[devs == dev]
            inos = np.ascontiguousarray(mine["ino"])
            # one index lookup for the readers and the forgetting (most deleted files were never tracked: each
            # lookup costs a step per such file)
            idx = self.hotness.index.get(dev)
            slots = idx.lookup_many(inos) if idx is not None else None
            if dev in self.vols:
                for read in self.delete_readers:
                    read(dev, mine, slots)
            # as delete() does, per batch
            self.hotness.forget_many(dev, inos, mine["gen"].astype(np.uint32), slots=slots)

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
        k = ev.key
        if k.dev in self.vols:
            for read in self.delete_readers:
                read(k.dev, deletes_array([(k.dev, k.ino, k.gen, ev.size, ev.ts_ns)]), None)
        self.hotness.delete(ev)
