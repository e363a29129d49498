"""Lab: discard safety under churn. A seeded random workload (create, write, truncate, punch hole, delete, fsync;
LAB_OPS operations, default 10 000) on a bcache writeback volume while a second thread discards, through the
FITRIM actuator, every extent the probe sees freed — at once, and again later after the blocks may have been
reallocated to new files (delete -> commit -> reuse -> discard of the old range). Every live file must match an
in-memory model at the end, after drop_caches and after a remount. key=value lines on stdout."""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import threading
import time
from pathlib import Path

from labkit import drive, drop_caches, no_congestion_bypass, run, say, volume

from cachepilot.actions import DiscardRanges, SetKnob, SetWritePolicy
from cachepilot.actuators.discard import Discarder
from cachepilot.actuators.extents import fiemap
from cachepilot.backends.inspect import describe_volume
from cachepilot.events import FreedExtent
from cachepilot.probe import Probe

SEED, OPS = int(os.environ.get("LAB_SEED", "9")), int(os.environ.get("LAB_OPS", "10000"))
mnt = Path(os.environ["LAB_MOUNT"]) / "churn"
mnt.mkdir()
cached = os.environ["LAB_CACHED_DEV"]
b = volume()
info = describe_volume(cached)
for knob, value in (("sequential_cutoff", "0"), ("writeback_percent", "40")):
    drive(b, SetKnob(info.name, knob, value, "lab: keep data dirty, so a wrong discard would destroy it"))
no_congestion_bypass(b, "lab: keep data dirty on a loaded host too")
drive(b, SetWritePolicy(info.name, "writeback", "lab"))

libc = ctypes.CDLL(None, use_errno=True)
PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
bs = info.fs_block_size
stop = threading.Event()
freed_all: list[tuple[int, int]] = []
stats = {"discard_calls": 0, "issued_bytes": 0, "trimmed_bytes": 0, "failed": 0, "old_rediscards": 0}


def discarder(probe: Probe) -> None:
    d = Discarder(info, max_rate=1 << 40)
    rng = random.Random(SEED + 1)  # noqa: S311
    while not stop.is_set():
        fresh = [(e.block * bs, e.count * bs) for e in probe.poll(20)
                 if isinstance(e, FreedExtent) and e.dev == info.dev and not e.metadata]
        batches = [fresh] if fresh else []
        if len(freed_all) > 8:  # old ranges again: by now many were reallocated to newer files
            batches.append(rng.sample(freed_all, 8))
            stats["old_rediscards"] += 8
        freed_all.extend(fresh)
        for ranges in batches:
            r = d.run(DiscardRanges(info.name, info.dev, tuple(ranges), "lab: churn"))
            stats["discard_calls"] += 1
            stats["issued_bytes"] += r.issued_bytes
            stats["trimmed_bytes"] += r.trimmed_bytes
            stats["failed"] += r.status == "failed"


def workload() -> dict[str, bytearray]:
    rng = random.Random(SEED)  # noqa: S311
    model: dict[str, bytearray] = {}
    counter = 0
    for _ in range(OPS):
        op = rng.random()
        names = list(model)
        if op < 0.40 or not names:  # write (creating the file if needed)
            name = rng.choice(names) if names and rng.random() < 0.5 else f"f{counter}"
            counter += 1 if name == f"f{counter}" else 0
            data = model.setdefault(name, bytearray())
            off = rng.randrange(0, min(len(data), 192 << 10) + 1)
            buf = rng.randbytes(rng.randrange(1, 64 << 10))
            fd = os.open(mnt / name, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(fd, buf, off)
            os.close(fd)
            data[len(data):off] = bytes(max(0, off - len(data)))
            data[off:off + len(buf)] = buf
        elif op < 0.55:  # truncate, shorter or longer
            name = rng.choice(names)
            size = rng.randrange(0, 256 << 10)
            os.truncate(mnt / name, size)
            data = model[name]
            del data[size:]
            data.extend(bytes(size - len(data)))
        elif op < 0.70:  # punch a block-aligned hole
            name = rng.choice(names)
            data = model[name]
            if len(data) < bs:
                continue
            off = rng.randrange(0, len(data) // bs) * bs
            n = rng.randrange(1, 16) * bs
            fd = os.open(mnt / name, os.O_WRONLY)
            if libc.fallocate(fd, PUNCH, ctypes.c_long(off), ctypes.c_long(n)):
                raise OSError(ctypes.get_errno(), "fallocate punch hole")
            os.close(fd)
            end = min(len(data), off + n)
            data[off:end] = bytes(end - off)
        elif op < 0.85:  # delete
            name = rng.choice(names)
            os.unlink(mnt / name)
            del model[name]
        else:  # fsync (the journal commits, freed blocks become trimmable)
            name = rng.choice(names)
            fd = os.open(mnt / name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return model


def check(model: dict[str, bytearray]) -> str:
    live = sorted(p.name for p in mnt.iterdir())
    if live != sorted(model):
        return f"no: files differ ({len(live)} on disk, {len(model)} in the model)"
    bad = [n for n, data in model.items()
           if hashlib.sha256((mnt / n).read_bytes()).digest() != hashlib.sha256(data).digest()]
    return "yes" if not bad else f"no: {len(bad)} files differ, e.g. {sorted(bad)[:3]}"


probe = Probe(max_files=4096, ignore_self=False)  # this process's own deletes are the ones to discard
probe.watch_volume(info.dev)
t = threading.Thread(target=discarder, args=(probe,), daemon=True)
t.start()
t0 = time.monotonic()
model = workload()
os.sync()
time.sleep(1.5)  # the last commit's frees reach the discarder
stop.set()
t.join()
say("ops", OPS)
say("workload_seconds", f"{time.monotonic() - t0:.1f}")
for k, v in stats.items():
    say(k, v)
say("freed_ranges", len(freed_all))
# Did the race happen? Old freed ranges that live files occupy now (reallocated), which were discarded again.
live_extents = []
for n in model:
    fd = os.open(mnt / n, os.O_RDONLY)
    live_extents += [(e.physical, e.physical + e.length) for e in fiemap(fd, sync=True)]
    os.close(fd)
live_extents.sort()
reused = sum(1 for s, n in freed_all if any(a < s + n and s < z for a, z in live_extents))
say("freed_ranges_now_reused", reused)
say("live_files", len(model))
say("dirty_bytes", b.sample(time.monotonic_ns()).dirty_bytes)
drop_caches()
say("intact", check(model))
run("umount", os.environ["LAB_MOUNT"])
run("mount", cached, os.environ["LAB_MOUNT"])
say("intact_remount", check(model))
probe.close()
