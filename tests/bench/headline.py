"""The headline benchmark's shared lab geometry and timing (issue 23), and the pair-by-pair arithmetic the W2-W4
scripts report with. A 7200 rpm disk behind a 256 MiB cache: origin 2 GiB (sparse) behind dm-delay 8 ms per read
(a seek plus half a turn), 4 ms per write (a disk's write cache absorbs part of the seek), 1 ms per flush (an almost
empty write cache), and qemu's throttle at 150 IOPS (a 7200 rpm disk's random IOPS: 100-200), so origin I/O
costs foreground throughput as on a real disk. The same numbers as the W1 fileserver run (branch s23bench); the lead
aligns them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labbench import LabSpec

ORIGIN_MB, CACHE_MB = 2048, 256
READ_MS, WRITE_MS, FLUSH_MS, IOPS = 8, 4, 1, 150
# Issue 31: the disk also pays transfer time. A 7200 rpm disk streams ~150 MB/s; at that rate the ~6.7 ms of one
# random operation (1 s / 150) moves ~1 MiB, so a request counts as one operation per MiB it carries
# (throttling.iops-size) besides the byte budget: a merged 4 MiB drain burst costs four seeks' worth, not one.
BPS, IOPS_SIZE = 150_000_000, 1 << 20


@dataclass(frozen=True)
class Timing:
    """Seconds of warm-up (not measured) and of the measured steady-state window, per run."""

    warmup: int
    window: int


FULL = Timing(warmup=45, window=120)  # the minimum window: 2 min
QUICK = Timing(warmup=10, window=30)  # development only: one round, a short window


def spec(recipe: str, mode: str = "writeback", timeout: int = 900) -> LabSpec:
    return LabSpec(recipe=recipe, mode=mode, origin_delay_ms=READ_MS, origin_size_mb=ORIGIN_MB,
                   cache_size_mb=CACHE_MB, timeout=timeout, read_delay_ms=READ_MS, write_delay_ms=WRITE_MS,
                   flush_delay_ms=FLUSH_MS, origin_iops=IOPS, origin_bps=BPS, origin_iops_size=IOPS_SIZE)


def geometry() -> str:
    return (f"origin {ORIGIN_MB} MiB (sparse) behind dm-delay read {READ_MS} ms, write {WRITE_MS} ms, flush "
            f"{FLUSH_MS} ms and qemu's throttle at {IOPS} IOPS and {BPS / 1e6:g} MB/s, a request counting once per"
            f" {IOPS_SIZE >> 20} MiB; cache {CACHE_MB} MiB")


def pair_deltas(a: Sequence[dict], b: Sequence[dict], key: str) -> list[float]:
    """a[i][key] - b[i][key] for the rounds where both ran and both have the key (pairs from the same round)."""
    return [float(x[key]) - float(y[key]) for x, y in zip(a, b, strict=False)
            if x.get(key) is not None and y.get(key) is not None]


def verdict(xs: Sequence[float], ok: bool) -> str:
    """met / missed for a goal on the median of the pairs; n/a without a single pair."""
    return "n/a (no complete round)" if not xs else ("met" if ok else "**missed**")
