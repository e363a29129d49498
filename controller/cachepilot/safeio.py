"""Opening and reading the files cachepilot is given (configs, policies, the state file, traces) without trusting them.

Every such file is opened with ``O_NONBLOCK`` (opening a FIFO must not wait for a writer), ``O_NOCTTY`` and
``O_CLOEXEC``, checked with ``fstat`` on the open descriptor (not the path, which can change underneath), and refused
with one line unless it is a regular file -- or a pipe/FIFO where the caller reads a stream (a trace on stdin). A
regular file's size is checked before anything is read and at most ``cap + 1`` bytes are read (a file can grow
between the check and the read), so ``/dev/zero``, a symlink to it, or a sparse 5 GiB file cost nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from cachepilot.errors import UserError

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISSOCK, "a socket"))


class NoSuchFile(UserError):
    """The file does not exist (callers that start fresh without it tell this apart)."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def human(n: int) -> str:
    """A byte count as the caps are written (whole MiB or KiB)."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


def open_input(path: str | Path, what: str, *, stream: bool = False,
               follow: bool = True) -> tuple[BinaryIO, bool]:
    """(file, is_stream): a regular file, or with ``stream`` also a pipe/FIFO (then read in blocking mode: a
    producer that is slow to write is waited for, one that never connects is an end of file). UserError otherwise.
    ``follow`` False: a symbolic link is refused (ELOOP), for files in a directory another user might plant one in."""
    try:
        fd = os.open(path, OPEN_FLAGS if follow else OPEN_FLAGS | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NoSuchFile(f"{path}: no such {what}") from None
    except OSError as exc:
        why = "a symbolic link, refused here" if exc.errno == errno.ELOOP and not follow else exc.strerror or exc
        raise UserError(f"{path}: cannot read {what}: {why}") from None
    try:
        mode = os.fstat(fd).st_mode
        is_stream = stream and stat.S_ISFIFO(mode)
        if not stat.S_ISREG(mode) and not is_stream:
            raise UserError(f"{path}: cannot read {what}: {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), is_stream
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | Path, what: str, cap: int, *, follow: bool = True) -> bytes:
    """The whole content of a regular file of at most ``cap`` bytes; UserError naming the file and the problem."""
    f, _ = open_input(path, what, follow=follow)
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise UserError(f"{path}: {what} of {size} bytes, larger than {human(cap)}")
        chunks: list[bytes] = []
        left = cap + 1
        try:
            while left > 0:
                b = f.read(min(left, 1 << 20))
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
        except OSError as exc:
            raise UserError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    data = b"".join(chunks)
    if len(data) > cap:  # grew after the fstat
        raise UserError(f"{path}: {what} larger than {human(cap)}")
    return data


def read_text(path: str | Path, what: str, cap: int) -> str:
    """:func:`read_capped`, decoded as UTF-8 (configs and policies)."""
    data = read_capped(path, what, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: cannot read {what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
