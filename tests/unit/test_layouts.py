"""One layout, several views: the BPF hot slot (ctypes) seen by struct and numpy, and the trace's hotness record
seen by struct and numpy, must agree field by field (each view is derived from the one definition)."""

from __future__ import annotations

import ctypes as C
import random
import struct

import numpy as np

from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.probe import layout as L
from cachepilot.trace.format import LAYOUTS, T_HOT


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
