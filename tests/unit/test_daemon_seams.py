"""The daemon's seams: the per-volume handle and its table, persistence through engine methods only."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cachepilot.actions import DiscardRanges, Promote, SetKnob
from cachepilot.daemon.decisionlog import DecisionLog
from cachepilot.daemon.persist import Persistence
from cachepilot.daemon.state import StateFile
from cachepilot.daemon.volume import ManagedVolume, VolumeTable
from cachepilot.daemon.volumes import Found
from cachepilot.engine.engine import Engine
from cachepilot.events import Discard, kdev
from cachepilot.models.hotness import F_READ
from cachepilot.models.volume import VolumeInfo

NS = 1_000_000_000
FS = kdev(252, 1)
CACHED = kdev(252, 0)
LOWER = kdev(8, 16)
INFO = VolumeInfo(dev=FS, name="dm-1", kind="dm-cache", fs_uuid="u-1", mountpoint="/mnt/x", cache_id="c-1")


def test_the_table_keeps_every_index_in_step_and_routes_block_events_to_the_filesystem() -> None:
    t = VolumeTable()
    v = ManagedVolume(Found(INFO, lower=(LOWER,), block_dev=CACHED), None)
    t.add(v)
    assert t[FS] is v and t.named("dm-1") is v and list(t) == [FS] and len(t) == 1
    ev = t.route(Discard(CACHED, 0, 8, 0))
    assert ev.dev == FS  # the engine's key: the filesystem stacked on the cached device
    t.route(Discard(LOWER, 0, 8, 0))  # landed on a device below: counted on its volume
    assert v.discard_landed_bytes == 4096
    assert t.pop(FS) is v and t.named("dm-1") is None and FS not in t and t.pop(FS) is None
    assert t.route(Discard(CACHED, 0, 8, 0)).dev == CACHED and v.discard_landed_bytes == 4096


def test_the_handle_holds_deferred_promotions_while_held_and_hands_out_retries_when_due() -> None:
    v = ManagedVolume(Found(INFO), None)
    p = Promote("dm-1", FS, 12, 1, ((0, 4096),), "t")
    d = DiscardRanges("dm-1", FS, ((0, 4096),), "t")
    v.deferred = [p, d]
    assert v.take_deferred(held=True) == [d] and v.deferred == [p]
    assert v.take_deferred(held=False) == [p] and v.deferred == []
    k = SetKnob("dm-1", "k", "1", "t")
    v.retry_later(0, 0, k)  # first retry after 1 s, attempt 1
    assert v.due_retries(NS - 1) == [] and v.due_retries(NS) == [(1, k)] and v.retries == []


def test_persistence_restores_a_latch_and_rewarms_through_engine_methods(tmp_path: Path) -> None:
    engine = Engine()
    engine.add_volume(INFO)
    counters: Counter[str] = Counter()
    sf = StateFile(tmp_path)
    p = Persistence(sf, engine, counters, lambda _: None)
    v = ManagedVolume(Found(INFO), None)
    doc = {"volumes": {"dm-1": {"name": "dm-1", "kind": "dm-cache", "fs_uuid": "u-1",
                                "hot": [[5, 1, 100, 8192], [0, 1, 9, 1], "bad"],
                                "latch": {"reason": "cache device failed", "cache_id": "c-1"}}},
           "decisions": [{"action": "x"}], "counters": {"ticks": 3}}
    assert sf.write(doc)
    decisions = DecisionLog(10)
    p.read(decisions)
    assert list(decisions) == [{"action": "x"}] and p.previous_counters == {"ticks": 3}
    p.adopted(v, 7)
    latch = engine.latch_of(FS)
    assert latch is not None and latch.reason == "cache device failed (kept from the state file)"
    assert counters["rewarm_files"] == 1
    slot = engine.hotness.update(FS, 5, 1, 0, 0, 0, 7, 8192)  # the same file: its slot
    assert engine.hotness.flags[slot] & F_READ
    # an engine latch already set is kept, not overwritten
    assert engine.restore_latch(FS, "other", 9, "") is latch
    saved = p.doc([v], decisions)["volumes"]["dm-1"]
    assert saved["latch"] == {"reason": latch.reason, "cache_id": "c-1"} and saved["health"] == "OK"
    assert saved["hot"][0][:2] == [5, 1]


def test_a_latch_on_a_replaced_cache_device_is_not_restored(tmp_path: Path) -> None:
    engine = Engine()
    engine.add_volume(INFO)
    sf = StateFile(tmp_path)
    assert sf.write({"volumes": {"dm-1": {"fs_uuid": "u-1", "latch": {"reason": "r", "cache_id": "old"}}}})
    p = Persistence(sf, engine, Counter(), lambda _: None)
    p.read([])
    p.adopted(ManagedVolume(Found(INFO), None), 1)
    assert engine.latch_of(FS) is None and engine.restore_latch(kdev(1, 1), "r", 1, "") is None
