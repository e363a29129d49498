"""Per-file inverse-bitmap hotness, measured on ext4 on a loop device, against the kernel's own ftrace of the bios."""

from __future__ import annotations

import os

import pytest
from bpf_support import LoopFs, child, ftrace_bios, run, settle

from cachepilot.events import FileKey, HotnessDelta, MetadataDelta
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf

DIRECT_READ = """
import mmap, os, sys
path, bs, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, bs)
for i in range(count):
    assert os.preadv(fd, [buf], i * bs) == bs
os.close(fd)
"""

DIRECT_WRITE = """
import mmap, os, sys
path, bs, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, bs)
buf.write(b"w" * bs)
for i in range(count):
    assert os.pwritev(fd, [buf], i * bs) == bs
os.close(fd)
"""


def make_file(fs: LoopFs, name: str, size: int) -> tuple[str, FileKey]:
    path = str(fs.path(name))
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    st = os.stat(path)
    return path, FileKey(fs.dev, st.st_ino, _generation(path))


def _generation(path: str) -> int:
    import fcntl
    import struct

    fd = os.open(path, os.O_RDONLY)
    try:
        buf = fcntl.ioctl(fd, 0x80087601, b"\0" * 8)  # FS_IOC_GETVERSION (long)
        return struct.unpack("<q", buf)[0] & 0xFFFFFFFF
    finally:
        os.close(fd)


def file_delta(probe: Probe, key: FileKey) -> HotnessDelta:
    deltas = [e for e in probe.drain() if isinstance(e, HotnessDelta) and e.key == key]
    assert deltas, f"no hotness recorded for {key}"
    return HotnessDelta(
        key,
        sum(d.read_score for d in deltas),
        sum(d.write_score for d in deltas),
        sum(d.read_bytes for d in deltas),
        sum(d.write_bytes for d in deltas),
        max(d.last_access_ns for d in deltas),
        deltas[-1].size,
    )


@pytest.mark.parametrize(("bs", "per_bio"), [(4096, 64), (65536, 4), (1 << 20, 1)])
def test_direct_reads_add_inverse_bitmap_per_bio(probe: Probe, watched: LoopFs, bs: int, per_bio: int) -> None:
    count = 6
    path, key = make_file(watched, "data", count * bs)
    settle(probe)
    with ftrace_bios(watched.dev) as trace:
        child(DIRECT_READ, path, str(bs), str(count))
    d = file_delta(probe, key)
    pieces = trace.pieces("R")
    assert sum(pieces) == count * bs, f"ftrace saw {pieces}"
    # exactly what the kernel did: one b per piece the block layer sent
    assert d.read_score == trace.score("R")
    if pieces == [bs] * count:  # no split: the numbers
        assert d.read_score == per_bio * count
    assert d.read_bytes == count * bs
    assert d.write_score == 0 and d.write_bytes == 0
    assert d.size == count * bs
    assert d.last_access_ns > 0


def test_direct_writes_count_as_writes(probe: Probe, watched: LoopFs) -> None:
    path, key = make_file(watched, "data", 8 * 4096)
    settle(probe)
    with ftrace_bios(watched.dev) as trace:
        child(DIRECT_WRITE, path, "4096", "8")
    d = file_delta(probe, key)
    assert trace.pieces("W").count(4096) >= 8
    assert d.write_score == 8 * 64
    assert d.write_bytes == 8 * 4096
    assert d.read_score == 0


def test_buffered_read_misses_and_readahead(probe: Probe, watched: LoopFs) -> None:
    size = 2 << 20
    path, key = make_file(watched, "data", size)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    settle(probe)
    with ftrace_bios(watched.dev) as trace:
        child("import sys; f = open(sys.argv[1], 'rb'); assert len(f.read()) == int(sys.argv[2])", path, str(size))
    d = file_delta(probe, key)
    assert d.read_bytes == size == sum(trace.pieces("R"))
    assert d.read_score == trace.score("R")


def test_buffered_writeback_counted_for_the_file(probe: Probe, watched: LoopFs) -> None:
    path, key = make_file(watched, "data", 4096)
    settle(probe)
    size = (1 << 20) + 3 * 4096
    with ftrace_bios(watched.dev) as trace:
        child(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)\n"
            "os.write(fd, b'x' * int(sys.argv[2])); os.fsync(fd)",
            path,
            str(size),
        )
    d = file_delta(probe, key)
    assert d.write_bytes == size
    # the file's bios are the data writes the witness saw minus journal/metadata: check the score is one of the
    # decompositions of `size` the kernel used (every data piece counts on its own)
    assert d.write_score >= 1 and d.write_score <= trace.score("W")
    events = probe.drain()
    assert not [e for e in events if isinstance(e, HotnessDelta)]


def test_metadata_goes_to_the_volume_bucket(probe: Probe, watched: LoopFs) -> None:
    settle(probe)
    child(
        "import os, sys\nfor i in range(50):\n    open(os.path.join(sys.argv[1], f'f{i}'), 'w').close()\n"
        "os.sync()",
        str(watched.workdir or watched.mount),
    )
    events = probe.drain()
    meta = [e for e in events if isinstance(e, MetadataDelta) and e.dev == watched.dev]
    assert meta and meta[0].bytes > 0 and meta[0].score > 0
    assert not [e for e in events if isinstance(e, HotnessDelta)]  # empty files: no data I/O


def test_own_process_is_ignored(probe: Probe, watched: LoopFs) -> None:
    import mmap

    path, key = make_file(watched, "data", 4 * 4096)
    settle(probe)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    for i in range(4):
        os.preadv(fd, [buf], i * 4096)
    os.close(fd)
    assert not [e for e in probe.drain() if isinstance(e, HotnessDelta) and e.key == key]
    child(DIRECT_READ, path, "4096", "4")
    assert file_delta(probe, key).read_score == 4 * 64


def test_syscall_fallback_for_direct_io(bpf_env: None, watched: LoopFs) -> None:
    """With the syscall hooks as the direct-I/O marks, the numbers are the same. iomap's own direct-I/O bios name their
    file (bi_private), so the marks are kept for clones below stacked filesystems and wait for one."""
    with Probe(max_files=1024, dio_hook="syscalls") as p:
        assert p.report.dio_hook == "syscalls"
        assert "sys_dio_pread64" in p.report.disabled and "on_dio_begin" not in p.report.attached
        assert "stacked" in p.report.disabled["sys_dio_pread64"]
        p.watch_volume(watched.dev)
        path, key = make_file(watched, "fallback", 4 * 65536)
        settle(p)
        child(DIRECT_READ, path, "4096", "5")
        child(DIRECT_READ, path, "65536", "4")
        d = file_delta(p, key)
        assert d.read_score == 5 * 64 + 4 * 4
        assert d.read_bytes == 5 * 4096 + 4 * 65536


def test_table_full_is_counted(bpf_env: None, watched: LoopFs) -> None:
    with Probe(max_files=16, dio_hook="auto") as p:
        p.watch_volume(watched.dev)
        names = [str(watched.path(f"f{i}")) for i in range(150)]
        for n in names:
            with open(n, "wb") as f:
                f.write(b"z" * 4096)
        settle(p)
        before = p.drops().hotness_map_full
        child(
            "import mmap, os, sys\nbuf = mmap.mmap(-1, 4096)\nfor n in sys.argv[1:]:\n"
            "    fd = os.open(n, os.O_RDONLY | os.O_DIRECT); os.preadv(fd, [buf], 0); os.close(fd)",
            *names,
        )
        events = p.drain()
        tracked = [e for e in events if isinstance(e, HotnessDelta)]
        dropped = p.drops().hotness_map_full - before
        assert len(tracked) <= p.nslots
        assert dropped > 0
        assert len(tracked) + dropped == len(names)
        assert sum(e.read_score for e in tracked) == 64 * len(tracked)


def test_split_bios_count_per_piece(probe: Probe, watched: LoopFs) -> None:
    """With max_sectors_kb = 128 the block layer splits each 1 MiB direct read into 8 pieces of 128 KiB: b = 2 each."""
    name = os.path.basename(os.path.realpath(watched.loopdev))
    limit = f"/sys/block/{name}/queue/max_sectors_kb"
    old = open(limit).read().strip()
    path, key = make_file(watched, "big", 2 << 20)
    settle(probe)
    try:
        with open(limit, "w") as f:
            f.write("128\n")
        with ftrace_bios(watched.dev) as trace:
            child(DIRECT_READ, path, str(1 << 20), "2")
    finally:
        with open(limit, "w") as f:
            f.write(old + "\n")
    assert trace.pieces("R") == [128 * 1024] * 16, trace
    assert len(trace.splits) == 14  # 7 splits per bio; the last piece is the remainder
    d = file_delta(probe, key)
    assert d.read_score == 16 * 2 == trace.score("R")
    assert d.read_bytes == 2 << 20


def test_drain_as_numpy_records_for_the_models(probe: Probe, watched: LoopFs) -> None:
    path, key = make_file(watched, "arr", 4 * 65536)
    settle(probe)
    child(DIRECT_READ, path, "65536", "4")
    rec = probe.drain_hotness_array()
    mine = rec[(rec["ino"] == key.ino) & (rec["dev"] == key.dev)]
    assert len(mine) == 1
    r = mine[0]
    assert (int(r["gen"]), int(r["rs"]), int(r["ws"]), int(r["rb"]), int(r["wb"]), int(r["size"])) == (
        key.gen, 4 * 4, 0, 4 * 65536, 0, 4 * 65536
    )
    assert int(r["last"]) > 0
    assert len(probe.drain_hotness_array()) == 0  # drained means reset


def test_page_cache_hits_do_not_count(probe: Probe, watched: LoopFs) -> None:
    """Only I/O that reaches the volume below the page cache counts: re-reading a cached file adds nothing."""
    path, key = make_file(watched, "cached", 256 * 1024)
    child("import sys; open(sys.argv[1], 'rb').read()", path)  # now fully in the page cache
    settle(probe)
    child("import sys\nfor _ in range(20): open(sys.argv[1], 'rb').read()", path)
    assert not [e for e in probe.drain() if isinstance(e, HotnessDelta) and e.key == key]


def test_metadata_read_by_a_direct_io_task_is_not_the_file(probe: Probe, watched: LoopFs) -> None:
    """A task that did direct I/O and then reads metadata (cold inode tables): the metadata goes to the volume's
    bucket, the file only gets its own direct reads."""
    path, key = make_file(watched, "dio", 4 * 4096)
    names = [str(watched.path(f"m{i}")) for i in range(200)]
    for n in names:
        open(n, "w").close()
    listing = str(watched.path("list"))
    with open(listing, "w") as f:
        f.write("\n".join(names))
    os.sync()
    run("umount", str(watched.mount))  # cold caches: the stats below must read inode tables from the device
    run("mount", "-t", "ext4", watched.loopdev, str(watched.mount))
    settle(probe)
    before = probe.volume_state(watched.dev)
    stat_after = DIRECT_READ + "for n in open(sys.argv[4]).read().split():\n    os.stat(n)\n"
    child(stat_after, path, "4096", "4", listing)
    d = file_delta(probe, key)
    assert d.read_score == 4 * 64 and d.read_bytes == 4 * 4096
    after = probe.volume_state(watched.dev)
    assert before is not None and after is not None and after.meta_bytes > before.meta_bytes


def test_cold_directory_listing_after_direct_io_is_metadata(probe: Probe, watched: LoopFs) -> None:
    """Directory and inode-table read-ahead (block-device pages, no REQ_META) after a task's direct I/O is the
    volume's metadata, not the file's: the file gets exactly its 4 direct reads of 4 KiB."""
    path, key = make_file(watched, "dio", 4 * 4096)
    d = watched.path("many")
    os.mkdir(d)
    for i in range(3000):
        open(os.path.join(d, f"{i:06d}-{'n' * 40}"), "w").close()
    os.sync()
    run("umount", str(watched.mount))  # cold caches: the listing below reads directory blocks and inode tables
    run("mount", "-t", "ext4", watched.loopdev, str(watched.mount))
    settle(probe)
    before = probe.volume_state(watched.dev)
    listing = DIRECT_READ + "for e in os.scandir(sys.argv[4]):\n    e.stat()\n"
    child(listing, path, "4096", "4", str(d))
    delta = file_delta(probe, key)
    assert (delta.read_score, delta.read_bytes) == (4 * 64, 4 * 4096)
    after = probe.volume_state(watched.dev)
    assert before is not None and after is not None and after.meta_bytes - before.meta_bytes >= 64 * 1024


def test_raw_device_direct_read_after_a_files_direct_io_is_not_the_file(probe: Probe, watched: LoopFs) -> None:
    path, key = make_file(watched, "dio", 4 * 4096)
    settle(probe)
    before = probe.volume_state(watched.dev)
    raw = DIRECT_READ + (
        "fd = os.open(sys.argv[4], os.O_RDONLY | os.O_DIRECT)\nos.preadv(fd, [mmap.mmap(-1, 65536)], 1 << 20)\n"
    )
    child(raw, path, "4096", "4", watched.loopdev)
    delta = file_delta(probe, key)
    assert (delta.read_score, delta.read_bytes) == (4 * 64, 4 * 4096)
    after = probe.volume_state(watched.dev)
    assert before is not None and after is not None and after.meta_bytes - before.meta_bytes >= 65536
