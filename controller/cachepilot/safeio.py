"""Opening and reading the files cachepilot is given (configs, policies, the state file, traces) without trusting them.

Every such file is opened with ``O_NONBLOCK`` (opening a FIFO must not wait for a writer), ``O_NOCTTY`` and
``O_CLOEXEC``, checked with ``fstat`` on the open descriptor (not the path, which can change underneath), and refused
with one line unless it is a regular file -- or a pipe/FIFO where the caller reads a stream (a trace on stdin). A
regular file's size is checked before anything is read and at most ``cap + 1`` bytes are read (a file can grow
between the check and the read), so ``/dev/zero``, a symlink to it, or a sparse 5 GiB file cost nothing.

Every file cachepilot writes (traces, recordings, the state and lock files, the metrics textfile) goes through
:func:`output_dir` and the helpers after it: the directory is opened once and checked on that descriptor (owned by
root or the caller; writable by others only with the sticky bit, and then only our own entries are replaced), and
everything after goes through that descriptor: a new file is created ``O_CREAT|O_EXCL|O_NOFOLLOW``, its mode set by
``fchmod``, and it is renamed within the same directory. A link planted by another user, as the output or as its
temporary, is never followed, and nothing is ever done again by path.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from cachepilot.errors import UserError

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISSOCK, "a socket"))


class NoSuchFile(UserError):
    """The file does not exist (callers that start fresh without it tell this apart)."""


class UnsafeOutput(UserError):
    """An output's directory or name another user could redirect (a link, a directory others may write in)."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def human(n: int) -> str:
    """A byte count as the caps are written (whole MiB or KiB)."""
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


def _refuse_kind(path: str | Path, what: str, mode: int, stream: bool) -> None:
    if not stat.S_ISREG(mode) and not (stream and stat.S_ISFIFO(mode)):
        raise UserError(f"{path}: cannot read {what}: {_kind(mode)}, not a regular file")


def open_input(path: str | Path, what: str, *, stream: bool = False,
               follow: bool = True) -> tuple[BinaryIO, bool]:
    """(file, is_stream): a regular file, or with ``stream`` also a pipe/FIFO (then read in blocking mode: a
    producer that is slow to write is waited for, one that never connects is an end of file). UserError otherwise.
    ``follow`` False: a symbolic link is refused (ELOOP), for files in a directory another user might plant one in."""
    try:  # what it is, asked before opening: a FIFO's open wakes its writer, a device's may act (a tape rewinds)
        first = os.stat(path, follow_symlinks=follow).st_mode
        if stat.S_ISLNK(first):
            raise OSError(errno.ELOOP, "a symbolic link")  # follow is False: said below as a refusal
        _refuse_kind(path, what, first, stream)
        fd = os.open(path, OPEN_FLAGS if follow else OPEN_FLAGS | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NoSuchFile(f"{path}: no such {what}") from None
    except OSError as exc:
        why = "a symbolic link, refused here" if exc.errno == errno.ELOOP and not follow else exc.strerror or exc
        raise UserError(f"{path}: cannot read {what}: {why}") from None
    try:
        mode = os.fstat(fd).st_mode  # again on the descriptor: the path may have been swapped since
        is_stream = stream and stat.S_ISFIFO(mode)
        _refuse_kind(path, what, mode, stream)
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


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_items(raw: bytes) -> int:
    """How many items a JSON text's arrays and objects hold in all (commas outside strings, plus one), counted
    without building anything: ``json.loads`` of 32 MiB of ``{},`` builds 11 million objects (870 MB) before
    anyone can count them. Two passes at C speed (a copy with strings emptied, then ``count``)."""
    if raw.count(b",") == 0:
        return 1
    return _JSON_STRING.sub(b'""', raw).count(b",") + 1


def read_text(path: str | Path, what: str, cap: int) -> str:
    """:func:`read_capped`, decoded as UTF-8 (configs and policies)."""
    data = read_capped(path, what, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: cannot read {what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


# ------------------------------------------------------------------ outputs
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _mine(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _check_dir(dfd: int, where: str, what: str) -> bool:
    """True if the directory is sticky and open to others (then only our own entries may be replaced)."""
    st = os.fstat(dfd)
    open_to_others = bool(st.st_mode & 0o022)
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if not _mine(st.st_uid) or (open_to_others and not sticky):
        raise UnsafeOutput(f"{where}: cannot write {what}: its directory (owner uid {st.st_uid}, mode "
                           f"{stat.S_IMODE(st.st_mode):o}) lets another user replace what is written there")
    return open_to_others


def output_dir(path: str | Path, what: str) -> tuple[int, str, bool]:
    """(directory descriptor, file name, sticky-and-shared) for an output at ``path``, the directory checked on its
    descriptor; UnsafeOutput (one line) if another user could redirect the file, OSError if it cannot be opened."""
    p = Path(path)
    if not p.name or p.name in (".", ".."):
        raise UserError(f"{path}: cannot write {what}: not a file name")
    dfd = os.open(p.parent, DIR_FLAGS)  # OSError: the callers say it their way (one line, or a failed write)
    try:
        return dfd, p.name, _check_dir(dfd, str(path), what)
    except BaseException:
        os.close(dfd)
        raise


def _old(dfd: int, name: str, where: str, what: str, shared: bool, stream: bool = False) -> int | None:
    """The file type of what is at ``name`` (None: nothing). A link is refused, never followed or replaced; so is
    another user's entry in a shared sticky directory, and anything but a regular file -- or, for a ``stream``, a
    character device or FIFO named directly (``/dev/null``, ``/dev/full``, a pipe), written to in place."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    kind = stat.S_IFMT(st.st_mode)
    if not (stat.S_ISREG(kind) or stream and (stat.S_ISCHR(kind) or stat.S_ISFIFO(kind))):
        what_is = "a symbolic link" if stat.S_ISLNK(kind) else _kind(kind)
        raise UnsafeOutput(f"{where}: cannot write {what}: {what_is} is there: refusing to follow or replace it")
    if shared and st.st_uid != os.geteuid():
        raise UnsafeOutput(f"{where}: cannot write {what}: the file there belongs to uid {st.st_uid}")
    return kind


def _user_output_dir(path: str | Path, what: str) -> tuple[int, str, bool]:
    """:func:`output_dir` for a path the user named: a directory that cannot be opened is one line too."""
    try:
        return output_dir(path, what)
    except OSError as exc:
        raise UserError(f"{path}: cannot write {what}: no usable directory {Path(path).parent} "
                        f"({exc.strerror or exc})") from None


def check_output(path: str | Path, what: str, *, stream: bool = False) -> None:
    """UserError (one line) now if ``path`` could not be written safely (before minutes of work that would feed it)."""
    dfd, name, shared = _user_output_dir(path, what)
    try:
        _old(dfd, name, str(path), what, shared, stream)
    finally:
        os.close(dfd)


def _open_in_place(dfd: int, name: str, kind: int, where: str, what: str) -> int:
    """A character device or FIFO opened for writing as it is (non-blocking: a FIFO without a reader is ENXIO, not a
    hang), checked to be still what was looked at."""
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    if stat.S_IFMT(os.fstat(fd).st_mode) != kind:
        os.close(fd)
        raise UnsafeOutput(f"{where}: cannot write {what}: replaced while it was opened")
    os.set_blocking(fd, True)
    return fd


def create_new(dfd: int, name: str, mode: int, where: str, what: str) -> int:
    """A new file ``name`` in the checked directory (``O_EXCL|O_NOFOLLOW``: nothing planted is ever opened), its mode
    set on the descriptor."""
    try:
        fd = os.open(name, NEW_FLAGS, mode, dir_fd=dfd)
    except FileExistsError:
        raise UnsafeOutput(f"{where}: cannot write {what}: {name} appeared while it was being created") from None
    os.fchmod(fd, mode)  # not the umask's idea of it, and never by path
    return fd


def open_stream(path: str | Path, what: str, mode: int = 0o644) -> BinaryIO:
    """An output written as it goes (a trace: a killed writer leaves what it wrote at ``path``): an old file of ours
    there is removed and a new one created in its place (a named device or FIFO is written in place). UserError
    (one line) if that is not safe or fails."""
    dfd, name, shared = _user_output_dir(path, what)
    try:
        kind = _old(dfd, name, str(path), what, shared, stream=True)
        if kind is not None and not stat.S_ISREG(kind):
            return os.fdopen(_open_in_place(dfd, name, kind, str(path), what), "wb")
        if kind is not None:
            os.unlink(name, dir_fd=dfd)
        return os.fdopen(create_new(dfd, name, mode, str(path), what), "wb")
    except OSError as exc:
        raise UserError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None
    finally:
        os.close(dfd)


@contextmanager
def replacing(path: str | Path, what: str, mode: int = 0o600) -> Iterator[int]:
    """Replace ``path`` atomically: yields the descriptor of a new temporary beside it (write there); on success it
    is fsynced and renamed over ``path`` within the checked directory, which is then fsynced. OSError from the
    writes propagates (the old file is then left as it was); UnsafeOutput if the directory or name is unsafe."""
    dfd, name, shared = output_dir(path, what)
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        _old(dfd, name, str(path), what, shared)
        fd = create_new(dfd, tmp, mode, str(path), what)
        try:
            yield fd
            os.fsync(fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | Path, data: bytes, what: str, mode: int = 0o600) -> None:
    """:func:`replacing` with ``data`` as the whole new content."""
    with replacing(path, what, mode) as fd:
        write_all(fd, data)
