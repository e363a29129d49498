"""The daemon's per-tick costs that grow with the work waiting (issue 23 item 5): a deferred promotion that waits on
is one decision, said once."""

from __future__ import annotations

import logging
from typing import cast

import pytest

from cachepilot.actions import PENDING, Outcome, Promote
from cachepilot.backends.base import Backend
from cachepilot.daemon.acting import Actor
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.volume import ManagedVolume, VolumeTable
from cachepilot.daemon.volumes import Found
from cachepilot.engine.engine import Engine
from cachepilot.events import kdev
from cachepilot.models.volume import VolumeInfo

FS = kdev(252, 1)
INFO = VolumeInfo(dev=FS, name="bcache0", kind="bcache", fs_uuid="u-1", mountpoint="/mnt/x", cache_id="c-1")


class SpentPromoter:
    """The promoter's answer when this second's read time is spent: the action back whole, deferred."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, action: Promote, dry_run: bool) -> Outcome:
        self.calls += 1
        return Outcome(action, PENDING, dry_run, deferred=action, actuated=True,
                       detail="this second's read time is spent")


def test_a_deferred_promotion_that_waits_is_one_decision_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    files = SpentPromoter()
    v = ManagedVolume(Found(INFO), backend=cast(Backend, object()), files=files)  # managed
    vols = VolumeTable()
    vols.add(v)
    counters = Counters()
    actor = Actor(Engine(), vols, counters, lambda dev, why: None, lambda msg: None)
    p = Promote("bcache0", FS, 12, 1, ((0, 65536),), "hot")
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        actor.execute(p, 0, dry_run=False)  # the engine's decision: deferred at once, said
        for tick in range(1, 6):
            actor.deferred(tick, dry_run=False)  # each tick it is tried again, and waits on
    assert files.calls == 6 and v.deferred == [p]  # still tried every tick, still waiting
    assert len(actor.decisions) == 1 and counters["decisions.promote"] == 1
    assert len([r for r in caplog.records if "promote bcache0" in r.getMessage()]) == 1
    assert counters["deferred_waits"] == 5
