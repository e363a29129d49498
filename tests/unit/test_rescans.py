"""Rescans driven by the kernel's events (daemon/uevents.py, daemon/rescans.py): uevent datagrams parsed as the
kernel writes them and nothing else (malformed, oversized, foreign ones refused, never an exception), the socket
read a bounded amount a tick, a change rescanned at the next tick and once more when it settled, polling kept as
a fallback."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.daemon import uevents
from cachepilot.daemon.rescans import FALLBACK_S, SETTLE_S, RescanEvents, RescanSchedule
from cachepilot.daemon.uevents import MAX_DATAGRAM, MAX_PER_TAKE, Uevent, UeventSocket, parse
from cachepilot.daemon.volumes import Found
from tests.unit.daemon_rig import VOL, Rig

NS = 1_000_000_000


def kernel(action: str = "add", devpath: str = "/devices/virtual/block/loop7", **extra: str) -> bytes:
    fields = {"ACTION": action, "DEVPATH": devpath, "SUBSYSTEM": "block", "MAJOR": "7", "MINOR": "7",
              "DEVNAME": "loop7", "DEVTYPE": "disk", "SEQNUM": "4242", **extra}
    return f"{action}@{devpath}\0".encode() + b"".join(f"{k}={v}\0".encode() for k, v in fields.items())


def test_a_kernel_uevent_parses() -> None:
    assert parse(kernel()) == Uevent("add", "/devices/virtual/block/loop7", "block", "loop7", "disk")
    assert parse(kernel("remove")).block and parse(kernel("change")).block  # type: ignore[union-attr]
    assert not parse(kernel("bind")).block  # type: ignore[union-attr]
    assert not parse(kernel(SUBSYSTEM="usb")).block  # type: ignore[union-attr]
    assert parse(kernel()[:-1]) == parse(kernel())  # the last NUL is optional


MALFORMED = [
    b"",
    b"\0",
    b"add@/devices/virtual/block/loop7",  # no pairs
    b"libudev\0\xfe\xed\xca\xfe" + kernel()[8:],  # udevd's re-broadcast
    kernel().replace(b"add@", b"add#", 1),  # no header
    kernel().replace(b"ACTION=add", b"ACTION=remove"),  # header and ACTION disagree
    kernel().replace(b"DEVPATH=/devices", b"DEVPATH=/elsewhere"),  # header and DEVPATH disagree
    kernel(devpath="devices/relative"),
    kernel(action="explode"),
    kernel().replace(b"MAJOR=7", b"major=7"),  # a key the kernel never writes
    kernel().replace(b"MAJOR=7", b"MAJOR7"),  # a pair without "="
    kernel() + b"MINOR=8\0",  # a key twice
    kernel(DEVNAME="loop\xc3\xa9".encode("latin-1").decode("latin-1")),  # not ASCII
    kernel(DEVNAME="a b"),  # a space
    kernel(DEVNAME="x" * 2000),  # longer than a field can be
    kernel(**{f"K{i}": "v" for i in range(70)}),  # more pairs than the kernel sends
    kernel(PAD="x" * 1000, PAD2="x" * 1000, PAD3="x" * 1000, PAD4="x" * 1000, PAD5="x" * 1000, PAD6="x" * 1000,
           PAD7="x" * 1000, PAD8="x" * 1000, PAD9="x" * 1000),  # larger than MAX_DATAGRAM
]


def test_malformed_and_oversized_datagrams_are_refused() -> None:
    assert len(MALFORMED[-1]) > MAX_DATAGRAM
    for data in MALFORMED:
        assert parse(data) is None, data[:80]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=3 * MAX_DATAGRAM) | st.lists(st.binary(max_size=80), max_size=90).map(b"\0".join))
def test_any_bytes_parse_or_are_refused_never_raise(data: bytes) -> None:
    ev = parse(data)
    if ev is not None:
        assert len(data) <= MAX_DATAGRAM and ev.action in uevents.ACTIONS and ev.devpath.startswith("/")
        assert all(x.isascii() and x.isprintable() and " " not in x for x in (ev.devpath, ev.devname, ev.subsystem))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(uevents.ACTIONS)), st.from_regex(r"/[a-z0-9/!._-]{1,60}", fullmatch=True),
       st.from_regex(r"[a-z0-9!._-]{0,30}", fullmatch=True))
def test_what_the_kernel_writes_parses_back(action: str, devpath: str, devname: str) -> None:
    ev = parse(kernel(action, devpath, DEVNAME=devname))
    assert ev == Uevent(action, devpath, "block", devname, "disk")


class FakeNetlink:
    """recvmsg() of a netlink socket: queued (data, flags, (port id, groups)) or an errno."""

    def __init__(self, items: list[tuple[bytes, int, tuple[int, int]] | int]) -> None:
        self.items = items

    def recvmsg(self, size: int) -> tuple[bytes, list[object], int, tuple[int, int]]:
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "empty")
        item = self.items.pop(0)
        if isinstance(item, int):
            raise OSError(item, "error")
        data, flags, addr = item
        return data[:size], [], flags, addr

    def close(self) -> None:
        pass


def take(items: list[tuple[bytes, int, tuple[int, int]] | int]) -> tuple[list[Uevent], bool, int]:
    us = UeventSocket(FakeNetlink(items))  # type: ignore[arg-type]
    got, lost = us.take()
    return got, lost, us.dropped


def test_only_the_kernels_whole_block_events_are_taken() -> None:
    got, lost, dropped = take([
        (kernel(), 0, (0, 1)),
        (kernel("change", DEVNAME="sdb"), 0, (4321, 1)),  # from a process, not the kernel
        (kernel(), socket.MSG_TRUNC, (0, 1)),  # cut short: more than MAX_DATAGRAM
        (kernel(SUBSYSTEM="net"), 0, (0, 1)),  # parsed, not a block device: ignored
        (b"garbage", 0, (0, 1)),
        (kernel("remove"), 0, (0, 1)),
    ])
    assert [e.action for e in got] == ["add", "remove"] and not lost and dropped == 3


def test_a_full_receive_buffer_and_a_backlog_say_lost() -> None:
    got, lost, _ = take([(kernel(), 0, (0, 1)), errno.ENOBUFS])
    assert len(got) == 1 and lost
    got, lost, _ = take([(kernel(), 0, (0, 1))] * (MAX_PER_TAKE + 5))
    assert len(got) == MAX_PER_TAKE and lost  # the rest waits: rescan anyway


class FakeMounts:
    def __init__(self) -> None:
        self.pending = False

    def changed(self) -> bool:
        was, self.pending = self.pending, False
        return was

    def close(self) -> None:
        pass


def schedule(items: list[tuple[bytes, int, tuple[int, int]] | int]) -> tuple[RescanSchedule, FakeMounts]:
    mounts = FakeMounts()
    s = RescanSchedule(RescanEvents(UeventSocket(FakeNetlink(items)), mounts))  # type: ignore[arg-type]
    s.looked(0, 10.0)
    return s, mounts


def test_an_event_rescans_at_the_next_tick_then_once_more_when_settled_and_polling_falls_back() -> None:
    net: list[tuple[bytes, int, tuple[int, int]] | int] = []
    s, mounts = schedule(net)
    assert s.due(1 * NS, 10.0) is None  # quiet: no poll before the fallback
    net += [(kernel(), 0, (0, 1))] * 40  # a storm: one rescan
    assert s.due(2 * NS, 10.0) == ("uevent", "add loop7, add loop7, add loop7 and 37 more")
    assert s.due(3 * NS, 10.0) is None
    assert s.due(int((2 + SETTLE_S) * NS), 10.0) == ("settle", "2 s after an event")
    mounts.pending = True
    assert s.due(5 * NS, 10.0) == ("mounts", "the mount table changed")
    assert s.due(7 * NS, 10.0) == ("settle", "2 s after an event")
    assert s.due(40 * NS, 10.0) is None  # 10 s polling is not needed with events
    assert s.due(int((7 + FALLBACK_S) * NS), 10.0) == ("poll", "every 60 s")


def test_without_event_sources_the_configured_poll_is_kept() -> None:
    s = RescanSchedule(RescanEvents(None, None))
    s.looked(0, 10.0)
    assert s.due(9 * NS, 10.0) is None and s.due(10 * NS, 10.0) == ("poll", "every 10 s")


def test_the_daemon_adopts_a_volume_at_the_tick_after_its_uevent_not_at_the_next_poll(tmp_path: Path) -> None:
    net: list[tuple[bytes, int, tuple[int, int]] | int] = []
    r = Rig(tmp_path)
    r.d._rescan_events = lambda: RescanEvents(UeventSocket(FakeNetlink(net)), None)  # type: ignore[arg-type]
    r.found = []
    r.d.start()
    try:
        assert not r.d.vols
        r.found = [Found(VOL)]
        r.tick(1)  # no event yet, the poll (1 s here, 60 s with events) not due
        assert not r.d.vols
        net.append((kernel("add", "/devices/virtual/block/bcache0", DEVNAME="bcache0"), 0, (0, 1)))
        r.tick(2)
        assert [v.info.name for v in r.d.vols.values()] == ["bcache0"]
        assert r.d.counters["rescans.uevent"] == 1
    finally:
        r.d.shutdown()


def test_a_failing_uevent_socket_is_dropped_for_polling_not_rescanned_every_tick() -> None:
    net: list[tuple[bytes, int, tuple[int, int]] | int] = [errno.EBADF]
    s = RescanSchedule(RescanEvents(UeventSocket(FakeNetlink(net)), None))  # type: ignore[arg-type]
    s.looked(0, 10.0)
    assert s.due(1 * NS, 10.0) == ("uevents_lost", "uevents lost or more than a tick reads")  # once, at the failure
    net.append(errno.EBADF)
    got = [s.due(t * NS, 10.0) for t in range(2, 13)]
    assert got == [None, ("settle", "2 s after an event")] + [None] * 9  # not "lost" every tick
    assert s.due(13 * NS, 10.0) == ("poll", "every 10 s")  # the configured interval again: no event source left
