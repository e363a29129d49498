"""BPF ring buffers read from their memory map instead of one libbpf callback a record: fixed-size records in bulk
(numpy), records of any size in one Python pass (RawRing).

The block-barrier ring carries one record per flush the volume sees; a write + fsync loop makes tens of thousands a
second. libbpf's consumer calls back into Python once per record (ctypes trampoline, a bytes copy, a ctypes struct):
~9 µs a record, 8% of a core in a 4 KiB write + fsync loop on this host, which the loop's throughput paid for
(bench_probe, 2026-11-25). Here a batch is one pass of array operations.

The ring's layout is the kernel's (kernel/bpf/ringbuf.c, stable ABI since 5.8, the one libbpf's consumer reads): page 0
holds the consumer position (written by user space), page 1 the producer position; the data pages follow, mapped
twice in a row so that a record that wraps around the end reads as one piece. A record is an 8-byte header (u32
length with the BUSY and DISCARD bits, u32 page offset) and the payload, rounded up to 8 bytes.
"""

from __future__ import annotations

import ctypes as C
import mmap
import struct

import numpy as np

HDR_SIZE = 8
BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
_LEN_MASK = ~(BUSY_BIT | DISCARD_BIT)
_HDR = struct.Struct("<I")  # a record header's length word


class RingFormatError(RuntimeError):
    """A record of another size than the ring's: not this reader's ring."""


class _RingMaps:
    """A BPF_MAP_TYPE_RINGBUF map's memory: the consumer position (ours to write), the producer position and the
    data pages (twice in a row)."""

    def __init__(self, map_fd: int, size: int) -> None:
        if size <= 0 or size & (size - 1) or size % mmap.PAGESIZE:
            raise ValueError(f"ring size {size} is not a power of two multiple of the page size")
        self.size = size
        self._cons_mm = mmap.mmap(map_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._data_mm = mmap.mmap(map_fd, mmap.PAGESIZE + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ,
                                  offset=mmap.PAGESIZE)
        self._cons = C.c_uint64.from_buffer(self._cons_mm)  # one native 8-byte store per update, as the kernel reads
        whole = np.frombuffer(self._data_mm, dtype=np.uint8)
        self._prod = whole[:8].view(np.uint64)
        self._data = whole[mmap.PAGESIZE:]  # 2 x size: the data pages and their second mapping
        self.left_over = False

    @property
    def unread(self) -> bool:
        """Whether records wait past the consumer position (two loads from the ring's memory, no system call)."""
        return int(self._prod[0]) > int(self._cons.value)

    def close(self) -> None:
        # the views must go before the maps they look into
        del self._cons, self._prod, self._data
        self._cons_mm.close()
        self._data_mm.close()


class RawRing(_RingMaps):
    """Consumer of a ring whose records differ in size (the event ring): each record's bytes, read from the ring's
    memory in one Python pass. libbpf's consumer called back into Python once per record (a ctypes trampoline and a
    pointer copy each): under the lab's TCG vCPU the callbacks were most of the ring read's cost (issue 23 item 5).
    Same rules as libbpf's ring_buffer__consume: a record still being written (BUSY) ends the pass, a discarded one
    is skipped, the consumer position moves past what was read."""

    def take(self, limit: int) -> list[bytes]:
        """Up to `limit` committed records, oldest first, consumed."""
        cons = int(self._cons.value)
        prod = int(self._prod[0])
        data, mask, header = self._data_mm, self.size - 1, _HDR.unpack_from
        base = mmap.PAGESIZE  # the data's first byte in the second map
        out: list[bytes] = []
        while cons < prod and len(out) < limit:
            at = base + (cons & mask)
            hdr = header(data, at)[0]
            if hdr & BUSY_BIT:
                break
            n = hdr & _LEN_MASK
            if not hdr & DISCARD_BIT:
                out.append(data[at + HDR_SIZE: at + HDR_SIZE + n])  # a copy (mmap slices are bytes)
            cons += (n + HDR_SIZE + 7) & ~7
        self.left_over = len(out) >= limit and cons < prod
        self._cons.value = cons
        return out


class FixedRing(_RingMaps):
    """Consumer of a BPF_MAP_TYPE_RINGBUF map whose records all have `dtype`'s size."""

    def __init__(self, map_fd: int, size: int, dtype: np.dtype) -> None:
        super().__init__(map_fd, size)
        self.dtype = np.dtype(dtype)
        self.rec = (self.dtype.itemsize + HDR_SIZE + 7) & ~7
        # a record as one structured item (header, payload, padding): a batch is a view of the ring's memory
        # (contiguous even when it wraps: the data pages are mapped twice), not a gather by computed offsets
        self._rec_dtype = np.dtype({"names": ["len", "payload"], "formats": ["<u4", self.dtype],
                                    "offsets": [0, HDR_SIZE], "itemsize": self.rec})

    def take(self, limit: int) -> np.ndarray:
        """Up to `limit` committed records, oldest first (a record still being written ends the batch); they are
        consumed. Discarded records are skipped."""
        cons = int(self._cons.value)
        prod = int(self._prod[0])
        n = min(max(prod - cons, 0) // self.rec, limit)
        self.left_over = n == limit and prod - cons > n * self.rec  # the limit left records for the next pass
        if n <= 0:
            return np.empty(0, dtype=self.dtype)
        start = cons & (self.size - 1)
        recs = self._data[start: start + n * self.rec].view(self._rec_dtype)
        hdr = recs["len"]
        busy = np.flatnonzero(hdr & BUSY_BIT)
        if busy.size:
            n = int(busy[0])
            recs, hdr = recs[:n], hdr[:n]
        length = hdr & ~np.uint32(BUSY_BIT | DISCARD_BIT)
        if np.any(length != self.dtype.itemsize):
            bad = int(length[np.flatnonzero(length != self.dtype.itemsize)[0]])
            raise RingFormatError(f"a record of {bad} bytes in a ring of {self.dtype.itemsize}-byte records")
        rows = recs["payload"][(hdr & DISCARD_BIT) == 0]  # a copy: the kernel may reuse the space once consumed
        self._cons.value = cons + n * self.rec
        return rows
