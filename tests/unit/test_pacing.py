"""Paced drains (issue 31, engine/pacing.py; opt-in by exposure.pace): after the first drain measured the volume's
full write-back rate, a periodic drain asks the kind's rate floor for half of it and starts that much earlier; a
breach or a latch still drains at the full rate; a paced drain's duration is kept in full-rate terms."""

from __future__ import annotations

from cachepilot.engine import Drain, Engine, Outcome
from cachepilot.engine.pacing import PACE_SHARE, drain_rate
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
MIB = 1 << 20
POLICY = "version: 1\ndefaults: {failure_model: destructive, exposure: {max_dirty: 64MiB, max_age: 30s, pace: %s}}\n"


def engine(pace: bool = True, kind: str = "bcache", extra: str = "") -> Engine:
    text = POLICY % ("true" if pace else "false")
    if extra:
        text = text.replace("}}\n", f"}}, {extra}}}\n")
    return Engine(parse_policy(text, "t.yaml"), [VolumeInfo(dev=DEV, name="bcache0", kind=kind, cache_bytes=1 << 30)])


def measured(e: Engine, nbytes: int = 8 * MIB, seconds: float = 2.0) -> None:
    e.vols[DEV].drains_done.append((nbytes, int(seconds * NS)))


def first_drain(e: Engine, dirty: int = 4 * MIB, until: int = 40) -> tuple[int, Drain]:
    """Clean at t=0, then `dirty` bytes from t=1 on: the tick (s) of the first periodic drain and the drain."""
    e.sample(VolumeSample(DEV, 0, "writeback", 0, 0, 0, 0, False, {}, ""))
    e.tick(0)
    for t in range(1, until):
        e.sample(VolumeSample(DEV, t * NS, "writeback", dirty, 0, 0, 0, False, {}, ""))
        ds = [a for a in e.tick(t * NS) if isinstance(a, Drain)]
        if ds:
            return t, ds[0]
    raise AssertionError("no drain")


def test_a_periodic_drain_asks_half_the_measured_full_rate_and_starts_earlier() -> None:
    paced, full = engine(True), engine(False)
    for e in (paced, full):
        measured(e, 8 * MIB, 2.0)  # 4 MiB/s at full rate
    tp, dp = first_drain(paced, dirty=16 * MIB)
    tf, df = first_drain(full, dirty=16 * MIB)
    assert dp.rate == int(PACE_SHARE * 4 * MIB) and df.rate == 0
    assert "paced at 2.00 MiB/s" in dp.reason and "exposure.pace" in dp.reason
    assert tp < tf  # 16 MiB at 2 MiB/s takes twice as long: the paced drain starts earlier
    assert dp.deadline_ns == df.deadline_ns == 30 * NS  # the same bound: clean at 0, max_age 30 s


def test_the_first_drain_runs_at_full_rate_and_measures_it() -> None:
    e = engine(True)
    _, d = first_drain(e)
    assert d.rate == 0 and drain_rate(e.vols[DEV]) == 0


def test_a_paced_drain_is_kept_in_full_rate_terms() -> None:
    e = engine(True)
    measured(e, 8 * MIB, 2.0)
    t, d = first_drain(e, dirty=16 * MIB)
    assert d.rate
    e.sample(VolumeSample(DEV, (t + 8) * NS, "writeback", 16 * MIB, 0, 0, 0, False, {}, ""))
    e.tick((t + 8) * NS)
    e.outcome(Outcome(d, "done"))  # 16 MiB in 8 s at the paced 2 MiB/s
    nbytes, took = e.vols[DEV].drains_done[-1]
    assert nbytes == 16 * MIB and took == int(8 * NS * PACE_SHARE)  # 4 MiB/s at full rate, not 2
    assert drain_rate(e.vols[DEV]) == int(PACE_SHARE * 4 * MIB)  # the pace does not decay drain after drain


def test_pacing_is_opt_in_and_never_overrides_a_pinned_floor_or_a_kind_without_one() -> None:
    for e in (engine(False), engine(True, extra="knobs: {writeback_rate_minimum: 8}"),
              engine(True, kind="dm-cache")):
        measured(e)
        assert drain_rate(e.vols[DEV]) == 0, e.vols[DEV].info.kind


def test_a_breach_drains_at_the_full_rate() -> None:
    e = engine(True)
    measured(e)
    e.sample(VolumeSample(DEV, NS, "writeback", 4 * MIB, 0, 0, 0, False, {}, ""))
    e.vols[DEV].breach = "a drain missed its deadline"
    d = next(a for a in e.tick(NS) if isinstance(a, Drain))
    assert "exposure breach" in d.reason and d.rate == 0
