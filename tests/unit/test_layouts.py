"""One layout, several views: the BPF hot slot (ctypes) seen by struct and numpy, and the trace's hotness record
seen by struct and numpy, must agree field by field (each view is derived from the one definition); and the records
table (cachepilot.records) agrees with the kernel's side, bpf/cachepilot.h: its structs, event types, barrier kinds."""

from __future__ import annotations

import ctypes as C
import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from cachepilot import bpf_layout as L
from cachepilot import records as R
from cachepilot.engine import Engine
from cachepilot.events import (
    Barrier,
    BarrierKind,
    Delete,
    Discard,
    Drops,
    FileKey,
    FreedExtent,
    HotnessDelta,
    JournalCommit,
    MetadataDelta,
    SyncCalls,
)
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.trace.format import LAYOUTS, T_HOT, event_to_record


def random_record(fields: list[tuple[str, type]]) -> list[int]:
    rng = random.Random(7)  # noqa: S311 (test data)
    out = []
    for _, t in fields:
        bits = 8 * C.sizeof(t)
        signed = t(-1).value < 0
        out.append(rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1)) if signed else rng.randrange(1 << bits))
    return out


def test_hot_slot_struct_numpy_and_ctypes_agree() -> None:
    fields = L.cp_hot_slot._fields_
    values = random_record(fields)
    raw = struct.pack(L.HOT_SLOT_FORMAT, *values)
    assert len(raw) == C.sizeof(L.cp_hot_slot)
    as_ctypes = L.cp_hot_slot.from_buffer_copy(raw)
    as_numpy = np.frombuffer(raw, dtype=np.dtype(L.cp_hot_slot))[0]
    for (name, _), v in zip(fields, values, strict=True):
        assert getattr(as_ctypes, name) == v == int(as_numpy[name]), name


def test_trace_hot_record_struct_and_numpy_agree() -> None:
    values = [3, 1 << 40, 7, 64, 32, 1 << 33, 4096, -5, 16384]
    raw = LAYOUTS[T_HOT].pack(*values)
    assert LAYOUTS[T_HOT].size == HOT_DTYPE.itemsize
    rec = np.frombuffer(raw, dtype=HOT_DTYPE)[0]
    assert [int(rec[n]) for n in HOT_DTYPE.names] == values


# ------------------------------------------------------------------ the records table against bpf/cachepilot.h
HEADER = Path(__file__).resolve().parents[2] / "bpf" / "cachepilot.h"
C_TYPES = {"u32": C.c_uint32, "u64": C.c_uint64}


def header_structs() -> dict[str, list[tuple[str, str]]]:
    """struct name -> [(C type, field name)] of every struct the kernel's header declares."""
    out: dict[str, list[tuple[str, str]]] = {}
    for m in re.finditer(r"^struct (\w+) \{(.*?)^\};", HEADER.read_text(), re.M | re.S):
        out[m.group(1)] = re.findall(r"^\s*((?:struct )?\w+)\s+(\w+);", m.group(2), re.M)
    return out


def header_enum(name: str) -> dict[str, int]:
    body = re.search(rf"^enum {name} \{{(.*?)^\}};", HEADER.read_text(), re.M | re.S)
    assert body, f"enum {name} is not in {HEADER}"
    return {k: int(v) for k, v in re.findall(r"^\s*(\w+)\s*=\s*(\d+),", body.group(1), re.M)}


@pytest.mark.parametrize("cls", L.ALL_STRUCTS, ids=lambda c: c.__name__)
def test_every_python_struct_is_the_headers(cls: type[C.Structure]) -> None:
    fields = header_structs().get(cls.__name__)
    assert fields is not None, f"struct {cls.__name__} is not in {HEADER.name}"
    ours = [(name, t) for name, t in cls._fields_]
    theirs = [(name, getattr(L, ctype.split()[1]) if ctype.startswith("struct ") else C_TYPES[ctype])
              for ctype, name in fields]
    assert ours == theirs


def test_the_ring_kinds_are_the_headers_event_types() -> None:
    """Every CP_EV_* of the header is one record of the table, with that struct; nothing else is a ring kind."""
    enum = header_enum("cp_event_type")
    assert {k.ring_type: k.c_struct.__name__ for k in R.BY_RING.values() if k.c_struct} == {
        v: "cp_" + name.lower().removeprefix("cp_") for name, v in enum.items()}
    assert {getattr(L, n.removeprefix("CP_")) for n in enum} == set(R.BY_RING)


def test_the_barrier_kinds_are_the_headers() -> None:
    assert {n.removeprefix("CP_BAR_"): v for n, v in header_enum("cp_barrier_kind").items()} == {
        k.name: int(k) for k in BarrierKind}


EXAMPLES = [
    HotnessDelta(FileKey(3, 1 << 40, 7), 64, 32, 1 << 33, 4096, 5, 16384),
    MetadataDelta(3, 12, 4096),
    FreedExtent(3, 12, 1000, 8, True, 99, 41),
    JournalCommit(3, 41, 100),
    Delete(FileKey(3, 12, 2), 8192, 101),
    Barrier(3, BarrierKind.FUA, 0, 0, 12288, 102, 8192, 4096, 2, 4096, True),
    Discard(3, 2048, 16, 103),
    Drops(1, 2, 3),
    SyncCalls(3, BarrierKind.FSYNC, 5, 77, 12, 104),
]


@pytest.mark.parametrize("ev", EXAMPLES, ids=lambda e: type(e).__name__)
def test_each_kind_round_trips_through_its_trace_record(ev: object) -> None:
    kind = R.BY_EVENT[type(ev)]
    raw = kind.trace.pack(*kind.to_record(ev))
    assert kind.from_record(kind.trace.unpack(raw)) == ev
    assert event_to_record(ev) == (kind.trace_type, kind.to_record(ev))  # the trace format reads the table


def test_every_kind_has_an_example_and_an_engine_handler() -> None:
    assert {type(e) for e in EXAMPLES} == set(R.BY_EVENT)
    e = Engine()
    for ev in EXAMPLES:
        e.feed(ev)  # no UnknownEvent


@pytest.mark.parametrize("kind", list(R.BY_RING.values()), ids=lambda k: k.name)
def test_each_ring_record_decodes_to_its_event(kind: R.EventKind) -> None:
    assert kind.c_struct is not None
    rec = kind.c_struct()
    rec.hdr.type, rec.hdr.dev, rec.hdr.ts_ns = kind.ring_type, 3, 12345
    if kind is R.BARRIER:
        rec.kind = int(BarrierKind.PREFLUSH)
    ev = R.decode_ring(bytes(rec) + b"\0" * 8)  # a ring record may be padded
    assert type(ev) is kind.event and ev.ts_ns == 12345
    assert R.decode_ring(bytes(rec)[:-1]) is None  # short: not decoded
