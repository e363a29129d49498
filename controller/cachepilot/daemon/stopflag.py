"""A stop request that a signal handler may raise.

Python runs a signal handler in the main thread between two bytecodes, possibly while that thread is inside
``threading.Event.wait`` holding the event's lock: a handler calling ``Event.set`` then waits for a lock its own
thread holds, for ever (seen: a daemon that ignored SIGTERM for 14 minutes, its main thread in ``Event.set`` under
``Event.wait``). So the request is a plain attribute and a byte written to a pipe -- neither takes a lock -- and a
wait is a ``poll`` on the pipe (a byte once written stays, so every later wait returns at once).
"""

from __future__ import annotations

import math
import os
import select
import weakref


class StopFlag:
    """``threading.Event``'s ``set``/``is_set``/``wait`` for a one-way stop, safe from a signal handler."""

    def __init__(self) -> None:
        self._set = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        weakref.finalize(self, _close, self._r, self._w)

    def set(self) -> None:
        self._set = True
        try:
            os.write(self._w, b"\0")
        except OSError:  # full (a byte is already there) or closed: the attribute alone says it
            pass

    def is_set(self) -> bool:
        return self._set

    def fileno(self) -> int:
        """The pipe's read end: readable once set (and for ever after), for a caller that waits on several
        descriptors at once (the probe's rings: Probe.wake_on) and must still see a stop request at once."""
        return self._r

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            poller = select.poll()  # not select(): a descriptor above 1023 would make it fail at once, a busy loop
            poller.register(self._r, select.POLLIN)
            try:
                poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))
            except OSError:
                pass
        return self._set


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
