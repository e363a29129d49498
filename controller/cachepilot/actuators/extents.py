"""A file's extents from FIEMAP (``FS_IOC_FIEMAP``): where its data lives on the volume, which ranges are holes
or unwritten (reading those touches no disk). Used by the promoter to read only what is on disk, in an order of
its choosing."""

from __future__ import annotations

import fcntl
import struct
from dataclasses import dataclass

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2
FIEMAP_EXTENT_DELALLOC = 0x4
FIEMAP_EXTENT_UNWRITTEN = 0x800
_HEAD = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, reserved
_EXT = struct.Struct("=QQQQQIIII")  # fe_logical, fe_physical, fe_length, 2 reserved, fe_flags, 3 reserved
BATCH = 128


@dataclass(frozen=True, slots=True)
class Extent:
    logical: int  # byte offset in the file
    physical: int  # byte offset on the device
    length: int
    flags: int

    @property
    def on_disk(self) -> bool:
        """Data that a read fetches from the device (not unwritten, not delayed, location known)."""
        return not self.flags & (FIEMAP_EXTENT_UNWRITTEN | FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_UNKNOWN)


def fiemap(fd: int, start: int = 0, length: int = (1 << 63) - 1, *, sync: bool = False) -> list[Extent]:
    """Every extent of the open file overlapping [start, start+length); OSError if the filesystem has no FIEMAP."""
    out: list[Extent] = []
    pos, end = start, start + length
    while pos < end:
        buf = bytearray(_HEAD.pack(pos, end - pos, FIEMAP_FLAG_SYNC if sync else 0, 0, BATCH, 0)
                        + bytes(_EXT.size * BATCH))
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
        mapped = _HEAD.unpack_from(buf)[3]
        if not mapped:
            break
        for i in range(mapped):
            f = _EXT.unpack_from(buf, _HEAD.size + i * _EXT.size)
            out.append(Extent(f[0], f[1], f[2], f[5]))
        last = out[-1]
        if last.flags & FIEMAP_EXTENT_LAST:
            break
        pos = last.logical + last.length
    return out
