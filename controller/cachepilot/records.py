"""One record per event kind (libbpf-tools' shared-header idea, on the Python side): for each kind of event, its
name, its dataclass (cachepilot.events), its trace record (type id, version-2 layout, conversions both ways) and,
for the kinds the kernel sends through a ring buffer, its ``CP_EV_*`` id and C struct (bpf_layout, the Python view
of bpf/cachepilot.h) with the decoding of a raw record.

The probe decodes, the trace format writes and reads, the engine dispatches and the daemon names its counters from
this table; adding a kind is adding one :class:`EventKind` here (and its struct to the C header, its handler to the
engine). tests/unit/test_layouts.py checks the table against bpf/cachepilot.h; tests/bpf/test_layout.py checks
the C structs against the compiled object's BTF.
"""

from __future__ import annotations

import ctypes as C
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachepilot import bpf_layout as L
from cachepilot.events import (
    Barrier,
    BarrierKind,
    Delete,
    Discard,
    Drops,
    Event,
    FileKey,
    FreedExtent,
    HotnessDelta,
    JournalCommit,
    MetadataDelta,
    SyncCalls,
)
from cachepilot.models.epochs import BLOCK_BARRIERS
from cachepilot.models.hotness import HOT_DTYPE

Record = tuple[Any, ...]


@dataclass(frozen=True)
class EventKind:
    name: str  # counters, metrics and drop counters: "freed_extent"
    label: str  # what a trace's errors call its records: "freed"
    event: type  # its dataclass in cachepilot.events
    trace_type: int  # its block type in a trace (trace/format.py); never reused
    trace: struct.Struct  # its version-2 trace layout
    to_record: Callable[[Any], Record]  # event -> trace record
    from_record: Callable[[Record], Event]  # trace record -> event (ValueError for a value the kind cannot take)
    ring_type: int = 0  # CP_EV_* of bpf/cachepilot.h; 0: not a ring event (drained from a map, or made here)
    c_struct: type[C.Structure] | None = None  # its struct in bpf/cachepilot.h (bpf_layout)
    from_c: Callable[[bytes], Event | None] | None = None  # a raw ring record of c_struct's size -> event


def _struct_of(dtype: np.dtype) -> struct.Struct:
    """The packed little-endian struct of a numpy record of integer fields (the one hotness layout, HOT_DTYPE)."""
    codes = {1: "b", 2: "h", 4: "i", 8: "q"}
    out = "<"
    for name in dtype.names or ():
        f = dtype[name]
        c = codes[f.itemsize]
        out += c.upper() if f.kind == "u" else c
    return struct.Struct(out)


BARRIER_KINDS = {int(k): k for k in BarrierKind}
SYNC_CALL_KINDS = {v: k for v, k in BARRIER_KINDS.items() if k not in BLOCK_BARRIERS}
BARRIER_DTYPE = np.dtype(L.cp_ev_barrier)


def _barrier(r: Record) -> Barrier:
    kind = BARRIER_KINDS.get(r[1])
    if kind is None:
        raise ValueError(f"unknown barrier kind {r[1]}")
    return Barrier(r[0], kind, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], bool(r[10]))


def _sync(r: Record) -> SyncCalls:
    kind = SYNC_CALL_KINDS.get(r[1])
    if kind is None:
        raise ValueError(f"unknown sync calls kind {r[1]} (file-level kinds only)")
    return SyncCalls(r[0], kind, r[2], r[3], r[4], r[5])


def decode_barriers(rows: np.ndarray) -> list[Barrier]:
    """Block-barrier ring records (BARRIER_DTYPE) to typed events, in bulk; a record of an unknown kind is left
    out. The one rule for barriers: a single ring record goes through it too."""
    if not rows.size:
        return []
    data, meta = rows["data_bytes"].tolist(), rows["meta_bytes"].tolist()
    out = []
    for dev, ts, kind, ino, pid, d, m, flags, arg, closes in zip(
        rows["hdr"]["dev"].tolist(), rows["hdr"]["ts_ns"].tolist(), rows["kind"].tolist(), rows["ino"].tolist(),
        rows["pid"].tolist(), data, meta, rows["flags"].tolist(), rows["arg"].tolist(), rows["closes"].tolist(),
        strict=True,
    ):
        k = BARRIER_KINDS.get(kind)
        if k is not None:
            out.append(Barrier(dev, k, ino, pid, d + m, ts, d, m, flags, arg, bool(closes)))
    return out


def _c_barrier(raw: bytes) -> Event | None:
    got = decode_barriers(np.frombuffer(raw, dtype=BARRIER_DTYPE))
    return got[0] if got else None


def _c_free(raw: bytes) -> Event:
    e = L.cp_ev_free.from_buffer_copy(raw)
    metadata = bool(e.flags & L.EXT4_FREE_BLOCKS_METADATA)
    return FreedExtent(e.hdr.dev, e.ino, e.block, e.count, metadata, e.hdr.ts_ns, tid=e.tid if e.has_tid else -1)


def _c_delete(raw: bytes) -> Event:
    e = L.cp_ev_delete.from_buffer_copy(raw)
    return Delete(FileKey(e.hdr.dev, e.ino, e.gen), e.size, e.hdr.ts_ns)


def _c_discard(raw: bytes) -> Event:
    e = L.cp_ev_discard.from_buffer_copy(raw)
    return Discard(e.hdr.dev, e.sector, e.nr_sectors, e.hdr.ts_ns)


def _c_commit(raw: bytes) -> Event:
    e = L.cp_ev_commit.from_buffer_copy(raw)
    return JournalCommit(e.hdr.dev, e.transaction, e.hdr.ts_ns)


def _hot_record(ev: HotnessDelta) -> Record:
    k = ev.key
    return (k.dev, k.ino, k.gen, ev.read_score, ev.write_score, ev.read_bytes, ev.write_bytes, ev.last_access_ns,
            ev.size)


def _barrier_record(ev: Barrier) -> Record:
    return (ev.dev, int(ev.kind), ev.ino, ev.pid, ev.epoch_bytes, ev.ts_ns, ev.epoch_data_bytes, ev.epoch_meta_bytes,
            ev.flags, ev.arg, int(ev.closes_epoch))


HOTNESS = EventKind(
    "hotness_delta", "hotness", HotnessDelta, 1, _struct_of(HOT_DTYPE), _hot_record,
    lambda r: HotnessDelta(FileKey(r[0], r[1], r[2]), r[3], r[4], r[5], r[6], r[7], r[8]))
METADATA = EventKind(
    "metadata_delta", "metadata", MetadataDelta, 2, struct.Struct("<IQQ"), lambda ev: (ev.dev, ev.score, ev.bytes),
    lambda r: MetadataDelta(*r))
FREED = EventKind(
    "freed_extent", "freed", FreedExtent, 3, struct.Struct("<IQQQBqq"),
    lambda ev: (ev.dev, ev.ino, ev.block, ev.count, int(ev.metadata), ev.ts_ns, ev.tid),
    lambda r: FreedExtent(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]),
    L.EV_FREE, L.cp_ev_free, _c_free)
COMMIT = EventKind(
    "journal_commit", "commit", JournalCommit, 4, struct.Struct("<IQq"), lambda ev: (ev.dev, ev.transaction, ev.ts_ns),
    lambda r: JournalCommit(*r), L.EV_COMMIT, L.cp_ev_commit, _c_commit)
DELETE = EventKind(
    "delete", "delete", Delete, 5, struct.Struct("<IQIqq"),
    lambda ev: (ev.key.dev, ev.key.ino, ev.key.gen, ev.size, ev.ts_ns),
    lambda r: Delete(FileKey(r[0], r[1], r[2]), r[3], r[4]), L.EV_DELETE, L.cp_ev_delete, _c_delete)
BARRIER = EventKind(
    "barrier", "barrier", Barrier, 6, struct.Struct("<IBQIQqQQIQB"), _barrier_record, _barrier,
    L.EV_BARRIER, L.cp_ev_barrier, _c_barrier)
DISCARD = EventKind(
    "discard", "discard", Discard, 7, struct.Struct("<IQQq"), lambda ev: (ev.dev, ev.sector, ev.nr_sectors, ev.ts_ns),
    lambda r: Discard(*r), L.EV_DISCARD, L.cp_ev_discard, _c_discard)
DROPS = EventKind(
    "drops", "drops", Drops, 8, struct.Struct("<QQQ"), lambda ev: (ev.ringbuf_full, ev.hotness_map_full, ev.other),
    lambda r: Drops(*r))
SYNC = EventKind(
    "sync_calls", "sync calls", SyncCalls, 11, struct.Struct("<IBQIQq"),
    lambda ev: (ev.dev, int(ev.kind), ev.calls, ev.last_pid, ev.last_ino, ev.ts_ns), _sync)

KINDS: tuple[EventKind, ...] = (HOTNESS, METADATA, FREED, COMMIT, DELETE, BARRIER, DISCARD, DROPS, SYNC)
BY_EVENT: dict[type, EventKind] = {k.event: k for k in KINDS}
BY_TRACE: dict[int, EventKind] = {k.trace_type: k for k in KINDS}
BY_RING: dict[int, EventKind] = {k.ring_type: k for k in sorted(KINDS, key=lambda k: k.ring_type) if k.ring_type}


def _check() -> None:
    """The table is consistent (at import: a mistake here is a programming error, not input)."""
    for attr in ("name", "event", "trace_type", "ring_type"):
        values = [getattr(k, attr) for k in KINDS if getattr(k, attr) != 0]
        if len(values) != len(set(values)):
            raise AssertionError(f"records: two event kinds share a {attr}")
    for k in BY_RING.values():
        if k.c_struct is None or k.from_c is None:
            raise AssertionError(f"records: ring kind {k.name} needs its C struct and decoder")


_check()


def decode_ring(raw: bytes) -> Event | None:
    """One ring-buffer record to a typed event; unknown or short records give None (never raise)."""
    if len(raw) < C.sizeof(L.cp_ev_hdr):
        return None
    kind = BY_RING.get(int.from_bytes(raw[:4], "little"))
    if kind is None or kind.c_struct is None or kind.from_c is None:
        return None
    size = C.sizeof(kind.c_struct)
    return kind.from_c(raw[:size]) if len(raw) >= size else None
