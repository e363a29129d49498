"""inode number -> slot for one filesystem, in about 4 bytes per file (8 in the young run, below).

A Python dict costs ~100 bytes per entry once its int keys and values are counted; a million tracked files cannot
afford that. Here the map is numpy runs sorted by inode number: the main run holds only the *slots* (i32), and reads
each one's inode number from the hotness table's own ``ino`` column (``keys_of``: a view of it, taken per call --
the column may grow between calls), so the key is not stored twice (4 MiB less per million files, issue 32). The
young run, which batches of new files go into (a merge of the batch with the young run only), keeps its keys (u32
while every inode number fits, u64 for good at the first that does not: XFS inode64, btrfs) and values (i32); a
deleted entry there keeps its key with value -1 until the next merge. Single inserts wait in a small dict. When the
young run and the dict grow past 1/8 of the main run, everything is merged into it.

A slot's inode number is its key only while the slot is live in this index: a freed slot is given to the next new
file, of any filesystem. So a delete takes an entry out of the main run at once (a copy of the run, O(files); the
daemon deletes in batches, one copy a batch) where the young run keeps a tombstone. Batches are looked up with one
``searchsorted`` per run (the main run's keys gathered from the column first), the queries sorted first (numpy
then narrows each search from the previous one); single lookups are a dict probe plus a binary search per run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

MERGE_MIN = 4096
# A batch of few queries searches the main run one query at a time (a binary search reading the column at each step:
# ~9 us a query natively) instead of gathering the whole run's keys from the column (~3.5 ns a file): below one query
# per this many files the searches cost less. The daemon's tick looks up a handful of deletes in a run of tens of
# thousands of files; each gather was a pass over the whole column, three a tick (issue 32).
FILES_PER_QUERY = 2048
U32_MAX = 0xFFFFFFFF
_NO_KEYS = np.empty(0, dtype=np.uint32)
_NO_VALS = np.empty(0, dtype=np.int32)

KeysOf = Callable[[], np.ndarray]  # the table's ino column as a numpy view (u32 or u64), indexed by slot


def _pos(keys: np.ndarray, ino: int) -> int:
    """Index of ino in the sorted run, or -1."""
    if len(keys) == 0 or ino < 0 or ino > (U32_MAX if keys.dtype == np.uint32 else 0xFFFFFFFFFFFFFFFF):
        return -1
    i = int(keys.searchsorted(keys.dtype.type(ino)))  # a Python int would convert the whole array
    if i < len(keys) and int(keys[i]) == ino:
        return i
    return -1


def _search(keys: np.ndarray, sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, found) of each of the sorted queries sq (u64) in the sorted run keys (u32 or u64)."""
    if len(keys) == 0:
        return np.zeros(len(sq), dtype=np.int64), np.zeros(len(sq), dtype=bool)
    fits = None
    if keys.dtype == np.uint32 and sq.dtype != np.uint32:
        if len(sq) and int(sq[-1]) > U32_MAX:  # sorted: the last is the largest
            fits = sq <= U32_MAX
            sq = np.where(fits, sq, 0)
        sq = sq.astype(np.uint32)
    pos = keys.searchsorted(sq)
    np.minimum(pos, len(keys) - 1, out=pos)  # searchsorted gives 0..len: only the end to clip
    found = keys[pos] == sq
    if fits is not None:
        found &= fits
    return pos, found


class InoIndex:
    def __init__(self, keys_of: KeysOf) -> None:
        self.keys_of = keys_of
        self.vals = _NO_VALS  # the main run: slots, sorted by their inode numbers (every one live)
        self.ykeys = _NO_KEYS  # the young run
        self.yvals = _NO_VALS
        self.recent: dict[int, int] = {}
        self.n = 0
        self.wide = False  # u64 keys in the young run (an inode number past 2^32 was inserted)

    def _main_search(self, sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """_search(self.main_keys(), sq) where found (a position where not found is 0 here, which no caller reads),
        without the gather when there are few queries (FILES_PER_QUERY)."""
        if len(sq) * FILES_PER_QUERY < len(self.vals):
            pos = np.fromiter((self._main_pos(x) for x in sq.tolist()), dtype=np.int64, count=len(sq))
            found = pos >= 0
            return np.maximum(pos, 0), found
        return _search(self.main_keys(), sq)

    def main_keys(self) -> np.ndarray:
        """The main run's inode numbers (a copy, gathered from the column)."""
        if not len(self.vals):
            return _NO_KEYS
        return self.keys_of()[self.vals]

    def _fit(self, inos: np.ndarray) -> np.ndarray:
        """inos as keys of the young run, widening it to u64 first if one needs it."""
        if not self.wide and len(inos) and int(inos.max()) > U32_MAX:
            self.wide = True
            self.ykeys = self.ykeys.astype(np.uint64)
        return inos.astype(np.uint64 if self.wide else np.uint32)

    # ------------------------------------------------------------ single
    def _main_pos(self, ino: int) -> int:
        """Index of ino in the main run, or -1: a binary search reading the column at each step."""
        vals = self.vals
        if not len(vals) or ino < 0:
            return -1
        col = self.keys_of()
        lo, hi = 0, len(vals)
        while lo < hi:
            mid = (lo + hi) >> 1
            if int(col[vals[mid]]) < ino:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(vals) and int(col[vals[lo]]) == ino else -1

    def get(self, ino: int, default: int | None = None) -> int | None:
        v = self.recent.get(ino)
        if v is not None:
            return v
        i = _pos(self.ykeys, ino)
        if i >= 0 and self.yvals[i] >= 0:
            return int(self.yvals[i])
        i = self._main_pos(ino)
        return int(self.vals[i]) if i >= 0 else default

    def __getitem__(self, ino: int) -> int:
        v = self.get(ino)
        if v is None:
            raise KeyError(ino)
        return v

    def __contains__(self, ino: object) -> bool:
        return isinstance(ino, int) and self.get(ino) is not None

    def __setitem__(self, ino: int, slot: int) -> None:
        """ino -> slot; the column must already hold ino at ``slot`` (the table writes it before)."""
        if ino in self.recent:
            self.recent[ino] = slot
            return
        i = _pos(self.ykeys, ino)
        if i >= 0:
            if self.yvals[i] < 0:
                self.n += 1
            self.yvals[i] = slot
            return
        i = self._main_pos(ino)
        if i >= 0:
            self.vals[i] = slot
            return
        self.recent[ino] = slot
        self.n += 1
        self._maybe_merge()

    def __delitem__(self, ino: int) -> None:
        if self.recent.pop(ino, None) is not None:
            self.n -= 1
            return
        i = _pos(self.ykeys, ino)
        if i >= 0 and self.yvals[i] >= 0:
            self.yvals[i] = -1
        else:
            i = self._main_pos(ino)
            if i < 0:
                raise KeyError(ino)
            self.vals = np.delete(self.vals, i)
        self.n -= 1
        self._maybe_merge()

    # ------------------------------------------------------------ batch
    def update(self, new: Mapping[int, int]) -> None:
        """Insert many (ino -> slot) that are not live in the index."""
        if new:
            self.update_arrays(np.fromiter(new.keys(), dtype=np.uint64, count=len(new)),
                               np.fromiter(new.values(), dtype=np.int32, count=len(new)))

    def update_arrays(self, inos: np.ndarray, slots: np.ndarray) -> None:
        """update() for distinct inode numbers (u64) that are not live in the index, and their slots, as arrays."""
        slots = slots.astype(np.int32)
        order = inos.argsort(kind="stable")
        inos, slots = self._fit(inos[order]), slots[order]
        # a tombstone of an earlier file with the same inode number in the young run is revived in place (a run
        # holds a key once); the main run holds none
        pos, found = _search(self.ykeys, inos)
        rest = ~found
        if found.any():
            self.yvals[pos[found]] = slots[found]
        self.n += len(inos)
        if rest.any():  # into the young run: both sorted, so an insertion, not a sort
            at = self.ykeys.searchsorted(inos[rest])
            self.ykeys = np.insert(self.ykeys, at, inos[rest])
            self.yvals = np.insert(self.yvals, at, slots[rest])
        self._maybe_merge()

    def delete_many(self, inos: np.ndarray) -> None:
        """del self[ino] for distinct inode numbers that are all live in the index (one search per run; the main
        run's entries taken out in one copy)."""
        inos = np.sort(inos)
        pos, found = _search(self.ykeys, inos)
        found[found] &= self.yvals[pos[found]] >= 0
        self.yvals[pos[found]] = -1
        rest = ~found
        if len(self.vals) and rest.any():
            mpos, mfound = self._main_search(inos)
            mfound &= rest
            if mfound.any():
                self.vals = np.delete(self.vals, mpos[mfound])
            rest &= ~mfound
        for ino in inos[rest].tolist():
            del self.recent[ino]
        self.n -= len(inos)
        self._maybe_merge()

    def lookup_many(self, inos: np.ndarray) -> np.ndarray:
        """Slots for an array of inode numbers (u64); -1 where unknown."""
        order = inos.argsort(kind="stable")
        sq = inos[order]
        found_sorted = np.full(len(inos), -1, dtype=np.int64)
        for main, vals in ((True, self.vals), (False, self.yvals)):
            if len(vals):
                pos, found = self._main_search(sq) if main else _search(self.ykeys, sq)
                # an inode is live in one run at most; a tombstone (-1) never hides a live entry
                found_sorted[found] = np.maximum(found_sorted[found], vals[pos[found]])
        out = np.empty(len(inos), dtype=np.int64)
        out[order] = found_sorted
        if self.recent:
            left = np.nonzero(out < 0)[0]
            if len(left):
                get = self.recent.get
                out[left] = [get(x, -1) for x in inos[left].tolist()]
        return out

    # ------------------------------------------------------------ merging
    def _maybe_merge(self) -> None:
        """Merge once the young run (its tombstones included) and the dict pass 1/8 of the main run."""
        if len(self.ykeys) + len(self.recent) > max(MERGE_MIN, len(self.vals) >> 3):
            self._merge()

    def _merge(self) -> None:
        ylive = self.yvals >= 0
        rk = self._fit(np.fromiter(self.recent.keys(), dtype=np.uint64, count=len(self.recent)))
        rv = np.fromiter(self.recent.values(), dtype=np.int32, count=len(self.recent))
        mk, yk = self.main_keys(), self.ykeys[ylive]
        kd = np.result_type(mk.dtype, yk.dtype, rk.dtype)  # u32 unless an inode number needs more
        keys = np.concatenate([mk.astype(kd), yk.astype(kd), rk.astype(kd)])
        vals = np.concatenate([self.vals, self.yvals[ylive], rv])
        self.vals = vals[keys.argsort(kind="stable")]
        self.ykeys, self.yvals = np.empty(0, dtype=np.uint64 if self.wide else np.uint32), _NO_VALS
        self.recent = {}

    # ------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.n

    def items(self) -> Iterator[tuple[int, int]]:
        yield from zip(self.main_keys().tolist(), self.vals.tolist(), strict=True)
        live = self.yvals >= 0
        yield from zip(self.ykeys[live].tolist(), self.yvals[live].tolist(), strict=True)
        yield from self.recent.items()

    def __iter__(self) -> Iterator[int]:
        return (k for k, _ in self.items())

    def slots(self) -> np.ndarray:
        """Every live value (slot), in no particular order, as int64."""
        rv = np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))
        return np.concatenate([self.vals, self.yvals[self.yvals >= 0], rv]).astype(np.int64)

    def values(self) -> Iterator[int]:
        return (v for _, v in self.items())

    def memory_bytes(self) -> int:
        return self.vals.nbytes + self.ykeys.nbytes + self.yvals.nbytes
