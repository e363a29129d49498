"""Promotion pacing on bcache's allocation failures (bcache_alloc_fail): the AIMD rate, the one re-read, the
promoter following it, the daemon's per-tick hook (a fake probe's counts) and the exported metrics."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from cachepilot.actions import Promote
from cachepilot.actuators.allocpace import REREAD, AllocBackoff
from cachepilot.actuators.promote import DONE, MIN_CHUNK, Promoter
from cachepilot.daemon.allocfail import pace_promotions
from tests.unit.test_promote import MIB, Clock, action, fs, make_file  # noqa: F401 (fs: the fixture)

S = 1_000_000_000


def promote(ino: int = 7, n: int = MIB) -> Promote:
    return Promote("bcache0", 1, ino, 1, ((0, n),), "hot")


def test_a_tick_with_failures_halves_the_rate_and_quiet_ticks_add_it_back_slowly() -> None:
    b = AllocBackoff(8 * MIB, floor=MIN_CHUNK, recover_s=8)
    b.observe(0, 0)
    assert b.rate == 8 * MIB
    b.observe(3, 1 * S)  # three failures since the last look
    assert b.rate == 4 * MIB and b.failures_total == 3
    b.observe(5, 2 * S)
    assert b.rate == 2 * MIB and b.failures_total == 5
    b.observe(5, 3 * S)  # no new failure: + max_rate / recover_s per second
    assert b.rate == 3 * MIB
    b.observe(5, 13 * S)
    assert b.rate == 8 * MIB  # never above the policy's rate
    for t in range(20):
        b.observe(6 + t, (14 + t) * S)
    assert b.rate == MIN_CHUNK  # never below the floor: promotion goes on, slowly


def test_what_was_read_in_a_tick_with_failures_is_read_once_more() -> None:
    b = AllocBackoff(8 * MIB, floor=MIN_CHUNK)
    b.observe(0, 0)
    b.read(promote(1), ((0, MIB),))
    assert b.observe(0, 1 * S) == []  # a quiet tick: nothing to read again, kept one more look
    assert b.observe(0, 2 * S) == []  # a second quiet look: forgotten
    b.read(promote(2), ((0, 256 << 10), (MIB, 64 << 10)))
    again = b.observe(2, 3 * S)
    assert [(a.ino, a.ranges) for a in again] == [(2, ((0, 256 << 10), (MIB, 64 << 10)))]
    assert again[0].reason.startswith(REREAD) and b.rereads_total == 1
    b.read(again[0], again[0].ranges)  # the re-read itself, in a tick that fails again: not read a third time
    assert b.observe(4, 4 * S) == []


def test_a_failure_counted_a_look_after_the_read_still_finds_it() -> None:
    """The insert follows the read's completion, so its failure can reach the count after the next look (the lab: 4
    failures counted and nothing to re-read); it is read once more, and only once."""
    b = AllocBackoff(8 * MIB, floor=MIN_CHUNK)
    b.observe(0, 0)
    b.read(promote(1), ((0, MIB),))
    assert b.observe(0, 1 * S) == []  # the look came before the count
    again = b.observe(3, 2 * S)
    assert [a.ino for a in again] == [1] and b.rereads_total == 1
    assert b.observe(5, 3 * S) == []  # not again


def test_a_reloaded_probe_counting_from_zero_is_not_taken_for_a_quiet_tick() -> None:
    b = AllocBackoff(8 * MIB, floor=MIN_CHUNK)
    b.observe(10, 0)
    b.observe(2, 1 * S)  # smaller than before: a new probe counted 2
    assert b.failures_total == 12 and b.rate == 2 * MIB


def test_the_promoter_on_bcache_reads_less_after_failures_and_records_its_reads(fs) -> None:  # noqa: F811
    info, d = fs
    info = replace(info, cache_bytes=8 << 30)  # burst = rate (1/1024 of the cache is larger)
    ino, gen = make_file(d / "f", [(0, 8 * MIB)])
    clock = Clock()
    p = Promoter(info, rate=4 * MIB, clock=clock)
    assert p.backoff is not None
    r = p.run(action(info, ino, gen, [(0, 8 * MIB)]))
    assert 4 * MIB - 256 * 1024 < r.read_bytes <= 4 * MIB  # a second's budget, in whole chunks
    clock.t += S
    again = p.alloc_failures(5, clock.t)  # the tick after: the cache refused inserts meanwhile
    assert p.rate == 2 * MIB and p.burst == 2 * MIB
    assert sum(n for a in again for _, n in a.ranges) == r.read_bytes  # what was read, once more
    assert p.run(r.deferred).read_bytes == 0  # the bucket is emptied: the allocator has nothing ready now
    clock.t += S
    r = p.run(r.deferred)
    assert 0 < r.read_bytes <= 2 * MIB  # a second's budget at the halved rate


def test_other_kinds_have_no_backoff(fs) -> None:  # noqa: F811
    info, _ = fs
    p = Promoter(replace(info, kind="dm-cache"), rate=4 * MIB)
    assert p.backoff is None and p.alloc_failures(9, S) == [] and p.rate == 4 * MIB


class FakeProbe:
    def __init__(self, counts: dict[int, int]) -> None:
        self.counts = counts

    def alloc_failures(self, dev: int) -> int:
        return self.counts.get(dev, 0)


def test_each_tick_the_volumes_cache_count_reaches_its_promoter_and_rereads_are_deferred(fs) -> None:  # noqa: F811
    info, d = fs
    ino, gen = make_file(d / "f", [(0, MIB)])
    p = Promoter(replace(info, cache_bytes=8 << 30), rate=4 * MIB, clock=Clock())
    assert p.run(action(info, ino, gen, [(0, MIB)])).status == DONE
    backing, cache = 0x800010, 0x800020
    v = SimpleNamespace(files=SimpleNamespace(promoter=p), found=SimpleNamespace(lower=(backing, cache)),
                        deferred=[])
    probe = FakeProbe({cache: 3, 0x800030: 99})  # another cache's failures are not this volume's
    pace_promotions([v], probe, S)  # type: ignore[list-item]
    assert p.backoff is not None and p.backoff.failures_total == 3 and p.rate == 2 * MIB
    assert [a.ino for a in v.deferred] == [ino]
    pace_promotions([v], None, 2 * S)  # no probe: nothing changes
    assert p.rate == 2 * MIB


def test_the_exporter_shows_failures_and_the_rate_per_volume() -> None:
    from cachepilot.exporter import collectors
    zero = {"promoted_bytes": 0, "discard_issued_bytes": 0, "discard_landed_bytes": 0}
    vol = SimpleNamespace(volume="data", device="bcache0", alloc_failures=23, promotion_rate=2.0 * MIB, **zero)
    other = SimpleNamespace(volume="db", device="dm-3", alloc_failures=None, promotion_rate=4.0 * MIB, **zero)
    got = {m.name: m for m in collectors.actuation(SimpleNamespace(volumes=[vol, other]))}  # type: ignore[arg-type]
    fails = got["cachepilot_bcache_alloc_failures"]
    assert fails.type == "counter"
    assert [(s.labels, s.value) for s in fails.samples if s.name.endswith("_total")] == \
        [({"volume": "data", "device": "bcache0"}, 23.0)]
    rate = got["cachepilot_volume_promotion_rate_bytes"]
    assert sorted(s.value for s in rate.samples) == [2.0 * MIB, 4.0 * MIB]
