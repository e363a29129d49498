"""cachepilot trace files (``.cptrace``), version 2 (version 1 still reads).

A trace is the event stream the controller saw (or a generator produced), plus the volume samples and
the tick times, so that replaying it drives the models and the engine exactly as live.

Layout (all integers little-endian)::

    file   := header block* end
    header := magic "CPTRACE\\0" (8 bytes) | version u16 (=2) | flags u16 (=0) | reserved u32 (=0)
    block  := type u8 | codec u8 | reserved u16 | count u32 | length u32 | crc32 u32 | payload[length]
    end    := a block of type END (255) whose count is the total number of records in the file

``codec`` 0 = raw, 1 = zlib, 2 = zstd (the payload is compressed; the CRC covers the stored bytes; a zstd frame
declares its size, which must not exceed what the block may hold). Writers use zstd (decoding was a fifth of a
replay's time with zlib; zstd inflates several times faster and stores less); zlib blocks still read. A block holds
``count`` records of one type. Fixed-size records are packed back to back with these layouts
(``struct`` notation, ``<`` = little-endian, no padding):

=====  ===============  =================  ======================================================
type   record           layout             fields
=====  ===============  =================  ======================================================
1      HotnessDelta     ``<IQIIIQQqq``     dev, ino, gen, read_score, write_score, read_bytes,
                                           write_bytes, last_access_ns, size
2      MetadataDelta    ``<IQQ``           dev, score, bytes
3      FreedExtent      ``<IQQQBqq``       dev, ino, block, count, metadata, ts_ns, tid
4      JournalCommit    ``<IQq``           dev, transaction, ts_ns
5      Delete           ``<IQIqq``         dev, ino, gen, size, ts_ns
6      Barrier          ``<IBQIQqQQIQB``   dev, kind, ino, pid, epoch_bytes, ts_ns, epoch_data_bytes,
                                           epoch_meta_bytes, flags, arg, closes_epoch
7      Discard          ``<IQQq``          dev, sector, nr_sectors, ts_ns
8      Drops            ``<QQQ``           ringbuf_full, hotness_map_full, other
10     Tick             ``<q``             ts_ns: the engine ticks here
11     SyncCalls        ``<IBQIQq``        dev, kind, calls, last_pid, last_ino, ts_ns
=====  ===============  =================  ======================================================

Version 1 differs only in FreedExtent (``<IQQQBq``: no tid, read as -1) and Barrier (``<IBQIQq``: no
split, flags, arg or closes; read as closing exactly when the kind is a block barrier -- PREFLUSH, FUA,
EMPTY_FLUSH --, which is what the v1 kernel half meant) and has no SyncCalls.

Variable-size records are UTF-8 JSON objects, one per line (``\\n``-separated) in the payload:

* type 0 ``Meta``: ``{"volumes": [VolumeInfo fields...], "source": str, ...}`` -- the first block, one record.
* type 9 ``VolumeSample``: the VolumeSample fields.

Readers stream the file (never more than one block in memory; a pipe is read once, as a stream) and reject, with
a :class:`~cachepilot.errors.UserError` naming the byte offset: unknown versions, block types or codecs, bad
CRCs, a file cut before its meta block ends, blocks larger than :data:`MAX_BLOCK_BYTES` or
:data:`MAX_BLOCK_RECORDS`, compressed payloads that inflate beyond what the block declares, JSON that is
not an object of the expected fields and types, unknown barrier kinds, and volumes with impossible
values. A writer starts a new block when the record type changes or after 8192 records, so order
across types is kept exactly; fixed-size blocks can be read as numpy structured arrays
(:data:`DTYPES`) without a Python object per record. Compatibility: new record types get new numbers;
a changed layout bumps the version.

A file that ends early (no END block, the last block cut in its header or payload: its writer was killed) reads up
to its last complete block and the reader's ``cut`` says where it ends. Writers hand each block to the kernel in one
write as soon as it is complete, so a killed writer loses only the block in progress.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import zstandard

from cachepilot import records as R
from cachepilot.capabilities import KINDS
from cachepilot.errors import UserError
from cachepilot.events import (
    Event,
)
from cachepilot.models.epochs import BLOCK_BARRIERS
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.safeio import json_items, open_input, open_stream

MAGIC = b"CPTRACE\x00"
VERSION = 2
VERSIONS = (1, 2)
HEADER = struct.Struct("<8sHHI")
BLOCK = struct.Struct("<BBHIII")

T_META, T_SAMPLE, T_TICK, T_END = 0, 9, 10, 255  # the blocks that are not events; an event kind's is in its record
T_HOT, T_META_DELTA, T_FREED, T_COMMIT, T_DELETE, T_BARRIER, T_DISCARD, T_DROPS, T_SYNC = (
    k.trace_type for k in (R.HOTNESS, R.METADATA, R.FREED, R.COMMIT, R.DELETE, R.BARRIER, R.DISCARD, R.DROPS, R.SYNC))

_NP = {"B": "u1", "H": "u2", "I": "u4", "Q": "u8", "b": "i1", "h": "i2", "i": "i4", "q": "i8"}

LAYOUTS: dict[int, struct.Struct] = {**{k.trace_type: k.trace for k in R.KINDS}, T_TICK: struct.Struct("<q")}
LAYOUTS_V1: dict[int, struct.Struct] = {
    **{t: s for t, s in LAYOUTS.items() if t != T_SYNC},
    T_FREED: struct.Struct("<IQQQBq"),
    T_BARRIER: struct.Struct("<IBQIQq"),
}


def _dtype(layout: struct.Struct) -> np.dtype:
    """The packed numpy record of a struct layout (fields f0, f1, ...)."""
    return np.dtype([(f"f{i}", "<" + _NP[c]) for i, c in enumerate(layout.format.lstrip("<"))])


DTYPES: dict[int, np.dtype] = {t: (HOT_DTYPE if t == T_HOT else _dtype(s)) for t, s in LAYOUTS.items()}
JSON_TYPES = {T_META, T_SAMPLE}
NAMES = {T_META: "meta", **{k.trace_type: k.label for k in R.KINDS}, T_SAMPLE: "sample", T_TICK: "tick",
         T_END: "end"}
BLOCK_RECORDS = 8192
MAX_BLOCK_RECORDS = 1 << 20  # a reader refuses blocks that claim more (writers use BLOCK_RECORDS)
MAX_BLOCK_BYTES = 64 << 20  # stored or inflated; a fixed-size block inflates to exactly count x size
RAW, ZLIB, ZSTD = 0, 1, 2  # block codecs
ZSTD_LEVEL = 3
MAX_JSON_LINE = 1 << 20  # one meta or sample record
# A JSON block (meta, samples) is bounded by what its records may build, not only by bytes: 64 MiB of JSON built
# 1.7 GB of objects from a 5.6 KB trace. Its inflated size (checked against the frame's declared size before
# inflating) and its JSON items (counted before parsing) are capped; its lines must be the count it declares.
MAX_JSON_BLOCK_BYTES = 8 << 20
MAX_JSON_ITEMS = 1 << 20
MAX_TICK_NS = (1 << 32) * 1_000_000_000  # 136 years of CLOCK_MONOTONIC: hotness epochs fit in u32


@dataclass(frozen=True, slots=True)
class Tick:
    ts_ns: int


def event_to_record(ev: Event | VolumeSample | Tick) -> tuple[int, tuple[Any, ...] | dict[str, Any]]:
    """(type, fields) of one event in trace layout."""
    kind = R.BY_EVENT.get(type(ev))
    if kind is not None:
        return kind.trace_type, kind.to_record(ev)
    if isinstance(ev, Tick):
        return T_TICK, (ev.ts_ns,)
    if isinstance(ev, VolumeSample):
        d = dataclasses.asdict(ev)
        del d["writeback"]  # the live stall watch's view (models/writeback.py): not part of the trace format
        return T_SAMPLE, d
    raise TypeError(f"cannot record {type(ev).__name__}")


def upgrade_v1(t: int, r: tuple[Any, ...]) -> tuple[Any, ...]:
    """A version-1 record in version-2 layout (see the module docstring)."""
    if t == T_FREED:
        return (*r, -1)
    if t == T_BARRIER:
        return (*r, 0, 0, 0, 0, int(r[1] in BLOCK_BARRIERS))
    return r


_KIND, _SYNC_KIND = R.BARRIER_KINDS, R.SYNC_CALL_KINDS

MAKERS: dict[int, Any] = {**{k.trace_type: k.from_record for k in R.KINDS}, T_TICK: lambda r: Tick(r[0])}
"""Per fixed record type: version-2 tuple -> event (ValueError for an unknown kind)."""


def record_to_event(t: int, r: Any) -> Event | VolumeSample | Tick:
    """The event of one record in version-2 layout (tuples) or a sample (dict)."""
    if t == T_SAMPLE:
        return VolumeSample(**r)
    make = MAKERS.get(t)
    if make is None:
        raise ValueError(f"no event for record type {t}")
    return make(r)  # type: ignore[no-any-return]


class TraceWriter:
    """Write events to a trace file. Use as a context manager; ``close()`` writes the END block."""

    def __init__(self, path: str | Path | BinaryIO, volumes: Iterable[VolumeInfo] = (),
                 meta: dict[str, Any] | None = None, compress: bool = True) -> None:
        self._own = not hasattr(path, "write")
        self.name = str(path) if self._own else str(getattr(path, "name", "trace"))
        self.failed = False  # a write failed (a full disk): close() writes no END block
        # a path: created through safeio's one output path (a planted link is refused, never followed)
        self.f: BinaryIO = open_stream(path, "trace") if self._own else path  # type: ignore[arg-type,assignment]
        self.compress = compress
        self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
        self.total = 0
        self._type: int | None = None
        self._buf: list[Any] = []
        self._put(HEADER.pack(MAGIC, VERSION, 0, 0))
        m = dict(meta or {})
        m["volumes"] = [dataclasses.asdict(v) for v in volumes]
        self._block(T_META, [m])

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, data: bytes) -> None:
        """Hand data to the kernel at once (a block in one write): a killed writer leaves every block it made."""
        try:
            self.f.write(data)
            self.f.flush()
        except OSError as exc:
            self.failed = True
            raise UserError(f"{self.name}: cannot write trace: {exc.strerror or exc}") from None

    def _block(self, t: int, records: list[Any] | np.ndarray) -> None:
        if t in JSON_TYPES:
            lines = (json.dumps(r, separators=(",", ":"), sort_keys=True) for r in records)
            payload = "\n".join(lines).encode()
        elif isinstance(records, np.ndarray):
            payload = records.tobytes()
        else:
            s = LAYOUTS[t]
            payload = b"".join(s.pack(*r) for r in records)
        codec = RAW
        if self.compress and len(payload) > 256:
            payload = self._zstd.compress(payload)  # the frame carries the content size (the reader's bound)
            codec = ZSTD
        self._put(BLOCK.pack(t, codec, 0, len(records), len(payload), zlib.crc32(payload)) + payload)
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

    def write_array(self, t: int, arr: np.ndarray) -> None:
        """Fixed-size records of one type straight from a numpy array of ``DTYPES[t]`` (no per-record
        objects): generators and large drains."""
        if arr.dtype != DTYPES[t]:
            raise TypeError(f"expected dtype {DTYPES[t]}, got {arr.dtype}")
        self.flush_block()
        for i in range(0, len(arr), BLOCK_RECORDS):
            self._block(t, arr[i:i + BLOCK_RECORDS])

    def write(self, ev: Event | VolumeSample | Tick) -> None:
        t, fields = event_to_record(ev)
        self.write_record(t, fields)

    def write_many(self, events: Iterable[Event | VolumeSample | Tick]) -> None:
        for ev in events:
            self.write(ev)

    def close(self) -> None:
        if self.f.closed:
            return
        try:
            if not self.failed:
                self.flush_block()
                self._put(BLOCK.pack(T_END, 0, 0, self.total, 0, zlib.crc32(b"")))
        finally:
            if self._own:
                try:
                    self.f.close()
                except OSError:
                    pass  # nothing is left in the buffer (each block is flushed): the error was raised already


OBSERVED = "none"  # the kind of a plain block device (record, observe): not a cache
_U32, _U60 = (1 << 32) - 1, 1 << 60


def _typed(cls: type, d: Any, what: str) -> dict[str, Any]:
    """Check a JSON object against a dataclass's fields and their (simple) annotated types."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object, not {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in d:
        if k not in fields:
            raise ValueError(f"{what}: unknown field {k!r}")
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{what}: missing field {name!r}")
            continue
        v, ty = d[name], str(f.type)
        is_int = isinstance(v, int) and not isinstance(v, bool)
        ok = {"int": is_int, "int | None": v is None or is_int, "str": isinstance(v, str),
              "bool": isinstance(v, bool),
              "dict[str, str]": isinstance(v, dict) and all(isinstance(x, str) for x in (*v, *v.values()))}[ty]
        if not ok:
            raise ValueError(f"{what}: field {name!r} must be {ty}, not {json.dumps(v)[:40]}")
        if is_int and not 0 <= v <= _U60 and name != "ts_ns":
            raise ValueError(f"{what}: field {name!r} = {v} is out of range")
    return d


def volume_info(d: Any) -> VolumeInfo:
    """A VolumeInfo from its JSON object, checked (ValueError naming the problem)."""
    v = VolumeInfo(**_typed(VolumeInfo, d, "volume"))
    if v.dev > _U32:
        raise ValueError(f"volume {v.name!r}: dev {v.dev} is not a 32-bit device number")
    if not v.name:
        raise ValueError("volume: empty name")
    known = (*KINDS, OBSERVED)
    if v.kind not in known:
        raise ValueError(f"volume {v.name!r}: unknown kind {v.kind!r} (known: {', '.join(known)})")
    bs = v.fs_block_size
    if bs < 512 or bs > 65536 or bs & (bs - 1):
        raise ValueError(f"volume {v.name!r}: fs_block_size {bs} is not a power of two in 512..65536")
    return v


def volume_sample(d: Any) -> VolumeSample:
    return VolumeSample(**_typed(VolumeSample, d, "volume sample"))


class TraceReader:
    """Read a trace file block by block, streaming (one block in memory at a time, bounded in size).
    Corruption and hostile content raise UserError with the byte offset. A trace whose writer was killed (it
    ends inside a block or without the END block) reads up to its last complete block; ``cut`` then says
    where it ends. A pipe or FIFO (``/dev/stdin``) is read as a stream, once."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.cut: str | None = None  # why the trace ends early (no END block), once the blocks have been read
        self._unzstd_ctx = zstandard.ZstdDecompressor()
        f, self.stream = open_input(self.path, "trace", stream=True)
        try:
            self._header(f)
            blocks = self._walk(f)
            first = next(blocks, None)
        except BaseException:
            f.close()
            raise
        self._live: Iterator[tuple[int, int, Any]] | None = None
        if self.stream:
            self._live = itertools.chain([first] if first else [], blocks)
        else:
            f.close()
        if first is None or first[1] != T_META:
            if self.cut:
                raise UserError(f"{self.path}: trace cut at offset {HEADER.size}, before its meta block ended")
            raise UserError(f"{self.path}: offset {HEADER.size}: the first block must be the meta block")
        self._meta(first[2])

    def _header(self, f: BinaryIO) -> None:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise UserError(f"{self.path}: not a cachepilot trace (file too short: {len(head)} bytes)")
        magic, version, _flags, _ = HEADER.unpack(head)
        if magic != MAGIC:
            raise UserError(f"{self.path}: not a cachepilot trace (bad magic at offset 0)")
        if version not in VERSIONS:
            raise UserError(f"{self.path}: trace version {version} is not supported (supported: 1, 2)")
        self.version = version
        self.layouts = LAYOUTS if version == 2 else LAYOUTS_V1

    def _meta(self, recs: Any) -> None:
        if len(recs) != 1 or not isinstance(recs[0], dict):
            raise UserError(f"{self.path}: offset {HEADER.size}: the meta block must hold one JSON object")
        self.meta: dict[str, Any] = recs[0]
        vols = self.meta.get("volumes", [])
        try:
            if not isinstance(vols, list):
                raise ValueError("'volumes' must be a list")
            self.volumes: list[VolumeInfo] = [volume_info(v) for v in vols]
        except (TypeError, ValueError) as exc:
            raise UserError(f"{self.path}: offset {HEADER.size}: bad meta block: {exc}") from None
        for attr in ("dev", "name"):
            seen = [getattr(v, attr) for v in self.volumes]
            if len(set(seen)) != len(seen):
                raise UserError(f"{self.path}: offset {HEADER.size}: bad meta block: two volumes with one {attr}")

    def _err(self, off: int, msg: str) -> UserError:
        return UserError(f"{self.path}: offset {off}: {msg}")

    def _payload(self, off: int, t: int, codec: int, count: int, payload: bytes, crc: int) -> bytes:
        """One block's payload, checked and inflated, never beyond what the block may hold."""
        if zlib.crc32(payload) != crc:
            raise self._err(off, "corrupt block (CRC mismatch)")
        if codec == RAW:
            return payload
        limit = count * self.layouts[t].size if t in self.layouts else MAX_JSON_BLOCK_BYTES
        if codec == ZSTD:
            return self._unzstd(off, payload, limit)
        if codec != ZLIB:
            raise self._err(off, f"unknown codec {codec}")
        d = zlib.decompressobj()
        try:
            out = d.decompress(payload, limit + 1)  # bounded: a zlib bomb stops here
        except zlib.error as exc:
            raise self._err(off, f"corrupt compressed block: {exc}") from None
        if len(out) > limit:
            raise self._err(off, f"compressed block inflates beyond {limit} bytes")
        return out

    def _unzstd(self, off: int, payload: bytes, limit: int) -> bytes:
        """A zstd frame, inflated only up to the size it declares, and only if that fits the block's bound."""
        try:
            size = zstandard.frame_content_size(payload)
        except zstandard.ZstdError as exc:
            raise self._err(off, f"corrupt compressed block: {exc}") from None
        if size < 0:
            raise self._err(off, "compressed block does not declare its size")
        if size > limit:
            raise self._err(off, f"compressed block inflates beyond {limit} bytes (declares {size})")
        try:
            out = self._unzstd_ctx.decompress(payload, max_output_size=max(size, 1))
        except zstandard.ZstdError as exc:
            raise self._err(off, f"corrupt compressed block: {exc}") from None
        if len(out) != size:
            raise self._err(off, f"compressed block inflates to {len(out)} bytes, declares {size}")
        return out

    def _json(self, off: int, t: int, count: int, payload: bytes) -> list[Any]:
        if len(payload) > MAX_JSON_BLOCK_BYTES:
            raise self._err(off, f"{NAMES[t]} block of {len(payload)} bytes (at most {MAX_JSON_BLOCK_BYTES})")
        lines = payload.count(b"\n") + 1 if payload else 0
        if lines != count:
            raise self._err(off, f"{NAMES[t]} block holds {lines} records, declares {count}")
        items = json_items(payload)
        if items > MAX_JSON_ITEMS:
            raise self._err(off, f"{NAMES[t]} block of {items} JSON values (at most {MAX_JSON_ITEMS})")
        recs: list[Any] = []
        for line in payload.split(b"\n") if payload else ():
            if len(line) > MAX_JSON_LINE:
                raise self._err(off, f"{NAMES[t]} record longer than {MAX_JSON_LINE} bytes")
            try:
                recs.append(json.loads(line))
            except (ValueError, RecursionError) as exc:
                raise self._err(off, f"corrupt JSON record: {str(exc)[:80]}") from None
        if t == T_SAMPLE:
            for r in recs:
                if not isinstance(r, dict):
                    raise self._err(off, "sample records must be JSON objects")
        return recs

    def _fixed(self, off: int, t: int, count: int, payload: bytes) -> np.ndarray | list[tuple[Any, ...]]:
        """Hotness as a numpy array (vectorised path); other types as version-2 tuples (struct.iter_unpack
        is faster than numpy for the short blocks they come in)."""
        size = self.layouts[t].size
        if len(payload) != count * size:
            raise self._err(off, f"{NAMES[t]} block has {len(payload)} bytes for {count} records")
        if t == T_HOT:
            return np.frombuffer(payload, dtype=HOT_DTYPE)
        recs = list(self.layouts[t].iter_unpack(payload))
        if self.version == 1 and t in (T_FREED, T_BARRIER):
            recs = [upgrade_v1(t, r) for r in recs]
        if t == T_TICK:
            for (ts,) in recs:
                if not 0 <= ts < MAX_TICK_NS:
                    raise self._err(off, f"tick at {ts} ns is outside 0..136 years of monotonic time")
        if t in (T_BARRIER, T_SYNC):
            kinds = _KIND if t == T_BARRIER else _SYNC_KIND
            for r in recs:
                if r[1] not in kinds:
                    raise self._err(off, f"unknown {NAMES[t]} kind {r[1]}")
        return recs

    def raw_blocks(self) -> Iterator[tuple[int, int, Any]]:
        """(offset, type, records) per block: JSON records as a list of objects, hotness as a numpy array
        (HOT_DTYPE), other fixed records as tuples in version-2 layout."""
        if self.stream:
            live, self._live = self._live, None
            if live is None:
                raise UserError(f"{self.path}: a trace from a pipe can be read only once")
            yield from live
            return
        f, _ = open_input(self.path, "trace")  # a file again: one replaced by a FIFO since is refused
        with f:
            f.seek(HEADER.size)
            yield from self._walk(f)

    def _walk(self, f: BinaryIO) -> Iterator[tuple[int, int, Any]]:
        """The blocks from just after the header; at an early end of file, ``cut`` says where and the walk ends."""
        off = HEADER.size
        total = 0
        while True:
            head = f.read(BLOCK.size)
            if len(head) < BLOCK.size:
                self._cut(off, total)
                return
            t, codec, _r, count, length, crc = BLOCK.unpack(head)
            self._bounds(off, t, count, length)
            payload = f.read(length)
            if len(payload) < length:
                self._cut(off, total)
                return
            start = off + BLOCK.size
            if t == T_END:
                if count != total:
                    raise self._err(off, f"END block says {count} records, file has {total}")
                if f.read(1):
                    raise self._err(start, "garbage after the END block")
                return
            if t not in self.layouts and t not in JSON_TYPES:
                raise self._err(off, f"unknown block type {t}")
            payload = self._payload(off, t, codec, count, payload, crc)
            recs = self._json(off, t, count, payload) if t in JSON_TYPES else self._fixed(off, t, count, payload)
            if len(recs) != count:
                raise self._err(off, f"block says {count} records, holds {len(recs)}")
            total += count
            yield off, t, recs
            off = start + length

    def _cut(self, off: int, total: int) -> None:
        self.cut = (f"trace cut at offset {off} (no END block: its writer was stopped); read {total} records "
                    "up to there")

    def _bounds(self, off: int, t: int, count: int, length: int) -> None:
        if t == T_END:  # its count is the file's total, not a block's
            if length:
                raise self._err(off, f"END block with a payload of {length} bytes")
            return
        if count > MAX_BLOCK_RECORDS:
            raise self._err(off, f"block claims {count} records (at most {MAX_BLOCK_RECORDS})")
        if length > MAX_BLOCK_BYTES:
            raise self._err(off, f"block of {length} bytes (at most {MAX_BLOCK_BYTES})")

    def blocks(self, hot_as_array: bool = False) -> Iterator[tuple[int, Any]]:
        """(type, records) per block; fixed records as tuples in version-2 layout, JSON records as dicts.
        With hot_as_array, hotness blocks come as one numpy structured array (HOT_DTYPE) instead."""
        for _off, t, recs in self.raw_blocks():
            yield t, (recs.tolist() if t == T_HOT and not hot_as_array else recs)

    def events(self) -> Iterator[Event | VolumeSample | Tick]:
        for t, recs in self.blocks():
            if t == T_META:
                continue
            for r in recs:
                try:
                    yield volume_sample(r) if t == T_SAMPLE else record_to_event(t, r)
                except (TypeError, ValueError) as exc:
                    raise UserError(f"{self.path}: bad {NAMES[t]} record: {exc}") from None


def write_trace(path: str | Path | io.BufferedIOBase, events: Iterable[Event | VolumeSample | Tick],
                volumes: Iterable[VolumeInfo] = (), meta: dict[str, Any] | None = None) -> int:
    with TraceWriter(path, volumes, meta) as w:  # type: ignore[arg-type]
        w.write_many(events)
        return w.total
