"""The kernel's table of watched devices (bpf/cachepilot.h "watched"): user space places every device where the BPF
lookup (find_watch in bpf/common.bpf.h, mirrored here step by step) finds it, and nothing else is found."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot import bpf_layout as L
from cachepilot.errors import UserError
from cachepilot.probe.watches import watch_home, watch_layout


def find_watch(table: dict[int, int], mul: int, dev: int) -> int | None:
    """The BPF lookup: linear probing from the home index, an empty entry ends the search."""
    if not dev:
        return None
    home = watch_home(dev, mul)
    for i in range(L.WATCH_PROBES):
        k = (home + i) % L.WATCH_SLOTS
        if k not in table:
            return None
        if table[k] == dev:
            return k
    return None


devices = st.integers(min_value=1, max_value=(1 << 32) - 1)


@settings(max_examples=200, deadline=None)
@given(st.sets(devices, max_size=L.WATCH_SLOTS // 4), st.lists(devices, max_size=50), st.integers(0, (1 << 32) - 1))
def test_every_watched_device_is_found_and_no_other(devs: set[int], others: list[int], current: int) -> None:
    mul, at = watch_layout(devs, current)
    assert mul % 2 == 1 and set(at) == devs and len(set(at.values())) == len(devs)
    table = {k: d for d, k in at.items()}
    for d in devs:
        assert find_watch(table, mul, d) == at[d]
    for d in others:
        if d not in devs:
            assert find_watch(table, mul, d) is None


def test_the_current_multiplier_is_kept_while_everything_fits() -> None:
    mul, _ = watch_layout([8 << 20 | 16], 0)
    assert watch_layout([8 << 20 | 16, 8 << 20 | 32], mul)[0] == mul  # no rewrite of the whole table for one more


def test_real_device_numbers_of_a_large_host_fit() -> None:
    # 64 volumes of bcache / dm / loop / sd devices, each with its backing and cache device: dense dev_t ranges
    devs = {maj << 20 | mi for maj in (7, 8, 252, 253, 254) for mi in range(0, 51)}
    mul, at = watch_layout(devs, 0)
    assert len(at) == 255


def test_too_many_devices_is_one_line() -> None:
    with pytest.raises(UserError, match="too many watched devices"):
        watch_layout(range(1, L.WATCH_SLOTS // 4 + 2), 0)
