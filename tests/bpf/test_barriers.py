"""Barriers and epoch accounting: block-level PREFLUSH/FUA and file-level fsync & co, on ext4 on a loop device."""

from __future__ import annotations

import os

import pytest
from bpf_support import LoopFs, child, collect, settle

from cachepilot.events import Barrier, BarrierKind, JournalCommit, SyncCalls
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf

WRITE_FSYNC = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
for chunk in sys.argv[2:]:
    os.write(fd, b"d" * int(chunk))
    os.fsync(fd)
print(os.fstat(fd).st_ino)
"""


def block_barriers(events: list) -> list[Barrier]:
    return [e for e in events if isinstance(e, Barrier) and e.closes_epoch]


@pytest.mark.parametrize("sizes", [[1 << 20], [4096, 12288, 300000]])
def test_fsync_epochs_carry_exactly_the_data_written(probe: Probe, watched: LoopFs, sizes: list[int]) -> None:
    path = str(watched.path("log"))
    settle(probe)
    r = child(WRITE_FSYNC, path, *map(str, sizes))
    ino = int(r.stdout)
    pages = [-(-s // 4096) * 4096 for s in sizes]  # write-back writes whole pages

    def done(evs: list) -> bool:
        return sum(b.epoch_data_bytes for b in block_barriers(evs)) >= sum(pages)

    events = collect(probe, done)
    # (a sync(2) anywhere on the host, e.g. by a test running beside this one, counts for every volume: not asserted)
    fsyncs = [e for e in probe.drain() if isinstance(e, SyncCalls) and e.kind != BarrierKind.SYNC]
    assert [(e.dev, e.kind, e.calls, e.last_ino) for e in fsyncs] == [(watched.dev, BarrierKind.FSYNC, len(sizes), ino)]
    assert fsyncs[0].last_pid > 0 and fsyncs[0].last_pid != os.getpid()
    assert not [e for e in events if isinstance(e, Barrier) and not e.closes_epoch]  # never one event per call
    blocks = block_barriers(events)
    assert blocks and all(b.dev == watched.dev and b.ino == 0 for b in blocks)
    # per fsync: the barrier it caused closes an epoch that holds exactly that fsync's data
    assert [b.epoch_data_bytes for b in blocks if b.epoch_data_bytes] == pages
    # journal commits: the commit block is PREFLUSH|FUA, and the journal/metadata bytes are accounted apart
    assert any(b.kind == BarrierKind.PREFLUSH and b.flags == 3 for b in blocks)
    assert sum(b.epoch_meta_bytes for b in blocks) > 0
    assert all(b.epoch_bytes == b.epoch_data_bytes + b.epoch_meta_bytes for b in blocks)
    vol = probe.volume_state(watched.dev)
    assert vol is not None and vol.epoch_data_bytes == 0


def test_durability_calls_are_counted_per_kind_only_when_they_succeed(probe: Probe, watched: LoopFs) -> None:
    path = str(watched.path("f"))
    settle(probe)
    r = child(
        "import os, sys, ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "os.write(fd, b'x' * 8192); os.fdatasync(fd)\n"
        "os.write(fd, b'y' * 8192)\n"
        "assert libc.sync_file_range(fd, 0, 0, 7) == 0\n"
        "assert libc.sync_file_range(fd, 0, 0, 7) == 0\n"
        "assert libc.sync_file_range(fd, -1, 0, 7) == -1\n"  # EINVAL: not counted
        "assert libc.syncfs(fd) == 0\n"
        "opath = os.open(sys.argv[1], os.O_PATH)\n"
        "assert libc.fsync(opath) == -1 and libc.fdatasync(opath) == -1\n"  # EBADF on an O_PATH fd: not counted
        "print(os.getpid(), os.fstat(fd).st_ino)",
        path,
    )
    pid, ino = map(int, r.stdout.split())
    events = collect(probe, timeout=0.3)
    assert not [e for e in events if isinstance(e, Barrier) and not e.closes_epoch]
    # (a sync(2) anywhere on the host, e.g. by a test running beside this one, counts for every volume: not asserted)
    calls = sorted((e.kind, e.calls, e.last_pid, e.last_ino) for e in probe.drain()
                   if isinstance(e, SyncCalls) and e.kind != BarrierKind.SYNC)
    assert calls == [
        (BarrierKind.FDATASYNC, 1, pid, ino),
        (BarrierKind.SYNC_FILE_RANGE, 2, pid, ino),
        (BarrierKind.SYNCFS, 1, pid, 0),
    ]
    assert not [e for e in probe.drain() if isinstance(e, SyncCalls) and e.kind != BarrierKind.SYNC]  # reported once


def test_empty_flush_and_journal_commits(probe: Probe, watched: LoopFs) -> None:
    settle(probe)
    # fsync of a file with nothing dirty but a pending inode change: a journal commit; then a bare flush via
    # BLKFLSBUF-free path: fsync on the block device issues an empty PREFLUSH
    child(
        "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY)\nos.fsync(fd)",
        watched.loopdev,
    )
    events = collect(probe, lambda evs: any(getattr(e, "kind", 0) == BarrierKind.EMPTY_FLUSH for e in evs))
    empty = [e for e in events if isinstance(e, Barrier) and e.kind == BarrierKind.EMPTY_FLUSH]
    assert empty and empty[0].dev == watched.dev and empty[0].arg == 0 and empty[0].flags & 1
    child("import os, sys\nopen(os.path.join(sys.argv[1], 'n'), 'w').close()\nos.sync()", str(watched.mount))
    commits = [e for e in collect(probe, lambda evs: any(isinstance(e, JournalCommit) for e in evs))
               if isinstance(e, JournalCommit)]
    assert commits and commits[0].dev == watched.dev and commits[0].transaction > 0
