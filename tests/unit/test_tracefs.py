"""The guest scripts' trace instance (tests/vm/tracefs.py) on a fake tracefs tree: what ``mkdir instances/NAME`` and
``rmdir`` do in the kernel (the whole tree made, every event with its enable and filter; the whole tree taken down)
done by the fake, the rest by the helper as in a guest -- made, set up, read, and removed, also on error; and the
witnesses built on it (W1's bcache events, W4's bios, the hot-large test's bcache account) read and remove theirs."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

VM = Path(__file__).resolve().parents[1] / "vm"
sys.path.insert(0, str(VM))
import bcache_trace  # noqa: E402
import tracefs  # noqa: E402
from tracefs import TraceInstance  # noqa: E402

EVENTS = ("block/block_bio_queue", "bcache/bcache_write", "bcache/bcache_writeback", "bcache/bcache_read",
          "bcache/bcache_bypass_sequential", "bcache/bcache_bypass_congested", "bcache/bcache_alloc_fail")
TRACE = """# tracer: nop
     python3-77 [000] ..... 100.000000: bcache_write: 0b1c-uuid inode 0  W 2064 + 8 hit 1 bypass 0
     kworker-9  [000] ..... 130.000000: bcache_writeback: 1:2072 len 8 dirty 1
      python3-77 [000] ..... 131.000000: block_bio_queue: 253,3 WS 2048 + 16 [python3]
      kworker-9  [000] ..... 132.000000: block_bio_queue: 253,0 W 2048 + 16 [kcopyd]
"""


class FakeTracefs:
    """tracefs's instance directories as the kernel makes and removes them; what each instance's event files held
    when it was removed is kept (``removed``)."""

    def __init__(self, root: Path) -> None:
        self.root, self.removed = root, {}  # type: ignore[var-annotated]
        (root / "instances").mkdir(parents=True)
        for ev in EVENTS:
            (root / "events" / ev).mkdir(parents=True)

    def make(self, path: Path) -> None:
        path.mkdir()  # FileExistsError for a name in use, as the kernel's EEXIST
        shutil.copytree(self.root / "events", path / "events")
        for ev in EVENTS:
            (path / "events" / ev / "enable").write_text("0\n")
            (path / "events" / ev / "filter").write_text("none\n")
        (path / "trace_clock").write_text("[local] global counter uptime perf mono mono_raw boot\n")
        (path / "buffer_size_kb").write_text("1408\n")
        (path / "trace").write_text("# tracer: nop\n")
        (path / "per_cpu" / "cpu0").mkdir(parents=True)
        (path / "per_cpu" / "cpu0" / "stats").write_text("entries: 0\noverrun: 0\n")

    def remove(self, path: Path) -> None:
        self.removed[path.name] = {ev: (path / "events" / ev / "enable").read_text() for ev in EVENTS}
        shutil.rmtree(path)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTracefs:
    fs = FakeTracefs(tmp_path / "tracing")
    monkeypatch.setattr(tracefs, "make_instance", fs.make)
    monkeypatch.setattr(tracefs, "remove_instance", fs.remove)
    monkeypatch.setattr(tracefs, "TRACING", fs.root)
    return fs


def test_an_instance_is_made_with_its_clock_buffer_filters_and_events_then_read_and_removed(fake: FakeTracefs) -> None:
    inst = fake.root / "instances" / "t1"
    with TraceInstance("t1", {"block/block_bio_queue": "dev == 265289728", "bcache/bcache_read": ""},
                       clock="mono", buffer_kb=8192) as t:
        assert (inst / "trace_clock").read_text() == "mono" and (inst / "buffer_size_kb").read_text() == "8192"
        q = inst / "events" / "block" / "block_bio_queue"
        assert (q / "filter").read_text() == "dev == 265289728\n" and (q / "enable").read_text() == "1"
        assert (inst / "events" / "bcache" / "bcache_read" / "enable").read_text() == "1"
        assert (inst / "events" / "bcache" / "bcache_read" / "filter").read_text() == "none\n"  # no filter asked
        assert (inst / "events" / "bcache" / "bcache_write" / "enable").read_text() == "0\n"  # not asked for
        (inst / "trace").write_text(TRACE)
        assert t.lines()[1].endswith("hit 1 bypass 0") and not t.overran()
        t.clear()
        assert t.text() == ""
        (inst / "per_cpu" / "cpu0" / "stats").write_text("entries: 9\noverrun: 12\n")
        assert t.overran()
    assert not inst.exists()
    # its events were off before the removal (nothing more was coming in while it was read)
    assert fake.removed["t1"]["block/block_bio_queue"] == "0" and fake.removed["t1"]["bcache/bcache_read"] == "0"
    t.close()  # again: nothing


def test_an_instance_is_removed_when_the_block_fails(fake: FakeTracefs) -> None:
    with pytest.raises(RuntimeError, match="the workload failed"), \
            TraceInstance("t2", {"bcache/bcache_write": ""}) as t:
        assert t.dir.is_dir()
        raise RuntimeError("the workload failed")
    assert not (fake.root / "instances" / "t2").exists() and "t2" in fake.removed


def test_a_misspelt_event_fails_at_the_start_and_leaves_no_instance(fake: FakeTracefs) -> None:
    with pytest.raises(FileNotFoundError, match="bcache_writes"):
        TraceInstance("t3", {"bcache/bcache_write": "", "bcache/bcache_writes": ""}).open()
    assert not (fake.root / "instances" / "t3").exists()
    assert fake.removed["t3"]["bcache/bcache_write"] == "0"  # what it had enabled, off again


def test_tracefs_is_mounted_where_it_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare guest (busybox init) has nothing mounted on /sys/kernel/tracing: the helper mounts it first."""
    ran: list[list[str]] = []
    monkeypatch.setattr(tracefs.subprocess, "run", lambda argv, check: ran.append(argv))
    with pytest.raises(FileNotFoundError):  # the fake mount mounts nothing
        TraceInstance("t4", {}, root=tmp_path / "tracing").open()
    assert ran == [["mount", "-t", "tracefs", "nodev", str(tmp_path / "tracing")]]


def _guest_common() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tracefs_guest_common", Path(__file__).resolve().parents[1] / "bench" / "guest" / "common.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_witnesses_read_their_instance_and_remove_it(fake: FakeTracefs, monkeypatch: pytest.MonkeyPatch) -> None:
    common = _guest_common()
    monkeypatch.setattr(common.os, "getpid", lambda: 4242)
    dirty = common.DirtyTrace()
    inst = fake.root / "instances" / "cp-dirty-4242"
    assert (inst / "trace_clock").read_text() == "mono" and (inst / "buffer_size_kb").read_text() == "16384"
    (inst / "trace").write_text(TRACE)
    events, overrun = dirty.events()
    assert events == [(100.0, "w", 2064, 8), (130.0, "wb", 2064, 8)] and not overrun
    assert not inst.exists() and fake.removed["cp-dirty-4242"]["bcache/bcache_write"] == "0"

    bio = common.BioTrace("253:3", "253:0")
    inst = fake.root / "instances" / "cp-bio-4242"
    assert (inst / "events" / "block" / "block_bio_queue" / "filter").read_text() == (
        f"dev == {(253 << 20) | 3} || dev == {253 << 20}\n")
    (inst / "trace").write_text(TRACE)
    assert bio.events() == ([(131.0, "w", 2048, 16), (132.0, "wb", 2048, 16)], False) and not inst.exists()

    with pytest.raises(RuntimeError), common.BioTrace("253:3", "253:0"):
        raise RuntimeError("the run failed before its witness was read")
    assert not inst.exists()


def test_the_hot_large_tests_trace_starts_empty_takes_rounds_and_is_removed(fake: FakeTracefs,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bcache_trace.os, "getpid", lambda: 7)
    inst = fake.root / "instances" / "cp-bcache-7"
    tr = bcache_trace.Trace((bcache_trace.ALLOC_FAIL,))
    assert not inst.exists()  # nothing until started
    tr.start()
    assert (inst / "events" / "bcache" / "bcache_alloc_fail" / "enable").read_text() == "1"
    assert (inst / "buffer_size_kb").read_text() == "4096"
    line = "    kworker/0:1-33      [000] d..1.   101.200000: bcache_alloc_fail: 8,32 reserve 3\n"
    (inst / "trace").write_text(line * 2)
    assert [r.event for r in tr.take()] == [bcache_trace.ALLOC_FAIL] * 2 and tr.take() == []
    (inst / "trace").write_text(line)
    assert len(tr.stop()) == 1 and not inst.exists()


def test_w1s_discard_and_hit_witnesses_filter_by_device_and_pid_and_remove_theirs(
        fake: FakeTracefs, monkeypatch: pytest.MonkeyPatch) -> None:
    common = _guest_common()
    monkeypatch.setattr(common.os, "getpid", lambda: 4242)
    dev = (1 << 20) | 3  # /dev/null (1:3) stands in for the cached volume's node: only its number is read
    witness = common.DiscardWitness("/dev/null")
    inst = fake.root / "instances" / "cp-bench-4242"
    q = inst / "events" / "block" / "block_bio_queue"
    assert (q / "filter").read_text() == f"dev == {dev}\n" and (inst / "trace_clock").read_text() == "mono"
    (inst / "trace").write_text("  jbd2-9 [000] ..... 50.000000: block_bio_queue: 1,3 DS 2048 + 256 [jbd2]\n")
    assert witness.discards() == [(50.0, 2048, 256)] and not inst.exists()

    hits = common.WorkloadHits("/dev/null", 77)
    inst = fake.root / "instances" / "cp-hits-4242"
    q = inst / "events" / "block" / "block_bio_queue"
    assert (q / "filter").read_text() == f"dev == {dev} && common_pid == 77\n"
    seq = inst / "events" / "bcache" / "bcache_bypass_sequential"
    assert (seq / "filter").read_text() == "common_pid == 77\n" and (seq / "enable").read_text() == "1"
    assert (inst / "events" / "bcache" / "bcache_read" / "enable").read_text() == "1"
    (inst / "trace").write_text(
        "  python3-77 [000] ..... 60.000000: block_bio_queue: 1,3 R 2048 + 8 [python3]\n"
        "  <idle>-0   [000] ..... 60.100000: bcache_read: 254,0 R 2064 + 8 hit 1 bypass 0\n")
    got = hits.counts()
    assert (got["hits"], got["misses"], got["offset"]) == (1, 0, 16) and not inst.exists()
