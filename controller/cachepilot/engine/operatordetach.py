"""An operator's detach (issue 36, ``cachepilot detach VOLUME``): the cache taken out from under a volume that stays
mounted and serving. First an operator's drain to verified clean, ending write-through where the kind has it (the
same request ``cachepilot drain --end writethrough`` makes, engine/operatordrain.py: the policy is held off the
volume from here on), then one :class:`~cachepilot.actions.Detach` through the kind's own interface (bcache
``detach``, dm kinds a linear table over the origin, lvmcache ``lvconvert --splitcache``), read back by the backend.
When it is done the daemon releases the volume from its management (daemon/lifecycle.py): a volume without its
cache on purpose is neither latched nor alerted on.

``accept_loss`` (the operator accepted losing the dirty data of a failed cache device): no drain (it cannot write
back), the Detach is sent at once with ``accept_loss``. Without it a failed cache holding dirty data is refused
before anything is queued (:func:`refusal`).

States: ``draining`` -> ``detaching`` -> ``detached`` (the daemon then drops the volume), or ``failed`` (the drain
expired or failed, or the Detach failed): the volume stays held write-through by the drain until released
(``cachepilot drain VOLUME --release``), nothing half-done."""

from __future__ import annotations

from cachepilot.actions import Action, Detach, Write
from cachepilot.engine import operatordrain
from cachepilot.engine.volumectl import (
    DETACHED,
    DETACHING,
    DRAINING,
    FAILED,
    HELD,
    NS,
    OperatorDetach,
    VolumeCtl,
    normalise_mode,
)
from cachepilot.errors import UserError
from cachepilot.models.volume import WRITETHROUGH

DETACH_WINDOW_NS = 120 * NS  # the Detach itself (bcache writes back a few blocks dirtied since the drain, a suspend)


def refusal(name: str, failed: bool, dirty: int, accept_loss: bool) -> str | None:
    """The one line that refuses a detach, or None: a cache device that failed while it holds dirty data cannot
    write it back, so a detach loses it -- only with accept_loss."""
    if failed and dirty > 0 and not accept_loss:
        return (f"{name}: refused: the cache device failed holding {dirty} dirty bytes that a detach would lose"
                " (--accept-loss detaches anyway)")
    return None


def at_risk(c: VolumeCtl) -> int | None:
    """The dirty bytes a detach of ``c`` would lose now: None while its cache has not failed (nor is latched). A
    failed dm-cache reports no figures: what it held is the last reading before it failed."""
    if c.latch is None and not (c.state.samples > 0 and c.state.failed):
        return None
    return max(c.state.dirty_bytes, c.state.dirty_before_failure)


def request(c: VolumeCtl, now: int, deadline_s: float, accept_loss: bool, number: int = 0) -> OperatorDetach:
    """Start a detach of ``c`` (UserError for a bad request or a refusal); ``number``: the control socket's for
    the request, shown in status."""
    if c.detach is not None and c.detach.state in (DRAINING, DETACHING):
        raise UserError(f"{c.info.name}: a detach is already under way ({c.detach.state})")
    loss = at_risk(c)
    failed = loss is not None
    line = refusal(c.info.name, failed, loss or 0, accept_loss)
    if line is not None:
        raise UserError(line)
    d = OperatorDetach(now, now + int(deadline_s * NS), accept_loss, request=number)
    if accept_loss and failed:
        d.state = DETACHING  # nothing can be written back: straight to the detach
    else:
        end = WRITETHROUGH if WRITETHROUGH in c.caps.modes else "policy"
        operatordrain.request(c, now, deadline_s, end)
    c.detach = d
    return d


def step(c: VolumeCtl, now: int, out: list[Action]) -> None:
    """After the operator's drain step: once it read the cache clean (and write-through, where the kind has it),
    the Detach; a drain that ended otherwise fails the detach."""
    d = c.detach
    if d is None or d.state not in (DRAINING, DETACHING) or d.action is not None:
        return
    if d.state == DRAINING:
        op = c.operator
        if op is None or op.state == operatordrain.DONE and WRITETHROUGH in c.caps.modes:
            _end(d, FAILED, "the drain was released before the detach")
            return
        if op.state in (operatordrain.EXPIRED, operatordrain.FAILED):
            _end(d, FAILED, f"not detached: drain {op.state}: {op.detail}")
            return
        if op.state not in (HELD, operatordrain.DONE):
            return  # draining
        if op.state == HELD and normalise_mode(c.state.mode) != WRITETHROUGH:
            return  # the hold's switch to write-through is still on its way
        d.state = DETACHING
    how = "accepting the loss of the failed cache's dirty data" if d.accept_loss else "drained and verified clean"
    d.action = Detach(c.info.name, max(now + DETACH_WINDOW_NS, d.deadline_ns),
                      f"operator detach (cachepilot detach): {how}, {c.state.dirty_bytes} dirty bytes now",
                      accept_loss=d.accept_loss)
    out.append(d.action)


def ended(c: VolumeCtl, a: Detach, ok: bool, detail: str, writes: tuple[Write, ...] = ()) -> None:
    """The Detach ended: detached (the daemon releases the volume), or failed (held write-through, said why)."""
    d = c.detach
    if d is None or d.action != a:
        return
    d.writes = writes
    if ok:
        _end(d, DETACHED, detail or "detached")
    else:
        _end(d, FAILED, f"detach failed: {detail or 'no reason given'}")


def _end(d: OperatorDetach, state: str, detail: str) -> None:
    d.state, d.detail = state, detail
