"""systemd notification (``Type=notify``): READY=1 once the probe is attached and the volumes adopted, WATCHDOG=1
from the loop after every tick (so a stuck tick stops the pings and systemd's watchdog acts), RELOADING=1 around a
SIGHUP reload, STOPPING=1 at exit. Without ``NOTIFY_SOCKET`` (not under systemd) every call does nothing."""

from __future__ import annotations

import os

import sdnotify


class Notifier:
    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._n = sdnotify.SystemdNotifier() if self.enabled else None
        self.sent: list[str] = []  # the last few messages (for status)

    def _send(self, msg: str) -> None:
        if self._n is not None:
            self._n.notify(msg)
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
