"""Hot lists handed to the daemon over the control socket (``cachepilot hotlist import``), from the server thread
to the loop: requests carry at most ``MAX_PER_REQUEST`` files each (the socket takes 4 KiB per request), the loop
hands them to the engine at its next tick (engine/handoff.py), and at most ``MAX_PENDING`` files wait at once (a
client that sends more is told to wait, not buffered)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from cachepilot.engine.engine import Engine
from cachepilot.errors import UserError
from cachepilot.hotlist import MAX_PER_REQUEST

log = logging.getLogger("cachepilot")

MAX_PENDING = 1 << 17
U32 = 0xFFFFFFFF
U63 = (1 << 63) - 1
Entry = tuple[int, int, int, int]  # (ino, gen, score, size)


def _entry(e: Any) -> Entry:
    if not isinstance(e, list) or len(e) != 4 or any(isinstance(x, bool) or not isinstance(x, int) for x in e):
        raise UserError("files: each entry is [inode, generation, score, size] (integers)")
    ino, gen, score, size = e
    if not (0 < ino <= U63 and 0 <= gen <= U32 and 0 < score <= U32 and 0 <= size <= U63):
        raise UserError("files: an entry out of range")
    return ino, gen, score, size


class Imports:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[str, list[Entry]]] = []
        self._count = 0

    def add(self, name: str, files: Any) -> int:
        """Called on the server thread; the number of files queued."""
        if not isinstance(files, list) or len(files) > MAX_PER_REQUEST:
            raise UserError(f"files: a list of at most {MAX_PER_REQUEST} entries")
        entries = [_entry(e) for e in files]
        with self._lock:
            if self._count + len(entries) > MAX_PENDING:
                raise UserError(f"busy: {self._count} imported files wait for the loop; try again in a second")
            self._pending.append((name, entries))
            self._count += len(entries)
        return len(entries)

    def apply(self, engine: Engine) -> None:
        """On the loop thread: the waiting lists into the engine's promotion queues."""
        with self._lock:
            pending, self._pending, self._count = self._pending, [], 0
        for name, entries in pending:
            try:
                queued, left = engine.import_hot(name, entries)
            except UserError as exc:  # the volume went away since
                log.warning("hot-list import: %s", exc)
                continue
            log.info("%s: hot-list import: %d file(s) queued for re-warming, %d not queued"
                     " (sieved, below the admission bar, or already held)", name, queued, left)
