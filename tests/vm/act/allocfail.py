"""Lab: promotion against bcache's allocator. Twice over an emptied cache (detached and re-attached) and a fresh
hot set, the promoter reads the set in one burst, faster than the allocator refills (bcache then refuses read-miss
inserts: bcache_alloc_fail); the probe counts the refusals on the cache device. First without the back-off (what
the promoter did before), then with the daemon's per-tick hook (AIMD rate, one re-read). After each, an ordinary
O_DIRECT re-read of the set: what it reads from the origin is what the promotion failed to make resident.
key=value lines on stdout."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

from labkit import drive, drop_caches, reattach_bcache, run, say, volume, write_files

from cachepilot.actions import Promote, SetKnob
from cachepilot.actuators.promote import Promoter
from cachepilot.backends import kinds
from cachepilot.backends.host import Host
from cachepilot.backends.inspect import block_name, describe_volume
from cachepilot.daemon.allocfail import pace_promotions
from cachepilot.daemon.volumes import _lower
from cachepilot.probe.hooks import BCACHE_ALLOC_FAIL
from cachepilot.probe.probe import Probe

MIB = 1 << 20
FILES = 16
RATE = 64 * MIB
# With the shipped burst (cache/1024: 256 KiB here) one promoter alone never outran the allocator in the lab (16 MiB
# at 64 MiB/s: 0 failures, 32 KiB not resident). A workload's own misses compete for the same buckets; here one
# burst of the whole set stands in for them.
BURST = FILES * MIB
TICK_S = 0.5
mnt = Path(os.environ["LAB_MOUNT"])
cached, origin = os.environ["LAB_CACHED_DEV"], os.environ["LAB_ORIGIN_DEV"]
info = describe_volume(cached)
bc = Path(f"/sys/block/{info.name}/bcache")


def origin_read() -> int:
    return int(Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()[2]) * 512


def generation(path: Path) -> int:
    import fcntl
    import struct
    with open(path, "rb") as f:
        buf = bytearray(8)
        fcntl.ioctl(f.fileno(), 0x80087601, buf, True)  # FS_IOC_GETVERSION
        return struct.unpack("=q", buf)[0] & 0xFFFFFFFF


def actions(prefix: str) -> list[Promote]:
    out = []
    for i in range(FILES):
        p = mnt / f"{prefix}{i}"
        st = os.stat(p)
        out.append(Promote(info.name, info.dev, st.st_ino, generation(p), ((0, st.st_size),), "lab: hot"))
    return out


def empty_cache() -> None:
    reattach_bcache(bc)
    drop_caches()


def promote(prefix: str, probe: Probe, lower: tuple[int, ...], paced: bool) -> None:
    """As the daemon: the promoter runs the queue, deferred work comes back; every TICK_S the pacing hook (when
    ``paced``) hears the probe's count. Reports failures, re-reads, the lowest rate, bytes and time."""
    p = Promoter(info, rate=RATE, burst=BURST, seed=7)
    if not paced:
        p.backoff = None
    v = SimpleNamespace(files=SimpleNamespace(promoter=p), found=SimpleNamespace(lower=lower), deferred=[])
    count0 = sum(probe.alloc_failures(d) for d in lower)
    todo, nbytes, low = actions(prefix), 0, p.rate
    t0 = next_tick = time.monotonic()
    while True:
        while todo or v.deferred:
            if time.monotonic() >= next_tick:
                pace_promotions([v], probe, time.monotonic_ns())  # type: ignore[list-item]
                low = min(low, p.rate)
                next_tick += TICK_S
            todo += v.deferred
            v.deferred = []
            if not todo:
                time.sleep(0.02)
                continue
            r = p.run(todo.pop(0))
            assert r.status in ("done", "pending"), r.line()
            nbytes += r.read_bytes
            if r.deferred is not None:
                todo.append(r.deferred)
                time.sleep(0.02 if not r.read_bytes else 0)
        # as the daemon, which keeps ticking once the queue is empty: refusals of the burst's last reads, after the
        # last tick (a fresh-clone run: 4 refused, the burst over in 1.08 s, none heard), are heard at the next tick
        time.sleep(max(0.0, next_tick - time.monotonic()))
        pace_promotions([v], probe, time.monotonic_ns())  # type: ignore[list-item]
        low = min(low, p.rate)
        next_tick += TICK_S
        if not v.deferred:
            break
    secs = time.monotonic() - t0
    time.sleep(1.0)  # the last inserts' failures, if any, are counted by now
    tag = "paced" if paced else "unpaced"
    say(f"{tag}_failures", sum(probe.alloc_failures(d) for d in lower) - count0)
    say(f"{tag}_promote_bytes", nbytes)
    say(f"{tag}_rereads", p.backoff.rereads_total if p.backoff else 0)
    say(f"{tag}_lowest_rate", int(low))
    say(f"{tag}_seconds", f"{secs:.2f}")


def reread(prefix: str, tag: str) -> None:
    drop_caches()
    before = origin_read()
    for i in range(FILES):
        run("dd", f"if={mnt / f'{prefix}{i}'}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
    say(f"{tag}_reread_origin_bytes", origin_read() - before)


for knob in ("congested_read_threshold_us", "congested_write_threshold_us"):
    say(f"{knob}_status", drive(volume(), SetKnob(info.name, knob, "0", "lab: promotion"))[0].status)
write_files(mnt, "a", FILES, MIB, seed=1)
write_files(mnt, "b", FILES, MIB, seed=2)
os.sync()
lower = _lower(Host(), info.name, kinds.kind(info.kind))
with Probe(max_files=1 << 12) as probe:
    say("hook", "attached" if BCACHE_ALLOC_FAIL in probe.report.attached else probe.report.summary())
    probe.watch_volume(info.dev, lower=lower)
    say("sequential_cutoff", (bc / "sequential_cutoff").read_text().strip())
    for prefix, paced in (("a", False), ("b", True)):
        empty_cache()
        o0 = origin_read()
        promote(prefix, probe, lower, paced)
        tag = "paced" if paced else "unpaced"
        say(f"{tag}_promote_origin_bytes", origin_read() - o0)
        reread(prefix, tag)
