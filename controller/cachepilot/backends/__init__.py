"""Backends: one module per kind of kernel cache (bcache, dm-cache, dm-writecache), each reading the cache's
state and applying actions through the interfaces the stock kernel already has (sysfs, dmsetup).

``open_backend(info)`` gives the backend for a discovered volume (``inspect.describe_volume``)."""

from __future__ import annotations

from pathlib import Path

from cachepilot.backends.base import Backend, DmRunner
from cachepilot.capabilities import KIND_BCACHE, KIND_DMCACHE, KIND_WRITECACHE
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo


def open_backend(info: VolumeInfo, *, sysfs_root: Path = Path("/sys"), dm: DmRunner | None = None) -> Backend:
    """The backend instance for one volume; ``dm`` defaults to the real dmsetup runner."""
    from cachepilot.backends.bcache import BcacheBackend
    from cachepilot.backends.dmcache import DmCacheBackend
    from cachepilot.backends.writecache import WritecacheBackend

    kinds: dict[str, type[Backend]] = {KIND_BCACHE: BcacheBackend, KIND_DMCACHE: DmCacheBackend,
                                       KIND_WRITECACHE: WritecacheBackend}
    try:
        cls = kinds[info.kind]
    except KeyError:
        raise UserError(f"{info.name}: no backend for cache kind {info.kind!r}") from None
    return cls(info, sysfs_root=sysfs_root, dm=dm)
