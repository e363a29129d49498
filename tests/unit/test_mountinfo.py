"""fs_type: which filesystem a device is mounted as, from a mountinfo file (decides whether the probe needs the
fsync-family syscall tracepoints: ext4 counts those calls in its own hooks)."""

from __future__ import annotations

from pathlib import Path

from cachepilot.mountinfo import ProcMounts

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
    f = tmp_path / "self" / "mountinfo"
    f.parent.mkdir()
    f.write_text(MOUNTINFO)
    fs_type = ProcMounts(tmp_path).fs_type
    assert fs_type(kdev(7, 1)) == "ext4"
    assert fs_type(kdev(7, 2)) == "xfs"  # mounted twice, one type
    assert fs_type(kdev(7, 4)) == "btrfs"  # optional fields and escaped spaces before the separator
    assert fs_type(kdev(7, 3)) is None  # two types: unknown, so the probe attaches the syscall hooks
    assert fs_type(kdev(7, 9)) is None  # not mounted here
    assert ProcMounts(tmp_path / "missing").fs_type(kdev(7, 1)) is None


def test_mount_of_is_the_root_mount_with_its_discard_option(tmp_path: Path) -> None:
    """Where a volume's filesystem is mounted (the mount of its root, not a bind of a subdirectory) and whether
    with -o discard (a mount or a superblock option)."""
    f = tmp_path / "self" / "mountinfo"
    f.parent.mkdir()
    f.write_text(MOUNTINFO + "37 22 7:5 /sub /mnt/bind rw - ext4 /dev/loop5 rw\n"
                 "38 22 7:5 / /mnt/e rw,relatime - ext4 /dev/loop5 rw,discard\n")
    mounts = ProcMounts(tmp_path)
    assert mounts.mount_of(kdev(7, 4)) == ("/mnt/with space", False)
    assert mounts.mount_of(kdev(7, 5)) == ("/mnt/e", True)
    assert mounts.mount_of(kdev(7, 9)) == ("", False)
