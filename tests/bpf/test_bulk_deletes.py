"""Deletes aggregated in the kernel (issue 32 item 2): with bulk_deletes the probe's "deletes" map holds every file's
end until take_deletes() takes them all at once as an array; the ring carries none, unless the map is full, and then
it carries exactly those the map could not hold."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Iterator

import pytest
from bpf_support import SLOW, LoopFs, child

from cachepilot.events import Delete
from cachepilot.probe import hooks
from cachepilot.probe.probe import Probe

pytestmark = pytest.mark.bpf
FILES = 200


def generation(path: str) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return struct.unpack("l", fcntl.ioctl(fd, 0x80087601, b"\0" * 8))[0]  # FS_IOC_GETVERSION
    finally:
        os.close(fd)


def make_files(fs: LoopFs, n: int) -> dict[int, tuple[int, int]]:
    """n files of 4..(4+n) KiB on fs, on disk; ino -> (gen, size)."""
    out = {}
    for i in range(n):
        p = str(fs.path(f"f{i}"))
        with open(p, "wb") as f:
            f.write(b"d" * (4096 * (1 + i % 4) + i))
        out[os.stat(p).st_ino] = (generation(p), os.stat(p).st_size)
    os.sync()
    return out


def unlink_all(fs: LoopFs, n: int) -> None:
    child("import os, sys\nfor i in range(int(sys.argv[2])): os.unlink(os.path.join(sys.argv[1], f'f{i}'))",
          str(fs.path("")), str(n))


def ring_deletes(p: Probe, dev: int, seconds: float) -> list[Delete]:
    got: list[Delete] = []
    deadline = time.monotonic() + seconds * SLOW
    while time.monotonic() < deadline:
        got += [e for e in p.poll(50) if isinstance(e, Delete) and e.key.dev == dev]
    return got


@pytest.fixture
def bulk(bpf_env: None, loopfs: LoopFs) -> Iterator[Probe]:
    with Probe(max_files=1 << 12, bulk_deletes=True) as p:
        p.watch_volume(loopfs.dev)
        p.poll(0)
        p.take_deletes()
        yield p


def test_every_delete_is_taken_in_bulk_and_none_crosses_the_ring(bulk: Probe, loopfs: LoopFs) -> None:
    files = make_files(loopfs, FILES)
    bulk.poll(0)
    bulk.take_deletes()
    unlink_all(loopfs, FILES)
    assert ring_deletes(bulk, loopfs.dev, 1.0) == []  # one ring record per file was the cost (issue 32)
    arr = bulk.take_deletes()
    mine = arr[arr["dev"] == loopfs.dev]
    assert {int(r["ino"]): (int(r["gen"]), int(r["size"])) for r in mine} == files
    assert len(mine) == FILES
    assert (mine["ts_ns"][1:] >= mine["ts_ns"][:-1]).all()  # oldest first
    assert len(bulk.take_deletes()) == 0  # taken means removed from the map
    assert not bulk.drops_by_volume()


def test_a_full_map_leaves_the_rest_to_the_ring_and_loses_none(bpf_env: None, loopfs: LoopFs,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "DELETE_ENTRIES", 64)  # the table sizes the map, the probe reads its size
    files = make_files(loopfs, FILES)
    with Probe(max_files=1 << 12, bulk_deletes=True) as p:
        p.watch_volume(loopfs.dev)
        p.poll(0)
        unlink_all(loopfs, FILES)
        ring = ring_deletes(p, loopfs.dev, 1.0)
        arr = p.take_deletes()
    taken = {int(i) for i in arr["ino"][arr["dev"] == loopfs.dev]}
    by_ring = {e.key.ino for e in ring}
    assert len(taken) == 64 and len(by_ring) == FILES - 64
    assert taken | by_ring == set(files) and not taken & by_ring


def test_without_bulk_deletes_the_ring_carries_them_and_the_map_stays_empty(probe: Probe, watched: LoopFs) -> None:
    files = make_files(watched, 8)
    probe.poll(0)
    unlink_all(watched, 8)
    assert {e.key.ino for e in ring_deletes(probe, watched.dev, 1.0)} == set(files)
    assert len(probe.take_deletes()) == 0
