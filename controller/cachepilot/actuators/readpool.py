"""Promotion reads in background threads, several files at once, each paced at the promotion rate.

A promotion read of a file the cache lacks is a read of the origin: on a slow origin its latency, not its
bandwidth, bounds a reader that waits for each read before the next. Measured in the lab (dm-cache, origin +20 ms):
the loop's reads, one at a time within their 250 ms of each second, placed ~7 files of 64 KiB a second, and an
imported hot list of 949 files was still being read 36 s into the workload it was meant to prepare for. Here each
file's chunks are read by one of ``workers`` threads (in the order the promoter planned them: a file's reads never
continue one another), so up to ``workers`` files are read at once and the daemon's loop never waits on the origin.

A file is handed over whole: the thread reads at once what the promoter's bucket held for it, and the rest one chunk
at a time at the promotion rate (a :class:`Pacer`, one chunk of at most the bucket's burst ready at a time: on
bcache no more than its allocator keeps ready). Before, the loop handed over one burst a tick and collected it the
next: on bcache (burst cache/1024, 256 KiB on a 256 MiB cache) a 16 MiB file took ~60 s in the lab, whatever the
rate said (issue 37). The threads only read and close the descriptor they are handed; every count and decision
stays on the loop, which collects a file's result the next time it looks at that file (``poll``). ``close`` stops
the threads between two chunks (the daemon's stop, a volume that vanished): a paced read of a large file is
minutes long at a low rate.
"""

from __future__ import annotations

import logging
import mmap
import os
import resource
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from cachepilot.actuators.taskruns import shed_run_history

log = logging.getLogger("cachepilot.actuators.readpool")

Key = tuple[int, int, int]  # (dev, ino, gen)
Chunk = tuple[int, int, int]  # (physical, logical, length)

MAX_CHUNK = 256 << 10
MAX_INFLIGHT = 256  # files handed over and not yet collected (each holds a descriptor until it is read)
CLOSE_WAIT_S = 2.0  # how long close waits for the reads in flight (each stops before its next chunk)


@dataclass(frozen=True)
class Done:
    """A finished (or stopped) read: what was read (logical, length), the clock when its last read ended, and the
    chunks it did not read (stopped before them)."""

    read: list[tuple[int, int]]
    ended: int
    unread: list[Chunk]


def inflight_limit() -> int:
    """At most MAX_INFLIGHT, and a quarter of the descriptors the process may open."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_INFLIGHT if soft == resource.RLIM_INFINITY else max(1, min(MAX_INFLIGHT, soft // 4))


class Pacer:
    """One read's token bucket: it starts with ``tokens`` bytes (what the promoter's bucket held when it handed the
    file over, beyond the chunks read at once), fills at ``rate()`` bytes a second up to ``cap()`` (both read at each
    chunk: on bcache the rate follows the allocator's refusals). ``take`` waits until a chunk fits."""

    def __init__(self, tokens: float, rate: Callable[[], float], cap: Callable[[], int],
                 clock: Callable[[], int]) -> None:
        self.rate, self.cap, self.clock = rate, cap, clock
        self._tokens = float(tokens)
        self._last = clock()
        self._lock = threading.Lock()  # the loop empties it (refused inserts) while the thread takes from it

    def take(self, n: int, sleep: Callable[[float], bool]) -> bool:
        """Wait until ``n`` bytes fit, take them; False if ``sleep`` said stop first (it returns True to stop)."""
        while True:
            with self._lock:
                now = self.clock()
                rate = max(1.0, float(self.rate()))
                cap = max(float(self.cap()), float(n))  # a chunk larger than the cap still goes, alone
                self._tokens = min(cap, self._tokens + (now - self._last) / 1e9 * rate)
                self._last = now
                if self._tokens >= n:
                    self._tokens -= n
                    return True
                short = (n - self._tokens) / rate
            if sleep(short):
                return False

    def empty(self) -> None:
        """The allocator has nothing ready now (bcache refused inserts): what it held waits for the rate again."""
        with self._lock:
            self._tokens = min(self._tokens, 0.0)


@dataclass
class _Read:
    """One file handed over: its future, the action it was handed for, its descriptor (closed by the thread, or by
    ``close`` if the thread never started), its pacer, and the paced chunks started so far (the loop tells bcache's
    back-off about each once, ``started``)."""

    fut: Future[Done]
    owner: Any
    fd: int
    pacer: Pacer
    paced: list[tuple[int, int]] = field(default_factory=list)
    told: int = 0


class ReadPool:
    """The files being read in the background, by identity."""

    def __init__(self, workers: int, clock: Callable[[], int],
                 sleep: Callable[[float], bool] | None = None, shed_runs: bool = False) -> None:
        """``sleep(seconds)``: a pacer's wait, True when the pool is stopping (default: on the stop event).
        ``shed_runs``: each thread sheds the bcache run history it inherited before its first read (taskruns)."""
        self.workers = max(1, workers)
        self.shed_runs = shed_runs
        self.clock = clock
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="cachepilot-promote")
        self._inflight: dict[Key, _Read] = {}
        self.limit = max(self.workers, inflight_limit())

    def busy(self, key: Key) -> bool:
        return key in self._inflight

    def owner(self, key: Key) -> Any:
        """The action ``key``'s read was handed over for (None: nothing runs for it)."""
        r = self._inflight.get(key)
        return None if r is None else r.owner

    def full(self) -> bool:
        """The loop collects results once a tick, so this many files a tick at most (in the lab, with at most 32
        at a time, an imported list was still being re-warmed 24 s into the workload); each holds a descriptor
        until it is read."""
        return len(self._inflight) >= self.limit

    def submit(self, key: Key, owner: Any, fd: int, chunks: list[Chunk], pacer: Pacer, at_once: int) -> None:
        """Read ``chunks`` of the open ``fd`` (closed when read) for ``owner`` (an action): the first ``at_once``
        of them without waiting (the promoter's bucket held them), the rest as ``pacer`` lets them go."""
        if self._stop.is_set():
            os.close(fd)
            raise RuntimeError("the read pool is closed")
        r = _Read(Future(), owner, fd, pacer)
        r.fut = self._pool.submit(self._read, r, chunks, at_once)
        self._inflight[key] = r

    def started(self, key: Key) -> list[tuple[int, int]]:
        """The paced chunks (logical, length) of ``key``'s read that started since the last call (the loop's)."""
        r = self._inflight.get(key)
        if r is None:
            return []
        n = len(r.paced)  # the thread only appends
        new, r.told = r.paced[r.told:n], n
        return new

    def reading(self) -> list[tuple[Key, Any]]:
        """Every read in flight: (key, owner)."""
        return [(k, r.owner) for k, r in self._inflight.items()]

    def empty_pacers(self) -> None:
        for r in self._inflight.values():
            r.pacer.empty()

    def poll(self, key: Key) -> tuple[Done | OSError, list[tuple[int, int]]] | None:
        """The finished read of ``key`` (its result or its error) and its paced chunks not told yet, taken off the
        pool; None while it runs or when nothing runs for it."""
        r = self._inflight.get(key)
        if r is None or not r.fut.done():
            return None
        untold = self.started(key)
        del self._inflight[key]
        exc = r.fut.exception()
        if exc is not None:
            if isinstance(exc, OSError):
                return exc, untold
            raise exc
        return r.fut.result(), untold

    def _read(self, r: _Read, chunks: list[Chunk], at_once: int) -> Done:
        """Read ``chunks`` in order (O_DIRECT: a page-aligned buffer), the first ``at_once`` without waiting, then
        each when the pacer lets it go; stops before a chunk once the pool is closing. Closes the descriptor."""
        buf = mmap.mmap(-1, MAX_CHUNK)
        done: list[tuple[int, int]] = []
        try:
            if self.shed_runs and chunks and not self._stop.is_set():
                shed_run_history(r.fd, buf, chunks[0][1])
            for _, logical, n in chunks:
                if self._stop.is_set():
                    break
                if len(done) >= at_once:
                    if not r.pacer.take(n, self.sleep):
                        break
                    r.paced.append((logical, n))
                os.preadv(r.fd, [memoryview(buf)[:n]], logical)
                done.append((logical, n))
        finally:
            buf.close()
            os.close(r.fd)
        return Done(done, self.clock(), chunks[len(done):])

    def wait(self) -> None:
        """Until every read has ended (tests)."""
        for r in list(self._inflight.values()):
            r.fut.exception()

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Stop: no chunk starts any more (a pacer's wait ends at once); reads not started are cancelled (their
        descriptors closed here). True if every thread ended within ``timeout`` seconds (one read of a chunk on a
        live device); False is logged: a read stuck on a device that went away (the process still exits: the
        thread ends when the kernel fails the read)."""
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        reads, self._inflight = list(self._inflight.values()), {}
        started = []
        for r in reads:
            if r.fut.cancelled():  # never started (concurrent.futures.wait would wait for it: not "notified")
                os.close(r.fd)
            else:
                started.append(r.fut)
        _, running = wait_futures(started, timeout=timeout)
        if running:
            log.warning("%d promotion read(s) still running %.1f s after the stop (a device not answering)",
                        len(running), timeout)
        return not running
