"""The headline benchmark's pure parts: the lifetime mix, the delete -> discard bookkeeping, the exposure witness's
age computation, and the harness's pair-by-pair ratio and goal arithmetic."""

from __future__ import annotations

import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


lt = _load("bench_lifetimes", BENCH / "guest" / "lifetimes.py")
lb = _load("bench_labbench", BENCH / "labbench.py")


def test_mix_share_and_range() -> None:
    mix = lt.LifetimeMix(short_share=0.5, short_min_s=2.0, short_max_s=60.0)
    rnd = random.Random(4)  # noqa: S311 - a reproducible draw, not a secret
    draws = [mix.draw(rnd) for _ in range(20000)]
    short = [d for d in draws if d is not None]
    assert abs(len(short) / len(draws) - 0.5) < 0.02
    assert min(short) >= 2.0 and max(short) <= 60.0
    # log-uniform: the median is the geometric mean of the bounds, a quarter of the draws under sqrt(min*median)
    assert abs(statistics.median(short) - mix.median_short_s()) / mix.median_short_s() < 0.05
    q = math.sqrt(2.0 * mix.median_short_s())
    assert abs(sum(1 for d in short if d < q) / len(short) - 0.25) < 0.02


def test_mix_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        lt.LifetimeMix(short_share=1.5)
    with pytest.raises(ValueError):
        lt.LifetimeMix(short_min_s=10, short_max_s=5)
    rnd = random.Random(1)  # noqa: S311 - a reproducible draw, not a secret
    assert all(lt.LifetimeMix(short_share=0.0).draw(rnd) is None for _ in range(100))


def test_surviving_share_bounds_what_an_age_bound_saves() -> None:
    # only short files dying within 2 s: only the appends to the (initial) long-lived files outlive a 30 s bound,
    # 16 KiB of every step's mean 128.5 + 16 KiB
    only_short = lt.LifetimeMix(short_share=1.0, short_min_s=1.0, short_max_s=2.0)
    assert lt.surviving_share(only_short, 40.0, 30.0, 10 << 20) == pytest.approx(16 / 144.5, abs=0.01)
    # W1's mix: about a third of new bytes die within a 30 s bound, more within a longer one
    w1 = lt.LifetimeMix(short_share=0.4, short_min_s=2.0, short_max_s=60.0)
    at30, at60 = (lt.surviving_share(w1, 40.0, b, (256 << 20) // 3) for b in (30.0, 60.0))
    assert 0.62 < at30 < 0.72 and at60 < at30 - 0.05


def test_discard_outcomes_latency_never_and_reuse() -> None:
    deletes = [(10.0, [(100, 8)]), (20.0, [(200, 8)]), (30.0, [(300, 8)])]
    discards = [(9.0, 100, 8), (10.4, 96, 16), (25.0, 0, 50)]  # the first is before the delete: not counted
    created = [(5.0, [(300, 8)]), (31.0, [(304, 8)])]  # the file at 31 s took a block the third delete freed
    o = lt.discard_outcomes(deletes, discards, created)
    assert o.latencies == [pytest.approx(0.4)]
    assert (o.never, o.reused_first) == (2, 1)
    assert lt.reach_share(o) == pytest.approx(0.5)  # 1 reached of 2 eligible (one was reused first)
    # a discard after the blocks were taken again is the new file's: it reaches the reused delete no more
    late = lt.discard_outcomes(deletes, [*discards, (40.0, 300, 16)], created)
    assert late.latencies == o.latencies and (late.never, late.reused_first) == (2, 1)
    assert math.isnan(lt.reach_share(lt.Outcomes([], 0, 0)))


def test_oldest_dirty_age() -> None:
    ev = [(0.0, "w", 0, 16), (5.0, "w", 8, 8), (12.0, "wb", 0, 8), (20.0, "wb", 0, 16), (21.0, "w", 64, 8),
          (22.0, "d", 64, 8)]
    # blocks 0 and 1 written at 0 s; block 1 rewritten at 5 s; block 0 written back at 12 s (age 12); block 1 at
    # 20 s (age 15, the oldest); the write at 21 s dies by discard at 22 s
    assert lt.oldest_dirty_age(ev, 30.0) == pytest.approx(15.0)
    # a write bcache sent to the origin (write-through, bypassed) replaces the dirty copy
    assert lt.oldest_dirty_age([(0.0, "w", 0, 8), (3.0, "c", 0, 8)], 50.0) == pytest.approx(3.0)
    # a write-back key older than the write does not clean it: still dirty at the end
    assert lt.oldest_dirty_age([(1.0, "wb", 0, 8), (2.0, "w", 0, 8)], 50.0) == pytest.approx(48.0)


def test_pair_ratios_and_verdicts() -> None:
    a = [{"x": 3.0}, {"error": "rc=1"}, {"x": 4.0}]
    b = [{"x": 2.0}, {"x": 2.0}, {"x": 0.0}]
    assert lb.pair_ratios(a, b, "x") == [1.5]  # round 2 failed, round 3's denominator is zero
    assert lb.cell([1.0, 2.0, 4.0], "{:.1f}") == "2.0 (1.0–4.0)"
    assert lb.verdict([1.4, 1.6, 1.7], lambda x: x >= 1.5) == "met"
    assert lb.verdict([1.4, 1.4, 1.7], lambda x: x >= 1.5) == "**missed**"
    assert lb.verdict([], lambda x: True) == "n/a"
    assert lb.all_rounds([0.5, 1.2], lambda x: x <= 1.0) == "**missed**"
    assert lb.all_rounds([0.5, 0.9], lambda x: x <= 1.0) == "met"


def test_origin_text() -> None:
    spec = lb.LabSpec(origin_delay_ms=8, read_delay_ms=8, write_delay_ms=4, flush_delay_ms=1, origin_iops=150)
    assert lb.origin_text(spec) == "dm-delay read 8 / write 4 / flush 1 ms, 150 IOPS (qemu throttling)"
    assert lb.origin_text(lb.LabSpec()) == "dm-delay 5 ms"


def test_the_origin_charges_per_byte_too() -> None:
    """Issue 31: an IOPS budget alone charges a merged 1 MiB drain burst like one 4 KiB write; the lab's flags carry
    qemu's byte budget and iops-size as well, and the text says so."""
    spec = lb.LabSpec(origin_iops=150, origin_bps=150_000_000, origin_iops_size=1 << 20)
    argv = spec.argv(Path("/tmp/x"), ["g.py"])
    assert argv[argv.index("--origin-bps") + 1] == "150000000"
    assert argv[argv.index("--origin-iops-size") + 1] == str(1 << 20)
    assert lb.origin_text(spec) == (
        "dm-delay 5 ms, 150 IOPS, 150 MB/s, a request counts once per 1024 KiB (qemu throttling)")
    import argparse
    import importlib
    import importlib.machinery

    loader = importlib.machinery.SourceFileLoader("labrunner", str(lb.LAB))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("labrunner", loader))
    loader.exec_module(mod)
    ns = argparse.Namespace(origin_iops=150, origin_bps=150_000_000, origin_iops_size=1 << 20)
    assert mod.origin_throttle(ns) == (
        ",throttling.iops-total=150,throttling.bps-total=150000000,throttling.iops-size=1048576")
    sys.path.insert(0, str(BENCH))
    hl = importlib.import_module("headline")
    s = hl.spec("bcache")
    assert (s.origin_iops, s.origin_bps, s.origin_iops_size) == (150, 150_000_000, 1 << 20)


def test_wall_clock_mix_matches_the_quoted_figures_and_is_drawn_in_seconds() -> None:
    """Issue 31: lifetimes drawn at birth in seconds; the default mix gives the quoted 20% under 30 s and 50% within
    5 minutes, whatever the loop's speed (nothing in it depends on how fast files are made)."""
    mix = lt.WallClockMix()
    assert abs(mix.share_within(30.0) - 0.2) < 1e-9 and abs(mix.share_within(300.0) - 0.5) < 1e-9
    rnd = random.Random(7)  # noqa: S311 - a reproducible draw, not a secret
    draws = [mix.draw(rnd) for _ in range(20000)]
    assert abs(sum(1 for d in draws if d < 30) / len(draws) - 0.2) < 0.02
    assert abs(sum(1 for d in draws if d < 300) / len(draws) - 0.5) < 0.02
    assert min(draws) >= 2.0 and max(draws) <= 3600.0
    with pytest.raises(ValueError):
        lt.WallClockMix(classes=((0.5, 2.0, 30.0),))
    with pytest.raises(ValueError):
        lt.WallClockMix(overwrite_share=1.5)


sg = _load("bench_stockgrid", BENCH / "stockgrid.py")


def test_the_stock_grid_is_the_issues_grid_and_best_is_judged_by_the_bound() -> None:
    """Issue 31 item 1: writeback_percent {0, 10, 40} x writeback_delay {5, 10, 30} x -o discard {off, on}; the
    best point within the bound is the fastest whose every run kept the witness within 64 MiB / 30 s."""
    g = sg.grid()
    assert len(g) == 18 and len(set(g)) == 18 and "stock:wp=0,wd=10,discard=1" in g
    rows = {
        "stock:wp=0,wd=10,discard=1": [{"ops_s": 90, "exposure_max_dirty_mib": 40, "exposure_oldest_dirty_s": 20},
                                       {"ops_s": 100, "exposure_max_dirty_mib": 50, "exposure_oldest_dirty_s": 25}],
        "stock:wp=40,wd=30,discard=1": [{"ops_s": 150, "exposure_max_dirty_mib": 90, "exposure_oldest_dirty_s": 80}],
        "stock:wp=10,wd=5,discard=0": [{"ops_s": 120, "exposure_max_dirty_mib": 30, "exposure_oldest_dirty_s": 10},
                                       {"ops_s": 130, "exposure_max_dirty_mib": 70, "exposure_oldest_dirty_s": 10}],
        "stock:wp=0,wd=5,discard=0": [{"error": "rc=1"}],
    }
    found = sg.best(rows)
    assert found["best_overall"] == "stock:wp=40,wd=30,discard=1"
    assert found["best_bounded"] == "stock:wp=0,wd=10,discard=1" and found["best_bounded_ops_s"] == 95


def test_the_writecache_grid_and_its_guest_names() -> None:
    """Issue 31 item 1 for dm-writecache: max_age {15, 30} s x pause_writeback {0, 3000} x watermarks {50/45, 25/20,
    18/13} x -o discard {off, on}; the W4 guest parses each point to the table arguments it sets and refuses anything
    else with one line."""
    g = sg.grid("writecache")
    assert len(g) == 24 and len(set(g)) == 24 and "stock:age=15,pause=0,wm=18/13,discard=1" in g
    assert sg.result("writecache").name == "stock_grid_writecache.json" and sg.grid() == sg.grid("bcache")
    sys.path.insert(0, str(BENCH / "guest"))
    point = _load("bench_guest_w4", BENCH / "guest" / "wcfiles.py").stock_point
    assert [point(p) for p in g[:2]] == [{"age": 15, "pause": 0, "high": 50, "low": 45, "discard": 0},
                                         {"age": 15, "pause": 0, "high": 50, "low": 45, "discard": 1}]
    assert point("max-age") == {"age": 30, "pause": 3000, "high": 50, "low": 45, "discard": 0}
    for bad in ("stock:pause=0,wm=20/25,discard=1", "stock:pause=0,wm=50,discard=1", "stock:pause=0;rm",
                "stock:pause=0,wm=50/45,discard=2", "stock:pause=0,wm=50/45,discard=1,x=1",
                "stock:age=0,pause=0,wm=50/45,discard=1"):
        with pytest.raises(SystemExit, match="bad stock configuration"):
            point(bad)


def test_w4_draws_its_seeds_shuffles_its_order_and_runs_the_grids_find(tmp_path: Path, monkeypatch) -> None:
    sys.path.insert(0, str(BENCH))
    w4 = _load("bench_w4", BENCH / "bench_lab_writecache.py")
    found = tmp_path / "stock_grid_writecache.json"
    monkeypatch.setattr(w4.stockgrid, "result", lambda kind: found)
    with pytest.raises(SystemExit, match="--kind writecache --write"):
        w4.options([])
    found.write_text('{"best_bounded": "stock:pause=0,wm=25/20,discard=1", "best_overall": "stock:pause=0,'
                     'wm=50/45,discard=1"}')
    a = w4.options([])
    assert len(a.seeds) == 5 and not set(a.seeds) <= {1, 2, 3, 4, 5}
    assert a.stock["best-bounded"] == "stock:pause=0,wm=25/20,discard=1"
    assert w4.options(["--seeds", "7,8", "--configs", "max-age,cp-default"]).reps == 2
    pinned = "stock:age=30,pause=0,wm=18/13,discard=1"
    assert w4.options(["--best-bounded", pinned]).stock["best-bounded"] == pinned
    with pytest.raises(SystemExit):
        w4.options(["--best-bounded", "stock:pause=0;rm"])
    orders = {tuple(w4.lb.shuffled(["max-age", "best-bounded", "cp-default"], s)) for s in range(30)}
    assert len(orders) > 3


def test_the_grid_result_is_required_and_checked(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no stock grid result"):
        sg.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"best_bounded": "wb", "best_overall": "stock:wp=0,wd=5,discard=0"}')
    with pytest.raises(SystemExit, match="best_bounded missing or not a stock configuration"):
        sg.load(bad)


def test_w1_rounds_draw_their_seeds_and_shuffle_their_order() -> None:
    """Issue 31 item 5: seeds drawn per run (not the development seeds 1, 2, 3), the order shuffled per round, the
    CPU-tax control last; a guest's stock configuration names parse to the knobs it sets."""
    sys.path.insert(0, str(BENCH))
    w1 = _load("bench_w1", BENCH / "bench_lab_headline_fileserver.py")
    seeds = w1.options(["--configs", "wt"]).seeds
    assert w1.options(["--configs", "wt", "--seeds", "7,8"]).seeds == [7, 8]
    assert len(set(seeds)) == 5 and not set(seeds) <= {1, 2, 3, 4, 5}
    configs = ["cp-destructive", "wt", "wb", "best-bounded", "best-overall", "cpu-tax"]
    orders = {tuple(w1.round_order(configs, s)) for s in range(40)}
    assert len(orders) > 10 and all(o[-1] == "cpu-tax" and sorted(o) == sorted(configs) for o in orders)


def test_guest_stock_configuration_names() -> None:
    sys.path.insert(0, str(BENCH / "guest"))
    knobs = _load("bench_guest_w1", BENCH / "guest" / "headline_fileserver.py").stock_knobs
    assert knobs("stock:wp=0,wd=10,discard=1") == {"wp": 0, "wd": 10, "discard": 1}
    assert knobs("tuned") == {"wp": 40, "discard": 1} and knobs("wb") == {}
    with pytest.raises(SystemExit, match="bad stock configuration"):
        knobs("stock:wp=0;rm")


def test_the_w4_witness_reads_the_bios_of_the_volume_and_its_origin() -> None:
    """dm-writecache has no tracepoint of its own: a write to the volume starts its blocks' age, a write to the
    origin at those sectors (write-back) ends it, a discard of the volume kills them; reads, empty flushes and other
    devices do not count."""
    sys.path.insert(0, str(BENCH / "guest"))
    common = _load("bench_guest_common", BENCH / "guest" / "common.py")
    lt = _load("bench_guest_lifetimes", BENCH / "guest" / "lifetimes.py")
    names = {"253,3": "volume", "253,0": "origin"}
    lines = [
        " python3-77 [000] ..... 100.000000: block_bio_queue: 253,3 WS 2048 + 16 [python3]",
        " python3-77 [000] ..... 101.000000: block_bio_queue: 253,3 W 4096 + 8 [python3]",
        " python3-77 [000] ..... 101.500000: block_bio_queue: 253,3 R 4096 + 8 [python3]",
        " python3-77 [000] ..... 102.000000: block_bio_queue: 253,3 FWS 0 + 0 [python3]",
        " kworker-9 [000] ..... 110.000000: block_bio_queue: 253,1 W 4096 + 8 [kworker]",  # the cache device
        " kworker-9 [000] ..... 125.000000: block_bio_queue: 253,0 W 2048 + 16 [kcopyd]",
        " python3-77 [000] ..... 126.000000: block_bio_queue: 253,3 DS 4096 + 8 [jbd2]",
        "garbage: block_bio_queue: 253,3",
    ]
    ev = common.bio_events(lines, names)
    assert ev == [(100.0, "w", 2048, 16), (101.0, "w", 4096, 8), (125.0, "wb", 2048, 16), (126.0, "d", 4096, 8)]
    assert lt.oldest_dirty_age(ev, 130.0) == 25.0  # the first write waited 25 s; nothing is dirty at the end
    assert lt.oldest_dirty_age(ev[:2], 130.0) == 30.0  # never written back: its age at the end


def test_the_shared_options_check_and_default_what_each_benchmark_gave_itself() -> None:
    """One harness (labbench): --reps/--quick/--out first, --configs each one of the table's, --seeds replayed or
    drawn (one round with --quick), warm-up and window by --quick unless given."""
    ap = lb.parser(reps=4)
    lb.add_windows(ap)
    lb.add_seeds(ap)
    a = ap.parse_args(["--quick"])
    lb.windows(a, quick=(5.0, 20.0), full=(15.0, 60.0))
    lb.seeds(ap, a)
    assert (a.warmup, a.window, a.reps, len(a.seeds)) == (5.0, 20.0, 1, 1)
    a = ap.parse_args(["--window", "33", "--seeds", "7,8,9"])
    lb.windows(a, quick=(5.0, 20.0), full=(15.0, 60.0))
    lb.seeds(ap, a)
    assert (a.warmup, a.window, a.reps, a.seeds) == (15.0, 33.0, 3, [7, 8, 9])
    assert len(lb.parser(reps=4).parse_args([]).__dict__) == 3 and lb.parser(reps=4).parse_args([]).reps == 4
    table = {"wt": "stock write-through", "cp": "cachepilot"}
    assert lb.chosen(ap, "cp,wt", table) == ["cp", "wt"]
    for bad in ("wt,nope", ",", ""):
        with pytest.raises(SystemExit):
            lb.chosen(ap, bad, table)
    with pytest.raises(SystemExit):
        lb.seeds(ap, ap.parse_args(["--seeds", "1,x"]))


def test_numbered_rounds_run_every_configuration_each_round_with_the_rounds_seed(monkeypatch) -> None:
    spec = lb.LabSpec()
    jobs = lb.numbered_rounds(["a", "b"], 2, spec, ["g.py", "{c}", "9"], "res", prefix="p-")
    assert [(j.key, j.label, j.result_name) for j in jobs] == [
        ("a", "p-a-1", "res"), ("b", "p-b-1", "res"), ("a", "p-a-2", "res"), ("b", "p-b-2", "res")]
    assert [list(j.cmd) for j in jobs[1:3]] == [["g.py", "b", "9", "--seed", "1"], ["g.py", "a", "9", "--seed", "2"]]
    closed: list[str] = []

    class FakeRunner:
        def __init__(self, name: str, total: int, **kw: object) -> None:
            self.name, self.total, self.kw = name, total, kw

        def run_all(self, jobs: list, rows: dict) -> None:
            raise KeyboardInterrupt  # an operator's ^C in the middle of a run

        def close(self) -> None:
            closed.append(self.name)

    monkeypatch.setattr(lb, "Runner", FakeRunner)
    with pytest.raises(KeyboardInterrupt):
        lb.run_jobs("w9", jobs, {}, Path("/tmp/out"), at_a_time=1)
    assert closed == ["w9"]  # the progress bar stopped however the run ended


def test_w5_runs_on_bcache_or_dm_cache_with_each_kinds_own_configurations() -> None:
    sys.path.insert(0, str(BENCH))
    w5 = _load("bench_w5", BENCH / "bench_lab_hotlarge.py")
    own, rest = w5.options(["--reps", "2"])
    assert own.kind == "bcache" and own.configs == ["stock", "cutoff0", "cutoff16", "cp-default"] and rest
    own, _ = w5.options(["--kind", "dmcache"])
    assert own.configs == ["smq", "smq-mt", "cp-default"]
    with pytest.raises(SystemExit, match="for dmcache"):
        w5.options(["--kind", "dmcache", "--configs", "cutoff0"])
    # a run's account of its cache: each kind's own counters
    rounds = [{"round": 3, "read_ms": [1.0], "origin_bytes_per_read": 0,
               "bcache": {"read_hits": 4, "read_misses": 1, "promotions": 8, "demotions": 0}}]
    assert w5.summary({"rounds": rounds, "stream_mib_s": 1.0})["bcache"]["promotions"] == 8


# the kernel's lines from two lab guests of one benchmark run (2026-11-29 fio-db rounds 4): the first's clock ran
# 4.7x fast and its throughput read 0.35x its neighbours'
BAD_CLOCK = """[    0.000000] tsc: Fast TSC calibration failed
[    0.016000] tsc: PIT calibration deviates from HPET: 547856 2594576
[    0.016000] tsc: Using PIT calibration value
[    0.016000] tsc: Detected 547.856 MHz processor
[    1.217981] clocksource: Switched to clocksource tsc-early
[    4.126867] clocksource: Switched to clocksource tsc
"""
GOOD_CLOCK = """[    0.000000] tsc: Fast TSC calibration failed
[    0.012000] tsc: Unable to calibrate against PIT
[    0.012000] tsc: using HPET reference calibration
[    0.012000] tsc: Detected 2594.486 MHz processor
[    1.185346] clocksource: Switched to clocksource tsc-early
[    2.516848] tsc: Refined TSC clocksource calibration: 2596.139 MHz
[    2.517721] clocksource: Switched to clocksource tsc
"""


def test_a_guest_whose_clock_was_miscalibrated_is_left_out_with_the_reason() -> None:
    sys.path.insert(0, str(BENCH))
    lb = _load("bench_labbench_clock", BENCH / "labbench.py")
    fault = lb.guest_clock_fault(BAD_CLOCK)
    assert fault is not None and "548 MHz" in fault and "4.7x fast" in fault
    assert lb.guest_clock_fault(GOOD_CLOCK) is None
    # the same miscalibration is harmless once the guest keeps time by the HPET
    assert lb.guest_clock_fault(BAD_CLOCK + "[    5.0] clocksource: Switched to clocksource hpet\n") is None
    assert lb.guest_clock_fault("") is None


def test_the_measured_window_runs_the_threads_and_counts_from_the_warm_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """W2 and W4's window (common.run_window): the threads started, the warm-up slept, the origin's writes and the
    daemon's CPU taken at its end, the threads joined; seconds counted from t0."""
    sys.path.insert(0, str(BENCH / "guest"))
    common = _load("bench_guest_common_window", BENCH / "guest" / "common.py")
    clock = {"now": 100.0, "written": 0}
    window = common.threading.Event()  # the threads write their window's share once its start is read

    def work() -> None:
        window.wait(5)
        clock["written"] += 3 * common.MIB

    def sleep(s: float) -> None:
        clock["now"] += s
        clock["written"] += 2 * common.MIB  # the warm-up's writes: not the window's

    def written() -> int:
        at = clock["written"]
        window.set()
        return at

    monkeypatch.setattr(common.time, "sleep", sleep)
    monkeypatch.setattr(common.time, "monotonic", lambda: clock["now"] + 4)  # 4 s into the window at its end
    monkeypatch.setattr(common, "origin_written", written)

    class Busy:
        def cpu_s(self) -> float:
            return 7.5

    threads = [common.threading.Thread(target=work) for _ in range(2)]
    elapsed, origin_mib, cpu0 = common.run_window(threads, 105.0, 5, Busy())
    assert not any(t.is_alive() for t in threads) and clock["now"] == 105.0  # joined; the warm-up slept
    assert (elapsed, origin_mib, cpu0) == (4.0, 6.0, 7.5)
    assert common.run_window([], 105.0, 0, None)[2] == 0.0  # no daemon: no CPU
