"""The control socket (daemon/control.py) and its answers (daemon/answers.py): private, fast, from the published
snapshot, bounded under descriptor exhaustion; explain and clear-latch; the decision log merged only when read."""

from __future__ import annotations

import os
import resource
import socket
import stat
import time
from pathlib import Path

import pytest

from cachepilot.daemon.control import ControlServer, request
from cachepilot.errors import FatalError, UserError
from tests.unit.daemon_rig import (
    Rig,
)


def test_control_socket_is_0600_and_answers(tmp_path: Path) -> None:
    path = tmp_path / "run" / "ctl.sock"
    srv = ControlServer(path, lambda req: {"echo": req["cmd"]} if req["cmd"] == "hi" else (_ for _ in ()).throw(
        UserError("unknown command")))
    srv.start()
    try:
        assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert request(path, {"cmd": "hi"}) == {"echo": "hi"}
        with pytest.raises(UserError, match="daemon: bad request: unknown command"):
            request(path, {"cmd": "nope"})
        # brackets inside a string are not nesting (the depth check scans past strings, escaped quotes included)
        with pytest.raises(UserError, match="daemon: bad request: unknown command"):
            request(path, {"cmd": '\\"' + "[{" * 100})
        deep: list[object] = []
        for _ in range(31):  # the object and 32 lists: 33 deep
            deep = [deep]
        with pytest.raises(UserError, match="daemon: bad request: nested deeper than 32"):
            request(path, {"cmd": "hi", "x": deep})
        assert request(path, {"cmd": "hi", "x": deep[0]}) == {"echo": "hi"}  # 32 deep: parsed
        with pytest.raises(FatalError, match="in use by another process"):
            ControlServer(path, lambda r: {}).start()
    finally:
        srv.stop()
    assert not path.exists()
    with pytest.raises(UserError, match="no daemon"):
        request(path, {"cmd": "hi"})


def _thread_cpu_s(stat_fd: int) -> float:
    """CPU seconds (user + system) of one thread, from its /proc stat file opened beforehand (out of fds, no open
    can succeed)."""
    fields = os.pread(stat_fd, 4096, 0).decode().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_control_socket_outlives_running_out_of_file_descriptors(tmp_path: Path) -> None:
    """Out of fds, accept fails (EMFILE): the server neither dies nor spins; it answers once fds are free again."""
    path = tmp_path / "ctl.sock"
    srv = ControlServer(path, lambda req: {"echo": req["cmd"]})
    srv.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    assert srv.server is not None
    stat_fd = os.open(f"/proc/self/task/{srv.server._thread.native_id}/stat", os.O_RDONLY)
    try:
        # the client ends made first: out of fds, it is the server's accept that must fail, not the test's socket()
        held = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(12)]
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
        for s in held:  # 12 connections against the 6 fds left for the server's accepts
            s.connect(str(path))
        time.sleep(0.3)
        cpu = _thread_cpu_s(stat_fd)
        time.sleep(0.5)
        # no busy loop on a listener it cannot accept from (the server's own thread: other tests' threads may run)
        assert _thread_cpu_s(stat_fd) - cpu < 0.1
        assert srv.server.closed["accept failed (Too many open files)"] >= 1
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(stat_fd)
    assert request(path, {"cmd": "hi"}) == {"echo": "hi"}
    srv.stop()


def test_status_is_served_from_the_snapshot_fast(rig: Rig) -> None:
    rig.d.start()
    rig.tick(1)
    path = rig.socket
    t0 = time.monotonic()
    for _ in range(50):
        s = request(path, {"cmd": "status"})
    assert (time.monotonic() - t0) / 50 < 0.2  # the goal: <= 200 ms per answer
    assert s["volumes"][0]["name"] == "bcache0" and "decisions" not in s
    with pytest.raises(UserError, match=r"unknown volume 'nope' \(known: bcache0\)"):  # as top says it
        request(path, {"cmd": "explain", "volume": "nope"})
    with pytest.raises(UserError, match="unknown volume 'nope'"):
        request(path, {"cmd": "top", "volume": "nope"})


def test_explain_keeps_a_vanished_volumes_decisions_and_clear_latch_says_if_one_was_set(rig: Rig) -> None:
    rig.d.start()
    rig.backends["bcache0"].dirty = 8 << 20  # a decision for bcache0
    rig.tick(1)
    assert rig.d.answer({"cmd": "clear_latch", "volume": "bcache0"}) == {"queued": "bcache0", "latched": False}
    rig.found = []
    rig.tick(3)  # rescanned: bcache0 is gone, its decisions stay and explain still answers for it
    assert not rig.status()["volumes"]
    assert rig.d.answer({"cmd": "explain", "volume": "bcache0"})["decisions"]


def test_publishing_does_not_merge_the_decision_log(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot published every tick keeps the decision log as two copies; they are merged into order only when
    explain (or a JSON dump) reads them: a full log (2 x 1 000 entries) merged every tick cost the publish stage
    milliseconds a tick under TCG (issue 23 item 5)."""
    import heapq

    from cachepilot.daemon import decisionlog

    rig.d.start()
    for i in range(300):  # a discard storm, and one control decision among them
        rig.d.decisions.append({"ts": float(i), "volume": "bcache0", "kind": "discard" if i != 150 else "drain"})
    merges = []
    real = heapq.merge
    monkeypatch.setattr(decisionlog.heapq, "merge", lambda *a, **k: (merges.append(1), real(*a, **k))[1])
    for t in range(1, 4):
        rig.tick(t)
    assert merges == []  # one a tick before
    got = rig.d.answer({"cmd": "explain", "volume": "bcache0", "since": 100})["decisions"]
    assert [d["ts"] for d in got[:60]] == [float(i) for i in range(100, 160)] and got[50]["kind"] == "drain"
    assert len(merges) == 1
