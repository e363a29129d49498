"""The daemon's bulk views of the hotness table (daemon/snapshot.py) against a plain Python oracle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.daemon.snapshot import hottest
from cachepilot.models.hotness import HotnessTable

# (dev, ino, read score, write score, last) — few distinct scores and times, so ties are common
FILES = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 200), st.integers(0, 4), st.integers(0, 2),
                           st.integers(0, 3)), max_size=300)


def oracle(t: HotnessTable, dev: int, k: int, slots: dict[tuple[int, int], int]) -> list[tuple[int, int]]:
    """Highest score first; the most recent wins a tie; then the later slot (the bulk sort's reversed order)."""
    live = [(t.score(s), t.last[s], s) for (d, _), s in slots.items() if d == dev]
    return [(t.score(s), int(t.ino[s])) for _, _, s in sorted(live, reverse=True)[:k]]


@settings(max_examples=200, deadline=None)
@given(FILES, st.integers(1, 3), st.integers(1, 40))
def test_hottest_equals_a_full_sort(files: list[tuple[int, int, int, int, int]], dev: int, k: int) -> None:
    t = HotnessTable()
    slots: dict[tuple[int, int], int] = {}
    for d, ino, rs, ws, last in files:
        slots[(d, ino)] = t.update(d, ino, 0, rs * 16, ws * 16, 0, last_ns=last * 1000)
    got = [(h["score"], h["ino"]) for h in hottest(t, dev, k)]
    assert got == oracle(t, dev, k, slots)
