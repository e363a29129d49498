"""inode number -> slot for one filesystem, in about 12 bytes per file.

A Python dict costs ~100 bytes per entry once its int keys and values are counted; a million tracked
files cannot afford that. Here the bulk of the map is two sorted numpy arrays (``keys`` u64, ``vals``
i32; a deleted entry keeps its key with value -1 until the next merge) and recent inserts wait in a small
dict that is merged into the arrays when it grows past 1/8 of them. Batches are looked up with one
``searchsorted``; single lookups are a dict probe plus a binary search.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

MERGE_MIN = 4096


class InoIndex:
    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.uint64)
        self.vals = np.empty(0, dtype=np.int32)
        self.recent: dict[int, int] = {}
        self.n = 0
        self.dead = 0

    # ------------------------------------------------------------ single
    def _pos(self, ino: int) -> int:
        keys = self.keys
        if len(keys) == 0 or ino < 0 or ino > 0xFFFFFFFFFFFFFFFF:
            return -1
        i = int(keys.searchsorted(np.uint64(ino)))  # a Python int would convert the whole array
        if i < len(keys) and int(keys[i]) == ino:
            return i
        return -1

    def get(self, ino: int, default: int | None = None) -> int | None:
        v = self.recent.get(ino)
        if v is not None:
            return v
        i = self._pos(ino)
        if i >= 0:
            v = int(self.vals[i])
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
        i = self._pos(ino)
        if i >= 0:
            if self.vals[i] < 0:
                self.n += 1
                self.dead -= 1
            self.vals[i] = slot
            return
        self.recent[ino] = slot
        self.n += 1
        self._maybe_merge()

    def __delitem__(self, ino: int) -> None:
        if self.recent.pop(ino, None) is not None:
            self.n -= 1
            return
        i = self._pos(ino)
        if i < 0 or self.vals[i] < 0:
            raise KeyError(ino)
        self.vals[i] = -1
        self.n -= 1
        self.dead += 1
        if self.dead > MERGE_MIN and self.dead * 4 > len(self.keys):
            self._merge()

    def delete_many(self, inos: np.ndarray) -> None:
        """del self[ino] for distinct inode numbers that are all live in the index (one search for the batch)."""
        keys = self.keys
        pos = np.zeros(len(inos), dtype=np.int64)
        in_arrays = np.zeros(len(inos), dtype=bool)
        if len(keys):
            pos = keys.searchsorted(inos).clip(0, len(keys) - 1)
            in_arrays = (keys[pos] == inos) & (self.vals[pos] >= 0)
        for ino in inos[~in_arrays].tolist():
            del self.recent[ino]
        self.vals[pos[in_arrays]] = -1
        self.n -= len(inos)
        self.dead += int(in_arrays.sum())
        if self.dead > MERGE_MIN and self.dead * 4 > len(self.keys):
            self._merge()

    def update(self, new: Mapping[int, int]) -> None:
        """Insert many (ino -> slot) that are not live in the index."""
        if len(self.keys) and new:
            inos = np.fromiter(new.keys(), dtype=np.uint64, count=len(new))
            i = self.keys.searchsorted(inos).clip(0, len(self.keys) - 1)
            found = self.keys[i] == inos
            if found.any():  # tombstones of earlier files with the same inode number: revive in place
                slots = np.fromiter(new.values(), dtype=np.int32, count=len(new))
                self.vals[i[found]] = slots[found]
                self.dead -= int(found.sum())
                self.n += int(found.sum())
                new = {k: v for k, v, f in zip(new.keys(), new.values(), found.tolist(), strict=True) if not f}
        self.recent.update(new)
        self.n += len(new)
        self._maybe_merge()

    def _maybe_merge(self) -> None:
        if len(self.recent) > max(MERGE_MIN, len(self.keys) >> 3):
            self._merge()

    def _merge(self) -> None:
        live = self.vals >= 0
        rk = np.fromiter(self.recent.keys(), dtype=np.uint64, count=len(self.recent))
        rv = np.fromiter(self.recent.values(), dtype=np.int32, count=len(self.recent))
        keys = np.concatenate([self.keys[live], rk])
        vals = np.concatenate([self.vals[live], rv])
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.vals = vals[order]
        self.recent = {}
        self.dead = 0

    # ------------------------------------------------------------ batch
    def lookup_many(self, inos: np.ndarray) -> np.ndarray:
        """Slots for an array of inode numbers (u64); -1 where unknown."""
        out = np.full(len(inos), -1, dtype=np.int64)
        keys = self.keys
        if len(keys):
            i = keys.searchsorted(inos).clip(0, len(keys) - 1)
            hit = keys[i] == inos
            out[hit] = self.vals[i[hit]]
        if self.recent:
            miss = np.nonzero(out < 0)[0]
            if len(miss):
                get = self.recent.get
                out[miss] = [get(x, -1) for x in inos[miss].tolist()]
        return out

    # ------------------------------------------------------------ iteration
    def __len__(self) -> int:
        return self.n

    def items(self) -> Iterator[tuple[int, int]]:
        live = self.vals >= 0
        yield from zip(self.keys[live].tolist(), self.vals[live].tolist(), strict=True)
        yield from self.recent.items()

    def __iter__(self) -> Iterator[int]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[int]:
        return (v for _, v in self.items())

    def memory_bytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes
