"""Lab: an LVM cache LV (recipe lvmcache) driven through cachepilot's lvmcache backend and actuators: a knob, a
drain and a write-policy switch with dirty data (every change through lvchange: LVM's metadata must say what the
table says), then promotion by reading (smq's two rounds) and a targeted discard of deleted files that reaches the
origin. key=value lines on stdout."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

from labkit import dirty_on_smq, drive, drop_caches, intact, run, say, volume, write_files

from cachepilot.actions import DiscardRanges, Drain, Promote, SetKnob, SetWritePolicy
from cachepilot.actuators.discard import Discarder
from cachepilot.actuators.extents import fiemap
from cachepilot.actuators.promote import Promoter
from cachepilot.backends.dmstatus import DmCacheStatus, parse_dm_cache_status
from cachepilot.backends.inspect import block_name

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
dm, lv, origin = os.environ["LAB_DM_NAME"], os.environ["LAB_LV"], os.environ["LAB_ORIGIN_DEV"]
b = volume()
info = b.info
name = info.name


def report(tag: str, action: SetKnob | Drain | SetWritePolicy) -> None:
    out, secs = drive(b, action)
    say(f"{tag}_status", out.status)
    say(f"{tag}_seconds", f"{secs:.2f}")
    say(f"{tag}_line", out.line())


def status() -> DmCacheStatus:
    return parse_dm_cache_status(run("dmsetup", "status", dm))


def lvs(fields: str) -> str:
    return " ".join(run("lvs", "--noheadings", "-o", fields, lv).split())


def origin_stat() -> list[int]:
    return [int(x) for x in Path(f"/sys/block/{block_name(origin)[0]}/stat").read_text().split()]


def generation(path: Path) -> int:
    with open(path, "rb") as f:
        buf = bytearray(8)
        fcntl.ioctl(f.fileno(), 0x80087601, buf, True)  # FS_IOC_GETVERSION
        return struct.unpack("=q", buf)[0] & 0xFFFFFFFF


say("kind", info.kind)
say("table_before", run("dmsetup", "table", dm))

# ---- a knob, through lvchange --cachesettings: in LVM's metadata and in the live table
report("threshold", SetKnob(name, "migration_threshold", "4096", "lab: knob"))
say("threshold_lvs", lvs("cache_settings"))

# ---- dirty data (smq caches blocks it sees read repeatedly; overwrites of cached blocks are dirty), then a drain
sums = dirty_on_smq(mnt, "f", 4, 4 * MIB)
os.sync()
say("drain_dirty_before", status().dirty_bytes)
report("drain", Drain(name, time.monotonic_ns() + 120 * 10**9, "lab: drain"))
say("drain_dirty_after", status().dirty_bytes)
say("lvs_after_drain", lvs("cache_mode,cache_policy"))

# ---- dirty again, then writeback -> writethrough: drained first, the mode changed by lvchange once clean
sums = write_files(mnt, "f", 4, 4 * MIB, seed=3)
os.sync()
say("dirty_before", status().dirty_bytes)
report("switch", SetWritePolicy(name, "writethrough", "lab: drain and switch"))
say("dirty_after", status().dirty_bytes)
say("mode_after", b.sample(time.monotonic_ns()).mode)
say("lvs_after_switch", lvs("cache_mode,cache_policy"))
say("table_after_switch", run("dmsetup", "table", dm))

# ---- bypass (passthrough, by lvchange, only from clean); files written there are not cached (smq caches blocks
# written in writethrough too), so the promotion below starts from an uncached hot set
report("bypass", SetWritePolicy(name, "bypass", "lab: bypass once clean"))
say("lvs_bypass", lvs("cache_mode,cache_policy"))
hot = write_files(mnt, "h", 4, MIB, seed=4)
os.sync()
report("writethrough", SetWritePolicy(name, "writethrough", "lab: cache reads again"))

# ---- promotion by reading: two rounds of the promoter, then an ordinary re-read
drop_caches()
acts = []
for n in sorted(hot):
    st = os.stat(mnt / n)
    acts.append(Promote(name, info.dev, st.st_ino, generation(mnt / n), ((0, st.st_size),), "lab: hot"))
say("promote_rounds", Promoter(info).rounds)
p = Promoter(info, rate=1 << 30, seed=7)
base, nbytes, todo = status().promotions, 0, list(acts)
while todo:
    r = p.run(todo.pop(0))
    assert r.status in ("done", "pending"), r.line()
    nbytes += r.read_bytes
    if r.deferred is not None:
        todo.append(r.deferred)
        time.sleep(max(0, r.not_before_ns - time.monotonic_ns()) / 1e9 if not r.read_bytes else 0)
say("promote_bytes", nbytes)
say("promote_promotions", status().promotions - base)
read0 = origin_stat()[2]
for n in sorted(hot):
    run("dd", f"if={mnt / n}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
say("reread_origin_bytes", (origin_stat()[2] - read0) * 512)

# ---- delete -> targeted discard (FITRIM of the freed ranges): dm-cache passes it down to the origin
extents = []
for n in sums:
    fd = os.open(mnt / n, os.O_RDONLY)
    try:
        extents += [(e.physical, e.length) for e in fiemap(fd, sync=True)]
    finally:
        os.close(fd)
    (mnt / n).unlink()
os.sync()  # the journal commit that frees the blocks
dead = sum(n for _, n in extents)
say("dead_bytes", dead)
disc0 = origin_stat()[13]
d = Discarder(info, max_rate=1 << 30).run(DiscardRanges(name, info.dev, tuple(sorted(extents)), "lab: deleted"))
say("discard_status", d.status)
say("discard_issued_bytes", d.issued_bytes)
say("discard_origin_bytes", (origin_stat()[13] - disc0) * 512)

# ---- the data: through the volume, and LVM still says what the table says
drop_caches()
say("intact_hot", intact(mnt, hot))
report("writeback", SetWritePolicy(name, "writeback", "lab: back to write-back"))
say("lvs_end", lvs("cache_mode,cache_policy"))
say("table_end", run("dmsetup", "table", dm))
