"""The bulk ring reader (cachepilot.probe.ring) on a memfd laid out as the kernel lays out a BPF ring buffer: consumer
page, producer page, the data pages twice in a row. Wrap-around, a record still being written, discarded records and
the limit; the same readers run on the real rings in tests/bpf (test_barriers, test_storm, test_exactness: the barrier
ring; every test that polls events: the event ring)."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from cachepilot.probe.ring import BUSY_BIT, DISCARD_BIT, FixedRing, RawRing, RingFormatError

PAGE = mmap.PAGESIZE
SIZE = PAGE  # one data page: a 24-byte record wraps after 128 records
DT = np.dtype([("a", "<u8"), ("b", "<u4"), ("c", "<u4"), ("d", "<u8")])  # 24 bytes -> 32-byte records
REC = 32


class FakeRing:
    """The kernel's side: writes records at the producer position, into both mappings of the data."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("ring")
        os.ftruncate(self.fd, 2 * PAGE + 2 * SIZE)
        self.mm = mmap.mmap(self.fd, 2 * PAGE + 2 * SIZE)
        self.prod = 0
        self.content = bytearray(SIZE)

    def cons(self) -> int:
        return int(struct.unpack_from("<Q", self.mm, 0)[0])

    def _put(self, off: int, data: bytes) -> None:
        for t, byte in enumerate(data):
            self.content[(off + t) % SIZE] = byte
        for base in (2 * PAGE, 2 * PAGE + SIZE):  # the kernel maps the data pages twice in a row
            self.mm[base: base + SIZE] = bytes(self.content)

    def write_raw(self, payload: bytes, flags: int = 0) -> int:
        """A record of any size (the event ring's); returns where its header is."""
        off = self.prod & (SIZE - 1)
        self._put(off, struct.pack("<II", len(payload) | flags, 0) + payload)
        self.prod += (len(payload) + 8 + 7) & ~7
        struct.pack_into("<Q", self.mm, PAGE, self.prod)
        return off

    def write(self, a: int, *, length: int = DT.itemsize, flags: int = 0) -> None:
        off = self.prod & (SIZE - 1)
        payload = np.array([(a, a & 0xFFFF, 7, a * 3)], dtype=DT).tobytes()
        self._put(off, struct.pack("<II", length | flags, 0) + payload)
        self.prod += REC
        struct.pack_into("<Q", self.mm, PAGE, self.prod)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


@pytest.fixture
def ring() -> Iterator[tuple[FakeRing, FixedRing]]:
    k = FakeRing()
    r = FixedRing(k.fd, SIZE, DT)
    yield k, r
    r.close()
    k.close()


def test_records_come_in_order_and_are_consumed(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    for a in range(1, 11):
        k.write(a)
    got = r.take(100)
    assert got["a"].tolist() == list(range(1, 11))
    assert got["d"].tolist() == [3 * a for a in range(1, 11)]
    assert k.cons() == 10 * REC
    assert r.take(100).size == 0


def test_wrap_around_reads_whole_records(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    seen: list[int] = []
    a = 0
    for _ in range(10):  # 10 x 50 records through a ring of 128: wraps several times, a record across the end
        for _ in range(50):
            a += 1
            k.write(a)
        seen += r.take(1000)["a"].tolist()
    assert seen == list(range(1, a + 1))


def test_a_record_being_written_ends_the_batch(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    k.write(1)
    k.write(2, flags=BUSY_BIT)
    k.write(3)
    assert r.take(100)["a"].tolist() == [1]
    assert k.cons() == REC  # the busy record and what follows it stay for the next pass
    # committed: the kernel clears the busy bit
    k._put(REC, struct.pack("<I", DT.itemsize))
    assert r.take(100)["a"].tolist() == [2, 3]


def test_discarded_records_are_skipped_and_consumed(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    k.write(1)
    k.write(2, flags=DISCARD_BIT)
    k.write(3)
    assert r.take(100)["a"].tolist() == [1, 3]
    assert k.cons() == 3 * REC


def test_the_limit_bounds_a_batch(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    for a in range(1, 21):
        k.write(a)
    assert r.take(8)["a"].tolist() == list(range(1, 9))
    assert r.take(100)["a"].tolist() == list(range(9, 21))


def test_a_record_of_another_size_is_an_error(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    k.write(1, length=16)
    with pytest.raises(RingFormatError, match="16 bytes"):
        r.take(10)


def test_left_over_says_whether_the_limit_left_records(ring: tuple[FakeRing, FixedRing]) -> None:
    k, r = ring
    for a in range(1, 6):
        k.write(a)
    r.take(3)
    assert r.left_over
    r.take(2)
    assert not r.left_over  # exactly the limit, nothing after it
    k.write(6)
    r.take(3)
    assert not r.left_over


@pytest.fixture
def raw_ring() -> Iterator[tuple[FakeRing, RawRing]]:
    k = FakeRing()
    r = RawRing(k.fd, SIZE)
    yield k, r
    r.close()
    k.close()


def payload(i: int) -> bytes:
    return bytes([i & 0xFF]) * (1 + i % 61)  # 1..61 bytes: headers land on every 8-byte offset of the page


def test_raw_records_of_any_size_come_whole_in_order_across_the_wrap(raw_ring: tuple[FakeRing, RawRing]) -> None:
    k, r = raw_ring
    seen: list[bytes] = []
    want: list[bytes] = []
    i = 0
    for _ in range(20):  # ~600 records through a one-page ring: it wraps many times, records across its end
        for _ in range(30):
            i += 1
            k.write_raw(payload(i))
            want.append(payload(i))
        seen += r.take(1000)
    assert seen == want and k.cons() == k.prod


def test_raw_ring_stops_at_a_busy_record_skips_discarded_ones_and_keeps_the_limit(
        raw_ring: tuple[FakeRing, RawRing]) -> None:
    k, r = raw_ring
    k.write_raw(b"one")
    k.write_raw(b"gone", flags=DISCARD_BIT)
    busy = k.write_raw(b"three!", flags=BUSY_BIT)
    k.write_raw(b"four")
    assert r.take(100) == [b"one"] and k.cons() == 32  # the busy one and what follows it wait
    k._put(busy, struct.pack("<I", 6))  # committed: the kernel clears the busy bit
    assert r.take(1) == [b"three!"] and r.left_over
    assert r.take(100) == [b"four"] and not r.left_over and k.cons() == k.prod
