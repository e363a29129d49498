"""Lab: drain-and-verify write-policy switches through the backend of the lab's volume ($LAB_RECIPE), with dirty
data, then the data checked through the volume and on the origin alone (cache out of the picture)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from labkit import drive, drop_caches, intact, no_congestion_bypass, run, say, volume, write_files

from cachepilot.actions import Drain, SetKnob, SetWritePolicy
from cachepilot.engine import Engine
from cachepilot.policy import parse_policy

MIB = 1 << 20
recipe = os.environ["LAB_RECIPE"]
mnt = Path(os.environ["LAB_MOUNT"])
origin = os.environ["LAB_ORIGIN_DEV"]
b = volume()
name = b.info.name


def report(tag: str, action) -> None:
    out, secs = drive(b, action)
    say(f"{tag}_status", out.status)
    say(f"{tag}_seconds", f"{secs:.2f}")
    say(f"{tag}_line", out.line())


def dirty() -> int:
    return b.sample(time.monotonic_ns()).dirty_bytes


def delegate() -> None:
    """The bound delegated to dm-writecache (engine.nativebound), engine and backend as the daemon runs them: the
    table arguments in one reload at adoption, put back in one when a policy reload makes the model recoverable."""
    reloads: list[str] = []
    dm = b.host.dm

    def counted(args, timeout):
        if args[0] == "reload":
            reloads.append(args[-1])
        return dm(args, timeout)

    def tick(e: Engine) -> list[str]:
        s = b.sample(time.monotonic_ns())
        e.sample(s)
        return [drive(b, a)[0].line() for a in e.tick(s.ts_ns + 1) if not isinstance(a, Drain)]

    b.host = replace(b.host, dm=counted)
    say("delegate_table_before", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
    e = Engine(parse_policy(POLICY, "lab.yaml"), [b.info])
    t0 = time.monotonic()
    say("delegate_lines", " | ".join(tick(e)))
    say("delegate_seconds", f"{time.monotonic() - t0:.2f}")
    say("delegate_reloads", len(reloads))
    say("delegate_table", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
    e.set_policy(parse_policy(POLICY.replace("destructive", "recoverable"), "lab.yaml"))
    t0 = time.monotonic()
    say("putback_lines", " | ".join(tick(e)))
    say("putback_seconds", f"{time.monotonic() - t0:.2f}")
    say("putback_reloads", len(reloads) - 1)
    say("putback_table", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
    b.host = replace(b.host, dm=dm)


POLICY = "version: 1\ndefaults:\n  failure_model: destructive\n  exposure: {max_dirty: 8MiB, max_age: 30s}\n"

if recipe == "bcache":
    report("writeback", SetWritePolicy(name, "writeback", "lab: make data dirty"))
    report("cutoff", SetKnob(name, "sequential_cutoff", "0", "lab: cache sequential writes too"))
    report("percent", SetKnob(name, "writeback_percent", "40", "lab: let dirty data sit"))
    no_congestion_bypass(b, "lab: make data dirty on a loaded host")
    # As a policy with a dirty-age bound pins it: bcache sleeps this long after each full write-back scan.
    report("delay", SetKnob(name, "writeback_delay", os.environ.get("LAB_WB_DELAY", "1"), "lab: quick drains"))
    sums = write_files(mnt, "f", 16, 4 * MIB, seed=1)
elif recipe == "dmcache":
    sums = write_files(mnt, "f", 4, 4 * MIB, seed=1)
    drop_caches()
    for _ in range(3):  # smq promotes blocks it sees read repeatedly; overwrites of cached blocks are dirty
        for n in sums:
            run("dd", f"if={mnt / n}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
    sums = write_files(mnt, "f", 4, 4 * MIB, seed=2)
    os.sync()
    # A drain runs in writethrough with the cleaner from its start (under load dm-cache writes back only blocks
    # that have not been written for a while), then loads the table it found again.
    say("drain_dirty_before", dirty())
    report("drain", Drain(name, time.monotonic_ns() + 120 * 10**9, "lab: drain"))
    say("drain_dirty_after", dirty())
    say("table_after_drain", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
    sums = write_files(mnt, "f", 4, 4 * MIB, seed=3)
else:
    delegate()
    report("high_wm", SetKnob(name, "high_watermark", "90", "lab: let dirty data sit"))
    report("low_wm", SetKnob(name, "low_watermark", "80", "lab: let dirty data sit"))
    say("table", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
    sums = write_files(mnt, "f", 8, 4 * MIB, seed=1)

os.sync()
say("dirty_before", dirty())
if recipe == "writecache":
    report("switch", Drain(name, time.monotonic_ns() + 120 * 10**9, "lab: drain"))
    report("writethrough", SetWritePolicy(name, "writethrough", "lab: must be refused"))
else:
    report("switch", SetWritePolicy(name, "writethrough", "lab: drain and switch"))
    say("mode_after", b.sample(time.monotonic_ns()).mode)
say("dirty_after", dirty())
if recipe == "bcache":
    say("writeback_percent_after", Path(f"/sys/block/{name}/bcache/writeback_percent").read_text().strip())
if recipe != "writecache":
    report("bypass", SetWritePolicy(name, "bypass", "lab: bypass once clean"))
    say("mode_bypass", b.sample(time.monotonic_ns()).mode)
if recipe == "dmcache":
    say("table_after", run("dmsetup", "table", os.environ["LAB_DM_NAME"]))
drop_caches()
say("intact_volume", intact(mnt, sums))

# The cache out of the picture: what is on the origin alone must be the same data.
run("umount", str(mnt))
if recipe == "bcache":
    Path(f"/sys/block/{name}/bcache/stop").write_text("1\n")
    for _ in range(100):
        if not Path(f"/sys/block/{name}").exists():
            break
        time.sleep(0.05)
    # bcache's backing device holds the filesystem 8 KiB in (BDEV_DATA_START_DEFAULT, 16 sectors)
    run("modprobe", "loop")
    dev = run("losetup", "-r", "-o", "8192", "-f", "--show", origin)
else:
    run("dmsetup", "remove", os.environ["LAB_DM_NAME"])
    dev = origin
run("mount", "-o", "ro,noload", dev, str(mnt))
say("intact_origin", intact(mnt, sums))
