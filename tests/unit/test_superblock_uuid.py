"""The filesystem UUID read from the superblock is the one blkid reports (real mkfs.ext4 / mkfs.xfs images), and
anything else is left to blkid: the daemon's rescans no longer run ``blkid -p`` (about a second per rescan on a
bcache volume over a slow origin, measured by the soak)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cachepilot.backends.host import Host, ToolResult, superblock_uuid


def blkid(image: Path) -> str:
    return subprocess.run(["blkid", "-p", "-o", "value", "-s", "UUID", str(image)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("mkfs", [["mkfs.ext4", "-q", "-F"], ["mkfs.ext2", "-q", "-F"], ["mkfs.xfs", "-q", "-f"]])
def test_the_superblock_says_what_blkid_says(tmp_path: Path, mkfs: list[str]) -> None:
    image = tmp_path / "fs.img"
    with open(image, "wb") as f:
        f.truncate(320 << 20)  # sparse; XFS wants 300 MiB at least
    subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
    assert superblock_uuid(str(image)) == blkid(image) != ""


def test_anything_else_is_left_to_blkid(tmp_path: Path) -> None:
    image = tmp_path / "empty.img"
    image.write_bytes(b"\0" * 8192)
    assert superblock_uuid(str(image)) is None
    assert superblock_uuid(str(tmp_path / "missing")) is None
    asked: list[list[str]] = []

    def tool(argv: Sequence[str], timeout: float) -> ToolResult:
        asked.append(list(argv))
        return ToolResult(0, "from-blkid\n", "")

    host = Host(tool=tool)
    assert host.fs_uuid(str(image)) == "from-blkid" and asked[0][0] == "blkid"
    ext = tmp_path / "ext.img"
    with open(ext, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(ext)], check=True, capture_output=True)
    asked.clear()
    assert host.fs_uuid(str(ext)) == blkid(ext) and asked == []  # no subprocess for an ext4 volume
