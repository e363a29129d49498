"""`cachepilot drain` through the daemon (issue 36): the control socket checks the request and queues it, the loop
starts the operator's drain with the policy held off, status shows its progress, the CLI follows it to its end."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import pytest

from cachepilot.actions import DONE, Drain, Outcome, SetWritePolicy
from cachepilot.errors import UserError
from tests.unit.daemon_rig import Rig

NS = 1_000_000_000


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = Rig(tmp_path)
    yield r
    r.d.shutdown()


def test_a_drain_request_is_checked_queued_started_and_shown(rig: Rig) -> None:
    rig.d.start()
    b = rig.backends["bcache0"]
    b.dirty = 512 << 10
    rig.tick(1)
    with pytest.raises(UserError, match="unknown volume 'nope'"):
        rig.d.answer({"cmd": "drain", "volume": "nope"})
    with pytest.raises(UserError, match="end: policy or writethrough"):
        rig.d.answer({"cmd": "drain", "volume": "bcache0", "end": "bypass"})
    with pytest.raises(UserError, match="deadline"):
        rig.d.answer({"cmd": "drain", "volume": "bcache0", "deadline": "soon"})
    answer = rig.d.answer({"cmd": "drain", "volume": "bcache0", "deadline": 120})
    assert answer == {"queued": "bcache0", "dirty_bytes": 512 << 10, "request": answer["request"]}
    b.drains.clear()
    b.mode = "writeback"
    b.dirty = 8 << 20  # over the policy's 1 MiB bound: the policy would switch to write-through
    before = len(b.applied)
    rig.tick(2)
    ours = [a for a in b.drains if a.reason.startswith("operator drain")]
    assert len(ours) == 1 and not [a for a, _ in b.applied[before:] if isinstance(a, SetWritePolicy)]
    op = rig.d.answer({"cmd": "status"})["volumes"][0]["operator_drain"]
    assert op["state"] == "running" and op["dirty_bytes"] == 8 << 20
    with pytest.raises(UserError, match="already running"):
        rig.d.answer({"cmd": "drain", "volume": "bcache0"})
    rig.d.engine.outcome(Outcome(ours[0], DONE, detail="clean"))
    b.dirty = 0
    rig.tick(3)
    op = rig.d.answer({"cmd": "status"})["volumes"][0]["operator_drain"]
    assert op["state"] == "done" and op["dirty_bytes"] == 0


def test_the_cli_follows_the_drain_to_its_end_and_exits_1_on_the_deadline(rig: Rig, capsys) -> None:  # type: ignore[no-untyped-def]
    from cachepilot.commands import drain as cmd

    rig.d.start()
    b = rig.backends["bcache0"]
    b.dirty = 4 << 20
    rig.tick(1)
    stop = threading.Event()

    def loop() -> None:  # the daemon's loop, by hand: a tick every 0.2 s of "daemon time" 1 s
        t = 2.0
        while not stop.is_set():
            rig.tick(t)
            t += 1.0
            time.sleep(0.2)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    try:
        args = argparse.Namespace(socket=str(rig.d.config.socket), config=None, volume="bcache0", deadline="3s",
                                  end="policy", release=False, no_wait=False, rate=None)
        rc = cmd.drain(args)
    finally:
        stop.set()
        runner.join()
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "drain queued (4.0 MiB dirty)" in out and "drain expired" in out and "4.0 MiB still dirty" in out
    assert any(isinstance(a, Drain) and a.reason.startswith("operator drain") for a in b.drains)


def test_an_operator_drain_shows_in_the_metrics_while_it_runs(tmp_path: Path) -> None:
    r = Rig(tmp_path, metrics=f"{{listen: '', textfile: {tmp_path}/m.prom}}")
    try:
        r.d.start()
        b = r.backends["bcache0"]
        b.dirty = 6 << 20
        r.tick(1)
        r.d.answer({"cmd": "drain", "volume": "bcache0", "deadline": 600})
        r.tick(2)
        r.tick(3)
        text = (tmp_path / "m.prom").read_text()
        assert 'cachepilot_volume_operator_drain_remaining_bytes{device="bcache0",volume="bcache0"} 6.291456e+06' \
            in text, text[-2000:]
        assert "cachepilot_volume_operator_drain_rate_bytes{" in text
    finally:
        r.d.shutdown()


def test_a_rate_the_kind_cannot_steer_is_refused_at_the_socket_with_why(rig: Rig) -> None:
    from cachepilot.daemon.answers import _drain

    vol = argparse.Namespace(observe_only=False, operator_drain=None, kind="dm-writecache", dirty_bytes=0)
    with pytest.raises(UserError, match="writeback_jobs caps the write-backs in flight, not a rate"):
        _drain({"dm-4": vol}, {"cmd": "drain", "volume": "dm-4", "rate": 1 << 20}, [])
    queue: list = []  # type: ignore[type-arg]
    _drain({"dm-4": vol}, {"cmd": "drain", "volume": "dm-4"}, queue)
    assert queue == [{"volume": "dm-4", "deadline": 600, "end": "policy", "rate": 0, "request": queue[0]["request"]}]
    rig.d.start()
    rig.tick(1)
    assert rig.d.answer({"cmd": "drain", "volume": "bcache0", "rate": 4 << 20})["queued"] == "bcache0"
    assert rig.d.drain_requests[-1]["rate"] == 4 << 20


def test_the_cli_follows_its_own_request_not_the_end_of_an_earlier_one(rig: Rig, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Until the daemon's next tick takes a request up, status still shows the previous request's end: the lab's
    drain asked for right after one that expired printed that one's "drain expired" and exited 1 at once."""
    from cachepilot.commands import drain as cmd
    from cachepilot.daemon import control

    rig.d.start()
    rig.backends["bcache0"].dirty = 4 << 20
    rig.tick(1)
    first = rig.d.answer({"cmd": "drain", "volume": "bcache0", "deadline": 1})
    rig.tick(2)
    rig.tick(4)  # past its deadline

    def shown() -> dict:  # type: ignore[type-arg]
        return dict(rig.d.answer({"cmd": "status"})["volumes"][0]["operator_drain"])

    assert shown()["state"] == "expired" and shown()["request"] == first["request"]
    second = rig.d.answer({"cmd": "drain", "volume": "bcache0", "deadline": 60})
    assert second["request"] > first["request"] and shown()["request"] == first["request"]  # until the next tick
    rig.tick(5)
    assert shown()["state"] == "running" and shown()["request"] == second["request"]

    old = {"state": "expired", "detail": "deadline passed with 4194304 dirty bytes left", "dirty_bytes": 4 << 20,
           "elapsed_s": 7.0, "request": 1}
    running = {**old, "state": "running", "detail": "", "request": 2, "elapsed_s": 1.0, "start_dirty_bytes": 4 << 20,
               "rate_bytes_s": 0, "deadline_in_s": 59}
    done = {**running, "state": "done", "detail": "drained and verified clean", "dirty_bytes": 0}
    polls = iter([old, old, running, done])

    def request(sock: Path, req: dict) -> dict:  # type: ignore[type-arg]
        if req["cmd"] == "drain":
            return {"queued": "bcache0", "dirty_bytes": 4 << 20, "request": 2}
        return {"volumes": [{"name": "bcache0", "operator_drain": next(polls)}]}

    monkeypatch.setattr(control, "request", request)
    monkeypatch.setattr(cmd, "POLL_S", 0.0)
    args = argparse.Namespace(socket=str(rig.d.config.socket), config=None, volume="bcache0", deadline="60s",
                              end="policy", release=False, no_wait=False, rate=None)
    rc = cmd.drain(args)
    out = capsys.readouterr().out
    assert rc == 0 and "drain done" in out and "expired" not in out, out
