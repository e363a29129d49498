"""XFS: freed extents come from its deferred-free intents (no ext4 tracepoints); the block hooks work unchanged."""

from __future__ import annotations

import os

import pytest
from bpf_support import blocks, child, collect, fiemap, make_loop_ext4, settle

from cachepilot.events import FreedExtent, HotnessDelta
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf


def test_xfs_unlink_reports_the_freed_extents(probe: Probe) -> None:
    with make_loop_ext4(512, fstype="xfs") as fs:
        probe.watch_volume(fs.dev)
        try:
            path = str(fs.path("f"))
            other = str(fs.path("g"))
            with open(path, "wb") as a, open(other, "wb") as b:
                for _ in range(6):
                    for f in (a, b):
                        f.write(os.urandom(64 * 1024))
                        f.flush()
                        os.fsync(f.fileno())
            st = os.stat(path)
            expect = blocks([(p, n) for _, p, n in fiemap(path)])
            settle(probe)
            child("import os, sys\nos.unlink(sys.argv[1])\nos.sync()", path)

            def freed(evs: list) -> set[int]:
                return blocks([(e.block, e.count) for e in evs if isinstance(e, FreedExtent) and e.dev == fs.dev
                               and not e.metadata])

            events = collect(probe, lambda evs: freed(evs) >= expect, timeout=10)
            assert freed(events) == expect
            assert {e.ino for e in events if isinstance(e, FreedExtent)} <= {st.st_ino, 0}
            # the block-level hooks do not care about the filesystem
            settle(probe)
            child("import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nos.posix_fadvise(fd, 0, 0, 4)\n"
                  "os.read(fd, 1 << 20)", other)
            hot = [e for e in probe.drain() if isinstance(e, HotnessDelta) and e.key.ino == os.stat(other).st_ino]
            assert hot and hot[0].key.dev == fs.dev and hot[0].read_bytes == 6 * 64 * 1024
        finally:
            probe.unwatch(fs.dev)
