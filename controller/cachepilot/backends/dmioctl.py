"""A device-mapper device's status or table line read through the DM ioctl (``DM_TABLE_STATUS`` on
``/dev/mapper/control``), as ``dmsetup status NAME`` / ``dmsetup table NAME`` print it.

Why not dmsetup: the daemon samples every dm volume once a tick (status and table). A dmsetup run is a fork, an
exec and libdevmapper's start-up each time — on the lab's emulated vCPU tens of milliseconds, twice a tick per
volume; the ioctl is one system call. Status is read with ``DM_NOFLUSH_FLAG``: without it dm-cache commits its
metadata on every status read (``cache_status``), a superblock write and two flushes per tick. ``commit=True``
reads it without the flag, for the one use a commit has: dm-cache finds a dead metadata device only when it
commits, and it commits on its own only when its metadata changed (Capabilities.failure_seen_at_commit).

The layout (include/uapi/linux/dm-ioctl.h, interface version 4): a ``struct dm_ioctl`` header (312 bytes), then
from ``data_start`` one ``struct dm_target_spec`` (40 bytes) per target followed by its NUL-terminated parameters;
each spec's ``next`` is the offset of the next from ``data_start``. A result that did not fit sets
``DM_BUFFER_FULL_FLAG``: asked again with a larger buffer, up to a cap.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

from cachepilot.errors import KernelRejected, classify_errno

CONTROL = "/dev/mapper/control"
_HEADER = struct.Struct("=3I I I I i I I I Q 128s 129s 7x")  # struct dm_ioctl (data[7] is padding to 8)
_SPEC = struct.Struct("=Q Q i I 16s")  # struct dm_target_spec
_VERSION = (4, 0, 0)  # any 4.x kernel answers a 4.0 request
_DM_TABLE_STATUS = (3 << 30) | (_HEADER.size << 16) | (0xFD << 8) | 12  # _IOWR(DM_IOCTL, DM_TABLE_STATUS_CMD, ...)
_STATUS_TABLE_FLAG = 1 << 4  # the table instead of the status
_BUFFER_FULL_FLAG = 1 << 8
_NOFLUSH_FLAG = 1 << 11
_FIRST_BUFFER = 16 * 1024
_MAX_BUFFER = 1 << 20  # a status line of a cache target is a few hundred bytes; this bounds a hostile answer

assert _HEADER.size == 312 and _SPEC.size == 40


def request(name: str, *, table: bool, size: int, commit: bool = False) -> bytearray:
    """The ioctl's buffer for ``name``: the header, room for the answer. A status read commits (no
    ``DM_NOFLUSH_FLAG``) only with ``commit``."""
    raw = name.encode()
    if not raw or len(raw) >= 128 or b"\0" in raw:
        raise KernelRejected(f"dm name {name!r}: not a device-mapper name")
    flags = _STATUS_TABLE_FLAG if table else 0 if commit else _NOFLUSH_FLAG
    buf = bytearray(size)
    _HEADER.pack_into(buf, 0, *_VERSION, size, _HEADER.size, 0, 0, flags, 0, 0, 0, raw, b"")
    return buf


def parse(buf: bytes | bytearray) -> str | None:
    """The lines (``start length target params``, one per target) of an answered buffer; None if it was too small."""
    fields = _HEADER.unpack_from(buf, 0)
    data_size, data_start, count, flags = fields[3], fields[4], fields[5], fields[7]
    if flags & _BUFFER_FULL_FLAG:
        return None
    end = min(len(buf), data_size)
    lines, at = [], data_start
    for _ in range(count):
        if at + _SPEC.size > end:
            raise KernelRejected("device-mapper answer cut short")
        start, length, _status, nxt, ttype = _SPEC.unpack_from(buf, at)
        params_at = at + _SPEC.size
        nul = buf.find(b"\0", params_at, end)
        params = bytes(buf[params_at:nul if nul >= 0 else end]).decode(errors="replace")
        target = ttype.split(b"\0", 1)[0].decode(errors="replace")
        lines.append(f"{start} {length} {target} {params}".rstrip())
        at = data_start + nxt
    return "\n".join(lines)


def read(name: str, *, table: bool, commit: bool = False, control: str = CONTROL) -> str:
    """``dmsetup status --noflush NAME`` (or ``table``; ``commit``: ``dmsetup status NAME``) through the ioctl.
    OSError when the control node cannot be opened (the caller may fall back to dmsetup); DeviceGone / RetryLater /
    KernelRejected by the ioctl's errno."""
    fd = os.open(control, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = _FIRST_BUFFER
        while True:
            buf = request(name, table=table, size=size, commit=commit)
            try:
                fcntl.ioctl(fd, _DM_TABLE_STATUS, buf, True)
            except OSError as exc:
                what = f"device-mapper {'table' if table else 'status'} of {name}"
                raise classify_errno(exc.errno or errno.EIO, what) from None
            text = parse(buf)
            if text is not None:
                return text
            if size >= _MAX_BUFFER:
                raise KernelRejected(f"device-mapper status of {name}: longer than {_MAX_BUFFER} bytes")
            size *= 4
    finally:
        os.close(fd)
