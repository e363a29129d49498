"""Finding the host's cached volumes (at start and on every rescan): bcache devices with a bcache directory in
sysfs, device-mapper devices whose table is a ``cache`` or ``writecache`` target. Read-only; one ``dmsetup table``
call covers every dm device. Also the devices below each volume (backing and cache), whose discards the probe
reports, and the extra devices the configuration asks to observe without acting. A filesystem stacked on a cached
device (LVM, dm-crypt, dm-linear on bcache) is found through the device's holders."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from cachepilot.backends import inspect
from cachepilot.errors import CachepilotError, UserError
from cachepilot.events import kdev, kdev_from_st_dev
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


def _dev_of(sysdir: Path) -> int | None:
    try:
        major, minor = (sysdir / "dev").read_text().strip().split(":")
    except (OSError, ValueError):
        return None
    return kdev(int(major), int(minor))


def _lower(sys_block: Path, name: str) -> tuple[int, ...]:
    out: list[int] = []
    slaves = sys_block / name / "slaves"
    if slaves.is_dir():
        for s in sorted(slaves.iterdir()):
            d = _dev_of(s.resolve())
            if d is not None:
                out.append(d)
    cache0 = sys_block / name / "bcache" / "cache" / "cache0"
    if cache0.exists():  # the cache set's cache device: .../block/<dev>/bcache
        d = _dev_of(cache0.resolve().parent)
        if d is not None:
            out.append(d)
    return tuple(out)


def _dm_cache_names() -> set[str]:
    """dm names whose table is a cache or writecache target (one dmsetup call for all)."""
    try:
        r = subprocess.run(["dmsetup", "table"], capture_output=True, text=True, timeout=10,
                           env={**os.environ, "DM_DISABLE_UDEV": "1"})
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return set()
    names = set()
    for line in r.stdout.splitlines():
        name, sep, table = line.partition(": ")
        fields = table.split()
        if sep and len(fields) > 2 and fields[2] in ("cache", "writecache"):
            names.add(name)
    return names


def _stacked_mount(sys_block: Path, name: str, depth: int = 4) -> tuple[str, int, str, bool] | None:
    """A filesystem mounted on a device stacked on ``name`` (LVM, dm-crypt, dm-linear: its holders, recursively):
    (holder name, its dev, mountpoint, mounted with -o discard), or None."""
    todo, seen = [(name, 0)], set()
    while todo:
        cur, level = todo.pop(0)
        holders = sys_block / cur / "holders"
        if level >= depth or not holders.is_dir():
            continue
        for h in sorted(holders.iterdir()):
            if h.name in seen:
                continue
            seen.add(h.name)
            dev = _dev_of(sys_block / h.name)
            if dev is None:
                continue
            mountpoint, fs_discard = inspect._mount_of(dev)  # noqa: SLF001 - the one mountinfo reader
            if mountpoint:
                return h.name, dev, mountpoint, fs_discard
            todo.append((h.name, level + 1))
    return None


def _fs_on_stack(sys_block: Path, name: str, info: VolumeInfo) -> tuple[VolumeInfo, int | None]:
    """The volume as the daemon tracks it: when nothing is mounted on the cached device itself but a device stacked
    on it carries a mounted filesystem, that filesystem (its dev, mountpoint, UUID) on the cached device's backend."""
    if info.mountpoint:
        return info, None
    stacked = _stacked_mount(sys_block, name)
    if stacked is None:
        return info, None
    holder, dev, mountpoint, fs_discard = stacked
    fs_uuid = inspect._fs_uuid(f"/dev/{holder}")  # noqa: SLF001 - the one blkid call
    bs = inspect.fs_block_size(mountpoint)
    return replace(info, dev=dev, mountpoint=mountpoint, fs_uuid=fs_uuid, fs_block_size=bs,
                   fs_discard=fs_discard), info.dev


def _dm_name(sys_block: Path, name: str) -> str:
    try:
        return (sys_block / name / "dm" / "name").read_text().strip()
    except OSError:
        return ""


def discover(sys_block: Path = inspect.SYS_BLOCK) -> tuple[list[Found], list[str]]:
    """The cached volumes now present, and one line per device that looked cached but could not be described."""
    found: list[Found] = []
    problems: list[str] = []
    candidates: list[str] = []
    try:
        names = sorted(p.name for p in sys_block.iterdir())
    except OSError as exc:
        return [], [f"{sys_block}: {exc.strerror}"]
    dm_names: set[str] | None = None
    for name in names:
        if (sys_block / name / "bcache").is_dir() and name.startswith("bcache"):
            candidates.append(name)
        elif (sys_block / name / "dm" / "name").is_file():
            if dm_names is None:
                dm_names = _dm_cache_names()
            try:
                if (sys_block / name / "dm" / "name").read_text().strip() in dm_names:
                    candidates.append(name)
            except OSError:
                continue
    for name in candidates:
        try:
            info = inspect.describe_volume(f"/dev/{name}")
        except CachepilotError as exc:  # not a cache, or gone or refusing while we looked
            problems.append(f"{name}: {exc}")
            continue
        info, block_dev = _fs_on_stack(sys_block, name, info)
        found.append(Found(info, _lower(sys_block, name), block_dev, _dm_name(sys_block, name)))
    return found, problems


def observed(spec: str) -> Found:
    """A device or mountpoint to watch without a cache: events and hotness only, no actions."""
    try:
        st = os.stat(spec)
    except OSError as exc:
        raise UserError(f"observe: {spec}: {exc.strerror}") from None
    if stat.S_ISBLK(st.st_mode):
        name, dev = inspect.block_name(spec)
    elif stat.S_ISDIR(st.st_mode):
        dev = kdev_from_st_dev(st.st_dev)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        name = Path(f"/sys/dev/block/{major}:{minor}").resolve().name or f"{major}:{minor}"
    else:
        raise UserError(f"observe: {spec}: neither a block device nor a mountpoint")
    mountpoint, fs_discard = inspect._mount_of(dev)  # noqa: SLF001 - the one mountinfo reader
    bs = inspect.fs_block_size(mountpoint)
    return Found(VolumeInfo(dev=dev, name=name, kind=OBSERVE, mountpoint=mountpoint, fs_block_size=bs,
                            fs_discard=fs_discard))
