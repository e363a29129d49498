"""Helpers for the ops tests: a hand-built daemon snapshot, free ports, the exposition as text.

The snapshot is synthetic (the daemon that fills it in production is `cachepilot run`); everything downstream of
it — collectors, HTTP server, textfile, promtool, Prometheus, node_exporter — is the real code and the real tools.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from cachepilot.exporter import (
    EPOCH_BUCKETS,
    TICK_BUCKETS,
    DaemonSnapshot,
    DetachedVolume,
    HistogramAccumulator,
    UnmanagedVolume,
    VolumeSnapshot,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
CACHE_SET = "0d1d5ad2-0a1c-4d2f-9b1a-7c2a3e4f5a6b"  # bcache0's cache set (tests/ops/data/node: node_exporter's view)


def need_tool(name: str) -> str:
    """Path of a host tool the test needs; fails (never skips) naming the `make deps` step that installs it."""
    path = shutil.which(name)
    assert path, f"{name} is not installed: run `make deps-system` (Makefile APT_PACKAGES)"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def snapshot(step: int = 1, now: float = 1_800_000_000.0) -> DaemonSnapshot:
    """The daemon after `step` ticks of one second: two volumes, counters growing with `step`.

    bcache0: bcache in write-back under the destructive model (bounded), with bypasses;
    lab-cached (dm-3): dm-cache in write-through, unbounded (recoverable), no bypass counter, no error count;
    bcache1: found, not managed (two policy files' rules select it)."""
    ticks = HistogramAccumulator(TICK_BUCKETS)
    epochs = HistogramAccumulator(EPOCH_BUCKETS)
    for i in range(step):
        ticks.observe(0.02 + (i % 5) * 0.01)
        epochs.observe(64 * KiB * (1 + i % 7))
    bcache = VolumeSnapshot(
        volume="bcache0", device="bcache0", kind="bcache", mode="writeback", target_mode="writeback", health=0,
        latched=False, draining=False, cache_bytes=256 * MiB, cache_io_errors=0,
        dirty_bytes=8 * MiB + step * 4 * KiB, dirty_age_seconds=3.0, dirty_bound_bytes=64 * MiB,
        age_bound_seconds=30.0, drains=step // 10, exposure_breaches=0,
        hits=900 * step, misses=100 * step, bypasses=5 * step, bypassed_bytes=5 * 128 * KiB * step,
        promoted_bytes=MiB * step, discard_issued_bytes=256 * KiB * step, discard_landed_bytes=192 * KiB * step,
        barriers=3 * step, epoch_bytes=epochs.freeze(), cache_set=CACHE_SET,
        alloc_failures=2 * step, promotion_rate=4.0 * MiB,
        operator_drain_remaining_bytes=8 * MiB, operator_drain_rate_bytes=2.0 * MiB,
        writeback_stalled=True, writeback_stalled_seconds=900.0, all_dirty=None, clean_eta_seconds=4.0,
        advice=((128 * MiB, 0.52, 0.01, 480 * MiB, 64 * MiB), (256 * MiB, 0.71, 0.01, 290 * MiB, 64 * MiB),
                (512 * MiB, 0.83, 0.02, 170 * MiB, 64 * MiB), (1024 * MiB, 0.88, 0.01, 120 * MiB, 64 * MiB)),
    )
    dmcache = VolumeSnapshot(
        volume="lab-cached", device="dm-3", kind="dm-cache", mode="writethrough", target_mode="writethrough",
        health=0, latched=False, draining=False, cache_bytes=240 * MiB, cache_io_errors=None,
        dirty_bytes=0, dirty_age_seconds=0.0, dirty_bound_bytes=None, age_bound_seconds=None, drains=0,
        exposure_breaches=0, hits=500 * step, misses=500 * step, bypasses=None,
        promoted_bytes=0, discard_issued_bytes=64 * KiB * step, discard_landed_bytes=64 * KiB * step,
        barriers=step, epoch_bytes=epochs.freeze(), bypassed_bytes=None, cache_set=None, alloc_failures=None,
        promotion_rate=None, operator_drain_remaining_bytes=None, operator_drain_rate_bytes=None,
        writeback_stalled=False, writeback_stalled_seconds=0.0, all_dirty=False, clean_eta_seconds=None, advice=(),
    )
    return DaemonSnapshot(
        timestamp=now, start_time=now - step, ready=True, dry_run=False, observe_only=False,
        events={"barrier": 4 * step, "delete": 2 * step, "freed_extent": 6 * step, "journal_commit": step,
                "discard": 3 * step},
        drops={"ringbuf_full": 0, "hotness_map_full": 0, "other": 0},
        ticks=step, tick_duration=ticks.freeze(), last_tick_timestamp=now,
        stage_seconds={"sample": 0.03 * step, "between": 0.8 * step}, stage_cpu_seconds={"sample": 0.01 * step},
        decisions={"promote": step, "discard": step, "set_write_policy": 1, "drain": step // 10},
        action_failures={"retry": 1, "rejected": 0},
        policy_reloads=1, policy_reload_failures=0, policy_last_reload_success=True,
        state_writes=step // 30, state_write_failures=0,
        volumes=(bcache, dmcache), unmanaged=(UnmanagedVolume("bcache1", "bcache1", "policy"),),
        detached=(DetachedVolume("lab-wc", "dm-4", "dm-writecache", "operator"),),
        version="1.2.3", kernel="6.1.0-lab", bpf_object="0123456789ab", capture="bcc",
    )


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_tool("promtool"), *args], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd=cwd)
