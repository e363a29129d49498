"""An operator's drain (issue 36, engine/operatordrain.py): the policy held off the volume, a drain to a deadline,
done only when the backend read the cache clean, the end mode held until released, the deadline honoured."""

from __future__ import annotations

import pytest

from cachepilot.actions import Drain, Outcome, SetWritePolicy
from cachepilot.engine import Engine
from cachepilot.errors import UserError
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
DEV = kdev(252, 0)
MIB = 1 << 20
POLICY = "version: 1\ndefaults: {failure_model: destructive, exposure: {max_dirty: 8MiB, max_age: 30s}}\n"


def engine() -> Engine:
    return Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="bcache0", kind="bcache",
                                                             cache_bytes=1 << 30)])


def tick(e: Engine, t: float, mode: str = "writeback", dirty: int = 0) -> list:  # type: ignore[type-arg]
    e.sample(VolumeSample(DEV, int(t * NS), mode, dirty, 0, 0, 0, False, {}, ""))
    return e.tick(int(t * NS))


def status(e: Engine) -> dict:  # type: ignore[type-arg]
    op = e.vols[DEV].operator
    assert op is not None
    return op.to_json(e.vols[DEV].state.dirty_bytes, e.now_ns)


def test_a_drain_holds_the_policy_off_and_is_done_only_when_the_backend_read_clean() -> None:
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 60, "policy")
    acts = tick(e, 2, dirty=20 * MIB)  # over the 8 MiB bound: the policy would switch to write-through
    [d] = [a for a in acts if isinstance(a, Drain)]
    assert d.reason.startswith("operator drain") and d.deadline_ns == 61 * NS
    assert not [a for a in acts if isinstance(a, SetWritePolicy)]  # the policy is held off
    assert status(e)["state"] == "running"
    assert not [a for a in tick(e, 3, dirty=10 * MIB) if isinstance(a, Drain | SetWritePolicy)]  # one in flight
    e.outcome(Outcome(d, "done", detail="clean"))
    assert status(e)["state"] == "done" and "verified clean" in status(e)["detail"]
    acts = tick(e, 4, dirty=20 * MIB)  # the policy has the volume again
    assert [a.mode for a in acts if isinstance(a, SetWritePolicy)] == ["writethrough"]


def test_the_deadline_is_honoured_with_what_is_left() -> None:
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 5, "policy")
    [d] = [a for a in tick(e, 2, dirty=4 * MIB) if isinstance(a, Drain)]
    for t in range(3, 7):
        tick(e, t, dirty=3 * MIB)
    s = status(e)
    assert s["state"] == "expired" and f"{3 * MIB} dirty bytes left" in s["detail"]
    e.outcome(Outcome(d, "failed", detail="missed its deadline"))
    assert status(e)["state"] == "expired"


def test_an_operators_missed_deadline_or_failed_drain_is_not_an_exposure_breach() -> None:
    """The operator's deadline is the operator's, not the policy's exposure bound: a drain that misses it (or fails)
    ends the request as expired; it neither counts as a breach (cachepilot_volume_exposure_breaches_total) nor
    forces the volume write-through once the policy has it back."""
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 5, "policy")
    [d] = [a for a in tick(e, 2, dirty=4 * MIB) if isinstance(a, Drain)]
    e.outcome(Outcome(d, "failed", detail="kernel said no"))  # within the deadline: tried again
    [d] = [a for a in tick(e, 3, dirty=4 * MIB) if isinstance(a, Drain)]
    for t in range(4, 8):
        tick(e, t, dirty=3 * MIB)
    c = e.vols[DEV]
    assert status(e)["state"] == "expired"
    e.outcome(Outcome(d, "failed", detail="missed its deadline"))
    assert c.breach is None and c.breaches == 0
    acts = tick(e, 8, dirty=3 * MIB)  # the policy's again: under its 8 MiB bound, nothing forced
    assert not [a for a in acts if isinstance(a, SetWritePolicy) and a.mode == "writethrough"], acts


def test_a_failed_drain_is_tried_again_within_the_deadline() -> None:
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 60, "policy")
    [d] = [a for a in tick(e, 2, dirty=4 * MIB) if isinstance(a, Drain)]
    e.outcome(Outcome(d, "failed", detail="kernel said no"))
    assert status(e)["state"] == "running"
    assert [a for a in tick(e, 3, dirty=4 * MIB) if isinstance(a, Drain)]


def test_end_in_write_through_holds_until_released() -> None:
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 60, "writethrough")
    [d] = [a for a in tick(e, 2, dirty=4 * MIB) if isinstance(a, Drain)]
    e.outcome(Outcome(d, "done"))
    assert status(e)["state"] == "held"
    acts = tick(e, 3, mode="writeback", dirty=0)
    assert [(a.mode, a.reason) for a in acts if isinstance(a, SetWritePolicy)] == [
        ("writethrough", "operator drain: held write-through until released")]
    for t in range(4, 40):  # held: the destructive policy would take write-back again
        assert not [a for a in tick(e, t, mode="writethrough") if isinstance(a, SetWritePolicy)]
    assert e.operator_release("bcache0") == "released (held)"
    assert [a.mode for a in tick(e, 41, mode="writethrough") if isinstance(a, SetWritePolicy)] == ["writeback"]


def test_bad_requests_are_one_line() -> None:
    e = engine()
    with pytest.raises(UserError, match="unknown volume"):
        e.operator_drain("bcache9", 60, "policy")
    with pytest.raises(UserError, match="end: one of policy, writethrough"):
        e.operator_drain("bcache0", 60, "bypass")
    with pytest.raises(UserError, match="deadline"):
        e.operator_drain("bcache0", 0, "policy")
    e.operator_drain("bcache0", 60, "policy")
    with pytest.raises(UserError, match="already running"):
        e.operator_drain("bcache0", 60, "policy")


def test_a_drain_of_the_policy_in_flight_becomes_the_operators() -> None:
    e = engine()
    [mine] = [a for a in tick(e, 1, dirty=4 * MIB) if isinstance(a, Drain)]  # dirty data of unknown age
    e.operator_drain("bcache0", 60, "policy")
    assert not [a for a in tick(e, 2, dirty=2 * MIB) if isinstance(a, Drain)]
    e.outcome(Outcome(mine, "done"))
    assert status(e)["state"] == "done"


def test_a_rate_is_asked_of_bcaches_rate_controller_and_refused_where_the_kind_has_none() -> None:
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 60, "policy", rate=8 * MIB)
    [d] = [a for a in tick(e, 2, dirty=20 * MIB) if isinstance(a, Drain)]
    assert d.rate == 8 * MIB and "at 8388608 B/s" in d.reason
    assert status(e)["rate_asked_bytes_s"] == 8 * MIB
    dm = Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="dm-3", kind="dm-cache",
                                                           cache_bytes=1 << 30)])
    with pytest.raises(UserError, match=r"dm-3 \(dm-cache\) cannot be drained at a rate: migration_threshold caps"):
        dm.operator_drain("dm-3", 60, "policy", rate=8 * MIB)
    dm.operator_drain("dm-3", 60, "policy")  # at its full speed it can


def test_bcaches_writeback_delay_sleep_is_said_instead_of_an_unknown_eta() -> None:
    """bcache's write-back thread sleeps writeback_delay after a full scan and the drain cannot cut a sleep begun
    short (kernel-facts): while nothing is written back the progress line says within how long it starts, from the
    knob's value when the drain was asked for; once dirty data falls (or the sleep must be over) the rate again."""
    from cachepilot.commands.drain import _progress

    e = engine()
    e.sample(VolumeSample(DEV, NS, "writeback", 4 * MIB, 0, 0, 0, False, {"writeback_delay": "30"}, ""))
    e.tick(NS)
    e.operator_drain("bcache0", 120, "policy")
    for t in range(2, 12):  # the drain set writeback_delay 0: the samples read 0 now
        e.sample(VolumeSample(DEV, t * NS, "writeback", 4 * MIB, 0, 0, 0, False, {"writeback_delay": "0"}, ""))
        e.tick(t * NS)
    s = status(e)
    assert s["writeback_starts_within_s"] == 20.0 and s["sleep_knob"] == "writeback_delay"
    line = _progress("bcache0", s)
    assert "write-back starts within 20 s (writeback_delay)" in line and "ETA unknown" not in line, line
    tick(e, 12, dirty=2 * MIB)  # written back: the rate again
    s = status(e)
    assert s["writeback_starts_within_s"] is None and "/s, ETA " in _progress("bcache0", s)
    e2 = engine()  # past the sleep with nothing written back: unknown again, not a promise
    e2.sample(VolumeSample(DEV, NS, "writeback", 4 * MIB, 0, 0, 0, False, {"writeback_delay": "5"}, ""))
    e2.tick(NS)
    e2.operator_drain("bcache0", 120, "policy")
    tick(e2, 7, dirty=4 * MIB)
    assert "ETA unknown" in _progress("bcache0", status(e2))


def test_the_deadline_runs_from_the_time_the_request_is_taken_up_not_from_a_late_last_tick() -> None:
    """The daemon takes requests up before its tick, with that tick's time; the engine's clock is still the last
    tick's, seconds behind after a slow one (lab: a 1 s drain on dm-writecache taken up 5 s late expired before any
    flush was sent)."""
    e = engine()
    tick(e, 1, dirty=0)
    e.operator_drain("bcache0", 2, "policy", now_ns=6 * NS)  # the last tick was 5 s ago
    assert status(e)["deadline_in_s"] == 2
    [d] = [a for a in tick(e, 6, dirty=4 * MIB) if isinstance(a, Drain)]  # a drain, not an expired request
    assert d.deadline_ns == 8 * NS and status(e)["state"] == "running"
