"""Every durability point is a SyncCalls of its kind: sync(2), O_SYNC / O_DSYNC / RWF_DSYNC writes, msync(MS_SYNC),
io_uring's fsync, fsync through overlayfs. Witnesses: the children's own count of calls that succeeded; fio's count."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from bpf_support import LoopFs, child, collect, make_loop_ext4, run, settle

from cachepilot.events import BarrierKind, SyncCalls
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf


def drained_sync_calls(probe: Probe) -> list[SyncCalls]:
    """Every volume's calls since the last drain (one drain takes them all)."""
    collect(probe, timeout=0.2)
    return [e for e in probe.drain() if isinstance(e, SyncCalls)]


def sync_calls(probe: Probe, dev: int) -> dict[BarrierKind, SyncCalls]:
    return {e.kind: e for e in drained_sync_calls(probe) if e.dev == dev}


IMPLICIT = """
import mmap, os, sys
path = sys.argv[1]
fd = os.open(path + ".sync", os.O_WRONLY | os.O_CREAT | os.O_SYNC)
for _ in range(3):
    os.write(fd, b"s" * 4096)
os.close(fd)
fd = os.open(path + ".dsync", os.O_WRONLY | os.O_CREAT | os.O_DSYNC)
os.pwrite(fd, b"d" * 4096, 0)
os.writev(fd, [b"d" * 4096])
os.close(fd)
fd = os.open(path + ".rwf", os.O_RDWR | os.O_CREAT)
os.pwritev(fd, [b"r" * 4096], 0, os.RWF_DSYNC)
os.pwrite(fd, b"r" * 4096, 4096)  # a plain write: not a durability point
m = mmap.mmap(fd, 8192)
m[:4] = b"mmap"
m.flush()  # msync(MS_SYNC)
m.close()
rwf_ino = os.fstat(fd).st_ino
os.close(fd)
os.sync()
print(os.getpid(), rwf_ino)
"""


def test_sync_writes_msync_and_sync_have_their_kinds(probe: Probe, watched: LoopFs) -> None:
    settle(probe)
    pid, rwf_ino = map(int, child(IMPLICIT, str(watched.path("f"))).stdout.split())
    got = sync_calls(probe, watched.dev)
    # sync(2) is a durability point of every volume, whoever calls it: a test running beside this one may add its own
    host_sync = got.pop(BarrierKind.SYNC)
    assert host_sync.calls == 1 and host_sync.last_pid == pid or host_sync.calls >= 2, host_sync
    assert {k: (v.calls, v.last_pid) for k, v in got.items()} == {
        BarrierKind.SYNC_WRITE: (6, pid),
        BarrierKind.MSYNC: (1, pid),
    }
    assert got[BarrierKind.MSYNC].last_ino == rwf_ino and host_sync.last_ino == 0


def test_io_uring_fsync_is_an_fsync(probe: Probe, watched: LoopFs) -> None:
    settle(probe)
    r = run(
        "fio", "--output-format=json", "--name=uring", f"--directory={watched.path('')}", "--rw=write", "--bs=4k",
        "--size=64k", "--ioengine=io_uring", "--fsync=1", "--end_fsync=0",
    )
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    fsyncs = job["sync"]["total_ios"]
    assert fsyncs >= 8
    got = sync_calls(probe, watched.dev)
    assert got[BarrierKind.FSYNC].calls == fsyncs, (got, fsyncs)


def test_fsync_through_overlayfs_counts_for_the_volume_below(probe: Probe, watched: LoopFs) -> None:
    base = Path(watched.path("ovl"))
    for d in ("lower", "upper", "work"):
        (base / d).mkdir(parents=True)
    merged = Path(tempfile.mkdtemp(prefix="cachepilot-ovl-"))
    run("modprobe", "overlay", check=False)
    run("mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={base / 'lower'},upperdir={base / 'upper'},workdir={base / 'work'}", str(merged))
    try:
        settle(probe)
        pid = int(child(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'o' * 8192)\n"
            "os.fsync(fd); os.fdatasync(fd); os.close(fd)\nprint(os.getpid())",
            str(merged / "file"),
        ).stdout)
        got = sync_calls(probe, watched.dev)
    finally:
        run("umount", str(merged), check=False)
        os.rmdir(merged)
    upper = os.stat(base / "upper" / "file").st_ino
    # a sync(2) anywhere on the host (another test) is a durability point of every volume: not this test's concern
    got.pop(BarrierKind.SYNC, None)
    assert {k: (v.calls, v.last_pid, v.last_ino) for k, v in got.items()} == {
        BarrierKind.FSYNC: (1, pid, upper),
        BarrierKind.FDATASYNC: (1, pid, upper),
    }


FSYNCS = """
import os, sys
path = sys.argv[1]
fd = os.open(path + ".plain", os.O_WRONLY | os.O_CREAT)
for _ in range(4):
    os.write(fd, b"p" * 4096); os.fsync(fd)
os.fdatasync(fd); os.fdatasync(fd)
os.close(fd)
fd = os.open(path + ".osync", os.O_WRONLY | os.O_CREAT | os.O_SYNC)
os.fsync(fd)  # an fsync on an O_SYNC file is an fsync, not a sync write
os.close(fd)
try:
    os.fsync(1 << 20)  # EBADF: fails before any filesystem sees it
except OSError:
    pass
print(os.getpid())
"""


def test_on_ext4_the_fsync_family_is_counted_by_ext4s_own_hooks(bpf_env: None, watched: LoopFs) -> None:
    """With only ext4 watched, the fsync syscall tracepoints (a run per fsync of every task on the host) stay
    detached; ext4's fsync hooks count every call exactly, of its kind, only those that succeed."""
    with Probe(max_files=64) as p:
        p.watch_volume(watched.dev)
        assert "other than ext4" in p.report.disabled["sys_fsync"], p.report.summary()
        assert "sys_exit_fdatasync" not in p.report.attached
        settle(p)
        pid = int(child(FSYNCS, str(watched.path("f"))).stdout)
        got = sync_calls(p, watched.dev)
        got.pop(BarrierKind.SYNC, None)  # sync(2) by a test running beside this one counts for every filesystem
        assert {k: (v.calls, v.last_pid) for k, v in got.items()} == {
            BarrierKind.FSYNC: (5, pid),
            BarrierKind.FDATASYNC: (2, pid),
        }


def test_a_non_ext4_filesystem_attaches_the_syscall_hooks_and_ext4_counts_once(bpf_env: None, watched: LoopFs) -> None:
    with Probe(max_files=64) as p, make_loop_ext4(512, fstype="xfs") as xfs:
        p.watch_volume(watched.dev)
        p.watch_volume(xfs.dev)
        assert {"sys_fsync", "sys_exit_fsync", "sys_fdatasync", "sys_exit_fdatasync"} <= set(p.report.attached)
        settle(p)
        pid = int(child(FSYNCS, str(watched.path("f"))).stdout)
        xpid = int(child(FSYNCS, str(xfs.path("f"))).stdout)
        drained = drained_sync_calls(p)
        for dev, who in ((watched.dev, pid), (xfs.dev, xpid)):
            # sync(2) by a test running beside this one counts for every watched filesystem: not this test's
            got = {e.kind: e for e in drained if e.dev == dev and e.kind != BarrierKind.SYNC}
            assert {k: (v.calls, v.last_pid) for k, v in got.items()} == {
                BarrierKind.FSYNC: (5, who),
                BarrierKind.FDATASYNC: (2, who),
            }, dev


def test_a_range_of_a_per_cpu_array_reads_as_its_elements_one_by_one(bpf_env: None) -> None:
    """MapAccess.percpu_rows (one BPF_MAP_LOOKUP_BATCH, issue 32) reads what a lookup per element reads, every CPU's
    copy, from the first element of the map and from the middle of it."""
    import ctypes as C

    from cachepilot import bpf_layout as L

    with Probe(max_files=64) as p:
        m = p._maps  # noqa: SLF001 - the map access under test
        for k in range(4, 11):
            vals = (L.cp_sync * m.ncpus)()
            for c in range(m.ncpus):
                vals[c].calls, vals[c].ts_ns = 10 * k + c, 1000 * c + k
                vals[c].last_pid, vals[c].last_ino = 7 + c, 99 + k
            assert m.h.bpf_map_update_elem(m.fds["sync_calls"], C.byref(C.c_uint32(3 * L.SYNC_KINDS + k)), vals, 0) == 0
        for first, count in ((3 * L.SYNC_KINDS + 4, 7), (0, 3), (3 * L.SYNC_KINDS, 16)):
            rows = m.percpu_rows("sync_calls", first, count, L.cp_sync)
            assert rows.shape == (count, m.ncpus)
            for i in range(count):
                one = m.percpu("sync_calls", first + i, L.cp_sync)
                assert [(c.calls, c.ts_ns, c.last_pid, c.last_ino) for c in one] == [
                    (int(r["calls"]), int(r["ts_ns"]), int(r["last_pid"]), int(r["last_ino"])) for r in rows[i]]
