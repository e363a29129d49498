"""systemd notification (``Type=notify``): READY=1 once the probe is attached and the volumes adopted, WATCHDOG=1
from the loop after every tick (so a stuck tick stops the pings and systemd's watchdog acts), RELOADING=1 around a
SIGHUP reload, STOPPING=1 at exit. Without ``NOTIFY_SOCKET`` (not under systemd) every call does nothing.

Sent without blocking (as libsystemd's sd_notify does): a receiver that does not read (its queue holds only
``net.unix.max_dgram_qlen`` datagrams, 10 by default) costs a dropped, counted message, never a stuck loop."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        addr = os.environ.get("NOTIFY_SOCKET", "")
        self.addr = "\0" + addr[1:] if addr.startswith("@") else addr
        self.enabled = bool(addr)
        self.dropped = 0
        self.sent: list[str] = []  # the last few messages (for status)
        self._sock: socket.socket | None = None
        if self.enabled:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)

    def _send(self, msg: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto(msg.encode(), self.addr)
        except OSError:  # EAGAIN (receiver's queue full), ECONNREFUSED (gone): never wait for systemd
            self.dropped += 1
            return
        self.sent = [*self.sent[-7:], msg.split("\n", 1)[0]]

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def reloading(self) -> None:
        self._send("RELOADING=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")
