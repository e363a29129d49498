"""Lab-only (run by tests/vm/test_bpf_lab.py inside the guest; not collected on the host, which has no cached
volume): events are attributed to the cached device, not only to the physical disks below it."""

from __future__ import annotations

import os
import re

import pytest
from bpf_support import LoopFs, child, collect, ftrace_bios, run, settle

from cachepilot.events import Discard, HotnessDelta, kdev_from_st_dev
from cachepilot.probe import Probe

pytestmark = pytest.mark.bpf

READ = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 65536)
for i in range(8):
    os.preadv(fd, [buf], i * 65536)
"""


def lower_devs() -> dict[str, int]:
    out = {}
    for var in ("LAB_ORIGIN_DEV", "LAB_CACHE_DEV"):
        path = os.environ.get(var)
        assert path, f"{var} not set: not in the lab"
        out[var] = kdev_from_st_dev(os.stat(path).st_rdev)
    return out


def test_io_is_attributed_to_the_cached_device(probe: Probe, watched: LoopFs) -> None:
    lower = lower_devs()
    probe.watch_volume(watched.dev, lower=lower.values())
    path = str(watched.path("attr"))
    with open(path, "wb") as f:
        f.write(os.urandom(8 * 65536))
        os.fsync(f.fileno())
    ino = os.stat(path).st_ino
    settle(probe)
    before = probe.volume_state(watched.dev)
    assert before is not None
    with ftrace_bios(lower["LAB_ORIGIN_DEV"]) as origin, ftrace_bios(lower["LAB_CACHE_DEV"]) as cache:
        child(READ, path)
    deltas = [e for e in probe.drain() if isinstance(e, HotnessDelta)]
    assert [(d.key.dev, d.key.ino, d.read_score, d.read_bytes) for d in deltas] == [
        (watched.dev, ino, 8 * 4, 8 * 65536)
    ]
    after = probe.volume_state(watched.dev)
    assert after is not None and after.data_read_bytes - before.data_read_bytes == 8 * 65536
    # the reads were served by the devices below (cache hits or misses), and nothing was attributed to them
    assert sum(origin.pieces("R")) + sum(cache.pieces("R")) >= 8 * 65536
    assert not set(lower.values()) & {d.key.dev for d in deltas}


def test_discards_on_the_volume_and_below(probe: Probe, watched: LoopFs) -> None:
    lower = lower_devs()
    probe.watch_volume(watched.dev, lower=lower.values())
    path = str(watched.path("trimme"))
    with open(path, "wb") as f:
        f.write(os.urandom(4 << 20))
        os.fsync(f.fileno())
    os.unlink(path)
    settle(probe)
    out = run("fstrim", "-v", str(watched.mount)).stdout
    trimmed = int(re.search(r"\((\d+) bytes\)", out).group(1))

    def on(dev: int, evs: list) -> int:
        return sum(e.nr_sectors * 512 for e in evs if isinstance(e, Discard) and e.dev == dev)

    events = collect(probe, lambda evs: on(watched.dev, evs) >= trimmed)
    assert trimmed > 0 and on(watched.dev, events) == trimmed
    # the cache passes (part of) the discards down: seen on the devices below, each attributed to its own device
    events += collect(probe, timeout=1.0)
    below = {name: on(dev, events) for name, dev in lower.items()}
    assert sum(below.values()) > 0, f"no discard reached the devices below the volume: {below}"
