"""What the probe promises, held exactly: max_files files in one tick are all tracked; a lone delete wakes poll(-1)."""

from __future__ import annotations

import os
import threading

import pytest
from bpf_support import LoopFs, child, settle

from cachepilot.events import Delete, HotnessDelta
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf


def test_max_files_in_one_tick_are_all_tracked(bpf_env: None, watched: LoopFs) -> None:
    n = 10000
    with Probe(max_files=n) as p:
        p.watch_volume(watched.dev)
        d = watched.path("many")
        os.mkdir(d)
        names = [os.path.join(d, str(i)) for i in range(n)]
        for name in names:
            with open(name, "wb") as f:
                f.write(b"z" * 4096)
        settle(p)
        before = p.drops().hotness_map_full
        child(
            "import mmap, os, sys\nbuf = mmap.mmap(-1, 4096)\nfor n in sorted(os.listdir(sys.argv[1])):\n"
            "    fd = os.open(os.path.join(sys.argv[1], n), os.O_RDONLY | os.O_DIRECT); os.preadv(fd, [buf], 0)\n"
            "    os.close(fd)",
            str(d),
        )
        tracked = {e.key.ino for e in p.drain() if isinstance(e, HotnessDelta) and e.read_bytes == 4096}
        assert p.drops().hotness_map_full == before
        assert tracked == {os.stat(name).st_ino for name in names}


def test_a_lone_delete_wakes_a_waiting_poll(bpf_env: None, watched: LoopFs) -> None:
    path = str(watched.path("lone"))
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    ino = os.stat(path).st_ino
    p = Probe(max_files=64)
    p.watch_volume(watched.dev)
    settle(p)
    got: list = []

    def wait() -> None:  # every poll(-1) blocks until something wakes it (a journal commit may come first)
        while not any(isinstance(e, Delete) for e in got):
            got.extend(p.poll(-1))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    child("import os, sys\nos.unlink(sys.argv[1])", path)
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "poll(-1) did not return after a delete"
    assert [e.key.ino for e in got if isinstance(e, Delete)] == [ino]
    p.close()
