"""A tick's admission split by volume (engine/admission.py ``_by_volume``): the same groups in the same order
whether picked out by masks or by a sort, and a million touched files admitted without a transient as large as the
table (issue 32: the first tick's peak RSS)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cachepilot.engine import Engine, admission
from cachepilot.events import kdev
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy import parse_policy

POLICY = """version: 1
defaults:
  promotion: {enabled: true, rate: 8MiB, max_cache_fraction: 0.5, sieve_size: 1MiB}
"""
VOLUMES = 16


def engine_with_touched(n: int, other_fs: bool = False) -> Engine:
    """16 volumes (and, with ``other_fs``, files of a filesystem that is no volume's), n files touched once each
    in an interleaved order."""
    vols = [VolumeInfo(dev=kdev(252, i), name=f"bcache{i}", cache_bytes=8 << 30) for i in range(VOLUMES)]
    e = Engine(parse_policy(POLICY, "p.yaml"), vols)
    j = np.random.default_rng(4).permutation(n)
    rec = np.zeros(n, dtype=HOT_DTYPE)
    devs = np.array([kdev(252, v) for v in range(VOLUMES + other_fs)], dtype=np.uint32)
    rec["dev"] = devs[j % len(devs)]
    rec["ino"], rec["gen"], rec["rs"], rec["rb"], rec["last"], rec["size"] = j + 12, 1, 1 + j % 64, 4096, 1, 4096
    e.feed_hotness_array(rec)
    return e


@pytest.mark.parametrize("other_fs", [False, True])
def test_masks_and_the_sort_give_the_same_groups_in_the_same_order(monkeypatch: pytest.MonkeyPatch,
                                                                    other_fs: bool) -> None:
    e = engine_with_touched(20_000, other_fs)
    slots = e.hotness.drain_touched_array()
    masked = list(e.admission._by_volume(e.hotness, slots))
    monkeypatch.setattr(admission, "MASKED_GROUPS", 0)
    sorted_ = list(e.admission._by_volume(e.hotness, slots))
    assert len(masked) == VOLUMES and [g.tolist() for g in masked] == [g.tolist() for g in sorted_]


def test_a_million_touched_files_are_admitted_with_a_transient_of_at_most_16_bytes_each() -> None:
    """The slots themselves are 8 bytes a file; the int64 search, the argsort and the sorted copy took 28."""
    n = 1 << 20
    e = engine_with_touched(n)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    e.admission.admit(e.hotness, 2)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    assert sum(len(c.promo_queue) for c in e.vols.values()) == n  # every file admitted and queued
    assert peak / n <= 16, peak / n
