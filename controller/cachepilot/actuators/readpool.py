"""Promotion reads in background threads, several files at once.

A promotion read of a file the cache lacks is a read of the origin: on a slow origin its latency, not its
bandwidth, bounds a reader that waits for each read before the next. Measured in the lab (dm-cache, origin +20 ms):
the loop's reads, one at a time within their 250 ms of each second, placed ~7 files of 64 KiB a second, and an
imported hot list of 949 files was still being read 36 s into the workload it was meant to prepare for. Here each
file's chunks are read by one of ``workers`` threads (in the order the promoter planned them: a file's reads never
continue one another), so up to ``workers`` files are read at once and the daemon's loop never waits on the origin.
The threads only read and close the descriptor they are handed; every count and decision stays on the loop, which
collects a file's result the next time it looks at that file (``poll``).
"""

from __future__ import annotations

import mmap
import os
import resource
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

Key = tuple[int, int, int]  # (dev, ino, gen)
Chunk = tuple[int, int, int]  # (physical, logical, length)
Done = tuple[list[tuple[int, int]], int]  # ((logical, length) read, the clock when the last read ended)

MAX_CHUNK = 256 << 10
MAX_INFLIGHT = 256  # files handed over and not yet collected (each holds a descriptor until it is read)


def inflight_limit() -> int:
    """At most MAX_INFLIGHT, and a quarter of the descriptors the process may open."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_INFLIGHT if soft == resource.RLIM_INFINITY else max(1, min(MAX_INFLIGHT, soft // 4))


def read_chunks(fd: int, chunks: list[Chunk], clock: Callable[[], int]) -> Done:
    """Read ``chunks`` of ``fd`` in order (O_DIRECT: a page-aligned buffer); closes ``fd``."""
    buf = mmap.mmap(-1, MAX_CHUNK)
    done: list[tuple[int, int]] = []
    try:
        for _, logical, n in chunks:
            os.preadv(fd, [memoryview(buf)[:n]], logical)
            done.append((logical, n))
    finally:
        buf.close()
        os.close(fd)
    return done, clock()


class ReadPool:
    """The files being read in the background, by identity, with the chunks left for later."""

    def __init__(self, workers: int, clock: Callable[[], int]) -> None:
        self.workers = max(1, workers)
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="cachepilot-promote")
        self._inflight: dict[Key, tuple[Future[Done], list[Chunk]]] = {}
        self.limit = max(self.workers, inflight_limit())

    def busy(self, key: Key) -> bool:
        return key in self._inflight

    def full(self) -> bool:
        """The loop collects results once a tick, so this many files a tick at most (in the lab, with at most 32
        at a time, an imported list was still being re-warmed 24 s into the workload); each holds a descriptor
        until it is read."""
        return len(self._inflight) >= self.limit

    def submit(self, key: Key, fd: int, chunks: list[Chunk], rest: list[Chunk]) -> None:
        """Read ``chunks`` of the open ``fd`` (closed when read); ``rest``: what the budget left for later."""
        self._inflight[key] = (self._pool.submit(read_chunks, fd, chunks, self.clock), rest)

    def poll(self, key: Key) -> tuple[Done | OSError, list[Chunk]] | None:
        """The finished read of ``key`` (its result or its error) and the chunks left, taken off the pool; None
        while it runs or when nothing runs for it."""
        got = self._inflight.get(key)
        if got is None or not got[0].done():
            return None
        del self._inflight[key]
        fut, rest = got
        exc = fut.exception()
        if exc is not None:
            if isinstance(exc, OSError):
                return exc, rest
            raise exc
        return fut.result(), rest

    def wait(self) -> None:
        """Until every read has ended (tests; the daemon's stop)."""
        for fut, _ in list(self._inflight.values()):
            fut.exception()
