"""Typed access to a loaded BPF object's maps by name: element update and lookup, per-CPU arrays, their memory."""

from __future__ import annotations

import ctypes as C
import functools
from pathlib import Path
from typing import Any

import numpy as np


class MapAccess:
    """The maps of one loaded object, by name (their fds), and the number of possible CPUs per-CPU maps hold."""

    def __init__(self, h: C.CDLL, fds: dict[str, int], ncpus: int) -> None:
        self.h = h
        self.fds = fds
        self.ncpus = ncpus

    def update(self, name: str, key: C._SimpleCData | C.Structure, value: C._SimpleCData | C.Structure) -> None:
        rc = self.h.bpf_map_update_elem(self.fds[name], C.byref(key), C.byref(value), 0)
        if rc:
            raise OSError(-rc if rc < 0 else C.get_errno(), f"update of map {name} failed")

    def lookup(self, name: str, key: C._SimpleCData, value: C.Structure | C._SimpleCData) -> bool:
        rc = self.h.bpf_map_lookup_elem(self.fds[name], C.byref(key), C.byref(value))
        return rc == 0

    def percpu(self, name: str, key: int, value_type: type[C.Structure] | type[C.c_uint64]) -> list:
        """Every CPU's copy of one element of a per-CPU array."""
        stride = (C.sizeof(value_type) + 7) // 8 * 8
        buf = C.create_string_buffer(stride * self.ncpus)
        rc = self.h.bpf_map_lookup_elem(self.fds[name], C.byref(C.c_uint32(key)), buf)
        if rc:
            return []
        return [value_type.from_buffer_copy(buf.raw[i * stride : i * stride + C.sizeof(value_type)])
                for i in range(self.ncpus)]

    def percpu_rows(self, name: str, first: int, count: int, value_type: type[C.Structure]) -> Any:
        """Every CPU's copy of the elements ``first`` .. ``first + count - 1`` of a per-CPU array, as one numpy
        array of shape (count, CPUs) of ``value_type``'s layout: one BPF_MAP_LOOKUP_BATCH (the batch starts after
        the key it is given), not a lookup per element and a ctypes object per CPU (a volume's seven durability
        counters a tick were a tenth of the drain stage under the lab's TCG vCPU, issue 32). Per element if the
        kernel refuses the batch."""
        row = _row_dtype(value_type)
        stride = row.itemsize
        out = np.zeros((count, self.ncpus), dtype=row)
        keys = np.zeros(count, dtype=np.uint32)
        prev, pos, n = C.c_uint32(first - 1), C.c_uint32(0), C.c_uint32(count)
        rc = self.h.bpf_map_lookup_batch(self.fds[name], C.byref(prev) if first else None, C.byref(pos),
                                         keys.ctypes.data, out.ctypes.data, C.byref(n), None)
        if rc == 0 and n.value == count and int(keys[0]) == first and int(keys[-1]) == first + count - 1:
            return out
        buf = C.create_string_buffer(stride * self.ncpus)
        for i in range(count):  # the batch refused (or cut short): one element at a time, zeros where absent
            if self.h.bpf_map_lookup_elem(self.fds[name], C.byref(C.c_uint32(first + i)), buf) == 0:
                out[i] = np.frombuffer(buf.raw, dtype=row)
        return out

    def zero_percpu(self, name: str, keys: range, size: int) -> None:
        """Zero every CPU's copy of the elements ``keys`` (values of ``size`` bytes) of a per-CPU array."""
        zero = C.create_string_buffer((size + 7) // 8 * 8 * self.ncpus)
        for key in keys:
            rc = self.h.bpf_map_update_elem(self.fds[name], C.byref(C.c_uint32(key)), zero, 0)
            if rc:
                raise OSError(-rc if rc < 0 else C.get_errno(), f"update of map {name} failed")

    def memory_bytes(self) -> dict[str, int]:
        """Kernel memory charged for each map (memlock from /proc/self/fdinfo)."""
        out: dict[str, int] = {}
        for name, fd in self.fds.items():
            for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
                if line.startswith("memlock:"):
                    out[name] = int(line.split()[1])
        return out


@functools.cache
def _row_dtype(value_type: type[C.Structure]) -> np.dtype[Any]:
    """numpy's view of one CPU's value in a per-CPU map (8-aligned, as the kernel lays them out); built once: numpy's
    ctypes conversion is slow."""
    dt = np.dtype(value_type)
    names, fields = list(dt.names or ()), dict(dt.fields or {})
    return np.dtype({"names": names, "formats": [fields[n][0] for n in names],
                     "offsets": [fields[n][1] for n in names], "itemsize": (C.sizeof(value_type) + 7) // 8 * 8})
