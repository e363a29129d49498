"""The exposure bound delegated to dm-writecache's own max_age and watermarks (engine.nativebound): the table
arguments the engine asks for (put back on exit), no periodic flush while the table holds them, a flush on a
measured breach only (the backend's reload and put-back of an argument the table did not set: test_backends)."""

from __future__ import annotations

from cachepilot.actions import Drain, SetKnob
from cachepilot.engine import Engine
from cachepilot.engine.nativebound import _Written, wanted
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
MIB = 1 << 20
DEV = kdev(252, 0)
DESTRUCTIVE = """version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 64MiB, max_age: 30s}
"""
STOCK = {"high_watermark": "50", "low_watermark": "45"}
HELD = {"high_watermark": "18", "low_watermark": "13", "max_age": "30000", "pause_writeback": "0"}
WC = VolumeInfo(dev=DEV, name="dm-2", kind="dm-writecache", cache_bytes=256 * MIB)


def run(e: Engine, seconds: int, knobs: dict[str, str], dirty: int = 40 * MIB, rate: int = 4 * MIB,
        start: int = 0) -> list[object]:
    """A sample and a tick every second: ``dirty`` bytes dirty (never clean), ``rate`` bytes/s written."""
    out: list[object] = []
    for t in range(start, start + seconds):
        e.sample(VolumeSample(DEV, t * NS + 1, "writeback", dirty, 0, 0, 0, False, dict(knobs),
                              written_bytes=t * rate))
        out += e.tick(t * NS + 2)
    return out


def test_destructive_writecache_asks_for_max_age_and_watermarks_low_first() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    asks = [a for a in run(e, 2, STOCK) if isinstance(a, SetKnob)]
    assert [(a.knob, a.value) for a in asks] == [("low_watermark", "13"), ("high_watermark", "18"),
                                                 ("max_age", "30000"), ("pause_writeback", "0")]
    assert all(a.put_back_on_exit for a in asks)
    assert "delegated to the kernel" in asks[2].reason and "15/16" in asks[2].reason
    assert "75% of it" in asks[1].reason and "writecache_map_flush" in asks[3].reason


def test_the_table_without_pause_writeback_0_does_not_keep_the_bound() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    paused = {k: v for k, v in HELD.items() if k != "pause_writeback"}  # fsync flushes would hold write-back off
    assert [a for a in run(e, 120, paused) if isinstance(a, Drain)]


def test_the_drain_of_data_of_unknown_age_waits_two_ticks_for_the_reloads() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    first = run(e, 1, STOCK)  # never seen clean: dirty data of unknown age
    assert [a for a in first if isinstance(a, SetKnob)] and not [a for a in first if isinstance(a, Drain)]
    assert not [a for a in run(e, 3, HELD, start=1) if isinstance(a, Drain)]  # the table holds: none at all
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    later = run(e2, 4, STOCK)  # the reloads were refused: the drain comes, two ticks late
    assert [a for a in later if isinstance(a, Drain)] and "unknown age" in str(later)


def test_a_pinned_knob_is_not_delegated_and_recoverable_asks_nothing() -> None:
    e = Engine(parse_policy(DESTRUCTIVE + "  knobs: {max_age: 60000}\n", "t.yaml"), [WC])
    asks = [a for a in run(e, 2, STOCK) if isinstance(a, SetKnob)]
    assert ("max_age", "60000") in [(a.knob, a.value) for a in asks]
    assert ("max_age", "30000") not in [(a.knob, a.value) for a in asks]
    e2 = Engine(parse_policy(DESTRUCTIVE.replace("destructive", "recoverable"), "t.yaml"), [WC])
    assert not [a for a in run(e2, 2, STOCK) if isinstance(a, SetKnob) and a.knob != "high_watermark"]


def test_no_periodic_flush_while_the_table_keeps_the_bound() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    acts = run(e, 120, HELD)  # dirty 40 MiB for two minutes, never clean: the kernel writes back oldest first
    assert not [a for a in acts if isinstance(a, Drain)]
    # the same volume with the stock table: the daemon keeps the bound by flushing every block
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    assert [a for a in run(e2, 120, STOCK) if isinstance(a, Drain)]


def test_a_measured_breach_is_a_flush() -> None:
    e = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    run(e, 5, HELD)
    [d] = [a for a in run(e, 1, HELD, dirty=65 * MIB, start=5) if isinstance(a, Drain)]
    assert "over max_dirty" in d.reason and "delegated bound breached" in d.reason
    # age: 40 MiB dirty while only 0.5 MiB/s was written for the last 30 s: 25 MiB are provably older
    e2 = Engine(parse_policy(DESTRUCTIVE, "t.yaml"), [WC])
    acts = run(e2, 29, HELD, rate=MIB // 2)
    assert not [a for a in acts if isinstance(a, Drain)]  # no mark 30 s old yet: nothing measured
    [d2] = [a for a in run(e2, 3, HELD, rate=MIB // 2, start=29) if isinstance(a, Drain)][:1]
    assert "older than max_age" in d2.reason


def test_written_marks_restart_with_the_counter_and_stay_bounded() -> None:
    w = _Written()
    for t in range(100):
        w.note(t * NS, t * MIB, 30 * NS)
    assert len(w.marks) <= 32 and w.since(99 * NS, 30 * NS) == 30 * MIB
    w.note(100 * NS, 5, 30 * NS)  # a reload restarted the statistics
    assert w.since(100 * NS, 30 * NS) is None


def test_wanted_leaves_the_watermarks_for_a_bound_above_half_the_cache() -> None:
    assert [x.knob for x in wanted(30.0, 200 * MIB, 256 * MIB)] == ["max_age", "pause_writeback"]
