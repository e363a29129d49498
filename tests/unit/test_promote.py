"""The promoter on the host's filesystem (root: open_by_handle_at and FIEMAP are real here): files opened by
(dev, ino, gen), only on-disk extents read, in aligned 64-256 KiB chunks that never continue an earlier read,
within the byte budget; a replaced or deleted file skipped; another filesystem refused."""

from __future__ import annotations

import fcntl
import os
import struct
from dataclasses import replace

import pytest

from cachepilot.actions import Promote
from cachepilot.actuators import promote
from cachepilot.actuators.promote import DONE, FAILED, MAX_CHUNK, MIN_CHUNK, PENDING, SKIPPED, Promoter
from cachepilot.errors import DeviceGone
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo

MIB = 1 << 20


def generation(path) -> int:
    with open(path, "rb") as f:
        buf = bytearray(8)
        fcntl.ioctl(f.fileno(), 0x80087601, buf, True)  # FS_IOC_GETVERSION
        return struct.unpack("=q", buf)[0] & 0xFFFFFFFF


@pytest.fixture
def fs(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root (CAP_DAC_READ_SEARCH for open_by_handle_at)", pytrace=False)
    info = VolumeInfo(dev=kdev_from_st_dev(os.stat(tmp_path).st_dev), name="bcache0", kind="bcache",
                      mountpoint=str(tmp_path), fs_block_size=4096)
    return info, tmp_path


def make_file(path, parts):
    with open(path, "wb") as f:
        for off, n in parts:
            f.seek(off)
            f.write(os.urandom(n))
        f.flush()
        os.fsync(f.fileno())
    st = os.stat(path)
    return st.st_ino, generation(path)


def action(info, ino, gen, ranges):
    return Promote(info.name, info.dev, ino, gen, tuple(ranges), "hot")


class Clock:
    t = 0

    def __call__(self):
        return self.t


def test_reads_exactly_the_on_disk_parts_in_chunks_that_never_continue_a_run(fs):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, 3 * MIB), (5 * MIB, MIB)])  # a 2 MiB hole in between
    p = Promoter(info, rate=64 * MIB, seed=1, clock=Clock())  # a frozen clock: no read-time slice runs out
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        chunks = p.plan(fd, ((0, 6 * MIB),))
    finally:
        os.close(fd)
    assert sum(n for _, _, n in chunks) == 4 * MIB
    assert all(lg % 4096 == 0 and MIN_CHUNK <= n <= MAX_CHUNK or n < MIN_CHUNK for _, lg, n in chunks)
    assert not any(MIB * 3 <= lg < 5 * MIB for _, lg, _ in chunks)  # the hole is never read
    ends = set()
    for phys, _, n in chunks:  # no chunk starts where an earlier-read one ended: no sequential run
        assert phys not in ends
        ends.add(phys + n)
    r = p.run(action(info, ino, gen, [(0, 6 * MIB)]))
    assert r.status == DONE and r.read_bytes == 4 * MIB and r.reads == len(chunks), r.line()


def test_a_promotion_that_read_logs_no_line_of_its_own(fs, caplog):
    """The daemon's decision record logs each outcome; the actuator's own copy of that line was a second one per
    promotion (issue 23 item 5: the daemon's CPU)."""
    import logging

    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    p = Promoter(info, rate=64 * MIB, seed=1, clock=Clock())
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        r = p.run(action(info, ino, gen, [(0, MIB)]))
    assert r.status == DONE and r.read_bytes == MIB and caplog.records == []


def test_replaced_or_deleted_file_is_skipped(fs):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    p = Promoter(info)
    r = p.run(action(info, ino, gen + 1, [(0, MIB)]))
    assert r.status == SKIPPED and "replaced" in r.detail
    os.unlink(d / "f")
    assert p.run(action(info, ino, gen, [(0, MIB)])).status == SKIPPED
    assert p.skipped_total == 2


def test_budget_defers_the_rest(fs):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, 2 * MIB)])
    clock = Clock()
    p = Promoter(info, rate=MIB, clock=clock)
    r = p.run(action(info, ino, gen, [(0, 2 * MIB)]))
    assert r.status == PENDING and r.read_bytes <= MIB and r.deferred is not None
    assert r.read_bytes + sum(n for _, n in r.deferred.ranges) == 2 * MIB
    total = r.read_bytes
    while r.deferred is not None:  # a second's budget at a time, never more
        clock.t += 1_000_000_000
        r = p.run(r.deferred)
        assert 0 < r.read_bytes <= MIB
        total += r.read_bytes
    assert r.status == DONE and total == 2 * MIB


def test_a_promotion_waiting_on_a_spent_budget_is_not_opened_again(fs):
    """While the bucket holds less than a smallest chunk, a deferred promotion waits without an open and a FIEMAP
    (before: both on every turn, only to read nothing; hundreds of queued promotions a tick in the lab's headline
    fileserver, issue 23 item 5); once the bucket has refilled it is opened and read as before."""
    from cachepilot.handles import open_by_handle

    info, d = fs
    ino, gen = make_file(d / "f", [(0, 2 * MIB)])
    clock = Clock()
    opened: list[int] = []

    def opener(mfd: int, i: int, g: int, flags: int) -> int:
        opened.append(i)
        return open_by_handle(mfd, i, g, flags)

    p = Promoter(info, rate=MIB, clock=clock, opener=opener)
    r = p.run(action(info, ino, gen, [(0, 2 * MIB)]))
    assert r.status == PENDING and 0 < r.read_bytes <= MIB and r.deferred is not None and len(opened) == 1
    rest = r.deferred
    for _ in range(10):  # the same second: the bucket is spent
        r = p.run(rest)
        assert len(opened) == 1 and r.status == PENDING and r.reads == 0 and r.deferred == rest
    clock.t += 1_000_000_000  # refilled: opened and read again
    r = p.run(rest)
    assert r.read_bytes > 0 and len(opened) == 2


def test_bcache_burst_never_outruns_the_allocators_ready_buckets(fs):
    # bcache keeps about 1/1024 of the cache in ready buckets and drops a read-miss insert that finds none
    # (bcache_alloc_fail): a 256 MiB cache gets reads of at most 256 KiB at once, however high the rate.
    info, d = fs
    info = replace(info, cache_bytes=256 * MIB)
    ino, gen = make_file(d / "f", [(0, 4 * MIB)])
    clock = Clock()
    p = Promoter(info, rate=64 * MIB, clock=clock)
    assert p.burst == 256 * 1024
    r = p.run(action(info, ino, gen, [(0, 4 * MIB)]))
    assert r.status == PENDING and 0 < r.read_bytes <= 256 * 1024
    clock.t += 10_000_000_000  # ten idle seconds refill no more than the burst
    assert 0 < p.run(r.deferred).read_bytes <= 256 * 1024
    # dm-cache allocates on its own schedule (migrations): a second of the rate, as before
    assert Promoter(replace(info, kind="dm-cache"), rate=64 * MIB).burst == 64 * MIB


def test_another_filesystem_is_refused(fs):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    r = Promoter(info).run(Promote(info.name, info.dev + 1, ino, gen, ((0, MIB),), "hot"))
    assert r.status == FAILED and isinstance(r.error, DeviceGone)


def test_writecache_caches_no_reads_and_dry_run_reads_nothing(fs, monkeypatch):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    assert Promoter(replace(info, kind="dm-writecache")).run(action(info, ino, gen, [(0, MIB)])).status == SKIPPED
    monkeypatch.setattr(os, "preadv", lambda *a: pytest.fail("a dry run read"))
    r = Promoter(info).run(action(info, ino, gen, [(0, MIB)]), dry_run=True)
    assert r.dry_run and r.status == DONE and r.read_bytes == MIB


def test_dm_cache_gets_a_second_round_after_smqs_tick(fs):
    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    clock = Clock()
    p = Promoter(replace(info, kind="dm-cache"), rate=64 * MIB, clock=clock)
    a = action(info, ino, gen, [(0, MIB)])
    r = p.run(a)
    assert r.status == PENDING and r.read_bytes == MIB and r.deferred == a and r.not_before_ns > 0
    early = p.run(a)
    assert early.status == PENDING and early.read_bytes == 0
    clock.t = r.not_before_ns
    r2 = p.run(a)
    assert r2.status == DONE and r2.read_bytes == MIB


def test_reading_stops_when_this_seconds_read_time_is_spent(fs, monkeypatch):
    """Promotions read on the daemon's loop: in the lab soak a tick that decided dozens of them read for ten
    seconds. Each second the promoter reads for at most READ_SLICE_NS; the rest waits for the next one."""
    from cachepilot.actuators import promote

    info, d = fs
    files = [make_file(d / f"f{i}", [(0, MIB)]) for i in range(3)]
    clock = Clock()
    real = os.preadv

    def slow_read(fd, bufs, off):  # each chunk takes 100 ms of the loop's time
        clock.t += 100_000_000
        return real(fd, bufs, off)

    monkeypatch.setattr(promote.os, "preadv", slow_read)
    p = Promoter(info, rate=64 * MIB, clock=clock)
    first = p.run(action(info, *files[0], [(0, MIB)]))
    assert first.status == PENDING and first.reads == 3 and first.deferred is not None  # 300 ms: slice spent
    later = p.run(action(info, *files[1], [(0, MIB)]))
    assert later.status == PENDING and later.reads == 0 and later.deferred is not None
    assert later.not_before_ns == 1_000_000_000 and "read time" in later.detail
    clock.t = later.not_before_ns  # the next second: reading goes on, at least a chunk a call
    again = p.run(later.deferred)
    assert again.reads >= 1 and again.read_bytes > 0
    assert clock.t - later.not_before_ns <= promote.READ_SLICE_NS + 100_000_000


def test_background_readers_read_several_files_at_once_and_the_loop_collects_them(fs, monkeypatch):
    """On a slow origin a read's latency bounds a reader that waits for each (the lab: ~7 files of 64 KiB a second
    re-warmed behind a +20 ms origin). With reader threads the promoter hands files over and returns at once; the
    threads read several at a time; the next look at a file collects its result (a second round on dm-cache counts
    its gap from when the first ended)."""
    import threading
    import time

    from cachepilot.actuators import readpool

    info, d = fs
    files = [make_file(d / f"f{i}", [(0, 64 << 10)]) for i in range(8)]
    real, lock = os.preadv, threading.Lock()
    now, peak = [0], [0]

    def slow_read(fd, bufs, off):  # a slow origin: each read waits 200 ms
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.2)
        with lock:
            now[0] -= 1
        return real(fd, bufs, off)

    monkeypatch.setattr(readpool.os, "preadv", slow_read)
    clock = Clock()
    p = Promoter(replace(info, kind="dm-cache"), rate=64 * MIB, clock=clock, workers=8)
    acts = [action(info, ino, gen, [(0, 64 << 10)]) for ino, gen in files]
    t0 = time.monotonic()
    handed = [p.run(a) for a in acts]
    assert time.monotonic() - t0 < 0.2  # nothing waited on a read
    assert all(r.status == PENDING and r.deferred is r.action and r.reads == 0 for r in handed)
    p.pool.wait()
    assert peak[0] >= 4, peak  # several files read at once (serially: 1)
    clock.t = 5_000_000_000  # the loop looks again later
    first = [p.run(a) for a in acts]
    assert all(r.status == PENDING and r.reads == 1 and r.read_bytes == 64 << 10 for r in first)
    assert all(r.not_before_ns == promote.ROUND_GAP_NS for r in first)  # from when the read ended (clock 0)
    second = [p.run(a) for a in acts]  # round 2 handed over, then collected
    p.pool.wait()
    done = [p.run(a) for a in acts]
    assert all(r.status == PENDING and r.reads == 0 for r in second)
    assert all(r.status == DONE and r.read_bytes == 64 << 10 for r in done) and p.read_bytes_total == 16 * (64 << 10)


def test_an_imported_hot_list_is_read_faster_than_the_rate_and_backs_off_on_bcache_refusals(fs):
    """A warm handoff's list (the operator asked for it) goes at IMPORT_RATE_FACTOR times the rate from its own
    bucket, leaving ordinary promotions their budget; on bcache no larger bursts than the allocator keeps ready, and
    a refusal empties its bucket too (start fast, back off on failure)."""
    from cachepilot.actions import IMPORTED

    info, d = fs
    ino, gen = make_file(d / "f", [(0, 8 * MIB)])
    clock = Clock()
    p = Promoter(replace(info, kind="dm-cache"), rate=MIB, clock=clock, rounds=1)
    ordinary = p.run(action(info, ino, gen, [(0, 8 * MIB)]))
    assert ordinary.read_bytes <= MIB  # a second of the rate
    imp = p.run(replace(action(info, ino, gen, [(0, 8 * MIB)]), reason=IMPORTED))
    assert imp.read_bytes > 4 * MIB and imp.read_bytes <= promote.IMPORT_RATE_FACTOR * MIB
    clock.t += 1_000_000_000
    assert p.run(ordinary.deferred).read_bytes > 0  # the import did not spend the ordinary budget

    big = replace(info, cache_bytes=256 * MIB)  # bcache: 256 KiB ready at once, whatever the rate
    b = Promoter(big, rate=64 * MIB, clock=clock)
    assert b.import_burst == b.burst == 256 * 1024
    b.alloc_failures(0, clock.t)
    r = b.run(replace(action(big, ino, gen, [(0, 8 * MIB)]), reason=IMPORTED))
    assert 0 < r.read_bytes <= 256 * 1024
    clock.t += 10_000_000
    b.alloc_failures(3, clock.t)  # refused inserts: halved, and nothing more until it has earned it
    assert b.rate == 32 * MIB
    assert b.run(r.deferred).read_bytes == 0


def test_a_background_read_counts_for_bcache_refusals_from_when_it_is_handed_over(fs):
    """The tick's look at bcache_alloc_fail re-reads what was read since the last look: a file handed to a reader
    thread is among them at once, not only once the loop has collected it (a tick later)."""
    info, d = fs
    ino, gen = make_file(d / "f", [(0, 64 << 10)])
    clock = Clock()
    p = Promoter(replace(info, cache_bytes=256 * MIB), rate=64 * MIB, clock=clock, workers=2)
    p.alloc_failures(0, clock.t)
    a = action(info, ino, gen, [(0, 64 << 10)])
    assert p.run(a).reads == 0  # handed over
    again = p.alloc_failures(1, clock.t)  # a refusal seen before the loop collected the read
    assert [(x.ino, x.ranges) for x in again] == [(ino, ((0, 64 << 10),))]
    p.pool.wait()
    clock.t += 1
    assert p.run(a).status == DONE and p.alloc_failures(1, clock.t) == []  # counted once


def test_the_reader_threads_take_up_to_a_ticks_worth_within_the_descriptor_limit(monkeypatch):
    """The loop collects once a tick: at 32 files in flight the lab's import re-warm ran 24 s into the workload. Up
    to 256 files wait at once, never more than a quarter of the descriptors the process may open."""
    import resource

    from cachepilot.actuators import readpool

    assert readpool.ReadPool(8, Clock()).limit == min(256, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)
    monkeypatch.setattr(readpool.resource, "getrlimit", lambda _: (4096, 4096))
    assert readpool.ReadPool(8, Clock()).limit == 256
    monkeypatch.setattr(readpool.resource, "getrlimit", lambda _: (200, 4096))
    assert readpool.ReadPool(8, Clock()).limit == 50
