"""inode number -> slot for one filesystem, in about 8 bytes per file (12 once an inode number needs 64 bits).

A Python dict costs ~100 bytes per entry once its int keys and values are counted; a million tracked
files cannot afford that. Here the map is sorted numpy runs (``keys`` u64, ``vals`` i32; a deleted entry
keeps its key with value -1 until the next merge): the main run, and a young run that batches of new files
go into (a merge of the batch with the young run only). Single inserts wait in a small dict. When the young
run and the dict grow past 1/8 of the main run, everything is merged into it. Batches are looked up with one
``searchsorted`` per run, the queries sorted first (numpy then narrows each search from the previous one:
twice as fast on a large run); single lookups are a dict probe plus a binary search per run. The keys are u32 while
every inode number fits (ext4's always do: 4 MiB less per million files) and turn u64 for good at the first that
does not (XFS inode64, btrfs); a query that does not fit u32 keys is simply not found in them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

MERGE_MIN = 4096
U32_MAX = 0xFFFFFFFF
_NO_KEYS = np.empty(0, dtype=np.uint32)
_NO_VALS = np.empty(0, dtype=np.int32)


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
    def __init__(self) -> None:
        self.keys = _NO_KEYS
        self.vals = _NO_VALS
        self.ykeys = _NO_KEYS  # the young run
        self.yvals = _NO_VALS
        self.recent: dict[int, int] = {}
        self.n = 0
        self.dead = 0  # tombstones in both runs
        self.wide = False  # u64 keys (an inode number past 2^32 was inserted)

    def _fit(self, inos: np.ndarray) -> np.ndarray:
        """inos as keys of this index, widening the runs to u64 first if one needs it."""
        if not self.wide and len(inos) and int(inos.max()) > U32_MAX:
            self.wide = True
            self.keys, self.ykeys = self.keys.astype(np.uint64), self.ykeys.astype(np.uint64)
        return inos.astype(np.uint64 if self.wide else np.uint32)

    # ------------------------------------------------------------ single
    def _runs(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        return (self.keys, self.vals), (self.ykeys, self.yvals)

    def _locate(self, ino: int) -> tuple[np.ndarray, int]:
        """(the run's values, index) of ino's entry: the live one if any (an inode number may have a tombstone in
        the main run and a live entry in the young one), else a tombstone; index -1 if in no run."""
        dead: tuple[np.ndarray, int] = (self.vals, -1)
        for keys, vals in self._runs():
            i = _pos(keys, ino)
            if i >= 0:
                if vals[i] >= 0:
                    return vals, i
                dead = (vals, i)
        return dead

    def get(self, ino: int, default: int | None = None) -> int | None:
        v = self.recent.get(ino)
        if v is not None:
            return v
        vals, i = self._locate(ino)
        if i >= 0:
            v = int(vals[i])
            if v >= 0:
                return v
        return default

    def __getitem__(self, ino: int) -> int:
        v = self.get(ino)
        if v is None:
            raise KeyError(ino)
        return v

    def __contains__(self, ino: object) -> bool:
        return isinstance(ino, int) and self.get(ino) is not None

    def __setitem__(self, ino: int, slot: int) -> None:
        if ino in self.recent:
            self.recent[ino] = slot
            return
        vals, i = self._locate(ino)
        if i >= 0:
            if vals[i] < 0:
                self.n += 1
                self.dead -= 1
            vals[i] = slot
            return
        self.recent[ino] = slot
        self.n += 1
        self._maybe_merge()

    def __delitem__(self, ino: int) -> None:
        if self.recent.pop(ino, None) is not None:
            self.n -= 1
            return
        vals, i = self._locate(ino)
        if i < 0 or vals[i] < 0:
            raise KeyError(ino)
        vals[i] = -1
        self.n -= 1
        self.dead += 1
        self._maybe_merge()

    # ------------------------------------------------------------ batch
    def update(self, new: Mapping[int, int]) -> None:
        """Insert many (ino -> slot) that are not live in the index."""
        if new:
            self.update_arrays(np.fromiter(new.keys(), dtype=np.uint64, count=len(new)),
                               np.fromiter(new.values(), dtype=np.int32, count=len(new)))

    def update_arrays(self, inos: np.ndarray, slots: np.ndarray) -> None:
        """update() for distinct inode numbers (u64) and their slots as arrays."""
        slots = slots.astype(np.int32)
        order = inos.argsort(kind="stable")
        inos, slots = self._fit(inos[order]), slots[order]
        # a tombstone of an earlier file with the same inode number in the young run is revived in place (a run
        # holds a key once); one in the main run stays until the next merge (searching the main run per batch
        # cost as much as the lookups themselves), the live entry in the young run wins (_locate, lookup_many)
        pos, found = _search(self.ykeys, inos)
        rest = ~found
        if found.any():
            self.yvals[pos[found]] = slots[found]
            self.dead -= int(found.sum())
        self.n += len(inos)
        if rest.any():  # into the young run: both sorted, so an insertion, not a sort
            at = self.ykeys.searchsorted(inos[rest])
            self.ykeys = np.insert(self.ykeys, at, inos[rest])
            self.yvals = np.insert(self.yvals, at, slots[rest])
        self._maybe_merge()

    def delete_many(self, inos: np.ndarray) -> None:
        """del self[ino] for distinct inode numbers that are all live in the index (one search per run)."""
        inos = np.sort(inos)
        rest = np.ones(len(inos), dtype=bool)
        for keys, vals in self._runs():
            pos, found = _search(keys, inos)
            found &= rest
            found[found] &= vals[pos[found]] >= 0
            vals[pos[found]] = -1
            self.dead += int(found.sum())
            rest &= ~found
        for ino in inos[rest].tolist():
            del self.recent[ino]
        self.n -= len(inos)
        self._maybe_merge()

    def lookup_many(self, inos: np.ndarray) -> np.ndarray:
        """Slots for an array of inode numbers (u64); -1 where unknown."""
        order = inos.argsort(kind="stable")
        sq = inos[order]
        found_sorted = np.full(len(inos), -1, dtype=np.int64)
        for keys, vals in self._runs():
            if len(keys):
                pos, found = _search(keys, sq)
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
        big = max(MERGE_MIN, len(self.keys) >> 3)
        if len(self.ykeys) + len(self.recent) > big or (self.dead > MERGE_MIN and self.dead * 4 > len(self.keys)):
            self._merge()

    def _merge(self) -> None:
        live, ylive = self.vals >= 0, self.yvals >= 0
        rk = self._fit(np.fromiter(self.recent.keys(), dtype=np.uint64, count=len(self.recent)))
        rv = np.fromiter(self.recent.values(), dtype=np.int32, count=len(self.recent))
        keys = np.concatenate([self.keys[live], self.ykeys[ylive], rk])
        vals = np.concatenate([self.vals[live], self.yvals[ylive], rv])
        order = keys.argsort(kind="stable")
        self.keys = keys[order]
        self.vals = vals[order]
        self.ykeys, self.yvals = np.empty(0, dtype=self.keys.dtype), _NO_VALS
        self.recent = {}
        self.dead = 0

    # ------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.n

    def items(self) -> Iterator[tuple[int, int]]:
        for keys, vals in self._runs():
            live = vals >= 0
            yield from zip(keys[live].tolist(), vals[live].tolist(), strict=True)
        yield from self.recent.items()

    def __iter__(self) -> Iterator[int]:
        return (k for k, _ in self.items())

    def slots(self) -> np.ndarray:
        """Every live value (slot), in no particular order, as int64."""
        rv = np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))
        return np.concatenate([self.vals[self.vals >= 0], self.yvals[self.yvals >= 0], rv]).astype(np.int64)

    def values(self) -> Iterator[int]:
        return (v for _, v in self.items())

    def memory_bytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes + self.ykeys.nbytes + self.yvals.nbytes
