"""Python view of bpf/cachepilot.h (the kernel side): every ring-buffer event and map key/value layout.

tests/bpf/test_layout.py checks each of these against the compiled object's BTF (sizes and field offsets), so a change
on one side without the other fails the tests instead of silently mis-decoding.
"""

from __future__ import annotations

import ctypes as C
from typing import Any

u32 = C.c_uint32
u64 = C.c_uint64

ROLE_VOLUME = 0x1
ROLE_FS = 0x2
ROLE_LOWER = 0x4

CFG_IGNORE_SELF = 0x1
CFG_DIO_SYSCALLS = 0x2
CFG_SYNC_SYSCALLS = 0x4
CFG_BULK_DELETES = 0x8
MAX_VOLUMES = 64
WATCH_BITS = 10
WATCH_SLOTS = 1 << WATCH_BITS
WATCH_PROBES = 4
SELF_CLAIM_FD = -4242

EV_FREE = 1
EV_DELETE = 2
EV_BARRIER = 3
EV_DISCARD = 4
EV_COMMIT = 5

BAR_F_PREFLUSH = 0x1
BAR_F_FUA = 0x2

HOT_PROBES = 8
DROP_KINDS = 8
DROP_SYNC = 7
SYNC_KINDS = 16
EXT4_FREE_BLOCKS_METADATA = 0x1


class Struct(C.Structure):
    _pack_ = 8


class cp_watch(Struct):  # noqa: N801 - mirrors the C name
    _fields_ = [("dev", u32), ("roles", u32), ("volume", u32), ("slot", u32), ("fs_dev", u32), ("_pad", u32),
                ("lower_of", u64)]


class cp_config(Struct):  # noqa: N801
    _fields_ = [("self_tgid", u32), ("flags", u32), ("nslots", u64), ("clock_ns", u64), ("nonce", u64),
                ("hot_base", u64), ("watch_sel", u64), ("wake_every_ns", u64)]


class cp_hot_slot(Struct):  # noqa: N801
    _fields_ = [
        ("ino", u64),
        ("dev", u32),
        ("gen", u32),
        ("read_score", u32),
        ("write_score", u32),
        ("read_sectors", u32),
        ("write_sectors", u32),
        ("last_ns", u64),
        ("size", u64),
    ]


# The struct module's view of cp_hot_slot (the tuple drain path), derived from the one layout above; packed and
# little-endian like the BPF side (tests/bpf/test_layout.py checks the size against the kernel's BTF).
def struct_format(cls: type[C.Structure]) -> str:
    """The struct module's little-endian format of a packed Structure of integer fields."""
    codes = {1: "b", 2: "h", 4: "i", 8: "q"}
    out = "<"
    for f in cls._fields_:
        t: Any = f[1]
        c = codes[C.sizeof(t)]
        out += c if t(-1).value < 0 else c.upper()
    return out


HOT_SLOT_FORMAT = struct_format(cp_hot_slot)


class cp_volume(Struct):  # noqa: N801
    _fields_ = [
        ("meta_score", u64),
        ("meta_bytes", u64),
        ("meta_ios", u64),
        ("data_read_bytes", u64),
        ("data_write_bytes", u64),
        ("epoch_data_bytes", u64),
        ("epoch_meta_bytes", u64),
        ("epoch_start_ns", u64),
        ("barriers", u64),
        ("discards", u64),
        ("discard_sectors", u64),
    ]


class cp_dio(Struct):  # noqa: N801
    _fields_ = [("ino", u64), ("dev", u32), ("gen", u32), ("size", u64)]


class cp_drops(Struct):  # noqa: N801
    _fields_ = [("ringbuf_full", u64), ("hot_full", u64), ("other", u64)]


class cp_sync(Struct):  # noqa: N801
    _fields_ = [("calls", u64), ("last_ino", u64), ("ts_ns", u64), ("last_pid", u32), ("pad", u32)]


class cp_sync_pending(Struct):  # noqa: N801
    _fields_ = [("ino", u64), ("slot", u32), ("kind", u32)]


class cp_ev_hdr(Struct):  # noqa: N801
    _fields_ = [("type", u32), ("dev", u32), ("ts_ns", u64)]


class cp_ev_free(Struct):  # noqa: N801
    _fields_ = [
        ("hdr", cp_ev_hdr),
        ("ino", u64),
        ("block", u64),
        ("count", u64),
        ("flags", u32),
        ("tid", u32),
        ("has_tid", u32),
        ("pad", u32),
    ]


class cp_delete_key(Struct):  # noqa: N801
    _fields_ = [("ino", u64), ("dev", u32), ("gen", u32)]


class cp_delete(Struct):  # noqa: N801
    _fields_ = [("size", u64), ("ts_ns", u64), ("pid", u32), ("pad", u32)]


class cp_ev_delete(Struct):  # noqa: N801
    _fields_ = [("hdr", cp_ev_hdr), ("ino", u64), ("size", u64), ("gen", u32), ("pid", u32)]


class cp_ev_barrier(Struct):  # noqa: N801
    _fields_ = [
        ("hdr", cp_ev_hdr),
        ("ino", u64),
        ("data_bytes", u64),
        ("meta_bytes", u64),
        ("arg", u64),
        ("pid", u32),
        ("kind", u32),
        ("flags", u32),
        ("closes", u32),
    ]


class cp_ev_discard(Struct):  # noqa: N801
    _fields_ = [("hdr", cp_ev_hdr), ("sector", u64), ("nr_sectors", u64), ("volume", u32), ("roles", u32)]


class cp_ev_commit(Struct):  # noqa: N801
    _fields_ = [("hdr", cp_ev_hdr), ("transaction", u32), ("pad", u32)]


ALL_STRUCTS: tuple[type[C.Structure], ...] = (
    cp_watch,
    cp_config,
    cp_hot_slot,
    cp_volume,
    cp_dio,
    cp_drops,
    cp_sync,
    cp_sync_pending,
    cp_delete_key,
    cp_delete,
    cp_ev_hdr,
    cp_ev_free,
    cp_ev_delete,
    cp_ev_barrier,
    cp_ev_discard,
    cp_ev_commit,
)
