"""Steering bcache's sequential_cutoff (engine/seqcutoff.py) on a fixture sysfs tree: bypassed runs made of
small-file creates raise it (read back, with the reason), streams lower it back, a pin or steering off puts back
the value found at start, and stopping restores it."""

from __future__ import annotations

import numpy as np
import pytest

from cachepilot.actions import SetKnob
from cachepilot.backends.base import DONE
from cachepilot.engine import Engine
from cachepilot.events import kdev
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import parse_policy
from tests.unit.test_backends import bc  # noqa: F401 (the fixture: a bcache sysfs tree and its backend)

NS = 1_000_000_000
MIB = 1 << 20
DEV = kdev(252, 0)
VOL = VolumeInfo(dev=DEV, name="bcache0", kind="bcache", cache_bytes=1 << 30)
POLICY = "version: 1\ndefaults: {sequential_steering: {window: 10s, max_cutoff: 16MiB}}\n"


def writes(files: list[tuple[int, int]], first_ino: int = 100) -> np.ndarray:
    """Hotness records: (bytes written this tick, file size) per file."""
    rec = np.zeros(len(files), dtype=HOT_DTYPE)
    rec["dev"], rec["ino"], rec["gen"] = DEV, np.arange(first_ino, first_ino + len(files)), 1
    rec["wb"] = [w for w, _ in files]
    rec["size"] = [s for _, s in files]
    rec["ws"] = 1
    return rec


class Lab:
    """The engine and a bcache backend over the fixture tree, sampled as the daemon does."""

    def __init__(self, bc, policy: str = POLICY) -> None:  # noqa: F811
        self.backend, self.dir = bc
        self.backend.info = VOL
        self.engine = Engine(parse_policy(policy, "t.yaml"), [VOL])
        self.bypassed = 1.5 * MIB

    def tick(self, t: float, bypassed_more: float = 0) -> list:
        self.bypassed += bypassed_more
        (self.dir / "stats_total" / "bypassed").write_text(f"{self.bypassed / MIB:.1f}M\n")
        s = self.backend.sample(int(t * NS))
        self.engine.sample(s)
        return [a for a in self.engine.tick(int(t * NS)) if isinstance(a, SetKnob) and a.knob == "sequential_cutoff"]

    def apply(self, a: SetKnob) -> str:
        out = self.backend.apply(a)
        assert out.status == DONE, out
        assert out.writes and out.writes[0].readback == out.writes[0].value  # read back
        return (self.dir / "sequential_cutoff").read_text().strip()


def small_file_creates(n: int = 100, size: int = 64 << 10) -> np.ndarray:
    return writes([(size, size)] * n)


def test_small_file_creates_that_get_bypassed_raise_the_cutoff_and_streams_lower_it_back(bc):  # noqa: F811
    lab = Lab(bc)
    assert lab.tick(0) == []  # the first look opens a window
    lab.engine.feed_hotness_array(small_file_creates())  # 6.25 MiB in 100 files of 64 KiB
    assert lab.tick(5, bypassed_more=6 * MIB) == []  # the window is not over
    (raise_,) = lab.tick(11)
    assert raise_.value == str(8 * MIB) and "small-file creates" in raise_.reason and "100 file(s)" in raise_.reason
    assert "was 4.0M" in raise_.reason
    assert lab.apply(raise_) == str(8 * MIB)
    # a stream: one big file writes 40 MiB; bcache bypasses it as it should
    lab.engine.feed_hotness_array(writes([(40 * MIB, 200 * MIB)], first_ino=900))
    (lower,) = lab.tick(22, bypassed_more=36 * MIB)
    assert lower.value == str(4 * MIB) and "streams" in lower.reason
    assert lab.apply(lower) == str(4 * MIB)
    lab.engine.feed_hotness_array(writes([(40 * MIB, 200 * MIB)], first_ino=900))
    assert lab.tick(33, bypassed_more=36 * MIB) == []  # never below the value found at start


def test_no_raise_without_bypass_or_for_a_few_files_or_past_the_maximum(bc):  # noqa: F811
    lab = Lab(bc)
    lab.tick(0)
    lab.engine.feed_hotness_array(small_file_creates())
    assert lab.tick(11) == []  # nothing bypassed: the small files were cached anyway
    lab.engine.feed_hotness_array(writes([(MIB, MIB)] * 5))  # 5 MiB, but 5 files
    assert lab.tick(22, bypassed_more=6 * MIB) == []
    lab.engine.feed_hotness_array(small_file_creates())
    lab.engine.feed_hotness_array(writes([(4 * MIB, 64 * MIB)] * 2, first_ino=900))  # streams too: 8 MiB of them
    assert lab.tick(33, bypassed_more=6 * MIB) == []
    (lab.dir / "sequential_cutoff").write_text("16.0M\n")  # at max_cutoff already
    lab.tick(40)
    lab.engine.feed_hotness_array(writes([(256 << 10, 256 << 10)] * 100))
    assert lab.tick(51, bypassed_more=30 * MIB) == []


def test_stopping_puts_back_the_value_found_at_start(bc):  # noqa: F811
    lab = Lab(bc)
    assert lab.engine.restore_knobs() == []  # nothing changed: nothing to put back
    lab.tick(0)
    lab.engine.feed_hotness_array(small_file_creates())
    (raise_,) = lab.tick(11, bypassed_more=6 * MIB)
    lab.apply(raise_)
    lab.tick(12)
    (back,) = lab.engine.restore_knobs()
    assert back.knob == "sequential_cutoff" and back.value == str(4 * MIB) and "stopping" in back.reason
    assert lab.apply(back) == str(4 * MIB)


@pytest.mark.parametrize("policy", [
    "version: 1\ndefaults: {sequential_steering: {enabled: false}}\n",
    "version: 1\ndefaults: {knobs: {sequential_cutoff: 2MiB}}\n",
])
def test_steering_off_puts_ours_back_a_pin_wins_and_neither_steers(bc, policy):  # noqa: F811
    lab = Lab(bc)
    lab.tick(0)
    lab.engine.feed_hotness_array(small_file_creates())
    (raise_,) = lab.tick(11, bypassed_more=6 * MIB)
    lab.apply(raise_)
    lab.tick(12)
    lab.engine.set_policy(parse_policy(policy, "t.yaml"))
    acts = lab.tick(13)
    if "enabled: false" in policy:
        assert [(a.value, "steering is off" in a.reason) for a in acts] == [(str(4 * MIB), True)]
    else:  # the pin wins, and stays at stop
        assert [a.value for a in acts] == ["2MiB"]
        assert lab.engine.restore_knobs() == []
    lab.engine.feed_hotness_array(small_file_creates())
    assert all("small-file" not in a.reason for a in lab.tick(30, bypassed_more=6 * MIB))


def test_other_kinds_are_not_steered() -> None:
    e = Engine(parse_policy(POLICY, "t.yaml"), [VolumeInfo(dev=DEV, name="dm-3", kind="dm-cache", cache_bytes=1 << 30)])
    assert DEV not in e.seq.vols


def test_the_policy_section_is_checked() -> None:
    from cachepilot.errors import UserError
    p = parse_policy("version: 1\ndefaults: {sequential_steering: {max_cutoff: 32MiB, window: 1m}}\n", "t.yaml")
    assert p.defaults.sequential_steering.max_cutoff == 32 * MIB and p.defaults.sequential_steering.window_s == 60
    with pytest.raises(UserError):
        parse_policy("version: 1\ndefaults: {sequential_steering: {window: 0s}}\n", "t.yaml")
    with pytest.raises(UserError):
        parse_policy("version: 1\ndefaults: {sequential_steering: {speed: 3}}\n", "t.yaml")


def test_the_daemon_puts_the_steered_cutoff_back_when_it_stops(tmp_path) -> None:
    from tests.unit.daemon_rig import VOL as DVOL
    from tests.unit.daemon_rig import Rig
    rig = Rig(tmp_path)
    rig.d.start()
    rig.tick(1)  # the cutoff found at start: 4 MiB
    b = rig.backends[DVOL.name]
    b.knobs["sequential_cutoff"] = str(8 * MIB)  # as a raise by the steering rule left it
    rig.d.engine.seq.vols[DVOL.dev].moved = True
    rig.tick(2)
    rig.d.shutdown()
    last = [a for a, _ in b.applied if isinstance(a, SetKnob)][-1]
    assert (last.knob, last.value) == ("sequential_cutoff", str(4 * MIB)) and "stopping" in last.reason
    assert b.knobs["sequential_cutoff"] == str(4 * MIB)
