"""Backends: one module per kind of kernel cache (bcache, dm-cache, dm-writecache, lvmcache), each declaring
its kind in the table of kinds (``backends.kinds``) and reading the cache's state and applying actions through
the interfaces the stock kernel already has (sysfs, dmsetup, lvm).

``open_backend(info)`` gives the backend for a discovered volume (``inspect.describe``)."""

from __future__ import annotations

from cachepilot.backends.base import Backend
from cachepilot.backends.host import Host
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeInfo


def open_backend(info: VolumeInfo, *, host: Host | None = None) -> Backend:
    """The backend instance for one volume; ``host`` defaults to this machine (real sysfs and dmsetup)."""
    from cachepilot.backends import kinds

    k = kinds.get(info.kind)
    if k is None:
        raise UserError(f"{info.name}: no backend for cache kind {info.kind!r}")
    return k.open(info, host)
