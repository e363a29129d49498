"""Per-file columns narrower than the values they hold, exactly (issue 32: RSS <= 100 MiB with 1 M tracked files).

The hotness table keeps one slot per tracked file in parallel columns. A column of 64-bit values costs 8 MiB per
million files, most of it zeros: sizes and read bytes are almost always below 4 GiB, inode numbers of ext4 are 32-bit
by format, a host has few filesystems. Each column here stores the common case in fewer bytes and reads back the
value it was given:

- :class:`SpillU32` -- 4 bytes; a value that does not fit is kept in a dict (a 4 GiB file, 4 GiB read in a
  half-life: few).
- :class:`WideningU32` -- 4 bytes until a value needs 8; then the whole column becomes 8 bytes (an inode number past
  2^32: XFS inode64, btrfs after billions of creations).
- :class:`DevIds` -- 2 bytes: an index into the filesystems seen.
- :class:`Epoch8` -- an ageing epoch in 1 byte (modulo 256, the table sweeps the slots far behind).
- :class:`Millis32` -- a CLOCK_MONOTONIC time in 4 bytes: whole milliseconds after a base (~49 days; the base moves
  on before that). The one column that is not exact: times in the same millisecond compare equal (recency breaks
  ties between equal counters; one file accessed a millisecond after another is not told apart by it).

Scalar access is ``col[slot]`` / ``col[slot] = v``; bulk access is ``take(slots)`` / ``put(slots, values)`` with numpy
arrays (no Python object per slot).
"""

from __future__ import annotations

from array import array

import numpy as np

from cachepilot.errors import UserError

U32_MAX = 0xFFFFFFFF
MS = 1_000_000


class SpillU32:
    """Integers >= ``-offset`` as ``value + offset`` in a u32 array (u16 with ``narrow="H"``); the array's largest
    value marks a value kept in ``spill``."""

    def __init__(self, offset: int = 0, dtype: type[np.signedinteger] | type[np.unsignedinteger] = np.int64,
                 narrow: str = "I") -> None:
        self.a = array(narrow)
        self.spill: dict[int, int] = {}
        self.offset = offset
        self.dtype = dtype  # what take() returns
        self.raw = np.dtype(np.uint32 if narrow == "I" else np.uint16)
        self.top = U32_MAX if narrow == "I" else 0xFFFF  # the spill mark

    def __len__(self) -> int:
        return len(self.a)

    def _enc(self, v: int) -> int:
        u = v + self.offset
        if u < 0:
            raise UserError(f"{v} below the column's range (at least {-self.offset})")
        return u

    def __getitem__(self, i: int) -> int:
        u = self.a[i]
        return self.spill[i] if u == self.top else u - self.offset

    def __setitem__(self, i: int, v: int) -> None:
        u = self._enc(v)
        if u >= self.top:
            self.a[i] = self.top
            self.spill[i] = v
            return
        self.a[i] = u
        if self.spill:
            self.spill.pop(i, None)

    def extend_fill(self, n: int, v: int) -> None:
        """n new slots holding v."""
        start = len(self.a)
        u = self._enc(v)
        self.a.extend(array(self.a.typecode, [min(u, self.top)]) * n)
        if u >= self.top:
            self.spill.update(dict.fromkeys(range(start, start + n), v))

    def take(self, slots: np.ndarray) -> np.ndarray:
        u = np.frombuffer(self.a, dtype=self.raw)[slots]
        out = u.astype(self.dtype)
        if self.offset:
            out -= self.offset
        if self.spill:
            big = np.flatnonzero(u == self.top)
            if len(big):
                out[big] = [self.spill[s] for s in np.asarray(slots)[big].tolist()]
        return out

    def put(self, slots: np.ndarray, values: np.ndarray | int) -> None:
        # Every numpy call made here is a Python-level wrapper or a C one; the tick's columns are short (tens of new
        # files a take), so their fixed cost is what counts: under the lab's TCG vCPU, broadcast_to and .any()'s
        # wrappers were a tenth of the drain stage (issue 32). The same values land either way.
        if isinstance(values, (int, np.integer)) and self.offset + int(values) >= 0:
            self._put_one(slots, int(values))
            return
        if isinstance(values, np.ndarray) and isinstance(slots, np.ndarray) and values.shape == slots.shape:
            vals = values
        else:
            vals = np.broadcast_to(np.asarray(values), np.shape(slots))
        if self.offset:
            u = vals.astype(np.int64) + self.offset
        else:
            u = vals
        over = u >= self.top
        a = np.frombuffer(self.a, dtype=self.raw)
        a[slots] = np.where(over, self.top, u).astype(self.raw)
        del a  # release the buffer: the array may grow again
        if self.spill:
            pop = self.spill.pop
            for s in np.asarray(slots)[~over].tolist():
                pop(s, None)
        if np.count_nonzero(over):
            self.spill.update(zip(np.asarray(slots)[over].tolist(), vals[over].tolist(), strict=True))

    def _put_one(self, slots: np.ndarray, v: int) -> None:
        """put() of one value (>= -offset) into every slot: the same slots spilled or not as the array path."""
        u = v + self.offset
        a = np.frombuffer(self.a, dtype=self.raw)
        a[slots] = min(u, self.top)
        del a
        if self.spill:
            pop = self.spill.pop
            for s in np.asarray(slots).tolist():
                pop(s, None)
        if u >= self.top:
            self.spill.update(dict.fromkeys(np.asarray(slots).tolist(), v))

    @property
    def nbytes(self) -> int:
        return len(self.a) * self.a.itemsize + 100 * len(self.spill)  # a dict entry with its two ints: ~100 bytes


class WideningU32:
    """Unsigned integers in a u32 array until one needs more: then the column turns u64, once, for good."""

    def __init__(self) -> None:
        self.a = array("I")

    def __len__(self) -> int:
        return len(self.a)

    @property
    def wide(self) -> bool:
        return self.a.typecode == "Q"

    def _widen(self) -> None:
        self.a = array("Q", np.frombuffer(self.a, dtype=np.uint32).astype(np.uint64).tobytes())

    def __getitem__(self, i: int) -> int:
        return self.a[i]

    def __setitem__(self, i: int, v: int) -> None:
        if v > U32_MAX and not self.wide:
            self._widen()
        self.a[i] = v

    def append(self, v: int) -> None:
        if v > U32_MAX and not self.wide:
            self._widen()
        self.a.append(v)

    def _fit(self, values: np.ndarray) -> np.dtype[np.unsignedinteger]:
        # the ufunc's reduce, not ndarray.max(): the same maximum without numpy's Python-level wrapper
        if not self.wide and len(values) and int(np.maximum.reduce(values)) > U32_MAX:
            self._widen()
        return np.dtype(np.uint64 if self.wide else np.uint32)

    def extend(self, values: np.ndarray) -> None:
        self.a.frombytes(values.astype(self._fit(values)).tobytes())

    def view(self) -> np.ndarray:
        """The column as a numpy array on its buffer (u32 or u64): drop it before the column may grow."""
        return np.frombuffer(self.a, dtype=np.uint64 if self.wide else np.uint32)

    def take(self, slots: np.ndarray) -> np.ndarray:
        return self.view()[slots].astype(np.uint64)

    def put(self, slots: np.ndarray, values: np.ndarray) -> None:
        dt = self._fit(values)
        np.frombuffer(self.a, dtype=dt)[slots] = values

    @property
    def nbytes(self) -> int:
        return len(self.a) * self.a.itemsize


class DevIds:
    """Filesystem device numbers as u16 indexes into the list of those seen (65 535 filesystems at most)."""

    def __init__(self) -> None:
        self.a = array("H")
        self.devs: list[int] = []
        self._ids: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.a)

    def id_of(self, dev: int) -> int:
        i = self._ids.get(dev)
        if i is None:
            if len(self.devs) > 0xFFFF:
                raise UserError("more than 65 536 filesystems tracked")
            i = self._ids[dev] = len(self.devs)
            self.devs.append(dev)
        return i

    def __getitem__(self, i: int) -> int:
        return self.devs[self.a[i]]

    def __setitem__(self, i: int, dev: int) -> None:
        self.a[i] = self.id_of(dev)

    def extend_fill(self, n: int, dev: int) -> None:
        self.a.extend(array("H", [self.id_of(dev)]) * n)

    def put(self, slots: np.ndarray, dev: int) -> None:
        np.frombuffer(self.a, dtype=np.uint16)[slots] = self.id_of(dev)

    def ids(self, slots: np.ndarray) -> np.ndarray:
        """The slots' indexes into :attr:`devs` (u16)."""
        return np.frombuffer(self.a, dtype=np.uint16)[slots]

    def take(self, slots: np.ndarray) -> np.ndarray:
        """The device numbers (u32) of the slots."""
        return np.array(self.devs, dtype=np.uint32)[np.frombuffer(self.a, dtype=np.uint16)[slots]]

    def mask(self, dev: int) -> np.ndarray:
        """True at every slot holding ``dev``."""
        i = self._ids.get(dev)
        ids = np.frombuffer(self.a, dtype=np.uint16)
        return ids == i if i is not None else np.zeros(len(ids), dtype=bool)

    @property
    def nbytes(self) -> int:
        return len(self.a) * 2


class Epoch8:
    """Ageing epochs in one byte a slot: stored modulo 256, read back as ``now - ((now - stored) mod 256)`` -- exact
    while no slot's epoch is 256 or more behind ``now``. :meth:`sweep` keeps that true: whenever ``now`` crosses a
    multiple of 64 it returns the slots 64 or more behind (their counters are worth 0 by then: a u32 shifted by 32,
    read bytes below 2^62 by 63), which the table zeroes and stamps with ``now``; no slot is then more than 127
    behind. (A u32 epoch a slot cost 4 bytes; 3 MiB per million files, issue 32.)"""

    SWEEP = 64

    def __init__(self) -> None:
        self.a = array("B")
        self.now = 0  # the table's epoch

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, i: int) -> int:
        return self.now - ((self.now - self.a[i]) & 0xFF)

    def __setitem__(self, i: int, epoch: int) -> None:
        self.a[i] = epoch & 0xFF

    def extend_fill(self, n: int, epoch: int) -> None:
        self.a.extend(array("B", [epoch & 0xFF]) * n)

    def take(self, slots: np.ndarray) -> np.ndarray:
        """The slots' epochs (int64)."""
        behind = (self.now - np.frombuffer(self.a, dtype=np.uint8)[slots].astype(np.int64)) & 0xFF
        return self.now - behind

    def put(self, slots: np.ndarray, epoch: int) -> None:
        np.frombuffer(self.a, dtype=np.uint8)[slots] = epoch & 0xFF

    def sweep(self, now: int) -> np.ndarray:
        """Move to epoch ``now`` (never back); the slots to zero and re-stamp at it (see the class), ascending."""
        old, self.now = self.now, max(self.now, now)
        if old // self.SWEEP == self.now // self.SWEEP or not len(self.a):
            return np.empty(0, dtype=np.int64)
        behind = (old - np.frombuffer(self.a, dtype=np.uint8).astype(np.int64)) & 0xFF  # exact at the old epoch
        return np.flatnonzero(behind + (self.now - old) >= self.SWEEP)

    @property
    def nbytes(self) -> int:
        return len(self.a)


class Millis32:
    """CLOCK_MONOTONIC times (ns) as whole milliseconds after ``base``, plus one, in a u32 array; 0 is "none" (a time
    <= 0). Ordering is kept (a later time never reads back earlier) and a time a whole number of milliseconds after
    the base reads back as it was; any other as the start of its millisecond, but never as 0 (at least 1 ns: "seen",
    as the table's ``max(1, t)``). Times between 0 and the base read back as the base, times later than ~49 days
    after it as the last millisecond it holds (:meth:`rebase` moves the base on long before that)."""

    def __init__(self, base_ns: int) -> None:
        self.a = array("I")
        self.base = base_ns

    def __len__(self) -> int:
        return len(self.a)

    def enc(self, ns: np.ndarray | int) -> np.ndarray:
        ns = np.asarray(ns, dtype=np.int64)
        # np.clip's value, from the two ufuncs (clip goes through several Python-level wrappers)
        u = np.minimum(np.maximum((ns - self.base) // MS + 1, 1), U32_MAX)
        return np.where(ns > 0, u, 0).astype(np.uint32)

    def _enc_one(self, ns: int) -> int:
        return 0 if ns <= 0 else min(max((ns - self.base) // MS + 1, 1), U32_MAX)

    def dec(self, u: np.ndarray) -> np.ndarray:
        ns = np.maximum(self.base + (u.astype(np.int64) - 1) * MS, 1)
        return np.where(u > 0, ns, 0)

    def __getitem__(self, i: int) -> int:
        u = self.a[i]
        if u == 0:
            return 0
        return max(self.base + (u - 1) * MS, 1)

    def __setitem__(self, i: int, ns: int) -> None:
        self.a[i] = self._enc_one(ns)

    def extend_zero(self, n: int) -> None:
        self.a.frombytes(bytes(4 * n))

    def take(self, slots: np.ndarray) -> np.ndarray:
        return self.dec(np.frombuffer(self.a, dtype=np.uint32)[slots])

    def put(self, slots: np.ndarray, ns: np.ndarray | int) -> None:
        one = isinstance(ns, (int, np.integer))  # a new file's "never": one value, encoded once
        np.frombuffer(self.a, dtype=np.uint32)[slots] = self._enc_one(int(ns)) if one else self.enc(ns)

    def rebase(self, now_ns: int) -> bool:
        """Move the base on by half the range once ``now_ns`` is past three quarters of it (every ~25 days): times
        before the new base read back as it. True if it moved."""
        if (now_ns - self.base) // MS < (U32_MAX // 4) * 3:
            return False
        shift = U32_MAX // 2
        u = np.frombuffer(self.a, dtype=np.uint32)
        keep = u > 0
        u[keep] = np.maximum(u[keep].astype(np.int64) - shift, 1).astype(np.uint32)
        del u
        self.base += shift * MS
        return True

    @property
    def nbytes(self) -> int:
        return len(self.a) * 4
