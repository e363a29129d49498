"""The soak's reading of the daemon's tick histogram (from the exporter's real exposition) and its verdicts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from cachepilot.exporter import (
    TICK_BUCKETS,
    DaemonSnapshot,
    HistogramAccumulator,
    SnapshotBox,
    make_registry,
    write_textfile,
)

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def exposition(tmp_path: Path, durations: list[float]) -> str:
    acc = HistogramAccumulator(TICK_BUCKETS)
    for d in durations:
        acc.observe(d)
    box = SnapshotBox()
    box.publish(DaemonSnapshot(timestamp=0.0, start_time=0.0, ready=True, dry_run=False, observe_only=False,
                               ticks=len(durations), tick_duration=acc.freeze()))
    path = tmp_path / "cachepilot.prom"
    write_textfile(path, make_registry(box))
    return path.read_text()


def test_tick_histogram_counts_the_ticks_over_a_second_and_bounds_the_longest(tmp_path: Path) -> None:
    soak = load(BENCH / "guest" / "soak.py")
    assert soak.tick_histogram(exposition(tmp_path, [0.02, 0.03, 0.4])) == {
        "tick_count": 3, "ticks_over_1s": 0, "max_tick_bound_s": 0.5}
    got = soak.tick_histogram(exposition(tmp_path, [0.02, 1.5, 0.9, 12.0]))
    assert got["tick_count"] == 4 and got["ticks_over_1s"] == 2
    assert got["max_tick_bound_s"] is None  # beyond the last bucket: only +Inf holds it
    assert soak.tick_histogram("") == {}  # the daemon did not answer


def good_result() -> dict:
    return {"rss_start_kib": 100_000, "rss_end_kib": 105_000, "rss_growth_ratio": 1.05, "rss_max_kib": 106_000,
            "ticks": 1800, "ticks_over_1s": 0, "ticks_after_warmup": 1500, "ticks_over_1s_after_warmup": 0,
            "max_tick_seconds": 0.25, "tracebacks": 0, "daemon_exit": 0,
            "files_bad": 0, "files_checked": 600, "files_deleted": 3000, "hups_sent": 29, "hups_ok": 29,
            "completed": True, "events": [{"t": 1, "event": e} for e in
                                          ("latched", "volume removed", "volume re-added")]}


def test_each_criterion_fails_on_its_own_breach() -> None:
    bench = load(BENCH / "bench_lab_soak.py")
    assert all(p for _, _, p in bench.criteria(good_result()))
    breaches = {0: {"rss_growth_ratio": 1.11}, 1: {"ticks_over_1s_after_warmup": 1}, 2: {"tracebacks": 1},
                3: {"files_bad": 1}, 4: {"hups_ok": 28}, 5: {"completed": False}}
    for i, change in breaches.items():
        verdicts = [p for _, _, p in bench.criteria({**good_result(), **change})]
        assert not verdicts[i] and sum(verdicts) == len(verdicts) - 1, change
    assert not bench.criteria({**good_result(), "events": []})[5][2]  # a disruption that never happened


def test_the_daemons_cost_between_two_samples_per_tick_and_stage() -> None:
    soak = load(BENCH / "guest" / "soak.py")
    first = {"t": 100.0, "daemon_cpu_s": 10.0,
             "counters": {"ticks": 50, "tick_wall_ns.sample": 1_000_000_000, "tick_cpu_ns.sample": 200_000_000}}
    last = {"t": 200.0, "daemon_cpu_s": 25.0,
            "counters": {"ticks": 150, "tick_wall_ns.sample": 6_000_000_000, "tick_cpu_ns.sample": 1_200_000_000,
                         "tick_wall_ns.publish": 500_000_000, "tick_cpu_ns.publish": 300_000_000}}
    assert soak.cost(first, last) == {"daemon_cpu_pct_after_warmup": 15.0,
                                      "stage_ms_per_tick_after_warmup": {"publish": [5.0, 3.0], "sample": [50.0, 10.0]}}
    bench = load(BENCH / "bench_lab_soak.py")
    md = bench.report({**good_result(), **soak.cost(first, last)}, bench.lb.LabSpec(), 6, "cmd")
    assert "15.0% of the vCPU" in md and "sample 50 / 10, publish 5 / 3" in md
