"""Block-device uevents from the kernel (a NETLINK_KOBJECT_UEVENT socket): a device added, removed or changed is
what prompts the daemon's rescan (daemon/rescans.py), instead of looking every few seconds.

The kernel sends one datagram per event (lib/kobject_uevent.c): ``ACTION@DEVPATH\\0`` then ``KEY=VALUE\\0`` pairs,
at most 2 048 bytes of pairs (UEVENT_BUFFER_SIZE) and 64 of them (UEVENT_NUM_ENVP), to multicast group 1, from port
id 0. Only that is listened to: udevd's re-broadcasts (group 2, a ``libudev`` header) are not bound, a datagram
from any other port id is dropped, and so is one that does not parse as the kernel writes them. The parser is
bounded and refuses rather than guesses: at most ``MAX_DATAGRAM`` bytes (a longer datagram arrives truncated and
is dropped), ``MAX_FIELDS`` pairs, keys of upper-case letters, digits and ``_``, each key once, the header's action
and path equal to ACTION and DEVPATH, the fields used in printable ASCII. A tick reads at most ``MAX_PER_TAKE``
datagrams; a full receive buffer (ENOBUFS: the kernel dropped events) is reported as ``lost``, so the caller
rescans anyway. The stdlib socket speaks AF_NETLINK; no dependency.

In a network namespace other than the host's (most containers) the kernel sends no block uevents at all: the
socket opens and stays silent, and the fallback poll is what finds changes there.
"""

from __future__ import annotations

import errno
import logging
import re
import socket
from dataclasses import dataclass

log = logging.getLogger("cachepilot")

NETLINK_KOBJECT_UEVENT = 15  # <linux/netlink.h>
KERNEL_GROUP = 1  # the kernel's multicast group (udevd's is 2)
MAX_DATAGRAM = 8192  # the kernel's: a 2 048-byte buffer of pairs plus the header; anything longer is not one
MAX_FIELDS = 64
MAX_PER_TAKE = 256  # datagrams read a tick; more left waiting means "changed" anyway
RCVBUF = 1 << 20  # room for a burst (an LVM activation, a hundred disks appearing) without ENOBUFS
ACTIONS = frozenset({"add", "remove", "change", "move", "online", "offline", "bind", "unbind"})
RESCAN_ACTIONS = frozenset({"add", "remove", "change", "move"})  # what can make or unmake a cached volume
_KEY = re.compile(rb"[A-Z0-9_]{1,64}")
_TEXT = re.compile(rb"[\x21-\x7e]{0,1024}")  # printable ASCII, no spaces: action, path and names as the kernel writes


@dataclass(frozen=True, slots=True)
class Uevent:
    action: str
    devpath: str
    subsystem: str
    devname: str = ""  # DEVNAME, e.g. "loop3", "dm-2" (not all events carry one)
    devtype: str = ""  # DEVTYPE: "disk", "partition"

    @property
    def block(self) -> bool:
        """A block device's event that can make or unmake a cached volume."""
        return self.subsystem == "block" and self.action in RESCAN_ACTIONS


def parse(data: bytes) -> Uevent | None:
    """One datagram as the kernel writes it, or None (anything else: malformed, oversized, from udevd)."""
    if not data or len(data) > MAX_DATAGRAM:
        return None
    parts = data.split(b"\0")
    if parts[-1] == b"":
        parts.pop()  # the pairs end with a NUL
    if not 2 <= len(parts) <= MAX_FIELDS + 1:
        return None
    action, at, devpath = parts[0].partition(b"@")
    if not at:
        return None  # udevd's "libudev" header, or garbage
    fields: dict[bytes, bytes] = {}
    for p in parts[1:]:
        key, eq, value = p.partition(b"=")
        if not eq or not _KEY.fullmatch(key) or key in fields:
            return None
        fields[key] = value
    if fields.get(b"ACTION") != action or fields.get(b"DEVPATH") != devpath or not devpath.startswith(b"/"):
        return None
    used = (action, devpath, fields.get(b"SUBSYSTEM", b""), fields.get(b"DEVNAME", b""), fields.get(b"DEVTYPE", b""))
    if not all(_TEXT.fullmatch(x) for x in used):
        return None
    ev = Uevent(*(x.decode("ascii") for x in used))
    return ev if ev.action in ACTIONS else None


class UeventSocket:
    """The kernel's uevents, read without blocking; ``take()`` once a tick."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dropped = 0  # datagrams refused (not the kernel's, malformed, truncated)
        self.failed = ""  # why the socket stopped working (an error other than an overrun): the caller drops it

    @classmethod
    def open(cls) -> UeventSocket | None:
        """The socket bound to the kernel's group, or None (said once) where it cannot be had."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                                 NETLINK_KOBJECT_UEVENT)
        except (OSError, AttributeError) as exc:  # AttributeError: a platform without AF_NETLINK
            log.info("no kernel uevents (%s): volumes are looked for by polling only", exc)
            return None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # capped by rmem_max: best effort
            sock.bind((0, KERNEL_GROUP))
        except OSError as exc:
            sock.close()
            log.info("no kernel uevents (%s): volumes are looked for by polling only", exc)
            return None
        return cls(sock)

    def take(self) -> tuple[list[Uevent], bool]:
        """(the block events waiting, at most MAX_PER_TAKE datagrams read; whether events were lost or left)."""
        got: list[Uevent] = []
        for _ in range(MAX_PER_TAKE):
            try:
                data, _anc, flags, addr = self.sock.recvmsg(MAX_DATAGRAM)
            except BlockingIOError:
                return got, False
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    self.failed = str(exc)
                return got, True  # the kernel dropped events (or the socket failed): look anyway
            ev = parse(data) if not flags & socket.MSG_TRUNC and _from_kernel(addr) else None
            if ev is None:
                self.dropped += 1
            elif ev.block:
                got.append(ev)
        return got, True  # more waiting than a tick reads: changed anyway

    def close(self) -> None:
        self.sock.close()


def _from_kernel(addr: object) -> bool:
    """A netlink source address (port id, groups): the kernel's port id is 0."""
    return isinstance(addr, tuple) and len(addr) == 2 and addr[0] == 0
