"""Finding the host's cached volumes (at start and on every rescan): every block device some kind in the table of
kinds (backends.kinds) detects as its own. Read-only; one ``dmsetup table`` call covers every dm device. Also the
devices below each volume (backing and cache), whose discards the probe reports, and the extra devices the
configuration asks to observe without acting. A filesystem stacked on a cached
device (LVM, dm-crypt, dm-linear on bcache) is found through the device's holders."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace

from cachepilot.backends import inspect, kinds
from cachepilot.backends.host import Host
from cachepilot.errors import CachepilotError, UserError
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo

OBSERVE = "none"  # VolumeInfo.kind of a watched device that is not a cache: observe only, never acted on


@dataclass(frozen=True)
class Found:
    info: VolumeInfo  # info.dev is the filesystem's device (the cached device itself, or what is stacked on it)
    lower: tuple[int, ...] = ()
    block_dev: int | None = None  # the cached device, when the filesystem sits on a device stacked on it
    dm_name: str = ""  # device-mapper name of a dm volume (lab-cached); "" for bcache

    @property
    def label(self) -> str:
        """The volume's name for people and metrics (the dm name, else the kernel name: lab-cached, bcache0);
        ``info.name`` stays the kernel name (dm-3), as node_exporter's ``device`` label has it."""
        return self.dm_name or self.info.name

    @property
    def volume_dev(self) -> int:
        """The cached block device (what the probe watches as the volume)."""
        return self.info.dev if self.block_dev is None else self.block_dev


def _lower(host: Host, name: str, kind: kinds.Kind) -> tuple[int, ...]:
    """The devices below a volume: its slaves, and the cache devices its kind finds where the kernel does not list
    them among the slaves (kinds.Kind.cache_devices)."""
    out: list[int] = []
    slaves = host.sys_block / name / "slaves"
    if slaves.is_dir():
        for s in sorted(slaves.iterdir()):
            d = host.dev_of(s.resolve())
            if d is not None:
                out.append(d)
    return (*out, *kind.cache_devices(host, name))


def _stacked_mount(host: Host, name: str, depth: int = 4) -> tuple[str, int, str, bool] | None:
    """A filesystem mounted on a device stacked on ``name`` (LVM, dm-crypt, dm-linear: its holders, recursively):
    (holder name, its dev, mountpoint, mounted with -o discard), or None."""
    todo, seen = [(name, 0)], set()
    while todo:
        cur, level = todo.pop(0)
        holders = host.sys_block / cur / "holders"
        if level >= depth or not holders.is_dir():
            continue
        for h in sorted(holders.iterdir()):
            if h.name in seen:
                continue
            seen.add(h.name)
            dev = host.dev_of(host.sys_block / h.name)
            if dev is None:
                continue
            mountpoint, fs_discard = host.mount_of(dev)
            if mountpoint:
                return h.name, dev, mountpoint, fs_discard
            todo.append((h.name, level + 1))
    return None


def _fs_on_stack(host: Host, name: str, info: VolumeInfo) -> tuple[VolumeInfo, int | None]:
    """The volume as the daemon tracks it: when nothing is mounted on the cached device itself but a device stacked
    on it carries a mounted filesystem, that filesystem (its dev, mountpoint, UUID) on the cached device's backend."""
    if info.mountpoint:
        return info, None
    stacked = _stacked_mount(host, name)
    if stacked is None:
        return info, None
    holder, dev, mountpoint, fs_discard = stacked
    return replace(info, dev=dev, mountpoint=mountpoint, fs_uuid=host.fs_uuid(f"/dev/{holder}"),
                   fs_block_size=host.fs_block_size(mountpoint), fs_discard=fs_discard), info.dev


def _candidates(host: Host, names: list[str]) -> list[str]:
    """The devices some kind in the table says are its own (one ``dmsetup table`` call covers every dm device)."""
    tables: dict[str, tuple[str, ...]] | None = None
    out: list[str] = []
    for name in names:
        if tables is None and host.dm_name(name):
            tables = host.dm_tables()
        if kinds.detect(host.block(name, tables or {})) is not None:
            out.append(name)
    return out


def discover(host: Host | None = None) -> tuple[list[Found], list[str]]:
    """The cached volumes now present, and one line per device that looked cached but could not be described."""
    host = (host or Host()).reporting()
    found: list[Found] = []
    problems: list[str] = []
    try:
        names = host.block_names()
    except OSError as exc:
        return [], [f"{host.sys_block}: {exc.strerror}"]
    for name in _candidates(host, names):
        dev = host.dev_of(host.sys_block / name)
        try:
            if dev is None:
                raise UserError("its dev number cannot be read")
            info = inspect.describe(host, name, dev)
        except CachepilotError as exc:  # not a cache, or gone or refusing while we looked
            problems.append(f"{name}: {exc}")
            continue
        info, block_dev = _fs_on_stack(host, name, info)
        found.append(Found(info, _lower(host, name, kinds.kind(info.kind)), block_dev, host.dm_name(name)))
    return found, problems


def observed(spec: str, host: Host | None = None) -> Found:
    """A device or mountpoint to watch without a cache: events and hotness only, no actions."""
    host = host or Host()
    try:
        st = os.stat(spec)
    except OSError as exc:
        raise UserError(f"observe: {spec}: {exc.strerror}") from None
    if stat.S_ISBLK(st.st_mode):
        name, dev = inspect.block_name(spec, host)
    elif stat.S_ISDIR(st.st_mode):
        dev = kdev_from_st_dev(st.st_dev)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        name = (host.sysfs / "dev" / "block" / f"{major}:{minor}").resolve().name or f"{major}:{minor}"
    else:
        raise UserError(f"observe: {spec}: neither a block device nor a mountpoint")
    mountpoint, fs_discard = host.mount_of(dev)
    bs = host.fs_block_size(mountpoint)
    return Found(VolumeInfo(dev=dev, name=name, kind=OBSERVE, mountpoint=mountpoint, fs_block_size=bs,
                            fs_discard=fs_discard))
