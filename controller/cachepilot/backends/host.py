"""The host as the controller reads it, rooted at paths (procfs' ``NewFS(root)`` idea): one object owns the sysfs
and proc roots, the one mountinfo reader (cachepilot.mountinfo), the ``dmsetup`` runner and the runner of the
other tools (blkid, lvm).

Discovery, ``describe`` and ``sample`` take a :class:`Host` (the probe, below the backends, takes its
:class:`~cachepilot.mountinfo.ProcMounts`); the real one reads ``/sys`` and ``/proc`` and runs the real tools, a
test passes a fixture tree and fakes. Nothing here writes to the kernel.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cachepilot.backends.kernelio import read_attr, run_dm
from cachepilot.errors import CachepilotError, RetryLater, UserError
from cachepilot.events import kdev
from cachepilot.mountinfo import ProcMounts

DmRunner = Callable[[Sequence[str], float], str]
"""Runs ``dmsetup ARGS`` (argument vector, never a shell) with a time-out in seconds; returns stdout.
Raises DeviceGone / RetryLater / KernelRejected by what dmsetup said."""

ToolRunner = Callable[[Sequence[str], float], "ToolResult"]
"""Runs a tool (``blkid``, ``lvs``, ``lvchange``: argv[0]) with a time-out; UserError if it is not installed,
RetryLater if it does not answer in time."""


@dataclass(frozen=True, slots=True)
class ToolResult:
    returncode: int
    stdout: str
    stderr: str


EXT_SB, EXT_MAGIC_AT, EXT_UUID_AT = 1024, 0x38, 0x68  # ext2/3/4: struct ext4_super_block at byte 1024
XFS_UUID_AT = 32  # struct xfs_dsb at byte 0: "XFSB", then sb_blocksize, sb_dblocks, sb_rblocks, sb_rextents, sb_uuid


def superblock_uuid(dev_path: str) -> str | None:
    """The UUID of an ext2/3/4 or XFS filesystem on ``dev_path``, as blkid prints it; None for another or no
    filesystem, or a device that cannot be read."""
    try:
        fd = os.open(dev_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        head = os.pread(fd, EXT_SB + 0x100, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    ext = head[EXT_SB:]
    if head[:4] == b"XFSB":
        raw = head[XFS_UUID_AT:XFS_UUID_AT + 16]
    elif ext[EXT_MAGIC_AT:EXT_MAGIC_AT + 2] == b"\x53\xef":  # 0xEF53, little-endian
        raw = ext[EXT_UUID_AT:EXT_UUID_AT + 16]
    else:
        return None
    if len(raw) != 16:
        return None
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def run_tool(argv: Sequence[str], timeout: float) -> ToolResult:
    """The real :data:`ToolRunner`: an argument vector, never a shell, without udev waits (the daemon runs where
    udev may not answer), bounded by ``timeout`` seconds."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "DM_DISABLE_UDEV": "1"})
    except FileNotFoundError:
        raise UserError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise RetryLater(f"{' '.join(argv)} did not answer within {timeout:g} s") from None
    return ToolResult(r.returncode, r.stdout, r.stderr)


def _dm_reporting(args: Sequence[str], timeout: float) -> str:
    """For one-shot readers (record, describe): a dmsetup that does not answer is a problem to report; backends
    use the raw runner and retry instead."""
    try:
        return run_dm(args, timeout)
    except RetryLater as exc:
        raise UserError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class BlockDev:
    """One entry of ``sysfs/block`` as the cache kinds' ``detect`` sees it: the kernel name, its sysfs directory and,
    for a device-mapper device, its dm name, uuid and table line (from the host's one ``dmsetup table`` listing)."""

    name: str
    sysdir: Path
    dm_name: str = ""
    dm_uuid: str = ""
    dm_table: tuple[str, ...] = ()  # the table line's fields: start, length, target, args...

    @property
    def dm_target(self) -> str:
        return self.dm_table[2] if len(self.dm_table) > 2 else ""


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Host:
    """The machine at ``sysfs``/``proc`` (default: this one), with the tools it runs."""

    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    dm: DmRunner = run_dm
    tool: ToolRunner = run_tool
    statvfs: Callable[[str], os.statvfs_result] = field(default=os.statvfs)

    @property
    def sys_block(self) -> Path:
        return self.sysfs / "block"

    def reporting(self) -> Host:
        """This host for one-shot readers: a dmsetup that does not answer is reported, not retried."""
        return replace(self, dm=_dm_reporting) if self.dm is run_dm else self

    # -------------------------------------------------------------- block devices
    def block_names(self) -> list[str]:
        return sorted(p.name for p in self.sys_block.iterdir())

    def dev_of(self, sysdir: Path) -> int | None:
        """The kernel dev_t of a sysfs block directory (its ``dev`` file), or None."""
        try:
            major, minor = (sysdir / "dev").read_text().strip().split(":")
            return kdev(int(major), int(minor))
        except (OSError, ValueError):
            return None

    def dm_name(self, name: str) -> str:
        """The device-mapper name of ``name`` (lab-cached), "" if it is not a dm device (or vanished)."""
        return _read_or_empty(self.sys_block / name / "dm" / "name")

    def dm_name_of(self, name: str) -> str:
        """As :meth:`dm_name`, but DeviceGone / RetryLater when it cannot be read (a backend's view)."""
        return read_attr(self.sys_block / name / "dm" / "name")

    def dm_tables(self) -> dict[str, tuple[str, ...]]:
        """Every dm device's table, by dm name (one ``dmsetup table`` call); {} if dmsetup cannot say."""
        try:
            text = self.dm(("table",), 10.0)
        except CachepilotError:
            return {}  # no dmsetup, or it failed: no dm volumes to find this time
        out: dict[str, tuple[str, ...]] = {}
        for line in text.splitlines():
            name, sep, table = line.partition(": ")
            if sep:
                out[name] = tuple(table.split())
        return out

    def block(self, name: str, tables: dict[str, tuple[str, ...]] | None = None) -> BlockDev:
        """``name`` as the kinds' ``detect`` sees it; ``tables`` from :meth:`dm_tables` when scanning many."""
        sysdir = self.sys_block / name
        dm_name = self.dm_name(name)
        if not dm_name:
            return BlockDev(name, sysdir)
        if tables is not None:
            table = tables.get(dm_name, ())
        else:
            table = tuple(self.dm(("table", dm_name), 10.0).split())
        return BlockDev(name, sysdir, dm_name, _read_or_empty(sysdir / "dm" / "uuid"), table)

    # -------------------------------------------------------------- filesystems
    @property
    def mounts(self) -> ProcMounts:
        """The one mount-table reader, at this host's proc root."""
        return ProcMounts(self.proc)

    def mount_of(self, dev: int) -> tuple[str, bool]:
        return self.mounts.mount_of(dev)

    def fs_uuid(self, dev_path: str) -> str:
        """The filesystem UUID: read from an ext2/3/4 or XFS superblock directly (two small reads), else what blkid
        says; "" if neither can say. blkid -p probes signatures all over the device, the end included: on a
        bcache volume over a slow origin a rescan spent about a second in it, on the daemon's loop (the soak's
        ticks over 1 s)."""
        uuid = superblock_uuid(dev_path)
        if uuid is not None:
            return uuid
        try:
            r = self.tool(["blkid", "-p", "-o", "value", "-s", "UUID", dev_path], 10.0)
        except (UserError, RetryLater):
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""

    def fs_block_size(self, mountpoint: str) -> int:
        return self.statvfs(mountpoint).f_bsize if mountpoint else 4096
