"""safeio: the one way cachepilot opens the files it is given. Every refusal is a UserError of one line naming the
file and what is wrong, made without blocking and without reading more than the cap."""

from __future__ import annotations

import errno
import io
import os
import resource
import time
from pathlib import Path

import pytest

from cachepilot.errors import UserError
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.volume import VolumeInfo
from cachepilot.safeio import NoSuchFile, open_input, read_capped, read_text
from cachepilot.trace import Tick, TraceReader, TraceWriter
from cachepilot.trace.format import BLOCK

CAP = 1 << 20


def _refused(path: Path | str, *words: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(UserError) as ei:
        read_capped(path, "thing", CAP)
    assert time.monotonic() - t0 < 1.0
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for w in words:
        assert w in msg, msg
    return msg


def test_a_regular_file_up_to_the_cap_reads_whole(tmp_path: Path) -> None:
    f = tmp_path / "ok"
    f.write_bytes(b"x" * CAP)
    assert read_capped(f, "thing", CAP) == b"x" * CAP
    f.write_text("héllo")
    assert read_text(f, "thing", CAP) == "héllo"
    f.write_bytes(b"x" * (CAP + 1))
    _refused(f, f"thing of {CAP + 1} bytes, larger than 1 MiB")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    f = tmp_path / "fifo"
    os.mkfifo(f)
    _refused(f, "cannot read thing: a FIFO or pipe, not a regular file")


def test_character_devices_directly_or_through_a_symlink(tmp_path: Path) -> None:
    _refused("/dev/zero", "a character device, not a regular file")
    _refused("/dev/null", "a character device")
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    _refused(link, "a character device")


def test_a_sparse_huge_file_is_refused_before_any_read(tmp_path: Path) -> None:
    f = tmp_path / "sparse"
    f.write_bytes(b"")
    os.truncate(f, 5 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _refused(f, "thing of 5368709120 bytes, larger than 1 MiB")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: nothing was read


def test_a_directory_a_missing_file_and_a_bad_path(tmp_path: Path) -> None:
    _refused(tmp_path, "a directory, not a regular file")
    with pytest.raises(NoSuchFile, match="no such thing"):
        read_capped(tmp_path / "nope", "thing", CAP)
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file" / "x", "cannot read thing: Not a directory")


def test_not_utf8_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bin"
    f.write_bytes(b"ok\xff\xfe")
    with pytest.raises(UserError, match=r"cannot read thing: not UTF-8 \(invalid start byte at byte 2\)"):
        read_text(f, "thing", CAP)


def test_a_stream_is_accepted_only_where_asked_for(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.write(w, b"data")
    os.close(w)
    f, stream = open_input(f"/proc/self/fd/{r}", "trace", stream=True)
    with f:
        assert stream and f.read() == b"data"
    os.close(r)
    g = tmp_path / "t"
    g.write_bytes(b"x")
    f, stream = open_input(g, "trace", stream=True)
    f.close()
    assert not stream


class _FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, room: int) -> None:
        self.room, self.data = room, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        if len(self.data) + len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.data += b
        return len(b)


def test_a_full_disk_mid_trace_is_one_line_and_leaves_complete_blocks(tmp_path: Path) -> None:
    dev = kdev(252, 0)
    vol = VolumeInfo(dev=dev, name="bcache0")
    full = _FullDisk(4096)
    full.name = "full.cptrace"  # type: ignore[attr-defined]
    with pytest.raises(UserError, match=r"^full.cptrace: cannot write trace: No space left on device$"):
        with TraceWriter(full, [vol]) as w:  # type: ignore[arg-type]
            for i in range(100_000):
                w.write(HotnessDelta(FileKey(dev, i, 0), 64, 0, 4096, 0, i, 4096))
                w.write(Tick(i + 1))
    assert w.failed
    f = tmp_path / "t.cptrace"
    f.write_bytes(bytes(full.data))  # what reached the disk: whole blocks (each one write), no END
    r = TraceReader(f)
    n = sum(1 for _ in r.events())
    assert n > 10 and r.cut is not None and "no END block" in r.cut
    assert len(full.data) > BLOCK.size
