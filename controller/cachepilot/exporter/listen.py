"""The metrics listen address (``metrics.listen``): its default and its parser, apart from the HTTP server so that
checking a config does not import the exporter's output side (exporter/__init__.py)."""

from __future__ import annotations

import ipaddress

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
