"""Per-file hotness: Loris' inverse-bitmap counters, kept in parallel arrays.

One *slot* per tracked file, in the parallel arrays of :class:`~cachepilot.models.slots.SlotArrays` (the storage;
its per-slot fields are listed there); the generation is stored in the slot and a different generation (inode reuse)
resets the slot.

Aging is lazy: time is cut into epochs of one half-life; a counter stamped at epoch ``s`` is worth
``raw >> (epoch - s)`` at epoch ``epoch``. Nothing walks the table to age it.
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cachepilot.errors import UserError
from cachepilot.events import Delete, HotnessDelta
from cachepilot.models.inoindex import InoIndex
from cachepilot.models.slots import F_APPEND as F_APPEND
from cachepilot.models.slots import F_LIVE as F_LIVE
from cachepilot.models.slots import F_MEMBER as F_MEMBER
from cachepilot.models.slots import F_OVERWRITE as F_OVERWRITE
from cachepilot.models.slots import F_QUEUED as F_QUEUED
from cachepilot.models.slots import F_READ as F_READ
from cachepilot.models.slots import F_RESIDENT as F_RESIDENT
from cachepilot.models.slots import F_TOUCHED as F_TOUCHED
from cachepilot.models.slots import SlotArrays

COUNTER_MAX = 0xFFFFFFFF
RBYTES_MAX = 1 << 62  # read bytes saturate here (a u64 sum must never wrap)
PAGE = 4096



HOT_DTYPE = np.dtype([("dev", "<u4"), ("ino", "<u8"), ("gen", "<u4"), ("rs", "<u4"), ("ws", "<u4"),
                      ("rb", "<u8"), ("wb", "<u8"), ("last", "<i8"), ("size", "<i8")])
"""HotnessDelta in trace layout (``<IQIIIQQqq``, 56 bytes, packed) as a numpy record."""
DELETE_DTYPE = np.dtype([("dev", "<u4"), ("ino", "<u8"), ("gen", "<u4"), ("size", "<i8"), ("ts_ns", "<i8")])
"""Deletes in bulk (a Delete's trace record: dev, ino, gen, size, ts_ns): the probe's drain of its in-kernel map
and the engine's batch take them as one array, no object per file."""


def deletes_array(recs: list[tuple[int, ...]]) -> np.ndarray:
    """Delete records (dev, ino, gen, size, ts_ns) as a DELETE_DTYPE array, in order."""
    return np.array([tuple(r[:5]) for r in recs], dtype=DELETE_DTYPE)


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


class HotnessTable(SlotArrays):
    """The hotness rule and its lazy ageing over the slot storage: counters bumped (one record at a time or
    vectorised), files forgotten, slots touched since the last tick handed to admission, scores read back."""

    def __init__(self, half_life_s: float = 600.0, start_ns: int = 0) -> None:
        if half_life_s <= 0:
            raise UserError(f"hotness half-life must be positive, got {half_life_s}")
        super().__init__(start_ns)
        self.half_life_ns = int(half_life_s * 1e9)
        self.start_ns = start_ns
        self.now_ns = start_ns
        self.touched = array("q")  # slots changed since the last drain_touched (each once: F_TOUCHED)
        self.owners: dict[int | None, MemberOwner] = {}  # believed-cached sets by dev (None: any dev)

    # ---------------------------------------------------------------- time
    def advance(self, now_ns: int) -> None:
        """Move the clock; aging epochs follow from it (never goes backwards)."""
        if now_ns > self.now_ns:
            self.now_ns = now_ns
            e = (now_ns - self.start_ns) // self.half_life_ns
            if e > self.epoch:
                self.epoch = int(e)
                self._sweep()
            self.last.rebase(now_ns)  # every ~25 days: the u32 millisecond columns keep their range
            self.born.rebase(now_ns)

    def _sweep(self) -> None:
        """Slots whose counters aged to nothing are zeroed and stamped now (the one-byte epochs stay exact:
        models.columns.Epoch8); what they read is what lazy ageing would read."""
        gone = self.stamp.sweep(self.epoch)
        if len(gone):
            np.frombuffer(self.rscore, dtype=np.uint32)[gone] = 0
            np.frombuffer(self.wscore, dtype=np.uint32)[gone] = 0
            self.rbytes.put(gone, 0)
            self.stamp.put(gone, self.epoch)

    # ---------------------------------------------------------------- updates
    def apply(self, ev: HotnessDelta) -> int:
        k = ev.key
        if ev.read_bytes < 0:
            raise UserError(f"negative hotness delta for dev={k.dev} ino={k.ino}")
        slot = self.update(
            k.dev, k.ino, k.gen, ev.read_score, ev.write_score, ev.write_bytes, ev.last_access_ns, ev.size,
            ev.read_bytes
        )
        db = self.dev_bytes[k.dev]
        db[0] += ev.read_bytes
        db[1] += ev.write_bytes
        return slot

    def update(
        self, dev: int, ino: int, gen: int, rs: int, ws: int, wbytes: int, last_ns: int, size: int = -1,
        rbytes: int = 0
    ) -> int:
        if rs < 0 or ws < 0 or wbytes < 0 or rbytes < 0:
            raise UserError(f"negative hotness delta for dev={dev} ino={ino}")
        idx = self.index.get(dev)
        slot = None if idx is None else idx.get(ino)
        if slot is None:
            slot = self._alloc(dev, ino, gen)
        elif self.gen[slot] != gen:
            self._reset(slot, gen)
        self._bump(slot, rs, ws, wbytes, last_ns, size)
        if rbytes:
            self.rbytes[slot] = min(self.rbytes[slot] + rbytes, RBYTES_MAX)  # _bump aged it to this epoch
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
        self.rbytes[slot] = 0
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
            self.rbytes[slot] >>= min(sh, 63)
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
        order = slots.argsort(kind="stable")
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
        rsa = np.frombuffer(self.rscore, dtype=u32)
        wsa = np.frombuffer(self.wscore, dtype=u32)
        rba = self.rbytes.take(slots)  # u64
        e = self.epoch
        st = self.stamp.take(slots)
        aged = st != e
        old = slots[aged]
        if len(old):
            sh = np.minimum(np.maximum(e - st[aged], 0), 63).astype(np.uint64)
            rsa[old] = (rsa[old].astype(np.uint64) >> sh).astype(u32)
            wsa[old] = (wsa[old].astype(np.uint64) >> sh).astype(u32)
            rba[aged] >>= sh
            self.stamp.put(old, e)
        rs = rec["rs"]
        ws = rec["ws"]
        rsa[slots] = np.minimum(rsa[slots].astype(np.uint64) + rs, COUNTER_MAX).astype(u32)
        self.rbytes.put(slots, np.minimum(rba, np.uint64(RBYTES_MAX) - rec["rb"]) + rec["rb"])  # saturating
        wmask = ws > 0
        anyw = bool(wmask.any())
        if anyw:
            wsa[slots] = np.minimum(wsa[slots].astype(np.uint64) + ws, COUNTER_MAX).astype(u32)
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        f = flags[slots] | np.where(rs > 0, F_READ, 0).astype(np.uint8)
        size = rec["size"]
        if anyw:
            oldsize = self.size.take(slots)
            wb = rec["wb"].astype(i64)
            app = wmask & (size >= 0) & (oldsize >= 0) & (wb > 0) & (size - oldsize >= wb)
            ovw = wmask & ~app & ((oldsize >= 0) | (size < 0))
            f |= (app * F_APPEND | ovw * F_OVERWRITE).astype(np.uint8)
            f &= np.where(wmask, ~F_RESIDENT & 0xFF, 0xFF).astype(np.uint8)
        known = size >= 0
        self.size.put(slots[known], size[known])
        self.last.put(slots, np.maximum(self.last.take(slots), rec["last"]))
        if anyw:
            fresh = wmask & (self.born.take(slots) == 0)
            self.born.put(slots[fresh], np.maximum(rec["last"][fresh], 1))
        new = (f & F_TOUCHED) == 0
        self.touched.frombytes(slots[new].astype(np.int64).tobytes())
        flags[slots] = f | F_TOUCHED
        del gen, rsa, wsa, flags  # release the buffers: the arrays may grow again
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

    def forget_many(self, dev: int, inos: np.ndarray, gens: np.ndarray, slots: np.ndarray | None = None) -> list[int]:
        """forget() for a batch of deleted files of one filesystem (gen 0: any generation), in order; returns the
        former slots of those that were tracked. One index lookup for the whole batch (``slots``: its result, when
        the caller made it)."""
        idx = self.index.get(dev)
        if idx is None or not len(inos):
            return []
        if slots is None:
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
        self.rbytes[slot] = 0
        self._free.append(slot)
        self.live -= 1

    def delete(self, ev: Delete) -> int | None:
        return self.forget(ev.key.dev, ev.key.ino, ev.key.gen)

    def drain_touched_array(self) -> np.ndarray:
        """Slots changed since the last call (live ones only, int64, in order of first change); clears the marks."""
        out = np.frombuffer(self.touched, dtype=np.int64)  # the old array is out's alone now: no copy (8 MiB when
        self.touched = array("q")  # a million files were touched, issue 32)
        if not len(out):
            return out
        flags = np.frombuffer(self.flags, dtype=np.uint8)
        f = flags[out]
        flags[out] = f & (~F_TOUCHED & 0xFF)
        del flags  # release the buffer: the array may grow again
        live = (f & F_LIVE) != 0
        return out if live.all() else out[live]

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

    def sieve_mask(self, slots: np.ndarray, sieve_size: int, large_max: int = 0, min_reads: float = 0.0) -> np.ndarray:
        """The sieve, for many slots at once (the engine's path): True where a file may be promoted — it was read, it
        is not append-only, and its size is known and in a size class: at most ``sieve_size`` (the small files), or,
        where ``large_max`` is above that (the large-file class is on), at most ``large_max`` and read whole at
        least ``min_reads`` times below the page cache (its aged read bytes). :meth:`sieve` is the same rule one slot
        at a time, with the reason (the tests hold the two equal)."""
        f = np.frombuffer(self.flags, dtype=np.uint8)[slots]
        size = self.size.take(slots)
        append_only = (f & (F_APPEND | F_OVERWRITE)) == F_APPEND
        sized = (size >= 0) & (size <= sieve_size)
        if large_max > sieve_size:
            rb = self.rbytes.take(slots).astype(np.float64)
            sized |= (size > sieve_size) & (size <= large_max) & (rb >= min_reads * size)
        return sized & ((f & F_READ) != 0) & ~append_only

    def sieve(self, slot: int, sieve_size: int, large_max: int = 0, min_reads: float = 0.0) -> str | None:
        """Why a file may not be promoted, or None if it may."""
        size = self.size[slot]
        if size < 0:
            return "size unknown"
        if size > sieve_size and large_max <= sieve_size:
            return f"larger than sieve ({size} > {sieve_size} bytes)"
        if size > large_max > sieve_size:
            return f"larger than the large-file class ({size} > {large_max} bytes)"
        if size > sieve_size and self.rbytes[slot] < min_reads * size:
            return f"large file read whole {self.whole_reads(slot):.1f} times, not {min_reads:g}"
        f = self.flags[slot]
        if not f & F_READ:
            return "write-only"
        if f & F_APPEND and not f & F_OVERWRITE:
            return "append-only"
        return None

    def whole_reads(self, slot: int) -> float:
        """How many times the file was read whole below the page cache (its aged read bytes over its size)."""
        size = self.size[slot]
        return self.rbytes[slot] / size if size > 0 else 0.0

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

    def hottest(self, k: int, dev: int | None = None) -> list[int]:
        """Highest counter first; most recent access wins ties. O(n log k) scan: for queries, not ticks."""
        score, last = self.score, self.last
        return heapq.nlargest(k, self._live_slots(dev), key=lambda s: (score(s), last[s]))

    def coldest(self, k: int, dev: int | None = None) -> list[int]:
        """Lowest counter first; least recent access wins ties."""
        score, last = self.score, self.last
        return heapq.nsmallest(k, self._live_slots(dev), key=lambda s: (score(s), last[s]))
