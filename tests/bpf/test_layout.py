"""The Python view of every struct in bpf/cachepilot.h matches the compiled object's BTF (sizes and offsets)."""

from __future__ import annotations

import ctypes as C

import pytest

from cachepilot import bpf_layout as L
from cachepilot.probe import bccload, libbpf
from cachepilot.probe.checks import CHECKOUT_OBJECT
from cachepilot.probe.hooks import HOOKS

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def btf(bpf_env: None):
    h = libbpf.lib()
    b = h.btf__parse(str(CHECKOUT_OBJECT).encode(), None)
    assert b, f"cannot parse the BTF of {CHECKOUT_OBJECT}"
    yield b
    h.btf__free(b)


@pytest.mark.parametrize("cls", L.ALL_STRUCTS, ids=lambda c: c.__name__)
def test_struct_matches_btf(btf, cls: type[C.Structure]) -> None:
    found = libbpf.btf_struct_layout(btf, cls.__name__)
    assert found is not None, f"struct {cls.__name__} is not in the object's BTF"
    size, members = found
    ours = {name: getattr(cls, name).offset for name, _ in cls._fields_}
    assert members == ours
    assert size == C.sizeof(cls)


def test_hot_slot_fast_format_matches(btf) -> None:
    import struct

    assert struct.calcsize(L.HOT_SLOT_FORMAT) == C.sizeof(L.cp_hot_slot) == 48


def test_every_program_is_known(bpf_env: None) -> None:
    """Each program in the object has a HOOKS entry (so a failed attach can be explained)."""
    h = libbpf.lib()
    obj = h.bpf_object__open_file(str(CHECKOUT_OBJECT).encode(), None)
    assert obj
    try:
        names = set()
        p = h.bpf_object__next_program(obj, None)
        while p:
            names.add(h.bpf_program__name(p).decode())
            p = h.bpf_object__next_program(obj, p)
    finally:
        h.bpf_object__close(obj)
    assert names == {hk.program for hk in HOOKS}


def test_the_bcc_build_attaches_each_program_where_the_object_does(bpf_env: None) -> None:
    """bccload.PROGRAMS names each program of the bcc build with the object's own tracepoint (tp_btf/X: raw tracepoint
    X; tracepoint/C/N: classic C/N), and leaves out only what needs BTF (docs/kernel.md, "Kernels without BTF")."""
    h = libbpf.lib()
    obj = h.bpf_object__open_file(str(CHECKOUT_OBJECT).encode(), None)
    assert obj
    try:
        sections = {}
        p = h.bpf_object__next_program(obj, None)
        while p:
            kind, _, tp = h.bpf_program__section_name(p).decode().partition("/")
            sections[h.bpf_program__name(p).decode()] = tp if kind in ("tp_btf", "tracepoint") else kind
            p = h.bpf_object__next_program(obj, p)
    finally:
        h.bpf_object__close(obj)
    assert {n: sections[n] for n in bccload.PROGRAMS} == bccload.PROGRAMS
    # the one table's tracepoint of every hook, the bcc build's or not, is the object's own
    assert {hk.program: hk.tracepoint for hk in HOOKS} == sections
    assert set(sections) - set(bccload.PROGRAMS) == {
        "on_bio_queue", "on_dio_begin", "on_dio_complete", "on_dio_queued", "on_xfs_extent_free",
    }


def test_decoding_never_raises_on_garbage() -> None:
    import random

    from cachepilot.probe import decode_event

    rng = random.Random(7)  # noqa: S311 - fuzzing, not crypto
    for n in range(2000):
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 96)))
        if n % 2:
            raw = (rng.randrange(0, 8)).to_bytes(4, "little") + raw[4:]
        decode_event(raw)  # must not raise
