"""The kernel's hotness table: two halves of per-file slots (the programs count into one while user space drains
the other), the claimed-slot bitmap, both memory-mapped; drained as tuples or as one numpy record array."""

from __future__ import annotations

import ctypes as C
import functools
import mmap
import struct
from typing import Any

import numpy as np

from cachepilot import bpf_layout as L
from cachepilot.errors import UserError
from cachepilot.probe.kconfig import KernelConfig

SLOT_SIZE = C.sizeof(L.cp_hot_slot)
ZERO_SLOT = bytes(SLOT_SIZE)


def _map_shared(fd: int, size: int) -> mmap.mmap:
    """A BPF_F_MMAPABLE array map's values, read-write (whole pages)."""
    return mmap.mmap(fd, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE, flags=mmap.MAP_SHARED,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE)


class KernelHotTable:
    """``nslots`` slots per half (a multiple of 64); ``config.cfg.hot_base`` says which half the programs count into."""

    def __init__(self, config: KernelConfig, nslots: int) -> None:
        self._config = config
        self.nslots = nslots
        fds = config.maps.fds
        self._hot_mm: mmap.mmap | None = _map_shared(fds["hot_slots"], 2 * nslots * SLOT_SIZE)
        self._claimed_mm: mmap.mmap | None = _map_shared(fds["hot_claimed"], 2 * nslots // 8)

    def _swap_halves(self) -> int:
        """Make the programs count into the other half of the table and wait until none still counts into this
        one (the grace map's update returns after every running program has finished); returns its first byte."""
        cfg = self._config.cfg
        old = cfg.hot_base
        cfg.hot_base = 0 if old else self.nslots
        self._config.switch()
        return old * SLOT_SIZE

    def _drain_claimed(self) -> list[int]:
        """The slots of the half of the in-kernel hotness table the programs counted into until now that they
        claimed (their bits in "hot_claimed"), the bits cleared. Lossless: the programs count into the other half
        meanwhile (_swap_halves). A file may appear in two slots (a race at claim time); deltas are additive."""
        if self._hot_mm is None or self._claimed_mm is None:
            raise UserError("probe is closed")
        first = self._swap_halves() // SLOT_SIZE // 64
        # numpy, not a Python loop over every word of the half (4 096 at the default max_files, each tick)
        words: Any = np.frombuffer(self._claimed_mm, dtype="<u8", count=self.nslots // 64,  # type: ignore[arg-type]
                                   offset=first * 8)
        try:
            nz = np.flatnonzero(words)
            if not len(nz):
                return []
            vals = words[nz]  # a copy
            words[nz] = 0
        finally:
            del words  # no view may outlive the map (close() unmaps it)
        bits = np.unpackbits(vals.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        rows, cols = np.nonzero(bits)
        return [int(x) for x in (nz[rows] + first) * 64 + cols]

    def drain_raw(self) -> list[tuple[int, ...]]:
        """See Probe.drain_hotness_raw."""
        unpack = struct.Struct(L.HOT_SLOT_FORMAT).unpack_from
        claimed = self._drain_claimed()
        mm = self._hot_mm
        assert mm is not None  # (_drain_claimed raises on a closed probe)
        out: list[tuple[int, ...]] = []
        for k in claimed:
            out.append(unpack(mm, k * SLOT_SIZE))
            mm[k * SLOT_SIZE : (k + 1) * SLOT_SIZE] = ZERO_SLOT
        return [t for t in out if t[0]]

    def drain_array(self) -> Any:  # numpy.ndarray of cachepilot.models.hotness.HOT_DTYPE (numpy loads lazily)
        """See Probe.drain_hotness_array."""

        from cachepilot.models.hotness import HOT_DTYPE

        slot = _slot_dtype()
        idx = np.array(self._drain_claimed(), dtype=np.int64)
        table: Any = np.frombuffer(self._hot_mm, dtype=slot, count=2 * self.nslots)  # type: ignore[arg-type]
        try:
            used = table[idx]  # a copy
            table[idx] = np.zeros(1, dtype=slot)
        finally:
            del table  # no view may outlive the map (close() unmaps it)
        used = used[used["ino"] != 0]
        out = np.empty(len(used), dtype=HOT_DTYPE)
        for to, f in (("dev", "dev"), ("ino", "ino"), ("gen", "gen"), ("rs", "read_score"), ("ws", "write_score"),
                      ("last", "last_ns"), ("size", "size")):
            out[to] = used[f]
        out["rb"] = used["read_sectors"].astype(np.uint64) << 9
        out["wb"] = used["write_sectors"].astype(np.uint64) << 9
        return out

    def close(self) -> None:
        for mm in (self._hot_mm, self._claimed_mm):
            if mm is not None:
                mm.close()
        self._hot_mm = self._claimed_mm = None


@functools.cache
def _slot_dtype() -> Any:
    """numpy's view of the one ctypes layout of a hotness slot (built once: numpy's ctypes conversion is slow)."""
    slot = np.dtype(L.cp_hot_slot)
    assert slot.itemsize == SLOT_SIZE
    return slot
