"""What a restart keeps (daemon/persist.py over the state file): re-warm, reconcile of an interrupted drain, the
failure latch, knobs steered before a kill, a hostile steered entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachepilot.actions import Drain, Promote, SetKnob
from cachepilot.daemon.state import StateFile
from cachepilot.events import FileKey, HotnessDelta
from cachepilot.models.volume import VolumeSample
from tests.unit.daemon_rig import (
    DEV,
    VOL,
    FakeBackend,
    Rig,
)


def test_state_survives_a_restart_rewarms_and_reconciles(tmp_path: Path) -> None:
    r = Rig(tmp_path)
    r.d.start()
    for ino in range(1, 6):
        r.d.engine.feed(HotnessDelta(FileKey(DEV, ino, 7), 64 * ino, 0, 4096, 0, 1, size=16384))
    r.d.execute(Drain("bcache0", 0, "test"), r.d.started_ns)  # in flight when we "crash"
    r.tick(1)
    r.d._save_state()
    r.crash()  # no restore(): the drain's writeback_percent=0 stays behind
    doc, _ = StateFile(tmp_path / "st").read()
    assert doc is not None
    vol = doc["volumes"]["bcache0"]
    assert [h[0] for h in vol["hot"]] == [5, 4, 3, 2, 1] and vol["in_flight"][0]["kind"] == "drain"

    r2 = Rig(tmp_path)
    r2.backends["bcache0"] = r.backends["bcache0"]  # the same cache, as the crash left it
    r2.backends["bcache0"].bypass_rate = 1  # bypassing reads: what it holds may not be what was hot
    r2.d.start()
    b = r2.backends["bcache0"]
    assert b.knobs["writeback_percent"] == "10"  # put back: it still read back as the interrupted drain left it
    assert [a for a, _ in b.applied if isinstance(a, Drain)] == [Drain("bcache0", 0, "test")]  # never repeated
    t = r2.d.engine.hotness
    assert all(t.lookup(DEV, ino, 7) is not None for ino in range(1, 6))
    r2.tick(1)
    r2.tick(2)
    assert r2.d.counters["rewarm_files"] == 5 and r2.status()["volumes"][0]["believed_cached"] == 5
    promoted = [a for a, _ in r2.d.vols[DEV].files.ran if isinstance(a, Promote)]
    assert sorted(a.ino for a in promoted) == [1, 2, 3, 4, 5] and all(a.gen == 7 for a in promoted)
    r2.d.shutdown()


class FailingBackend(FakeBackend):
    def sample(self, now_ns: int) -> VolumeSample:
        s = super().sample(now_ns)
        return VolumeSample(s.dev, s.ts_ns, s.mode, s.dirty_bytes, s.hits, s.misses, 3, True, s.knobs)


def test_the_failure_latch_survives_a_restart_until_cleared(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    r = Rig(tmp_path)
    r.backends["bcache0"] = FailingBackend(VOL)
    r.d.start()
    r.tick(1)
    assert r.status()["volumes"][0]["latched"] is True
    r.d.shutdown()
    r2 = Rig(tmp_path)  # the cache reads healthy now, but nobody replaced it or cleared the latch
    r2.d.start()
    v = r2.status()["volumes"][0]
    assert v["latched"] is True and "kept from the state file" in v["latch_reason"]
    from cachepilot.cli import main

    assert main(["clear-latch", "bcache0", "--socket", str(r2.socket)]) == 0
    assert capsys.readouterr().out == "bcache0: latch cleared at the daemon's next tick (see `cachepilot status`)\n"
    assert main(["clear-latch", "nope", "--socket", str(r2.socket)]) == 2  # unknown volume: one line
    r2.tick(1)
    assert r2.status()["volumes"][0]["latched"] is False
    r2.d.shutdown()


def test_knobs_steered_before_a_kill_are_put_back_at_the_next_start(tmp_path: Path) -> None:
    """The lifetime hold and sequential steering put their knobs back at a clean stop; a SIGKILL leaves them
    steered. The state file keeps what was steered and from what, and the next start puts back what still reads as
    the last run left it -- before the engine takes its base (else the steered value would become the "original")."""
    r = Rig(tmp_path)
    r.d.start()
    b = r.backends["bcache0"]
    b.knobs.update({"writeback_percent": "40", "sequential_cutoff": "8388608"})
    b.steered_knobs = lambda: {"writeback_percent": ("10", "40")}  # type: ignore[method-assign]
    seq = r.d.engine.seq.vols[DEV]
    seq.base, seq.cutoff, seq.moved = 4194304, 8388608, True
    r.d._save_state()
    r.crash()  # killed: no restore()
    doc, _ = StateFile(tmp_path / "st").read()
    assert doc is not None
    assert doc["volumes"]["bcache0"]["steered"] == {"sequential_cutoff": ["4194304", "8388608"],
                                                    "writeback_percent": ["10", "40"]}

    b.knobs["writeback_percent"] = "25"  # an operator set it since: theirs to keep
    r2 = Rig(tmp_path)
    r2.backends["bcache0"] = b
    r2.d.start()
    assert b.knobs["sequential_cutoff"] == "4194304" and b.knobs["writeback_percent"] == "25"
    assert r2.d.engine.seq.vols[DEV].base == 4194304  # the operator's value is the base again
    put = [a for a, _ in b.applied if isinstance(a, SetKnob) and "unclean stop" in a.reason]
    assert [(a.knob, a.value) for a in put] == [("sequential_cutoff", "4194304")]
    r2.d.shutdown()


def test_a_hostile_steered_entry_in_the_state_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "st").mkdir(mode=0o700)
    assert StateFile(tmp_path / "st").write({"volumes": {"bcache0": {"name": "bcache0", "fs_uuid": "u-1", "steered": {
        "writeback_percent": ["10"], "sequential_cutoff": [1, 2], "x": "y", "cache_mode": ["none", "writeback"]}}}})
    r = Rig(tmp_path)
    b = r.backend(VOL)
    r.d.start()
    assert not [a for a, _ in b.applied if isinstance(a, SetKnob)] and b.knobs["writeback_percent"] == "10"
    r.d.shutdown()
