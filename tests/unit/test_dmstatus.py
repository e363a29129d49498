import pytest

from cachepilot.backends.dmstatus import (
    StatusParseError,
    parse_dm_cache_status,
    parse_dm_writecache_status,
)

# Lines captured from the lab (Debian 6.1 kernel).
DMCACHE_WB = (
    "0 2097152 cache 8 14/4096 128 258/3840 768 17 256 153 0 258 257 1 writeback "
    "2 migration_threshold 2048 smq 0 rw - "
)
DMCACHE_WT = "8 20/4096 128 262/3840 0 0 3 270 0 0 0 1 writethrough 2 migration_threshold 2048 smq 0 ro needs_check"


def test_dm_cache_full_line():
    s = parse_dm_cache_status(DMCACHE_WB)
    assert (s.metadata_used_blocks, s.metadata_total_blocks) == (14, 4096)
    assert (s.cache_used_blocks, s.cache_total_blocks, s.cache_block_sectors) == (258, 3840, 128)
    assert (s.read_hits, s.read_misses, s.write_hits, s.write_misses) == (768, 17, 256, 153)
    assert (s.demotions, s.promotions, s.dirty_blocks) == (0, 258, 257)
    assert s.io_mode == "writeback"
    assert s.core_args == {"migration_threshold": "2048"}
    assert s.policy == "smq" and s.policy_args == ()
    assert s.metadata_mode == "rw" and not s.needs_check and not s.failed
    assert s.dirty_bytes == 257 * 128 * 512


def test_dm_cache_target_fields_only_and_needs_check():
    s = parse_dm_cache_status(DMCACHE_WT)
    assert s.io_mode == "writethrough" and s.dirty_blocks == 0
    assert s.metadata_mode == "ro" and s.needs_check


def test_dm_cache_fail():
    assert parse_dm_cache_status("0 2097152 cache Fail").failed
    # 6.1 with its cache device returning errors: the metadata commit failed, then "Error" (lab, 2026-11-29)
    assert parse_dm_cache_status("0 2097152 cache Error").failed


@pytest.mark.parametrize(
    "line, message",
    [
        ("0 10 cache 8 14/4096 128", "field 4"),
        ("8 x/4096 128 1/2 0 0 0 0 0 0 0 0 smq 0 rw", "field 2"),
        ("8 1/4096 128 1/2 0 0 0 0 0 0 0 3 writeback", "features: 3 announced, 1 present"),
        ("8 1/4096 128 1/2 0 -1 0 0 0 0 0 0 0 smq 0 rw", "negative"),
    ],
)
def test_dm_cache_malformed(line, message):
    with pytest.raises(StatusParseError, match=message):
        parse_dm_cache_status(line)


def test_writecache():
    s = parse_dm_writecache_status("0 2097152 writecache 0 65280 61010 0 19 10 4280 2 8 0 4270 0 5 0")
    assert (s.error, s.total_blocks, s.free_blocks, s.writeback_blocks) == (0, 65280, 61010, 0)
    assert s.used_blocks == 4270 and len(s.stats) == 10
    with pytest.raises(StatusParseError, match="exceed"):
        parse_dm_writecache_status("0 10 20 0")
