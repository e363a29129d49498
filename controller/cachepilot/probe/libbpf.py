"""Minimal ctypes binding of the system libbpf (libbpf1 >= 1.1): only what the probe needs.

libbpf 1.x reports errors as NULL pointers / negative return values with errno set (libbpf 1.0 error mode).
"""

from __future__ import annotations

import ctypes as C
import ctypes.util
import os
import threading
from typing import Any

LIBBPF_NAMES = ("libbpf.so.1", "/usr/lib/x86_64-linux-gnu/libbpf.so.1", "libbpf.so")

BTF_KIND_STRUCT = 4
BTF_KIND_TYPEDEF = 8
BTF_KIND_FUNC = 12

PRINT_FN = C.CFUNCTYPE(C.c_int, C.c_int, C.c_char_p, C.c_void_p)


class LibbpfMissing(RuntimeError):
    pass


class BtfType(C.Structure):
    _fields_ = [("name_off", C.c_uint32), ("info", C.c_uint32), ("size_or_type", C.c_uint32)]


class BtfMember(C.Structure):
    _fields_ = [("name_off", C.c_uint32), ("type", C.c_uint32), ("offset", C.c_uint32)]


_lib: C.CDLL | None = None
_lock = threading.Lock()
_log: list[str] = []
_print_cb = None


def _fn(lib: C.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


def lib() -> C.CDLL:
    """Load and describe libbpf once per process."""
    global _lib, _print_cb
    with _lock:
        if _lib is not None:
            return _lib
        last: OSError | None = None
        handle = None
        for name in LIBBPF_NAMES:
            try:
                handle = C.CDLL(name, use_errno=True)
                break
            except OSError as exc:
                last = exc
        if handle is None:
            raise LibbpfMissing(f"the system libbpf (libbpf.so.1, Debian package libbpf1) is not installed: {last}")
        vp, cp, i, u = C.c_void_p, C.c_char_p, C.c_int, C.c_uint32
        _fn(handle, "libbpf_major_version", u)
        _fn(handle, "libbpf_minor_version", u)
        _fn(handle, "bpf_object__open_file", vp, cp, vp)
        _fn(handle, "bpf_object__load", i, vp)
        _fn(handle, "bpf_object__close", None, vp)
        _fn(handle, "bpf_object__next_program", vp, vp, vp)
        _fn(handle, "bpf_object__find_map_by_name", vp, vp, cp)
        _fn(handle, "bpf_object__btf", vp, vp)
        _fn(handle, "bpf_program__name", cp, vp)
        _fn(handle, "bpf_program__section_name", cp, vp)
        _fn(handle, "bpf_program__set_autoload", i, vp, C.c_bool)
        _fn(handle, "bpf_program__autoload", C.c_bool, vp)
        _fn(handle, "bpf_program__attach", vp, vp)
        _fn(handle, "bpf_link__destroy", i, vp)
        _fn(handle, "bpf_map__set_max_entries", i, vp, u)
        _fn(handle, "bpf_map__max_entries", u, vp)
        _fn(handle, "bpf_map__fd", i, vp)
        _fn(handle, "bpf_map__value_size", u, vp)
        _fn(handle, "bpf_map_lookup_elem", i, i, vp, vp)
        _fn(handle, "bpf_map_update_elem", i, i, vp, vp, C.c_uint64)
        _fn(handle, "bpf_map_delete_elem", i, i, vp)
        # fd, in_batch, out_batch, keys, values, count (in: room, out: taken), opts
        _fn(handle, "bpf_map_lookup_and_delete_batch", i, i, vp, vp, vp, vp, C.POINTER(u), vp)
        _fn(handle, "bpf_map_lookup_batch", i, i, vp, vp, vp, vp, C.POINTER(u), vp)
        _fn(handle, "libbpf_num_possible_cpus", i)
        _fn(handle, "btf__parse", vp, cp, vp)
        _fn(handle, "btf__load_vmlinux_btf", vp)
        _fn(handle, "btf__parse_split", vp, cp, vp)
        _fn(handle, "btf__free", None, vp)
        _fn(handle, "btf__find_by_name_kind", i, vp, cp, u)
        _fn(handle, "btf__type_by_id", C.POINTER(BtfType), vp, u)
        _fn(handle, "btf__name_by_offset", cp, vp, u)
        _fn(handle, "btf__resolve_size", C.c_long, vp, u)
        _fn(handle, "libbpf_set_print", vp, vp)
        # the bcc capture path (probe/bccload.py): the object's map definitions, then maps and programs of its own
        _fn(handle, "bpf_map__type", i, vp)
        _fn(handle, "bpf_map__key_size", u, vp)
        _fn(handle, "bpf_map__map_flags", u, vp)
        _fn(handle, "bpf_map_create", i, i, cp, u, u, u, vp)
        _fn(handle, "bpf_prog_load", i, i, cp, cp, vp, C.c_size_t, vp)
        _fn(handle, "bpf_raw_tracepoint_open", i, cp, i)
        libc = C.CDLL(ctypes.util.find_library("c"), use_errno=True)
        vsnprintf = _fn(libc, "vsnprintf", i, cp, C.c_size_t, cp, vp)

        def _print(level: int, fmt: bytes, ap: int) -> int:
            buf = C.create_string_buffer(1 << 16)
            vsnprintf(buf, len(buf), fmt, ap)
            _log.extend(buf.value.decode(errors="replace").rstrip().splitlines())
            del _log[:-400]
            return 0

        _print_cb = PRINT_FN(_print)
        handle.libbpf_set_print(C.cast(_print_cb, C.c_void_p))
        _lib = handle
        return handle


def log_tail(n: int = 20) -> list[str]:
    """The last libbpf log lines (libbpf's own warnings, verifier output on load failures)."""
    return _log[-n:]


def clear_log() -> None:
    _log.clear()


def errno_str(err: int) -> str:
    err = abs(err)
    return f"{os.strerror(err)} (errno {err})"


def version() -> tuple[int, int]:
    h = lib()
    return int(h.libbpf_major_version()), int(h.libbpf_minor_version())


def btf_struct_layout(btf: int, name: str) -> tuple[int, dict[str, int]] | None:
    """(size, {member: byte offset}) of a struct in a BTF, or None if absent."""
    h = lib()
    tid = h.btf__find_by_name_kind(btf, name.encode(), BTF_KIND_STRUCT)
    if tid < 0:
        return None
    t = h.btf__type_by_id(btf, tid)
    vlen = t.contents.info & 0xFFFF
    size = t.contents.size_or_type
    members = C.cast(C.addressof(t.contents) + C.sizeof(BtfType), C.POINTER(BtfMember))
    kflag = (t.contents.info >> 31) & 1
    out: dict[str, int] = {}
    for k in range(vlen):
        m = members[k]
        bits = m.offset & 0xFFFFFF if kflag else m.offset
        out[h.btf__name_by_offset(btf, m.name_off).decode()] = bits // 8
    return size, out
