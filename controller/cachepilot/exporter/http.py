"""The metrics endpoint: HTTP on 127.0.0.1 by default, on a :class:`~cachepilot.boundedserver.BoundedServer` (one
thread, a connection cap, the whole request within ``REQUEST_TIMEOUT_S``), so a local user cannot stall it.

A scrape reads the last published snapshot (:class:`~cachepilot.exporter.snapshot.SnapshotBox`); it never
takes a lock the loop holds for longer than a reference swap, so a slow or stuck scraper cannot delay a tick.
HTTP is the little a scraper needs: ``GET``/``HEAD`` of ``/metrics`` (and ``/``, a link to it), one request per
connection; any other path is 404, any other method 405. With the daemon's snapshot box, two probes for load
balancers and orchestrators: ``/healthz`` (200 while the loop ticks: 503 once the last tick is older than
``STALL_S``, the rules' CachepilotLoopStalled) and ``/ready`` (200 once the daemon said ready, else 503).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachepilot.boundedserver import BoundedServer, Dialogue
from cachepilot.errors import UserError
from cachepilot.exporter.exposition import negotiate
from cachepilot.exporter.listen import parse_listen
from cachepilot.exporter.registry import Registry
from cachepilot.exporter.snapshot import DaemonSnapshot, SnapshotBox

RENDER_TTL_S = 0.1
MAX_REQUEST = 8192  # the request line and headers
REQUEST_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 10.0
MAX_CLIENTS = 256  # a scrape costs a socket and a buffer, not a thread
INDEX = b'<html><body><a href="/metrics">/metrics</a></body></html>\n'
STALL_S = 60.0  # /healthz fails when the loop has not ticked for this long (as CachepilotLoopStalled does)
PROBES = (b"/healthz", b"/ready")


def _response(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8", extra: str = "",
              head: bool = False) -> bytes:
    header = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}"
              "Connection: close\r\n\r\n")
    return header.encode("latin-1") + (b"" if head else body)


def _accept_header(head: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"accept":
            return value.strip().decode("latin-1")
    return ""


def health(snap: DaemonSnapshot | None, now: float) -> tuple[bool, str]:
    """/healthz: alive unless the loop stopped ticking (no snapshot yet: starting, alive)."""
    if snap is None or not snap.last_tick_timestamp:
        return True, "ok: starting\n"
    age = now - snap.last_tick_timestamp
    if age > STALL_S:
        return False, f"loop stalled: last tick {age:.0f} s ago\n"
    return True, "ok\n"


def readiness(snap: DaemonSnapshot | None) -> tuple[bool, str]:
    """/ready: the daemon reported ready (probe attached, volumes adopted)."""
    if snap is not None and snap.ready:
        return True, "ready\n"
    return False, "not ready\n"


class _Scrapes(Dialogue):
    def __init__(self, registry: Registry, box: SnapshotBox | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self.box = box
        self.clock = clock
        self._rendered: dict[str, tuple[float, bytes]] = {}  # content type -> (when, body)

    def _render(self, accept: str) -> tuple[bytes, str]:
        """The registry rendered in the format the scraper asked for; at most once per RENDER_TTL_S per format, so
        a storm of scrapes costs sends, not renders (the snapshot behind it changes once per tick anyway)."""
        encode, ctype = negotiate(accept)  # Prometheus asks for OpenMetrics, curl gets text
        now = time.monotonic()
        when, body = self._rendered.get(ctype, (-RENDER_TTL_S, b""))
        if now - when >= RENDER_TTL_S:
            body = encode(self.registry.collect())
            self._rendered[ctype] = (now, body)
        return body, ctype

    def reply(self, data: bytes, eof: bool) -> bytes | None:
        head, sep, _ = data.partition(b"\r\n\r\n")
        if not sep:
            return b"" if eof else None
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response("400 Bad Request", b"bad request\n")
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        probes = PROBES if self.box is not None else ()
        if path not in (b"/metrics", b"/", *probes):
            return _response("404 Not Found", b"not found: try /metrics\n")
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed", b"method not allowed\n", extra="Allow: GET, HEAD\r\n")
        if path in probes:
            return self._probe(path, head=method == b"HEAD")
        if path == b"/":
            return _response("200 OK", INDEX, "text/html; charset=utf-8", head=method == b"HEAD")
        body, ctype = self._render(_accept_header(head))
        return _response("200 OK", body, ctype, head=method == b"HEAD")

    def _probe(self, path: bytes, head: bool) -> bytes:
        assert self.box is not None  # only routed here with a box
        snap = self.box.latest()
        ok, text = health(snap, self.clock()) if path == b"/healthz" else readiness(snap)
        return _response("200 OK" if ok else "503 Service Unavailable", text.encode(), head=head)

    def too_big(self) -> bytes:
        return _response("431 Request Header Fields Too Large", b"request too large\n")

    def too_slow(self) -> bytes:
        return _response("408 Request Timeout", b"request not complete in time\n")


@dataclass
class MetricsServer:
    host: str
    port: int  # the bound port (useful with port 0 in tests)
    _server: BoundedServer

    def close(self) -> None:
        self._server.close()


def serve(listen: str, registry: Registry, box: SnapshotBox | None = None) -> MetricsServer:
    """Start answering ``/metrics`` on ``listen`` (and, given the snapshot box, ``/healthz`` and ``/ready``);
    UserError if the address is malformed or taken."""
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds despite TIME_WAIT
        sock.bind((host, port))
        server = BoundedServer(sock, _Scrapes(registry, box), name="cachepilot-metrics", max_conns=MAX_CLIENTS,
                               request_deadline_s=REQUEST_TIMEOUT_S, reply_deadline_s=REPLY_TIMEOUT_S,
                               max_request=MAX_REQUEST)
    except OSError as e:
        sock.close()
        raise UserError(f"metrics listen address {listen}: {e.strerror or e}") from None
    server.start()
    return MetricsServer(host, sock.getsockname()[1], server)
