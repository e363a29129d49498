"""Read-only discovery and sampling of cached volumes: what a volume is (bcache, dm-cache, dm-writecache), where
its filesystem is mounted, how big its cache is, and one reading of its state (mode, dirty bytes, hits, misses,
errors). Nothing here writes to the kernel.

Sources: bcache's sysfs (``/sys/block/bcacheN/bcache``), ``dmsetup table|status`` for the device-mapper targets
(run with an argument vector, never a shell), ``/proc/self/mountinfo`` and ``blkid`` for the filesystem.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cachepilot import units
from cachepilot.backends.dmstatus import StatusParseError, parse_dm_cache_status, parse_dm_writecache_status
from cachepilot.backends.kernelio import read_attr, run_dmsetup
from cachepilot.errors import DeviceGone, RetryLater, UserError
from cachepilot.events import kdev_from_st_dev, kdev_major_minor
from cachepilot.models.volume import VolumeInfo, VolumeSample

SYS_BLOCK = Path("/sys/block")
DmRunner = Callable[[Sequence[str], float], str]  # the same shape as backends.base.DmRunner
KIND_BCACHE, KIND_DMCACHE, KIND_WRITECACHE = "bcache", "dm-cache", "dm-writecache"



def parse_bcache_size(text: str) -> int:
    """bcache prints sizes human-readably ("5.8M", "64.0k", "512"); back to bytes (to the precision printed)."""
    try:
        return units.parse_size(text, units.BCACHE, signed=True)
    except ValueError:
        raise UserError(f"unexpected bcache size {text.strip()!r}") from None


def _read(path: Path) -> str:
    return read_attr(path)


def _dm_reporting(args: Sequence[str], timeout: float) -> str:
    """The default runner here: inspect's callers (record, describe) report a dmsetup that does not answer
    as a problem; backends pass their own runner and retry instead."""
    try:
        return run_dmsetup(args, timeout)
    except RetryLater as exc:
        raise UserError(str(exc)) from None


def _dmsetup(*args: str) -> str:
    return _dm_reporting(args, 10.0)


def block_name(dev_path: str) -> tuple[str, int]:
    """The kernel name (bcache0, dm-3) and kernel dev_t of a block device node."""
    try:
        st = os.stat(dev_path)
    except OSError as exc:
        raise UserError(f"{dev_path}: {exc.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise UserError(f"{dev_path}: not a block device")
    sysdir = Path(f"/sys/dev/block/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}").resolve()
    return sysdir.name, kdev_from_st_dev(st.st_rdev)


def _kind(name: str) -> tuple[str, str, list[str]]:
    """(kind, dm name or '', dm table fields or [])."""
    if (SYS_BLOCK / name / "bcache").is_dir():
        return KIND_BCACHE, "", []
    dm_name_file = SYS_BLOCK / name / "dm" / "name"
    if dm_name_file.is_file():
        dm_name = _read(dm_name_file)
        table = _dmsetup("table", dm_name).split()
        target = table[2] if len(table) > 2 else "?"
        if target == "cache":
            return KIND_DMCACHE, dm_name, table
        if target == "writecache":
            return KIND_WRITECACHE, dm_name, table
        raise UserError(f"/dev/{name} ({dm_name}) is a dm '{target}' target, not a cache")
    raise UserError(f"/dev/{name} is neither a bcache device nor a dm-cache / dm-writecache target")


def _unescape_mount(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_of(dev: int) -> tuple[str, bool]:
    """(mountpoint, mounted with -o discard) of the filesystem on the device (kernel dev_t), or ('', False)."""
    major, minor = kdev_major_minor(dev)
    want = f"{major}:{minor}"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[2] != want or fields[3] != "/":
                continue
            sep = fields.index("-")
            options = set(fields[5].split(",")) | set(fields[sep + 3].split(","))
            return _unescape_mount(fields[4]), "discard" in options
    return "", False


def fs_block_size(mountpoint: str) -> int:
    """The block size of the filesystem mounted there (statvfs ``f_bsize``: ext4's is 1, 2 or 4 KiB, set at mkfs),
    or 4096 when nothing is mounted (no filesystem, so no extents to count)."""
    return os.statvfs(mountpoint).f_bsize if mountpoint else 4096


def _fs_uuid(dev_path: str) -> str:
    try:
        r = subprocess.run(["blkid", "-p", "-o", "value", "-s", "UUID", dev_path], capture_output=True,
                           text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def _bcache_cache_bytes(name: str) -> int:
    cset = SYS_BLOCK / name / "bcache" / "cache"
    if not cset.exists():
        return 0  # detached: no cache
    cache_dev = (cset / "cache0").resolve().parent  # .../block/<cache device>/bcache -> the device
    return int(_read(cache_dev / "size")) * 512


def _bcache_cache_id(sysfs: Path) -> str:
    """The cache set's UUID (the directory ``bcache/cache`` links to), or "" when detached. A new cache device
    makes a new cache set, so a new UUID: this is what lets a failure latch end when the device is replaced."""
    link = sysfs / "cache"
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return ""


def _dm_cache_id(kind: str, table: Sequence[str]) -> str:
    """The cache device of a dm-cache / dm-writecache table line, as dmsetup prints it (major:minor)."""
    # cache: "<start> <len> cache <metadata dev> <cache dev> <origin dev> ..."
    # writecache: "<start> <len> writecache <p|s> <origin dev> <cache dev> ..."
    i = 4 if kind == KIND_DMCACHE else 5
    return table[i] if len(table) > i else ""


def describe_volume(dev_path: str) -> VolumeInfo:
    """What the volume is; UserError naming the problem if it is not a cached volume."""
    name, dev = block_name(dev_path)
    kind, dm_name, table = _kind(name)
    mountpoint, fs_discard = _mount_of(dev)
    cache_id = _dm_cache_id(kind, table)
    if kind == KIND_BCACHE:
        cache_bytes = _bcache_cache_bytes(name)
        cache_id = _bcache_cache_id(SYS_BLOCK / name / "bcache")
    elif kind == KIND_DMCACHE:
        cache_bytes = parse_dm_cache_status(_dmsetup("status", dm_name)).cache_bytes
    else:  # "<start> <len> writecache <p|s> <origin> <cache> <block size> ..."
        block = int(table[6]) if len(table) > 6 and table[6].isdigit() else 4096
        cache_bytes = parse_dm_writecache_status(_dmsetup("status", dm_name)).total_blocks * block
    return VolumeInfo(
        dev=dev,
        name=name,
        kind=kind,
        fs_uuid=_fs_uuid(dev_path) if mountpoint else "",
        mountpoint=mountpoint,
        cache_bytes=cache_bytes,
        fs_block_size=fs_block_size(mountpoint),
        fs_discard=fs_discard,
        cache_id=cache_id,
    )


def sample_volume(info: VolumeInfo, *, sysfs_root: Path = Path("/sys"), dm: DmRunner = _dm_reporting,
                  now_ns: int | None = None) -> VolumeSample:
    """One reading of the volume's state. Counters are cumulative, as the engine expects. DeviceGone when the
    volume's sysfs or dm node vanished."""
    now = time.monotonic_ns() if now_ns is None else now_ns
    sys_block = sysfs_root / "block"
    if info.kind == KIND_BCACHE:
        sysfs = sys_block / info.name / "bcache"
        mode_line = _read(sysfs / "cache_mode")
        mode = next((w.strip("[]") for w in mode_line.split() if w.startswith("[")), mode_line)
        attached = (sysfs / "cache").exists()
        errors = 0
        if attached:
            try:
                errors = int(_read(sysfs / "cache" / "cache0" / "io_errors"))
            except DeviceGone:
                attached = False  # the cache set went away between the two reads
        stats = sysfs / "stats_total"
        return VolumeSample(
            dev=info.dev, ts_ns=now, mode=mode, dirty_bytes=parse_bcache_size(_read(sysfs / "dirty_data")),
            hits=int(_read(stats / "cache_hits")), misses=int(_read(stats / "cache_misses")),
            io_errors=errors, failed=not attached, cache_id=_bcache_cache_id(sysfs) if attached else "",
            knobs={k: _read(sysfs / k) for k in ("sequential_cutoff", "writeback_percent", "writeback_delay")},
            # a bypass "hit" is a bypassed I/O whose data was in the cache anyway; both went around it
            bypasses=int(_read(stats / "cache_bypass_hits")) + int(_read(stats / "cache_bypass_misses")),
            bypassed_bytes=parse_bcache_size(_read(stats / "bypassed")),
        )
    dm_name = _read(sys_block / info.name / "dm" / "name")
    line = dm(("status", dm_name), 10.0)
    cache_id = _dm_cache_id(info.kind, dm(("table", dm_name), 10.0).split())
    try:
        if info.kind == KIND_DMCACHE:
            s = parse_dm_cache_status(line)
            return VolumeSample(
                dev=info.dev, ts_ns=now, mode=s.io_mode if not s.failed else "writethrough",
                dirty_bytes=s.dirty_bytes, hits=s.read_hits + s.write_hits,
                misses=s.read_misses + s.write_misses, io_errors=0,
                failed=s.failed or s.metadata_mode == "ro" or s.needs_check,
                knobs={k: v for k, v in s.core_args.items()}, cache_id=cache_id,
            )
        w = parse_dm_writecache_status(line)
        block = info.cache_bytes // w.total_blocks if w.total_blocks else 4096
        hits = w.stats[1] + w.stats[3] + w.stats[4] if len(w.stats) >= 5 else 0  # read hits + write hits
        total = w.stats[0] + w.stats[2] if len(w.stats) >= 3 else 0  # read blocks + write blocks
        return VolumeSample(
            dev=info.dev, ts_ns=now, mode="writeback", dirty_bytes=w.used_blocks * block, hits=hits,
            misses=max(0, total - hits), io_errors=w.error, failed=w.error != 0, cache_id=cache_id,
        )
    except StatusParseError as exc:
        raise UserError(f"dmsetup status {dm_name}: {exc}") from None
