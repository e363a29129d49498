"""A tick with many tracked files (issue 32: tick p99 <= 100 ms with 1 M files, bench_daemon_files.py): file
decisions made into records only when read, a volume's hot list computed once a tick and from its own files, the
state file written off the loop thread, and the state document encoded once."""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.actions import Promote
from cachepilot.backends.base import DONE, Outcome
from cachepilot.daemon import acting, decisionlog, snapshot
from cachepilot.daemon.answers import TOP_K
from cachepilot.daemon.snapshot import HotLists, kth_largest
from cachepilot.daemon.state import StateFile, _encode
from cachepilot.daemon.statewriter import StateWriter
from cachepilot.models.hotness import HOT_DTYPE, HotnessTable
from tests.unit.daemon_rig import Rig
from tests.unit.test_daemon_cost import FS, acting_on

NS = 1_000_000_000


class DonePromoter:
    def run(self, action: Promote, dry_run: bool) -> Outcome:
        return Outcome(action, DONE, dry_run, actuated=True, read_bytes=8192, reads=1)


def test_a_storm_of_promotions_is_made_into_records_only_as_far_as_they_are_read(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cachepilot")
    lines = []
    real = Promote.line
    monkeypatch.setattr(Promote, "line", lambda self: lines.append(1) or real(self))
    v, counters, actor = acting_on(DonePromoter())
    n = 3 * acting.DECISIONS_KEPT
    for ino in range(n):
        actor.execute(Promote("bcache0", FS, ino, 1, ((0, 8192),), "hot"), 0, dry_run=False)
    said = actor.lines.burst  # the INFO lines within the storm's budget are formatted, the rest not
    assert len(caplog.records) == said and len(lines) == said  # eager records: an action line each (3 000 more)
    kept = list(actor.decisions)
    assert len(kept) == acting.DECISIONS_KEPT and len(lines) == said + acting.DECISIONS_KEPT
    last = kept[-1]
    assert last["action"] == f"promote bcache0 ino={n - 1} gen=1 bytes=8192: hot" and last["status"] == "done"
    assert last["kind"] == "promote" and last["writes"] == [] and last["error"] is None and last["attempt"] == 0
    assert list(actor.decisions)[-1] is last  # made once
    assert counters["decisions.promote"] == n and v.promoted_bytes == 8192 * n


def test_a_file_decision_made_late_is_the_one_made_at_once() -> None:
    out = Outcome(Promote("bcache0", FS, 12, 1, ((0, 8192),), "hot"), DONE, actuated=True, read_bytes=8192, reads=1)
    late = decisionlog.FileDecision(out, 12.5, attempt=2, note="again")
    assert late.made() == decisionlog.decision(out, 12.5, 2, "again")
    log = decisionlog.DecisionLog(4)
    log.append({"kind": "drain", "n": 0})
    log.append_file(late)
    assert [d.get("kind") for d in log] == ["drain", "promote"] and log.last(1)[1]["attempt"] == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1 << 40) | st.integers(0, 70), min_size=1, max_size=200), st.data())
def test_kth_largest_counted_or_partitioned_is_the_sorted_kth(xs: list[int], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(xs)))
    assert kth_largest(np.array(xs, dtype=np.int64), k) == sorted(xs, reverse=True)[k - 1]


def table(n: int, devs: int) -> HotnessTable:
    t = HotnessTable()
    rec = np.zeros(n, dtype=HOT_DTYPE)
    j = np.arange(n)
    rec["dev"], rec["ino"], rec["gen"] = j % devs + 1, j + 12, 1
    rec["rs"], rec["size"], rec["last"] = 1 + (j * 7919) % 64, 16384, j % 5
    t.apply_array(rec)
    return t


def test_hot_lists_are_made_in_turn_a_share_of_the_volumes_a_tick_from_each_volumes_own_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = table(4000, 4)
    monkeypatch.setattr(t, "_live_slots", None)  # never a walk of the whole table
    made: list[int] = []
    real = snapshot.hot_columns
    monkeypatch.setattr(snapshot, "hot_columns",
                        lambda tt, dev, k, head=None: made.append(dev) or real(tt, dev, k, head))
    hot = HotLists(t, 500, every_s=2.0)
    devs = [1, 2, 3, 4]
    for tick in range(6):  # 1 s ticks: half of the volumes a tick, each every 2 s
        made.clear()
        hot.refresh(devs, tick * NS, NS)
        assert sorted(made) == ([1, 2] if tick % 2 == 0 else [3, 4]), (tick, made)  # all four at once: the old way
    assert all((hot.columns(2, 4 * NS)[f] == real(t, 2, 500)[f]).all() for f in snapshot.FIELDS)
    assert set(real(t, 2, 5000)["ino"].tolist()) == {i + 12 for i in range(4000) if i % 4 == 1}
    hot.refresh([1, 2], 6 * NS, NS)  # volumes 3 and 4 gone: their lists too
    assert sorted(hot._made) == [1, 2]


def test_a_hot_list_keeps_what_only_top_shows_for_its_head_and_reads_back_the_same_rows(tmp_path: Path) -> None:
    """The state file's rows (identity, score, size) for all k files and `top`'s for the head, as the full list
    has them, in about half the bytes (52 a file before, issue 32); the daemon's lists are made so."""
    t = table(4000, 4)
    full, narrow = snapshot.hot_columns(t, 2, 800), snapshot.hot_columns(t, 2, 800, head=25)
    assert snapshot.as_dicts(narrow, 25) == snapshot.as_dicts(full, 25)
    row = ("ino", "gen", "score", "size")
    assert snapshot.as_rows(narrow, row) == snapshot.as_rows(full, row) and len(narrow["ino"]) == 800
    assert sum(c.nbytes for c in narrow.values()) <= 25 * 800
    r = Rig(tmp_path)
    assert r.d.hot.head == TOP_K
    r.d.shutdown()


def test_the_state_document_is_encoded_once_in_the_format_of_the_outer_object() -> None:
    doc = {"volumes": {"b": {"hot": [[1, 2, 3, 4]]}}, "decisions": [{"reason": "é\u2028\"x\""}], "version": 1}
    body = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    old = json.dumps({"crc32": zlib.crc32(body.encode()), "state": doc}, sort_keys=True,
                     separators=(",", ":")).encode() + b"\n"
    assert _encode(doc) == old


class SlowStateFile(StateFile):
    """A disk that takes ``delay`` s a write; remembers what was written, in order."""

    def __init__(self, directory: Path, delay: float) -> None:
        super().__init__(directory)
        self.delay = delay
        self.written: list[Any] = []
        self.lock = threading.Lock()

    def write(self, doc: dict[str, Any]) -> bool:
        time.sleep(self.delay)
        ok = super().write(doc)
        with self.lock:
            self.written.append(doc.get("n"))
        return ok


def test_a_tick_hands_its_state_file_to_the_writer_and_does_not_wait_for_the_disk(tmp_path: Path) -> None:
    r = Rig(tmp_path)
    slow = SlowStateFile(tmp_path / "st", 0.6)
    r.d.state = r.d.persist.state = r.d.writer.state = slow
    r.d.start()
    r.d._next_state = 0
    t0 = time.monotonic()
    r.tick(1)  # a state file is due
    took = time.monotonic() - t0
    assert took < 0.4, f"the tick waited {took:.2f} s for the state file"  # synchronous: >= 0.6 s
    deadline = time.monotonic() + 5
    while not slow.written and time.monotonic() < deadline:  # the writer thread's
        time.sleep(0.05)
    time.sleep(0.1)  # its result handed back just after the file was written
    r.tick(2)
    assert r.d.counters["state_writes"] == 1  # counted on the loop thread, at the next tick
    r.d.shutdown()  # the last one, written before it returns
    assert slow.written == [None, None] and r.d.counters["state_writes"] == 2
    doc, why = slow.read()
    assert doc is not None and "bcache0" in doc["volumes"], why


def test_an_older_state_document_never_lands_after_a_newer_one(tmp_path: Path) -> None:
    slow = SlowStateFile(tmp_path, 0.2)
    w = StateWriter(slow)
    w.submit({"n": 1})  # taken by the thread, being written
    time.sleep(0.05)
    w.submit({"n": 2})  # pending
    w.submit({"n": 3})  # replaces 2
    assert w.write_now({"n": 4})  # waits for 1; 3 is dropped
    w.close()
    assert slow.written == [1, 4]
    assert [ok for ok, _ in w.results()] == [True, True]
    doc, _ = slow.read()
    assert doc is not None and doc["n"] == 4


HEAP_PROBE = """
import ctypes, sys
sys.path[:0] = {path!r}
from cachepilot.daemon import heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if {fixed!r}:
    assert heap.keep_large_blocks_mapped()
libc.free(libc.malloc(8 << 20))  # a freed 8 MiB mapping raises glibc's own threshold to 8 MiB
before = libc.mallinfo2().hblks
p = libc.malloc(2 << 20)
print(libc.mallinfo2().hblks - before)  # 1: the 2 MiB block has its own mapping (unmapped when freed); 0: heap
libc.free(p)
"""


@pytest.mark.parametrize("fixed", [True, False])
def test_large_blocks_keep_their_own_mappings_after_a_larger_one_was_freed(fixed: bool) -> None:
    import subprocess
    import sys

    code = HEAP_PROBE.format(path=[str(Path(snapshot.__file__).parents[2])], fixed=fixed)
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert got.stdout.strip() == ("1" if fixed else "0")  # glibc's dynamic threshold: the heap keeps it


def test_a_bug_in_the_writer_thread_is_a_failed_write_and_the_next_one_is_written(tmp_path: Path) -> None:
    state = StateFile(tmp_path)
    w = StateWriter(state)

    def broken(doc: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("volumes")

    w.submit({"n": 1}, broken)
    deadline = time.monotonic() + 5
    while not w._done and time.monotonic() < deadline:
        time.sleep(0.02)
    w.submit({"n": 2})
    w.close()
    assert w.results() == [(False, "state writer bug: KeyError: 'volumes'"), (True, None)]
    doc, _ = state.read()
    assert doc is not None and doc["n"] == 2


def test_the_ticks_heap_trim_looks_glibc_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """heap.give_back runs every tick: the library handle is made once, not a ctypes.CDLL(None) a tick (under TCG
    that construction was more than half of the heap stage, issue 32). The trim still runs each call."""
    import ctypes

    from cachepilot.daemon import heap

    made = [0]
    real = ctypes.CDLL

    def counting(*a: Any, **k: Any) -> Any:
        made[0] += 1
        return real(*a, **k)

    def forget() -> None:  # the look-up is made again under the counting CDLL (and again after the test)
        cached = getattr(heap, "_malloc_trim", None)
        if cached is not None:
            cached.cache_clear()

    forget()
    monkeypatch.setattr(ctypes, "CDLL", counting)
    try:
        assert all(heap.give_back() for _ in range(5))
        assert made[0] == 1
    finally:
        forget()
