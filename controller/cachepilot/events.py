"""Typed events: the one vocabulary shared by the probe (producer), the trace files (record/replay)
and the models (consumers).

Device numbers are kept in the kernel's internal encoding (``major << 20 | minor``), which is what the
BPF programs see; use :func:`kdev` / :func:`kdev_major_minor` to convert. Files are identified by
(dev, ino, gen); paths never appear here.

Timestamps are CLOCK_MONOTONIC nanoseconds (``bpf_ktime_get_ns``).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

MINOR_BITS = 20


def kdev(major: int, minor: int) -> int:
    """Kernel-internal dev_t for (major, minor)."""
    return (major << MINOR_BITS) | minor


def kdev_major_minor(dev: int) -> tuple[int, int]:
    return dev >> MINOR_BITS, dev & ((1 << MINOR_BITS) - 1)


def kdev_from_st_dev(st_dev: int) -> int:
    """Convert a userspace st_dev / st_rdev (glibc encoding) to the kernel encoding."""
    return kdev(os.major(st_dev), os.minor(st_dev))


@dataclass(frozen=True, slots=True)
class FileKey:
    dev: int
    ino: int
    gen: int = 0


@dataclass(frozen=True, slots=True)
class HotnessDelta:
    """Inverse-bitmap score and bytes a file accumulated below the page cache since the last drain."""

    key: FileKey
    read_score: int
    write_score: int
    read_bytes: int
    write_bytes: int
    last_access_ns: int
    size: int = -1
    """File size in bytes when last seen (-1 = unknown); used by sieving and for promotion ranges."""


@dataclass(frozen=True, slots=True)
class MetadataDelta:
    """Metadata / journal I/O (REQ_META, journal) of one volume since the last drain."""

    dev: int
    score: int
    bytes: int


@dataclass(frozen=True, slots=True)
class FreedExtent:
    """Filesystem blocks freed (unlink, truncate, punch hole). ``block`` and ``count`` are in fs blocks."""

    dev: int
    ino: int
    block: int
    count: int
    metadata: bool
    ts_ns: int
    tid: int = -1
    """The journal transaction that freed the blocks (ext4: jbd2's running transaction id); -1 when the
    filesystem has no journal transaction for it (XFS today, ext4 data=writeback data blocks)."""


@dataclass(frozen=True, slots=True)
class JournalCommit:
    """A journal transaction committed: blocks freed before it may now be trimmed."""

    dev: int
    transaction: int
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Delete:
    """Last unlink of a regular file."""

    key: FileKey
    size: int
    ts_ns: int


class BarrierKind(enum.IntEnum):
    PREFLUSH = 1  # bio with REQ_PREFLUSH (and data)
    FUA = 2  # bio with REQ_FUA
    EMPTY_FLUSH = 3  # flush bio without data
    FSYNC = 4
    FDATASYNC = 5
    SYNC_FILE_RANGE = 6
    SYNCFS = 7
    SYNC = 8  # sync(2)
    SYNC_WRITE = 9  # a write on an O_SYNC / O_DSYNC file, or with RWF_SYNC / RWF_DSYNC
    MSYNC = 10  # msync(MS_SYNC)


@dataclass(frozen=True, slots=True)
class Barrier:
    """A barrier on a volume; it closes the volume's current epoch.

    ``epoch_bytes`` are the bytes written to the volume since the previous barrier (counted in the kernel).
    ``ino`` and ``pid`` are 0 for block-level barriers.
    """

    dev: int
    kind: BarrierKind
    ino: int
    pid: int
    epoch_bytes: int
    ts_ns: int
    epoch_data_bytes: int = 0
    """Of ``epoch_bytes``: file data (bios attributed to a regular file)."""
    epoch_meta_bytes: int = 0
    """Of ``epoch_bytes``: metadata and journal (REQ_META, journal, directories, inode tables)."""
    flags: int = 0
    """Block barriers: bit 0 = PREFLUSH, bit 1 = FUA."""
    arg: int = 0
    """sync_file_range flags; the bio's payload size for block barriers."""
    closes_epoch: bool = True
    """Block barriers close (reset) the volume's epoch. File-level ones (fsync & co) report the epoch still open
    when they are called; the flush they cause closes it."""


@dataclass(frozen=True, slots=True)
class SyncCalls:
    """File-level durability calls of one kind that succeeded on a volume since the last drain, counted in the
    kernel (an unprivileged user can make millions a second, so they are never one event each). They annotate the
    volume's open epoch with who synced; only block barriers close an epoch."""

    dev: int
    kind: BarrierKind
    calls: int
    last_pid: int
    last_ino: int
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Discard:
    """A discard bio seen on a watched device (sectors of 512 bytes)."""

    dev: int
    sector: int
    nr_sectors: int
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Drops:
    """Cumulative counters of every lossy path in the kernel half."""

    ringbuf_full: int
    hotness_map_full: int
    other: int = 0


Event = HotnessDelta | MetadataDelta | FreedExtent | JournalCommit | Delete | Barrier | SyncCalls | Discard | Drops
