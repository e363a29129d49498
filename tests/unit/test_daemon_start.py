"""Start and stop (daemon/daemon.py): reconcile and the drain sleep before the probe's slow load, a probe that
cannot load, the SIGTERM path; sd_notify (daemon/notify.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from cachepilot.actions import Drain, SetKnob
from cachepilot.daemon.lock import DaemonLock
from cachepilot.daemon.state import StateFile
from cachepilot.errors import FatalError, UserError
from tests.unit.daemon_rig import (
    DEV,
    VOL,
    FakeBackend,
    FakeProbe,
    Rig,
)


def test_reconcile_puts_back_before_the_probe_loads_then_watches(tmp_path: Path) -> None:
    """A slow probe load (seconds under the verifier on a slow host) must not delay putting back what a killed
    daemon left behind; the volumes adopted meanwhile are watched once the probe is there."""
    b = FakeBackend(VOL)
    b.knobs["writeback_percent"] = "0"  # a drain was in flight when the last daemon was killed
    (tmp_path / "st").mkdir(mode=0o700)
    assert StateFile(tmp_path / "st").write({"volumes": {"bcache0": {"name": "bcache0", "fs_uuid": "u-1", "in_flight": [
        {"action": "drain", "kind": "drain", "writes": [{"target": "bcache0 writeback_percent", "before": "10",
                                                         "value": "0"}]}]}}})
    seen: dict[str, object] = {}
    r = Rig(tmp_path)
    r.backends["bcache0"] = b
    r.d.probe_factory = lambda n: FakeProbe(seen, b)
    r.d.start()
    assert seen["knob_at_load"] == "10"  # put back before the probe loaded
    assert seen["probe"].watched == [DEV] and r.d.ready  # type: ignore[attr-defined]
    assert r.d.capture == "bcc"  # the probe's capture path, for cachepilot_capture_info
    r.d.shutdown()


def test_the_drain_sleep_is_held_before_the_probe_loads_and_the_daemon_is_ready(tmp_path: Path) -> None:
    """bcache's write-back thread reads writeback_delay when a scan ends and sleeps that long, whatever is written
    later. Held only at the first tick (a second or more after ready), a workload started at ready made it sleep the
    stock 30 s and the first drain waited for that (W1 round 1: oldest dirty data 36.7 s, bound 30 s). One sample
    and the hold come before the probe's slow load, so ready means the short sleep is in place."""
    b = FakeBackend(VOL)
    b.knobs["writeback_delay"] = "30"
    seen: dict[str, object] = {}

    class Probe(FakeProbe):
        def __init__(self) -> None:
            seen["delay_at_load"] = b.knobs["writeback_delay"]
            super().__init__(seen, b)

    r = Rig(tmp_path)
    r.backends["bcache0"] = b
    r.d.probe_factory = lambda n: Probe()
    r.d.start()
    assert seen["delay_at_load"] == "10" and b.knobs["writeback_delay"] == "10"  # max_age 60 s: a third of 30 s
    d = [x for x in r.d.decisions if x["kind"] == "set_knob"]
    assert len(d) == 1 and "exposure guarantee" in d[0]["reason"] and d[0]["status"] == "done"
    assert r.ctl().drain_sleep_until_ns > 0  # drains planned before the old sleep ended allow for it
    r.tick(1)
    assert len([a for a, _ in b.applied if isinstance(a, SetKnob) and a.knob == "writeback_delay"]) == 1  # held
    r.d.shutdown()


def test_a_probe_that_cannot_load_after_reconcile_puts_back_and_releases(tmp_path: Path) -> None:
    r = Rig(tmp_path)

    def broken(n: int) -> object:
        raise UserError("no BTF")

    r.d.probe_factory = broken
    with pytest.raises(FatalError, match="probe is unusable: no BTF"):
        r.d.start()
    r.d.abandon()
    assert r.backends["bcache0"].restored == 1
    DaemonLock(tmp_path / "st").acquire()  # released: a next start can take it


def test_sigterm_path_restores_every_backend(rig: Rig) -> None:
    rig.d.start()
    b = rig.backends["bcache0"]
    rig.d.execute(Drain("bcache0", 0, "test"), rig.d.started_ns)
    rig.d.request_stop()
    rig.d.run()  # returns at once: stop requested
    rig.d.shutdown()
    assert b.restored == 1 and b.knobs["writeback_percent"] == "10"
    assert (rig.tmp / "st" / "state.json").exists() and not (rig.tmp / "ctl.sock").exists()


def test_notify_never_blocks_on_a_receiver_that_does_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    from cachepilot.daemon.notify import Notifier

    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(tmp_path / "n.sock"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
    n = Notifier()
    n.ready("up")
    t0 = time.monotonic()
    for _ in range(200):  # far more than the receiver's queue holds
        n.watchdog()
    assert time.monotonic() - t0 < 2.0 and n.dropped > 0
    assert rx.recv(4096).decode().startswith("READY=1\nSTATUS=up\nMAINPID=")
    rx.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert Notifier()._sock is None
