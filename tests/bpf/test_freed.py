"""Freed extents (unlink, truncate, punch hole), deletes and discards, compared with FIEMAP taken before."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from bpf_support import BLOCK, LoopFs, blocks, child, collect, fiemap, ftrace_events, run, settle

from cachepilot.events import Delete, Discard, FreedExtent, JournalCommit
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf

def fragmented(fs: LoopFs, name: str | bytes, chunks: int = 8) -> str | bytes:
    """A file whose blocks are interleaved with another file's (several extents)."""
    path = fs.path(name)
    other = fs.path(f"other-{os.urandom(4).hex()}")
    with open(path, "wb") as a, open(other, "wb") as b:
        for _ in range(chunks):
            for f in (a, b):
                f.write(os.urandom(64 * 1024))
                f.flush()
                os.fsync(f.fileno())
    return path


def freed_for(events: list, ino: int, metadata: bool = False) -> list[tuple[int, int]]:
    return [
        (e.block, e.count) for e in events if isinstance(e, FreedExtent) and e.ino == ino and e.metadata == metadata
    ]


HOSTILE = [b"plain", b"new\nline\r\x1b[31m", b"\xff\xfe\xc0 invalid utf-8", b"n" * 255]


@pytest.mark.parametrize("name", HOSTILE, ids=["plain", "newline", "invalid-utf8", "255-bytes"])
def test_unlink_frees_exactly_the_extents_and_reports_the_delete(probe: Probe, watched: LoopFs, name: bytes) -> None:
    path = fragmented(watched, name)
    st = os.stat(path)
    extents = fiemap(path)
    assert extents
    settle(probe)
    child("import os, sys\nos.unlink(os.fsencode(sys.argv[1]))", os.fsdecode(path))
    events = collect(probe, lambda evs: blocks(freed_for(evs, st.st_ino)) >= blocks([(p, n) for _, p, n in extents]))
    assert blocks(freed_for(events, st.st_ino)) == blocks([(p, n) for _, p, n in extents])
    assert not freed_for(events, st.st_ino, metadata=True)  # <= 4 extents live in the inode
    deletes = [e for e in events if isinstance(e, Delete)]
    assert [(d.key.dev, d.key.ino, d.size) for d in deletes] == [(watched.dev, st.st_ino, st.st_size)]
    assert all(e.dev == watched.dev for e in events if isinstance(e, FreedExtent))
    # The journal commit that makes the blocks reusable (and trimmable) follows the frees. jbd2 may already have
    # committed while the frees were being collected; then sync has nothing left to commit.
    freed_at = max(e.ts_ns for e in events if isinstance(e, FreedExtent) and e.ino == st.st_ino)

    def commits(evs: list) -> list[JournalCommit]:
        return [e for e in evs if isinstance(e, JournalCommit) and e.dev == watched.dev and e.ts_ns >= freed_at]

    child("import os, sys\nos.sync()")
    later = collect(probe, lambda evs: bool(commits(events + evs)))
    assert commits(events + later)


UNLINK = "import os, sys\nos.unlink(sys.argv[1])\nprint(os.getpid())"


def test_freed_extents_carry_the_transaction_that_frees_them(probe: Probe, watched: LoopFs) -> None:
    """Each freed extent names its jbd2 transaction (the witness: ftrace's jbd2_handle_start of the unlinking task);
    the commit of that transaction covers it, and blocks freed after that commit belong to a later transaction."""
    a, b = fragmented(watched, "a"), fragmented(watched, "b")
    ino_a, ino_b = os.stat(a).st_ino, os.stat(b).st_ino
    settle(probe)
    with ftrace_events("jbd2", ("jbd2_handle_start", "jbd2_end_commit"), f"dev == {watched.dev}") as trace:
        pid_a = int(child(UNLINK, str(a)).stdout)
        frees_a = [e for e in collect(probe, lambda evs: bool(freed_for(evs, ino_a))) if isinstance(e, FreedExtent)]
        child("import os\nos.sync()")

        def committed(evs: list) -> list[int]:
            return [e.transaction for e in evs if isinstance(e, JournalCommit) and e.dev == watched.dev]

        tids_a = {e.tid for e in frees_a if e.ino == ino_a}
        after = collect(probe, lambda evs: bool(committed(evs)) and max(committed(evs)) >= max(tids_a))
        frees_a += [e for e in after if isinstance(e, FreedExtent)]
        pid_b = int(child(UNLINK, str(b)).stdout)
        later = collect(probe, lambda evs: bool(freed_for(evs, ino_b)))
        child("import os\nos.sync()")
        later += collect(probe, lambda evs: bool(committed(evs)) and max(committed(evs)) >= max(tids_a) + 1)
    tids_a = {e.tid for e in frees_a if e.ino == ino_a}
    tids_b = {e.tid for e in later if isinstance(e, FreedExtent) and e.ino == ino_b}
    handles = {(r.pid, int(r.fields["tid"])) for r in trace if r.event == "jbd2_handle_start"}
    assert tids_a and all(t >= 0 for t in tids_a)
    assert tids_a <= {t for p, t in handles if p == pid_a}, (tids_a, handles)
    assert tids_b <= {t for p, t in handles if p == pid_b}, (tids_b, handles)
    first_commit = min(t for t in committed(after) if t >= max(tids_a))
    assert min(tids_b) > first_commit  # T's commit does not cover the frees of a later transaction
    # the probe's commit events are the kernel's own (ftrace's jbd2_end_commit)
    witnessed = {int(r.fields["transaction"]) for r in trace if r.event == "jbd2_end_commit"}
    assert set(committed(after + later)) <= witnessed and first_commit in witnessed
    assert any(t >= max(tids_b) for t in committed(later)), "the commit covering the later frees was not seen"


def test_unlink_of_a_hard_linked_file_is_not_a_delete(probe: Probe, watched: LoopFs) -> None:
    path = str(watched.path("a"))
    with open(path, "wb") as f:
        f.write(b"x" * 8192)
    os.link(path, str(watched.path("b")))
    settle(probe)
    child("import os, sys\nos.unlink(sys.argv[1])", path)
    events = collect(probe, timeout=0.5)
    assert not [e for e in events if isinstance(e, Delete | FreedExtent)]


def test_truncate_frees_the_tail(probe: Probe, watched: LoopFs) -> None:
    path = fragmented(watched, "t")
    ino = os.stat(path).st_ino
    keep = 256 * 1024
    extents = fiemap(path)
    expect = set()
    for logical, phys, n in extents:
        for i in range(n):
            if logical + i * BLOCK >= keep:
                expect.add(phys + i)
    settle(probe)
    child("import os, sys\nos.truncate(sys.argv[1], int(sys.argv[2]))", str(path), str(keep))
    events = collect(probe, lambda evs: blocks(freed_for(evs, ino)) >= expect)
    assert expect and blocks(freed_for(events, ino)) == expect
    assert not [e for e in events if isinstance(e, Delete)]


def test_punch_hole_frees_the_range(probe: Probe, watched: LoopFs) -> None:
    path = fragmented(watched, "p")
    ino = os.stat(path).st_ino
    start, length = 192 * 1024, 320 * 1024
    extents = fiemap(path)
    expect = set()
    for logical, phys, n in extents:
        for i in range(n):
            if start <= logical + i * BLOCK < start + length:
                expect.add(phys + i)
    settle(probe)
    run("fallocate", "--punch-hole", "--offset", str(start), "--length", str(length), str(path))
    events = collect(probe, lambda evs: blocks(freed_for(evs, ino)) >= expect)
    assert expect and blocks(freed_for(events, ino)) == expect
    after = {p + i for _, p, n in fiemap(path) for i in range(n)}
    assert not (after & expect)


def test_fstrim_discards_are_seen(probe: Probe, watched: LoopFs) -> None:
    path = fragmented(watched, "gone")
    os.unlink(path)
    settle(probe)
    out = run("fstrim", "-v", str(watched.mount)).stdout
    trimmed = int(re.search(r"\((\d+) bytes\)", out).group(1))
    assert trimmed > 0

    def total(evs: list) -> int:
        return sum(e.nr_sectors * 512 for e in evs if isinstance(e, Discard) and e.dev == watched.dev)

    events = collect(probe, lambda evs: total(evs) >= trimmed)
    assert total(events) == trimmed
    vol = probe.volume_state(watched.dev)
    assert vol is not None and vol.discard_sectors * 512 >= trimmed


def test_unwatched_devices_cost_nothing(probe: Probe, watched: LoopFs) -> None:
    from bpf_support import make_loop_ext4

    with make_loop_ext4(64) as other:
        settle(probe)
        drops = probe.drops()
        path = str(other.path("x"))
        child(
            "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'u' * 65536)\n"
            "os.fsync(fd); os.close(fd); os.unlink(sys.argv[1])",
            path,
        )
        run("fstrim", str(other.mount))
        events = collect(probe, timeout=0.5) + probe.drain()
        assert [e for e in events if getattr(e, "dev", None) == other.dev] == []
        assert [e for e in events if getattr(getattr(e, "key", None), "dev", None) == other.dev] == []
        assert probe.drops() == drops


def ended(events: list, ino: int) -> list[Delete]:
    return [e for e in events if isinstance(e, Delete) and e.key.ino == ino]


def test_rename_over_a_file_is_its_end(probe: Probe, watched: LoopFs) -> None:
    victim = fragmented(watched, "victim")
    st = os.stat(victim)
    expect = blocks([(p, n) for _, p, n in fiemap(victim)])
    new = str(watched.path("new"))
    with open(new, "wb") as f:
        f.write(b"n" * 4096)
    settle(probe)
    child("import os, sys\nos.rename(sys.argv[1], sys.argv[2])", new, str(victim))
    events = collect(probe, lambda evs: bool(ended(evs, st.st_ino)) and blocks(freed_for(evs, st.st_ino)) >= expect)
    assert [(d.key.dev, d.size) for d in ended(events, st.st_ino)] == [(watched.dev, st.st_size)]
    assert blocks(freed_for(events, st.st_ino)) == expect


def test_an_o_tmpfile_never_linked_ends_at_its_last_close(probe: Probe, watched: LoopFs) -> None:
    fd = os.open(str(watched.mount if watched.workdir is None else watched.workdir), os.O_TMPFILE | os.O_RDWR)
    try:
        for _ in range(4):
            os.write(fd, os.urandom(65536))
        os.fsync(fd)
        ino = os.fstat(fd).st_ino
        expect = blocks([(p, n) for _, p, n in fiemap(f"/proc/self/fd/{fd}")])
        settle(probe)
        # a child holds the last reference: its close is the file's end (the probe ignores its own process)
        proc = subprocess.Popen([sys.executable, "-c", "import os, sys\nsys.stdin.read()\nos.close(int(sys.argv[1]))",
                                 str(fd)], pass_fds=(fd,), stdin=subprocess.PIPE)
    finally:
        os.close(fd)
    assert not ended(collect(probe, timeout=0.3), ino)
    proc.communicate(b"", timeout=10)
    events = collect(probe, lambda evs: bool(ended(evs, ino)) and blocks(freed_for(evs, ino)) >= expect)
    assert [(d.key.dev, d.size) for d in ended(events, ino)] == [(watched.dev, 4 * 65536)]
    assert expect and blocks(freed_for(events, ino)) == expect


def test_an_unlinked_open_file_ends_at_its_last_close(probe: Probe, watched: LoopFs) -> None:
    path = fragmented(watched, "open")
    st = os.stat(path)
    expect = blocks([(p, n) for _, p, n in fiemap(path)])
    settle(probe)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nos.unlink(sys.argv[1])\n"
         "print('unlinked', flush=True)\nsys.stdin.read()\nos.close(fd)", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"unlinked\n"
    early = collect(probe, timeout=0.3)
    assert not ended(early, st.st_ino) and not freed_for(early, st.st_ino)  # still open: not the end yet
    proc.communicate(b"", timeout=10)
    events = collect(probe, lambda evs: bool(ended(evs, st.st_ino)) and blocks(freed_for(evs, st.st_ino)) >= expect)
    assert [(d.key.dev, d.size) for d in ended(events, st.st_ino)] == [(watched.dev, st.st_size)]
    assert blocks(freed_for(events, st.st_ino)) == expect
