"""The probe's discrete events: the event ring (libbpf's consumer, one callback a record) and the block-barrier ring
(read in bulk, ring.py), waited on together with one epoll and drained within a budget per call."""

from __future__ import annotations

import ctypes as C
import select
from collections.abc import Callable

from cachepilot import records
from cachepilot.errors import UserError
from cachepilot.events import Event
from cachepilot.probe import libbpf
from cachepilot.probe.maps import MapAccess
from cachepilot.probe.ring import FixedRing

# Work per poll() is bounded: at most this many records of each ring are consumed per call (the rest waits in the
# ring; a full ring is counted as drops). The must-not-miss ring gets the larger share.
POLL_BUDGET_EVENTS = 16384
POLL_BUDGET_BARRIERS = 2048
# poll(-1) looks at the rings at least this often: a record that came within CP_WAKE_EVERY_NS (20 ms) of the
# last wakeup does not wake the consumer itself
LOOK_EVERY_MS = 100
_BUDGET_SPENT = -1000  # returned by the sample callback to stop libbpf's consume loop

decode_event = records.decode_ring  # one ring record -> its event (bpf/cachepilot.h's side of the records table)


class EventRings:
    """Both rings of a loaded object; ``tick_clock`` is called around each wait (the kernel's hotness clock)."""

    def __init__(self, maps: MapAccess, ringbuf_bytes: int, tick_clock: Callable[[], None]) -> None:
        self._h = maps.h
        self._tick_clock = tick_clock
        self._backlog = False
        self._raw: list[bytes] = []
        self._rb: int | None = None
        self._barrier_ring: FixedRing | None = None
        self._epoll: select.epoll | None = None
        self._cb = libbpf.RINGBUF_SAMPLE_FN(self._on_sample)
        try:
            self._open(maps.fds, ringbuf_bytes)
        except BaseException:
            self.close()
            raise

    def _open(self, fds: dict[str, int], ringbuf_bytes: int) -> None:
        rb = self._h.ring_buffer__new(fds["events"], self._cb, None, None)
        if not rb:
            raise UserError(f"ring_buffer__new failed: {libbpf.errno_str(C.get_errno())}")
        self._rb = rb
        # block barriers are read in bulk from the ring's memory (ring.py); one epoll waits for either ring
        self._barrier_ring = FixedRing(fds["barrier_events"], ringbuf_bytes, records.BARRIER_DTYPE)
        # edge-triggered: woken only by the kernel's (paced) wakeups; level-triggered, every look that found a
        # record that came meanwhile returned at once, and a busy producer kept the consumer spinning
        self._epoll = select.epoll()
        for name in ("events", "barrier_events"):
            self._epoll.register(fds[name], select.EPOLLIN | select.EPOLLET)

    # A sample handed to a callback is consumed even when the callback stops the loop: keep it, then stop.
    def _on_sample(self, _ctx: int, data: int, size: int) -> int:
        self._raw.append(C.string_at(data, size))
        return _BUDGET_SPENT if len(self._raw) >= POLL_BUDGET_EVENTS else 0

    def poll(self, timeout_ms: int = 0) -> list[Event]:
        """See Probe.poll."""
        if self._rb is None:
            raise UserError("probe is closed")
        if timeout_ms >= 0:
            return self._poll_once(timeout_ms)
        while True:
            got = self._poll_once(LOOK_EVERY_MS)
            if got:
                return got

    def _poll_once(self, timeout_ms: int) -> list[Event]:
        assert self._rb is not None and self._epoll is not None and self._barrier_ring is not None
        self._tick_clock()
        wait = 0 if self._backlog else timeout_ms  # records left by the last call's budget: no wakeup will say so
        self._epoll.poll(wait / 1000 if wait else 0)
        if wait:
            self._tick_clock()
        rc = self._h.ring_buffer__consume(self._rb)
        if rc < 0 and rc != _BUDGET_SPENT:
            raise OSError(-rc, "ring_buffer__consume failed")
        raw, self._raw = self._raw, []
        events = [ev for ev in map(decode_event, raw) if ev is not None]
        barriers = records.decode_barriers(self._barrier_ring.take(POLL_BUDGET_BARRIERS))
        self._backlog = len(raw) >= POLL_BUDGET_EVENTS or self._barrier_ring.left_over
        return events + barriers

    def close(self) -> None:
        if self._rb:
            self._h.ring_buffer__free(self._rb)
            self._rb = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._barrier_ring is not None:
            self._barrier_ring.close()
            self._barrier_ring = None
