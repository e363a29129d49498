"""The cache-sizing advisor (issue 25, item 1): the SHARDS estimate against an exact LRU simulation of the same
stream, its memory under a hostile stream, and `cachepilot advise`'s bad input (one line, exit 2)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from cachepilot.commands.advise import from_trace, render
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.sizing import MAX_BUCKET, Advisor, Advisors
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.trace.format import write_trace

MiB = 1 << 20
CLI = str(Path(sys.executable).parent / "cachepilot")
DEV = kdev(252, 0)

Access = tuple[int, int, int, int]  # file, size, read bytes, written bytes


def lru_hit_ratio(stream: list[Access], capacity: int) -> float:
    """Exact: a byte-capacity LRU of whole files, byte-weighted read hits (a re-read within one access's bytes
    beyond the file's size counts as a hit, as the advisor's near re-reads do)."""
    cache: OrderedDict[int, int] = OrderedDict()
    used = hits = total = 0
    for f, size, rb, _wb in stream:
        if rb:
            first = min(rb, size)
            total += rb
            hits += (rb - first) + (first if f in cache else 0)
        if f in cache:
            used -= cache.pop(f)
        cache[f] = size
        used += size
        while used > capacity:
            used -= cache.popitem(last=False)[1]
    return hits / total


def zipf_stream(n_files: int, n: int, seed: int, s: float = 0.9) -> list[Access]:
    rnd = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    sizes = [rnd.choice((16, 64, 64, 128, 256)) * 1024 for _ in range(n_files)]
    weights = [1 / (i + 1) ** s for i in range(n_files)]
    picks = rnd.choices(range(n_files), weights, k=n)
    out = []
    for f in picks:
        if rnd.random() < 0.1:
            out.append((f, sizes[f], 0, sizes[f]))  # a rewrite
        else:
            out.append((f, sizes[f], sizes[f] * (2 if rnd.random() < 0.05 else 1), 0))  # sometimes read twice
    return out


def feed(adv: Advisor, stream: list[Access], per_drain: int = 50) -> None:
    """In drains of ``per_drain`` records, as the daemon feeds it (a drain is one tick: files distinct in it)."""
    for i in range(0, len(stream), per_drain):
        adv.observe(np.array([(DEV, f + 1, 0, 0, 0, rb, wb, 0, size) for f, size, rb, wb in stream[i:i + per_drain]],
                             dtype=HOT_DTYPE))


@pytest.mark.parametrize("seed", [1, 2])
def test_shards_matches_exact_lru(seed: int) -> None:
    """8 000 files (~700 MiB) under Zipf reads, sampled at ~1 in 4 (fixed size: 2 000 objects per seed):
    the estimate at each size is within 3 points of the exact LRU and within 3x its own error estimate + 1 point."""
    stream = zipf_stream(8000, 60_000, seed)
    adv = Advisor(max_objects=2000)
    feed(adv, stream)
    assert all(s.rate < 0.5 for s in adv.samplers)  # the fixed-size variant did lower the rate
    for size in (16 * MiB, 64 * MiB, 128 * MiB, 256 * MiB, 512 * MiB):
        exact = lru_hit_ratio(stream, size)
        p = adv.point(size)
        assert abs(p.hit_ratio - exact) < 0.03, (size, p, exact)
        assert abs(p.hit_ratio - exact) < 3 * p.error + 0.01, (size, p, exact)


def test_unsampled_is_exact() -> None:
    """At rate 1 (fewer files than the bound) the curve is the exact LRU's, up to the size buckets (4.4%)."""
    stream = zipf_stream(500, 20_000, 3)
    adv = Advisor(max_objects=1000)
    feed(adv, stream)
    assert all(s.rate == 1.0 for s in adv.samplers)
    for size in (2 * MiB, 8 * MiB, 20 * MiB):
        assert adv.point(size).error == 0.0
        assert abs(adv.point(size).hit_ratio - lru_hit_ratio(stream, int(size / 1.045))) < 0.02


def test_size_for_90pct_and_origin_traffic() -> None:
    stream = zipf_stream(2000, 30_000, 4)
    adv = Advisor()
    feed(adv, stream)
    best = adv.point(1 << 50).hit_ratio
    at = adv.size_for()
    assert adv.point(at).hit_ratio >= 0.9 * best - 1e-9
    assert adv.point(int(at / 1.1)).hit_ratio < 0.9 * best
    curve = adv.curve(64 * MiB)
    assert [p.size_bytes for p in curve] == sorted({32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB, at})
    read = sum(rb for _, _, rb, _ in stream)
    written = sum(wb for _, _, _, wb in stream)
    for p in curve:
        assert p.origin_read_bytes == pytest.approx(read * (1 - p.hit_ratio), rel=1e-6)
        assert p.origin_write_bytes == pytest.approx(written, rel=1e-6)
    assert [p.hit_ratio for p in curve] == sorted(p.hit_ratio for p in curve)


def test_bounded_memory_under_hostile_stream() -> None:
    """A million distinct files, each read once: every sampler keeps at most its bound of objects, the positions
    stay bounded, and the histogram is its fixed size; every read is a cold miss."""
    adv = Advisor(max_objects=256)
    for i in range(0, 1_000_000, 10_000):
        ino = np.arange(i + 1, i + 10_001, dtype=np.uint64)
        recs = np.zeros(10_000, dtype=HOT_DTYPE)
        recs["dev"], recs["ino"], recs["gen"], recs["rb"], recs["size"] = DEV, ino, ino & 7, 4096, 4096
        adv.observe(recs)
    for s in adv.samplers:
        assert len(s.objects) <= 256
        assert s.clock <= s.capacity and len(s.tree.t) == s.capacity + 1
        assert s.hist.shape == (MAX_BUCKET,)
        assert s.rate < 0.001
    assert adv.point(1 << 40).hit_ratio == 0.0


def test_advisors_keep_to_managed_volumes() -> None:
    recs = np.array([(DEV, 5, 0, 1, 0, 8192, 0, 1, 8192), (kdev(8, 1), 6, 0, 1, 0, 8192, 0, 1, 8192)],
                    dtype=HOT_DTYPE)
    a = Advisors()
    a.observe(recs, (DEV,))
    a.observe(recs, (DEV,))
    assert list(a.by_dev) == [DEV]
    adv = a.advice(DEV, 1 * MiB)
    assert adv["samples"] == 2 and adv["points"][0]["hit_ratio"] == 0.5
    assert a.advice(kdev(9, 9), MiB)["points"] == []
    a.forget(())
    assert not a.by_dev


def _trace(tmp_path: Path, cache_bytes: int = 64 * MiB) -> Path:
    path = tmp_path / "t.cptrace"
    vol = VolumeInfo(DEV, "bcache0", cache_bytes=cache_bytes)
    evs = [HotnessDelta(FileKey(DEV, f + 1, 0), 1, 0, rb, wb, 1, size) for f, size, rb, wb in zipf_stream(300, 3000, 5)]
    write_trace(path, evs, [vol])
    return path


def test_offline_from_trace(tmp_path: Path) -> None:
    a = from_trace(str(_trace(tmp_path)), "bcache0", None)
    assert a["cache_bytes"] == 64 * MiB and a["samples"] > 0
    sizes = [p["size_bytes"] for p in a["points"]]
    assert {32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB} <= set(sizes)
    text = render(a)
    assert "<- current" in text and "bcache0" in text


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "advise", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,words", [
    (["bcache9", "--trace", "{t}"], ["unknown volume", "bcache0"]),
    (["bcache0", "--trace", "{t}", "--cache-size", "lots"], ["--cache-size", "not a size"]),
    (["bcache0", "--trace", "{t}", "--cache-size", "0"], ["--cache-size", "positive"]),
    (["bcache0", "--trace", "{missing}"], ["missing"]),
    (["bcache0", "--trace", "{garbage}"], ["garbage"]),
    (["bcache0", "--trace", "{nosize}"], ["--cache-size"]),
    (["bcache0", "--socket", "{missing}"], []),
])
def test_cli_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], words: list[str]) -> None:
    (tmp_path / "garbage").write_bytes(b"\x00not a trace" * 100)
    (tmp_path / "nosize").mkdir()
    paths = {"t": str(_trace(tmp_path)), "missing": str(tmp_path / "missing"), "garbage": str(tmp_path / "garbage"),
             "nosize": str(_trace(tmp_path / "nosize", cache_bytes=0))}
    r = cli(*[a.format(**paths) for a in args])
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert lines[0].startswith("cachepilot") and all(w in lines[0] for w in words), lines[0]


def test_cli_offline_json(tmp_path: Path) -> None:
    r = cli("bcache0", "--trace", str(_trace(tmp_path)), "--json", "--cache-size", "32MiB")
    assert r.returncode == 0, r.stderr
    assert '"cache_bytes": 33554432' in r.stdout


def test_calibration_by_the_caches_own_ratio() -> None:
    """A cache that measured what an LRU of half its size would is taken for one: 2x its size reads as an LRU of
    1x; a ratio past what any LRU size gives is clamped, never extrapolated."""
    stream = zipf_stream(2000, 30_000, 6)
    adv = Advisor()
    feed(adv, stream)
    c = adv.freeze()
    lru_half = c.point(32 * MiB).hit_ratio
    eff = c.efficiency(64 * MiB, lru_half)
    assert eff == pytest.approx(0.5, rel=0.05)
    a = c.advice(64 * MiB, lru_half)
    pts = {p["size_bytes"]: p["hit_ratio"] for p in a["points"]}
    lru = {p["size_bytes"]: p["hit_ratio"] for p in a["lru_points"]}
    assert pts[64 * MiB] == pytest.approx(lru_half, abs=0.01)
    assert pts[128 * MiB] == pytest.approx(lru[64 * MiB], abs=0.01)
    assert a["measured_hit_ratio"] == round(lru_half, 4) and "lru_points" not in c.advice(64 * MiB)
    assert c.efficiency(64 * MiB, 0.0) == 0.25 and c.efficiency(64 * MiB, 1.0) == 4.0


def test_offline_calibration_from_the_traces_samples(tmp_path: Path) -> None:
    """The cache measured (between the trace's first and last samples) what the LRU estimate gives at half its
    size: calibrated, the estimate at its size is that ratio."""
    half = {p["size_bytes"]: p["hit_ratio"] for p in from_trace(str(_trace(tmp_path)), "bcache0", None)["points"]}
    measured = half[32 * MiB]
    path = tmp_path / "s.cptrace"
    hits = round(measured * 10_000)
    evs: list[object] = [VolumeSample(DEV, 0, "writethrough", 0, 1000, 1000, 0)]
    evs += [HotnessDelta(FileKey(DEV, f + 1, 0), 1, 0, rb, wb, 1, size)
            for f, size, rb, wb in zipf_stream(300, 3000, 5)]
    evs.append(VolumeSample(DEV, 1, "writethrough", 0, 1000 + hits, 1000 + 10_000 - hits, 0))
    write_trace(path, evs, [VolumeInfo(DEV, "bcache0", cache_bytes=64 * MiB)])  # type: ignore[arg-type]
    a = from_trace(str(path), "bcache0", None)
    assert a["measured_hit_ratio"] == pytest.approx(measured, abs=1e-4)
    assert a["efficiency"] == pytest.approx(0.5, rel=0.05)
    assert {p["size_bytes"]: p["hit_ratio"] for p in a["points"]}[64 * MiB] == pytest.approx(measured, abs=0.01)
    assert "efficiency" not in from_trace(str(path), "bcache0", None, calibrate=False)
    assert "calibrated" in render(a)


def test_the_engine_feeds_drains_and_samples_to_the_advisor() -> None:
    """The live path: the engine's drains reach the volume's advisor, its samples calibrate it; a volume removed
    takes its advisor with it; a new counter base (cache replaced) starts the window again."""
    from cachepilot.engine.engine import Engine

    eng = Engine(volumes=[VolumeInfo(DEV, "bcache0", cache_bytes=64 * MiB)], advisor=True)
    recs = np.array([(DEV, 7, 0, 1, 0, 8192, 0, 1, 8192), (kdev(8, 1), 6, 0, 1, 0, 8192, 0, 1, 8192)],
                    dtype=HOT_DTYPE)
    eng.feed_hotness_array(recs)
    eng.feed_hotness_array(recs)
    assert list(eng.sizing.by_dev) == [DEV] and eng.sizing.by_dev[DEV].freeze().samples == 2
    eng.sample(VolumeSample(DEV, 1, "writethrough", 0, 500, 500, 0))
    eng.sample(VolumeSample(DEV, 2, "writethrough", 0, 560, 540, 0))
    assert eng.sizing.curve_of(DEV).measured == pytest.approx(0.6)
    eng.sample(VolumeSample(DEV, 3, "writethrough", 0, 10, 10, 0))  # counters went back: a new window
    assert eng.sizing.curve_of(DEV).measured is None
    eng.remove_volume(DEV)
    assert not eng.sizing.by_dev and not eng.sizing.measured
