"""Where a delete becomes a discard: ``FITRIM`` on the mounted filesystem, limited to each freed range.

The engine hands over :class:`~cachepilot.actions.DiscardRanges` whose extents were freed by deletes,
truncates and hole punches and whose freeing journal transaction has committed (``models/freed.py``). This
module turns each range into one ``FITRIM`` ioctl (``struct fstrim_range {start, len, minlen}``, bytes) on a
descriptor of the filesystem's mountpoint. The filesystem itself then discards only blocks that are still free
in its bitmap, under its group lock (ext4 mballoc): a block reallocated since it was freed is never discarded.
Never BLKDISCARD, never a device node.

Paced by a token bucket (``max_rate`` bytes per second, bursts up to one second's worth): what does not fit
now comes back as ``deferred`` for the next call. Skipped — and said so — when the filesystem is mounted with
``-o discard`` (it already discards on free). ``issued`` is what was asked of FITRIM; ``trimmed`` is what the
filesystem reports it discarded (it may trim a free extent that crosses the range's end in full, and skips
groups it trimmed before); what *landed* on the devices is for the probe to see (its Discard events).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable

from cachepilot.actions import DONE, FAILED, PENDING, SKIPPED, DiscardRanges, Outcome
from cachepilot.errors import CachepilotError, DeviceGone, KernelRejected, classify_errno
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo

log = logging.getLogger("cachepilot.actuators.discard")

FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range)
_RANGE = struct.Struct("=QQQ")  # start, len, minlen

Trim = Callable[[int, int, int, int], int]
"""(fd, start, len, minlen) -> bytes the filesystem reports trimmed; raises OSError."""


def fitrim(fd: int, start: int, length: int, minlen: int) -> int:
    buf = bytearray(_RANGE.pack(start, length, minlen))
    fcntl.ioctl(fd, FITRIM, buf, True)
    return _RANGE.unpack(buf)[1]  # the kernel writes back the number of bytes it trimmed


class Discarder:
    """One per filesystem (volume). ``run`` issues what the pacing allows now and returns the rest."""

    def __init__(self, info: VolumeInfo, *, max_rate: int = 256 << 20, trim: Trim = fitrim,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.info = info
        self.max_rate = max(1, max_rate)
        self.trim = trim
        self.clock = clock
        self._tokens = float(self.max_rate)  # one second's worth to start
        self._last = clock()
        self.errors: dict[str, int] = {}
        self.issued_bytes_total = 0
        self.trimmed_bytes_total = 0

    def run(self, action: DiscardRanges, *, dry_run: bool = False) -> Outcome:
        if self.info.fs_discard:
            log.info("%s: skipped, the filesystem is mounted with -o discard: %s", self.info.name, action.line())
            return Outcome(action, SKIPPED, dry_run, detail="filesystem mounted with -o discard", actuated=True)
        if not self.info.mountpoint:
            return self._failed(action, dry_run, (), 0, DeviceGone(f"{self.info.name}: no filesystem mounted"))
        now, ranges = self.clock(), _coalesced(action.ranges)
        self._refill(now)
        issued: list[tuple[int, int]] = []
        trimmed = 0
        try:
            fd = self._open(action)
        except CachepilotError as exc:
            return self._failed(action, dry_run, (), 0, exc)
        try:
            rest = list(ranges)
            while rest:
                start, length = rest[0]
                take = min(length, int(self._tokens) // self.info.fs_block_size * self.info.fs_block_size)
                if take <= 0:
                    break
                if not dry_run:
                    trimmed += self._trim_one(fd, start, take)
                self._tokens -= take
                issued.append((start, take))
                rest[0] = (start + take, length - take)
                if rest[0][1] == 0:
                    rest.pop(0)
        except CachepilotError as exc:
            return self._failed(action, dry_run, tuple(issued), trimmed, exc)
        finally:
            os.close(fd)
        if not dry_run:
            self.issued_bytes_total += sum(n for _, n in issued)
            self.trimmed_bytes_total += trimmed
        deferred = DiscardRanges(action.volume, action.fs_dev, tuple(rest), action.reason) if rest else None
        # not logged here: the daemon's decision record logs each outcome once (two lines a discard, before)
        return Outcome(action, PENDING if rest else DONE, dry_run, actuated=True, issued=tuple(issued),
                       trimmed_bytes=trimmed, deferred=deferred)

    def _open(self, action: DiscardRanges) -> int:
        """A descriptor of the mountpoint, checked to be the filesystem the ranges belong to."""
        try:
            fd = os.open(self.info.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise classify_errno(exc.errno, f"open {self.info.mountpoint}") from None
        dev = kdev_from_st_dev(os.fstat(fd).st_dev)
        if dev != action.fs_dev:
            os.close(fd)
            raise DeviceGone(f"{self.info.mountpoint} is now filesystem {dev:#x}, not {action.fs_dev:#x}: "
                             "not trimming another filesystem")
        return fd

    def _trim_one(self, fd: int, start: int, length: int) -> int:
        try:
            return self.trim(fd, start, length, self.info.fs_block_size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY):  # no FITRIM here, or no discards below
                raise KernelRejected(f"{self.info.mountpoint}: FITRIM not supported here "
                                     "(filesystem without FITRIM, or a device without discard)") from None
            raise classify_errno(exc.errno, f"FITRIM {self.info.mountpoint} [{start}, +{length})") from None

    def _refill(self, now: int) -> None:
        self._tokens = min(float(self.max_rate), self._tokens + (now - self._last) / 1e9 * self.max_rate)
        self._last = now

    def _failed(self, action: DiscardRanges, dry_run: bool, issued: tuple[tuple[int, int], ...], trimmed: int,
                exc: CachepilotError) -> Outcome:
        self.errors[exc.kind] = self.errors.get(exc.kind, 0) + 1
        log.warning("%s: %s failed: %s", self.info.name, action.line(), exc)
        return Outcome(action, FAILED, dry_run, error=exc, actuated=True, issued=issued, trimmed_bytes=trimmed)


def _coalesced(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ranges merged (one FITRIM each); empty ones dropped."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(r for r in ranges if r[1] > 0):
        if out and start <= out[-1][0] + out[-1][1]:
            s, n = out[-1]
            out[-1] = (s, max(n, start + length - s))
        else:
            out.append((start, length))
    return out
