"""Lab probe behind FAILURE_COMMIT_S (docs/operate.md, "A failed dm-cache cache device"): what a committing status
read costs an idle dm-cache, and when a dead cache device shows in its status. Not a test: run by hand,

    flock /tmp/cp-lab-B.lock tests/vm/lab run --recipe none -- .venv/bin/python tests/vm/lifecycle/commitcost.py

key=value lines on stdout. Two dm-caches on loop devices (loopvols.dmcache's layout, metadata and data on one
device): writes to the metadata device counted from /sys/block/dm-N/stat while idle with no status read, with
``dmsetup status --noflush`` each second, and with ``dmsetup status`` (which commits) each second; then one volume
loses both devices and the other its data device only, I/O fails on both, and the status is read without and then
with a commit."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "act"))  # tests/vm/act: the lab helpers
from labkit import dirty_on_smq, run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vm: the guest scripts' helpers
from guestkit import say  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopvols  # noqa: E402

WINDOW_S = 20


def kname(dm_name: str) -> str:
    return next(p.parent.parent.name for p in Path("/sys/block").glob("dm-*/dm/name")
                if p.read_text().strip() == dm_name)


def writes(dev: str) -> tuple[int, int]:
    """Write requests and sectors written (a dm device counts an empty flush as a write of 0 sectors)."""
    f = Path(f"/sys/block/{dev}/stat").read_text().split()
    return int(f[4]), int(f[6])


def window(name: str, meta: str, each_second: Callable[[], object] | None) -> None:
    w0, s0 = writes(meta)
    calls, end = 0, time.monotonic() + WINDOW_S
    while time.monotonic() < end:
        if each_second is not None:
            each_second()
            calls += 1
        time.sleep(1)
    w1, s1 = writes(meta)
    say(f"{name}_calls", calls)
    say(f"{name}_meta_writes", w1 - w0)
    say(f"{name}_meta_sectors", s1 - s0)


def io_fails(mount: Path) -> None:
    """A direct write with fsync and a read of a file smq holds dirty: both meet the dead device."""
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'h'}", "bs=64k", "count=4", "oflag=direct", "conv=fsync"],
                   capture_output=True, timeout=60, check=False)
    subprocess.run(["dd", f"if={mount / 'f0'}", "of=/dev/null", "bs=64k", "iflag=direct"], capture_output=True,
                   timeout=60, check=False)


def main() -> None:
    subprocess.run(["modprobe", "-a", "loop", "dm-cache", "dm-cache-smq"], check=False)
    tmp = Path(tempfile.mkdtemp(prefix="cp-commit-"))
    both = loopvols.dmcache(tmp)
    data_only = loopvols.dmcache(tmp, "lab-dmc2", Path("/mnt/dmc2"))
    for v in (both, data_only):
        dirty_on_smq(v.mount, "f", 4, 2 << 20)
    run("sync")
    time.sleep(6)  # ext4's journal commit (5 s) out of the windows
    meta = kname("lab-dmc-meta")
    window("idle", meta, None)
    window("noflush", meta, lambda: run("dmsetup", "status", "--noflush", "lab-dmc"))
    window("commit", meta, lambda: run("dmsetup", "status", "lab-dmc"))
    for linear in (*both.cache_linears, "lab-dmc2-data"):
        loopvols.fail(linear)
    t0 = time.monotonic()
    for v in (both, data_only):
        io_fails(v.mount)
    time.sleep(WINDOW_S)
    for p, v in (("both", both), ("data_only", data_only)):
        say(f"{p}_noflush_after_s", f"{time.monotonic() - t0:.0f}")
        say(f"{p}_noflush", run("dmsetup", "status", "--noflush", v.dm_name))
        say(f"{p}_commit", run("dmsetup", "status", v.dm_name))
        say(f"{p}_noflush_then", run("dmsetup", "status", "--noflush", v.dm_name))


if __name__ == "__main__":
    main()
