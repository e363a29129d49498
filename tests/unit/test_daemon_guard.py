"""A failing stage or event counted and said once (daemon/guard.py), start-up's objects frozen (daemon/gcpause.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cachepilot.actions import SetWritePolicy
from cachepilot.errors import KernelRejected
from cachepilot.events import Delete, FileKey
from tests.unit.daemon_rig import (
    DEV,
    Rig,
)


def test_a_type_error_inside_the_engine_is_a_bug_not_an_unknown_event(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    r = Rig(tmp_path)
    r.d.start()

    def bug(ev: object) -> None:
        raise TypeError("unsupported operand type(s)")

    r.d.engine.hotness.delete = bug  # type: ignore[method-assign]  # what the engine's Delete handler calls
    with caplog.at_level(logging.ERROR, logger="cachepilot"):
        r.d._feed(Delete(FileKey(DEV, 5, 1), 4096, 1))
        r.d._feed(Delete(FileKey(DEV, 6, 1), 4096, 2))
    assert r.d.counters["events.bugs"] == 2 and r.d.counters["events.unhandled"] == 0
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1 and "TypeError" in caplog.text  # once, with its traceback
    r.d._feed(SetWritePolicy("bcache0", "writeback", "not an event"))  # an unknown kind: still "unhandled"
    assert r.d.counters["events.unhandled"] == 1 and r.d.counters["events.bugs"] == 2
    r.d.shutdown()


def test_a_failing_stage_is_counted_and_the_tick_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    r = Rig(tmp_path)
    r.d.start()
    calls = []

    def broken(now: int, **_: object) -> list[object]:
        calls.append(now)
        raise TypeError("unsupported operand type(s)")

    r.d.engine.tick = broken  # type: ignore[method-assign]
    r.d.actor.step = lambda now: calls.append(-now)  # type: ignore[method-assign]
    r.d.stages = r.d._stages()
    with caplog.at_level(logging.ERROR, logger="cachepilot"):
        r.tick(1)
        r.tick(2)
    assert r.d.counters["stage_bugs.decide"] == 2 and r.d.counters["ticks"] == 2
    assert len(calls) == 4 and calls[1] < 0  # the stage after it ran, each tick
    assert r.d.counters["events.bugs"] == 0 and r.d.counters["stage_errors.decide"] == 0  # a bug, not input
    assert len([rec for rec in caplog.records if rec.exc_info]) == 1  # its traceback once
    snap = r.d.snapshot
    assert snap is not None and snap.last_tick.n == 2  # still published

    def refused(now: int, **_: object) -> None:
        raise KernelRejected("bcache0: cache_mode: Invalid argument")

    r.d.engine.tick = refused  # type: ignore[method-assign]
    r.tick(3)
    assert r.d.counters["stage_errors.decide"] == 1 and r.d.counters["stage_bugs.decide"] == 2
    r.d.shutdown()


def test_start_up_objects_are_frozen_and_full_collections_counted(rig: Rig) -> None:
    """A full collection walking start-up's objects made lab ticks pass a second (daemon/gcpause.py)."""
    import gc

    gc.unfreeze()
    rig.d.start()
    assert gc.get_freeze_count() > 1000  # the loaded code, out of the collector's walks
    gc.collect()
    assert rig.d.counters["gc.full"] >= 1 and rig.d.counters["gc_ns.full"] > 0
    rig.tick(1)
    c = rig.status()["counters"]
    assert c["tick_wall_ns.sample"] > 0 and "tick_cpu_ns.decide" in c  # where each tick's time went
    rig.d.shutdown()
    before = rig.d.counters["gc.full"]
    gc.collect()
    assert rig.d.counters["gc.full"] == before  # no callback left behind
    gc.unfreeze()
