"""Carrying out the engine's decisions (daemon/acting.py): applied and read back, dry-run, retries with back-off,
observe-only volumes, the file actuators' outcomes, errors by class, deferred file actions within the tick's budget."""

from __future__ import annotations

import errno
import time
from pathlib import Path

from cachepilot.actions import DiscardRanges, Promote, SetKnob, SetWritePolicy
from cachepilot.backends.base import DONE, Outcome
from cachepilot.daemon.volumes import Found
from cachepilot.errors import RetryLater
from cachepilot.events import FileKey, HotnessDelta
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import (
    DEV,
    FakeFiles,
    Rig,
)


def test_daemon_adopts_samples_decides_and_acts(rig: Rig) -> None:
    rig.d.start()
    b = rig.backends["bcache0"]
    b.dirty = 8 << 20  # over the 1 MiB bound in write-back: write-through at once
    rig.tick(1)
    assert [(a.mode, dry) for a, dry in b.applied if isinstance(a, SetWritePolicy)] == [("writethrough", False)]
    assert b.mode == "writethrough"
    d = list(rig.d.decisions)[-1]
    assert d["status"] == "done" and d["writes"][0]["readback"] == "writethrough" and "exposure bound" in d["reason"]
    v = rig.status()["volumes"][0]
    assert (v["mode"], v["target_mode"], v["dirty_bytes"]) == ("writeback", "writethrough", 8 << 20)  # as last read
    rig.tick(2)
    v = rig.status()["volumes"][0]
    assert (v["mode"], v["target_mode"]) == ("writethrough", "writethrough")


def test_dry_run_goes_through_apply_and_changes_nothing(tmp_path: Path) -> None:
    r = Rig(tmp_path, dry_run=True)
    r.d.start()
    b = r.backends["bcache0"]
    b.bypass_rate = 1  # a volume that bypasses reads: its hot files are worth a promotion read
    b.dirty = 8 << 20
    r.tick(1)
    assert [(a.mode, dry) for a, dry in b.applied if isinstance(a, SetWritePolicy)] == [("writethrough", True)]
    assert b.mode == "writeback" and list(r.d.decisions)[-1]["dry_run"] is True
    r.d.engine.feed(HotnessDelta(FileKey(DEV, 9, 1), 64, 0, 4096, 0, 1, size=16384))
    r.tick(2)
    files = r.d.vols[DEV].files.ran
    assert [(a.ino, dry) for a, dry in files if isinstance(a, Promote)] == [(9, True)]  # the actuator, told dry
    r.d.shutdown()


def test_retry_later_backs_off_and_counts(rig: Rig) -> None:
    rig.d.start()
    b = rig.backends["bcache0"]
    b.fail_with = [RetryLater("busy"), RetryLater("busy")]
    b.dirty = 8 << 20
    rig.tick(1)
    rig.tick(1.5)  # backoff 1 s: not yet
    assert len([a for a, _ in b.applied if isinstance(a, SetWritePolicy)]) == 1
    rig.tick(2.1)  # first retry (fails again: next backoff 2 s)
    rig.tick(3.0)
    assert len([a for a, _ in b.applied if isinstance(a, SetWritePolicy)]) == 2
    rig.tick(4.2)  # second retry succeeds
    assert b.mode == "writethrough" and rig.d.counters["retries"] == 2 and rig.d.counters["failed.retry"] == 2


def test_observe_only_volume_is_never_acted_on(tmp_path: Path) -> None:
    r = Rig(tmp_path)
    r.found = [Found(VolumeInfo(dev=DEV, name="loop0", kind="none", mountpoint="/mnt"))]
    r.d.start()
    assert r.status()["observe_only"] is True and r.backends == {}
    r.d.execute(SetKnob("loop0", "x", "1", "test"), r.d.started_ns)
    assert list(r.d.decisions)[-1]["detail"] == "not carried out: observe-only volume"
    r.d.shutdown()


class RealResultFiles(FakeFiles):
    """The file actuators' outcomes (what FITRIM and promotion runs return), without running them."""

    def run(self, action: object, dry_run: bool) -> object:  # type: ignore[override]
        self.ran.append((action, dry_run))
        if isinstance(action, DiscardRanges):
            return Outcome(action, DONE, dry_run=dry_run, actuated=True, issued=((0, 4096),), trimmed_bytes=4096)
        assert isinstance(action, Promote)
        return Outcome(action, DONE, dry_run=dry_run, actuated=True, read_bytes=8192, reads=1)


def test_file_actions_outcomes_are_recorded_and_logged(tmp_path: Path) -> None:
    """The daemon logs each outcome through its own line(): the file actuators' result types included."""
    r = Rig(tmp_path, files=RealResultFiles)
    r.d.start()
    r.d.execute(DiscardRanges("bcache0", DEV, ((0, 4096),), "test"), r.d.started_ns)
    r.d.execute(Promote("bcache0", DEV, 12, 1, ((0, 8192),), "test"), r.d.started_ns)
    got = [(d["kind"], d["status"]) for d in list(r.d.decisions)[-2:]]
    assert got == [("discard", DONE), ("promote", DONE)]
    assert "filesystem trimmed 4096 bytes" in list(r.d.decisions)[-2]["detail"]
    assert r.d.vols[DEV].promoted_bytes == 8192 and r.d.vols[DEV].discard_issued_bytes == 4096
    r.d.shutdown()


def test_the_daemon_classifies_an_os_error_by_the_same_rule(tmp_path: Path) -> None:
    """An OSError escaping a backend with an errno the rule does not list is rejected (counted, not retried), as
    kernelio rejects it; the daemon used to retry it five times."""
    r = Rig(tmp_path)
    r.d.start()
    b = r.backends["bcache0"]

    def broken(action: object, *, dry_run: bool = False) -> object:
        raise OSError(errno.EIO, "Input/output error", "/sys/block/bcache0/bcache/cache_mode")

    b.apply = broken  # type: ignore[assignment,method-assign]
    b.dirty = 8 << 20  # over the bound: a switch to write-through is decided
    r.tick(1)
    r.tick(3)
    d = [x for x in r.d.decisions if x["kind"] == "set_write_policy"]
    assert d and d[0]["error_kind"] == "rejected" and "cache_mode: Input/output error" in d[0]["error"]
    assert r.d.counters["retries"] == 0 and r.d.counters["failed.rejected"] >= 1
    r.d.shutdown()


def test_a_tick_runs_deferred_file_actions_only_within_its_budget_and_acts_at_once_between_ticks(
        tmp_path: Path) -> None:
    """Issue 21 item 6: the soak's ticks over 1 s were mostly the deferred stage (every deferred action, every tick).
    Each file action here costs 50 ms on the budget's clock: of 40 deferred, the tick runs what fits in half its
    period and leaves the rest queued in order; between ticks a file action is carried out at once."""
    r = Rig(tmp_path)
    r.d.start()
    extra = [0]
    r.d.budget.clock_ns = lambda: time.monotonic_ns() + extra[0]
    files = r.d.vols[DEV].files
    run = files.run
    files.run = lambda a, dry: (extra.__setitem__(0, extra[0] + 50_000_000), run(a, dry))[-1]
    queued = [Promote("bcache0", DEV, 100 + i, 1, ((0, 4096),), "hot") for i in range(40)]
    r.d.vols[DEV].deferred = list(queued)
    r.tick(1)
    ran = [a for a, _ in files.ran]
    assert 1 <= len(ran) <= 10 and ran == queued[:len(ran)]
    assert r.d.vols[DEV].deferred == queued[len(ran):] and r.d.counters["deferred_left"] == 40 - len(ran)
    d = DiscardRanges("bcache0", DEV, ((0, 4096),), "freed")
    r.d.execute(d, r.d.started_ns)  # between ticks: the budget is closed
    assert files.ran[-1] == (d, False)
    r.d.shutdown()


def test_the_rest_of_a_paced_promotion_waits_while_the_engine_holds_promotions(tmp_path: Path) -> None:
    """A promotion the pacing cut short goes on next tick, unless the volume's drain is at risk (the engine
    holds promotions): then it waits with the rest, and goes once the hold ends."""
    r = Rig(tmp_path)
    r.d.start()
    held = [True]
    r.d.engine.holds_promotions = lambda name: held[0]  # type: ignore[method-assign]
    rest = Promote("bcache0", DEV, 12, 1, ((8192, 8192),), "rest of a paced promotion")
    r.d.vols[DEV].deferred.append(rest)
    files = r.d.vols[DEV].files
    r.tick(1)
    assert not [a for a, _ in files.ran if a == rest] and r.d.vols[DEV].deferred == [rest]
    held[0] = False
    r.tick(2)
    assert [a for a, _ in files.ran if a == rest] and r.d.vols[DEV].deferred == []
    r.d.shutdown()
