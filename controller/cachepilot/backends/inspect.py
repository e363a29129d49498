"""Read-only discovery and sampling of cached volumes: what a volume is (its kind, from the table of kinds), where
its filesystem is mounted, how big its cache is, and one reading of its state (mode, dirty bytes, hits, misses,
errors). Nothing here writes to the kernel.

What is kind-specific (detect, describe, sample) is each kind's own (backends/<kind>.py, backends.kinds); the
host (sysfs, mountinfo, dmsetup, blkid) is a :class:`~cachepilot.backends.host.Host`.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from cachepilot import units
from cachepilot.backends import kinds
from cachepilot.backends.host import Host
from cachepilot.errors import UserError
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo, VolumeSample


def parse_bcache_size(text: str) -> int:
    """bcache prints sizes human-readably ("5.8M", "64.0k", "512"); back to bytes (to the precision printed)."""
    try:
        return units.parse_size(text, units.BCACHE, signed=True)
    except ValueError:
        raise UserError(f"unexpected bcache size {text.strip()!r}") from None


def block_name(dev_path: str, host: Host | None = None) -> tuple[str, int]:
    """The kernel name (bcache0, dm-3) and kernel dev_t of a block device node."""
    try:
        st = os.stat(dev_path)
    except OSError as exc:
        raise UserError(f"{dev_path}: {exc.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise UserError(f"{dev_path}: not a block device")
    sysfs = (host or Host()).sysfs
    sysdir = Path(f"{sysfs}/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}").resolve()
    return sysdir.name, kdev_from_st_dev(st.st_rdev)


def describe(host: Host, name: str, dev: int) -> VolumeInfo:
    """The volume called ``name`` (kernel name) with dev_t ``dev``; UserError naming the problem if it is not a
    cached volume of a known kind."""
    bdev = host.block(name)
    kind = kinds.detect(bdev)
    if kind is None:
        if bdev.dm_name:
            raise UserError(f"/dev/{name} ({bdev.dm_name}) is a dm '{bdev.dm_target or '?'}' target, not a cache")
        raise UserError(f"/dev/{name} is not a cache of a known kind ({', '.join(kinds.names())})")
    cache = kind.describe(host, bdev)
    mountpoint, fs_discard = host.mount_of(dev)
    return VolumeInfo(
        dev=dev,
        name=name,
        kind=kind.name,
        fs_uuid=host.fs_uuid(f"/dev/{name}") if mountpoint else "",
        mountpoint=mountpoint,
        cache_bytes=cache.cache_bytes,
        fs_block_size=host.fs_block_size(mountpoint),
        fs_discard=fs_discard,
        cache_id=cache.cache_id,
        discard_unit=cache.discard_unit,
    )


def describe_volume(dev_path: str, host: Host | None = None) -> VolumeInfo:
    """What the volume at a device node is; UserError naming the problem if it is not a cached volume."""
    host = (host or Host()).reporting()
    name, dev = block_name(dev_path, host)
    return describe(host, name, dev)


def sample_volume(info: VolumeInfo, *, host: Host | None = None, now_ns: int | None = None) -> VolumeSample:
    """One reading of the volume's state. Counters are cumulative, as the engine expects. DeviceGone when the
    volume's sysfs or dm node vanished."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    return kinds.kind(info.kind).sample((host or Host()).reporting(), info, now)
