"""A storm of file actions never pushes the rare decisions (switches, drains, knobs) out of `explain` or the state
file, and what is kept reads back in the order it was made."""

from __future__ import annotations

from typing import Any

from cachepilot.daemon.acting import DECISIONS_KEPT
from cachepilot.daemon.decisionlog import DecisionLog


def d(kind: str, n: int) -> dict[str, Any]:
    return {"kind": kind, "n": n}


def test_a_thousand_promotions_leave_the_switch_they_followed() -> None:
    log = DecisionLog(DECISIONS_KEPT)
    log.append(d("drain", 0))
    log.append(d("set_write_policy", 1))
    for i in range(2, 2 + 3 * DECISIONS_KEPT):
        log.append(d("promote" if i % 2 else "discard", i))
    kept = list(log)
    assert kept[:2] == [d("drain", 0), d("set_write_policy", 1)]  # a single deque of 1000 had lost them
    assert len(kept) == 2 + DECISIONS_KEPT and kept[-1]["n"] == 1 + 3 * DECISIONS_KEPT


def test_read_back_in_the_order_made_and_the_state_file_keeps_the_last_of_each() -> None:
    log = DecisionLog(4)
    kinds = ["promote", "set_knob", "discard", "promote", "drain", "promote", "set_knob", "discard"]
    for i, k in enumerate(kinds):
        log.append(d(k, i))
    assert [x["n"] for x in log] == [1, 2, 3, 4, 5, 6, 7]  # promote 0 went: four file actions kept
    assert [x["n"] for x in log.last(2)] == [4, 5, 6, 7]  # files 5, 7 and the others 4, 6
    assert log.last(0) == []
