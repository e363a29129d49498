"""The control socket: a unix stream socket, root only (0600, peers checked by SO_PEERCRED), that answers
`status`, `top` and `explain` from the daemon's last snapshot.

One request per connection: a JSON object on one line (``{"cmd": "status"}``); one JSON answer, then the server
closes. Answers are built from a snapshot the loop publishes every tick (a reference swap), never by computing, so
they come back in milliseconds however busy the loop is. The transport is a
:class:`~cachepilot.boundedserver.BoundedServer` (one thread, a connection cap, the whole request within
``CLIENT_TIMEOUT_S``); what a request means is the daemon's handler.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.boundedserver import BoundedServer, Dialogue, Later
from cachepilot.errors import FatalError, UserError

DEFAULT_SOCKET = "/run/cachepilot/control.sock"
MAX_REQUEST = 4096
MAX_DEPTH = 32  # requests are flat objects; json's parser recurses, so depth is refused before it parses
CLIENT_TIMEOUT_S = 1.0  # for the whole request, however it trickles in
REPLY_TIMEOUT_S = 5.0
MAX_CLIENTS = 64
WAITING = frozenset({"reload"})  # answered once the daemon's loop has acted: worked out off the server's thread

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def _line(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode() + b"\n"


def nesting_depth(text: bytes) -> int:
    """The deepest bracket nesting of a JSON text, strings skipped (one pass, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class _Requests(Dialogue):
    def __init__(self, server: ControlServer) -> None:
        self.server = server

    def admit(self, conn: socket.socket) -> bytes | None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid in (0, os.geteuid()):
            return None
        self.server.refused += 1
        return _line({"error": "permission denied: root only"})

    def reply(self, data: bytes, eof: bool) -> bytes | Later | None:
        line, newline, _ = data.partition(b"\n")
        if not (newline or eof):
            return None
        if not line.strip():
            return b""  # a connect-and-close (e.g. a liveness check)
        if nesting_depth(line) > MAX_DEPTH:
            return _line({"error": f"bad request: nested deeper than {MAX_DEPTH}"})
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            return _line({"error": f"bad request: {exc}"})
        if isinstance(req.get("cmd"), str) and req["cmd"] in WAITING:  # off the server's thread: status answers
            return Later(lambda: _line(self._answer(req)))
        return _line(self._answer(req))

    def busy(self) -> bytes:
        return _line({"error": "busy: other reloads are being waited for; try again"})

    def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.server.handler(req)
        except (ValueError, UserError) as exc:
            return {"error": f"bad request: {exc}"}
        except Exception as exc:  # noqa: BLE001 - a bug in one answer is that answer's error, not the socket's
            self.server.errors += 1
            self.server.last_error = f"{type(exc).__name__}: {exc}"
            return {"error": f"internal error: {self.server.last_error}"}

    def too_big(self) -> bytes:
        return _line({"error": f"bad request: longer than {MAX_REQUEST} bytes"})

    def too_slow(self) -> bytes:
        return _line({"error": f"bad request: not complete within {CLIENT_TIMEOUT_S:g} s"})


class ControlServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.refused = 0
        self.errors = 0
        self.last_error: str | None = None
        self.server: BoundedServer | None = None

    def start(self) -> None:
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            if self.path.is_socket():
                self._check_not_live()
                self.path.unlink()
            elif self.path.exists():
                raise FatalError(f"control socket path {self.path} exists and is not a socket")
        except OSError as exc:
            raise FatalError(f"control socket {self.path}: {exc.strerror}") from None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # created 0600: no window in which others could connect
        try:
            s.bind(str(self.path))
        except OSError as exc:
            s.close()
            raise FatalError(f"cannot create control socket {self.path}: {exc.strerror}") from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.server = BoundedServer(s, _Requests(self), name="cachepilot-control", max_conns=MAX_CLIENTS,
                                    request_deadline_s=CLIENT_TIMEOUT_S, reply_deadline_s=REPLY_TIMEOUT_S,
                                    max_request=MAX_REQUEST)
        self.server.start()

    def _check_not_live(self) -> None:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(0.5)
            probe.connect(str(self.path))
        except OSError:
            return  # stale socket of a dead daemon
        finally:
            probe.close()
        raise FatalError(f"control socket {self.path} is in use by another process")

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
            try:
                self.path.unlink()
            except OSError:
                pass


READ_ONLY = frozenset({"status", "top", "explain", "advise"})  # asking twice changes nothing
RETRY_PAUSE_S = 0.01
MAX_BACKOFF_S = 0.2
# A connect refused for now: the listener's queue is full under a connect flood (EAGAIN on a unix socket) or the
# daemon is between its unlink and listen (ECONNREFUSED). Nothing was sent, so any command may try again.
NOT_YET = frozenset({errno.EAGAIN, errno.ECONNREFUSED})


class _NotConnected(Exception):
    def __init__(self, err: OSError) -> None:
        super().__init__(err.strerror)
        self.err = err


def request(path: Path, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Ask the daemon; UserError naming the problem if it does not answer. A connect refused for now (``NOT_YET``)
    is tried again with a short backoff until ``timeout``, whatever the command (nothing was sent). The server closes
    a connection unanswered only before it has the whole request (over its connection cap, or too slow), so a
    read-only question whose connection was closed without a byte of answer is asked again until ``timeout``; any
    other is reported."""
    deadline = time.monotonic() + timeout
    pause = RETRY_PAUSE_S
    while True:
        try:
            data = _exchange(path, req, max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise UserError(f"the daemon at {path} did not answer within {timeout:g} s") from None
        except _NotConnected as exc:
            if time.monotonic() + pause >= deadline:
                raise UserError(f"cannot reach the daemon at {path}: {exc.err.strerror} (still after "
                                f"{timeout:g} s)") from None
            time.sleep(pause)
            pause = min(pause * 2, MAX_BACKOFF_S)
            continue
        except ConnectionError as exc:
            if req.get("cmd") not in READ_ONLY or time.monotonic() + RETRY_PAUSE_S >= deadline:
                raise UserError(f"the daemon at {path} closed the connection without answering ({exc.strerror})"
                                ) from None
            time.sleep(RETRY_PAUSE_S)
            continue
        break
    try:
        answer = json.loads(data)
    except ValueError:
        raise UserError(f"the daemon at {path} sent an unreadable answer") from None
    if not isinstance(answer, dict):
        raise UserError(f"the daemon at {path} sent an unreadable answer (not an object)")
    if "error" in answer:
        raise UserError(f"daemon: {answer['error']}")
    return answer


def _exchange(path: Path, req: dict[str, Any], timeout: float) -> bytes:
    """One connection: the request sent, the whole answer read (ConnectionError if closed before its first byte,
    TimeoutError past ``timeout``)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    chunks: list[bytes] = []
    try:
        try:
            s.connect(str(path))
        except FileNotFoundError:
            raise UserError(f"no daemon: {path} does not exist (is `cachepilot run` running?)") from None
        except PermissionError:
            raise UserError(f"{path}: permission denied (the control socket is root only)") from None
        except OSError as exc:
            if exc.errno in NOT_YET:
                raise _NotConnected(exc) from None
            raise UserError(f"cannot reach the daemon at {path}: {exc.strerror or exc}") from None  # too long: no errno
        s.sendall(json.dumps(req).encode() + b"\n")
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
    except ConnectionError as exc:
        if chunks:  # part of an answer: the request was taken, asking again could act twice
            raise UserError(f"the daemon at {path} broke off its answer ({exc.strerror})") from None
        raise
    finally:
        s.close()
    if not chunks:
        raise ConnectionResetError(errno.ECONNRESET, "closed without an answer")
    return b"".join(chunks)
