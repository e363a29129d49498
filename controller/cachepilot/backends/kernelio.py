"""The two ways a backend talks to the kernel — sysfs files and ``dmsetup`` — with every failure classified.

Every failure becomes an error class the daemon can act on: an errno through
:func:`cachepilot.errors.classify_errno` (the one rule: ENOENT/ENODEV/ENXIO → :class:`DeviceGone`,
EBUSY/EAGAIN/EINTR/ETIMEDOUT → :class:`RetryLater`, anything else → :class:`KernelRejected`), what dmsetup printed
through :func:`classify_dmsetup`, a dmsetup time-out as :class:`RetryLater`.
Each classified error is counted in an :class:`ErrorCounts`, which the backend owns and the exporter reads.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from cachepilot.backends import dmioctl
from cachepilot.errors import CachepilotError, DeviceGone, KernelRejected, RetryLater, UserError, classify_errno

__all__ = ["COMMIT", "ErrorCounts", "classify_dmsetup", "classify_errno", "read_attr", "run_dm", "run_dmsetup",
           "write_attr"]

ATTR_MAX = 65536  # a sysfs attribute is at most a page; one read returns all of it
SYS_BLOCK = Path("/sys/block")  # the real host's: run_dm is the real host's runner
# What dmsetup prints (libdevmapper's strerror of the ioctl's errno), by class.
_DM_GONE = ("No such device", "Device does not exist", "No such file or directory")
_DM_RETRY = ("Device or resource busy", "Resource temporarily unavailable")
# The runners' own word after ``status NAME`` (not a dmsetup option): read the status with the target's metadata
# committed first, as ``dmsetup status NAME`` does; without it the daemon's reads do not commit (dmioctl.py).
COMMIT = "--commit"


class ErrorCounts(Counter[str]):
    """Classified errors by kind ("rejected", "gone", "retry", "config"), cumulative."""

    def count(self, exc: CachepilotError) -> CachepilotError:
        self[exc.kind] += 1
        return exc


def read_attr(path: Path | str) -> str:
    """One sysfs attribute, stripped; DeviceGone / RetryLater / KernelRejected on failure."""
    try:  # os-level: Path.read_text's text-file stack cost more than the read itself, ten times a tick
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, ATTR_MAX)
        finally:
            os.close(fd)
    except OSError as exc:
        raise classify_errno(exc.errno, f"read {path}") from None
    return data.decode(errors="replace").strip()


def write_attr(path: Path, value: str) -> None:
    """Write one sysfs attribute in a single write(2), as sysfs expects."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as a shell redirect does; sysfs ignores the truncate
    except OSError as exc:
        raise classify_errno(exc.errno, f"open {path}") from None
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise classify_errno(exc.errno, f"write {value!r} to {path}") from None
    finally:
        os.close(fd)


def run_dm(args: Sequence[str], timeout: float) -> str:
    """The daemon's :data:`~cachepilot.backends.base.DmRunner`: one device's status (without a metadata commit;
    ``status NAME`` :data:`COMMIT`: with one) or table through the DM ioctl (backends/dmioctl.py: no process per
    tick), anything else — and these where ``/dev/mapper/control`` cannot be opened — through
    :func:`run_dmsetup`."""
    commit = len(args) == 3 and args[0] == "status" and args[2] == COMMIT
    try:
        if len(args) == 2 and args[0] in ("status", "table"):
            return dmioctl.read(args[1], table=args[0] == "table")
        if commit:
            return dmioctl.read(args[1], table=False, commit=True)
        if tuple(args) == ("table",):
            return _all_tables()
    except OSError:
        pass  # no control node here (or not ours to open): dmsetup says what is wrong
    return run_dmsetup(args[:2] if commit else args, timeout)  # dmsetup's status commits unless --noflush


def _all_tables() -> str:
    """``dmsetup table`` (every dm device, ``NAME: start length target args``) through the ioctl: the devices
    from sysfs, a device gone meanwhile left out (as it would be from dmsetup's listing)."""
    lines = []
    for name_file in sorted(SYS_BLOCK.glob("dm-*/dm/name")):
        try:
            name = name_file.read_text().strip()
            first, *more = dmioctl.read(name, table=True).splitlines() or [""]
        except (DeviceGone, FileNotFoundError):
            continue
        lines += [f"{name}: {first}", *more]
    return "\n".join(lines)


def run_dmsetup(args: Sequence[str], timeout: float) -> str:
    """The real :data:`~cachepilot.backends.base.DmRunner`: ``dmsetup ARGS`` as an argument vector, never a
    shell, without udev (the daemon does not wait for udev cookies), bounded by ``timeout`` seconds."""
    argv = ["dmsetup", *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "DM_DISABLE_UDEV": "1"})
    except FileNotFoundError:
        raise UserError("dmsetup is not installed (package dmsetup)") from None
    except subprocess.TimeoutExpired:
        raise RetryLater(f"dmsetup {' '.join(args)} did not answer within {timeout:g} s") from None
    if r.returncode != 0:
        raise classify_dmsetup(args, r.stderr.strip() or f"exit status {r.returncode}")
    return r.stdout.strip()


def classify_dmsetup(args: Sequence[str], stderr: str) -> CachepilotError:
    text = f"dmsetup {' '.join(args)} failed: {stderr.splitlines()[-1] if stderr else 'no message'}"
    if any(s in stderr for s in _DM_GONE):
        return DeviceGone(text)
    if any(s in stderr for s in _DM_RETRY):
        return RetryLater(text)
    return KernelRejected(text)
