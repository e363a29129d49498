"""The kernel's deletes map (bpf/cachepilot.h, struct cp_delete_key): every file's end since the last take, read and
emptied in bulk once a tick (BPF_MAP_LOOKUP_AND_DELETE_BATCH into numpy arrays), no object per file."""

from __future__ import annotations

import ctypes as C
import errno

import numpy as np

from cachepilot import bpf_layout as L
from cachepilot.models.hotness import DELETE_DTYPE

KEY_DTYPE = np.dtype(L.cp_delete_key)
VALUE_DTYPE = np.dtype(L.cp_delete)
# a take stops after this many batch calls: the map changes under it (programs add as it deletes), and what a take
# leaves behind is the next one's
MAX_CALLS = 64


class KernelDeletes:
    """``max_entries``: the map's size (its entries at most: the buffers hold a full map)."""

    def __init__(self, h: C.CDLL, fd: int, max_entries: int) -> None:
        self._h, self._fd = h, fd
        self._keys = np.zeros(max_entries, dtype=KEY_DTYPE)
        self._values = np.zeros(max_entries, dtype=VALUE_DTYPE)
        # the batch position: a hash map's is a bucket index (u32); room for a key, as libbpf's callers give
        self._pos = (C.c_uint8 * 16)(), (C.c_uint8 * 16)()

    def take(self) -> np.ndarray:
        """The deletes in the map, removed from it, as DELETE_DTYPE records, oldest first. Lossless: an entry is
        removed only once copied; one added meanwhile is this take's or the next's."""
        n = self._batches()
        keys, values = self._keys[:n], self._values[:n]
        out = np.empty(n, dtype=DELETE_DTYPE)
        out["dev"], out["ino"], out["gen"] = keys["dev"], keys["ino"], keys["gen"]
        out["size"], out["ts_ns"] = values["size"], values["ts_ns"]
        return out[np.argsort(out["ts_ns"], kind="stable")]

    def _batches(self) -> int:
        """Batch calls from the first bucket until the map's end (ENOENT) or full buffers; returns entries taken."""
        room, taken, first = len(self._keys), 0, True
        pin, pout = self._pos
        for _ in range(MAX_CALLS):
            count = C.c_uint32(room - taken)
            if not count.value:
                break
            rc = self._h.bpf_map_lookup_and_delete_batch(
                self._fd, None if first else C.byref(pin), C.byref(pout),
                self._keys.ctypes.data + taken * KEY_DTYPE.itemsize,
                self._values.ctypes.data + taken * VALUE_DTYPE.itemsize, C.byref(count), None)
            taken += count.value
            if rc in (-errno.ENOENT, -errno.ENOSPC):  # the map's end; a bucket past the room left (the next take's)
                break
            if rc:
                raise OSError(-rc, f"taking the deletes map failed: {errno.errorcode.get(-rc, rc)}")
            C.memmove(pin, pout, 16)
            first = False
        return taken
