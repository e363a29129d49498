"""The bcc path's attach to classic tracepoints (probe/perfattach.py): the perf event's attributes as the kernel lays
them out, the tracepoint's id from tracefs, a missing tracepoint named. (The attach: tests/vm/test_bcc_lab.py.)"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cachepilot.probe import perfattach


def test_the_attributes_ask_for_every_hit_of_the_tracepoint() -> None:
    attr = perfattach._perf_attr(1234)
    assert len(attr) == perfattach.PERF_ATTR_SIZE
    # struct perf_event_attr: __u32 type, size; __u64 config, sample_period, sample_type, read_format, flag bits;
    # __u32 wakeup_events
    kind, size, config, period, sample_type, read_format, bits, wakeup = struct.unpack_from("=IIQQQQQI", attr)
    assert (kind, size, config, period, wakeup) == (perfattach.PERF_TYPE_TRACEPOINT, 128, 1234, 1, 1)
    assert sample_type == read_format == bits == 0  # enabled by ioctl, not disabled by a flag
    assert attr[52:] == bytes(len(attr) - 52)


def test_the_id_comes_from_tracefs_and_a_missing_tracepoint_is_named(tmp_path: Path) -> None:
    tp = tmp_path / "events" / "syscalls" / "sys_enter_fsync"
    tp.mkdir(parents=True)
    (tp / "id").write_text("731\n")
    assert perfattach.tracepoint_id(tmp_path, "syscalls/sys_enter_fsync") == 731
    with pytest.raises(perfattach.AttachError, match="no tracepoint bcache/bcache_alloc_fail"):
        perfattach.tracepoint_id(tmp_path, "bcache/bcache_alloc_fail")
    (tp / "id").write_text("garbage")
    with pytest.raises(perfattach.AttachError):
        perfattach.tracepoint_id(tmp_path, "syscalls/sys_enter_fsync")
