"""Lab: delete -> discard through the real chain (probe -> freed-extent queue -> FITRIM actuator) on the lab's
volume. bcache writeback: the deleted files' dirty data is dropped and never reaches the origin. dm-cache
(LAB_RECIPE=dmcache): the discard lands, but the cached dirty copies stay (dm-cache only sets discard bits).
key=value lines on stdout."""

from __future__ import annotations

import mmap
import os
import subprocess
import threading
import time
from pathlib import Path

from labkit import drive, drop_caches, intact, no_congestion_bypass, run, say, volume, write_files

from cachepilot.actions import DiscardRanges, SetKnob, SetWritePolicy
from cachepilot.actuators.discard import Discarder
from cachepilot.actuators.extents import fiemap
from cachepilot.backends.inspect import block_name, describe_volume
from cachepilot.events import Discard, FreedExtent, JournalCommit
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.probe import Probe

MIB = 1 << 20
recipe = os.environ["LAB_RECIPE"]
mnt = Path(os.environ["LAB_MOUNT"])
cached, origin = os.environ["LAB_CACHED_DEV"], os.environ["LAB_ORIGIN_DEV"]
b = volume()
info = describe_volume(cached)
name = b.info.name


def diskstat(dev: str) -> list[int]:
    return [int(x) for x in Path(f"/sys/block/{block_name(dev)[0]}/stat").read_text().split()]


def written(dev: str) -> int:
    return diskstat(dev)[6] * 512  # write sectors (discards are counted apart)


def discarded(dev: str) -> int:
    return diskstat(dev)[13] * 512


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, n in sorted(ranges):
        if out and s <= out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], s + n - out[-1][0]))
        else:
            out.append((s, n))
    return out


def extents_of(path: Path) -> list[tuple[int, int]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return [(e.physical, e.length) for e in fiemap(fd, sync=True)]
    finally:
        os.close(fd)


def dirty() -> int:
    return b.sample(time.monotonic_ns()).dirty_bytes


def keep_busy(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    while not stop_busy.is_set():
        os.preadv(fd, [buf], 0)
        time.sleep(0.1)
    os.close(fd)


stop_busy = threading.Event()
busy = threading.Thread(target=lambda: keep_busy(mnt / "keep0"), daemon=True)


def dm_status() -> str:
    return run("dmsetup", "status", os.environ["LAB_DM_NAME"])


if recipe == "bcache":
    for knob, value in (("sequential_cutoff", "0"), ("writeback_percent", "40")):
        drive(b, SetKnob(name, knob, value, "lab: keep written data dirty"))
    no_congestion_bypass(b, "lab: keep written data dirty on a loaded host")
    drive(b, SetWritePolicy(name, "writeback", "lab"))

probe = Probe(max_files=4096)
probe.watch_volume(info.dev, lower=[block_name(origin)[1], block_name(os.environ["LAB_CACHE_DEV"])[1]])
origin_written0 = written(origin)
keep = write_files(mnt, "keep", 8, MIB, seed=1)
if recipe == "bcache":
    dead = write_files(mnt, "dead", 8, 2 * MIB, seed=2)
else:  # dm-cache: promote by reading three times, then overwrite: the cached copies become dirty
    dead = write_files(mnt, "dead", 4, 4 * MIB, seed=2)
    drop_caches()
    for _ in range(3):
        for n in dead:
            run("dd", f"if={mnt / n}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
    # dm-cache writes dirty blocks back as soon as it has been idle for a second, or while busy within
    # migration_threshold: keep it busy (small reads) and the threshold below one block, so the dirty copies
    # stay for the duration of the test.
    drive(b, SetKnob(name, "migration_threshold", "1", "lab: hold dirty blocks"))
    busy.start()
    dead = write_files(mnt, "dead", 4, 4 * MIB, seed=3)
os.sync()
time.sleep(1)
dead_bytes = sum((mnt / n).stat().st_size for n in dead)
extents = merged([e for n in dead for e in extents_of(mnt / n)])
say("dead_bytes", dead_bytes)
say("fiemap_bytes", sum(n for _, n in extents))
probe.poll(0)
dirty0 = dirty()
say("dirty_before", dirty0)
if recipe == "dmcache":
    say("status_before", dm_status())
vol_discard0 = discarded(cached)

# Delete (another process: the probe ignores its own), let the journal commit, feed the queue as the daemon does.
t_rm = time.monotonic_ns()
subprocess.run(["rm", *[str(mnt / n) for n in dead]], check=True)
queue = FreedExtentQueue()
freed: list[tuple[int, int]] = []
commit_ns = issued_ns = first_landed_ns = last_landed_ns = 0
landed = 0
bs = info.fs_block_size
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    for ev in probe.poll(100):
        if isinstance(ev, FreedExtent) and ev.dev == info.dev and not ev.metadata:
            queue.freed(ev.block, ev.count, ev.ts_ns, ev.tid)
            freed.append((ev.block * bs, ev.count * bs))
        elif isinstance(ev, JournalCommit) and ev.dev == info.dev and queue.pending:
            queue.commit(ev.transaction, ev.ts_ns)
            commit_ns = commit_ns or ev.ts_ns
        elif isinstance(ev, Discard) and ev.dev == info.dev and issued_ns:
            landed += ev.nr_sectors * 512
            first_landed_ns = first_landed_ns or ev.ts_ns
            last_landed_ns = ev.ts_ns
    ranges = queue.take(time.monotonic_ns())
    if ranges:
        action = DiscardRanges(name, info.dev, tuple((s * bs, n * bs) for s, n in ranges), "lab: deleted files")
        issued_ns = time.monotonic_ns()
        r = Discarder(info).run(action)
        say("discard_line", r.line())
        say("issued_bytes", r.issued_bytes)
        say("trimmed_bytes", r.trimmed_bytes)
    if landed and time.monotonic_ns() - last_landed_ns > 1_000_000_000:
        break
say("freed_equals_fiemap", "yes" if merged(freed) == extents else f"no: {merged(freed)[:3]} vs {extents[:3]}")
say("landed_probe_bytes", landed)
say("landed_diskstat_bytes", discarded(cached) - vol_discard0)
say("rm_to_commit_ms", (commit_ns - t_rm) // 1_000_000 if commit_ns else -1)
say("commit_to_first_landed_ms", (first_landed_ns - commit_ns) // 1_000_000 if first_landed_ns else -1)
say("commit_to_last_landed_ms", (last_landed_ns - commit_ns) // 1_000_000 if last_landed_ns else -1)
time.sleep(1)
say("dirty_after", dirty())
if recipe == "dmcache":
    say("status_after", dm_status())
    stop_busy.set()
    busy.join()

drop_caches()
say("keep_intact", intact(mnt, keep))
if recipe == "bcache":
    # Everything still dirty goes to the origin now; the deleted files' bytes must not be among it.
    drive(b, SetWritePolicy(name, "writethrough", "lab: drain"))
    say("dirty_drained", dirty())
    say("origin_written_bytes", written(origin) - origin_written0)
run("umount", str(mnt))
run("mount", cached, str(mnt))
say("keep_intact_remount", intact(mnt, keep))
probe.close()
