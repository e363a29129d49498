"""Promotion on a cache that inserts its own read misses (bcache): promote only what it did not keep -- files read
while it was bypassing reads -- and never a file already resident in the cache since it last changed."""

from __future__ import annotations

from cachepilot.engine import Engine, Promote
from cachepilot.engine.admission import BYPASSED_LATER, LEFT_TO_POLICY, SKIP_INSERTED, SKIP_RESIDENT
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.hotness import F_RESIDENT
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
POLICY = """
version: 1
defaults:
  failure_model: recoverable
  promotion: {enabled: true, rate: 1MiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
"""


def engine(kind: str = "bcache") -> Engine:
    return Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="v0", kind=kind, cache_bytes=1 << 30)])


def sample(e: Engine, t: float, bypasses: int | None, cache_id: str = "cset-a") -> None:
    e.sample(VolumeSample(DEV, int(t * NS), "writeback", 0, 0, 0, 0, False, {}, cache_id, bypasses=bypasses))


def read(e: Engine, ino: int, score: int = 64, written: int = 0) -> None:
    e.feed(HotnessDelta(FileKey(DEV, ino, 1), score, 64 if written else 0, 4096, written, 1, size=16384))


def promoted(e: Engine, t: float) -> list[Promote]:
    return [a for a in e.tick(int(t * NS)) if isinstance(a, Promote)]


def test_no_read_bypassed_means_bcache_inserted_the_misses_itself() -> None:
    e = engine()
    sample(e, 0, bypasses=100)
    sample(e, 1, bypasses=100)
    read(e, 1)
    assert not promoted(e, 1)  # waits: a bypass may still show (bcache folds its counters every ~14 s)
    for t in range(2, 33):
        sample(e, t, bypasses=100)
        assert not promoted(e, t)
    c = e.vols[DEV]
    assert c.promotions_skipped == {SKIP_INSERTED: 1} and not c.bypass_wait
    slot = e.hotness.lookup(DEV, 1, 1)
    assert slot is not None and e.hotness.flags[slot] & F_RESIDENT


def test_a_volume_that_bypasses_reads_gets_its_hot_files_promoted_with_the_reason() -> None:
    e = engine()
    sample(e, 0, bypasses=100)
    sample(e, 5, bypasses=180)  # bcache sent 80 reads around itself (a sequential run past the cutoff)
    read(e, 1)
    [p] = promoted(e, 6)
    assert p.ino == 1 and "last evicted" in p.reason and "the cache bypassed reads 1 s ago" in p.reason


def test_a_bypass_that_shows_after_the_admission_still_promotes_the_file() -> None:
    e = engine()
    sample(e, 0, bypasses=100)
    read(e, 1)
    assert not promoted(e, 1)
    sample(e, 14, bypasses=140)  # the stats fold that carries the file's bypassed reads
    [p] = promoted(e, 14)
    assert p.ino == 1 and p.reason == BYPASSED_LATER


def test_a_resident_file_is_not_promoted_again_until_written_or_the_cache_changes() -> None:
    e = engine()
    sample(e, 0, bypasses=0)
    sample(e, 1, bypasses=10)
    read(e, 1)
    assert [p.ino for p in promoted(e, 1)] == [1]
    c = e.vols[DEV]
    slot = e.hotness.lookup(DEV, 1, 1)
    assert slot is not None
    c.cached.discard(slot)  # out of the believed-cached set (e.g. evicted by colder admissions' pressure)
    sample(e, 2, bypasses=20)
    read(e, 1)
    assert not promoted(e, 2)  # re-admitted, but promoted since the cache last changed
    assert c.promotions_skipped == {SKIP_RESIDENT: 1}
    c.cached.discard(slot)
    read(e, 1, written=4096)  # a write: its blocks may have moved
    assert [p.ino for p in promoted(e, 3)] == [1]
    sample(e, 4, bypasses=20, cache_id="cset-b")  # a new cache holds nothing: re-warmed, resident forgotten
    assert [p.ino for p in promoted(e, 4)] == [1]
    assert e.hotness.flags[slot] & F_RESIDENT  # promoted into the new one


def test_dm_cache_leaves_admitted_files_to_smq() -> None:
    """smq promotes hot blocks from the workload's own read misses: a promotion read of a file the workload keeps
    reading repeats that at the cost of origin reads (the lab's W3). The file is admitted (a member, for re-warms
    and exports) but not read, and the skip is counted by reason."""
    for kind in ("dm-cache", "lvmcache"):
        e = engine(kind)
        sample(e, 0, bypasses=None)
        read(e, 1)
        assert promoted(e, 1) == [] and promoted(e, 2) == []
        c = e.vols[DEV]
        slot = e.hotness.lookup(DEV, 1, 1)
        assert slot is not None and slot in c.cached and not e.hotness.flags[slot] & F_RESIDENT
        assert c.promotions_skipped == {LEFT_TO_POLICY: 1} and not len(c.promo_queue)


def test_dm_cache_still_rewarms_what_a_replaced_cache_lost() -> None:
    """A new cache device holds none of the set: its members are read at once, not left to smq's misses."""
    e = engine("dm-cache")
    sample(e, 0, bypasses=None)
    read(e, 1)
    assert promoted(e, 1) == []
    sample(e, 2, bypasses=None, cache_id="cset-b")
    [p] = promoted(e, 2)
    assert p.ino == 1 and "cache device replaced" in p.reason


def test_dm_cache_with_only_uncached_false_promotes_every_admitted_file() -> None:
    e = Engine(parse_policy(POLICY.replace("sieve_size: 1MiB}", "sieve_size: 1MiB, only_uncached: false}"), "t.yaml"),
               [VolumeInfo(dev=DEV, name="v0", kind="dm-cache", cache_bytes=1 << 30)])
    sample(e, 0, bypasses=None)
    read(e, 1)
    [p] = promoted(e, 1)
    assert p.ino == 1 and p.reason.startswith("counter")


def test_dm_writecache_is_never_promoted_to() -> None:
    """dm-writecache caches writes only (promote_rounds 0): no promotion is decided there, where each was a decision
    record, a log line and a skip (W4: hundreds a run)."""
    e = engine("dm-writecache")
    sample(e, 0, bypasses=None)
    for ino in range(1, 6):
        read(e, ino)
    assert promoted(e, 1) == [] and promoted(e, 2) == []
    assert not len(e.vols[DEV].promo_queue)


def test_only_uncached_false_promotes_every_admitted_file() -> None:
    e = Engine(parse_policy(POLICY.replace("sieve_size: 1MiB}", "sieve_size: 1MiB, only_uncached: false}"), "t.yaml"),
               [VolumeInfo(dev=DEV, name="v0", kind="bcache", cache_bytes=1 << 30)])
    sample(e, 0, bypasses=100)
    sample(e, 1, bypasses=100)
    read(e, 1)
    [p] = promoted(e, 1)
    assert p.reason.startswith("counter") and "bypass" not in p.reason


def test_a_detach_forgets_what_was_resident() -> None:
    """bcache drops a detached backing device's cached data: after a re-attach, even of the same cache set, the
    files are not resident any more (promoted again while the cache bypasses reads)."""
    e = engine()
    sample(e, 0, bypasses=0)
    sample(e, 1, bypasses=10)
    read(e, 1)
    assert [p.ino for p in promoted(e, 1)] == [1]
    slot = e.hotness.lookup(DEV, 1, 1)
    assert slot is not None and e.hotness.flags[slot] & F_RESIDENT
    sample(e, 2, bypasses=10, cache_id="")  # detached
    assert not e.hotness.flags[slot] & F_RESIDENT
    sample(e, 3, bypasses=20)  # the same set back
    e.vols[DEV].cached.discard(slot)
    read(e, 1)
    assert [p.ino for p in promoted(e, 3)] == [1]
