"""Hostile input through the real CLI: one line naming the problem, exit 2, within 5 s and 1 GiB.

Every case runs `.venv/bin/cachepilot ...` under prlimit(1) with RLIMIT_AS = 1 GiB and RLIMIT_CPU = 5 s (the
kernel stops it past either), and its CPU time (user + system, from wait4) must stay within 5 s. CPU time, not
wall time, is the bound: this machine is shared, and wall time under load says little about the program. A
wall-clock guard of 60 s catches a process that blocks. The hostile files are generated here, in tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import zstandard

from cachepilot.events import Barrier, BarrierKind, FileKey, HotnessDelta, kdev
from cachepilot.models.volume import VolumeInfo, VolumeSample
from cachepilot.trace import Tick, TraceWriter
from cachepilot.trace.format import BLOCK, HEADER, MAGIC, T_BARRIER, T_END, T_HOT, T_META, T_SAMPLE, T_SYNC, T_TICK

CLI = str(Path(sys.executable).parent / "cachepilot")
LIMIT_AS = 1 << 30
CPU_S = 5.0
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"  # util-linux
WALL_GUARD_S = 60.0
DEV = kdev(252, 0)
VOL = {"dev": DEV, "name": "bcache0", "kind": "bcache", "fs_uuid": "abcd-1234", "mountpoint": "/srv",
       "cache_bytes": 1 << 30, "fs_block_size": 4096, "fs_discard": False}


def run_cli(*args: str, wall_s: float = WALL_GUARD_S) -> subprocess.CompletedProcess[str]:
    """Run the CLI under the limits; fails the test past the CPU bound or the wall-clock guard."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # prlimit(1) sets the limits and execs the CLI in place (same pid): no preexec_fn in a threaded test
        limits = [PRLIMIT, f"--as={LIMIT_AS}", f"--cpu={int(CPU_S)}:{int(CPU_S) + 1}", "--"]
        proc = subprocess.Popen([*limits, CLI, *args], stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + wall_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"cachepilot {' '.join(args)}: no answer within {wall_s} s of wall time")
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        assert cpu <= CPU_S, f"cachepilot {' '.join(args)}: {cpu:.1f} s of CPU (bound {CPU_S} s)"
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def assert_one_line(r: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = r.stderr.splitlines()
    assert r.returncode == 2, f"exit {r.returncode}, stderr: {r.stderr[-2000:]}"
    assert len(lines) == 1, f"expected one stderr line, got: {r.stderr[-2000:]}"
    assert lines[0].startswith("cachepilot: ")
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"


# ------------------------------------------------------------------ policies

def _bomb(levels: int = 9) -> str:
    out = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    out += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(out) + "\n"


def _rules(n: int, extra: str = "") -> str:
    body = "".join(f"  - name: r{i}\n    match: {{mountpoint: /srv/v{i}}}\n    failure_model: recoverable\n"
                   for i in range(n))
    return "version: 1\nvolumes:\n" + body + extra


POLICIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "alias-bomb": (_bomb(), ("anchors",)),
    "alias-only": ("version: 1\ndefaults: *x\n", ("YAML",)),
    "merge-key": ("version: 1\ndefaults:\n  <<: {failure_model: recoverable}\n", ("merge keys",)),
    # PyYAML >= 6.0.4 stops at its own depth limit ("exceeded maximum nesting depth") before ours ("nested deeper")
    "deep-nesting": ("version: 1\nx: " + "[" * 200_000 + "]" * 200_000 + "\n", ("nest",)),
    "deep-mapping": ("version: 1\nx: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n", ("nest",)),
    "huge-integer": ("version: 1\ndefaults:\n  promotion: {rate: " + "9" * 5000 + "}\n", ("number too long",)),
    "big-integer": ("version: 1\ndefaults:\n  promotion: {rate: 99999999999999999999999}\n", ("out of range",)),
    "huge-size-string": ("version: 1\ndefaults:\n  exposure: {max_dirty: '" + "9" * 400 + " TiB'}\n",
                         ("max_dirty",)),
    "size-overflow": ("version: 1\ndefaults:\n  exposure: {max_dirty: 99999999999 TiB}\n", ("larger than 1 EiB",)),
    "inf-duration": ("version: 1\ndefaults:\n  exposure: {max_age: .inf}\n", ("not a finite number",)),
    "nan-duration": ("version: 1\ndefaults:\n  discard_on_delete: {interval: .nan}\n", ("not a finite number",)),
    "tiny-duration": ("version: 1\ndefaults:\n  discard_on_delete: {interval: 0.0000001}\n", ("shorter than 1 ms",)),
    "tiny-half-life": ("version: 1\nhotness: {half_life: 1ms}\n", ("hotness.half_life",)),
    "zero-max-age": ("version: 1\ndefaults:\n  exposure: {max_age: 0}\n", ("max_age",)),
    "huge-duration": ("version: 1\ndefaults:\n  exposure: {max_age: 999999999d}\n", ("longer than a year",)),
    "discard-budget": ("version: 1\ndefaults:\n  discard_on_delete: {interval: 1s, max_rate: 1KiB, "
                       "min_extent: 64KiB}\n", ("no extent could ever be released",)),
    "python-tag": ("version: 1\ndefaults: !!python/object/apply:os.system ['true']\n", ("unsupported YAML tag",)),
    "binary-value": ("version: 1\ndefaults:\n  knobs: {readahead: !!binary aGk=}\n", ("unsupported value",)),
    "date-value": ("version: 1\ndefaults:\n  exposure: {max_age: 2001-01-01}\n", ("unsupported value",)),
    "two-documents": ("version: 1\n---\nversion: 1\n", ("more than one YAML document",)),
    "key-is-list": ("version: 1\n? [a]\n: 1\n", ("keys must be strings",)),
    "too-many-rules": (_rules(10_001), ("at most 10000",)),
    "overlap-after-8000": (_rules(8000, "  - name: dup\n    match: {mountpoint: /srv/v7}\n"), ("overlaps rule 'r7'",)),
}


@pytest.mark.parametrize("case", sorted(POLICIES))
def test_hostile_policy(batch: dict[str, Result], case: str) -> None:
    assert_one_line(batch[f"policy:{case}"](), f"{case}.yaml", *POLICIES[case][1])


# ------------------------------------------------------------------ files that are not files

HOSTILE_FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    # a FIFO nobody writes to: opening it must not wait for a writer
    "fifo": (lambda p: os.mkfifo(p), "a FIFO or pipe, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
    "sparse-5GiB": (lambda p: p.write_bytes(b"") or os.truncate(p, 5 << 30), "larger than"),  # checked before a read
    "directory": (lambda p: p.mkdir(), "a directory, not a regular file"),
}
WHAT = {"config": ("run", "--check", "--config"), "policy": ("policy", "check"), "trace": ("replay",)}
FILE_WALL_S = 10.0  # a blocking open would hang for good: fail fast (CPU time is bounded by run_cli)


@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
@pytest.mark.parametrize("what", sorted(WHAT))
def test_a_file_that_is_not_a_plain_small_file(tmp_path: Path, what: str, kind: str) -> None:
    """A FIFO, /dev/zero (through a symlink), a sparse 5 GiB file or a directory given as a configuration,
    policy or trace: one line naming the file and what it is, exit 2, at once, in bounded memory."""
    f = tmp_path / f"{kind}.{what}"
    make, expect = HOSTILE_FILES[kind]
    make(f)
    if what == "trace" and kind == "fifo":
        expect = "file too short: 0 bytes"  # a trace may be a stream: a FIFO without a writer is empty
    if what == "trace" and kind == "sparse-5GiB":
        expect = "bad magic"  # a trace is streamed block by block: its size is no bound, its header is read
    assert_one_line(run_cli(*WHAT[what], str(f), wall_s=FILE_WALL_S), str(f), expect)


def test_replay_reads_a_trace_from_a_pipe(tmp_path: Path) -> None:
    """`replay /dev/stdin` given a pipe streams it; --against (two passes) says it needs a file."""
    f = tmp_path / "t.cptrace"
    with TraceWriter(f, [VolumeInfo(**VOL)]) as w:  # type: ignore[arg-type]
        w.write_many([HotnessDelta(FileKey(DEV, 12, 1), 64, 0, 4096, 0, 1, 4096), Tick(1), Tick(2)])
    data = f.read_bytes()
    r = subprocess.run([CLI, "replay", "-q", "/dev/stdin"], input=data, capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.decode().startswith("# 4 records, 2 ticks"), r
    r = subprocess.run([CLI, "replay", "-q", "/dev/stdin", "--against", str(f)], input=data, capture_output=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.decode().splitlines() == [
        "cachepilot: /dev/stdin: --against replays the trace twice: give a file, not a pipe"], r


def test_replay_of_a_cut_trace_says_so(tmp_path: Path) -> None:
    """A trace without its END block (its writer killed) replays up to its last complete block: exit 0, one
    warning line, and the summary says where it was cut."""
    f = tmp_path / "t.cptrace"
    with TraceWriter(f, [VolumeInfo(**VOL)]) as w:  # type: ignore[arg-type]
        w.write_many([Tick(1), HotnessDelta(FileKey(DEV, 12, 1), 64, 0, 4096, 0, 1, 4096), Tick(2)])
    data = f.read_bytes()
    f.write_bytes(data[:-BLOCK.size - 3])  # END gone, the last tick block cut in its payload
    r = run_cli("replay", "-q", str(f))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"cachepilot: warning: {f}: trace cut at offset {len(data) - 2 * BLOCK.size - 8} "
                                     "(no END block: its writer was stopped); read 3 records up to there"]
    assert r.stdout.startswith("# 3 records, 1 ticks") and "trace cut at offset" in r.stdout, r.stdout


def test_simulate_trace_out_to_a_full_disk() -> None:
    assert_one_line(run_cli("simulate", "--workload", "varmail", "--trace-out", "/dev/full"),
                    "/dev/full: cannot write trace: No space left on device")


def test_8000_rules_check_in_linear_time(tmp_path: Path) -> None:
    f = tmp_path / "many.yaml"
    f.write_text(_rules(8000))
    r = run_cli("policy", "check", str(f))
    assert r.returncode == 0, r.stderr
    assert "8000 volume rule(s)" in r.stdout


def test_hostile_policy_given_to_replay(tmp_path: Path) -> None:
    f = tmp_path / "inf.yaml"
    f.write_text("version: 1\ndefaults:\n  exposure: {max_age: .inf}\n")
    t = tmp_path / "t.cptrace"
    with TraceWriter(t, [VolumeInfo(**VOL)]) as w:  # type: ignore[arg-type]
        w.write(Tick(1))
    assert_one_line(run_cli("replay", str(t), "--policy", str(f)), "not a finite number")


# ------------------------------------------------------------------ traces

def _block(t: int, payload: bytes, count: int, codec: int = 0) -> bytes:
    return BLOCK.pack(t, codec, 0, count, len(payload), zlib.crc32(payload)) + payload


def _trace(*blocks: tuple[int, bytes, int] | tuple[int, bytes, int, int], version: int = 2,
           meta: object | None = None) -> bytes:
    """A trace with valid CRCs: header, meta block (unless meta is given as raw blocks), blocks, END."""
    out = HEADER.pack(MAGIC, version, 0, 0)
    total = 0
    if meta is None:
        meta = {"volumes": [VOL]}
    if meta is not False:
        m = json.dumps(meta).encode()
        out += _block(T_META, m, 1)
        total += 1
    for b in blocks:
        out += _block(*b)
        total += b[2]
    return out + _block(T_END, b"", total)


def _barrier(kind: int) -> bytes:
    return struct.pack("<IBQIQqQQIQB", DEV, kind, 0, 0, 4096, 1, 0, 0, 0, 0, 1)


def _zlib_bomb(nbytes: int) -> bytes:
    """A zlib stream that inflates to nbytes of zeros, made cheaply: after a full flush the compressor's
    state is reset, so each 16 MiB piece compresses to the same bytes and can be repeated. (It has no
    final checksum: an unbounded reader inflates all of it before noticing.)"""
    c = zlib.compressobj(9)
    chunk = bytes(16 << 20)
    head = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    piece = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    return head + piece * (nbytes // len(chunk) - 1)


def _zstd(data: bytes, size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=size).compress(data)


def _sample(**over: object) -> bytes:
    s = {"dev": DEV, "ts_ns": 1, "mode": "writeback", "dirty_bytes": 0, "hits": 0, "misses": 0,
         "io_errors": 0, "failed": False, "knobs": {}}
    s.update(over)
    return json.dumps(s).encode()


TRACES: dict[str, tuple[Callable[[], bytes], tuple[str, ...]]] = {
    "unknown-barrier-kind": (lambda: _trace((T_BARRIER, _barrier(99), 1)), ("unknown barrier kind 99",)),
    "sync-calls-of-a-block-kind": (lambda: _trace((T_SYNC, struct.pack("<IBQIQq", DEV, 1, 1, 1, 1, 1), 1)),
                                   ("unknown sync calls kind 1",)),
    "empty-meta-block": (lambda: _trace((T_META, b"", 0), meta=False), ("meta block",)),
    "meta-not-an-object": (lambda: _trace(meta=[1, 2, 3]), ("meta block",)),
    "meta-volumes-not-a-list": (lambda: _trace(meta={"volumes": {"a": 1}}), ("'volumes' must be a list",)),
    "meta-nested-json": (lambda: _trace((T_META, b"[" * 100_000 + b"]" * 100_000, 1), meta=False),
                         ("corrupt JSON",)),
    "volume-wrong-types": (lambda: _trace(meta={"volumes": [{**VOL, "dev": "x", "name": 5}]}),
                           ("field 'dev' must be int",)),
    "volume-nested-field": (lambda: _trace(meta={"volumes": [{**VOL, "name": {"a": [1]}}]}),
                            ("field 'name' must be str",)),
    "volume-unknown-field": (lambda: _trace(meta={"volumes": [{**VOL, "evil": 1}]}), ("unknown field 'evil'",)),
    "fs-block-size-0": (lambda: _trace(meta={"volumes": [{**VOL, "fs_block_size": 0}]}), ("fs_block_size 0",)),
    "dev-out-of-range": (lambda: _trace(meta={"volumes": [{**VOL, "dev": 1 << 40}]}), ("dev",)),
    "duplicate-volume": (lambda: _trace(meta={"volumes": [VOL, VOL]}), ("two volumes",)),
    "no-volumes": (lambda: _trace(meta={"volumes": []}), ("names no volumes",)),
    "sample-wrong-types": (lambda: _trace((T_SAMPLE, _sample(dirty_bytes="lots"), 1)),
                           ("field 'dirty_bytes' must be int",)),
    "sample-knobs-nested": (lambda: _trace((T_SAMPLE, _sample(knobs={"a": {"b": 1}}), 1)), ("knobs",)),
    "sample-not-object": (lambda: _trace((T_SAMPLE, b"[1]", 1)), ("JSON objects",)),
    "zlib-bomb": (lambda: _trace((T_HOT, _zlib_bomb(2 << 30), 1, 1)), ("inflates beyond",)),
    "zlib-bomb-json": (lambda: _trace((T_SAMPLE, _zlib_bomb(1 << 30), 1, 1)), ("inflates beyond",)),
    "zstd-bomb": (lambda: _trace((T_HOT, _zstd(bytes(1 << 20)), 1, 2)), ("inflates beyond 56 bytes",)),
    "zstd-bomb-json": (lambda: _trace((T_SAMPLE, _zstd(bytes((64 << 20) + 1)), 1, 2)), ("inflates beyond",)),
    "zstd-no-size": (lambda: _trace((T_HOT, _zstd(bytes(56), size=False), 1, 2)), ("does not declare its size",)),
    "zstd-truncated-frame": (lambda: _trace((T_HOT, _zstd(bytes(56 * 18))[:-3], 18, 2)),
                             ("corrupt compressed block",)),
    "tick-far-future": (lambda: _trace((T_TICK, struct.pack("<q", (1 << 63) - 1), 1)), ("outside 0..136 years",)),
    "tick-negative": (lambda: _trace((T_TICK, struct.pack("<q", -1), 1)), ("outside 0..136 years",)),
    "huge-count": (lambda: _trace((T_HOT, b"", 1 << 30)), ("records (at most",)),
    "huge-length": (lambda: HEADER.pack(MAGIC, 2, 0, 0) + BLOCK.pack(T_META, 0, 0, 1, 1 << 31, 0),
                    ("block of 2147483648 bytes",)),
    "unknown-block-type": (lambda: _trace((42, b"x", 1)), ("unknown block type 42",)),
    "unknown-codec": (lambda: _trace((T_HOT, b"x" * 56, 1, 7)), ("unknown codec 7",)),
    "sync-block-in-v1": (lambda: _trace((T_SYNC, b"x" * 38, 1), version=1), ("unknown block type 11",)),
    "version-3": (lambda: _trace(version=3), ("version 3",)),
    "cut-in-meta-block": (lambda: _trace()[:HEADER.size + 20], ("cut at offset 16, before its meta block ended",)),
    "garbage-after-end": (lambda: _trace() + b"junk", ("garbage after the END",)),
    "bad-crc": (lambda: _trace()[:30] + b"X" + _trace()[31:], ("CRC",)),
    "empty-file": (lambda: b"", ("too short",)),
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_hostile_trace(batch: dict[str, Result], case: str) -> None:
    assert_one_line(batch[f"trace:{case}"](), *TRACES[case][1])


Result = Callable[[], subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every policy and trace case, written and run two at a time (each process's own CPU time is what is
    bounded, so running them side by side changes nothing but the wall time of this module)."""
    d = tmp_path_factory.mktemp("hostile")
    jobs: dict[str, list[str]] = {}
    for case, (text, _) in POLICIES.items():
        (d / f"{case}.yaml").write_text(text)
        jobs[f"policy:{case}"] = ["policy", "check", str(d / f"{case}.yaml")]
    for case, (make, _) in TRACES.items():
        (d / f"{case}.cptrace").write_bytes(make())
        jobs[f"trace:{case}"] = ["replay", str(d / f"{case}.cptrace")]

    def one(args: list[str]) -> Result:
        try:
            r = run_cli(*args)
        except BaseException as exc:  # noqa: BLE001 -- pytest's Failed and assertion errors, re-raised in the test
            err = exc

            def fail() -> subprocess.CompletedProcess[str]:
                raise err
            return fail
        return lambda: r

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(one, jobs.values()), strict=True))


def test_trace_dev_zero() -> None:
    """Not even the header is read from a character device (/dev/zero never ends)."""
    assert_one_line(run_cli("replay", "/dev/zero"), "a character device, not a regular file")


def test_trace_directory_and_missing(tmp_path: Path) -> None:
    assert_one_line(run_cli("replay", str(tmp_path)), "cannot read trace")
    assert_one_line(run_cli("replay", str(tmp_path / "nope.cptrace")), "no such trace")


def test_simulate_trace_out_into_missing_directory(tmp_path: Path) -> None:
    r = run_cli("simulate", "--workload", "varmail", "--trace-out", str(tmp_path / "no" / "such" / "t.cptrace"))
    assert_one_line(r, "cannot write trace")


def test_replay_warns_about_volumes_missing_from_meta(tmp_path: Path) -> None:
    f = tmp_path / "t.cptrace"
    other = kdev(252, 7)
    with TraceWriter(f, [VolumeInfo(**VOL)]) as w:  # type: ignore[arg-type]
        w.write(HotnessDelta(FileKey(other, 12, 1), 64, 0, 4096, 0, 1, 4096))
        w.write(Barrier(other, BarrierKind.PREFLUSH, 0, 0, 4096, 2))
        w.write(VolumeSample(other, 3, "writeback", 0, 0, 0, 0))
        w.write(Tick(4))
    r = run_cli("replay", "-q", str(f))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "3 events" in lines[0] and "252:7" in lines[0], r.stderr
