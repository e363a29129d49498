"""Helpers for the actuator lab scripts (run inside the lab guest by the venv's python): files with known
checksums, dropping caches, emptying a bcache, block-device counters, and driving a backend action to completion."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from cachepilot.actions import SetKnob
from cachepilot.backends import open_backend
from cachepilot.backends.base import PENDING, Backend, ControlAction, Outcome
from cachepilot.backends.inspect import block_name, describe_volume

_T0 = time.monotonic()


def say(key: str, value: object) -> None:
    print(f"{key}={value}", flush=True)
    print(f"[{time.monotonic() - _T0:6.1f} s] {key}", file=sys.stderr, flush=True)  # where the time goes


def volume() -> Backend:
    return open_backend(describe_volume(os.environ["LAB_CACHED_DEV"]))


# bcache sends I/O around a cache device that looks congested (reads over 2 ms, writes over 20 ms): under TCG with
# other guests on the host's cores the emulated device often does, and a test that needs bcache to cache (dirty data,
# hits, I/O on a failing cache) then sees none; the benchmarks turn both thresholds off (0), as a real SSD never trips
NO_CONGESTION = {"congested_read_threshold_us": "0", "congested_write_threshold_us": "0"}


def no_congestion_bypass(b: Backend, why: str) -> None:
    """Both congestion thresholds of bcache volume ``b`` set to 0 through the backend (read back and logged), each
    outcome said as ``<knob>_status``."""
    for knob, value in NO_CONGESTION.items():
        say(f"{knob}_status", drive(b, SetKnob(b.info.name, knob, value, why))[0].status)


def quiet_policy(*more: str) -> str:
    """The policy of a lab script that drives the caches itself (tests/vm/lifecycle/): recoverable (no drain of the
    daemon's own), no lifetime hold, no promotion; ``more``: further `defaults:` entries, one a line as written."""
    entries = ("failure_model: recoverable", "lifetime_hold: {enabled: false}", "promotion: {enabled: false}", *more)
    return "version: 1\ndefaults:\n" + "".join(f"  {e}\n" for e in entries)


def write_files(d: Path, prefix: str, n: int, size: int, seed: int) -> dict[str, str]:
    """n files of ``size`` pseudo-random bytes (seeded, so a rewrite with another seed differs), fsynced."""
    sums = {}
    for i in range(n):
        data = random.Random(f"{seed}:{prefix}{i}").randbytes(size)  # noqa: S311 (test data)
        path = d / f"{prefix}{i}"
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        sums[path.name] = hashlib.sha256(data).hexdigest()
    return sums


def dirty_on_smq(d: Path, prefix: str, n: int, size: int) -> dict[str, str]:
    """Dirty blocks on dm-cache's smq, which caches a block it sees read again and again and keeps an overwrite of
    a cached block dirty: n files written (seed 1), read three times past the page cache, written again (seed 2);
    the checksums of what they hold now."""
    sums = write_files(d, prefix, n, size, seed=1)
    drop_caches()
    for _ in range(3):
        for name in sums:
            run("dd", f"if={d / name}", "of=/dev/null", "bs=64k", "iflag=direct", "status=none")
    return write_files(d, prefix, n, size, seed=2)


def intact(d: Path, sums: dict[str, str]) -> str:
    """'yes' or the names that differ."""
    bad = [n for n, s in sums.items() if hashlib.sha256((d / n).read_bytes()).hexdigest() != s]
    return "yes" if not bad else "no:" + ",".join(sorted(bad)[:5])


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def reattach_bcache(bc: Path) -> str:
    """Detach the bcache device ``bc`` (its sysfs dir) from its cache set and attach it again: the same cache,
    now empty for this volume. Returns the cache set's UUID."""
    cset = os.path.basename(os.readlink(bc / "cache"))
    (bc / "detach").write_text("1\n")
    while (bc / "cache").exists():
        time.sleep(0.1)
    (bc / "attach").write_text(cset + "\n")
    while not (bc / "cache").exists():
        time.sleep(0.1)
    return cset


def sectors(dev_path: str) -> tuple[int, int]:
    """(read sectors, written sectors) of a block device, from /sys/block/NAME/stat."""
    name, _ = block_name(dev_path)
    f = Path(f"/sys/block/{name}/stat").read_text().split()
    return int(f[2]), int(f[6])


def drive(b: Backend, action: ControlAction, timeout: float = 120.0) -> tuple[Outcome, float]:
    """Apply an action and step the backend every 50 ms until it finishes; (outcome, seconds)."""
    t0 = time.monotonic()
    out = b.apply(action)
    while out.status == PENDING:
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{action.line()} still pending after {timeout} s")
        time.sleep(0.05)
        done = b.step(time.monotonic_ns())
        if done:
            out = done[0]
    return out, time.monotonic() - t0


def run(*argv: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout.strip()
