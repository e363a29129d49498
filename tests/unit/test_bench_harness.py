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
