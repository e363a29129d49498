"""A loaded program on a classic tracepoint (tracefs's events/CATEGORY/NAME) without libbpf's object: what the bcc path
needs for the system calls' and bcache's tracepoints (probe/bccload.py). The kernel's oldest interface, as bcc and
libbpf use it: a perf event on the tracepoint's id (pid -1, CPU 0: a tracepoint event sees every task on every CPU),
the program set on it by ioctl, the event enabled. Closing the event's descriptor detaches the program.
"""

from __future__ import annotations

import ctypes as C
import fcntl
import os
import struct
from pathlib import Path

PERF_TYPE_TRACEPOINT = 2
PERF_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7; the kernel takes any size it knows, zeroes past what it reads
SYS_PERF_EVENT_OPEN = 298  # x86-64 (the BPF side is x86-64's too: core_fixes.bpf.h)
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400  # _IO('$', 0)
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)


class AttachError(Exception):
    """The tracepoint is absent or the kernel refused the attach: the message says which."""


def tracepoint_id(tracefs: Path, tracepoint: str) -> int:
    """The id of CATEGORY/NAME under tracefs (AttachError if the kernel has no such tracepoint)."""
    try:
        return int((tracefs / "events" / tracepoint / "id").read_text())
    except (OSError, ValueError):
        raise AttachError(f"the kernel has no tracepoint {tracepoint}") from None


def _perf_attr(tp_id: int) -> bytes:
    attr = bytearray(PERF_ATTR_SIZE)
    # type, size, config (the tracepoint's id), sample_period 1; wakeup_events (offset 48) 1
    struct.pack_into("=IIQQ", attr, 0, PERF_TYPE_TRACEPOINT, PERF_ATTR_SIZE, tp_id, 1)
    struct.pack_into("=I", attr, 48, 1)
    return bytes(attr)


def attach(prog_fd: int, tracefs: Path, tracepoint: str) -> int:
    """Attach the program (of type tracepoint) to CATEGORY/NAME; returns the perf event's descriptor (close it to
    detach)."""
    attr = C.create_string_buffer(_perf_attr(tracepoint_id(tracefs, tracepoint)), PERF_ATTR_SIZE)
    libc = C.CDLL(None, use_errno=True)
    fd = int(libc.syscall(SYS_PERF_EVENT_OPEN, attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        raise AttachError(f"perf_event_open on {tracepoint}: {os.strerror(C.get_errno())}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError as exc:
        os.close(fd)
        raise AttachError(f"attaching to {tracepoint}: {exc.strerror}") from None
    return fd
