"""The control socket: a unix stream socket, root only (0600, peers checked by SO_PEERCRED), that answers
`status`, `top` and `explain` from the daemon's last snapshot.

One request per connection: a JSON object on one line (``{"cmd": "status"}``); one JSON answer, then the server
closes. Answers are built from a snapshot the loop publishes every tick (a reference swap), never by computing, so
they come back in milliseconds however busy the loop is. Clients get a short time-out to send their request.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.errors import FatalError, UserError

DEFAULT_SOCKET = "/run/cachepilot/control.sock"
MAX_REQUEST = 4096
CLIENT_TIMEOUT_S = 1.0

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.served = 0
        self.refused = 0
        self.errors = 0
        self.last_error: str | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
        s.listen(16)
        s.settimeout(0.2)
        self._sock = s
        self._thread = threading.Thread(target=self._serve, name="cachepilot-control", daemon=True)
        self._thread.start()

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
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            try:
                self.path.unlink()
            except OSError:
                pass

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            with conn:
                try:
                    self._one(conn)
                except OSError:
                    pass  # the client went away; nothing to answer
                except Exception as exc:  # noqa: BLE001 - a bug in one answer must not close the socket for good
                    self.errors += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    try:
                        conn.sendall(json.dumps({"error": f"internal error: {self.last_error}"}).encode() + b"\n")
                    except OSError:
                        pass

    def _one(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid not in (0, os.geteuid()):
            self.refused += 1
            conn.sendall(json.dumps({"error": "permission denied: root only"}).encode() + b"\n")
            return
        conn.settimeout(CLIENT_TIMEOUT_S)
        buf = b""
        while b"\n" not in buf and len(buf) < MAX_REQUEST:
            chunk = conn.recv(MAX_REQUEST)
            if not chunk:
                break
            buf += chunk
        if not buf.strip():
            return  # a connect-and-close (e.g. a liveness check)
        try:
            req = json.loads(buf.split(b"\n", 1)[0])
            if not isinstance(req, dict):
                raise ValueError("not an object")
            answer = self.handler(req)
        except (ValueError, UserError) as exc:
            answer = {"error": f"bad request: {exc}"}
        self.served += 1
        conn.sendall(json.dumps(answer, separators=(",", ":")).encode() + b"\n")


def request(path: Path, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Ask the daemon; UserError naming the problem if it does not answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        try:
            s.connect(str(path))
        except FileNotFoundError:
            raise UserError(f"no daemon: {path} does not exist (is `cachepilot run` running?)") from None
        except PermissionError:
            raise UserError(f"{path}: permission denied (the control socket is root only)") from None
        except OSError as exc:
            raise UserError(f"cannot reach the daemon at {path}: {exc.strerror or exc}") from None  # too long: no errno
        s.sendall(json.dumps(req).encode() + b"\n")
        chunks = []
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except TimeoutError:
        raise UserError(f"the daemon at {path} did not answer within {timeout:g} s") from None
    finally:
        s.close()
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise UserError(f"the daemon at {path} sent an unreadable answer") from None
    if "error" in answer:
        raise UserError(f"daemon: {answer['error']}")
    return answer
