"""Work bounded by what an input can amplify into, not only by its bytes (issue 33, cases 3 and 4), through the real
CLI under the unit's memory ceiling: each process runs under prlimit with RLIMIT_AS = MemoryMax (512 MiB, see
controller/cachepilot/data/cachepilot.service) and a CPU limit, and must refuse with exit 2 and one short line.

On main before this change: a 4 MiB policy whose pin.paths is one long list was refused with an error "line" of
megabytes; a 32 MiB hot list of ``{}`` died of the memory limit (870 MB to refuse unlimited); a trace of a few KB whose
sample block inflates to 64 MiB of JSON died of it too (1.7 GB unlimited), in `replay` and `advise`; a hotness block
naming 100 000 distinct unknown devices took minutes (one pass over the block per device)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

import cachepilot
from cachepilot.models.hotness import HOT_DTYPE
from cachepilot.sim.runner import sim_volume
from cachepilot.trace.format import BLOCK, T_HOT, T_SAMPLE, ZSTD, TraceWriter

CLI = str(Path(sys.executable).parent / "cachepilot")
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
SERVICE = Path(cachepilot.__file__).parent / "data" / "cachepilot.service"


def memory_max() -> int:
    m = re.search(r"^MemoryMax=(\d+)M$", SERVICE.read_text(), re.M)
    assert m, f"{SERVICE}: no MemoryMax=NM line (the ceiling these tests hold the tools to)"
    return int(m.group(1)) << 20


def limited(*args: str, cpu_s: int = 10, wall_s: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([PRLIMIT, f"--as={memory_max()}", f"--cpu={cpu_s}", "--", CLI, *args],
                       capture_output=True, text=True, timeout=wall_s)
    return r, time.monotonic() - t0


def refused(r: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, f"exit {r.returncode}: {r.stderr[-600:]}"
    line = lines[0]
    assert len(line) < 300 and "Traceback" not in line and all(w in line for w in words), line[:600]
    return line


# ------------------------------------------------------------------ policies
def test_a_4_mib_pin_list_is_refused_in_one_short_line(tmp_path: Path) -> None:
    head = "version: 1\ndefaults:\n  promotion: {enabled: true}\n  pin:\n    max_bytes: 1GiB\n    paths:\n"
    f = tmp_path / "p.yaml"
    f.write_text(head + "    - a\n" * (((4 << 20) - len(head) - 64) // 8))
    r, took = limited("policy", "check", str(f))
    refused(r, "p.yaml:", "defaults.pin.paths", "at most 10000")
    assert took < 10


def test_a_list_within_the_item_cap_but_over_the_schema_says_how_many(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    paths = ",".join(["a" * 40] * 9000)
    f.write_text("version: 1\ndefaults:\n  promotion: {enabled: true}\n"
                 f"  pin: {{max_bytes: 1GiB, paths: [{paths}]}}\n")
    r, _ = limited("policy", "check", str(f))
    assert refused(r).endswith("defaults.pin.paths: 9000 items (at most 256)")


# ------------------------------------------------------------------ hot lists
def test_a_32_mib_hot_list_of_empty_objects_is_counted_before_it_is_built(tmp_path: Path) -> None:
    f = tmp_path / "hot.json"
    n = (32 << 20) // 3 - 100
    f.write_bytes(b'{"format":"cachepilot-hotlist","version":1,"files":[' + b"{}," * n + b"{}]}")
    r, took = limited("hotlist", "import", "bcache0", str(f), "--socket", str(tmp_path / "none.sock"))
    refused(r, "hot.json: not a hot-list file:", "JSON values")
    assert took < 10


# ------------------------------------------------------------------ traces
def _trace_with(tmp_path: Path, t: int, count: int, payload: bytes) -> Path:
    """A valid trace (meta block) cut after one hostile block (the reader takes a cut trace up to its last
    complete block, so the block is read)."""
    f = tmp_path / "bomb.cptrace"
    w = TraceWriter(f, [sim_volume(1024)])
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
    w.f.write(BLOCK.pack(t, ZSTD, 0, count, len(frame), zlib.crc32(frame)) + frame)
    w.f.close()  # no END block
    return f


@pytest.mark.parametrize("command", [["replay"], ["advise", "sim0", "--trace"]])
def test_a_sample_block_inflating_to_64_mib_of_json_is_refused_before_inflating(tmp_path: Path,
                                                                                command: list[str]) -> None:
    line = b'{"x":[' + b"[]," * ((1 << 20) // 3 - 10) + b"[]]}"
    f = _trace_with(tmp_path, T_SAMPLE, 64, b"\n".join([line] * 64))
    assert f.stat().st_size < 64 << 10
    r, took = limited(*command, str(f))
    refused(r, "bomb.cptrace: offset", "sample")
    assert took < 10


def test_a_json_block_within_its_bytes_but_of_a_million_values_is_refused(tmp_path: Path) -> None:
    line = b'{"x":[' + b"0," * ((1 << 20) // 2 - 10) + b"0]}"
    f = _trace_with(tmp_path, T_SAMPLE, 7, b"\n".join([line] * 7))
    r, _ = limited("replay", str(f))
    refused(r, "sample block of", "JSON values (at most 1048576)")


def test_a_hotness_block_of_distinct_unknown_devices_replays_in_linear_time(tmp_path: Path) -> None:
    n = 200_000
    arr = np.zeros(n, dtype=HOT_DTYPE)
    arr["dev"] = np.arange(1, n + 1, dtype=np.uint32) + 0x1000_0000  # none of them is the meta block's volume
    arr["ino"] = 12
    arr["rs"] = 64
    f = _trace_with(tmp_path, T_HOT, n, arr.tobytes())  # one block (a writer cuts blocks at 8192 records)
    r, took = limited("replay", str(f), cpu_s=20)
    assert r.returncode == 0, r.stderr[-600:]
    warning = [x for x in r.stderr.splitlines() if "events of volumes missing" in x]
    assert len(warning) == 1 and f"{n} events" in warning[0] and len(warning[0]) < 400, warning
    assert took < 15


def test_blocks_of_new_inodes_stop_at_the_replay_files_cap(tmp_path: Path) -> None:
    """Each hotness block may name 2^20 files never seen before: the replayed engine's table grew by ~120 B a file
    without bound (3 blocks: 570 MB, beyond the ceiling); now one line once it tracks more than 2^19."""
    f = tmp_path / "inos.cptrace"
    v = sim_volume(1024)
    w = TraceWriter(f, [v])
    n = 1 << 20
    for b in range(3):
        arr = np.zeros(n, dtype=HOT_DTYPE)
        arr["dev"], arr["ino"], arr["gen"], arr["rs"] = v.dev, np.arange(n) + b * n + 100, 1, 64
        frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(arr.tobytes())
        w.f.write(BLOCK.pack(T_HOT, ZSTD, 0, n, len(frame), zlib.crc32(frame)) + frame)
    w.f.close()
    r, took = limited("replay", str(f), cpu_s=20)
    refused(r, "inos.cptrace: offset", "more than 524288 distinct files tracked at once")
    assert took < 15
