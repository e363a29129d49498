"""One daemon per host: exclusive flocks, each on a file holding the owner's pid.

Two locks, taken before anything acts: a host-wide one at a fixed path (``HOST_LOCK``), so that a second daemon
with its own configuration, state directory and socket cannot steer the same caches, and the state directory's
own, so that two daemons never share a state file. flock is released by the kernel when the process dies (even by
SIGKILL), so a stale file never blocks a restart; the pid inside is only for the message naming the running daemon.

The directories are trusted only if nobody else could plant a file in them (the daemon runs as root): each must be
owned by root (or by the running user when not root) and not writable by group or others, and so must each parent
unless it has the sticky bit (/tmp). The directory is reached one component at a time with O_NOFOLLOW, so a
symbolic link anywhere in its path is refused (one line, exit 2): a link another user planted (or could swap)
would move the daemon's state and lock into a directory of their choosing. The files are opened with O_NOFOLLOW,
so a symbolic link is refused, never followed."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from cachepilot.errors import FatalError, UserError

LOCK_NAME = "cachepilot.lock"
HOST_LOCK = Path("/run/cachepilot/daemon.lock")
# Moves the host lock (the test suites set it, so their daemons neither meet a real one nor each other).
HOST_LOCK_ENV = "CACHEPILOT_HOST_LOCK"


def host_lock_path() -> Path | None:
    """The host-wide lock's path; None for a non-root daemon without ``CACHEPILOT_HOST_LOCK``: it cannot write any
    cache's controls (bcache's sysfs, /dev/mapper/control are root's), and /run/cachepilot is not its to make."""
    env = os.environ.get(HOST_LOCK_ENV)
    if env:
        return Path(env)
    return HOST_LOCK if os.geteuid() == 0 else None


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _check_parents(real: str, what: str) -> None:
    for parent in Path(real).parents:
        st = os.stat(parent)
        open_to_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if not _trusted_owner(st) or open_to_others:
            raise UserError(f"{what}: its parent {parent} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
                            " lets another user replace it: refusing")


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


def _step(fd: int, part: str, last: bool) -> int:
    """The descriptor of directory ``part`` under ``fd`` (made if missing: 0700 the last, 0755 a parent)."""
    try:
        return os.open(part, _DIR, dir_fd=fd)
    except FileNotFoundError:
        try:
            os.mkdir(part, 0o700 if last else 0o755, dir_fd=fd)
        except FileExistsError:
            pass  # made meanwhile: opened (and checked) below like any other
        return os.open(part, _DIR, dir_fd=fd)


def open_no_links(path: Path, what: str) -> int:
    """An O_DIRECTORY descriptor of ``path`` reached component by component without following any link; UserError
    naming the component that is a link (or not a directory), FatalError if it cannot be made or opened."""
    full = Path(os.path.abspath(path))
    fd = os.open("/", _DIR)
    seen = Path("/")
    try:
        for i, part in enumerate(full.parts[1:], 2):
            seen /= part
            try:
                nfd = _step(fd, part, i == len(full.parts))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    kind = "a symbolic link" if os.path.islink(seen) else "not a directory"
                    raise UserError(f"{what} {path}: {seen} is {kind}: refusing (name the real directory)") from None
                raise FatalError(f"{what} {path}: {exc.strerror or exc}") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dir(path: Path, what: str) -> int:
    """An O_DIRECTORY descriptor of ``path`` (made 0700 if missing) once checked that nobody else can write in it
    or replace it; UserError (a configuration problem) if they can, FatalError if it cannot be made or opened."""
    fd = open_no_links(path, what)
    try:
        st = os.fstat(fd)
        if not _trusted_owner(st) or st.st_mode & 0o022:
            raise UserError(f"{what} {path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                            f"it must be owned by {'root' if os.geteuid() == 0 else f'root or uid {os.geteuid()}'} "
                            "and not writable by group or others")
        _check_parents(os.path.realpath(path), f"{what} {path}")
    except OSError as exc:  # a parent vanished or cannot be read while we looked
        os.close(fd)
        raise FatalError(f"{what} {path}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _flock(directory: Path, name: str, what: str) -> int:
    """The locked descriptor of ``directory/name`` with our pid in it; FatalError naming the holder if taken."""
    path = directory / name
    dfd = private_dir(directory, what)
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError as exc:
        why = "a symbolic link: refusing to follow it" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        raise FatalError(f"cannot lock {path}: {why}") from None
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FatalError(f"cannot lock {path}: not a regular file")
        os.fchmod(fd, 0o600)  # by descriptor, never by path: an old lock file with another mode is made private
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise FatalError(f"cannot lock {path}: {exc.strerror}") from None
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise FatalError(
            f"another cachepilot daemon is running (pid {ascii(holder)[1:-1]}, lock {path}); stop it first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class DaemonLock:
    """The state directory's lock and, with ``host`` (the daemon passes ``host_lock_path()``), the host's."""

    def __init__(self, directory: Path, host: Path | None = None) -> None:
        self.dir = directory
        self.path = directory / LOCK_NAME
        self.host = host
        self.fds: list[int] = []

    def acquire(self) -> None:
        """Host lock first (whatever the configuration, one daemon), then the state directory's; all or none."""
        try:
            if self.host is not None:
                self.fds.append(_flock(self.host.parent, self.host.name, "host lock directory"))
            self.fds.append(_flock(self.dir, LOCK_NAME, "state directory"))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        while self.fds:
            os.close(self.fds.pop())  # the files stay; the locks go with the descriptors
