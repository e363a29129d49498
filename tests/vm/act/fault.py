"""Lab: the cache device of a write-through bcache volume starts failing (dm-error under it) while files are
written and fsynced; the backend sees it and takes the volume out of the cache's path the safe way
(writethrough -> drain -> bypass). Every fsync-acknowledged file must read back intact. key=value lines."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from labkit import drive, drop_caches, intact, no_congestion_bypass, run, say, volume, write_files

from cachepilot.actions import Drain, SetWritePolicy

MIB = 1 << 20
mnt = Path(os.environ["LAB_MOUNT"])
b = volume()
name = b.info.name
no_congestion_bypass(b, "lab: the writes and reads reach the cache device that will fail")

acked: dict[str, str] = write_files(mnt, "before", 8, MIB, seed=1)
stop = threading.Event()
errors: dict[str, int] = {}


def writer() -> None:
    """Keep writing and fsyncing; a file counts as acknowledged only when its fsync returned."""
    i = 0
    while not stop.is_set():
        try:
            acked.update(write_files(mnt, f"during{i}_", 1, 256 << 10, seed=i))
        except OSError as exc:  # an error is allowed (not acknowledged); losing acknowledged data is not
            errors[exc.strerror] = errors.get(exc.strerror, 0) + 1
            time.sleep(0.05)
        i += 1


drop_caches()
s0 = b.sample(time.monotonic_ns())
say("io_errors_before", s0.io_errors)
w = threading.Thread(target=writer, daemon=True)
w.start()
time.sleep(0.5)
subprocess.run(["lab-fail-cache", "error"], check=True, capture_output=True)
t_fail = time.monotonic()
for n in list(acked)[:8]:  # reads of cached data now hit the failing device
    (mnt / n).read_bytes()
detected = ""
while time.monotonic() - t_fail < 30 and not detected:
    s = b.sample(time.monotonic_ns())
    if s.failed:
        detected = "cache detached"
    elif s.io_errors > s0.io_errors:
        detected = f"io_errors {s.io_errors}"
    time.sleep(0.1)
say("detected", detected or "no")
say("detect_seconds", f"{time.monotonic() - t_fail:.2f}")
# What the engine does on a health failure: write-through, drain, then bypass once clean.
for tag, action in (("writethrough", SetWritePolicy(name, "writethrough", "lab: cache device failing")),
                    ("drain", Drain(name, time.monotonic_ns() + 60 * 10**9, "lab: cache device failing")),
                    ("bypass", SetWritePolicy(name, "bypass", "lab: cache device failing"))):
    out, secs = drive(b, action)
    say(f"{tag}_status", out.status)
    say(f"{tag}_line", out.line())
say("mode_after", b.sample(time.monotonic_ns()).mode)
time.sleep(1)
stop.set()
w.join()
say("acked_files", len(acked))
say("writer_errors", errors)
say("dmesg", " | ".join(ln for ln in run("dmesg").splitlines() if "EXT4-fs" in ln or "bcache" in ln)[-600:])
drop_caches()
say("intact", intact(mnt, acked))
run("umount", str(mnt))
run("mount", os.environ["LAB_CACHED_DEV"], str(mnt))
say("intact_remount", intact(mnt, acked))
