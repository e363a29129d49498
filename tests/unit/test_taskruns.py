"""A promotion reader sheds the bcache run history its thread inherited (actuators/taskruns.py): bcache bypasses a
bio when the task's EWMA of its past runs passes the cutoff, and a new thread starts with its creator's (copy_process
resets it only when bcache is built in; lab 6.1, bcache a module: a fresh reader thread's first 17 chunks of a 16 MiB
file were bypassed as sequential, 2.37 MiB left uncached, though none continued any run). Each read that starts a new
run multiplies the average by 7/8: the thread's first promotion read is preceded by SHED_READS reads of one block."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from cachepilot.actuators import taskruns
from cachepilot.actuators.promote import DONE, Promoter
from tests.unit.test_promote import MIB, Clock, action, fs, make_file  # noqa: F401 (fs: the fixture)
from tests.unit.test_promote_pace import Reads, bfs, fake_sleep  # noqa: F401 (bfs: the fixture)

SHED = 64


@pytest.fixture
def shedding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskruns, "SHED_READS", SHED)  # on (tests/unit/conftest.py turns it off elsewhere)
    monkeypatch.setattr(taskruns, "_done", threading.local())


def read_all(p: Promoter, info, ino: int, gen: int, size: int, done: bool = True) -> None:  # type: ignore[no-untyped-def]
    a = action(info, ino, gen, [(0, size)])
    p.run(a)
    if p.pool is not None:
        p.pool.wait()
        got = p.run(a)
        assert got.status == DONE or not done, got.line()


def test_a_reader_thread_sheds_its_inherited_runs_once_before_its_first_chunk(bfs, monkeypatch, shedding) -> None:  # noqa: F811
    info, d = bfs
    one, two = make_file(d / "one", [(0, 4 * MIB)]), make_file(d / "two", [(0, 4 * MIB)])
    clock = Clock()
    reads = Reads(clock, monkeypatch)
    p = Promoter(info, rate=4 * MIB, clock=clock, workers=1)  # one thread: the second file on the same thread
    assert p.pool is not None and p.pool.shed_runs
    p.pool.sleep = fake_sleep(clock)
    read_all(p, info, *one, 4 * MIB)
    clock.t += 2_000_000_000  # the bucket has repaid the first file's debt
    read_all(p, info, *two, 4 * MIB)
    first, second = reads.of(one[0]), reads.of(two[0])
    shed, chunks = first[:SHED], first[SHED:]
    # one block, SHED times, at the offset of the first chunk read (the highest): each read a run of its own -- it
    # starts at X, the one before ended at X + a block -- and no chunk starts where they end
    assert {(off, n) for _, off, n in shed} == {(chunks[0][1], taskruns.SHED_BYTES)}
    assert all(off != chunks[0][1] + taskruns.SHED_BYTES for _, off, _ in chunks)
    assert sum(n for _, _, n in chunks) == 4 * MIB and all(n > taskruns.SHED_BYTES for _, _, n in chunks[:-1])
    assert sum(n for _, _, n in second) == 4 * MIB and len(second) == len({off for _, off, _ in second})  # shed once


def test_the_caller_thread_sheds_too_when_it_reads_itself(bfs, monkeypatch, shedding) -> None:  # noqa: F811
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, MIB)])
    reads = Reads(Clock(), monkeypatch)
    p = Promoter(info, rate=64 * MIB, burst=4 * MIB, clock=Clock(), workers=0)
    read_all(p, info, ino, gen, MIB)
    log = reads.of(ino)
    assert len(log) > SHED and {n for _, _, n in log[:SHED]} == {taskruns.SHED_BYTES}
    assert sum(n for _, _, n in log[SHED:]) == MIB


def test_other_kinds_do_not_shed(bfs, monkeypatch, shedding) -> None:  # noqa: F811
    info, d = bfs
    ino, gen = make_file(d / "f", [(0, MIB)])
    reads = Reads(Clock(), monkeypatch)
    p = Promoter(replace(info, kind="dm-cache"), rate=4 * MIB, clock=Clock(), workers=1)
    assert p.pool is not None and not p.pool.shed_runs
    read_all(p, replace(info, kind="dm-cache"), ino, gen, MIB, done=False)  # smq: the first of two rounds
    assert sum(n for _, _, n in reads.of(ino)) == MIB and taskruns.SHED_BYTES not in {n for _, _, n in reads.of(ino)}
