"""A promoted file is read by one reader thread, paced at the promotion rate (issue 37): before, the loop handed
over one burst a tick, and on bcache the burst is the allocator's reserve (cache/1024), so a 16 MiB file took ~60 s
in the lab whatever the rate. Here: the pace (the rate, one chunk of at most a burst at a time, in the order that
never continues a run), the debt the bucket carries meanwhile, the stop (the daemon's, a volume gone) within a bound,
and no file read twice."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cachepilot.actions import Promote
from cachepilot.actuators import readpool
from cachepilot.actuators.extents import fiemap
from cachepilot.actuators.promote import DONE, PENDING, Promoter
from cachepilot.daemon.volume import ManagedVolume
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import DEV, VOL, Rig
from tests.unit.test_promote import MIB, Clock, action, fs, make_file  # noqa: F401 (fs: the fixture)

S = 1_000_000_000
KIB = 1 << 10
BURST = 256 * KIB  # a 256 MiB bcache: its allocator keeps 1/1024 ready


class Reads:
    """preadv of the reader threads, recorded: (clock when it started, descriptor's inode, offset, length)."""

    def __init__(self, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock, self.log = clock, []
        self.lock = threading.Lock()
        real = os.preadv

        def preadv(fd: int, bufs: list[memoryview], off: int) -> int:
            with self.lock:
                self.log.append((self.clock.t, os.fstat(fd).st_ino, off, len(bufs[0])))
            return real(fd, bufs, off)

        monkeypatch.setattr(readpool.os, "preadv", preadv)

    def of(self, ino: int) -> list[tuple[int, int, int]]:
        return [(t, off, n) for t, i, off, n in self.log if i == ino]


def fake_sleep(clock: Clock):  # the pacer's wait: time passes, no stop
    def sleep(s: float) -> bool:
        clock.t += int(s * S) + 1
        return False
    return sleep


@pytest.fixture
def bfs(fs):  # type: ignore[no-untyped-def]  # noqa: F811
    """The host's filesystem as a 256 MiB bcache's (its allocator keeps 256 KiB ready: the burst)."""
    info, d = fs
    return replace(info, cache_bytes=256 * MIB), d


def test_a_large_file_is_read_whole_at_the_rate_one_chunk_at_a_time(bfs, monkeypatch) -> None:
    """16 MiB at 4 MiB/s: ~3.9 s after one hand-over (the first burst at once), collected done at the next look. On
    main: 256 KiB a hand-over, the rest deferred to the next tick. The chunks keep the order that never continues a
    run: each starts below every earlier one, so none starts where an earlier one ended (bcache's run detection
    matches a bio's start against a recent bio's end, check_should_bypass)."""
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, 16 * MIB)])
    clock = Clock()
    reads = Reads(clock, monkeypatch)
    p = Promoter(info, rate=4 * MIB, clock=clock, workers=2)
    assert p.burst == BURST and p.pool is not None
    p.pool.sleep = fake_sleep(clock)
    a = action(info, ino, gen, [(0, 16 * MIB)])
    handed = p.run(a)
    assert handed.status == PENDING and handed.reads == 0 and handed.deferred is a
    p.pool.wait()
    got = p.run(a)
    assert got.status == DONE and got.read_bytes == 16 * MIB, got.line()
    log = reads.of(ino)
    assert sum(n for _, _, n in log) == 16 * MIB and len({off for _, off, _ in log}) == len(log)  # each chunk once
    started = 0
    for t, _, n in log:  # never ahead of the first burst plus the rate since
        started += n
        assert started <= BURST + 4 * MIB * t / S + 1, (t, started)
        assert n <= BURST
    assert (16 * MIB - BURST) / (4 * MIB) <= clock.t / S <= (16 * MIB - BURST) / (4 * MIB) + 0.1
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        ext = [e for e in fiemap(fd, 0, 16 * MIB) if e.on_disk]
    finally:
        os.close(fd)
    phys = [next(e.physical + off - e.logical for e in ext if e.logical <= off < e.logical + e.length)
            for _, off, _ in log]
    assert phys == sorted(phys, reverse=True)  # descending physical order ...
    ends: set[int] = set()
    for ph, (_, _, n) in zip(phys, log, strict=True):  # ... so no chunk starts where an earlier one ended
        assert ph not in ends
        ends.add(ph + n)


def test_the_bucket_carries_the_files_debt_so_the_rate_holds_over_all_promotions(bfs, monkeypatch) -> None:
    """The whole file is charged when it is handed over: while its reader paces through it, another promotion waits
    (not even opened) until the rate has repaid the debt -- the bytes read a second stay the rate's. On main the
    bucket was charged one burst, and the next file went a burst's time later."""
    info, d = bfs
    big, small = make_file(d / "big", [(0, 16 * MIB)]), make_file(d / "small", [(0, MIB)])
    clock = Clock()
    gate = threading.Event()

    def held(s: float) -> bool:  # the reader is mid-file until the test lets it go
        gate.wait(10)
        clock.t += int(s * S) + 1
        return False

    opens: list[int] = []
    from cachepilot.handles import open_by_handle

    def opener(mfd: int, ino: int, gen: int, flags: int) -> int:
        opens.append(ino)
        return open_by_handle(mfd, ino, gen, flags)

    p = Promoter(info, rate=4 * MIB, clock=clock, workers=2, opener=opener)
    assert p.pool is not None
    p.pool.sleep = held
    a, b = action(info, *big, [(0, 16 * MIB)]), action(info, *small, [(0, MIB)])
    assert p.run(a).status == PENDING
    clock.t = 2 * S  # half of the file's time at the rate
    waits = p.run(b)
    assert waits.status == PENDING and waits.deferred is b and "budget" in waits.detail and opens == [big[0]]
    clock.t = 4 * S + S // 10  # the debt is repaid after (16 MiB - 256 KiB) / 4 MiB/s = 3.94 s
    assert "handed" in p.run(b).detail and opens == [big[0], small[0]]
    gate.set()
    p.pool.wait()
    assert p.run(a).read_bytes == 16 * MIB and p.run(b).status == DONE


def test_a_read_stopped_short_gives_its_unread_bytes_back_and_defers_them(bfs, monkeypatch) -> None:
    """The pool closing between two chunks: what was read counts, the rest is given back to the bucket (it is
    charged again when read) and is the deferred action."""
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, 4 * MIB)])
    clock = Clock()
    p = Promoter(info, rate=4 * MIB, clock=clock, workers=1)
    assert p.pool is not None
    p.pool.sleep = lambda s: True  # the stop comes at the first wait
    a = action(info, ino, gen, [(0, 4 * MIB)])
    p.run(a)
    p.pool.wait()
    r = p.run(a)
    assert r.status == PENDING and 0 < r.read_bytes <= BURST and r.deferred is not None
    assert r.read_bytes + sum(n for _, n in r.deferred.ranges) == 4 * MIB
    assert p._tokens == pytest.approx(BURST - r.read_bytes)  # charged only for what it read


def test_stop_ends_a_long_paced_read_within_a_bound(bfs) -> None:
    """16 MiB at 256 KiB/s is a minute's read: the daemon's stop (SIGTERM) and a volume gone end it before its next
    chunk, well within a second here; its descriptor is closed, nothing more is read."""
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, 16 * MIB)])
    p = Promoter(info, rate=256 * KIB, workers=2)  # the real clock and the real wait
    assert p.pool is not None
    fds = len(os.listdir("/proc/self/fd"))
    p.run(action(info, ino, gen, [(0, 16 * MIB)]))
    deadline = time.monotonic() + 5
    while not p.pool.reading() or time.monotonic() < deadline and not p.pool.started(p.pool.reading()[0][0]):
        time.sleep(0.01)  # the first paced chunk has started: the reader is in its pace
    t0 = time.monotonic()
    assert p.close() is True
    assert time.monotonic() - t0 < 1.0
    assert len(os.listdir("/proc/self/fd")) == fds


def test_close_cancels_the_reads_not_started_and_closes_their_descriptors(tmp_path: Path) -> None:
    from cachepilot.actuators.readpool import Pacer, ReadPool

    (tmp_path / "f").write_bytes(b"x" * 4096)
    clock = Clock()
    pool = ReadPool(1, clock)
    never = Pacer(0, rate=lambda: 1.0, cap=lambda: BURST, clock=time.monotonic_ns)  # one byte a second
    fds = [os.open(tmp_path / "f", os.O_RDONLY) for _ in range(2)]
    for i, fd in enumerate(fds):
        pool.submit((1, i, 1), None, fd, [(0, 0, 4096)], never, 0)  # the second waits for the one worker
    time.sleep(0.05)
    t0 = time.monotonic()
    assert pool.close() is True and time.monotonic() - t0 < 1.0
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_file_is_never_read_twice_by_its_promotion_and_a_reread_waits_for_it(bfs, monkeypatch) -> None:
    """While its reader paces through it, the loop's looks at the promotion read nothing; a second promotion of the
    same file (bcache's refused inserts: the one re-read) waits until the first is collected instead of taking its
    result (on main it took it, and the first read its ranges again). Each chunk: once by the promotion, once by
    the re-read; the re-read's own reads are never re-read."""
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, 4 * MIB)])
    clock = Clock()
    reads = Reads(clock, monkeypatch)
    p = Promoter(info, rate=4 * MIB, clock=clock, workers=2)
    assert p.pool is not None
    p.pool.sleep = fake_sleep(clock)
    p.alloc_failures(0, clock.t)
    a = action(info, ino, gen, [(0, 4 * MIB)])
    p.run(a)
    p.pool.wait()
    again = p.alloc_failures(1, clock.t)  # refusals while it was read: all of it, once more
    assert len(again) == 1 and sum(n for _, n in again[0].ranges) == 4 * MIB
    x = again[0]
    first = p.run(x)  # the loop happens to look at the re-read first
    assert first.status == PENDING and first.reads == 0 and "another promotion" in first.detail
    done = p.run(a)
    assert done.status == DONE and done.read_bytes == 4 * MIB
    clock.t += S
    p.run(x)
    p.pool.wait()
    assert p.run(x).status == DONE
    counts: dict[int, int] = {}
    for _, off, _ in reads.of(ino):
        counts[off] = counts.get(off, 0) + 1
    assert sum(n for _, _, n in reads.of(ino)) == 8 * MIB  # 4 MiB by the promotion, 4 MiB by the re-read
    assert p.alloc_failures(2, clock.t) == []  # a re-read is never re-read


def test_a_file_the_bucket_holds_is_read_at_once_as_before(bfs, monkeypatch) -> None:
    """W1's files (<= 192 KiB) fit the bucket: read at once, no pacer wait, no debt -- the same reads and charges as
    before the pace (no regression there by construction)."""
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, 192 * KIB)])
    clock = Clock()

    def no_wait(*_: object) -> bool:
        raise AssertionError("paced")

    monkeypatch.setattr(readpool.Pacer, "take", no_wait)
    p = Promoter(info, rate=4 * MIB, clock=clock, workers=2)
    assert p.pool is not None
    a = action(info, ino, gen, [(0, 192 * KIB)])
    assert p.run(a).detail.endswith("handed to a reader thread")
    assert p._tokens == BURST - 192 * KIB
    p.pool.wait()
    assert p.run(a).read_bytes == 192 * KIB


class ClosingFiles:
    """The file actuators of the daemon's tests, with the close the daemon owes them."""

    closed: list[str] = []

    def __init__(self, info: VolumeInfo, discard_rate: int, promote_rate: int) -> None:
        self.info = info

    def run(self, action: Promote, dry_run: bool) -> object:
        raise AssertionError("no file action in this test")

    def close(self) -> None:
        ClosingFiles.closed.append(self.info.name)


def test_the_daemon_stops_the_reader_threads_of_a_volume_gone(tmp_path: Path) -> None:
    ClosingFiles.closed = []
    r = Rig(tmp_path)
    r.d.adopter.actuators_factory = ClosingFiles
    r.d.start()
    assert isinstance(r.d.vols[DEV], ManagedVolume) and ClosingFiles.closed == []
    r.found = []
    r.tick(2)  # rescan: gone
    assert ClosingFiles.closed == [VOL.name]
    r.d.shutdown()
    assert ClosingFiles.closed == [VOL.name]


def test_the_daemon_stop_closes_every_volumes_readers(tmp_path: Path) -> None:
    ClosingFiles.closed = []
    r = Rig(tmp_path)
    r.d.adopter.actuators_factory = ClosingFiles
    r.d.start()
    r.d.shutdown()
    assert ClosingFiles.closed == [VOL.name]
