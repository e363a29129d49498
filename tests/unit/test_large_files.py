"""The sieve's large-file class (promotion.large_files, issue 37): a file above ``sieve_size`` is admitted once it
has been read whole ``min_reads`` times below the page cache; a file read once (a stream, a backup) never is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachepilot.engine import Engine, Promote
from cachepilot.errors import UserError
from cachepilot.events import FileKey, HotnessDelta, kdev
from cachepilot.models.hotness import HOT_DTYPE, HotnessTable
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy

NS = 1_000_000_000
MIB = 1 << 20
DEV = kdev(252, 0)
BIG = 16 * MIB


def policy(large: str = "{enabled: true, min_reads: 2, max_size: 64MiB}") -> str:
    return f"""
version: 1
defaults:
  failure_model: recoverable
  promotion: {{enabled: true, rate: 4MiB, max_cache_fraction: 0.25, sieve_size: 1MiB, large_files: {large}}}
"""


def engine(large: str = "{enabled: true, min_reads: 2, max_size: 64MiB}") -> Engine:
    info = VolumeInfo(dev=DEV, name="v0", kind="bcache", cache_bytes=256 * MIB)
    return Engine(parse_policy(policy(large), "t.yaml"), [info])


def sample(e: Engine, t: float, bypasses: int) -> None:
    e.sample(VolumeSample(DEV, int(t * NS), "writethrough", 0, 0, 0, 0, False, {}, "cset-a", bypasses=bypasses))


def read_whole(e: Engine, ino: int, size: int = BIG, t: float = 1.0) -> None:
    """One whole read of the file below the page cache, as the probe reports it (128 KiB requests: b = 2 each)."""
    e.feed(HotnessDelta(FileKey(DEV, ino, 1), 2 * (size // (128 << 10)), 0, size, 0, int(t * NS), size=size))


def promoted(e: Engine, t: float) -> list[Promote]:
    return [a for a in e.tick(int(t * NS)) if isinstance(a, Promote)]


def bypassing(e: Engine) -> None:
    sample(e, 0, bypasses=0)
    sample(e, 1, bypasses=4000)  # bcache sent the large file's sequential reads around itself


def test_a_large_file_read_whole_twice_is_promoted_whole_with_its_reason() -> None:
    e = engine()
    bypassing(e)
    read_whole(e, 1)
    assert not promoted(e, 2)  # read once: a stream, as far as anyone knows
    read_whole(e, 1, t=3)
    [p] = promoted(e, 3)
    assert p.ino == 1 and p.ranges == ((0, BIG),)
    assert "large file (16.0 MiB) read whole 2.0 times" in p.reason and "bypassed reads" in p.reason
    read_whole(e, 1, t=4)
    assert not promoted(e, 30)  # resident now: never read twice


def test_a_file_read_once_is_never_promoted() -> None:
    e = engine()
    bypassing(e)
    for ino in range(1, 9):  # eight cold 16 MiB files, each read once (a backup)
        read_whole(e, ino)
    assert not any(promoted(e, t) for t in range(2, 40))


def test_without_the_large_file_class_a_hot_large_file_is_never_promoted() -> None:
    e = engine("{enabled: false}")
    bypassing(e)
    for t in range(2, 8):
        read_whole(e, 1, t=t)
        assert not promoted(e, t)


def test_a_file_above_max_size_is_never_promoted() -> None:
    e = engine("{enabled: true, max_size: 8MiB}")
    bypassing(e)
    for t in range(2, 6):
        read_whole(e, 1, t=t)
        assert not promoted(e, t)


def test_whole_reads_age_with_the_counters_half_life() -> None:
    t = HotnessTable(half_life_s=10)
    slot = t.update(DEV, 1, 1, 2, 0, 0, 0, BIG, rbytes=2 * BIG)
    assert t.whole_reads(slot) == 2.0 and t.sieve(slot, MIB, 64 * MIB, 2.0) is None
    t.advance(11 * NS)
    t.update(DEV, 1, 1, 0, 0, 0, 11 * NS, BIG)  # a touch in the next epoch ages the read bytes
    assert t.whole_reads(slot) == 1.0
    assert t.sieve(slot, MIB, 64 * MIB, 2.0) == "large file read whole 1.0 times, not 2"
    assert t.sieve(slot, MIB) == f"larger than sieve ({BIG} > {MIB} bytes)"
    assert t.sieve(slot, MIB, 8 * MIB, 2.0) == f"larger than the large-file class ({BIG} > {8 * MIB} bytes)"


@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 40 * MIB), st.integers(0, 3 * MIB)), max_size=30),
       st.sampled_from([0, 4 * MIB, 32 * MIB]), st.sampled_from([1.0, 2.0, 3.5]))
def test_vectorised_read_bytes_and_sieve_match_the_scalar_rule(
        reads: list[tuple[int, int, int]], large_max: int, min_reads: float) -> None:
    vec, one = HotnessTable(), HotnessTable()
    rec = np.zeros(len(reads), dtype=HOT_DTYPE)
    for i, (ino, rb, size) in enumerate(reads):
        rec[i] = (DEV, ino, 1, 1, 0, rb, 0, i, size)
        one.update(DEV, ino, 1, 1, 0, 0, i, size, rbytes=rb)
    vec.apply_array(rec)
    for ino in {r[0] for r in reads}:
        a, b = vec.lookup(DEV, ino), one.lookup(DEV, ino)
        assert a is not None and b is not None and vec.rbytes[a] == one.rbytes[b]
        mask = vec.sieve_mask(np.array([a]), MIB, large_max, min_reads)
        assert bool(mask[0]) == (vec.sieve(a, MIB, large_max, min_reads) is None)


def test_policy_refuses_an_empty_large_file_class() -> None:
    with pytest.raises(UserError, match="large_files.max_size: .*not above sieve_size"):
        parse_policy(policy("{enabled: true, max_size: 512KiB}"), "t.yaml")
    with pytest.raises(UserError, match="min_reads"):
        parse_policy(policy("{enabled: true, min_reads: 0.5}"), "t.yaml")


def test_policy_check_verbose_shows_the_size_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cachepilot.cli import main

    f = tmp_path / "p.yaml"
    f.write_text(policy())
    assert main(["policy", "check", "-v", str(f)]) == 0
    assert f"sieve 1048576 B, large files <= {64 * MIB} B read whole 2x" in capsys.readouterr().out
