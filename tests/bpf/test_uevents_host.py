"""The daemon's rescans driven by the host kernel's events (daemon/uevents.py, daemon/rescans.py): a real loop
device added (LOOP_CTL_ADD), given a backing file (losetup), released and removed (LOOP_CTL_REMOVE) is seen through
the NETLINK_KOBJECT_UEVENT socket and makes the rescan schedule due at once; a real mount and unmount likewise
through /proc/self/mountinfo. No BPF here, but root and the host kernel, like the other host tests. Other
sessions may make loop devices meanwhile: only this test's device counts."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from bpf_support import IMG_DIR, run

from cachepilot.daemon.rescans import MountTable, RescanEvents, RescanSchedule, open_events
from cachepilot.daemon.uevents import Uevent, UeventSocket

pytestmark = pytest.mark.bpf

LOOP_CTL_ADD, LOOP_CTL_REMOVE = 0x4C80, 0x4C81  # <linux/loop.h>
NS = 1_000_000_000
WAIT_S = 5.0


@pytest.fixture
def root(bpf_env: None) -> None:
    """Root and the host kernel (bpf_env fails loudly otherwise)."""


@contextlib.contextmanager
def new_loop_device() -> Iterator[str]:
    """A loop device made for this test (a number nobody uses), removed at the end."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        n = next(i for i in range(300, 1 << 20) if not Path(f"/sys/block/loop{i}").exists())
        got = fcntl.ioctl(ctl, LOOP_CTL_ADD, n)
        assert got == n, f"LOOP_CTL_ADD {n} gave {got}"
        try:
            yield f"loop{n}"
        finally:
            for _ in range(50):  # udev may still hold it open for a moment
                try:
                    fcntl.ioctl(ctl, LOOP_CTL_REMOVE, n)
                    break
                except OSError:
                    time.sleep(0.1)
    finally:
        os.close(ctl)


def seen(us: UeventSocket, name: str, action: str) -> list[Uevent]:
    """This device's block events until one with ``action`` (at most WAIT_S)."""
    mine: list[Uevent] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got, _ = us.take()
        mine += [e for e in got if e.devname == name]
        if any(e.action == action for e in mine):
            return mine
        time.sleep(0.05)
    raise AssertionError(f"no {action} uevent for {name} in {WAIT_S} s (seen: {mine})")


def test_a_real_loop_device_added_attached_detached_and_removed_is_seen_through_uevents(root: None) -> None:
    us = UeventSocket.open()
    assert us is not None, "the NETLINK_KOBJECT_UEVENT socket did not open as root"
    image = IMG_DIR / f"cachepilot-uevent-{uuid.uuid4().hex[:8]}.img"
    try:
        with open(image, "wb") as f:
            f.truncate(16 << 20)
        with new_loop_device() as name:
            assert [e.action for e in seen(us, name, "add")][:1] == ["add"]
            run("losetup", f"/dev/{name}", str(image))
            try:
                assert seen(us, name, "change")[-1].devpath == f"/devices/virtual/block/{name}"
            finally:
                run("losetup", "-d", f"/dev/{name}")
            seen(us, name, "change")
        assert seen(us, name, "remove")[-1].subsystem == "block"
    finally:
        us.close()
        image.unlink(missing_ok=True)


def test_the_daemons_schedule_is_due_at_once_when_a_loop_device_comes_and_goes(root: None) -> None:
    events = open_events()
    assert events.uevents is not None and events.mounts is not None
    s = RescanSchedule(events)
    try:
        s.looked(0, 10.0)
        with new_loop_device() as name:
            assert _due_for(s, 2 * NS, f"add {name}")
        assert _due_for(s, 3 * NS, f"remove {name}")
    finally:
        s.close()


def _due_for(s: RescanSchedule, now: int, what: str) -> bool:
    """Whether the schedule said a uevent rescan naming ``what`` within WAIT_S (others' events may come first)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        why = s.due(now, 10.0)
        if why is not None and why[0] == "uevent" and what in why[1]:
            return True
        time.sleep(0.05)
    return False


def test_a_mount_and_an_unmount_are_seen_through_the_mount_table(root: None) -> None:
    mounts = MountTable.open()
    assert mounts is not None
    events = RescanEvents(None, mounts)
    mnt = Path(tempfile.mkdtemp(prefix="cachepilot-mounts-"))
    try:
        events.changed()  # what others did before: taken
        run("mount", "-t", "tmpfs", "-o", "size=1m", "cachepilot-test", str(mnt))
        try:
            assert events.changed() == ("mounts", "the mount table changed")
        finally:
            run("umount", str(mnt))
        assert events.changed() == ("mounts", "the mount table changed")
    finally:
        events.close()
        mnt.rmdir()
