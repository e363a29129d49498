"""Issue 34 item 3: a clean stop puts back every knob the daemon changed -- the ones the policy pins and the
drain-sleep the exposure guarantee shortens, not only the ones it steers -- to the value it found, and the state file
remembers that value across a crash, so the run after a kill still restores the original at its clean stop. A real
bcache backend on a fixture sysfs tree: every write is a file the test reads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cachepilot.backends import open_backend
from cachepilot.backends.base import Backend
from cachepilot.backends.host import Host
from cachepilot.daemon.state import StateFile
from cachepilot.models.volume import VolumeInfo
from tests.unit.daemon_rig import Rig
from tests.unit.test_backends import bcache_tree

# destructive, max_age 60 s: bcache's writeback_delay (30) held to max_age/6 = 10; writeback_percent pinned at 20
POLICY = """
version: 1
defaults:
  failure_model: destructive
  exposure: {max_dirty: 64MiB, max_age: 60s}
  hysteresis: {min_switch_interval: 0s}
  discard_on_delete: {enabled: false}
  knobs: {writeback_percent: 20}
"""


class SysfsRig(Rig):
    """The daemon on fakes, but its volume's backend is the real one, on a fixture sysfs tree."""

    def __init__(self, tmp: Path, sysfs: Path) -> None:
        self.sysfs = sysfs
        super().__init__(tmp, policy=POLICY)

    def backend(self, info: VolumeInfo) -> Backend:  # type: ignore[override]
        return open_backend(info, host=Host(sysfs=self.sysfs))


def knobs(d: Path) -> tuple[str, str]:
    return (d / "writeback_delay").read_text().strip(), (d / "writeback_percent").read_text().strip()


def run_once(tmp: Path, sysfs: Path) -> SysfsRig:
    r = SysfsRig(tmp, sysfs)
    r.d.start()
    r.tick(1)
    r.tick(2)
    return r


def test_a_clean_stop_puts_back_the_pinned_knob_and_the_drain_sleep(tmp_path: Path) -> None:
    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    r = run_once(tmp_path, tmp_path / "sys")
    assert knobs(d) == ("10", "20")  # the daemon changed both
    r.d.shutdown()
    assert knobs(d) == ("30", "10")  # both as found


def test_the_found_values_survive_a_crash_and_the_next_clean_stop_restores_them(tmp_path: Path) -> None:
    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    r = run_once(tmp_path, tmp_path / "sys")
    r.d._save_state()
    r.d.control.stop()
    r.d.lock.release()  # killed: no restore
    assert knobs(d) == ("10", "20")
    doc, _ = StateFile(tmp_path / "st").read()
    assert doc is not None
    assert doc["volumes"]["bcache0"]["steered"] == {"writeback_delay": ["30", "10"], "writeback_percent": ["10", "20"]}
    r2 = run_once(tmp_path, tmp_path / "sys")  # the restart finds the crashed run's values: not the originals
    assert knobs(d) == ("10", "20")
    r2.d.shutdown()
    assert knobs(d) == ("30", "10")


def test_a_knob_an_operator_changed_meanwhile_is_left_alone(tmp_path: Path) -> None:
    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    r = run_once(tmp_path, tmp_path / "sys")
    (d / "writeback_delay").write_text("7\n")  # the operator's: theirs to keep
    r.d.shutdown()
    assert knobs(d) == ("7", "10")


def test_a_first_start_says_info_a_corrupt_state_file_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 34 item 8: no state file is what every first start has -- not a warning; a corrupt one still is."""
    bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        run_once(tmp_path, tmp_path / "sys").d.shutdown()
    fresh = [r for r in caplog.records if r.getMessage().startswith("starting fresh")]
    assert [r.levelno for r in fresh] == [logging.INFO], fresh
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    caplog.clear()
    (tmp_path / "st" / "state.json").write_text("{not json")
    with caplog.at_level(logging.INFO, logger="cachepilot"):
        run_once(tmp_path, tmp_path / "sys").d.shutdown()
    fresh = [r for r in caplog.records if r.getMessage().startswith("starting fresh")]
    assert [r.levelno for r in fresh] == [logging.WARNING] and "corrupt" in fresh[0].getMessage()


def test_a_run_killed_before_it_pinned_again_keeps_the_found_value_for_the_next(tmp_path: Path) -> None:
    """The lab's crash test: run 1 pins and is killed; run 2 puts the found values back, then is killed before it
    pins again (its state file written meanwhile); run 3 must still know the values found before run 1."""
    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")

    def killed(r: SysfsRig) -> None:
        r.d._save_state()
        r.d.control.stop()
        r.d.lock.release()

    r1 = run_once(tmp_path, tmp_path / "sys")
    killed(r1)
    assert knobs(d) == ("10", "20")
    r2 = SysfsRig(tmp_path, tmp_path / "sys")
    r2.d.start()  # reconciles: the found values back; the pin of writeback_percent waits for a tick
    assert knobs(d)[1] == "10"
    killed(r2)
    (d / "writeback_delay").write_text("10\n")  # as if run 2 had pinned again just before the kill
    (d / "writeback_percent").write_text("20\n")
    r3 = run_once(tmp_path, tmp_path / "sys")
    r3.d.shutdown()
    assert knobs(d) == ("30", "10")


def test_a_run_killed_mid_drain_still_gets_the_found_value_back(tmp_path: Path) -> None:
    """Killed while a drain had writeback_percent at 0 (over the pinned value it saved): the restart undoes the
    drain's writes first and then puts back what the killed run steered -- the value found before it, not the pin
    (the lab's crash test ended at the pinned value: the steered put-back had seen the drain's 0 and skipped)."""
    import time as _time

    from cachepilot.actions import Drain

    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    r1 = run_once(tmp_path, tmp_path / "sys")
    assert knobs(d) == ("10", "20")
    (d / "dirty_data").write_text("4.0M\n")
    (d / "state").write_text("dirty\n")
    r1.d.execute(Drain("bcache0", _time.monotonic_ns() + 60 * 10**9, "age bound"), _time.monotonic_ns())
    assert knobs(d) == ("0", "0")  # the drain's own writes
    r1.d._save_state()
    r1.d.control.stop()
    r1.d.lock.release()  # killed mid-drain
    (d / "dirty_data").write_text("0\n")
    (d / "state").write_text("clean\n")
    r2 = SysfsRig(tmp_path, tmp_path / "sys")
    r2.d.start()  # reconciles
    assert knobs(d)[1] == "10", knobs(d)  # found before run 1, not run 1's pinned 20
    r2.tick(1)
    r2.tick(2)
    r2.d.shutdown()
    assert knobs(d) == ("30", "10")


def test_a_knob_a_killed_operation_left_unrecorded_still_goes_back_to_the_value_found(tmp_path: Path) -> None:
    """Killed after a drain set writeback_percent 0 but before the state file recorded that drain: the restart
    finds 0, pins over it, and at its clean stop puts back the value found before the first run (the state file's),
    not the 0 it found (the lab's crash test ended at 0)."""
    d = bcache_tree(tmp_path / "sys", dirty="0", state="clean")
    r1 = run_once(tmp_path, tmp_path / "sys")
    r1.d._save_state()
    r1.d.control.stop()
    r1.d.lock.release()
    (d / "writeback_percent").write_text("0\n")  # the unrecorded drain's write
    r2 = run_once(tmp_path, tmp_path / "sys")
    assert knobs(d)[1] == "20"  # pinned again
    r2.d.shutdown()
    assert knobs(d) == ("30", "10")
