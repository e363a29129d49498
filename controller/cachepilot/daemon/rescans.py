"""When the daemon looks for cached volumes again: when the kernel says something changed, and by polling only as a
fallback.

A cached volume is a block device with a filesystem mounted on it, so two things announce one appearing or going:
a block device's uevent (daemon/uevents.py: bcache registering ``bcacheN``, a dm table loaded and resumed, a device
removed) and a change of the mount table (``/proc/self/mountinfo`` polls with POLLPRI when it changes; a mount
makes no uevent). Either makes the next tick rescan, and one more rescan follows ``SETTLE_S`` later: the kernel's
event comes before udev has made the device's nodes and links, and a dm device is announced when its table is
loaded, before it is resumed. Events are read once a tick, so a storm costs one rescan a tick at most.

Polling stays, as a fallback every ``max(rescan, FALLBACK_S)``: 60 s, not the configured 10 s, because the events
cover what makes or unmakes a volume and what they can miss is rare -- a receive buffer overrun (ENOBUFS; that is
reported and rescans at once), a change no event announces (a filesystem's UUID rewritten in place), or a network
namespace where the kernel sends no uevents (a container; then only the mount table's changes and the poll are left).
A minute bounds how long such a change goes unseen, at a sixth of the polling's cost (a rescan reads sysfs for every
block device: 335 ms of a tick in the TCG lab guest). Without either event source the configured interval is kept.
"""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Callable

from cachepilot.daemon.uevents import UeventSocket

log = logging.getLogger("cachepilot")
NS = 1_000_000_000
FALLBACK_S = 60.0
SETTLE_S = 2.0
MOUNTINFO = "/proc/self/mountinfo"


class MountTable:
    """``/proc/self/mountinfo``, readable with POLLPRI once the mount table changed (until read again)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.poller = select.poll()
        self.poller.register(fd, select.POLLPRI | select.POLLERR)
        self._read()

    @classmethod
    def open(cls, path: str = MOUNTINFO) -> MountTable | None:
        try:
            return cls(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            log.info("mount table changes not watched (%s): polling finds new mounts", exc)
            return None

    def changed(self) -> bool:
        if not self.poller.poll(0):
            return False
        self._read()  # the mark stays until the file is read again
        return True

    def _read(self) -> None:
        os.lseek(self.fd, 0, os.SEEK_SET)
        while os.read(self.fd, 1 << 16):
            pass

    def close(self) -> None:
        os.close(self.fd)


class RescanEvents:
    """The event sources (either may be missing): what changed since the last look, in one word and a detail."""

    def __init__(self, uevents: UeventSocket | None, mounts: MountTable | None) -> None:
        self.uevents = uevents
        self.mounts = mounts

    @property
    def live(self) -> bool:
        return self.uevents is not None or self.mounts is not None

    def changed(self) -> tuple[str, str] | None:
        """(kind, detail) of the first change seen since the last call (every source is read), or None."""
        why: tuple[str, str] | None = None
        if self.uevents is not None:
            got, lost = self.uevents.take()
            if self.uevents.failed:  # not an overrun: a socket that fails would say "lost" every tick
                log.warning("kernel uevents no longer read (%s): volumes are looked for by polling",
                            self.uevents.failed)
                self.uevents.close()
                self.uevents = None
            if got:
                why = ("uevent", ", ".join(f"{e.action} {e.devname or e.devpath}" for e in got[:3])
                       + (f" and {len(got) - 3} more" if len(got) > 3 else ""))
            elif lost:
                why = ("uevents_lost", "uevents lost or more than a tick reads")
        if self.mounts is not None and self.mounts.changed() and why is None:
            why = ("mounts", "the mount table changed")
        return why

    def close(self) -> None:
        for src in (self.uevents, self.mounts):
            if src is not None:
                src.close()


def open_events() -> RescanEvents:
    return RescanEvents(UeventSocket.open(), MountTable.open())


class RescanSchedule:
    """``due(now, poll_s)`` once a tick: why to rescan now, or None."""

    def __init__(self, events: RescanEvents | None) -> None:
        self.events = events if events is not None and events.live else None
        self._next_poll = 0
        self._settle_at: int | None = None

    def fallback_s(self, poll_s: float) -> float:
        return poll_s if self.events is None or not self.events.live else max(poll_s, FALLBACK_S)

    def looked(self, now: int, poll_s: float) -> None:
        """A rescan was made at ``now`` (the start's, or one due)."""
        self._next_poll = now + int(self.fallback_s(poll_s) * NS)

    def due(self, now: int, poll_s: float) -> tuple[str, str] | None:
        why = self.events.changed() if self.events is not None else None
        if why is not None:
            self._settle_at = now + int(SETTLE_S * NS)
        elif self._settle_at is not None and now >= self._settle_at:
            self._settle_at = None
            why = ("settle", f"{SETTLE_S:g} s after an event")
        elif now >= self._next_poll:
            why = ("poll", f"every {self.fallback_s(poll_s):g} s")
        if why is not None:
            self.looked(now, poll_s)
        return why

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
            self.events = None


EventsFactory = Callable[[], RescanEvents | None]
