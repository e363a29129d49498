"""One size parser for every reader: policies and the configuration, knob values, bcache's sysfs sizes."""

from __future__ import annotations

import pytest

from cachepilot import units
from cachepilot.backends.bcache import size_matches
from cachepilot.backends.inspect import parse_bcache_size
from cachepilot.capabilities import KNOBS
from cachepilot.errors import UserError
from cachepilot.policy import parse_size


@pytest.mark.parametrize(("text", "n"), [
    ("4096", 4096), ("4MiB", 4 << 20), ("4M", 4 << 20), ("1.5 KiB", 1536), ("10MB", 10_000_000), ("2 GB", 2 * 10**9),
    ("1.5G", 3 << 29), ("7B", 7),
])
def test_every_operator_facing_reader_agrees(text: str, n: int) -> None:
    assert units.parse_size(text) == parse_size(text) == KNOBS["sequential_cutoff"].parse(text) == n


@pytest.mark.parametrize("text", ["4k", "4 P", "-4M", "4 MiBs", "M", "1" * 31, "1.0000000001M"])
def test_what_an_operator_may_not_write(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        units.parse_size(text)
    with pytest.raises(UserError, match="sequential_cutoff"):
        KNOBS["sequential_cutoff"].parse(text)


@pytest.mark.parametrize(("text", "n"), [
    ("512", 512), ("5.8M", int(5.8 * (1 << 20))), ("64.0k", 65536), ("-1.2k", -1228), ("1.0E", 1 << 60),
])
def test_bcache_prints_its_own_units(text: str, n: int) -> None:
    assert parse_bcache_size(text) == units.parse_size(text, units.BCACHE, signed=True) == n


@pytest.mark.parametrize("text", ["4MiB", "4K", "1.0Z", "x"])
def test_bcache_sizes_are_bcache_units_only(text: str) -> None:
    with pytest.raises(UserError, match="unexpected bcache size"):
        parse_bcache_size(text)


def test_one_table_behind_every_dialect() -> None:
    assert units.OPERATOR <= units.BYTES.keys() and units.BCACHE <= units.BYTES.keys()
    assert units.suffix_bytes("4.0M") == 1 << 20 and units.suffix_bytes("4096") == 1
    assert size_matches("4.0M", str((4 << 20) + 50_000)) and not size_matches("4.0M", str(5 << 20))


def test_bcache_prints_zero_as_0_0k_and_sizes_to_one_decimal() -> None:
    """bch_hprint (drivers/md/bcache/util.c) divides by 1024 at least once: 0 reads back as "0.0k"."""
    assert units.printed_matches("0.0k", 0) and size_matches("0.0k", "0")
    assert units.printed_matches("5.8M", 6081741) and not units.printed_matches("5.8M", 6 << 20)
    assert not units.printed_matches("4MiB", 4 << 20) and not units.printed_matches("x", 0)
