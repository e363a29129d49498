"""Finding the host's cached volumes (at start and on every rescan): bcache devices with a bcache directory in
sysfs, device-mapper devices whose table is a ``cache`` or ``writecache`` target. Read-only; one ``dmsetup table``
call covers every dm device. Also the devices below each volume (backing and cache), whose discards the probe
reports, and the extra devices the configuration asks to observe without acting."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cachepilot.backends import inspect
from cachepilot.errors import UserError
from cachepilot.events import kdev, kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo

OBSERVE = "none"  # VolumeInfo.kind of a watched device that is not a cache: observe only, never acted on


@dataclass(frozen=True)
class Found:
    info: VolumeInfo
    lower: tuple[int, ...] = ()


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
        except UserError as exc:
            problems.append(f"{name}: {exc}")
            continue
        found.append(Found(info, _lower(sys_block, name)))
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
    bs = os.statvfs(mountpoint).f_bsize if mountpoint else 4096
    return Found(VolumeInfo(dev=dev, name=name, kind=OBSERVE, mountpoint=mountpoint, fs_block_size=bs,
                            fs_discard=fs_discard))
