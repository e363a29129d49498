"""Typed access to a loaded BPF object's maps by name: element update and lookup, per-CPU arrays, their memory."""

from __future__ import annotations

import ctypes as C
from pathlib import Path


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
