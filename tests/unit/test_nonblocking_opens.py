"""Files named by a hot list, an event or a pin are never opened in a way that can block, nor opened at all to find
out what they are (issue 33, case 5). Real files on this host's ext4 (tmp_path), the real open_by_handle_at
(root: CAP_DAC_READ_SEARCH).

On main before this change: the promoter's open_by_handle_at of a FIFO's inode (a hot-list entry with generation 0
matches any inode) waited for a writer on the loop thread, past the unit's watchdog; resolving a hot list's paths
opened FIFOs (waking their writers) and device nodes before checking what they were; the CLI opened a FIFO given
as its policy, hot list or configuration (non-blocking, but its writer woke) to find out it was one."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from cachepilot.actions import Promote
from cachepilot.actuators.promote import Promoter
from cachepilot.events import kdev_from_st_dev
from cachepilot.fsfiles import resolve
from cachepilot.hotlist import HotFile, HotList, match
from cachepilot.models.volume import VolumeInfo

if os.geteuid() != 0:
    pytest.fail("tests/unit/test_nonblocking_opens.py needs root (open_by_handle_at)", pytrace=False)


def _release(fifo: Path) -> None:
    """Open the FIFO's other end (non-blocking where possible) so that a thread stuck in open returns."""
    for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
        try:
            os.close(os.open(fifo, flags))
        except OSError:
            pass


def test_promoting_a_fifos_inode_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    st = os.stat(fifo)
    dev = kdev_from_st_dev(st.st_dev)
    info = VolumeInfo(dev=dev, name="v", kind="bcache", mountpoint=str(tmp_path), fs_block_size=4096)
    promoter = Promoter(info)
    action = Promote("v", dev, st.st_ino, 0, ((0, 4096),), "hot-list import")  # generation 0: any inode
    outcome: list[str] = []

    def opener() -> None:
        try:
            os.close(promoter._open(action))
            outcome.append("opened")
        except Exception as exc:  # noqa: BLE001 - the outcome is what is asserted
            outcome.append(f"{type(exc).__name__}: {exc}")

    t = threading.Thread(target=opener, daemon=True)
    t.start()
    t.join(2.0)
    if t.is_alive():
        _release(fifo)
        t.join(2.0)
        pytest.fail("open_by_handle_at of a FIFO's inode blocked for 2 s waiting for a writer")
    assert outcome and "not a regular file" in outcome[0], outcome


def test_resolving_a_hot_list_opens_no_fifo_and_no_device(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.mknod(tmp_path / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers: harmless if opened
    (tmp_path / "real").write_bytes(b"x" * 100)
    woke: list[bool] = []

    def writer() -> None:  # blocks in open until somebody opens the FIFO for reading
        try:
            fd = os.open(fifo, os.O_WRONLY)
            woke.append(True)
            os.close(fd)
        except OSError:
            woke.append(False)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(0.2)  # the writer is waiting in open by now
    try:
        assert resolve(str(tmp_path), "fifo") is None
        assert resolve(str(tmp_path), "null") is None
        hl = HotList("v", "", 0.0, (HotFile("fifo", 0, 0, 0, 1), HotFile("null", 0, 0, 0, 1),
                                     HotFile("real", 100, 0, 0, 1)))
        m = match(hl, str(tmp_path))
        assert m.unknown == 2 and m.by_generation + m.by_mtime + m.changed == 1
        t.join(0.5)
        assert not woke, "the FIFO was opened for reading (its writer woke up)"
    finally:
        _release(fifo)
        t.join(2.0)


@pytest.mark.parametrize("argv", [["policy", "check"], ["hotlist", "import", "bcache0"],
                                  ["run", "--check", "--config"]])
def test_the_cli_asks_what_a_file_is_before_opening_it(tmp_path: Path, argv: list[str]) -> None:
    """A FIFO given as a policy, hot list or configuration: refused in one line without being opened (its writer,
    blocked in open until a reader comes, stays blocked; on main the CLI's non-blocking open woke it)."""
    import subprocess
    import sys

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    woke: list[bool] = []

    def writer() -> None:
        try:
            fd = os.open(fifo, os.O_WRONLY)
            woke.append(True)
            os.close(fd)
        except OSError:
            woke.append(False)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        cli = str(Path(sys.executable).parent / "cachepilot")
        r = subprocess.run([cli, *argv, str(fifo)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "a FIFO or pipe, not a regular file" in r.stderr, r.stderr
        t.join(0.3)
        assert not woke, "the CLI opened the FIFO (its writer woke up)"
    finally:
        _release(fifo)
        t.join(2.0)
