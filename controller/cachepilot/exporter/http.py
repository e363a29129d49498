"""The metrics endpoint: HTTP on 127.0.0.1 by default, in its own thread.

A scrape reads the last published snapshot (:class:`~cachepilot.exporter.snapshot.SnapshotBox`); it never
takes a lock the loop holds for longer than a reference swap, so a slow or stuck scraper cannot delay a tick.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from cachepilot.errors import UserError

DEFAULT_LISTEN = "127.0.0.1:9854"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → (host, port); UserError naming the value otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not 0 < number < 65536:
        raise UserError(f"metrics listen address {value!r}: expected IP:PORT, e.g. {DEFAULT_LISTEN}")
    return host, number


@dataclass
class MetricsServer:
    host: str
    port: int  # the bound port (useful with port 0 in tests)
    _server: object
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """A scrape is not worth a log line (the journal would get one every scrape interval)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(listen: str, registry: CollectorRegistry) -> MetricsServer:
    """Start answering ``/metrics`` on ``listen``; UserError if the address is malformed or taken.

    Our own small WSGI server around prometheus_client's app rather than its start_http_server, whose return value
    changed (None before 0.17, the server and thread after): Debian 12 ships 0.16."""
    host, port = parse_listen(listen)
    cls = _Server6 if ipaddress.ip_address(host).version == 6 else _Server
    try:
        server = make_server(host, port, make_wsgi_app(registry), cls, handler_class=_Quiet)
    except OSError as e:
        raise UserError(f"metrics listen address {listen}: {e.strerror or e}") from None
    thread = threading.Thread(target=server.serve_forever, name="cachepilot-metrics", daemon=True)
    thread.start()
    return MetricsServer(host, server.server_address[1], server, thread)
