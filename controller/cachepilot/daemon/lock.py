"""One daemon per host: an exclusive flock on a file in the state directory, holding the owner's pid.

flock is released by the kernel when the process dies (even by SIGKILL), so a stale file never blocks a restart;
the pid inside is only for the message that names the running daemon."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from cachepilot.errors import FatalError

LOCK_NAME = "cachepilot.lock"


class DaemonLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise FatalError(f"cannot lock {self.path}: {exc.strerror}") from None
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise FatalError(
                f"another cachepilot daemon is running (pid {holder}, lock {self.path}); stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the file stays; the lock goes with the descriptor
            self.fd = None
