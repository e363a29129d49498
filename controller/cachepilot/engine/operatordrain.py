"""An operator's drain (issue 36, ``cachepilot drain VOLUME``): dirty data driven to zero by a deadline through the
kind's own drain (the same Drain action the exposure guarantee uses: bcache writeback_percent 0, dm-cache the
cleaner, dm-writecache flush, lvmcache the cleaner by lvchange), verified by the backend (it ends a drain only when
it reads the cache clean), with the daemon's own write policy, drains and pacing held off the volume meanwhile.

It ends ``done`` (a drain started after the request read the cache clean), ``expired`` (the deadline passed; what
is left is said) or ``failed`` (the drain failed and the deadline left no room for another). With ``end``
"writethrough" a done drain leaves the volume write-through, held there until the operator releases it
(``cachepilot drain VOLUME --release``); with "policy" the policy takes the volume back at once."""

from __future__ import annotations

from cachepilot.actions import Action, Drain, SetWritePolicy
from cachepilot.engine.volumectl import (
    HELD,
    NS,
    REQUEST_RETRY_NS,
    RUNNING,
    DrainInFlight,
    OperatorDrain,
    VolumeCtl,
    caps_of,
    normalise_mode,
)
from cachepilot.errors import UserError
from cachepilot.models.volume import WRITETHROUGH

ENDS = ("policy", "writethrough")
DONE, EXPIRED, FAILED = "done", "expired", "failed"


def check_rate(name: str, kind: str, rate: int) -> None:
    """UserError for a rate the kind cannot steer (the control socket asks before it queues the request)."""
    caps = caps_of(kind)
    if rate < 0 or (rate and caps.pace_knob is None):
        why = caps.no_rate or "it has no write-back rate to steer"
        raise UserError(f"--rate: {name} ({kind}) cannot be drained at a rate: {why}")


def request(c: VolumeCtl, now: int, deadline_s: float, end: str, rate: int = 0, number: int = 0) -> OperatorDrain:
    """Start an operator's drain on ``c`` (UserError for a bad request). ``rate`` (bytes/s, 0: the kind's full
    speed) only where the kind has a write-back rate to steer (Capabilities.pace_knob: bcache's rate controller, as
    a paced drain sets it); ``number``: the control socket's for the request, shown in status."""
    check_rate(c.info.name, c.info.kind, rate)
    if end not in ENDS:
        raise UserError(f"end: one of {', '.join(ENDS)} expected, got {end!r}")
    if not 0 < deadline_s <= 7 * 86400:
        raise UserError(f"deadline: seconds in (0, {7 * 86400}] expected, got {deadline_s!r}")
    if c.operator is not None and c.operator.state == RUNNING:
        raise UserError(f"{c.info.name}: an operator's drain is already running")
    op = OperatorDrain(now, now + int(deadline_s * NS), end, c.state.dirty_bytes, rate=rate, request=number)
    op.sleep_knob, op.sleep_s = _sleep(c)
    if c.drain is not None:  # the policy's drain in flight becomes the operator's: it ends by reading clean too
        op.action, op.drains = c.drain.action, 1
    c.operator = op
    return op


def _sleep(c: VolumeCtl) -> tuple[str, float]:
    """The kind's sleep knob and its value as last sampled (before the drain sets it to 0), if it has one."""
    knob = c.caps.drain_sleep_knob
    try:
        return (knob, float(c.state.knobs[knob])) if knob else ("", 0.0)
    except (KeyError, ValueError):
        return knob or "", 0.0


def release(c: VolumeCtl) -> str:
    """Give a volume an operator's drain holds (or still runs) back to the policy; what it was doing."""
    op = c.operator
    if op is None or not op.active:
        return "nothing held"
    c.operator = None
    return f"released ({op.state})"


def step(c: VolumeCtl, now: int, out: list[Action]) -> None:
    """The operator's drain on this tick: start a drain when none is in flight, end on the deadline, keep a held
    volume write-through. Called before the policy's steps, which skip the volume while ``c.operator.active``."""
    op = c.operator
    if op is not None and op.state == HELD:
        _hold_writethrough(c, op, now, out)
    if op is None or op.state != RUNNING:
        return
    if now >= op.deadline_ns:
        _end(op, EXPIRED, now, f"deadline passed with {c.state.dirty_bytes} dirty bytes left")
        return
    if c.drain is None:
        paced = f" at {op.rate} B/s" if op.rate else ""
        a = Drain(c.info.name, op.deadline_ns, f"operator drain (cachepilot drain): {c.state.dirty_bytes} dirty"
                  f" bytes{paced}, deadline in {(op.deadline_ns - now) / NS:.0f} s, then {op.end}", rate=op.rate)
        out.append(a)
        c.drain = DrainInFlight(a, now, c.state.dirty_bytes, by_operator=True)
        op.drains += 1
        op.action = a


def _hold_writethrough(c: VolumeCtl, op: OperatorDrain, now: int, out: list[Action]) -> None:
    if c.state.samples == 0 or normalise_mode(c.state.mode) == WRITETHROUGH or WRITETHROUGH not in c.caps.modes:
        return
    if op.asked_mode_ns is None or now - op.asked_mode_ns >= REQUEST_RETRY_NS:
        out.append(SetWritePolicy(c.info.name, WRITETHROUGH, "operator drain: held write-through until released"))
        op.asked_mode_ns = now


def drain_ended(c: VolumeCtl, a: Drain, ok: bool, detail: str, now: int) -> None:
    """The operator's drain action ended: done when the backend read the cache clean (it ends a drain no other
    way); a failure ends the request only once its deadline has passed (else the next tick drains again)."""
    op = c.operator
    if op is None or op.state != RUNNING or op.action != a:
        return
    if not ok:
        if now >= op.deadline_ns:
            _end(op, FAILED, now, f"drain failed: {detail or 'no reason given'}")
        return
    if op.end == WRITETHROUGH:
        _end(op, HELD, now, "drained and verified clean; held write-through until released")
    else:
        _end(op, DONE, now, "drained and verified clean; the policy has the volume again")


def _end(op: OperatorDrain, state: str, now: int, detail: str) -> None:
    op.state, op.detail, op.ended_ns = state, detail, now
