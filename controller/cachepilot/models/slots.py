"""The hotness table's storage: one *slot* per tracked file in parallel arrays, found through
``index[dev][ino] -> slot`` (an :class:`~cachepilot.models.inoindex.InoIndex` per filesystem, ~4 bytes per file:
it reads the inode numbers from the ``ino`` column).

============  ============  ============================================================================
column        stored as     meaning
============  ============  ============================================================================
dev           u16 id        kernel dev_t of the filesystem (an index into the filesystems seen)
ino           u32 (or u64)  inode number (u64 for the whole column once one needs it)
gen           u32           inode generation
rscore        u32           read counter (saturating), at aging epoch ``stamp``
wscore        u32           write counter (saturating), at aging epoch ``stamp``
rbytes        u32 + spill   bytes read below the page cache, aged like the counters (the large-file sieve)
stamp         u8 mod 256    aging epoch at which rscore/wscore were last normalised (swept: models/columns)
last          u32 ms        last access, CLOCK_MONOTONIC (ns in, whole milliseconds kept)
born          u32 ms        first write seen (0 = none): a deleted file's age (engine.lifetime)
size          u32 + spill   file size in bytes (-1 = unknown)
flags         u8            READ / APPEND / OVERWRITE / TOUCHED / LIVE / MEMBER / QUEUED / RESIDENT bits
charged       u16 + spill   pages charged to the believed-cached set
============  ============  ============================================================================

38 bytes a file with 32-bit inode numbers (65 before issue 32); the narrow columns are in models/columns.py, exact
but for the times (milliseconds). The inode index adds 4 bytes a file (models/inoindex.py).

Per filesystem we also sum the read and write bytes (``dev_bytes``), for the ``auto`` failure model.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

from cachepilot.models.columns import DevIds, Epoch8, Millis32, SpillU32, WideningU32
from cachepilot.models.inoindex import InoIndex

F_READ = 1  # a read was seen
F_APPEND = 2  # a write that grew the file by at least its size was seen
F_OVERWRITE = 4  # a write that did not (only) append was seen
F_TOUCHED = 8  # changed since the last drain_touched()
F_LIVE = 16  # slot in use
F_MEMBER = 32  # in its volume's believed-cached set (models.admission)
F_QUEUED = 64  # waiting in its volume's promotion queue (engine)
# in the cache since it last changed identity, by our promotion or the cache's own insert (engine, bcache): not
# promoted again; cleared by a write (new blocks may be elsewhere), a reset slot, or a cache change (engine)
F_RESIDENT = 128


class SlotArrays:
    """The parallel arrays, the per-filesystem indexes and the free list: slots made, found and counted. What a
    slot's counters mean and how they age is the hotness table's (models.hotness), which builds on this."""

    def __init__(self, start_ns: int = 0) -> None:
        self.epoch = 0  # the ageing epoch new slots are stamped with (the hotness table advances it)
        self.index: dict[int, InoIndex] = {}
        self.dev = DevIds()
        self.ino = WideningU32()
        self.gen = array("I")
        self.rscore = array("I")
        self.wscore = array("I")
        self.rbytes = SpillU32(dtype=np.uint64)
        self.stamp = Epoch8()
        self.last = Millis32(start_ns)
        self.born = Millis32(start_ns)  # 0: none
        self.size = SpillU32(offset=1)  # -1: unknown
        self.flags = array("B")
        self.charged = SpillU32(dtype=np.int64, narrow="H")  # pages: a file of 256 MiB or more is spilled
        self.dev_bytes: dict[int, list[int]] = {}
        self._free: list[int] = []
        self.live = 0

    def _alloc(self, dev: int, ino: int, gen: int) -> int:
        if self._free:
            slot = self._free.pop()
            self.dev[slot] = dev
            self.ino[slot] = ino
            self.gen[slot] = gen
            self.rscore[slot] = 0
            self.wscore[slot] = 0
            self.rbytes[slot] = 0
            self.stamp[slot] = self.epoch
            self.last[slot] = 0
            self.born[slot] = 0
            self.size[slot] = -1
            self.flags[slot] = F_LIVE | (self.flags[slot] & (F_TOUCHED | F_QUEUED))  # may sit in those lists
            self.charged[slot] = 0
        else:
            slot = len(self.flags)
            self.dev.extend_fill(1, dev)
            self.ino.append(ino)
            self.gen.append(gen)
            self.rscore.append(0)
            self.wscore.append(0)
            self.rbytes.extend_fill(1, 0)
            self.stamp.extend_fill(1, self.epoch)
            self.last.extend_zero(1)
            self.born.extend_zero(1)
            self.size.extend_fill(1, -1)
            self.flags.append(F_LIVE)
            self.charged.extend_fill(1, 0)
        idx = self.index.get(dev)
        if idx is None:
            idx = self.index[dev] = InoIndex(self.ino.view)
            self.dev_bytes[dev] = [0, 0]
        idx[ino] = slot
        self.live += 1
        return slot

    def _alloc_many(self, dev: int, inos: np.ndarray, gens: np.ndarray) -> np.ndarray:
        """Slots for many new files at once (distinct inode numbers, u64, with their generations): free slots
        first, then new ones at the end of the arrays. No numpy view of the arrays may exist (they may grow)."""
        k = len(inos)
        slots = np.empty(k, dtype=np.int64)
        reuse = min(k, len(self._free))
        if reuse:
            slots[:reuse] = self._free[len(self._free) - reuse:]
            del self._free[len(self._free) - reuse:]
            self._reset_slots(slots[:reuse], dev, inos[:reuse], gens[:reuse])
        rest = k - reuse
        if rest:
            base = len(self.flags)
            slots[reuse:] = np.arange(base, base + rest)
            self.dev.extend_fill(rest, dev)
            self.ino.extend(inos[reuse:].astype(np.uint64))
            self.gen.frombytes(gens[reuse:].astype(np.uint32).tobytes())
            zeros = array("I", bytes(4 * rest))
            self.rscore.extend(zeros)
            self.wscore.extend(zeros)
            self.charged.extend_fill(rest, 0)
            self.rbytes.extend_fill(rest, 0)
            self.stamp.extend_fill(rest, self.epoch)
            self.last.extend_zero(rest)
            self.born.extend_zero(rest)
            self.size.extend_fill(rest, -1)
            self.flags.extend(array("B", [F_LIVE]) * rest)
        self.index[dev].update_arrays(inos.astype(np.uint64), slots)
        self.live += k
        return slots

    def _reset_slots(self, slots: np.ndarray, dev: int, inos: np.ndarray, gens: np.ndarray) -> None:
        """Free slots taken by new files (as _alloc does one at a time)."""
        self.dev.put(slots, dev)
        self.ino.put(slots, inos.astype(np.uint64))
        np.frombuffer(self.gen, dtype=np.uint32)[slots] = gens
        np.frombuffer(self.rscore, dtype=np.uint32)[slots] = 0
        np.frombuffer(self.wscore, dtype=np.uint32)[slots] = 0
        self.rbytes.put(slots, 0)
        self.stamp.put(slots, self.epoch)
        self.last.put(slots, 0)
        self.born.put(slots, 0)
        self.size.put(slots, -1)
        self.charged.put(slots, 0)
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        flags[slots] = F_LIVE | (flags[slots] & (F_TOUCHED | F_QUEUED))  # may sit in those lists
        del flags

    def lookup(self, dev: int, ino: int, gen: int | None = None) -> int | None:
        idx = self.index.get(dev)
        if idx is None:
            return None
        slot = idx.get(ino)
        if slot is None or (gen is not None and self.gen[slot] != gen):
            return None
        return slot

    def __len__(self) -> int:
        return self.live

    def register_dev(self, dev: int) -> None:
        """Track files of this filesystem (apply_array(known_only=True) skips the others)."""
        if dev not in self.index:
            self.index[dev] = InoIndex(self.ino.view)
            self.dev_bytes[dev] = [0, 0]

    def dev_mask(self, dev: int) -> np.ndarray:
        """True at every slot (live or free) of filesystem ``dev``: one vectorised pass over the device column."""
        return self.dev.mask(dev)

    def slots_of(self, dev: int) -> np.ndarray:
        """The live slots of one filesystem (int64, in no particular order), from its index: O(its files), not
        O(all files)."""
        idx = self.index.get(dev)
        return np.empty(0, dtype=np.int64) if idx is None else idx.slots()

    def _live_slots(self, dev: int | None) -> Iterator[int]:
        if dev is None:
            for idx in self.index.values():
                yield from idx.values()
        else:
            one = self.index.get(dev)
            if one is not None:
                yield from one.values()

    def memory_bytes(self) -> int:
        """Bytes held by the per-slot columns and the sorted part of the indexes."""
        return self.column_bytes() + sum(i.memory_bytes() for i in self.index.values())

    def column_bytes(self) -> int:
        """Bytes held by the per-slot columns (their spilled values counted at ~100 bytes each)."""
        arrays = (self.gen, self.rscore, self.wscore, self.flags)
        narrow = (self.dev, self.ino, self.rbytes, self.stamp, self.last, self.born, self.size, self.charged)
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays) + sum(c.nbytes for c in narrow)
