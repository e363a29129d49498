"""The state file: what a restarted daemon needs to carry on (hot list, counters, recent decisions, the failure
latch, actions in flight), as one JSON document.

Written atomically: a temporary file in the same directory, fsync, rename over the old one, fsync of the directory,
so a crash leaves either the old or the new file, never a torn one. Bounded: at most ``MAX_HOT`` files per volume
and ``MAX_DECISIONS`` decisions, and the whole document at most ``MAX_BYTES`` (hot lists are cut further if
needed). A write that fails (a full disk) is counted and the daemon carries on. Reading a missing, unreadable or
corrupt file gives ``None`` and the reason, never an exception: the daemon then starts fresh with one warning.
The file is read with O_NOFOLLOW and written through safeio's one output path (a new temporary created
O_EXCL|O_NOFOLLOW in the directory checked by descriptor, renamed within it): a symbolic link is never followed
(see daemon/lock.py for the checks on the directory).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, Protocol

from cachepilot.errors import UserError
from cachepilot.safeio import NoSuchFile, read_capped, write_atomic

VERSION = 1
NO_STATE = "no state file at"  # a first start: nothing is wrong (persist logs it at INFO)
MAX_HOT = 4096  # files per volume in the hot list
MAX_DECISIONS = 200
MAX_BYTES = 4 << 20
STATE_NAME = "state.json"


class RawRows(Protocol):
    """A long list of rows kept as numpy columns until it is encoded (daemon/snapshot.py HotRows): ``json()`` gives
    the text json.dumps would make of it, built a few thousand rows at a time. Made into one Python list for the
    encoder, 65 536 rows of 1 M files on 16 volumes had left the writer thread's heap 8 MiB larger (issue 32)."""

    def __len__(self) -> int: ...

    def __getitem__(self, cut: slice) -> RawRows: ...

    def json(self) -> str: ...


def _encode(doc: dict[str, Any]) -> bytes:
    """``{"crc32":N,"state":BODY}``: the body encoded once and wrapped as json.dumps of the outer object (sorted
    keys, compact) would write it -- encoding it twice was a quarter of a state write with 1 M files. A RawRows
    value is encoded as a placeholder string, then replaced by its own text (the same bytes as its rows')."""
    raw: dict[str, RawRows] = {}
    nonce = os.urandom(8).hex()  # no string of the document's own can be taken for a placeholder

    def defer(obj: Any) -> str:
        if not hasattr(obj, "json"):
            raise TypeError(f"{type(obj).__name__} is not JSON serializable")
        token = f"\x00rows-{nonce}-{len(raw)}\x00"
        raw[json.dumps(token)] = obj
        return token

    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=defer)
    parts = []
    for token, rows in raw.items():  # in the order json.dumps met them
        before, text = text.split(token, 1)
        parts += [before.encode(), rows.json().encode()]
    parts.append(text.encode())
    crc = 0
    for p in parts:  # the body's checksum without joining it first (one copy of a 1.3 MiB document less)
        crc = zlib.crc32(p, crc)
    return b"".join([b'{"crc32":%d,"state":' % crc, *parts, b"}\n"])


def bound(doc: dict[str, Any], max_bytes: int = MAX_BYTES) -> bytes:
    """Encode, cutting hot lists (coldest last, so the tail goes) and decisions until it fits."""
    doc["decisions"] = doc.get("decisions", [])[-MAX_DECISIONS:]
    for v in doc.get("volumes", {}).values():
        v["hot"] = v.get("hot", [])[:MAX_HOT]
    data = _encode(doc)
    while len(data) > max_bytes:
        longest = max(doc.get("volumes", {}).values(), key=lambda v: len(v.get("hot", [])), default=None)
        if longest is None or not longest.get("hot"):
            doc["decisions"] = doc["decisions"][len(doc["decisions"]) // 2:] if doc["decisions"] else []
            if not doc["decisions"]:
                break
        else:
            longest["hot"] = longest["hot"][: len(longest["hot"]) // 2]
        data = _encode(doc)
    return data


class StateFile:
    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES) -> None:
        self.dir = directory
        self.path = directory / STATE_NAME
        self.max_bytes = max_bytes
        self.writes = 0
        self.failed_writes = 0
        self.last_error: str | None = None
        self.last_bytes = 0

    def write(self, doc: dict[str, Any]) -> bool:
        """Atomically replace the state file; False (counted, reason in last_error) if that failed."""
        doc = {**doc, "version": VERSION}
        data = bound(doc, self.max_bytes)
        try:  # a new temporary (O_EXCL|O_NOFOLLOW) renamed over the file within the checked directory (safeio)
            write_atomic(self.path, data, "state file", 0o600)
        except (OSError, UserError) as exc:
            self.failed_writes += 1
            self.last_error = f"{self.path}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            return False
        self.writes += 1
        self.last_error = None
        self.last_bytes = len(data)
        return True

    def read(self) -> tuple[dict[str, Any] | None, str]:
        """(state, "") or (None, why it cannot be used)."""
        try:  # the size is checked before the read: a FIFO, /dev/zero or a sparse 5 GiB file costs nothing
            raw = read_capped(self.path, "state file", self.max_bytes * 2, follow=False)  # a planted link: refused
        except NoSuchFile:
            return None, f"{NO_STATE} {self.path}"
        except UserError as exc:
            return None, str(exc)
        try:
            outer = json.loads(raw)
            doc = outer["state"]
            body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
            if zlib.crc32(body.encode()) != outer["crc32"]:
                return None, f"{self.path}: checksum mismatch (corrupt)"
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"{self.path}: corrupt ({type(exc).__name__}: {str(exc)[:80]})"
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            version = doc.get("version") if isinstance(doc, dict) else "?"
            return None, f"{self.path}: unsupported state version {version}"
        return doc, ""
