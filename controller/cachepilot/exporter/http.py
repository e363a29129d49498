"""The metrics endpoint: HTTP on 127.0.0.1 by default, in its own thread.

A scrape reads the last published snapshot (:class:`~cachepilot.exporter.snapshot.SnapshotBox`); it never
takes a lock the loop holds for longer than a reference swap, so a slow or stuck scraper cannot delay a tick.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass

from prometheus_client import start_http_server
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


def serve(listen: str, registry: CollectorRegistry) -> MetricsServer:
    """Start answering ``/metrics`` on ``listen``; UserError if the address is malformed or taken."""
    host, port = parse_listen(listen)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise UserError(f"metrics listen address {listen}: {e.strerror or e}") from None
    return MetricsServer(host, server.server_address[1], server, thread)
