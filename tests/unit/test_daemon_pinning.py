"""Pinned files (daemon/pinning.py): resolved at adoption and reload off the loop thread, shown by status."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachepilot.actions import Promote
from cachepilot.daemon.volumes import Found
from tests.unit.daemon_rig import (
    DEV,
    POLICY_DESTRUCTIVE,
    VOL,
    Rig,
)


def ticks_until(r: Rig, t: float, done: Callable[[], bool]) -> float:
    """Tick from ``t`` (a tick a second of its clock, 20 ms apart in wall time) until ``done``; the tick it took
    (AssertionError after 10 s)."""
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        r.tick(t)
        if done():
            return t
        t += 1
        time.sleep(0.02)
    raise AssertionError("not done within 10 s of ticks")


def pinned(r: Rig) -> int:
    return int((r.status()["volumes"][0]["pins"] or {}).get("files", 0))


def test_pins_are_resolved_at_adoption_and_reload_and_shown_by_status(tmp_path: Path) -> None:
    """Issue 25: the daemon walks the volume's mount for its pin patterns when it adopts it and at every reload; the
    pinned files are promoted through the actuators first and status shows them with their residency."""
    import dataclasses

    mnt = tmp_path / "mnt"
    (mnt / "db").mkdir(parents=True)
    (mnt / "db" / "a").write_bytes(b"a" * 5000)
    pol = POLICY_DESTRUCTIVE + "  pin: {paths: [db], max_bytes: 1MiB}\n"
    r = Rig(tmp_path, policy=pol)
    r.found = [Found(dataclasses.replace(VOL, mountpoint=str(mnt)))]
    try:
        r.d.start()
        t = ticks_until(r, 1, lambda: not r.d.adopter.pins.busy())  # the walk runs off the loop (issue 33)
        r.tick(t + 1)  # handed over: promoted at the next tick
        v = r.status()["volumes"][0]
        assert v["pins"]["files"] == 1 and v["pins"]["list"][0]["path"] == "db/a"
        assert v["pins"]["resident_files"] == 1
        files = r.d.vols[DEV].files
        assert any(isinstance(a, Promote) and "pinned by policy" in a.reason for a, _ in files.ran)
        (mnt / "db" / "b").write_bytes(b"b" * 100)
        r.d.request_reload()
        ticks_until(r, t + 2, lambda: pinned(r) == 2)
    finally:
        r.d.shutdown()


def test_a_slow_pin_walk_does_not_stall_the_tick_of_a_reload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the pin walk ran on the loop thread, so a reload's tick lasted as long as the walk (6-9 s on the
    lab's large tree, longer than the watchdog allows on a slower disk). The filesystem is made slow here (each
    walk waits 1.5 s before the real walk): the reload's tick must stay short, the pins arrive a few ticks later."""
    import dataclasses

    from cachepilot.daemon import pinning

    real_walk = pinning.walk

    def slow_walk(*args: Any, **kw: Any) -> Any:
        time.sleep(1.5)
        return real_walk(*args, **kw)

    monkeypatch.setattr(pinning, "walk", slow_walk)
    mnt = tmp_path / "mnt"
    (mnt / "db").mkdir(parents=True)
    (mnt / "db" / "a").write_bytes(b"a" * 5000)
    r = Rig(tmp_path, policy=POLICY_DESTRUCTIVE + "  pin: {paths: [db], max_bytes: 1MiB}\n")
    r.found = [Found(dataclasses.replace(VOL, mountpoint=str(mnt)))]
    try:
        r.d.start()
        t = ticks_until(r, 1, lambda: pinned(r) == 1)
        (mnt / "db" / "b").write_bytes(b"b" * 100)
        r.d.request_reload()
        took = []
        for i in range(1, 4):
            t0 = time.monotonic()
            r.tick(t + i)
            took.append(time.monotonic() - t0)
        assert max(took) < 0.5, took
        ticks_until(r, t + 4, lambda: pinned(r) == 2)
    finally:
        r.d.shutdown()
