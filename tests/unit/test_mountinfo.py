"""fs_type: which filesystem a device is mounted as, from a mountinfo file (decides whether the probe needs the
fsync-family syscall tracepoints: ext4 counts those calls in its own hooks)."""

from __future__ import annotations

from pathlib import Path

from cachepilot.probe.probe import fs_type

MOUNTINFO = """\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 7:1 / /mnt/a rw,relatime shared:9 - ext4 /dev/loop1 rw
31 22 7:2 / /mnt/b rw,relatime shared:10 - xfs /dev/loop2 rw,attr2
32 22 7:2 /sub /mnt/b2 rw,relatime shared:10 - xfs /dev/loop2 rw,attr2
33 22 7:3 / /mnt/c rw - ext4 /dev/loop3 rw
34 22 7:3 / /mnt/c2 rw - ext2 /dev/loop3 rw
35 22 0:45 / /proc rw,nosuid - proc proc rw
36 22 7:4 / /mnt/with\\040space rw master:3 - btrfs /dev/loop4 rw
"""


def kdev(major: int, minor: int) -> int:
    return major << 20 | minor


def test_types_by_device(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_text(MOUNTINFO)
    assert fs_type(kdev(7, 1), f) == "ext4"
    assert fs_type(kdev(7, 2), f) == "xfs"  # mounted twice, one type
    assert fs_type(kdev(7, 4), f) == "btrfs"  # optional fields and escaped spaces before the separator
    assert fs_type(kdev(7, 3), f) is None  # two types: unknown, so the probe attaches the syscall hooks
    assert fs_type(kdev(7, 9), f) is None  # not mounted here
    assert fs_type(kdev(7, 1), tmp_path / "missing") is None
