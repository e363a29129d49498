"""Workload generators and the block-cache simulator."""

from __future__ import annotations

import pytest

from cachepilot import workloads as W
from cachepilot.errors import UserError
from cachepilot.sim import LRU, OPT, SMQ, prepare, run
from cachepilot.sim.runner import _NextRead, next_uses


def test_generators_are_seeded_and_parameterised() -> None:
    a = W.fileserver(iterations=200, nfiles=50, seed=7)
    b = W.fileserver(iterations=200, nfiles=50, seed=7)
    c = W.fileserver(iterations=200, nfiles=50, seed=8)
    assert a.ops == b.ops and a.ops != c.ops
    ops = {op for op, *_ in a.ops}
    assert {W.CREATE, W.WRITE, W.READ, W.APPEND, W.DELETE} <= ops
    v = W.varmail(iterations=100, nfiles=20)
    assert W.FSYNC in {op for op, *_ in v.ops}
    ws = W.webserver_backup(reads=2000, nfiles=300, hot_files=30)
    assert ws.scan is not None
    scanned = {fid for op, fid, _, _, tag in ws.ops[ws.scan[0]:ws.scan[1]] if tag == W.TAG_SCAN}
    assert scanned == set(range(300))  # one pass over everything
    wr = W.warm_restart(reads=1000, nfiles=100)
    assert wr.drop_at is not None and wr.ops[wr.drop_at][0] == W.DROP_CACHE
    with pytest.raises(UserError):
        W.fileserver(iterations=-1)


def test_zipf_is_skewed() -> None:
    w = W.warm_restart(reads=5000, nfiles=1000, hot_files=100)
    reads = [tag for op, _, _, _, tag in w.ops if op == W.READ]
    assert sum(1 for t in reads if t == W.TAG_HOT) / len(reads) > 0.5  # 10% of files, most reads


def test_prepare_events() -> None:
    p = prepare(W.fileserver(iterations=300, nfiles=40, op_interval_ms=10))
    assert p.tick_end[-1] == len(p.blk)
    kinds = {type(e).__name__ for evs in p.tick_events for e in evs}
    assert {"HotnessDelta", "Delete", "FreedExtent", "JournalCommit"} <= kinds


def _stream(blocks: list[int]) -> tuple[list[int], list[int]]:
    return blocks, list(range(len(blocks)))


def test_lru_smq_opt_basics() -> None:
    for c in (LRU(2), SMQ(2, promote_threshold=1)):
        assert c.read(1, 0) is False and c.read(1, 1) is True
        c.read(2, 2)
        c.read(3, 3)
        assert len(c) == 2
    # dirty eviction is written back; discard drops dirty data without writing
    c = LRU(2, writeback_percent=100)
    c.write(1, 0)
    c.write(2, 1)
    c.discard(2)
    c.write(3, 2)
    c.write(4, 3)  # evicts dirty 1
    assert c.written_back == 1 and c.dirty_dropped == 1
    c.flush()
    assert c.written_back == 3


def test_writeback_has_a_time_component_in_lba_order() -> None:
    """bcache: above the target back to it at once; below it at writeback_rate_minimum, in LBA order;
    idle at full speed. Today's main wrote back only on overflow, oldest first, with no time at all."""
    c = LRU(100, writeback_percent=10, rate_minimum=1.0)
    for i, b in enumerate([50, 7, 90, 3, 60, 20, 80, 11, 40, 30, 70, 99]):  # 12 dirty, target 10
        c.write(b, i)
    assert len(c.dirty) == 12 and c.written_back == 0  # nothing is written back between ticks
    assert c.tick(1.0, idle=False) == 2 and len(c.dirty) == 10  # back to the target: 3 and 7
    assert 3 not in c.dirty and 7 not in c.dirty
    assert c.tick(1.0, idle=False) == 1 and 11 not in c.dirty  # then one block a second, sweeping up
    assert c.tick(0.5, idle=False) == 0 and c.tick(0.5, idle=False) == 1 and 20 not in c.dirty
    assert c.tick(1.0, idle=True) == 8 and not c.dirty  # idle: everything
    assert c.written_back == 12


def test_smq_admits_on_hotspot_threshold_and_keeps_copies_on_discard() -> None:
    c = SMQ(64, writeback_percent=100)
    assert c.read(5, 0) is False and 5 not in c  # one miss: not promoted
    assert c.read(6, 1) is False and 6 in c  # the hotspot (blocks 0..15) missed twice: promoted
    c.write(40, 2)
    assert 40 not in c and c.written_through == 1  # a write miss goes to the origin
    c.write(6, 3)
    assert 6 in c.dirty
    c.discard(6)
    assert 6 in c and 6 in c.dirty and c.dirty_dropped == 0  # dm-cache keeps the copy, dirty included
    lru = LRU(64, writeback_percent=100)
    lru.write(6, 0)
    lru.discard(6)
    assert 6 not in lru and lru.dirty_dropped == 1  # bcache drops it


def test_opt_beats_lru_and_smq() -> None:
    p = prepare(W.warm_restart(reads=3000, nfiles=400, hot_files=40))
    cap = p.data_blocks_peak // 5
    aux = (next_uses(p), _NextRead(p))
    opt = run(p, "opt", False, cap, opt_aux=aux)
    assert isinstance(opt, object)
    for pol in ("lru", "smq"):
        r = run(p, pol, False, cap)
        assert opt.hit_ratio >= r.hit_ratio
    assert OPT.name == "opt"


def test_discards_cut_origin_writes_on_fileserver() -> None:
    p = prepare(W.fileserver(iterations=1500, nfiles=150, op_interval_ms=10))
    cap = p.data_blocks_peak * 2
    stock = run(p, "lru", False, cap, 40.0)
    ctl = run(p, "lru", True, cap, 40.0)
    assert ctl.actions["discard"] > 0 and ctl.discarded_blocks > 0
    assert ctl.origin_write_bytes < stock.origin_write_bytes
    assert ctl.hit_ratio >= stock.hit_ratio


def test_warm_restart_rewarms() -> None:
    p = prepare(W.warm_restart(reads=30000, nfiles=4000, hot_files=400))
    cap = p.data_blocks_peak // 4
    stock = run(p, "lru", False, cap)
    ctl = run(p, "lru", True, cap)
    assert ctl.promoted_bytes > 0
    first = p.workload.drop_at // 1000 + 1  # type: ignore[operator]  # the first tick after the drop

    def hot(r: object) -> float:
        n, h = r.hot_per_tick[first]  # type: ignore[attr-defined]
        return h / n

    assert hot(ctl) > hot(stock) + 0.05


def test_simulate_cli_rejects_bad_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from cachepilot.cli import main

    assert main(["simulate", "--policies", "lru,clock"]) == 2
    assert "unknown cache policy 'clock'" in capsys.readouterr().err


def test_simulator_emits_what_the_kernel_emits() -> None:
    """fsyncs arrive as SyncCalls counted per tick; epochs are closed only by the block barrier of the journal
    commit (PREFLUSH|FUA with the data/metadata split); freed extents carry the running transaction."""
    from cachepilot.events import Barrier, BarrierKind, FreedExtent, JournalCommit, SyncCalls
    from cachepilot.models.epochs import BLOCK_BARRIERS, EpochTracker

    w = W.varmail(iterations=200, nfiles=20)
    fsyncs = sum(1 for op, *_ in w.ops if op == W.FSYNC)
    p = prepare(w)
    evs = [e for tick in p.tick_events for e in tick]
    barriers = [e for e in evs if isinstance(e, Barrier)]
    assert barriers and all(b.kind in BLOCK_BARRIERS and b.closes_epoch and b.flags == 3 for b in barriers)
    assert all(b.epoch_bytes == b.epoch_data_bytes + b.epoch_meta_bytes for b in barriers)
    assert sum(e.calls for e in evs if isinstance(e, SyncCalls)) == fsyncs
    assert all(e.kind is BarrierKind.FSYNC for e in evs if isinstance(e, SyncCalls))
    committed: set[int] = set()
    for e in evs:  # every free is tagged with a transaction that has not committed yet, and later commits
        if isinstance(e, JournalCommit):
            committed.add(e.transaction)
        elif isinstance(e, FreedExtent):
            assert e.tid > 0 and e.tid not in committed
    frees = {e.tid for e in evs if isinstance(e, FreedExtent)}
    assert frees and frees <= committed | {max(committed) + 1}
    tr = EpochTracker(window=100_000)
    for e in evs:
        if isinstance(e, Barrier | SyncCalls):
            tr.feed(e)
    assert tr.total_barriers == len(barriers) and tr.total_syncs == fsyncs
    assert sum(ep.bytes for ep in tr.window) == sum(b.epoch_bytes for b in barriers)  # counted once


def test_late_drains_save_origin_writes_on_a_lifetime_mix_at_the_same_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: under the destructive default (30 s bound) drains timed by their measured duration let more young
    files die in the cache than drains at max_age/2 (the schedule before, forced here by pinning the lead at A/2):
    fewer bytes written to the origin, the witness (oldest dirty data) still within the bound."""
    from cachepilot.engine.drains import Drains
    from cachepilot.policy.model import DEFAULT_POLICY

    p = prepare(W.fileserver_lifetimes(iterations=3000, nfiles=400), tick_s=1.0)
    cap = p.data_blocks_peak * 3
    late = run(p, "lru", True, cap, 40.0, ctl_policy=DEFAULT_POLICY)
    monkeypatch.setattr(Drains, "lead", lambda self, c, now, half: (half, "at max_age/2"))
    half = run(p, "lru", True, cap, 40.0, ctl_policy=DEFAULT_POLICY)
    assert late.origin_write_bytes < half.origin_write_bytes, (late.origin_write_bytes, half.origin_write_bytes)
    assert late.dirty_dropped_blocks > half.dirty_dropped_blocks
    assert late.exposure_age_max_s <= 30 and half.exposure_age_max_s <= 30
    assert late.actions["set_write_policy"] == 0  # no write-through forced by the byte bound


def test_the_lifetime_mix_kills_a_share_of_new_files_young() -> None:
    """Half the new files (short_share 0.5) die 2-60 s old; the long-lived set (2 000 files) outlives the run."""
    w = W.fileserver_lifetimes(iterations=2000, nfiles=2000, short_share=0.5, seed=9)
    assert w.ops == W.fileserver_lifetimes(iterations=2000, nfiles=2000, short_share=0.5, seed=9).ops
    born: dict[int, float] = {}
    ages: dict[int, float] = {}
    for i, (op, fid, *_) in enumerate(w.ops):
        if op == W.CREATE:
            born[fid] = i * w.op_interval_ns / 1e9
        elif op == W.DELETE:
            ages[fid] = i * w.op_interval_ns / 1e9 - born[fid]
    end = len(w.ops) * w.op_interval_ns / 1e9
    early = [f for f in range(2000, 4000) if born[f] < end - 61]  # any short one among them died in the run
    young = [ages[f] for f in early if f in ages]
    assert len(early) > 500 and 0.4 < len(young) / len(early) < 0.6
    assert 2.0 <= min(young) and max(young) <= 61
    with pytest.raises(UserError):
        W.fileserver_lifetimes(short_min_s=0)
