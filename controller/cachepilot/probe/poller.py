"""The probe's discrete events: the event ring (records of several sizes, read in one pass) and the block-barrier
ring (read in bulk), both from the rings' memory (ring.py), waited on together with one epoll and drained within a
budget per call."""

from __future__ import annotations

import select
from collections.abc import Callable

from cachepilot import records
from cachepilot.errors import UserError
from cachepilot.events import Event
from cachepilot.probe.maps import MapAccess
from cachepilot.probe.ring import FixedRing, RawRing

# Work per poll() is bounded: at most this many records of each ring are consumed per call (the rest waits in the
# ring; a full ring is counted as drops). The must-not-miss ring gets the larger share.
POLL_BUDGET_EVENTS = 16384
POLL_BUDGET_BARRIERS = 2048
# poll(-1) looks at the rings at least this often: a record that came within CP_WAKE_EVERY_NS (20 ms) of the
# last wakeup does not wake the consumer itself
LOOK_EVERY_MS = 100

decode_event = records.decode_ring  # one ring record -> its event (bpf/cachepilot.h's side of the records table)


class EventRings:
    """Both rings of a loaded object; ``tick_clock`` is called around each wait (the kernel's hotness clock)."""

    def __init__(self, maps: MapAccess, ringbuf_bytes: int, tick_clock: Callable[[], None]) -> None:
        self._tick_clock = tick_clock
        self._backlog = False
        self._ring: RawRing | None = None
        self._barrier_ring: FixedRing | None = None
        self._epoll: select.epoll | None = None
        self._wake_fds: set[int] = set()  # descriptors besides the rings that end a wait (wake_on)
        self._woken = False  # the last wait was ended by one of those
        try:
            self._open(maps.fds, ringbuf_bytes)
        except BaseException:
            self.close()
            raise

    def _open(self, fds: dict[str, int], ringbuf_bytes: int) -> None:
        # both rings are read from their memory (ring.py); one epoll waits for either
        self._ring = RawRing(fds["events"], ringbuf_bytes)
        self._barrier_ring = FixedRing(fds["barrier_events"], ringbuf_bytes, records.BARRIER_DTYPE)
        # edge-triggered: woken only by the kernel's (paced) wakeups; level-triggered, every look that found a
        # record that came meanwhile returned at once, and a busy producer kept the consumer spinning
        self._epoll = select.epoll()
        for name in ("events", "barrier_events"):
            self._epoll.register(fds[name], select.EPOLLIN | select.EPOLLET)

    def wake_on(self, fd: int) -> None:
        """See Probe.wake_on. Level-triggered: a stop request stays readable, so every later wait returns at once
        (the rings are still read: the loop is leaving)."""
        if self._epoll is None:
            raise UserError("probe is closed")
        if fd not in self._wake_fds:
            self._epoll.register(fd, select.EPOLLIN)
            self._wake_fds.add(fd)

    def unread(self) -> bool:
        """See Probe.unread."""
        if self._ring is None or self._barrier_ring is None:
            raise UserError("probe is closed")
        return self._ring.unread or self._barrier_ring.unread

    def poll(self, timeout_ms: int = 0) -> list[Event]:
        """See Probe.poll."""
        if self._ring is None:
            raise UserError("probe is closed")
        if timeout_ms >= 0:
            return self._poll_once(timeout_ms)
        while True:
            got = self._poll_once(LOOK_EVERY_MS)
            if got or self._woken:  # a wake_on descriptor ends even an endless wait
                return got

    def _poll_once(self, timeout_ms: int) -> list[Event]:
        assert self._ring is not None and self._epoll is not None and self._barrier_ring is not None
        self._tick_clock()
        wait = 0 if self._backlog else timeout_ms  # records left by the last call's budget: no wakeup will say so
        ready = self._epoll.poll(wait / 1000 if wait else 0)
        self._woken = any(fd in self._wake_fds for fd, _ in ready)
        if wait:
            self._tick_clock()
        events = [ev for ev in map(decode_event, self._ring.take(POLL_BUDGET_EVENTS)) if ev is not None]
        barriers = records.decode_barriers(self._barrier_ring.take(POLL_BUDGET_BARRIERS))
        self._backlog = self._ring.left_over or self._barrier_ring.left_over
        return events + barriers

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._barrier_ring is not None:
            self._barrier_ring.close()
            self._barrier_ring = None
