"""Per-file hotness: Loris' inverse-bitmap counters, kept in parallel arrays.

One *slot* per tracked file. A file is found through ``index[dev][ino] -> slot`` (an
:class:`~cachepilot.models.inoindex.InoIndex` per filesystem, ~12 bytes per file); the generation is
stored in the slot and a different generation (inode reuse) resets the slot. Per slot we keep:

============  ======  =====================================================================
array         type    meaning
============  ======  =====================================================================
dev           u32     kernel dev_t of the filesystem
ino           u64     inode number
gen           u32     inode generation
rscore        u32     read counter (saturating), at aging epoch ``stamp``
wscore        u32     write counter (saturating), at aging epoch ``stamp``
stamp         u32     aging epoch at which rscore/wscore were last normalised
last          i64     last access, CLOCK_MONOTONIC ns
born          i64     first write seen, CLOCK_MONOTONIC ns (0 = none): a deleted file's age (engine.lifetime)
size          i64     file size in bytes (-1 = unknown)
flags         u8      READ / APPEND / OVERWRITE / TOUCHED / LIVE / MEMBER / QUEUED / RESIDENT bits
charged       u32     pages charged to the believed-cached set
============  ======  =====================================================================

Per filesystem we also sum the read and write bytes (``dev_bytes``), for the ``auto`` failure model.

Aging is lazy: time is cut into epochs of one half-life; a counter stamped at epoch ``s`` is worth
``raw >> (epoch - s)`` at epoch ``epoch``. Nothing walks the table to age it.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cachepilot.errors import UserError
from cachepilot.events import Delete, HotnessDelta
from cachepilot.models.inoindex import InoIndex

COUNTER_MAX = 0xFFFFFFFF
PAGE = 4096

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


HOT_DTYPE = np.dtype([("dev", "<u4"), ("ino", "<u8"), ("gen", "<u4"), ("rs", "<u4"), ("ws", "<u4"),
                      ("rb", "<u8"), ("wb", "<u8"), ("last", "<i8"), ("size", "<i8")])
"""HotnessDelta in trace layout (``<IQIIIQQqq``, 56 bytes, packed) as a numpy record."""


def inverse_bitmap_score(nbytes: int) -> int:
    """b = 2^(6 - floor(log2 N)), N = 4 KiB pages in the request clamped to 1..64."""
    if nbytes < 0:
        raise ValueError("negative request size")
    pages = (nbytes + PAGE - 1) // PAGE
    pages = 1 if pages < 1 else 64 if pages > 64 else pages
    return 1 << (6 - (pages.bit_length() - 1))


@dataclass(frozen=True, slots=True)
class FileView:
    """A read-only snapshot of one slot (for humans, tests and `top`; never used on the hot path)."""

    slot: int
    dev: int
    ino: int
    gen: int
    read_score: int
    write_score: int
    score: int
    last_access_ns: int
    size: int
    write_only: bool
    append_only: bool


class MemberOwner(Protocol):
    """Whoever holds a slot's F_MEMBER bit and its charge (models.admission.CachedSet)."""

    def discard(self, slot: int) -> int: ...


class HotnessTable:
    def __init__(self, half_life_s: float = 600.0, start_ns: int = 0) -> None:
        if half_life_s <= 0:
            raise UserError(f"hotness half-life must be positive, got {half_life_s}")
        self.half_life_ns = int(half_life_s * 1e9)
        self.start_ns = start_ns
        self.epoch = 0
        self.now_ns = start_ns
        self.index: dict[int, InoIndex] = {}
        self.dev = array("I")
        self.ino = array("Q")
        self.gen = array("I")
        self.rscore = array("I")
        self.wscore = array("I")
        self.stamp = array("I")
        self.last = array("q")
        self.born = array("q")
        self.size = array("q")
        self.flags = array("B")
        self.charged = array("I")
        self.dev_bytes: dict[int, list[int]] = {}
        self._free: list[int] = []
        self.touched = array("q")  # slots changed since the last drain_touched (each once: F_TOUCHED)
        self.live = 0
        self.owners: dict[int | None, MemberOwner] = {}  # believed-cached sets by dev (None: any dev)

    # ---------------------------------------------------------------- time
    def advance(self, now_ns: int) -> None:
        """Move the clock; aging epochs follow from it (never goes backwards)."""
        if now_ns > self.now_ns:
            self.now_ns = now_ns
            e = (now_ns - self.start_ns) // self.half_life_ns
            if e > self.epoch:
                self.epoch = int(e)

    # ---------------------------------------------------------------- slots
    def _alloc(self, dev: int, ino: int, gen: int) -> int:
        if self._free:
            slot = self._free.pop()
            self.dev[slot] = dev
            self.ino[slot] = ino
            self.gen[slot] = gen
            self.rscore[slot] = 0
            self.wscore[slot] = 0
            self.stamp[slot] = self.epoch
            self.last[slot] = 0
            self.born[slot] = 0
            self.size[slot] = -1
            self.flags[slot] = F_LIVE | (self.flags[slot] & (F_TOUCHED | F_QUEUED))  # may sit in those lists
            self.charged[slot] = 0
        else:
            slot = len(self.flags)
            self.dev.append(dev)
            self.ino.append(ino)
            self.gen.append(gen)
            self.rscore.append(0)
            self.wscore.append(0)
            self.stamp.append(self.epoch)
            self.last.append(0)
            self.born.append(0)
            self.size.append(-1)
            self.flags.append(F_LIVE)
            self.charged.append(0)
        idx = self.index.get(dev)
        if idx is None:
            idx = self.index[dev] = InoIndex()
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
            self.dev.extend(array("I", [dev]) * rest)
            self.ino.frombytes(inos[reuse:].astype(np.uint64).tobytes())
            self.gen.frombytes(gens[reuse:].astype(np.uint32).tobytes())
            zeros = array("I", bytes(4 * rest))
            self.rscore.extend(zeros)
            self.wscore.extend(zeros)
            self.charged.extend(zeros)
            self.stamp.extend(array("I", [self.epoch]) * rest)
            self.last.extend(array("q", bytes(8 * rest)))
            self.born.extend(array("q", bytes(8 * rest)))
            self.size.extend(array("q", [-1]) * rest)
            self.flags.extend(array("B", [F_LIVE]) * rest)
        self.index[dev].update_arrays(inos.astype(np.uint64), slots)
        self.live += k
        return slots

    def _reset_slots(self, slots: np.ndarray, dev: int, inos: np.ndarray, gens: np.ndarray) -> None:
        """Free slots taken by new files (as _alloc does one at a time)."""
        np.frombuffer(self.dev, dtype=np.uint32)[slots] = dev
        np.frombuffer(self.ino, dtype=np.uint64)[slots] = inos
        np.frombuffer(self.gen, dtype=np.uint32)[slots] = gens
        np.frombuffer(self.rscore, dtype=np.uint32)[slots] = 0
        np.frombuffer(self.wscore, dtype=np.uint32)[slots] = 0
        np.frombuffer(self.stamp, dtype=np.uint32)[slots] = self.epoch
        np.frombuffer(self.last, dtype=np.int64)[slots] = 0
        np.frombuffer(self.born, dtype=np.int64)[slots] = 0
        np.frombuffer(self.size, dtype=np.int64)[slots] = -1
        np.frombuffer(self.charged, dtype=np.uint32)[slots] = 0
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

    # ---------------------------------------------------------------- updates
    def register_dev(self, dev: int) -> None:
        """Track files of this filesystem (apply_array(known_only=True) skips the others)."""
        if dev not in self.index:
            self.index[dev] = InoIndex()
            self.dev_bytes[dev] = [0, 0]

    def apply(self, ev: HotnessDelta) -> int:
        k = ev.key
        if ev.read_bytes < 0:
            raise UserError(f"negative hotness delta for dev={k.dev} ino={k.ino}")
        slot = self.update(
            k.dev, k.ino, k.gen, ev.read_score, ev.write_score, ev.write_bytes, ev.last_access_ns, ev.size
        )
        db = self.dev_bytes[k.dev]
        db[0] += ev.read_bytes
        db[1] += ev.write_bytes
        return slot

    def update(
        self, dev: int, ino: int, gen: int, rs: int, ws: int, wbytes: int, last_ns: int, size: int = -1
    ) -> int:
        if rs < 0 or ws < 0 or wbytes < 0:
            raise UserError(f"negative hotness delta for dev={dev} ino={ino}")
        idx = self.index.get(dev)
        slot = None if idx is None else idx.get(ino)
        if slot is None:
            slot = self._alloc(dev, ino, gen)
        elif self.gen[slot] != gen:
            self._reset(slot, gen)
        self._bump(slot, rs, ws, wbytes, last_ns, size)
        return slot

    def _release(self, slot: int) -> None:
        """A member file is gone (deleted, or its inode reused): its believed-cached set gives back the charge."""
        if self.flags[slot] & F_MEMBER:
            owner = self.owners.get(self.dev[slot]) or self.owners.get(None)
            if owner is not None:
                owner.discard(slot)
            self.flags[slot] &= ~F_MEMBER & 0xFF
            self.charged[slot] = 0

    def _reset(self, slot: int, gen: int) -> None:
        """Inode reuse: a new file behind the same inode number starts from nothing."""
        self._release(slot)
        self.gen[slot] = gen
        self.rscore[slot] = 0
        self.wscore[slot] = 0
        self.stamp[slot] = self.epoch
        self.born[slot] = 0
        self.size[slot] = -1
        self.flags[slot] = F_LIVE | (self.flags[slot] & (F_TOUCHED | F_QUEUED))  # may sit in those lists

    def _bump(self, slot: int, rs: int, ws: int, wbytes: int, last_ns: int, size: int) -> None:
        e = self.epoch
        r = self.rscore[slot]
        w = self.wscore[slot]
        st = self.stamp[slot]
        if st != e:
            sh = e - st
            r >>= sh
            w >>= sh
            self.stamp[slot] = e
        r += rs
        w += ws
        self.rscore[slot] = r if r < COUNTER_MAX else COUNTER_MAX
        self.wscore[slot] = w if w < COUNTER_MAX else COUNTER_MAX
        if last_ns > self.last[slot]:
            self.last[slot] = last_ns
        if ws and not self.born[slot]:
            self.born[slot] = max(1, last_ns)
        f = self.flags[slot]
        if rs:
            f |= F_READ
        if ws:
            f &= ~F_RESIDENT & 0xFF
            old = self.size[slot]
            if size >= 0 and old >= 0 and size - old >= wbytes > 0:
                f |= F_APPEND
            elif old >= 0 or size < 0:
                f |= F_OVERWRITE
            # first sighting with a known size: cannot tell yet
        if size >= 0:
            self.size[slot] = size
        if not f & F_TOUCHED:
            f |= F_TOUCHED
            self.touched.append(slot)
        self.flags[slot] = f

    def apply_array(self, rec: np.ndarray, known_only: bool = False) -> int:
        """The hotness rule of :meth:`update`, vectorised, for a numpy structured array of :data:`HOT_DTYPE`
        records (a trace block decoded with ``np.frombuffer``, no per-record tuples); every live path (daemon drain,
        replay, engine feed, simulator) goes through it. Returns records skipped (filesystems never registered, with
        ``known_only``). tests/unit/test_hotness.py holds it to a scalar reference of the same rule."""
        n = len(rec)
        if n == 0:
            return 0
        devs = rec["dev"]
        udevs = np.unique(devs).tolist()
        slots = np.empty(n, dtype=np.int64)
        keep: np.ndarray | None = None
        skipped = 0
        for d in udevs:
            sel = (devs == d) if len(udevs) > 1 else np.ones(n, dtype=bool)
            idx = self.index.get(d)
            if idx is None:
                if known_only:
                    if keep is None:
                        keep = np.ones(n, dtype=bool)
                    keep &= ~sel
                    skipped += int(sel.sum())
                    continue
                self.register_dev(d)
                idx = self.index[d]
            inos_arr = rec["ino"][sel]
            got = idx.lookup_many(inos_arr)
            miss = np.nonzero(got < 0)[0]
            if len(miss):  # new files (the arrays may grow: no numpy views exist yet)
                mi = inos_arr[miss]
                uniq, first = np.unique(mi, return_index=True)  # a file twice: its first record's generation
                made = self._alloc_many(d, uniq, rec["gen"][sel][miss][first])
                got[miss] = made[np.searchsorted(uniq, mi)]
            slots[sel] = got
        if keep is not None:
            rec = rec[keep]
            slots = slots[keep]
            if len(rec) == 0:
                return skipped
        order = np.argsort(slots, kind="stable")
        ss = slots[order]
        dup = np.empty(len(ss), dtype=bool)
        dup[0] = False
        np.not_equal(ss[1:], ss[:-1], out=dup[1:])
        if dup[1:].all():
            self._apply_unique(rec, slots)
        else:  # a file twice in one block: apply its 1st records, then its 2nd ... (exact semantics)
            start = np.maximum.accumulate(np.where(dup, np.arange(len(ss)), 0))
            rank = np.empty(len(ss), dtype=np.int64)
            rank[order] = np.arange(len(ss)) - start
            for r in range(int(rank.max()) + 1):
                m = rank == r
                self._apply_unique(rec[m], slots[m])
        return skipped

    def _apply_unique(self, rec: np.ndarray, slots: np.ndarray) -> None:
        """apply_array's body for records whose slots are all different."""
        u32, i64 = np.uint32, np.int64
        gen = np.frombuffer(self.gen, dtype=u32)
        bad = np.nonzero(gen[slots] != rec["gen"])[0]
        for i in bad.tolist():  # inode reuse: rare
            self._reset(int(slots[i]), int(rec["gen"][i]))
        stamp = np.frombuffer(self.stamp, dtype=u32)
        rsa = np.frombuffer(self.rscore, dtype=u32)
        wsa = np.frombuffer(self.wscore, dtype=u32)
        e = self.epoch
        old = slots[stamp[slots] != e]
        if len(old):
            sh = (e - stamp[old].astype(i64)).clip(0, 63).astype(np.uint64)
            rsa[old] = (rsa[old].astype(np.uint64) >> sh).astype(u32)
            wsa[old] = (wsa[old].astype(np.uint64) >> sh).astype(u32)
            stamp[old] = e
        rs = rec["rs"]
        ws = rec["ws"]
        rsa[slots] = np.minimum(rsa[slots].astype(np.uint64) + rs, COUNTER_MAX).astype(u32)
        wmask = ws > 0
        anyw = bool(wmask.any())
        if anyw:
            wsa[slots] = np.minimum(wsa[slots].astype(np.uint64) + ws, COUNTER_MAX).astype(u32)
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        sizea = np.frombuffer(self.size, dtype=i64)
        f = flags[slots] | np.where(rs > 0, F_READ, 0).astype(np.uint8)
        size = rec["size"]
        if anyw:
            oldsize = sizea[slots]
            wb = rec["wb"].astype(i64)
            app = wmask & (size >= 0) & (oldsize >= 0) & (wb > 0) & (size - oldsize >= wb)
            ovw = wmask & ~app & ((oldsize >= 0) | (size < 0))
            f |= (app * F_APPEND | ovw * F_OVERWRITE).astype(np.uint8)
            f &= np.where(wmask, ~F_RESIDENT & 0xFF, 0xFF).astype(np.uint8)
        known = size >= 0
        sizea[slots[known]] = size[known]
        lasta = np.frombuffer(self.last, dtype=i64)
        lasta[slots] = np.maximum(lasta[slots], rec["last"])
        if anyw:
            borna = np.frombuffer(self.born, dtype=i64)
            fresh = wmask & (borna[slots] == 0)
            borna[slots[fresh]] = np.maximum(rec["last"][fresh], 1)
            del borna
        new = (f & F_TOUCHED) == 0
        self.touched.frombytes(slots[new].astype(np.int64).tobytes())
        flags[slots] = f | F_TOUCHED
        del gen, stamp, rsa, wsa, flags, sizea, lasta  # release the buffers: the arrays may grow again
        db = self.dev_bytes
        rdev = rec["dev"]
        for d in np.unique(rdev).tolist():
            acc = db.get(d)
            if acc is None:
                continue
            m = rdev == d
            acc[0] += int(rec["rb"][m].sum())
            acc[1] += int(rec["wb"][m].sum())

    def forget(self, dev: int, ino: int, gen: int | None = None) -> int | None:
        """Drop a deleted file; returns its former slot (for the admission sets) or None."""
        idx = self.index.get(dev)
        if idx is None:
            return None
        slot = idx.get(ino)
        if slot is None or (gen is not None and gen != 0 and self.gen[slot] != gen):
            return None
        self._forget_slot(idx, ino, slot)
        return slot

    def forget_many(self, dev: int, inos: np.ndarray, gens: np.ndarray) -> list[int]:
        """forget() for a batch of deleted files of one filesystem (gen 0: any generation), in order; returns the
        former slots of those that were tracked. One index lookup for the whole batch."""
        idx = self.index.get(dev)
        if idx is None or not len(inos):
            return []
        slots = idx.lookup_many(inos.astype(np.uint64))
        gen = np.frombuffer(self.gen, dtype=np.uint32) if len(self.gen) else np.zeros(0, dtype=np.uint32)
        found = slots >= 0
        found[found] &= (gens[found] == 0) | (gen[slots[found]] == gens[found])
        del gen  # release the buffer: the array may grow again
        inos, slots = inos[found], slots[found]
        _, first = np.unique(inos, return_index=True)  # the same file twice in a batch: the first delete took it
        first.sort()
        inos, slots = inos[first], slots[first]
        if not len(slots):
            return []
        idx.delete_many(inos)
        out = slots.tolist()
        for slot in out:
            self._clear_slot(slot)
        return out

    def _forget_slot(self, idx: InoIndex, ino: int, slot: int) -> None:
        del idx[ino]
        self._clear_slot(slot)

    def _clear_slot(self, slot: int) -> None:
        """A forgotten file's slot (its index entry gone): out of its believed-cached set, free for a new file."""
        self._release(slot)
        self.flags[slot] &= F_TOUCHED | F_QUEUED  # it may still sit in those lists
        self.charged[slot] = 0
        self.rscore[slot] = 0
        self.wscore[slot] = 0
        self._free.append(slot)
        self.live -= 1

    def delete(self, ev: Delete) -> int | None:
        return self.forget(ev.key.dev, ev.key.ino, ev.key.gen)

    def drain_touched_array(self) -> np.ndarray:
        """Slots changed since the last call (live ones only, int64, in order of first change); clears the marks."""
        out = np.frombuffer(self.touched, dtype=np.int64).copy()
        self.touched = array("q")
        if not len(out):
            return out
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        f = flags[out]
        flags[out] = f & (~F_TOUCHED & 0xFF)
        del flags  # release the buffer: the array may grow again
        return out[(f & F_LIVE) != 0]

    def drain_touched(self) -> list[int]:
        return self.drain_touched_array().tolist()

    # ---------------------------------------------------------------- reads
    def score(self, slot: int) -> int:
        """Effective (aged) counter: read + write, saturating."""
        sh = self.epoch - self.stamp[slot]
        s = (self.rscore[slot] >> sh) + (self.wscore[slot] >> sh)
        return s if s < COUNTER_MAX else COUNTER_MAX

    def read_score(self, slot: int) -> int:
        return self.rscore[slot] >> (self.epoch - self.stamp[slot])

    def write_only(self, slot: int) -> bool:
        return not self.flags[slot] & F_READ

    def append_only(self, slot: int) -> bool:
        f = self.flags[slot]
        return bool(f & F_APPEND) and not f & F_OVERWRITE

    def sieve_mask(self, slots: np.ndarray, sieve_size: int) -> np.ndarray:
        """The sieve, for many slots at once (the engine's path): True where a file may be promoted — its size is
        known and within ``sieve_size``, it was read, and it is not append-only. :meth:`sieve` is the same rule one
        slot at a time, with the reason (the tests hold the two equal)."""
        f = np.frombuffer(self.flags, dtype=np.uint8)[slots]
        size = np.frombuffer(self.size, dtype=np.int64)[slots]
        append_only = (f & (F_APPEND | F_OVERWRITE)) == F_APPEND
        return (size >= 0) & (size <= sieve_size) & ((f & F_READ) != 0) & ~append_only

    def sieve(self, slot: int, sieve_size: int) -> str | None:
        """Why a file may not be promoted, or None if it may."""
        size = self.size[slot]
        if size < 0:
            return "size unknown"
        if size > sieve_size:
            return f"larger than sieve ({size} > {sieve_size} bytes)"
        f = self.flags[slot]
        if not f & F_READ:
            return "write-only"
        if f & F_APPEND and not f & F_OVERWRITE:
            return "append-only"
        return None

    def view(self, slot: int) -> FileView:
        return FileView(
            slot=slot,
            dev=self.dev[slot],
            ino=self.ino[slot],
            gen=self.gen[slot],
            read_score=self.read_score(slot),
            write_score=self.wscore[slot] >> (self.epoch - self.stamp[slot]),
            score=self.score(slot),
            last_access_ns=self.last[slot],
            size=self.size[slot],
            write_only=self.write_only(slot),
            append_only=self.append_only(slot),
        )

    def _live_slots(self, dev: int | None) -> Iterator[int]:
        if dev is None:
            for idx in self.index.values():
                yield from idx.values()
        else:
            one = self.index.get(dev)
            if one is not None:
                yield from one.values()

    def hottest(self, k: int, dev: int | None = None) -> list[int]:
        """Highest counter first; most recent access wins ties. O(n log k) scan: for queries, not ticks."""
        score, last = self.score, self.last
        return heapq.nlargest(k, self._live_slots(dev), key=lambda s: (score(s), last[s]))

    def coldest(self, k: int, dev: int | None = None) -> list[int]:
        """Lowest counter first; least recent access wins ties."""
        score, last = self.score, self.last
        return heapq.nsmallest(k, self._live_slots(dev), key=lambda s: (score(s), last[s]))

    def memory_bytes(self) -> int:
        """Bytes held by the parallel arrays and the sorted part of the indexes."""
        arrays = (self.dev, self.ino, self.gen, self.rscore, self.wscore, self.stamp, self.last, self.born,
                  self.size, self.flags, self.charged)
        return (sum(a.buffer_info()[1] * a.itemsize for a in arrays)
                + sum(i.memory_bytes() for i in self.index.values()))
