"""The hot-list file of a warm handoff (``cachepilot hotlist export`` / ``import``): a volume's hot files by path,
so that another host -- or this one after its cache device was replaced -- can re-warm a cache before its own misses
would.

Format (one JSON object, ASCII: names that are not UTF-8 travel as ``\\udcXX`` surrogate escapes)::

    {"format": "cachepilot-hotlist", "version": 1, "volume": "bcache0", "fs_uuid": "...", "exported": 1764160000.0,
     "files": [{"path": "db/a", "size": 65536, "gen": 123, "mtime_ns": 1764..., "score": 4096}, ...]}

``files`` hottest first, paths relative to the mount point. Bounded: at most ``MAX_FILES`` files and
``MAX_FILE_BYTES`` bytes; anything else is refused with one line naming the file and the entry.

Matching on the receiving side (``match``): a file is the exported one when its generation and size are equal (the
same filesystem, e.g. a volume moved between hosts, or a block-level copy); a copy made file by file (rsync -a,
tar) has new inodes and generations, so size and modification time equal is taken as the same content. Anything
else is skipped as changed; a path that is not there (or not a regular file, or reached through a symbolic link)
is skipped as unknown.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from cachepilot.errors import UserError
from cachepilot.fsfiles import FileId, GenFn, generation, resolve
from cachepilot.safeio import json_items

FORMAT = "cachepilot-hotlist"
VERSION = 1
MAX_FILES = 65_536
MAX_FILE_BYTES = 32 << 20
MAX_PER_REQUEST = 128  # files per control-socket request of an import (its 4 KiB)
MAX_PATH = 4096
FIELDS = 5  # of a file entry
MAX_ITEMS = MAX_FILES * (FIELDS + 1) + 64  # JSON items in all, counted before anything is built (safeio.json_items)
U32 = 0xFFFFFFFF
U63 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class HotFile:
    path: str
    size: int
    gen: int
    mtime_ns: int
    score: int


@dataclass(frozen=True)
class HotList:
    volume: str
    fs_uuid: str
    exported: float
    files: tuple[HotFile, ...]

    def dumps(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "volume": self.volume, "fs_uuid": self.fs_uuid,
                           "exported": self.exported,
                           "files": [{"path": f.path, "size": f.size, "gen": f.gen, "mtime_ns": f.mtime_ns,
                                      "score": f.score} for f in self.files]}, indent=0) + "\n"


def _int(v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"not an integer in [{lo}, {hi}]: {str(v)[:40]!r}")
    return v


def _file(i: int, e: Any) -> HotFile:
    if not isinstance(e, dict):
        raise ValueError("not an object")
    path = e.get("path")
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise ValueError(f"path: a relative path of at most {MAX_PATH} characters")
    if path.startswith("/") or "\x00" in path or any(c in ("", ".", "..") for c in path.split("/")):
        raise ValueError(f"path: {path[:60]!r} is not relative to the mount point (absolute, NUL, '.' or '..')")
    return HotFile(path, _int(e.get("size"), 0, U63), _int(e.get("gen"), 0, U32), _int(e.get("mtime_ns"), 0, U63),
                   _int(e.get("score"), 1, U32))


def parse(raw: bytes, source: str) -> HotList:
    """A hot-list file's content, validated; UserError naming the file and the first bad entry."""
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(f"{source}: hot list larger than {MAX_FILE_BYTES >> 20} MiB")
    items = json_items(raw)
    if items > MAX_ITEMS:  # 32 MiB of {} took 870 MB to refuse once parsed
        raise UserError(f"{source}: not a hot-list file: {items} JSON values, more than {MAX_FILES} files of "
                        f"{FIELDS} fields hold")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{source}: not a hot-list file (not JSON: {str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UserError(f"{source}: not a hot-list file (no \"format\": \"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise UserError(f"{source}: unsupported hot-list version {str(doc.get('version'))[:20]!r} "
                        f"(this cachepilot reads {VERSION})")
    files = doc.get("files")
    if not isinstance(files, list):
        raise UserError(f"{source}: files: not a list")
    if len(files) > MAX_FILES:
        raise UserError(f"{source}: {len(files)} files (at most {MAX_FILES})")
    out = []
    for i, e in enumerate(files):
        try:
            out.append(_file(i, e))
        except ValueError as exc:
            raise UserError(f"{source}: files[{i}]: {exc}") from None
    exported = doc.get("exported", 0)
    return HotList(str(doc.get("volume", ""))[:256], str(doc.get("fs_uuid", ""))[:64],
                   float(exported) if isinstance(exported, int | float) and not isinstance(exported, bool) else 0.0,
                   tuple(out))


# ------------------------------------------------------------------ export: (inode, generation) -> path
def path_of(mount: str, ino: int, gen: int, gen_fn: GenFn = generation) -> FileId | None:
    """The file (inode, generation) of the filesystem mounted at ``mount``, by path relative to it (one of its
    names, if it has several), checked by resolving that path back; None if it is gone or has no name there.
    Needs CAP_DAC_READ_SEARCH (open_by_handle_at)."""
    from cachepilot.handles import open_by_handle

    try:
        mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fd = open_by_handle(mfd, ino, gen, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(mfd)
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    finally:
        os.close(fd)
    root = mount.rstrip("/") + "/"
    if not where.startswith(root):
        return None  # deleted (" (deleted)"), or reachable only outside this mount's root
    fid = resolve(mount, where[len(root):], gen_fn)
    return fid if fid is not None and fid.ino == ino and fid.gen == gen else None


def export(volume: str, fs_uuid: str, mount: str, hot: Iterable[Any], gen_fn: GenFn = generation,
           locate: Any = path_of) -> tuple[HotList, int]:
    """The hot list of the state file's ``hot`` entries ([ino, gen, score, size], hottest first) by path; (list,
    entries left out: gone, renamed out of reach or unreadable)."""
    files: list[HotFile] = []
    lost = 0
    for item in list(hot)[:MAX_FILES]:
        try:
            ino, gen, score, _size = (int(x) for x in item)
        except (TypeError, ValueError):
            lost += 1
            continue
        fid = locate(mount, ino, gen, gen_fn)
        if fid is None or score <= 0:
            lost += 1
            continue
        files.append(HotFile(fid.path, fid.size, fid.gen, fid.mtime_ns, min(score, U32)))
    return HotList(volume, fs_uuid, time.time(), tuple(files)), lost


# ------------------------------------------------------------------ import: path -> (inode, generation)
@dataclass
class Matched:
    files: list[tuple[int, int, int, int]] = field(default_factory=list)  # (ino, gen, score, size), hottest first
    by_generation: int = 0
    by_mtime: int = 0
    unknown: int = 0
    changed: int = 0


    def add(self, other: Matched) -> None:
        """Count ``other`` in (its files are not kept)."""
        self.by_generation += other.by_generation
        self.by_mtime += other.by_mtime
        self.unknown += other.unknown
        self.changed += other.changed


def match_in_parts(hl: HotList, mount: str, part: int, gen_fn: GenFn = generation) -> Iterator[Matched]:
    """``match`` of ``part`` files at a time, in the list's order (hottest first)."""
    for i in range(0, len(hl.files), max(1, part)):
        yield match(replace(hl, files=hl.files[i:i + part]), mount, gen_fn)


def match(hl: HotList, mount: str, gen_fn: GenFn = generation) -> Matched:
    """Each listed file resolved under ``mount`` and checked (module doc)."""
    m = Matched()
    for f in hl.files:
        fid = resolve(mount, f.path, gen_fn)
        if fid is None:
            m.unknown += 1
        elif fid.gen == f.gen and fid.size == f.size:
            m.by_generation += 1
            m.files.append((fid.ino, fid.gen, f.score, fid.size))
        elif fid.size == f.size and fid.mtime_ns == f.mtime_ns:
            m.by_mtime += 1
            m.files.append((fid.ino, fid.gen, f.score, fid.size))
        else:
            m.changed += 1
    return m
