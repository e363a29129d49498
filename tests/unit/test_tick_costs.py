"""Per-tick costs the lab's profile found (docs/benchmarks.md, "Soak"): each is a cheap path that a refactor could
lose again without any behaviour changing, so the tests pin the path itself."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cachepilot.backends import kernelio
from cachepilot.daemon import counters as counters_mod
from cachepilot.daemon.counters import Counters
from cachepilot.errors import DeviceGone


def test_a_sysfs_attribute_is_read_without_the_text_file_stack(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    (tmp_path / "dirty_data").write_text("12.5M\n")

    def slow(*a: object, **k: object) -> str:
        raise AssertionError("Path.read_text: an io stack per attribute, ten attributes a tick")

    monkeypatch.setattr(Path, "read_text", slow)
    monkeypatch.setattr(Path, "open", slow)
    assert kernelio.read_attr(tmp_path / "dirty_data") == "12.5M"
    with pytest.raises(DeviceGone):
        kernelio.read_attr(tmp_path / "gone")


def test_counting_into_a_known_group_builds_no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Counters()
    c.add("events", "Barrier")
    built: list[int] = []

    class Watched(Counter[str]):
        def __init__(self) -> None:
            built.append(1)
            super().__init__()

    monkeypatch.setattr(counters_mod, "Counter", Watched)
    for _ in range(100):
        c.add("events", "Barrier")  # once per event the probe delivers
    assert built == [] and c.group("events") == {"Barrier": 101} and c["events.Barrier"] == 101
    c.add("new", "x")
    assert built == [1]


def test_the_claimed_slots_of_the_drained_half_are_found_and_cleared_without_a_loop_per_word() -> None:
    import mmap

    from cachepilot.probe.hottable import SLOT_SIZE, KernelHotTable

    nslots = 64 * 64  # a half of 64 words
    p = KernelHotTable.__new__(KernelHotTable)
    p.nslots = nslots
    p._hot_mm = mmap.mmap(-1, 4096)
    p._claimed_mm = mm = mmap.mmap(-1, 2 * nslots // 8)
    words = memoryview(mm).cast("Q")
    claimed_low = {0, 5, 63, 64, 1000, nslots - 1}
    claimed_high = {nslots + 3, 2 * nslots - 1}  # the other half: counted into meanwhile, not drained now
    for k in claimed_low | claimed_high:
        words[k // 64] |= 1 << (k % 64)
    p._swap_halves = lambda: 0  # type: ignore[method-assign]  # the half at slot 0 is the one to drain
    assert p._drain_claimed() == sorted(claimed_low)
    assert all(words[w] == 0 for w in range(64)) and words[(nslots + 3) // 64] != 0
    assert p._drain_claimed() == []
    p._swap_halves = lambda: nslots * SLOT_SIZE  # type: ignore[method-assign]
    assert p._drain_claimed() == sorted(claimed_high)
    words.release()


def test_taking_from_a_queue_with_nothing_ready_does_no_array_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon asks after every poll of the rings (commits from fsyncs that freed nothing, ten a second)."""
    from cachepilot.models import freed

    q = freed.FreedExtentQueue()
    q.freed(100, 8, ts_ns=1, tid=7)  # pending: its transaction has not committed
    q.commit(6, ts_ns=2)
    monkeypatch.setattr(freed.np, "cumsum", lambda *a, **k: pytest.fail("array work with nothing ready"))
    assert q.take(3) == []
    monkeypatch.undo()
    q.commit(7, ts_ns=4)
    assert q.take(5) == [(100, 8)]
