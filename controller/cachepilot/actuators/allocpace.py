"""Promotion pacing on bcache's allocator: slow down when read-miss inserts are refused.

bcache inserts a read miss only into a bucket that is ready now (``bch_alloc_sectors`` -> ``bch_bucket_alloc`` with
wait false): when the free list is empty the read is served but not cached and the tracepoint
``bcache:bcache_alloc_fail`` fires. A promotion read that lands then is a read for nothing. The probe counts the
failures per cache device (bpf/bcache.bpf.h); once a tick this rule looks at the count of the volume's cache:

- AIMD rate: a tick that saw failures halves the promoter's rate (down to ``floor``); a tick without adds back
  ``max_rate / recover_s`` per second, up to the policy's rate. The allocator refills its free list as fast as
  invalidation and garbage collection let it, which nothing in sysfs tells: probing for it the way TCP probes for
  bandwidth keeps the losses small without a model of the allocator.
- One re-read: the promotions read since the look before last, in a tick that saw failures, are read once more
  (which of their chunks lost the insert is not known; a re-read that hits costs the cache device a read, one that
  misses is inserted now). The look before last too, because a failure can be counted a look after the read that
  met it (the insert follows the read's completion; the lab saw 4 failures and nothing to re-read once). A re-read
  is never re-read again.

Measured in the lab before this rule (8 MiB promoted into a 1 024-bucket cache): unlimited rate lost 1 311 KiB to
23 failures, 4 MiB/s 883 KiB, 2 MiB/s 369 KiB, 1 MiB/s 154 KiB.
"""

from __future__ import annotations

from cachepilot.actions import Promote

REREAD = "re-read once: bcache refused inserts (bcache_alloc_fail) while it was read"
RECOVER_S = 30.0  # seconds without failures from the floor back to the full rate (additive increase)


class AllocBackoff:
    """The AIMD promotion rate of one volume on bcache, and the promotions to read again."""

    def __init__(self, max_rate: int, *, floor: int, recover_s: float = RECOVER_S) -> None:
        self.max_rate = max(1, max_rate)
        self.floor = max(1, min(floor, self.max_rate))
        self.step = self.max_rate / max(recover_s, 1e-3)  # bytes/s added back per second without failures
        self.rate = float(self.max_rate)
        self.failures_total = 0  # failures seen on the volume's cache since the daemon started
        self.rereads_total = 0  # promotions read again
        self._seen: int | None = None  # the probe's cumulative count at the last look
        self._last_ns: int | None = None
        self._read: list[Promote] = []  # read since the last look (re-reads excluded)
        self._before: list[Promote] = []  # read between the look before last and the last, in a quiet tick

    def read(self, action: Promote, ranges: tuple[tuple[int, int], ...]) -> None:
        """The promoter read ``ranges`` of ``action``'s file."""
        if ranges and not action.reason.startswith(REREAD):
            self._read.append(Promote(action.volume, action.dev, action.ino, action.gen, ranges,
                                      f"{REREAD}; was: {action.reason}"))

    def observe(self, count: int, now_ns: int) -> list[Promote]:
        """The probe's cumulative failure count for the volume's cache now: adjust the rate; return the
        promotions to read once more (those read since the last look, if it saw failures)."""
        seen = self._seen if self._seen is not None else 0
        new = count - seen if count >= seen else count  # a smaller count: the probe was loaded again
        self._seen = count
        dt = 0.0 if self._last_ns is None else max(0.0, (now_ns - self._last_ns) / 1e9)
        self._last_ns = now_ns
        read, self._read = self._read, []
        if new <= 0:
            self._before = read  # a failure counted at the next look still finds them
            self.rate = min(float(self.max_rate), self.rate + self.step * dt)
            return []
        read, self._before = self._before + read, []
        self.failures_total += new
        self.rate = max(float(self.floor), self.rate / 2)
        again = _by_file(read)
        self.rereads_total += len(again)
        return again


def _by_file(read: list[Promote]) -> list[Promote]:
    """One re-read a file: a file read in parts since the last look (a paced reader's chunks, told as they start)
    is read again in one promotion, not in several that would wait for each other."""
    merged: dict[tuple[str, int, int, int], Promote] = {}
    for a in read:
        key = (a.volume, a.dev, a.ino, a.gen)
        had = merged.get(key)
        merged[key] = a if had is None else Promote(a.volume, a.dev, a.ino, a.gen,
                                                    tuple(sorted(had.ranges + a.ranges)), had.reason)
    return list(merged.values())
