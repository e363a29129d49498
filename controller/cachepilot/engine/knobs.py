"""Knob requests: knobs the policy pins, and the drain-sleep knob the exposure guarantee shortens.

Every knob asked for here is put back at a clean stop to the value the backend found before the first write
(``put_back_on_exit``; the state file keeps it across a crash): a knob the daemon changed must not outlive it,
e.g. bcache's writeback_delay left at 5 s after an uninstall (issue 34 item 3)."""

from __future__ import annotations

from cachepilot import units
from cachepilot.actions import Action, SetKnob, SetKnobs
from cachepilot.capabilities import KNOBS
from cachepilot.engine.exposure import Exposure
from cachepilot.engine.volumectl import ANY_KIND, NS, REQUEST_RETRY_NS, VolumeCtl
from cachepilot.errors import UserError


class KnobPins:
    """Asks for each volume's pinned knob values (at most once per REQUEST_RETRY_NS while unanswered)."""

    def __init__(self, exposure: Exposure) -> None:
        self.exposure = exposure

    def pin(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        kinds_knobs = c.caps.knobs() if c.caps is not ANY_KIND else KNOBS
        for knob, value in c.policy.knobs.items():
            if knob in kinds_knobs:  # else a defaults knob for another kind of cache
                self.request(c, knob, value, f"pinned by policy ({c.chosen_by})", now, out)
        self.drain_sleep(c, now, out)

    def drain_sleep(self, c: VolumeCtl, now: int, out: list[Action]) -> None:
        """The exposure guarantee needs every drain to finish within max_age/2. Where the kind may sleep before a
        drain's write-back starts (bcache: writeback_delay, 30 s by default, longer than the default 15 s window),
        hold that sleep to at most a third of the window under the destructive model, unless the policy pins it.
        A sleep already begun keeps its old length: drains planned before it can have ended get a deadline that
        allows for it (the guarantee holds from the first completed drain). The daemon asks once more before it
        says it is ready (:meth:`Engine.before_ready`), so that a workload started then meets the short sleep."""
        knob = c.caps.drain_sleep_knob
        if knob is None or knob in c.policy.knobs or self.exposure.failure_model(c, now)[0] != "destructive":
            return
        limit = max(1, int(c.policy.exposure.max_age_s / 6))
        have = c.state.knobs.get(knob)
        try:
            was = KNOBS[knob].parse(have) if have is not None else 0
        except UserError:
            return  # an unreadable value: not ours to guess at
        if was <= limit:
            c.requested_knobs.pop(knob, None)
            return
        c.drain_sleep_until_ns = max(c.drain_sleep_until_ns, now + was * NS)
        self.request(c, knob, str(limit), (
            f"exposure guarantee: a drain must finish within max_age/2 = {c.policy.exposure.max_age_s / 2:g} s"
            f" and the write-back thread's {knob} sleep is not cut short"), now, out)

    def request(self, c: VolumeCtl, knob: str, value: str, why: str, now: int, out: list[Action],
                put_back: bool = True) -> None:
        self.request_many(c, [(knob, value, why)], now, out, put_back)

    def request_many(self, c: VolumeCtl, wants: list[tuple[str, str, str]], now: int, out: list[Action],
                     put_back: bool = True) -> None:
        """Ask for (knob, value, why) each, the ones not already read back nor asked within REQUEST_RETRY_NS, together:
        one SetKnobs (one write where the kind has one, e.g. a dm-writecache reload) when there are several."""
        todo = [(k, v, why) for k, v, why in wants if _due(c, k, v, now)]
        if not todo:
            return
        if len(todo) == 1:
            knob, value, why = todo[0]
            out.append(SetKnob(c.info.name, knob, value, f"{why}; was {c.state.knobs.get(knob, 'unknown')}",
                               put_back))
        else:
            whys = "; ".join(dict.fromkeys(why for _, _, why in todo))  # each reason once, in order
            was = ", ".join(f"{k} {c.state.knobs.get(k, 'unknown')}" for k, _, _ in todo)
            out.append(SetKnobs(c.info.name, tuple((k, v) for k, v, _ in todo), f"{whys}; was {was}", put_back))
        for k, v, _ in todo:
            c.requested_knobs[k] = (v, now)


def _due(c: VolumeCtl, knob: str, value: str, now: int) -> bool:
    """Whether to ask for ``value``: the last sample reads otherwise, and it was not asked within REQUEST_RETRY_NS."""
    if same_knob_value(knob, c.state.knobs.get(knob), value):
        c.requested_knobs.pop(knob, None)
        return False
    req = c.requested_knobs.get(knob)
    return not (req is not None and req[0] == value and now - req[1] < REQUEST_RETRY_NS)


def knob_value(knob: str, have: str | None) -> int | None:
    """A knob's reading as its typed value; None when unread or unparsable."""
    if have is None:
        return None
    try:
        return KNOBS[knob].parse(have)
    except UserError:
        return None


def same_knob_value(knob: str, have: str | None, want: str) -> bool:
    """Compare as the knob's typed value ("4.0M" from bcache's sysfs equals "4MiB" and 4194304; bcache prints a size
    rounded to one decimal of its unit, and 0 as "0.0k")."""
    if have is None:
        return False
    if have == want:
        return True
    k = KNOBS.get(knob)
    if k is None:
        return False
    try:
        wanted = k.parse(want)
    except UserError:
        return False
    if k.type == "size" and units.printed_matches(have, wanted):
        return True
    try:
        return k.parse(have) == wanted
    except UserError:
        return False
