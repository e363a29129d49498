"""Lifetime-aware write-back (engine.lifetime): the delete-age histogram, the hold it derives within the cache's
room, the knob requests the engine makes from it (recoverable only, never over a pinned knob) and the backends
putting the steered values back when the daemon stops."""

from __future__ import annotations

import pytest

from cachepilot.actions import SetKnob
from cachepilot.engine import Engine
from cachepilot.engine.lifetime import MIN_EVIDENCE, DeleteAges, VolumeLifetimes, hold_for
from cachepilot.errors import UserError
from cachepilot.events import Delete, FileKey, HotnessDelta, kdev
from cachepilot.models.hotness import deletes_array
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from cachepilot.policy.model import LifetimeHold

NS = 1_000_000_000
MIB = 1 << 20
DEV = kdev(252, 0)

RECOVERABLE = """
version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: false}
  discard_on_delete: {enabled: false}
"""


def test_quantile_is_the_age_by_which_the_share_of_deleted_bytes_died() -> None:
    h = DeleteAges()
    assert h.quantile(0.9) is None  # no evidence yet
    h.add(3 * NS, 9 * MIB, NS)  # bucket up to 4 s
    h.add(100 * NS, 1 * MIB, NS)  # bucket up to 128 s
    assert h.quantile(0.9) == 4.0
    assert h.quantile(0.95) == 128.0
    h.add(0, 1, NS)
    assert h.quantile(0.0) == 0.5  # the first bucket's edge


def test_histogram_decays_and_forgets_below_the_evidence_floor() -> None:
    h = DeleteAges()
    h.add(3 * NS, MIN_EVIDENCE * 2, 1)
    assert h.quantile(0.5) == 4.0
    h.add(3 * NS, 0, 1 + 1800 * NS * 2)  # two half-lives later: a quarter of the weight is left
    assert h.total() == pytest.approx(MIN_EVIDENCE / 2)
    assert h.quantile(0.5) is None


def lifetimes(age_s: float, deleted: int, rate: float) -> VolumeLifetimes:
    lt = VolumeLifetimes(rate=rate)
    lt.ages.add(int(age_s * NS), deleted, NS)
    return lt


def test_bcache_hold_is_rate_times_hold_within_the_write_cutoff_room() -> None:
    pol = LifetimeHold()
    h = hold_for("bcache", 1024 * MIB, lifetimes(20, 64 * MIB, 4 * MIB), pol)  # 2 x 4 MiB/s x 32 s = 256 MiB
    assert h is not None and h.knob == "writeback_percent" and h.value == 25
    assert "90% of 64.0 MiB deleted died by 32 s" in h.reason and "room 30%" in h.reason
    h = hold_for("bcache", 256 * MIB, lifetimes(20, 64 * MIB, 4 * MIB), pol)  # would need 100%: the room caps
    assert h is not None and h.value == 30
    h = hold_for("bcache", 1024 * MIB, lifetimes(1, 64 * MIB, 1 * MIB), pol)  # dies within a second: stock floor
    assert h is not None and h.value == 10
    h = hold_for("bcache", 1024 * MIB, lifetimes(3600, 64 * MIB, 4 * MIB), LifetimeHold(max_hold_s=16))
    assert h is not None and h.value == 13 and "capped by max_hold" in h.reason  # 2 x 4 x 16 s of 1 GiB
    assert hold_for("dm-cache", 1024 * MIB, lifetimes(20, 64 * MIB, MIB), pol) is None  # no such knob
    assert hold_for("bcache", 1024 * MIB, lifetimes(20, MIB, MIB), pol) is None  # too little evidence


def test_writecache_hold_is_the_high_watermark_below_full() -> None:
    h = hold_for("dm-writecache", 256 * MIB, lifetimes(20, 64 * MIB, 4 * MIB), LifetimeHold())
    assert h is not None and h.knob == "high_watermark" and h.value == 90
    h = hold_for("dm-writecache", 4096 * MIB, lifetimes(20, 64 * MIB, 4 * MIB), LifetimeHold())
    assert h is not None and h.value == 50  # the kernel's default is the floor


def run_workload(e: Engine, vol: VolumeInfo, seconds: int, knobs: dict[str, str],
                 age_s: int = 20) -> list[SetKnob]:
    """A file of 1 MiB written every second, each deleted age_s later; a tick and a sample every second."""
    out: list[SetKnob] = []
    for t in range(seconds):
        e.feed(HotnessDelta(FileKey(DEV, 1000 + t, 1), 0, 64, 0, MIB, t * NS + 1, size=MIB))
        if t >= age_s:
            e.feed(Delete(FileKey(DEV, 1000 + t - age_s, 1), MIB, t * NS + 2))
        e.sample(VolumeSample(DEV, t * NS + 3, "writeback", 8 * MIB, 0, 0, 0, False, dict(knobs)))
        out += [a for a in e.tick(t * NS + 4) if isinstance(a, SetKnob)]
    return out


BCACHE = VolumeInfo(dev=DEV, name="bcache0", cache_bytes=128 * MIB)


def test_engine_raises_bcache_writeback_percent_from_the_deletes_it_saw() -> None:
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE])
    asks = run_workload(e, BCACHE, 40, {"writeback_percent": "10"})
    assert asks, "no hold requested"
    a = asks[-1]
    assert a.knob == "writeback_percent" and 10 < int(a.value) <= 30 and a.put_back_on_exit
    assert "lifetime hold 32 s" in a.reason and "died by 32 s" in a.reason and "; was 10" in a.reason
    assert e.lifetimes.of(DEV).why.startswith("lifetime hold")


def test_no_hold_under_destructive_nor_over_a_pinned_knob_nor_when_disabled() -> None:
    for text in (RECOVERABLE.replace("recoverable", "destructive"),
                 RECOVERABLE + "  knobs: {writeback_percent: 10}\n",
                 RECOVERABLE + "  lifetime_hold: {enabled: false}\n"):
        e = Engine(parse_policy(text, "t.yaml"), [BCACHE])
        asks = run_workload(e, BCACHE, 40, {"writeback_percent": "10", "writeback_delay": "1"})
        assert not [a for a in asks if a.put_back_on_exit], text


def test_files_never_seen_written_give_no_age() -> None:
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE])
    for i in range(64):
        e.feed(HotnessDelta(FileKey(DEV, i, 1), 64, 0, MIB, 0, NS, size=MIB))  # read only
        e.feed(Delete(FileKey(DEV, i, 1), MIB, 30 * NS))
    assert e.lifetimes.of(DEV).ages.total() == 0


def test_engine_feed_deletes_batch_counts_ages_as_delete_does() -> None:
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE])
    for i in range(8):
        e.feed(HotnessDelta(FileKey(DEV, i, 1), 0, 64, 0, MIB, NS, size=MIB))
    e.feed_deletes([(DEV, i, 1, MIB, 4 * NS) for i in range(8)])
    assert e.lifetimes.of(DEV).ages.quantile(0.5) == 4.0


def test_engine_feed_deletes_array_counts_ages_as_delete_does() -> None:
    """The kernel's deletes taken as one array (issue 32): the ages each Delete would add, no more (a file never
    written, another generation, an empty file: none)."""
    one, arr = (Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE]) for _ in range(2))
    recs = [(DEV, i, 1 if i != 3 else 2, MIB if i != 5 else 0, (4 + i) * NS) for i in range(8)] + [
        (DEV, 99, 1, MIB, 9 * NS)]
    for e in (one, arr):
        for i in range(8):
            e.feed(HotnessDelta(FileKey(DEV, i, 1), 0, 64, 0, MIB, NS, size=MIB))
    for r in recs:
        one.feed(Delete(FileKey(DEV, r[1], r[2]), r[3], r[4]))
    arr.feed_deletes_array(deletes_array(recs))
    assert arr.lifetimes.of(DEV).ages.bytes == one.lifetimes.of(DEV).ages.bytes
    # 8 written, one of another generation, one empty (the histogram decays with time: approximately)
    assert arr.lifetimes.of(DEV).ages.total() == pytest.approx(6 * MIB, rel=0.01)
    assert len(arr.hotness) == len(one.hotness) == 1  # the other generation's file stays


def test_writecache_hold_moves_only_by_five_points() -> None:
    vol = VolumeInfo(dev=DEV, name="dm-2", kind="dm-writecache", cache_bytes=32 * MIB)
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [vol])
    asks = run_workload(e, vol, 40, {"high_watermark": "50"})
    assert asks and asks[-1].knob == "high_watermark" and int(asks[-1].value) > 55
    e2 = Engine(parse_policy(RECOVERABLE, "t.yaml"), [vol])
    want = int(asks[-1].value)
    have = want - 3
    asks2 = run_workload(e2, vol, 40, {"high_watermark": str(have)})  # a reload suspends: not for 3 points
    assert str(want) not in [a.value for a in asks2]
    assert all(abs(int(a.value) - have) >= 5 for a in asks2)


def test_policy_lifetime_hold_section() -> None:
    p = parse_policy(RECOVERABLE + "  lifetime_hold: {share: 0.5, max_hold: 2m, headroom: 0.2}\n", "t.yaml")
    assert p.defaults.lifetime_hold == LifetimeHold(True, 0.5, 120.0, 0.2)
    with pytest.raises(UserError, match="share must be > 0"):
        parse_policy(RECOVERABLE + "  lifetime_hold: {share: 0}\n", "t.yaml")
    with pytest.raises(UserError, match="lifetime_hold"):
        parse_policy(RECOVERABLE + "  lifetime_hold: {share: 2}\n", "t.yaml")


def test_the_value_found_is_the_floor_the_hold_never_lowers_it() -> None:
    """An operator's writeback_percent 25 (not pinned by the policy) is not lowered to the stock 10 when the deletes
    ask for less; the hold only ever raises it."""
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE])
    asks = run_workload(e, BCACHE, 40, {"writeback_percent": "25"}, age_s=1)  # dies within 2 s: wants the floor
    assert e.lifetimes.of(DEV).why and "floor 25%" in e.lifetimes.of(DEV).why
    assert not asks


def test_bcache_in_use_beyond_the_dirty_data_shrinks_the_room() -> None:
    """bcache's write cutoff compares its in-use share (dirty buckets, metadata, buckets allocated since the last
    GC), not the dirty data: what is in use beyond the dirty share is taken off the room."""
    lt = lifetimes(20, 64 * MIB, 4 * MIB)
    h = hold_for("bcache", 256 * MIB, lt, LifetimeHold(), overhead=12)
    assert h is not None and h.value == 18 and "12% in use beyond the dirty data" in h.reason
    h = hold_for("bcache", 256 * MIB, lt, LifetimeHold(), overhead=35)
    assert h is not None and h.value == 10  # no room left: the floor, never below
    e = Engine(parse_policy(RECOVERABLE, "t.yaml"), [BCACHE])
    for t in range(40):
        e.feed(HotnessDelta(FileKey(DEV, 1000 + t, 1), 0, 64, 0, MIB, t * NS + 1, size=MIB))
        if t >= 20:
            e.feed(Delete(FileKey(DEV, 1000 + t - 20, 1), MIB, t * NS + 2))
        # 16 MiB dirty (12% of 128 MiB) but 32% in use: 20% overhead, room 10%
        e.sample(VolumeSample(DEV, t * NS + 3, "writeback", 16 * MIB, 0, 0, 0, False, {"writeback_percent": "10"},
                              in_use_percent=32))
        assert not [a for a in e.tick(t * NS + 4) if isinstance(a, SetKnob)]
    assert "20% in use beyond the dirty data" in e.lifetimes.of(DEV).why
