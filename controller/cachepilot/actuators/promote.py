"""Promotion by reading: the hot ranges of a file read through the cached volume so that the stock cache admits
them — the stock caches promote on access, so the controller promotes by accessing.

A file is named by (filesystem dev, inode, generation), never by a path: it is opened with
``open_by_handle_at`` on a descriptor of the filesystem's mountpoint, with a handle built from the inode and
generation (ext4's FILEID_INO32_GEN: type 1, ``{u32 ino, u32 gen}``). A file deleted or replaced since the
decision (generation mismatch, ESTALE) is skipped and logged. Needs CAP_DAC_READ_SEARCH. The file is opened
``O_DIRECT | O_NOATIME``: reads go to the volume (not the page cache) and no inode is dirtied.

FIEMAP gives the on-disk extents (holes and unwritten extents are never read). The ranges are cut into aligned
chunks of 64–256 KiB and read in *descending physical order*: bcache extends a sequential run only when a bio
starts where a recent one ended (``check_should_bypass``: the last 128 I/Os, within 5 s) and bypasses a run past
``sequential_cutoff``; reading downwards, no chunk ever starts where an earlier one ended, so no run forms and
the reads are admitted (as misses, then hits). dm-cache's smq promotes blocks whose hotspot has been hit
enough, and counts a hotspot at most once per tick (one second, ``hotspot_hit_bits``): measured in the lab,
one round of reads over a fresh set promoted 0 of 64 blocks, a second round over a second later all 64. So on
dm-cache a promotion takes ``rounds`` = 2 rounds (a kind declares its ``promote_rounds``) at least
``round_gap_ns`` apart: after the first, ``run`` returns the action as ``deferred`` with ``not_before_ns``;
called again before then, it reads nothing.
A token bucket keeps the reads within ``rate`` bytes per second; what does not fit now comes back as
``deferred``. So does what finds this second's read time spent (``READ_SLICE_NS`` of every ``SLICE_WINDOW_NS``):
the reads run on the daemon's loop, and a tick that decided dozens of promotions at once (a hot set re-warmed
after a scan) read for ten seconds in the lab soak, the loop stalled meanwhile; at least one chunk is read per
call, so every promotion moves on. With reader threads (the daemon's way, readpool) a file is handed over whole: the
chunks the bucket holds are read at once, the rest by the thread at the rate, the bucket carrying the rest as a debt.
The probe ignores the daemon's own I/O, so promotion reads never count as hotness.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import random
import stat
import time
from collections.abc import Callable

from cachepilot.actions import DONE, FAILED, IMPORTED, PENDING, SKIPPED, Outcome, Promote
from cachepilot.actuators.allocpace import AllocBackoff
from cachepilot.actuators.extents import fiemap
from cachepilot.actuators.readpool import Done, Pacer, ReadPool
from cachepilot.actuators.taskruns import shed_run_history
from cachepilot.capabilities import CAPABILITIES
from cachepilot.errors import CachepilotError, DeviceGone, classify_errno
from cachepilot.events import kdev_from_st_dev
from cachepilot.handles import open_by_handle
from cachepilot.models.volume import VolumeInfo

log = logging.getLogger("cachepilot.actuators.promote")

MIN_CHUNK, MAX_CHUNK = 64 << 10, 256 << 10
ROUND_GAP_NS = 1_200_000_000  # smq's hotspot tick is one second
SLICE_WINDOW_NS = 1_000_000_000  # the daemon's tick
READ_SLICE_NS = 250_000_000  # of each window, the most the promoter reads for (the rest of the tick is the loop's)
# An imported hot list (a warm handoff) is read at this many times the rate, from its own bucket: the operator asked
# for it, typically before the workload moves over; on bcache the alloc-fail back-off halves it too (allocpace).
IMPORT_RATE_FACTOR = 8


Chunk = tuple[int, int, int]  # (physical, logical, length)


class Promoter:
    """One per filesystem (volume). ``run`` reads what the budget allows now and returns the rest."""

    def __init__(self, info: VolumeInfo, *, rate: int = 4 << 20, rounds: int | None = None, seed: int = 0,
                 burst: int | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 opener: Callable[[int, int, int, int], int] = open_by_handle, workers: int = 0) -> None:
        """``workers`` > 0: files are read by that many background threads (readpool), off the caller's thread
        and without its read-time slice; 0: on the caller's thread."""
        self.info = info
        self.rate = max(1, rate)
        self._fixed_burst = burst
        self.burst, self.import_burst = self._bursts()
        caps = CAPABILITIES.get(info.kind)
        # a kind that refuses inserts when its free list is empty (bcache): the rate follows its failures (allocpace)
        self.backoff = AllocBackoff(self.rate, floor=MIN_CHUNK) if caps and caps.ready_reserve else None
        self.rounds = (caps.promote_rounds if caps else 1) if rounds is None else rounds
        self._round: dict[tuple[int, int, int], tuple[int, int]] = {}  # file -> (rounds done, next not before)
        self.rng = random.Random(seed)  # noqa: S311 (chunk sizes, not secrets)
        self.clock = clock
        self.opener = opener
        self._tokens = float(self.burst)
        self._import_tokens = float(self.import_burst)
        self._last = clock()
        self._window_end = self._slice_end = 0  # this window's end, and its read time's
        self.errors: dict[str, int] = {}
        self.read_bytes_total = 0
        self.skipped_total = 0
        # bcache: a new thread inherits its creator's run history and is bypassed until it has shed it (taskruns)
        self.shed_runs = bool(caps and caps.inherits_run_history)
        self.pool = ReadPool(workers, clock, shed_runs=self.shed_runs) if workers > 0 else None

    def run(self, action: Promote, *, dry_run: bool = False) -> Outcome:
        if self.rounds == 0:
            return self._skip(action, dry_run, f"{self.info.kind} does not cache reads")
        key = (action.dev, action.ino, action.gen)
        background = self.pool is not None and not dry_run
        if background and (waiting := self._collect(action, key)) is not None:
            return waiting
        done_rounds, not_before = self._round.get(key, (0, 0))
        if self.clock() < not_before:
            return Outcome(action, PENDING, dry_run, deferred=action, not_before_ns=not_before, actuated=True,
                           detail=f"round {done_rounds + 1} of {self.rounds} not due yet")
        if not background and self._slice_spent():
            return Outcome(action, PENDING, dry_run, deferred=action, not_before_ns=self._window_end, actuated=True,
                           detail="this second's read time is spent")
        if background and self.pool is not None and self.pool.full():
            return _waits(action, f"{self.pool.limit} files wait for the reader threads")
        if not self._holds_a_chunk(action):  # before the open and FIEMAP, which would only find the same
            return Outcome(action, PENDING, dry_run, deferred=action, actuated=True,
                           detail="the promotion budget is spent")
        try:
            fd = self._open(action)
        except _Skip as s:
            return self._skip(action, dry_run, str(s))
        except CachepilotError as exc:
            return self._failed(action, dry_run, exc)
        handed = False
        try:
            chunks = self.plan(fd, action.ranges)
            if background and chunks:
                handed = True  # the reader thread closes it
                return self._submit(fd, action, key, chunks)
            r = self._read(fd, action, chunks, dry_run)
            return self._next_round(action, r, key, done_rounds)
        except OSError as exc:
            return self._failed(action, dry_run, classify_errno(exc.errno, f"promote ino {action.ino}"))
        finally:
            if not handed:
                os.close(fd)

    # -------------------------------------------------------------- reading in the background (readpool)
    def _submit(self, fd: int, action: Promote, key: tuple[int, int, int], chunks: list[Chunk]) -> Outcome:
        """Hand the whole file to a reader thread: the chunks the bucket holds now are read at once, the rest one at a
        time at the rate (its pacer, no more than a burst ready at once: on bcache the allocator's reserve). The
        bucket is charged for all of it now, a debt the rate repays while the thread reads: no other promotion is
        handed over before then, so the bytes read a second stay the rate's. Before, one burst was handed over a tick
        and collected the next: ~0.27 MiB/s on bcache whatever the rate (a 16 MiB file ~60 s in the lab, issue 37)."""
        assert self.pool is not None
        self._refill()
        imported = IMPORTED in action.reason
        held = max(0.0, self._import_tokens if imported else self._tokens)
        at_once, covered = 0, 0
        for _, _, n in chunks:
            if covered + n > held:
                break
            at_once, covered = at_once + 1, covered + n
        self._charge(imported, sum(n for _, _, n in chunks))
        pacer = Pacer(held - covered, rate=(lambda: self.rate * IMPORT_RATE_FACTOR) if imported else lambda: self.rate,
                      cap=(lambda: self.import_burst) if imported else lambda: self.burst, clock=self.clock)
        self.pool.submit(key, action, fd, chunks, pacer, at_once)
        if self.backoff is not None and at_once:  # read from now on: failures the next look sees may be these reads'
            self.backoff.read(action, tuple(sorted((lg, n) for _, lg, n in chunks[:at_once])))
        paced = f", {len(chunks) - at_once} at the rate" if at_once < len(chunks) else ""
        return _waits(action, f"{at_once} chunk(s) handed to a reader thread{paced}")

    def _collect(self, action: Promote, key: tuple[int, int, int]) -> Outcome | None:
        """The outcome of the file's background read once it has ended; a wait while it runs; None if none runs. Only
        the action it was handed over for collects it: another promotion of the file (an alloc-fail re-read, a
        re-warm) waits until then and reads on its own."""
        assert self.pool is not None
        owner = self.pool.owner(key)
        if owner is not None and owner != action:
            return _waits(action, "another promotion of this file is being read")
        got = self.pool.poll(key)
        if got is None:
            return _waits(action, "being read by a reader thread") if owner is not None else None
        result, started = got
        if self.backoff is not None and started:
            self.backoff.read(action, tuple(sorted(started)))
        if isinstance(result, OSError):
            return self._failed(action, False, classify_errno(result.errno, f"promote ino {action.ino}"))
        return self._collected(action, key, result)

    def _collected(self, action: Promote, key: tuple[int, int, int], result: Done) -> Outcome:
        """A read that ended: what it stopped short of (the pool closing) is given back to the bucket and deferred."""
        unread = sum(n for _, _, n in result.unread)
        if unread:
            self._charge(IMPORTED in action.reason, -unread)
        r = self._outcome(action, result.read, result.unread, False, counted=True)
        return self._next_round(action, r, key, self._round.get(key, (0, 0))[0], result.ended)

    def close(self) -> bool:
        """Stop the reader threads (the daemon's stop, the volume gone); True if they ended in time."""
        return self.pool.close() if self.pool is not None else True

    # -------------------------------------------------------------- opening by handle
    def _open(self, action: Promote) -> int:
        if not self.info.mountpoint:
            raise DeviceGone(f"{self.info.name}: no filesystem mounted")
        try:
            mfd = os.open(self.info.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise classify_errno(exc.errno, f"open {self.info.mountpoint}") from None
        try:
            dev = kdev_from_st_dev(os.fstat(mfd).st_dev)
            if dev != action.dev:
                raise DeviceGone(f"{self.info.mountpoint} is filesystem {dev:#x}, not {action.dev:#x}")
            # O_NONBLOCK: a handle may name a FIFO (a hot-list entry with generation 0 matches any inode), whose
            # open would wait for a writer on the loop thread, past the watchdog; fstat below refuses it, and
            # O_DIRECT is set only then (a FIFO opened with it is EINVAL, not "not a regular file")
            flags = os.O_RDONLY | os.O_NOATIME | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
            try:
                fd = self.opener(mfd, action.ino, action.gen, flags)
            except OSError as exc:
                if exc.errno in (errno.ESTALE, errno.ENOENT):
                    raise _Skip(f"inode {action.ino} generation {action.gen} is gone or was replaced") from None
                raise classify_errno(exc.errno, f"open_by_handle_at ino {action.ino}") from None
        finally:
            os.close(mfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_ino != action.ino:
            os.close(fd)
            raise _Skip(f"inode {action.ino} is not a regular file")
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError as exc:
            os.close(fd)
            raise classify_errno(exc.errno, f"O_DIRECT on ino {action.ino}") from None
        return fd

    # -------------------------------------------------------------- what to read, in which order
    def plan(self, fd: int, ranges: tuple[tuple[int, int], ...]) -> list[Chunk]:
        """Aligned chunks of the on-disk parts of ``ranges``, in descending physical order."""
        bs = self.info.fs_block_size
        chunks: list[Chunk] = []
        for off, length in ranges:
            lo, hi = off // bs * bs, -(-(off + length) // bs) * bs
            for e in fiemap(fd, lo, hi - lo):
                if not e.on_disk:
                    continue
                s, t = max(lo, e.logical), min(hi, e.logical + e.length)
                while s < t:
                    n = min(t - s, self.rng.randrange(MIN_CHUNK, MAX_CHUNK + 1, bs))
                    chunks.append((e.physical + (s - e.logical), s, n))
                    s += n
        chunks.sort(reverse=True)
        return chunks

    def _read(self, fd: int, action: Promote, chunks: list[Chunk], dry_run: bool) -> Outcome:
        self._refill()
        buf = mmap.mmap(-1, MAX_CHUNK)  # page-aligned, as O_DIRECT needs
        reads = 0
        left = list(chunks)
        done: list[tuple[int, int]] = []
        imported = IMPORTED in action.reason
        if self.shed_runs and left and not dry_run:
            shed_run_history(fd, buf, left[0][1])
        while left and (not reads or self.clock() < self._slice_end) and self._spend(imported, left[0][2]):
            _, logical, n = left.pop(0)
            if not dry_run:
                os.preadv(fd, [memoryview(buf)[:n]], logical)
            reads += 1
            done.append((logical, n))
        buf.close()
        return self._outcome(action, done, left, dry_run)

    def _outcome(self, action: Promote, done: list[tuple[int, int]], left: list[Chunk], dry_run: bool,
                 counted: bool = False) -> Outcome:
        """What a round read (``done``: logical ranges) and what it left for later (``counted``: its reads were told
        to the back-off when they were handed to a reader thread)."""
        done_bytes = sum(n for _, n in done)
        if not dry_run:
            self.read_bytes_total += done_bytes
            if self.backoff is not None and not counted:
                self.backoff.read(action, tuple(sorted(done)))
        deferred = None
        if left:
            rest = tuple(sorted((lg, n) for _, lg, n in left))
            deferred = Promote(action.volume, action.dev, action.ino, action.gen, rest, action.reason)
        # not logged here: the daemon's decision record logs each outcome once (two lines a promotion, before)
        return Outcome(action, PENDING if left else DONE, dry_run, actuated=True, read_bytes=done_bytes,
                       reads=len(done), deferred=deferred)

    def _next_round(self, action: Promote, r: Outcome, key: tuple[int, int, int], done_rounds: int,
                    ended: int | None = None) -> Outcome:
        """A round that read everything it had (its last read ending at ``ended``, default now): count it; if the
        cache needs another, defer the whole action."""
        if r.status != DONE or r.dry_run:
            return r
        done_rounds += 1
        if done_rounds >= self.rounds:
            self._round.pop(key, None)
            return r
        not_before = (self.clock() if ended is None else ended) + ROUND_GAP_NS
        self._round[key] = (done_rounds, not_before)
        return Outcome(action, PENDING, False, actuated=True, read_bytes=r.read_bytes, reads=r.reads,
                       deferred=action, not_before_ns=not_before, detail=f"round {done_rounds} of {self.rounds} read")

    def alloc_failures(self, count: int, now_ns: int) -> list[Promote]:
        """The probe's cumulative bcache_alloc_fail count for this volume's cache: the rate follows it (AIMD);
        returns the promotions to read once more. Nothing on other kinds."""
        if self.backoff is None:
            return []
        if self.pool is not None:  # the paced chunks started since the last look are among those read since then
            for key, owner in self.pool.reading():
                if started := self.pool.started(key):
                    self.backoff.read(owner, tuple(sorted(started)))
        seen = self.backoff.failures_total
        again = self.backoff.observe(count, now_ns)
        self._refill()  # tokens earned so far at the old rate
        self.rate = max(1, int(self.backoff.rate))
        self.burst, self.import_burst = self._bursts()
        # the allocator is out of ready buckets now: nothing more until the halved rate has earned it (a debt stays)
        refused = self.backoff.failures_total > seen
        self._tokens = min(self._tokens, 0.0 if refused else float(self.burst))
        self._import_tokens = min(self._import_tokens, 0.0 if refused else float(self.import_burst))
        if refused and self.pool is not None:
            self.pool.empty_pacers()
        return again

    def _slice_spent(self) -> bool:
        """Whether this window's read time is used up (a new window starts when the last has ended)."""
        now = self.clock()
        if now >= self._window_end:
            self._window_end, self._slice_end = now + SLICE_WINDOW_NS, now + READ_SLICE_NS
        return now >= self._slice_end

    def _refill(self) -> None:
        now = self.clock()
        dt = (now - self._last) / 1e9
        self._tokens = min(float(self.burst), self._tokens + dt * self.rate)
        f = IMPORT_RATE_FACTOR
        self._import_tokens = min(float(self.import_burst), self._import_tokens + dt * self.rate * f)
        self._last = now

    def _bursts(self) -> tuple[int, int]:
        """The most read at once, at the rate and at an import's: a second's worth, and on bcache never more than
        its allocator keeps ready (default_burst) -- an import goes faster, not in larger bursts."""
        if self._fixed_burst is not None:
            return max(MAX_CHUNK, self._fixed_burst), max(MAX_CHUNK, self._fixed_burst * IMPORT_RATE_FACTOR)
        return (max(MAX_CHUNK, default_burst(self.info, self.rate)),
                max(MAX_CHUNK, default_burst(self.info, self.rate * IMPORT_RATE_FACTOR)))

    def _holds_a_chunk(self, action: Promote) -> bool:
        """Whether the action's bucket holds the largest chunk its first read could be (MAX_CHUNK, or all it has
        left in whole blocks if less): then every open reads at least a chunk. A promotion waiting on the budget
        (spent, or emptied by bcache's alloc failures) was opened and mapped (FIEMAP) on every turn only to read
        nothing: hundreds of queued promotions a tick in the lab's headline fileserver (issue 23 item 5). The bytes
        read a second stay the rate's: the bucket fills meanwhile (the burst is at least MAX_CHUNK)."""
        self._refill()
        bs = self.info.fs_block_size
        left = sum(-(-(off + n) // bs) * bs - off // bs * bs for off, n in action.ranges)
        tokens = self._import_tokens if IMPORTED in action.reason else self._tokens
        return tokens >= min(MAX_CHUNK, left)

    def _spend(self, imported: bool, n: int) -> bool:
        """Take ``n`` bytes from the bucket of the action's kind if it holds them."""
        if imported:
            if self._import_tokens < n:
                return False
            self._import_tokens -= n
        else:
            if self._tokens < n:
                return False
            self._tokens -= n
        return True

    def _charge(self, imported: bool, n: int) -> None:
        """Take ``n`` bytes from the bucket of the action's kind, into debt if it holds less (negative: give back)."""
        if imported:
            self._import_tokens = min(float(self.import_burst), self._import_tokens - n)
        else:
            self._tokens = min(float(self.burst), self._tokens - n)

    def _skip(self, action: Promote, dry_run: bool, why: str) -> Outcome:
        self.skipped_total += 1
        log.info("%s: skipped: %s", action.line(), why)
        return Outcome(action, SKIPPED, dry_run, detail=why, actuated=True)

    def _failed(self, action: Promote, dry_run: bool, exc: CachepilotError) -> Outcome:
        self.errors[exc.kind] = self.errors.get(exc.kind, 0) + 1
        log.warning("%s failed: %s", action.line(), exc)
        return Outcome(action, FAILED, dry_run, error=exc, actuated=True)


def default_burst(info: VolumeInfo, rate: int) -> int:
    """The most the promoter reads at once: one second of its rate, and on bcache no more than the cache set's
    allocator keeps ready. bcache inserts a read miss only into a bucket that is ready now (``bch_alloc_sectors``
    with wait false for a cache miss; a miss is served but not cached, ``bcache_alloc_fail``, when the free list is
    empty). The free list holds ``roundup_pow_of_two(nbuckets) >> 10`` buckets (``cache_alloc`` in super.c: the
    reserve), i.e. at least 1/1024 of the cache: a burst larger than that outruns the allocator (measured in the
    lab: 8 MiB read at once into a 256 MiB cache, 40-144 KiB of it not inserted in 1 run of 3)."""
    caps = CAPABILITIES.get(info.kind)
    if caps is not None and caps.ready_reserve is not None and info.cache_bytes > 0:
        return min(rate, info.cache_bytes >> caps.ready_reserve.shift)
    return rate


def _waits(action: Promote, why: str) -> Outcome:
    """The action waits whole, nothing read by this call (the daemon says it once, not each tick it waits)."""
    return Outcome(action, PENDING, False, deferred=action, actuated=True, detail=why)


class _Skip(Exception):
    """The file is not there to promote (an expected condition, not an error)."""
