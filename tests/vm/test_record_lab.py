"""Discovery, sampling and record -> replay on real cached volumes in the lab."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from typing import Any

import pytest

from cachepilot.events import Barrier, Delete, FreedExtent, HotnessDelta, SyncCalls
from cachepilot.models.epochs import closes
from cachepilot.models.volume import VolumeSample
from cachepilot.policy import DEFAULT_POLICY
from cachepilot.trace import replay
from cachepilot.trace.format import TraceReader

pytestmark = pytest.mark.vm

EXPECT = {  # recipe: (kind, mode the lab sets up)
    "bcache": ("bcache", "writethrough"),
    "dmcache": ("dm-cache", "writeback"),
    "writecache": ("dm-writecache", "writeback"),
}


# On bcache the description comes from the recording's guest, before it records (the description only reads): its
# own boot cost ~20 s of the suite
ON_BCACHE = ('tests/vm/smoke/describe.sh > "$LAB_OUT/describe.json" || echo "describe_rc=$?"\n'
             "exec tests/vm/smoke/record.sh\n")


@pytest.fixture(scope="module")
def bcache_run(lab) -> Any:
    """One bcache guest for this module: the description, then the recording."""
    return lab.run(["bash", "-c", ON_BCACHE], recipe="bcache", timeout=400)


@pytest.mark.parametrize("recipe", sorted(EXPECT))
def test_describe_and_sample_a_cached_volume(lab, request, recipe):
    if recipe == "bcache":
        r = request.getfixturevalue("bcache_run")
        assert "describe_rc" not in r.values, r.explain()
        got = json.loads((r.out / "describe.json").read_text())
    else:
        r = lab.run(["tests/vm/smoke/describe.sh"], recipe=recipe)
        assert r.rc == 0, r.explain()
        got = json.loads(r.stdout)
    info, sample = got["info"], got["sample"]
    kind, mode = EXPECT[recipe]
    assert info["kind"] == kind
    assert info["mountpoint"] == "/mnt/lab" and info["fs_block_size"] == 4096 and not info["fs_discard"]
    assert len(info["fs_uuid"]) == 36, info
    # the lab's cache device is 256 MiB; dm-cache keeps 16 MiB of it for metadata
    assert 200 << 20 <= info["cache_bytes"] <= 256 << 20, info
    assert sample["mode"] == mode and not sample["failed"] and sample["io_errors"] == 0, sample
    assert sample["hits"] >= 0 and sample["misses"] >= 0 and sample["dirty_bytes"] >= 0


def test_record_then_replay_on_bcache(bcache_run, tmp_path):
    r = bcache_run
    assert r.rc == 0 and r.int("record_rc") == 0, r.explain()
    hot, gone = r.int("hot_ino"), r.int("gone_ino")
    trace = r.out / "run.cptrace"

    read_score: dict[int, int] = defaultdict(int)
    freed_blocks: dict[int, int] = defaultdict(int)
    deletes, samples = [], []
    closing = syncs = 0
    for ev in TraceReader(trace).events():
        if isinstance(ev, Barrier):
            closing += closes(ev)
            syncs += not closes(ev) and ev.kind >= 4  # file-level kinds (fsync & co.)
        elif isinstance(ev, SyncCalls):
            syncs += ev.calls
        if isinstance(ev, HotnessDelta):
            read_score[ev.key.ino] += ev.read_score
        elif isinstance(ev, FreedExtent) and not ev.metadata:
            freed_blocks[ev.ino] += ev.count
        elif isinstance(ev, Delete):
            deletes.append(ev)
        elif isinstance(ev, VolumeSample):
            samples.append(ev)
    # 3 passes x 16 O_DIRECT reads of 4 KiB, 64 points each; the deleted 256 KiB file frees 64 blocks
    assert read_score[hot] == 3 * 16 * 64, dict(read_score)
    assert freed_blocks[gone] == 64, dict(freed_blocks)
    assert [(d.key.ino, d.size) for d in deletes] == [(gone, 256 << 10)]
    assert samples and all(s.mode == "writethrough" and not s.failed for s in samples)

    # one epoch contract: the replay sees the epochs the live recording saw; fsyncs annotate, flushes close
    live = (r.out / "record.out").read_text()
    replayed = replay(trace, DEFAULT_POLICY).engine.volume("bcache0").epochs  # type: ignore[union-attr]
    assert f"epochs bcache0: {replayed.summary()}" in live, (live, replayed.summary())
    assert syncs >= 7 and replayed.total_syncs == syncs  # 2 dd conv=fsync + 5 fsync'd appends, at least
    assert replayed.total_barriers == closing >= 1

    policy = tmp_path / "fast-discard.yaml"
    # only_uncached false: the hot file's O_DIRECT reads were not bypassed, so bcache inserted them itself and the
    # shipped rule would (rightly) skip it; here the replay must reproduce a promotion decision
    policy.write_text("version: 1\ndefaults:\n  discard_on_delete: {enabled: true, interval: 1s, min_extent: 4KiB}\n"
                      "  promotion: {only_uncached: false}\n")
    cmd = [sys.executable, "-m", "cachepilot.cli", "replay", str(trace), "--policy", str(policy)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    def decisions(out: str) -> list[str]:
        return [ln for ln in out.splitlines() if not ln.startswith("#")]  # the summary line has the CPU time

    assert decisions(first.stdout) == decisions(second.stdout)  # deterministic
    lines = first.stdout.splitlines()
    assert any(" promote bcache0 " in ln and f"ino={hot} " in ln for ln in lines), first.stdout
    assert any(" discard bcache0 " in ln and "bytes=262144" in ln for ln in lines), first.stdout
