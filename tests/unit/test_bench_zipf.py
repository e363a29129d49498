"""The headline benchmark's pure parts: the Zipf sampler of W3 and the pair-by-pair arithmetic."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


zipfgen = load(BENCH / "guest" / "zipfgen.py")
headline = load(BENCH / "headline.py")


def rng(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret


def test_zipf_frequencies_follow_the_power_law() -> None:
    z = zipfgen.Zipf(1000, 0.9, rng(7))
    counts = Counter(z() for _ in range(200_000))
    # rank 0 against rank 9: (10 / 1) ** 0.9 = 7.94
    assert counts[0] / counts[9] == pytest.approx(10 ** 0.9, rel=0.1)
    assert set(counts) <= set(range(1000))
    assert sum(c for r, c in counts.items() if r < 100) / 200_000 == pytest.approx(z.top_share(100), abs=0.01)


def test_zipf_is_reproducible_and_zero_exponent_is_uniform() -> None:
    a = zipfgen.Zipf(50, 1.0, rng(1))
    b = zipfgen.Zipf(50, 1.0, rng(1))
    assert [a() for _ in range(100)] == [b() for _ in range(100)]
    u = zipfgen.Zipf(4, 0.0, rng(3))
    assert u.top_share(1) == pytest.approx(0.25)
    assert u.top_share(0) == 0.0 and u.top_share(10) == pytest.approx(1.0)


def test_zipf_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        zipfgen.Zipf(0, 1.0, rng(1))
    with pytest.raises(ValueError, match="s >= 0"):
        zipfgen.Zipf(5, -1.0, rng(1))


def test_pair_deltas_pair_rounds_and_skip_missing() -> None:
    a = [{"hit": 0.7}, {"error": "rc=1"}, {"hit": 0.6}]
    b = [{"hit": 0.5}, {"hit": 0.4}, {"hit": 0.65}]
    assert headline.pair_deltas(a, b, "hit") == pytest.approx([0.2, -0.05])
    assert headline.verdict([], True).startswith("n/a")
    assert headline.verdict([0.2], True) == "met" and "missed" in headline.verdict([0.2], False)


def test_headline_spec_is_the_shared_geometry() -> None:
    s = headline.spec("dmcache")
    assert (s.origin_size_mb, s.cache_size_mb, s.origin_iops) == (2048, 256, 150)
    argv = s.argv(Path("/tmp/x"), ["true"])
    assert argv[argv.index("--origin-flush-delay-ms") + 1] == "1"
    assert headline.FULL.window >= 120


def test_dm_ratio_takes_the_promoters_bios_out_as_hits() -> None:
    zipfread = load(BENCH / "guest" / "zipfread.py")
    assert zipfread.workload_dm_ratio(100, 100, 0) == pytest.approx(0.5)
    # 20 promoter bios counted as hits: 80 workload hits of 180 workload bios
    assert zipfread.workload_dm_ratio(100, 100, 20) == pytest.approx(80 / 180)
    assert zipfread.workload_dm_ratio(5, 0, 5) is None
