"""The control socket's client under a connect flood and its server under malformed requests (issue 33, case 6).

On main before this change: a connect refused for now (the listener's queue full: EAGAIN; the daemon between unlink
and listen: ECONNREFUSED) failed the CLI at once (3 of 29 `status` runs under a flood); ``{"cmd":"top","n":[]}``
was answered "internal error: TypeError"."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachepilot.daemon.answers import answer
from cachepilot.daemon.control import ControlServer, request
from cachepilot.daemon.reloads import Verdict
from cachepilot.errors import UserError


def _serve_later(listener: socket.socket, delay_s: float, *, listen: bool = False,
                 flood: list[socket.socket] | None = None) -> threading.Thread:
    """After ``delay_s``: (listen and) answer every connection, as a daemon that was slow to get to its accepts
    (the ``flood``'s connections gone by then)."""

    def run() -> None:
        time.sleep(delay_s)
        for c in flood or []:
            c.close()
        if listen:
            listener.listen(8)
        listener.settimeout(3)
        try:
            while True:
                c, _ = listener.accept()
                with c:
                    if c.recv(4096):
                        c.sendall(b'{"ok": 1}\n')
        except OSError:
            return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _fill_backlog(path: Path) -> list[socket.socket]:
    """Connects nobody accepts until the kernel refuses the next one with EAGAIN (the flood's effect)."""
    held = []
    for _ in range(64):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            return held
        held.append(c)
    raise AssertionError("the listener's queue never filled")


def test_a_full_listen_queue_is_tried_again_within_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "s"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    held = _fill_backlog(path)
    t0 = time.monotonic()
    _serve_later(listener, 0.3, flood=held)
    try:
        assert request(path, {"cmd": "reload"}, timeout=3) == {"ok": 1}  # even one that acts: nothing was sent
        assert 0.25 < time.monotonic() - t0 < 2.5
    finally:
        for c in held:
            c.close()
        listener.close()


def test_a_socket_not_listening_yet_is_tried_again(tmp_path: Path) -> None:
    path = tmp_path / "s"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))  # bound, not listening: ECONNREFUSED, as a daemon between bind and listen
    _serve_later(listener, 0.3, listen=True)
    try:
        assert request(path, {"cmd": "status"}, timeout=3) == {"ok": 1}
    finally:
        listener.close()


def test_refused_past_the_deadline_is_one_line_in_time(tmp_path: Path) -> None:
    path = tmp_path / "s"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"cannot reach the daemon at .*: Connection refused \(still after 0.5 s\)"):
        request(path, {"cmd": "status"}, timeout=0.5)
    assert 0.3 < time.monotonic() - t0 < 1.0
    listener.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    """The real control server with the daemon's real answers (no snapshot yet: as just started)."""
    path = tmp_path / "ctl.sock"

    def handler(req: dict[str, Any]) -> dict[str, Any]:
        return answer(None, req, [], lambda: Verdict(True, "ok"))

    s = ControlServer(path, handler)
    s.start()
    yield path
    s.stop()


def _raw(path: Path, line: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(3)
        c.connect(str(path))
        c.sendall(line + b"\n")
        reply: dict[str, Any] = json.loads(c.makefile("rb").readline())
        return reply


@pytest.mark.parametrize(("req", "words"), [
    ({"cmd": "top", "n": []}, "n: an integer"),
    ({"cmd": "top", "n": "5"}, "n: an integer"),
    ({"cmd": "top", "n": 1e300}, "n: an integer"),
    ({"cmd": "top", "n": -1}, "n: an integer in [0,"),
    ({"cmd": "top", "volume": []}, "unknown volume"),
    ({"cmd": "explain", "since": {}}, "since: a number"),
    ({"cmd": "explain", "since": "NaN"}, "since: a number"),
    ({"cmd": "explain", "limit": [1]}, "limit: an integer"),
    ({"cmd": "explain", "volume": {"a": 1}}, "volume: a name"),
])
def test_malformed_requests_get_one_line_not_an_internal_error(server: Path, req: dict[str, Any],
                                                              words: str) -> None:
    err = _raw(server, json.dumps(req).encode())["error"]
    assert err.startswith("bad request: ") and words in err and "\n" not in err and len(err) < 200, err
    assert _raw(server, b'{"cmd": "top", "n": 3}') == {"volumes": []}  # and the server still answers


def test_nan_from_a_raw_request_is_refused(server: Path) -> None:
    err = _raw(server, b'{"cmd": "explain", "since": NaN}')["error"]
    assert "since: a number" in err, err


# ------------------------------------------------------------------ a reload waited for does not stop status
def test_status_is_answered_while_a_reload_waits_for_the_loop(tmp_path: Path) -> None:
    """The loop takes its time over a reload (a large policy parsed, pins walked): the server's thread used to wait
    with it, and `status` waited behind (up to 30 s); now the reload's answer is worked out on a thread of its own."""
    path = tmp_path / "ctl.sock"
    applied = threading.Event()

    def slow_reload() -> Verdict:
        applied.wait(3.0)
        return Verdict(True, "reloaded")

    s = ControlServer(path, lambda req: answer(None, req, [], slow_reload))
    s.start()
    try:
        out: list[dict[str, Any]] = []
        t = threading.Thread(target=lambda: out.append(request(path, {"cmd": "reload"}, timeout=5)))
        t.start()
        time.sleep(0.2)  # the reload is waiting
        took = []
        for _ in range(5):
            t0 = time.monotonic()
            assert request(path, {"cmd": "status"}, timeout=2) == {}
            took.append(time.monotonic() - t0)
        assert max(took) < 0.5, took
        assert t.is_alive()  # still waiting: the answers above did not wait for it
        applied.set()
        t.join(3)
        assert out == [{"reloaded": True, "message": "reloaded"}]
    finally:
        s.stop()


def test_a_fifth_reload_waited_for_at_once_is_told_busy(tmp_path: Path) -> None:
    """At most MAX_LATER answers are worked out on threads at once: a flood of reloads cannot make threads."""
    from cachepilot.boundedserver import MAX_LATER

    path = tmp_path / "ctl.sock"
    release = threading.Event()

    def held() -> Verdict:
        release.wait(5.0)
        return Verdict(True, "reloaded")

    s = ControlServer(path, lambda req: answer(None, req, [], held))
    s.start()
    try:
        waiting = [threading.Thread(target=request, args=(path, {"cmd": "reload"}, 6)) for _ in range(MAX_LATER)]
        for t in waiting:
            t.start()
        time.sleep(0.3)
        before = threading.active_count()
        with pytest.raises(UserError, match="busy: other reloads are being waited for"):
            request(path, {"cmd": "reload"}, timeout=2)
        assert threading.active_count() == before
        release.set()
        for t in waiting:
            t.join(3)
    finally:
        release.set()
        s.stop()
