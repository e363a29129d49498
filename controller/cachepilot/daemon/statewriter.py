"""The state file written off the loop thread: the loop builds the document (its own copies, read from the engine on
the loop thread) and hands it over; one writer thread encodes it, checksums it and replaces the file (write, fsync,
rename, fsync of the directory: daemon/state.py).

Why: with 1 M tracked files the document is 1.3 MiB of JSON, and its encoding plus two fsyncs made the tick that
wrote it the slowest of all (issue 32: tick p99 <= 100 ms with 1 M files; the fsyncs wait on the disk, whatever the
CPU). The loop never waits for a write in progress: a newer document replaces one not yet taken, and an older one
never lands after a newer one (each has a sequence number; the file is written under one lock, and only if no
newer one was written first). A write that must be done when the call returns -- the last one at stop, or one a
test asks for -- goes through :meth:`write_now`. How each write ended is handed back to the loop thread
(:meth:`results`), which counts it: the counters are only ever changed on the loop thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cachepilot.daemon.state import StateFile

Prepare = Callable[[dict[str, Any]], dict[str, Any]]

JOIN_S = 10.0  # close(): a write in progress is left to finish this long (a hung disk must not hang the stop)


class StateWriter:
    def __init__(self, state: StateFile) -> None:
        self.state = state
        self._cv = threading.Condition()
        self._pending: tuple[int, dict[str, Any], Prepare | None] | None = None  # the newest handed over, not taken
        self._seq = 0  # the last sequence number given out
        self._written = 0  # the newest written (or tried); an older one is dropped
        self._write_lock = threading.Lock()  # one StateFile.write at a time
        self._done: deque[tuple[bool, str | None]] = deque()  # (ok, error) of each write, for the loop thread
        self._closed = False
        self._thread: threading.Thread | None = None
        self.last_write_ns = 0  # how long the last write took (encode, checksum, write, fsyncs, rename)

    def submit(self, doc: dict[str, Any], prepare: Prepare | None = None) -> None:
        """Hand ``doc`` over (it is the writer's from now on; ``prepare`` finishes it on the writer thread); returns
        at once."""
        with self._cv:
            if self._closed:
                raise RuntimeError("state writer closed")
            self._seq += 1
            self._pending = (self._seq, doc, prepare)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cachepilot-state", daemon=True)
                self._thread.start()
            self._cv.notify()

    def write_now(self, doc: dict[str, Any]) -> bool:
        """Write ``doc`` before returning (waiting for a write in progress); a document handed over earlier and not
        written yet never lands after it."""
        with self._cv:
            self._seq += 1
            seq = self._seq
            self._pending = None
        return self._write(seq, doc)

    @property
    def busy(self) -> bool:
        """A document waits or is being written."""
        return self._pending is not None or self._write_lock.locked()

    def results(self) -> list[tuple[bool, str | None]]:
        """How the writes since the last call ended: (ok, error)."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def close(self, timeout: float = JOIN_S) -> None:
        """Write what is pending, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closed:
                    self._cv.wait()
                if self._pending is None:
                    return
                seq, doc, prepare = self._pending
                self._pending = None
            try:
                self._write(seq, doc if prepare is None else prepare(doc))
            except Exception as exc:  # a bug: said as a failed write (counted, logged once), the thread goes on
                self._done.append((False, f"state writer bug: {type(exc).__name__}: {exc}"))
            del doc  # not held while waiting for the next one (1.3 MiB of JSON and its lists with 1 M files)

    def _write(self, seq: int, doc: dict[str, Any]) -> bool:
        with self._write_lock:
            if seq < self._written:  # a newer one is on disk already
                return True
            self._written = seq
            t0 = time.monotonic_ns()
            ok = self.state.write(doc)
            self.last_write_ns = time.monotonic_ns() - t0
            self._done.append((ok, self.state.last_error))
        return ok
