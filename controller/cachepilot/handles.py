"""Opening a file by its ext4 handle (inode, generation): ``open_by_handle_at(2)`` with FILEID_INO32_GEN.

A module of its own, with nothing but the standard library, because the light commands need it too (``status``
names files, ``hotlist export`` resolves its list): through actuators/promote.py they loaded the engine's models
and numpy, most of a command's start-up on a slow host (the lab's TCG guest took 7-11 s for ``hotlist import``)."""

from __future__ import annotations

import ctypes
import os
import struct

FILEID_INO32_GEN = 1


class _FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_ubyte * 8)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.POINTER(_FileHandle), ctypes.c_int]
_libc.open_by_handle_at.restype = ctypes.c_int


def open_by_handle(mount_fd: int, ino: int, gen: int, flags: int) -> int:
    """open_by_handle_at(2) with an ext4 FILEID_INO32_GEN handle; OSError (ESTALE: gone or replaced)."""
    h = _FileHandle(8, FILEID_INO32_GEN)
    h.f_handle[:] = list(struct.pack("<II", ino & 0xFFFFFFFF, gen & 0xFFFFFFFF))
    fd = _libc.open_by_handle_at(mount_fd, ctypes.byref(h), flags)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return fd
