"""Helpers of the host eBPF tests: ext4 on loop devices, polling, child processes, an ftrace witness."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cachepilot.events import Event, kdev_from_st_dev
from cachepilot.probe.checks import TRACEFS
from cachepilot.probe.probe import Probe

ROOT = Path(__file__).resolve().parents[2]
IMG_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, **kw)


# In the lab guest (tests/vm/test_bpf_lab.py) the same tests run on the lab's cached volume instead of a loop device.
LAB_CACHED_DEV = os.environ.get("LAB_CACHED_DEV", "")
# The stacked layout test_stacking.py's stacked tests need, made in a lab guest (shell lines, for the lab tests
# that run them there): the lab's filesystem unmounted, ext4 on dm-linear over the cached device, and the
# LAB_STACK_* variables those tests read.
STACK_LAYOUT = """\
export DM_DISABLE_UDEV=1
umount "$LAB_MOUNT"
dmsetup create lab-stack --table "0 $(blockdev --getsz "$LAB_CACHED_DEV") linear $LAB_CACHED_DEV 0"
mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=1 /dev/mapper/lab-stack
mkdir -p /mnt/stack
mount -t ext4 /dev/mapper/lab-stack /mnt/stack
export LAB_STACK_UPPER=/dev/mapper/lab-stack LAB_STACK_LOWER="$LAB_CACHED_DEV" LAB_STACK_MOUNT=/mnt/stack
"""
LAB_MOUNT = os.environ.get("LAB_MOUNT", "")
SLOW = 8.0 if LAB_CACHED_DEV else 1.0  # TCG guest: give the kernel more time to get I/O out


@dataclass
class LoopFs:
    image: Path | None
    loopdev: str
    mount: Path
    dev: int  # kernel dev_t of the block device (== the ext4 superblock's s_dev)
    workdir: Path | None = None  # where tests create files (default: the filesystem root)

    def path(self, name: str | bytes) -> Path | bytes:
        base = self.workdir or self.mount
        if isinstance(name, bytes):
            return os.fsencode(base) + b"/" + name
        return base / name


@contextlib.contextmanager
def lab_volume() -> Iterator[LoopFs]:
    """The lab's cached volume (bcache / dm-cache) with ext4 mounted; each test gets a fresh directory on it."""
    work = Path(LAB_MOUNT) / f"t-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    yield LoopFs(None, LAB_CACHED_DEV, Path(LAB_MOUNT), kdev_from_st_dev(os.stat(LAB_CACHED_DEV).st_rdev), work)


@contextlib.contextmanager
def make_loop_ext4(size_mb: int = 256, mkfs_opts: tuple[str, ...] = (), fstype: str = "ext4") -> Iterator[LoopFs]:
    image = IMG_DIR / f"cachepilot-bpf-{uuid.uuid4().hex[:8]}.img"
    mnt = Path(tempfile.mkdtemp(prefix="cachepilot-bpf-"))
    loopdev = ""
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        loopdev = run("losetup", "--find", "--show", str(image)).stdout.strip()
        if fstype == "ext4":
            run("mkfs.ext4", "-F", "-q", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                *mkfs_opts, loopdev)
        else:
            run(f"mkfs.{fstype}", "-f", "-q", *mkfs_opts, loopdev)
        run("mount", "-t", fstype, loopdev, str(mnt))
        mounted = True
        yield LoopFs(image, loopdev, mnt, kdev_from_st_dev(os.stat(loopdev).st_rdev))
    finally:
        if mounted:
            run("umount", str(mnt), check=False)
        if loopdev:
            run("losetup", "-d", loopdev, check=False)
        image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def settle(probe: Probe) -> None:
    """Flush everything pending to the device and throw the resulting events away."""
    os.sync()
    time.sleep(0.05)
    probe.poll(0)
    probe.drain()


def collect(
    probe: Probe, until: Callable[[list[Event]], bool] | None = None, timeout: float = 3.0
) -> list[Event]:
    """Poll the ring buffer until `until(events)` holds or timeout (scaled in the lab); returns everything seen."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        events += probe.poll(50)
        if until is not None and until(events):
            break
    return events


def child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python code in a child process (the probe ignores its own process)."""
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"child failed: {r.stderr}")
    return r


# ---- an independent witness: the kernel's own ftrace of the same tracepoints ----



def inv_bitmap(nbytes: int) -> int:
    n = max(1, min(64, (nbytes + 4095) // 4096))
    return 1 << (6 - (n.bit_length() - 1))


@dataclass
class BioTrace:
    queued: list[tuple[str, int, int]]  # (rwbs, sector, nr_sectors)
    splits: list[tuple[str, int, int]]  # (rwbs, sector, new_sector)

    def pieces(self, op: str) -> list[int]:
        """Bytes of every piece the block layer really sent for bios of op ('R' / 'W'), after splits."""
        rest = {sector: n for rwbs, sector, n in self.queued if op in rwbs and n}
        out: list[int] = []
        for rwbs, sector, new_sector in self.splits:
            if op not in rwbs or sector not in rest:
                continue
            total = rest.pop(sector)
            out.append((new_sector - sector) * 512)
            rest[new_sector] = total - (new_sector - sector)
        out += [n * 512 for n in rest.values()]
        return out

    def score(self, op: str) -> int:
        return sum(inv_bitmap(p) for p in self.pieces(op))


@contextlib.contextmanager
def ftrace_bios(dev: int) -> Iterator[BioTrace]:
    """Record block_bio_queue and block_split of one device with ftrace (a private instance)."""
    inst = TRACEFS / "instances" / f"cachepilot-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    inst.mkdir()
    result = BioTrace([], [])
    try:
        for ev in ("block_bio_queue", "block_split"):
            (inst / "events" / "block" / ev / "filter").write_text(f"dev == {dev}\n")
            (inst / "events" / "block" / ev / "enable").write_text("1\n")
        yield result
        for ev in ("block_bio_queue", "block_split"):
            (inst / "events" / "block" / ev / "enable").write_text("0\n")
        for line in (inst / "trace").read_text().splitlines():
            if line.startswith("#"):
                continue
            if "block_bio_queue:" in line:
                f = line.split("block_bio_queue:")[1].split()
                # "7,0 R 2048 + 8 [dd]"
                if len(f) >= 5 and f[3] == "+":
                    result.queued.append((f[1], int(f[2]), int(f[4])))
            elif "block_split:" in line:
                f = line.split("block_split:")[1].split()
                # "7,0 R 2048 / 3072 [dd]"
                if len(f) >= 5 and f[3] == "/":
                    result.splits.append((f[1], int(f[2]), int(f[4])))
    finally:
        inst.rmdir()


# ---- FIEMAP: the extents of a file, as the filesystem reports them ----

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 1
BLOCK = 4096


def fiemap(path: str | bytes) -> list[tuple[int, int, int]]:
    """(logical byte, physical block, blocks) of every extent of a file."""
    n = 512
    fd = os.open(path, os.O_RDONLY)
    try:
        req = bytearray(struct.pack("<QQIIII", 0, 2**64 - 1, FIEMAP_FLAG_SYNC, 0, n, 0) + bytes(56 * n))
        fcntl.ioctl(fd, FS_IOC_FIEMAP, req)
    finally:
        os.close(fd)
    mapped = struct.unpack_from("<I", req, 20)[0]
    out = []
    for i in range(mapped):
        logical, physical, length = struct.unpack_from("<QQQ", req, 32 + 56 * i)
        out.append((logical, physical // BLOCK, length // BLOCK))
    return out


def blocks(extents: list[tuple[int, int]]) -> set[int]:
    return {b for start, count in extents for b in range(start, start + count)}


# ---- the kernel's own record of any tracepoint, as (pid, event name, {field: value}) ----


@dataclass
class TraceRecord:
    pid: int
    event: str
    fields: dict[str, str]


@contextlib.contextmanager
def ftrace_events(group: str, events: tuple[str, ...], filt: str = "") -> Iterator[list[TraceRecord]]:
    """Record tracepoints of one group with ftrace (a private instance); the list fills when the block exits.
    Fields are parsed from the print format's "name value" pairs (jbd2, ext4 style)."""
    inst = TRACEFS / "instances" / f"cachepilot-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    inst.mkdir()
    records: list[TraceRecord] = []
    try:
        (inst / "buffer_size_kb").write_text("8192\n")
        for ev in events:
            if filt:
                (inst / "events" / group / ev / "filter").write_text(filt + "\n")
            (inst / "events" / group / ev / "enable").write_text("1\n")
        yield records
        for ev in events:
            (inst / "events" / group / ev / "enable").write_text("0\n")
        for line in (inst / "trace").read_text().splitlines():
            if line.startswith("#"):
                continue
            head, sep, rest = line.partition(": ")
            name, sep2, body = rest.partition(": ")
            if not sep or not sep2 or name not in events:
                continue
            task = head.split("[")[0].strip()
            pid = int(task.rsplit("-", 1)[1])
            words = body.split()
            records.append(TraceRecord(pid, name, dict(zip(words[::2], words[1::2], strict=False))))
    finally:
        inst.rmdir()
