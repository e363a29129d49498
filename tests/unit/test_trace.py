"""Trace files: round trip, corruption and truncation errors with offsets, deterministic replay."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import zstandard

from cachepilot.cli import main
from cachepilot.errors import UserError
from cachepilot.events import (
    Barrier,
    BarrierKind,
    Delete,
    Discard,
    Drops,
    FileKey,
    FreedExtent,
    HotnessDelta,
    JournalCommit,
    MetadataDelta,
    kdev,
)
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.policy import parse_policy
from cachepilot.sim.prepare import prepare
from cachepilot.sim.runner import run, sim_volume
from cachepilot.trace import Tick, TraceReader, TraceWriter, replay, write_trace
from cachepilot.trace.format import BLOCK, HEADER
from cachepilot.workloads import fileserver

DEV = kdev(252, 0)
VOL = VolumeInfo(dev=DEV, name="bcache0", cache_bytes=1 << 30, fs_uuid="abcd-1234")

EVENTS = [
    HotnessDelta(FileKey(DEV, 12, 3), 64, 2, 4096, 8192, 10, 12288),
    MetadataDelta(DEV, 5, 4096),
    FreedExtent(DEV, 12, 100, 8, True, 11),
    JournalCommit(DEV, 77, 12),
    Delete(FileKey(DEV, 12, 3), 12288, 13),
    Barrier(DEV, BarrierKind.FDATASYNC, 12, 4242, 65536, 14),
    Discard(DEV, 800, 64, 15),
    Drops(1, 2, 3),
    VolumeSample(DEV, 16, "writeback", 4096, 10, 2, 0, False, {"sequential_cutoff": "0"}),
    Tick(17),
]


@pytest.mark.parametrize("compress", [True, False])
def test_round_trip(tmp_path: Path, compress: bool) -> None:
    f = tmp_path / "t.cptrace"
    with TraceWriter(f, [VOL], {"source": "test"}, compress=compress) as w:
        w.write_many(EVENTS * 50)
    r = TraceReader(f)
    assert r.volumes == [VOL] and r.meta["source"] == "test"
    assert list(r.events()) == EVENTS * 50


def test_compact(tmp_path: Path) -> None:
    f = tmp_path / "t.cptrace"
    hd = [HotnessDelta(FileKey(DEV, i, 0), 64, 0, 4096, 0, i, 4096) for i in range(10000)]
    write_trace(f, hd, [VOL])
    assert f.stat().st_size < 10000 * 56 / 2  # fixed 56-byte records, then zstd


def test_blocks_are_zstd_and_zlib_blocks_still_read(tmp_path: Path) -> None:
    """New traces are written with zstd (codec 2); a trace whose blocks are zlib (codec 1, what earlier versions
    wrote) reads to the same events."""
    from cachepilot.trace.format import BLOCK, HEADER, ZLIB, ZSTD

    f = tmp_path / "t.cptrace"
    hd = [HotnessDelta(FileKey(DEV, i, 0), 64, 0, 4096, 0, i, 4096) for i in range(1000)]
    write_trace(f, hd, [VOL])
    data, off, codecs, old = f.read_bytes(), HEADER.size, [], bytearray(f.read_bytes()[:HEADER.size])
    while off < len(data):
        t, codec, r, count, length, _crc = BLOCK.unpack_from(data, off)
        payload = data[off + BLOCK.size: off + BLOCK.size + length]
        codecs.append(codec)
        if codec == ZSTD:
            codec, payload = ZLIB, zlib.compress(zstandard.ZstdDecompressor().decompress(payload), 1)
        old += BLOCK.pack(t, codec, r, count, len(payload), zlib.crc32(payload)) + payload
        off += BLOCK.size + length
    assert ZSTD in codecs
    z = tmp_path / "zlib.cptrace"
    z.write_bytes(bytes(old))
    assert list(TraceReader(z).events()) == list(TraceReader(f).events()) == hd


def _trace(tmp_path: Path) -> bytes:
    f = tmp_path / "t.cptrace"
    write_trace(f, EVENTS * 20, [VOL])
    return f.read_bytes()


def _err(tmp_path: Path, data: bytes) -> str:
    g = tmp_path / "bad.cptrace"
    g.write_bytes(data)
    with pytest.raises(UserError) as ei:
        list(TraceReader(g).events())
    return str(ei.value)


def _block_ends(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of every block of a trace, END included."""
    out, off = [], HEADER.size
    while off < len(data):
        length = BLOCK.unpack_from(data, off)[4]
        out.append((off, off + BLOCK.size + length))
        off += BLOCK.size + length
    return out


def test_a_cut_trace_reads_up_to_its_last_complete_block(tmp_path: Path) -> None:
    """A writer killed at any point (no END block; the last block cut in its header or payload): every complete
    block reads, and ``cut`` names the offset of the block in progress. Before the meta block ends: an error."""
    data = _trace(tmp_path)
    blocks = _block_ends(data)[:-1]  # without END
    assert len(blocks) > 10
    g = tmp_path / "cut.cptrace"
    meta_end = blocks[0][1]
    for off, end in blocks[1:]:
        for cut in (off, off + 5, off + BLOCK.size, end - 1):
            g.write_bytes(data[:cut])
            r = TraceReader(g)
            got = [o for o, _t, _recs in r.raw_blocks()]
            assert got == [o for o, e in blocks if e <= cut], cut
            assert r.cut is not None and f"offset {off}" in r.cut and "no END block" in r.cut, r.cut
    g.write_bytes(data[:len(data) - BLOCK.size])  # only the END block missing: every event
    r = TraceReader(g)
    assert list(r.events()) == EVENTS * 20 and r.cut is not None
    r = TraceReader(tmp_path / "t.cptrace")
    assert list(r.events()) == EVENTS * 20 and r.cut is None
    for cut in (5, HEADER.size + 3, meta_end - 1):
        msg = _err(tmp_path, data[:cut])
        assert "bad.cptrace" in msg and ("too short" in msg or "cut at offset 16, before its meta block" in msg)


def test_corrupt_byte_is_caught_by_crc(tmp_path: Path) -> None:
    data = bytearray(_trace(tmp_path))
    start, end = _block_ends(bytes(data))[1]
    off = (start + BLOCK.size + end) // 2  # inside the first event block's payload (the meta block's length varies)
    data[off] ^= 0xFF
    msg = _err(tmp_path, bytes(data))
    assert "CRC" in msg or "offset" in msg


def test_bad_magic_version_type_and_garbage(tmp_path: Path) -> None:
    data = _trace(tmp_path)
    assert "bad magic" in _err(tmp_path, b"NOTATRACE" + data[9:])
    assert "version 9" in _err(tmp_path, data[:8] + struct.pack("<H", 9) + data[10:])
    bogus = BLOCK.pack(77, 0, 0, 0, 0, zlib.crc32(b""))
    msg = _err(tmp_path, data[:-BLOCK.size] + bogus + data[-BLOCK.size:])
    assert "unknown block type 77" in msg
    assert "garbage" in _err(tmp_path, data + b"xx")


def test_wrong_record_length(tmp_path: Path) -> None:
    payload = b"\x00" * 10  # not a multiple of a HotnessDelta record
    blk = BLOCK.pack(1, 0, 0, 1, len(payload), zlib.crc32(payload)) + payload
    data = _trace(tmp_path)
    msg = _err(tmp_path, data[:-BLOCK.size] + blk + data[-BLOCK.size:])
    assert "hotness block has 10 bytes for 1 records" in msg


def test_replay_cli_corrupt_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "bad.cptrace"
    g.write_bytes(_trace(tmp_path)[:100])
    assert main(["replay", str(g)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "offset" in err


def _sim_trace(tmp_path: Path) -> Path:
    p = prepare(fileserver(iterations=600, nfiles=100, op_interval_ms=10))
    f = tmp_path / "fs.cptrace"
    cap = p.data_blocks_peak
    with TraceWriter(f, [sim_volume(cap)], {"source": "test"}) as w:
        run(p, "lru", False, cap, 40.0, trace=w)
    return f


def test_replay_is_deterministic_and_policies_differ(tmp_path: Path) -> None:
    f = _sim_trace(tmp_path)
    pol = parse_policy("version: 1\ndefaults: {failure_model: recoverable}\n", "a.yaml")
    a = replay(f, pol)
    b = replay(f, pol)
    assert a.ticks > 10 and a.events > 1000
    assert [d.line() for d in a.decisions] == [d.line() for d in b.decisions]
    kinds = {d.action.kind for d in a.decisions}
    assert {"promote", "discard"} <= kinds
    no_promo = parse_policy("version: 1\ndefaults: {promotion: {enabled: false}}\n", "b.yaml")
    c = replay(f, no_promo)
    assert not [d for d in c.decisions if d.action.kind == "promote"]


def test_replay_cli_diff_and_unknown_volume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _sim_trace(tmp_path)
    p1 = tmp_path / "a.yaml"
    p1.write_text("version: 1\ndefaults: {failure_model: recoverable}\n")
    p2 = tmp_path / "b.yaml"
    p2.write_text("version: 1\ndefaults: {failure_model: recoverable, promotion: {enabled: false}}\n")
    assert main(["replay", str(f), "--policy", str(p1), "--against", str(p2)]) == 0
    out = capsys.readouterr().out
    assert "-t=" in out and " promote sim0" in out and "differing lines" in out
    assert main(["replay", str(f), "--volume", "bcache9"]) == 2
    assert "unknown volume 'bcache9'" in capsys.readouterr().err


def test_record_without_volume_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:  # argparse: a required option
        main(["record", "--out", "/nonexistent/x"])
    assert e.value.code == 2 and "the following arguments are required: --volume" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [
    {"dev": DEV, "ts_ns": 1, "mode": "writeback", "dirty_bytes": -5, "hits": 0, "misses": 0, "io_errors": 0},
    {"dev": DEV, "ts_ns": 1, "mode": "writeback", "dirty_bytes": "lots", "hits": 0, "misses": 0,
     "io_errors": 0},
    {"dev": DEV, "bogus": 1},
])
def test_bad_sample_in_trace_is_a_user_error(tmp_path: Path, bad: dict) -> None:  # type: ignore[type-arg]
    f = tmp_path / "s.cptrace"
    with TraceWriter(f, [VOL]) as w:
        w.write_record(9, bad)  # T_SAMPLE, written raw: what a foreign or buggy writer could produce
        w.write(Tick(5))
    with pytest.raises(UserError, match="bad volume sample"):
        replay(f, parse_policy("version: 1\n", "p.yaml"))


def test_trace_without_volumes_is_a_user_error(tmp_path: Path) -> None:
    f = tmp_path / "n.cptrace"
    write_trace(f, [Tick(1)], [])
    with pytest.raises(UserError, match="names no volumes"):
        replay(f, parse_policy("version: 1\n", "p.yaml"))


def test_record_rejects_a_character_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--out", "/tmp/x.cptrace", "--volume", "/dev/null"]) == 2
    assert "neither a block device nor a directory" in capsys.readouterr().err  # probe's rule
