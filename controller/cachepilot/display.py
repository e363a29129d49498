"""Showing files to humans: a path found by handle at display time, printed safely.

Files are (dev, inode, generation) everywhere in cachepilot; a path is only looked up when a person asks
(`cachepilot top`, `explain`), by opening the file by handle on its filesystem and reading back the name the kernel
has for it. Names are hostile input: control characters, invalid UTF-8 and terminal escapes are escaped, never
passed through.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

FILEID_INO32_GEN = 1  # ext2/3/4's handle type: (u32 inode, u32 generation)
_libc = ctypes.CDLL(None, use_errno=True)


def escape(text: str) -> str:
    """Printable text: control characters, DEL, C1 controls and undecodable bytes become \\xNN escapes."""
    out = []
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # surrogateescape'd byte of invalid UTF-8
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or 0x7F <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out)


def open_by_handle(mount_path: str, ino: int, gen: int, flags: int = os.O_PATH) -> int:
    """An fd of the file (inode, generation) on the filesystem mounted at ``mount_path`` (ext4's handle format).
    OSError: ESTALE when the file is gone or was replaced (generation mismatch), EPERM without
    CAP_DAC_READ_SEARCH."""
    if not 0 <= ino < 1 << 32:
        raise OSError(errno.EOVERFLOW, "inode number does not fit an ext4 handle")
    handle = ctypes.create_string_buffer(struct.pack("=Ii", 8, FILEID_INO32_GEN) + struct.pack("=II", ino, gen))
    mfd = os.open(mount_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = _libc.open_by_handle_at(mfd, handle, flags | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return fd
    finally:
        os.close(mfd)


def path_of(mount_path: str, ino: int, gen: int) -> str:
    """The file's current path for display (escaped), or why there is none, in angle brackets."""
    if not mount_path:
        return f"<ino {ino}: filesystem not mounted>"
    try:
        fd = open_by_handle(mount_path, ino, gen)
    except OSError as exc:
        why = "gone" if exc.errno in (errno.ESTALE, errno.ENOENT) else (exc.strerror or str(exc))
        return f"<ino {ino}: {why}>"
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        return f"<ino {ino}: {exc.strerror}>"
    finally:
        os.close(fd)
    return escape(target)
