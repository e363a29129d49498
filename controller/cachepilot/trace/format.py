"""cachepilot trace files (``.cptrace``), version 1.

A trace is the event stream the controller saw (or a generator produced), plus the volume samples and
the tick times, so that replaying it drives the models and the engine exactly as live.

Layout (all integers little-endian)::

    file   := header block* end
    header := magic "CPTRACE\\0" (8 bytes) | version u16 (=1) | flags u16 (=0) | reserved u32 (=0)
    block  := type u8 | codec u8 | reserved u16 | count u32 | length u32 | crc32 u32 | payload[length]
    end    := a block of type END (255) whose count is the total number of records in the file

``codec`` 0 = raw, 1 = zlib (the payload is compressed; the CRC covers the stored bytes). A block holds
``count`` records of one type. Fixed-size records are packed back to back with these layouts
(``struct`` notation, ``<`` = little-endian, no padding):

=====  ===============  ==============  =========================================================
type   record           layout          fields
=====  ===============  ==============  =========================================================
1      HotnessDelta     ``<IQIIIQQqq``  dev, ino, gen, read_score, write_score, read_bytes,
                                        write_bytes, last_access_ns, size
2      MetadataDelta    ``<IQQ``        dev, score, bytes
3      FreedExtent      ``<IQQQBq``     dev, ino, block, count, metadata, ts_ns
4      JournalCommit    ``<IQq``        dev, transaction, ts_ns
5      Delete           ``<IQIqq``      dev, ino, gen, size, ts_ns
6      Barrier          ``<IBQIQq``     dev, kind, ino, pid, epoch_bytes, ts_ns
7      Discard          ``<IQQq``       dev, sector, nr_sectors, ts_ns
8      Drops            ``<QQQ``        ringbuf_full, hotness_map_full, other
10     Tick             ``<q``          ts_ns: the engine ticks here
=====  ===============  ==============  =========================================================

Variable-size records are UTF-8 JSON objects, one per line (``\\n``-separated) in the payload:

* type 0 ``Meta``: ``{"volumes": [VolumeInfo fields...], "source": str, ...}`` — first block of a file.
* type 9 ``VolumeSample``: the VolumeSample fields.

Readers reject unknown versions, unknown block types, bad CRCs, short blocks and a missing END block
with a :class:`~cachepilot.errors.UserError` naming the byte offset. A writer starts a new block when
the record type changes or after 8192 records, so order across types is kept exactly; hotness blocks can
be read without creating a Python object per record (``TraceReader.blocks(hot_as_array=True)`` gives a
numpy view with :data:`cachepilot.models.hotness.HOT_DTYPE`). Compatibility: new record types get new
numbers; a changed layout bumps the version.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cachepilot.errors import UserError
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
)
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.volume import VolumeInfo, VolumeSample

MAGIC = b"CPTRACE\x00"
VERSION = 1
HEADER = struct.Struct("<8sHHI")
BLOCK = struct.Struct("<BBHIII")

T_META, T_HOT, T_META_DELTA, T_FREED, T_COMMIT, T_DELETE, T_BARRIER, T_DISCARD, T_DROPS = range(9)
T_SAMPLE, T_TICK, T_END = 9, 10, 255

LAYOUTS: dict[int, struct.Struct] = {
    T_HOT: struct.Struct("<IQIIIQQqq"),
    T_META_DELTA: struct.Struct("<IQQ"),
    T_FREED: struct.Struct("<IQQQBq"),
    T_COMMIT: struct.Struct("<IQq"),
    T_DELETE: struct.Struct("<IQIqq"),
    T_BARRIER: struct.Struct("<IBQIQq"),
    T_DISCARD: struct.Struct("<IQQq"),
    T_DROPS: struct.Struct("<QQQ"),
    T_TICK: struct.Struct("<q"),
}
JSON_TYPES = {T_META, T_SAMPLE}
NAMES = {T_META: "meta", T_HOT: "hotness", T_META_DELTA: "metadata", T_FREED: "freed", T_COMMIT: "commit",
         T_DELETE: "delete", T_BARRIER: "barrier", T_DISCARD: "discard", T_DROPS: "drops",
         T_SAMPLE: "sample", T_TICK: "tick", T_END: "end"}
BLOCK_RECORDS = 8192


@dataclass(frozen=True, slots=True)
class Tick:
    ts_ns: int


def event_to_record(ev: Event | VolumeSample | Tick) -> tuple[int, tuple[Any, ...] | dict[str, Any]]:
    """(type, fields) of one event in trace layout."""
    if isinstance(ev, HotnessDelta):
        k = ev.key
        return T_HOT, (k.dev, k.ino, k.gen, ev.read_score, ev.write_score, ev.read_bytes, ev.write_bytes,
                       ev.last_access_ns, ev.size)
    if isinstance(ev, FreedExtent):
        return T_FREED, (ev.dev, ev.ino, ev.block, ev.count, int(ev.metadata), ev.ts_ns)
    if isinstance(ev, JournalCommit):
        return T_COMMIT, (ev.dev, ev.transaction, ev.ts_ns)
    if isinstance(ev, Delete):
        return T_DELETE, (ev.key.dev, ev.key.ino, ev.key.gen, ev.size, ev.ts_ns)
    if isinstance(ev, Barrier):
        return T_BARRIER, (ev.dev, int(ev.kind), ev.ino, ev.pid, ev.epoch_bytes, ev.ts_ns)
    if isinstance(ev, MetadataDelta):
        return T_META_DELTA, (ev.dev, ev.score, ev.bytes)
    if isinstance(ev, Discard):
        return T_DISCARD, (ev.dev, ev.sector, ev.nr_sectors, ev.ts_ns)
    if isinstance(ev, Drops):
        return T_DROPS, (ev.ringbuf_full, ev.hotness_map_full, ev.other)
    if isinstance(ev, Tick):
        return T_TICK, (ev.ts_ns,)
    if isinstance(ev, VolumeSample):
        return T_SAMPLE, dataclasses.asdict(ev)
    raise TypeError(f"cannot record {type(ev).__name__}")


def record_to_event(t: int, r: Any) -> Event | VolumeSample | Tick:
    if t == T_HOT:
        return HotnessDelta(FileKey(r[0], r[1], r[2]), r[3], r[4], r[5], r[6], r[7], r[8])
    if t == T_FREED:
        return FreedExtent(r[0], r[1], r[2], r[3], bool(r[4]), r[5])
    if t == T_COMMIT:
        return JournalCommit(*r)
    if t == T_DELETE:
        return Delete(FileKey(r[0], r[1], r[2]), r[3], r[4])
    if t == T_BARRIER:
        return Barrier(r[0], BarrierKind(r[1]), r[2], r[3], r[4], r[5])
    if t == T_META_DELTA:
        return MetadataDelta(*r)
    if t == T_DISCARD:
        return Discard(*r)
    if t == T_DROPS:
        return Drops(*r)
    if t == T_TICK:
        return Tick(r[0])
    if t == T_SAMPLE:
        return VolumeSample(**r)
    raise ValueError(f"no event for record type {t}")


class TraceWriter:
    """Write events to a trace file. Use as a context manager; ``close()`` writes the END block."""

    def __init__(self, path: str | Path | BinaryIO, volumes: Iterable[VolumeInfo] = (),
                 meta: dict[str, Any] | None = None, compress: bool = True) -> None:
        self._own = not hasattr(path, "write")
        self.f: BinaryIO = open(path, "wb") if self._own else path  # type: ignore[arg-type]  # noqa: SIM115
        self.compress = compress
        self.total = 0
        self._type: int | None = None
        self._buf: list[Any] = []
        self.f.write(HEADER.pack(MAGIC, VERSION, 0, 0))
        m = dict(meta or {})
        m["volumes"] = [dataclasses.asdict(v) for v in volumes]
        self._block(T_META, [m])

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _block(self, t: int, records: list[Any]) -> None:
        if t in JSON_TYPES:
            lines = (json.dumps(r, separators=(",", ":"), sort_keys=True) for r in records)
            payload = "\n".join(lines).encode()
        else:
            s = LAYOUTS[t]
            payload = b"".join(s.pack(*r) for r in records)
        codec = 0
        if self.compress and len(payload) > 256:
            payload = zlib.compress(payload, 1)
            codec = 1
        self.f.write(BLOCK.pack(t, codec, 0, len(records), len(payload), zlib.crc32(payload)))
        self.f.write(payload)
        if t != T_END:
            self.total += len(records)

    def flush_block(self) -> None:
        if self._buf and self._type is not None:
            self._block(self._type, self._buf)
        self._buf = []
        self._type = None

    def write_record(self, t: int, fields: Any) -> None:
        if t != self._type:
            self.flush_block()
            self._type = t
        self._buf.append(fields)
        if len(self._buf) >= BLOCK_RECORDS:
            self.flush_block()

    def write(self, ev: Event | VolumeSample | Tick) -> None:
        t, fields = event_to_record(ev)
        self.write_record(t, fields)

    def write_many(self, events: Iterable[Event | VolumeSample | Tick]) -> None:
        for ev in events:
            self.write(ev)

    def close(self) -> None:
        if self.f.closed:
            return
        self.flush_block()
        self.f.write(BLOCK.pack(T_END, 0, 0, self.total, 0, zlib.crc32(b"")))
        if self._own:
            self.f.close()
        else:
            self.f.flush()


class TraceReader:
    """Read a trace file block by block. Corruption raises UserError with the byte offset."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            with open(path, "rb") as f:
                self.data = f.read()
        except OSError as exc:
            raise UserError(f"{path}: cannot read trace: {exc.strerror or exc}") from None
        if len(self.data) < HEADER.size:
            raise UserError(f"{self.path}: not a cachepilot trace (file too short: {len(self.data)} bytes)")
        magic, version, _flags, _ = HEADER.unpack_from(self.data, 0)
        if magic != MAGIC:
            raise UserError(f"{self.path}: not a cachepilot trace (bad magic at offset 0)")
        if version != VERSION:
            raise UserError(f"{self.path}: trace version {version} is not supported (supported: 1)")
        self.meta: dict[str, Any] = {}
        self.volumes: list[VolumeInfo] = []
        first = next(self.blocks(), None)
        if first is None or first[0] != T_META:
            raise UserError(f"{self.path}: offset {HEADER.size}: the first block must be the meta block")
        self.meta = first[1][0]
        try:
            self.volumes = [VolumeInfo(**v) for v in self.meta.get("volumes", [])]
        except TypeError as exc:
            raise UserError(f"{self.path}: offset {HEADER.size}: bad volume in meta block: {exc}") from None

    def _err(self, off: int, msg: str) -> UserError:
        return UserError(f"{self.path}: offset {off}: {msg}")

    def blocks(self, hot_as_array: bool = False) -> Iterator[tuple[int, Any]]:
        """(type, records) per block; fixed records as tuples, JSON records as dicts. With hot_as_array,
        hotness blocks come as one numpy structured array (HOT_DTYPE) instead: no per-record objects."""
        data = self.data
        off = HEADER.size
        n = len(data)
        total = 0
        while True:
            if off + BLOCK.size > n:
                raise self._err(off, "truncated: block header cut short (no END block)")
            t, codec, _r, count, length, crc = BLOCK.unpack_from(data, off)
            start = off + BLOCK.size
            if t == T_END:
                if count != total:
                    raise self._err(off, f"END block says {count} records, file has {total}")
                if start != n:
                    raise self._err(start, f"{n - start} bytes of garbage after the END block")
                return
            if t not in LAYOUTS and t not in JSON_TYPES:
                raise self._err(off, f"unknown block type {t}")
            if start + length > n:
                raise self._err(off, f"truncated: block of {length} bytes but only {n - start} left")
            payload = data[start:start + length]
            if zlib.crc32(payload) != crc:
                raise self._err(off, "corrupt block (CRC mismatch)")
            if codec == 1:
                try:
                    payload = zlib.decompress(payload)
                except zlib.error as exc:
                    raise self._err(off, f"corrupt compressed block: {exc}") from None
            elif codec != 0:
                raise self._err(off, f"unknown codec {codec}")
            if t in JSON_TYPES:
                try:
                    recs: list[Any] = [json.loads(line) for line in payload.split(b"\n")] if payload else []
                except ValueError as exc:
                    raise self._err(off, f"corrupt JSON record: {exc}") from None
                if t == T_SAMPLE and not all(isinstance(r, dict) for r in recs):
                    raise self._err(off, "sample records must be JSON objects")
            else:
                s = LAYOUTS[t]
                if len(payload) != count * s.size:
                    raise self._err(off, f"{NAMES[t]} block has {len(payload)} bytes for {count} records")
                if hot_as_array and t == T_HOT:
                    total += count
                    yield t, np.frombuffer(payload, dtype=HOT_DTYPE)
                    off = start + length
                    continue
                recs = list(s.iter_unpack(payload))
            if len(recs) != count:
                raise self._err(off, f"block says {count} records, holds {len(recs)}")
            total += count
            yield t, recs
            off = start + length

    def events(self) -> Iterator[Event | VolumeSample | Tick]:
        for t, recs in self.blocks():
            if t == T_META:
                continue
            for r in recs:
                try:
                    yield record_to_event(t, r)
                except (TypeError, ValueError) as exc:
                    raise UserError(f"{self.path}: bad {NAMES[t]} record {r!r}: {exc}") from None


def write_trace(path: str | Path | io.BufferedIOBase, events: Iterable[Event | VolumeSample | Tick],
                volumes: Iterable[VolumeInfo] = (), meta: dict[str, Any] | None = None) -> int:
    with TraceWriter(path, volumes, meta) as w:  # type: ignore[arg-type]
        w.write_many(events)
        return w.total
