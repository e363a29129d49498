"""Pacing (issue 31, engine/pacing.py): between drains a destructive bcache volume writes back at about its write
rate (writeback_rate_minimum), put back when pacing ends; opt-in by exposure.pace."""

from __future__ import annotations

from cachepilot.actions import PutBackKnobs, SetKnob
from cachepilot.engine import Engine
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
MIB = 1 << 20
PACED = "version: 1\ndefaults: {failure_model: destructive, exposure: {max_dirty: 64MiB, max_age: 30s, pace: true}}\n"


def engine(text: str = PACED, kind: str = "bcache") -> Engine:
    return Engine(parse_policy(text, "t.yaml"), [VolumeInfo(dev=DEV, name="bcache0", kind=kind, cache_bytes=1 << 30)])


def floors(acts: list) -> list[str]:  # type: ignore[type-arg]
    return [a.value for a in acts if isinstance(a, SetKnob) and a.knob == "writeback_rate_minimum"]


def run(e: Engine, t: int, write_mib_s: float, mode: str = "writeback") -> list:  # type: ignore[type-arg]
    e.feed(HotnessDelta(FileKey(DEV, 7, 1), 0, 64, 0, int(write_mib_s * MIB), t * NS, size=1 << 30))
    e.sample(VolumeSample(DEV, t * NS, mode, 4 * MIB, 0, 0, 0, False, {}, ""))
    return e.tick(t * NS)


def test_the_floor_follows_the_write_rate_and_is_put_back_when_pacing_ends() -> None:
    e = engine()
    asked = [v for t in range(1, 12) for v in floors(run(e, t, 8.0))]
    assert asked, "no floor asked for"
    last = int(asked[-1])
    assert abs(last * 512 - 1.25 * 8 * MIB) <= 0.3 * 8 * MIB, last  # 1.25 x 8 MiB/s, in sectors/s
    assert len(asked) <= 3  # changed only when the rate moves by more than a quarter
    acts = run(e, 12, 8.0, mode="writethrough")
    assert [a.knobs for a in acts if isinstance(a, PutBackKnobs)] == [("writeback_rate_minimum",)]


def test_a_trickle_gets_the_least_pace() -> None:
    e = engine()
    asked = [v for t in range(1, 5) for v in floors(run(e, t, 0.01))]
    assert asked and int(asked[-1]) == (1 << 20) // 512


def test_pacing_is_opt_in_and_never_overrides_a_pinned_floor() -> None:
    off = engine(PACED.replace(", pace: true", ""))
    assert not [v for t in range(1, 6) for v in floors(run(off, t, 8.0))]
    pinned = engine(PACED.rstrip("}\n") + "}, knobs: {writeback_rate_minimum: 100}}\n")
    assert all(v == "100" for t in range(1, 6) for v in floors(run(pinned, t, 8.0)))


def test_no_pacing_where_the_kind_has_no_floor_or_the_model_is_recoverable() -> None:
    assert not [v for t in range(1, 6) for v in floors(run(engine(kind="dm-cache"), t, 8.0))]
    rec = engine(PACED.replace("destructive", "recoverable"))
    assert not [v for t in range(1, 6) for v in floors(run(rec, t, 8.0))]
