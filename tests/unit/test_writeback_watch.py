"""Stuck write-back found and explained, and a dm-cache that came back all dirty (issue 36 items 3 and 4;
models/writeback.py): the watch on samples, each kind's view of its write-back read from fixture trees and a fake
dmsetup, the engine's findings, status and the decision log -- and no write to the operator's knob."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from cachepilot.actions import SetKnob
from cachepilot.backends.dmcache import SMQ_BUSY
from cachepilot.backends.host import Host
from cachepilot.backends.inspect import sample_volume
from cachepilot.commands.status import _writeback as render_writeback
from cachepilot.engine import Engine
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.models.writeback import WritebackView, WritebackWatch
from cachepilot.policy import parse_policy

NS = 1_000_000_000
MIB = 1 << 20


def run(w: WritebackWatch, samples: Sequence[tuple[float, int]], view: WritebackView | None, *,
        draining: bool = False, after: float = 60.0, written: int = 0) -> list:  # type: ignore[type-arg]
    out = []
    for t, dirty in samples:
        out += w.observe("v", int(t * NS), dirty, view, draining, after, written)
    return out


def flat(t0: float, t1: float, dirty: int, step: float = 5.0) -> list[tuple[float, int]]:
    n = int((t1 - t0) / step)
    return [(t0 + i * step, dirty) for i in range(n + 1)]


# ------------------------------------------------------------------ the watch
def test_writeback_switched_off_is_a_stall_after_the_configured_time_and_says_so() -> None:
    w = WritebackWatch()
    off = WritebackView(running=False, rate_bytes=0, hold_bytes=100 * MIB)  # below bcache's target, yet stopped
    assert run(w, flat(0, 55, 20 * MIB), off) == []
    assert w.stalled_ns is None and w.stalled_s(55 * NS) == 55
    [f] = run(w, [(60, 20 * MIB)], off)
    assert f.found and f.kind == "writeback_stall" and "writeback_running is 0" in f.why
    assert "leaves it so" in f.why  # what the daemon does about the operator's knob: nothing
    [end] = run(w, [(65, 19 * MIB)], off)  # dirty falls again (someone set it back to 1)
    assert not end.found and "falls again" in end.why and w.stalled_ns is None


def test_dirty_data_the_kind_holds_on_purpose_is_no_stall() -> None:
    w = WritebackView(running=True, rate_bytes=4096, hold_bytes=100 * MIB)
    watch = WritebackWatch()
    assert run(watch, flat(0, 3600, 20 * MIB), w) == [] and watch.stalled_s(3600 * NS) == 0


def test_a_drain_is_write_back_that_must_run_whatever_the_kind_holds() -> None:
    view = WritebackView(running=True, rate_bytes=4096, hold_bytes=100 * MIB)
    [f] = run(WritebackWatch(), flat(0, 60, 20 * MIB), view, draining=True)
    assert f.found and "during a drain" in f.why


def test_above_the_target_at_the_minimum_rate_with_no_writes() -> None:
    view = WritebackView(running=True, rate_bytes=4096, hold_bytes=10 * MIB)
    [f] = run(WritebackWatch(), flat(0, 60, 20 * MIB), view)
    assert "minimum rate" in f.why


def test_dm_cache_under_sustained_writes_cleans_nothing_and_the_reason_is_named() -> None:
    w = WritebackWatch()
    out = []
    for i in range(13):  # writes to new blocks every sample, dirty never falls
        view = WritebackView(writes=100 * i, overwrites=0, mapped_bytes=200 * MIB, policy="smq", busy_hold=SMQ_BUSY)
        out += w.observe("v", i * 5 * NS, 20 * MIB + i * MIB, view, False, 60, 0)
    [f] = out
    assert "writes kept coming" in f.why and "smq cleans only once the origin has been idle" in f.why


def test_the_same_blocks_dirtied_again_and_again() -> None:
    w = WritebackWatch()
    out = []
    for i in range(13):
        view = WritebackView(writes=100 * i, overwrites=90 * i, mapped_bytes=200 * MIB, policy="smq")
        out += w.observe("v", i * 5 * NS, 20 * MIB, view, False, 60, 0)
    [f] = out
    assert "hit blocks already cached" in f.why and "dirtied again" in f.why


def test_bcache_writing_back_but_overtaken_by_new_writes() -> None:
    w = WritebackWatch()
    out = []
    view = WritebackView(running=True, rate_bytes=8 * MIB, hold_bytes=0)
    for i in range(13):
        out += w.observe("v", i * 5 * NS, 20 * MIB, view, False, 60, i * 40 * MIB)
    [f] = out
    assert "write-back runs at 8388608 B/s but new writes" in f.why


def test_nothing_written_and_nothing_written_back_points_at_the_origin() -> None:
    [f] = run(WritebackWatch(), flat(0, 60, 20 * MIB), WritebackView(writes=5, overwrites=0, policy="smq"))
    assert "origin does not take writes" in f.why


def test_the_kinds_own_sleep_is_waited_out_before_a_stall() -> None:
    view = WritebackView(running=True, hold_bytes=0, quiet_s=600)  # writeback_delay 300
    w = WritebackWatch()
    assert run(w, flat(0, 590, 20 * MIB), view) == []
    assert [f.found for f in run(w, [(600, 20 * MIB)], view)] == [True]


def test_stall_after_zero_looks_for_none() -> None:
    w = WritebackWatch()
    assert run(w, flat(0, 3600, 20 * MIB), WritebackView(running=False), after=0) == [] and w.stalled_s(3600 * NS) == 0


def test_falling_dirty_data_is_progress_and_measures_the_rate() -> None:
    w = WritebackWatch()
    assert run(w, [(t, (100 - t) * MIB) for t in range(0, 100, 5)], WritebackView(running=True)) == []
    assert w.rate == pytest.approx(MIB, rel=0.01) and w.clean_eta_s(50 * MIB) == pytest.approx(50, rel=0.01)


def test_a_dm_cache_that_comes_back_all_dirty_is_named_with_its_time_to_clean() -> None:
    w = WritebackWatch()
    view = WritebackView(writes=0, overwrites=0, mapped_bytes=100 * MIB, policy="smq")
    [f] = run(w, [(0, 100 * MIB)], view, after=0)
    assert f.kind == "all_dirty" and f.found and "came back with every mapped block dirty" in f.why
    assert "unclean shutdown" in f.why and w.came_back and w.clean_eta_s(100 * MIB) is None  # not measured yet
    run(w, [(10, 99 * MIB), (20, 98 * MIB)], view, after=0)  # cleaning at 100 KiB/s
    assert w.all_dirty_ns is not None and w.clean_eta_s(98 * MIB) == pytest.approx(980, rel=0.01)
    [end] = run(w, [(30, 80 * MIB)], view, after=0)
    assert not end.found and w.all_dirty_ns is None


def test_a_cache_filled_dirty_later_has_all_blocks_dirty_but_did_not_come_back_so() -> None:
    w = WritebackWatch()
    run(w, [(0, 10 * MIB)], WritebackView(mapped_bytes=50 * MIB), after=0)
    [f] = run(w, [(5, 50 * MIB)], WritebackView(mapped_bytes=50 * MIB), after=0)
    assert "has every mapped block dirty" in f.why and not w.came_back


def test_a_nearly_empty_cache_says_nothing_about_how_it_came_back() -> None:
    assert run(WritebackWatch(), [(0, 4096)], WritebackView(mapped_bytes=4096), after=0) == []


# ------------------------------------------------------------------ each kind's view, from the kernel's own text
def bcache_tree(root: Path, running: str | None = "0") -> None:
    d = root / "block" / "bcache0" / "bcache"
    (d / "stats_total").mkdir(parents=True)
    cset = root / "fs" / "bcache" / "uuid"
    (cset / "cache0").mkdir(parents=True)
    (d / "cache").symlink_to(cset)
    files = {"cache_mode": "writethrough [writeback] writearound none", "dirty_data": "24.0M", "state": "dirty",
             "writeback_percent": "10", "writeback_delay": "30", "sequential_cutoff": "4.0M",
             "writeback_rate": "4.0k", "stats_total/cache_hits": "5", "stats_total/cache_misses": "7",
             "stats_total/cache_bypass_hits": "2", "stats_total/cache_bypass_misses": "9",
             "stats_total/bypassed": "1.5M"}
    if running is not None:
        files["writeback_running"] = running
    for name, value in files.items():
        (d / name).write_text(value + "\n")
    (cset / "cache0" / "io_errors").write_text("0\n")


def test_bcache_view_reads_writeback_running_rate_target_and_sleep(tmp_path: Path) -> None:
    bcache_tree(tmp_path)
    info = VolumeInfo(dev=1, name="bcache0", kind="bcache", cache_bytes=1 << 30)
    v = sample_volume(info, host=Host(sysfs=tmp_path), now_ns=1).writeback
    assert v == WritebackView(running=False, rate_bytes=4096, hold_bytes=(1 << 30) // 10, quiet_s=60.0)


def test_bcache_view_without_writeback_running_says_unknown(tmp_path: Path) -> None:
    bcache_tree(tmp_path, running=None)
    v = sample_volume(VolumeInfo(dev=1, name="bcache0", kind="bcache"), host=Host(sysfs=tmp_path), now_ns=1).writeback
    assert v is not None and v.running is None


def dm_host(tmp_path: Path, status: str, table: str) -> Host:
    (tmp_path / "block" / "dm-2" / "dm").mkdir(parents=True)
    (tmp_path / "block" / "dm-2" / "dm" / "name").write_text("lab-cached\n")

    def dm(args: Sequence[str], timeout: float) -> str:
        return {"status": status, "table": table}[args[0]]

    return Host(sysfs=tmp_path, dm=dm)


DMC_TABLE = "0 2097152 cache 254:3 254:4 254:1 128 1 writeback smq 0"


@pytest.mark.parametrize(("tail", "note"), [("smq 0 rw -", ""), ("smq 0 ro needs_check", "read-only")])
def test_dm_cache_view_counts_write_hits_and_mapped_blocks(tmp_path: Path, tail: str, note: str) -> None:
    status = f"0 2097152 cache 8 27/4096 128 100/2048 1 2 30 40 0 0 100 1 writeback 2 migration_threshold 2048 {tail}"
    info = VolumeInfo(dev=2, name="dm-2", kind="dm-cache", cache_bytes=2048 * 128 * 512)
    s = sample_volume(info, host=dm_host(tmp_path, status, DMC_TABLE), now_ns=1)
    v = s.writeback
    assert v is not None and (v.writes, v.overwrites, v.mapped_bytes, v.policy) == (70, 30, 100 * 128 * 512, "smq")
    assert s.dirty_bytes == v.mapped_bytes  # every mapped block dirty
    assert v.busy_hold == SMQ_BUSY  # smq cleans nothing while the origin is busy
    assert (note in v.note) if note else v.note == ""


@pytest.mark.parametrize(("args", "hold", "quiet"), [("4 high_watermark 50 low_watermark 45", 50, 0.0),
                                                    ("2 max_age 30000", 0, 60.0), ("1 cleaner", 0, 0.0)])
def test_writecache_view_holds_below_its_watermark_unless_max_age_or_cleaner(tmp_path: Path, args: str, hold: int,
                                                                            quiet: float) -> None:
    status = "0 2097152 writecache 0 65536 32768 0 10 5 200 30 20 0 0 0 0 0"
    info = VolumeInfo(dev=2, name="dm-2", kind="dm-writecache", cache_bytes=65536 * 4096)
    v = sample_volume(info, host=dm_host(tmp_path, status, f"0 2097152 writecache s 254:1 254:5 4096 {args}"),
                      now_ns=1).writeback
    assert v is not None and v.hold_bytes == 65536 * 4096 * hold // 100 and v.quiet_s == quiet
    assert (v.writes, v.overwrites) == (200, 50)
    # the pause under writes to the origin: the kernel's 3 s where the table sets none, none under the cleaner
    assert ("3000 ms, the kernel's default" in v.busy_hold) if "cleaner" not in args else v.busy_hold == ""


def writecache_view(tmp_path: Path, args: str, mode: str = "s") -> WritebackView:
    status = "0 2097152 writecache 0 65536 32768 0 10 5 200 0 0 0 0 0 0 0"
    info = VolumeInfo(dev=2, name="dm-2", kind="dm-writecache", cache_bytes=65536 * 4096)
    v = sample_volume(info, host=dm_host(tmp_path, status, f"0 2097152 writecache {mode} 254:1 254:5 4096 {args}"),
                      now_ns=1).writeback
    assert v is not None
    return v


def test_writecache_holding_write_back_under_writes_is_named(tmp_path: Path) -> None:
    v = writecache_view(tmp_path, "4 max_age 10000 pause_writeback 30000")
    assert "pause_writeback (30000 ms)" in v.busy_hold and "every flush (fsync)" in v.busy_hold
    w = WritebackWatch()
    out = []
    for i in range(13):  # an fsync loop rewriting one block: every write a write hit, nothing written back
        out += w.observe("v", i * 5 * NS, 20 * MIB, replace(v, writes=200 + i, overwrites=i), False, 40, 0)
    [f] = out
    assert "writes kept coming" in f.why and "8 of them to blocks already cached" in f.why  # since the stretch began
    assert "pause_writeback (30000 ms)" in f.why and "as fast as they are written back" not in f.why


@pytest.mark.parametrize(("args", "mode", "named"), [
    ("0", "s", "pause_writeback (3000 ms, the kernel's default)"),  # the stock table: PAUSE_WRITEBACK
    ("2 pause_writeback 0", "s", ""), ("0", "p", ""), ("1 cleaner", "s", "")])
def test_writecache_pause_is_the_kernels_default_unless_off_pmem_or_cleaner(tmp_path: Path, args: str, mode: str,
                                                                          named: str) -> None:
    v = writecache_view(tmp_path, args, mode)
    assert (named in v.busy_hold) if named else v.busy_hold == ""


# ------------------------------------------------------------------ the engine, status and the decision log
DEV = kdev(252, 0)
POLICY = "version: 1\ndefaults: {failure_model: recoverable, health: {stall_after: 90s}}\n"


def test_the_engine_finds_a_stall_behind_its_back_reports_it_and_leaves_the_knob_alone() -> None:
    e = Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="bcache0", kind="bcache",
                                                          cache_bytes=1 << 30)])
    assert e.vols[DEV].policy.health.stall_after_s == 90
    off = WritebackView(running=False, rate_bytes=0, hold_bytes=100 * MIB, quiet_s=60)
    acts = []
    for t in range(0, 100, 5):
        e.sample(VolumeSample(DEV, t * NS, "writeback", 20 * MIB, 0, 0, 0, False,
                              {"writeback_percent": "10", "writeback_delay": "30"}, "", writeback=off))
        acts += e.tick(t * NS)
        if t < 90:
            assert e.take_findings() == []
    [f] = e.take_findings()
    assert f.volume == "bcache0" and f.found and "writeback_running is 0" in f.why
    assert not [a for a in acts if isinstance(a, SetKnob) and a.knob == "writeback_running"]
    w = e.vols[DEV].writeback
    assert w.stalled_ns == 90 * NS and w.stalled_s(95 * NS) == 95


def test_status_names_the_stall_and_the_all_dirty_cache() -> None:
    lines = render_writeback({"stalled": True, "cause": "20 dirty bytes have not fallen for 90 s: x",
                              "all_dirty": True, "came_back_all_dirty": True, "clean_eta_s": 980.0,
                              "rate_bytes_s": 102400})
    assert "WRITE-BACK STALLED: 20 dirty bytes have not fallen for 90 s: x" in lines[0]
    assert "ALL DIRTY: came back with every mapped block dirty" in lines[1]
    assert "980 s to clean at 100.0 KiB/s" in lines[1]
    assert render_writeback({"stalled": False, "all_dirty": False}) == []


def test_a_finding_is_a_decision_explain_shows_with_its_reason() -> None:
    from cachepilot.commands.explain import render
    from cachepilot.daemon.acting import Actor
    from cachepilot.daemon.counters import Counters
    from cachepilot.daemon.volume import VolumeTable
    from cachepilot.models.writeback import Finding

    actor = Actor(Engine(), VolumeTable(), Counters(), lambda dev, why: None, lambda s: None)
    actor.findings([Finding("bcache0", "writeback_stall", True, "writeback_running is 0: stopped", 5 * NS)])
    [d] = list(actor.decisions)
    assert (d["volume"], d["kind"], d["status"]) == ("bcache0", "writeback_stall", "found") and d["writes"] == []
    text = render(d)
    assert "bcache0 writeback_stall => found" in text and "why: writeback_running is 0: stopped" in text


def test_through_the_daemon_a_stall_shows_in_status_metrics_and_explain(tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.unit.daemon_rig import FakeBackend, Rig

    class Stopped(FakeBackend):
        """bcache with writeback_running 0 and dirty data that does not move."""

        def sample(self, now_ns: int) -> VolumeSample:
            return replace(super().sample(now_ns), writeback=WritebackView(running=False, hold_bytes=1 << 30))

    policy = "version: 1\ndefaults: {failure_model: recoverable, health: {stall_after: 30s}}\n"
    r = Rig(tmp_path, policy=policy, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    r.backends["bcache0"] = Stopped(r.found[0].info)
    try:
        r.d.start()
        r.backends["bcache0"].dirty = 20 * MIB
        for t in range(1, 27, 5):  # dirty since the tick at 1 s
            r.tick(t)
        v = r.d.answer({"cmd": "status"})["volumes"][0]
        assert not v["writeback"]["stalled"] and v["writeback"]["not_falling_s"] == 25
        r.tick(31)
        v = r.d.answer({"cmd": "status"})["volumes"][0]
        assert v["writeback"]["stalled"] and "writeback_running is 0" in v["writeback"]["cause"]
        text = (tmp_path / "m.prom").read_text()
        assert 'cachepilot_volume_writeback_stalled{device="bcache0",volume="bcache0"} 1.0' in text, text[-3000:]
        assert 'cachepilot_volume_writeback_stalled_seconds{device="bcache0",volume="bcache0"} 30.0' in text
        [d] = [d for d in r.d.answer({"cmd": "explain"})["decisions"] if d["kind"] == "writeback_stall"]
        assert d["status"] == "found" and "writeback_running is 0" in d["reason"]
        assert not [a for a, _ in r.backends["bcache0"].applied if "writeback_running" in a.line()]
    finally:
        r.d.shutdown()


def test_a_stall_stretch_is_carried_across_a_daemon_restart(tmp_path: Path) -> None:
    """The stretch without progress goes into the state file: a daemon restarted 20 s into it reports the stall
    once stall_after (30 s) has passed in all, not 30 s after the restart; a cache that drained meanwhile is not
    carried over."""
    from dataclasses import replace

    from tests.unit.daemon_rig import FakeBackend, Rig

    class Stopped(FakeBackend):
        def sample(self, now_ns: int) -> VolumeSample:
            return replace(super().sample(now_ns), writeback=WritebackView(running=False, hold_bytes=1 << 30))

    policy = "version: 1\ndefaults: {failure_model: recoverable, health: {stall_after: 30s}}\n"

    def rig(dirty: int) -> Rig:
        r = Rig(tmp_path, policy=policy)
        r.backends["bcache0"] = Stopped(r.found[0].info)
        r.backends["bcache0"].dirty = dirty  # what the first sample at start reads
        r.d.start()
        return r

    def stalled(r: Rig) -> bool:
        return bool(r.d.answer({"cmd": "status"})["volumes"][0]["writeback"]["stalled"])

    r = rig(20 * MIB)
    for t in range(1, 22, 5):
        r.tick(t)
    assert not stalled(r)
    r.d.shutdown()
    r = rig(20 * MIB)
    try:
        r.tick(1)
        r.tick(6)
        assert not stalled(r)
        r.tick(12)  # 20 s before the restart + 11 s since the first sample
        assert stalled(r)
    finally:
        r.d.shutdown()
    r = rig(5 * MIB)  # dirty fell while the daemon was down: write-back moved, the stretch ends
    try:
        for t in (1, 6, 12):
            r.tick(t)
        assert not stalled(r)
    finally:
        r.d.shutdown()
