"""Files of a mounted filesystem named by path, turned into the identities the engine uses (inode, generation),
safely: pinning walks the directories its patterns name (``walk``), a hot-list import resolves one relative path at
a time (``resolve``).

Never leaves the mount: every component is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a
symbolic link is never followed, in or out of the mount) and a directory on another filesystem (a mount below this
one) is not entered. Bounded: a walk visits at most ``max_entries`` directory entries and stops at ``deadline_s``,
saying so; names are kept as the kernel gives them (bytes through surrogate escapes) and escaped only for display.
The generation comes from ``FS_IOC_GETVERSION`` (ext4, xfs: the inode's i_generation, what the probe reports).
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cachepilot.policy.pinpaths import Pattern, walk_roots

FS_IOC_GETVERSION = 0x80087601
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_WALK_ENTRIES = 200_000
WALK_DEADLINE_S = 5.0


@dataclass(frozen=True, slots=True)
class FileId:
    path: str  # relative to the mount point, '/'-separated (surrogate escapes for undecodable bytes)
    ino: int
    gen: int
    size: int
    mtime_ns: int


def generation(fd: int) -> int:
    """The inode's generation (OSError where the filesystem has none to give)."""
    buf = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETVERSION, buf, True)
    return struct.unpack("=q", buf)[0] & 0xFFFFFFFF


GenFn = Callable[[int], int]


def identify(dir_fd: int, name: str, rel: str, gen_fn: GenFn = generation) -> FileId | None:
    """The identity of a regular file ``name`` in ``dir_fd``; None if it is not one (or vanished, or has no
    generation). What it is is asked first (``lstat``): a FIFO or device node is never opened to find out (an open
    wakes a FIFO's writer, a tape rewinds); the ``fstat`` after the open catches a swap in between."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return FileId(rel, st.st_ino, gen_fn(fd), st.st_size, st.st_mtime_ns)
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_dir(parent: int, name: str, dev: int) -> int | None:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    if os.fstat(fd).st_dev != dev:  # another filesystem mounted here: not this volume's
        os.close(fd)
        return None
    return fd


def resolve(mount: str, rel: str, gen_fn: GenFn = generation) -> FileId | None:
    """The file at ``rel`` under ``mount`` (no component a symbolic link, none on another filesystem); None if
    there is no such regular file."""
    parts = rel.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        return None
    try:
        root = os.open(mount, DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return None
    fd = root
    try:
        dev = os.fstat(root).st_dev
        for p in parts[:-1]:
            nxt = _open_dir(fd, p, dev)
            if fd != root:
                os.close(fd)
            fd = -1
            if nxt is None:
                return None
            fd = nxt
        return identify(fd, parts[-1], rel, gen_fn)
    finally:
        if fd not in (-1, root):
            os.close(fd)
        os.close(root)


@dataclass
class WalkResult:
    files: list[FileId]
    entries: int = 0
    truncated: str = ""  # why the walk stopped early ("" = complete)


class _Budget:
    def __init__(self, max_entries: int, deadline_s: float, clock: Callable[[], float]) -> None:
        self.left, self.clock = max_entries, clock
        self.until = clock() + deadline_s
        self.max_entries, self.deadline_s = max_entries, deadline_s
        self.why = ""

    def spend(self) -> bool:
        self.left -= 1
        if self.left < 0:
            self.why = f"more than {self.max_entries} directory entries"
        elif self.left % 256 == 0 and self.clock() > self.until:
            self.why = f"longer than {self.deadline_s:g} s"
        return not self.why


def walk(mount: str, pats: tuple[Pattern, ...], *, max_files: int, max_entries: int = MAX_WALK_ENTRIES,
         deadline_s: float = WALK_DEADLINE_S, gen_fn: GenFn = generation,
         clock: Callable[[], float] = time.monotonic) -> WalkResult:
    """The regular files under ``mount`` that a pattern selects, in walk order (sorted names, depth first), at most
    ``max_files``; bounded as the module says."""
    out = WalkResult([])
    budget = _Budget(max_entries, deadline_s, clock)
    try:
        root = os.open(mount, DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError as exc:
        out.truncated = f"cannot open {mount}: {exc.strerror}"
        return out
    try:
        dev = os.fstat(root).st_dev
        for r in walk_roots(pats):
            for fid in _walk_root(root, dev, r, pats, budget, gen_fn):
                out.files.append(fid)
                if len(out.files) >= max_files:
                    budget.why = budget.why or f"more than {max_files} files"
                    break
            if budget.why:
                break
    finally:
        os.close(root)
    out.entries = budget.max_entries - max(0, budget.left)
    out.truncated = budget.why
    return out


def _walk_root(root: int, dev: int, r: tuple[str, ...], pats: tuple[Pattern, ...], budget: _Budget,
               gen_fn: GenFn) -> Iterator[FileId]:
    """Files under the root ``r`` (or ``r`` itself, a file) that a pattern selects."""
    fd = root
    owned: list[int] = []
    try:
        for i, p in enumerate(r):
            nxt = _open_dir(fd, p, dev)
            if nxt is None:
                if i == len(r) - 1 and any(pt.matches(r) for pt in pats):
                    fid = identify(fd, p, "/".join(r), gen_fn)  # a pattern naming one file
                    if fid is not None:
                        yield fid
                return
            owned.append(nxt)
            fd = nxt
        yield from _walk_dir(fd, dev, r, pats, budget, gen_fn)
    finally:
        for o in owned:
            os.close(o)


def _walk_dir(top: int, dev: int, prefix: tuple[str, ...], pats: tuple[Pattern, ...], budget: _Budget,
              gen_fn: GenFn) -> Iterator[FileId]:
    """Depth first with an explicit stack of open directories (no recursion; one descriptor and one streaming
    directory reader per level, so a directory of millions of names costs no memory, only budget)."""
    stack: list[tuple[int, tuple[str, ...], Any]] = []
    _push(stack, top, prefix)
    try:
        while stack and not budget.why:
            fd, where, it = stack[-1]
            entry = next(it, None)
            if entry is None:
                stack.pop()
                _close(fd, it, top)
                continue
            if not budget.spend():
                break
            parts = (*where, entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_dev == dev and _may_hold(parts, pats):
                sub = _open_dir(fd, entry.name, dev)
                if sub is not None:
                    _push(stack, sub, parts)
            elif stat.S_ISREG(st.st_mode) and any(p.matches(parts) for p in pats):
                fid = identify(fd, entry.name, "/".join(parts), gen_fn)
                if fid is not None:
                    yield fid
    finally:
        for fd, _, it in stack:
            _close(fd, it, top)


def _push(stack: list[tuple[int, tuple[str, ...], Any]], fd: int, where: tuple[str, ...]) -> None:
    it: Any
    try:
        it = os.scandir(fd)
    except OSError:
        it = iter(())
    stack.append((fd, where, it))


def _close(fd: int, it: Any, top: int) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    if fd != top:
        os.close(fd)


def _may_hold(parts: tuple[str, ...], pats: tuple[Pattern, ...]) -> bool:
    """Could a file under the directory ``parts`` match a pattern? (prunes the walk to the patterns' shape)"""
    for p in pats:
        if not p.glob:
            n = min(len(parts), len(p.parts))
            if parts[:n] == p.parts[:n]:
                return True
        elif len(parts) < len(p.parts) and Pattern(p.parts[:len(parts)], True).matches(parts):
            return True
    return False
