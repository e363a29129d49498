"""The compact inode index behaves like a dict (of inode numbers to slots whose ino column holds them, as the
hotness table's does: each new entry gets a slot of its own, the column written first)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.models import inoindex
from cachepilot.models.inoindex import InoIndex

OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "bulk", "del_many"]), st.integers(0, 60), st.integers(0, 1000)),
               max_size=200)


@settings(max_examples=60, deadline=None)
@given(OPS, st.sampled_from([4, 64]), st.sampled_from([inoindex.FILES_PER_QUERY, 0]))
def test_behaves_like_a_dict(ops: list[tuple[str, int, int]], merge_min: int, per_query: int) -> None:
    old = inoindex.MERGE_MIN, inoindex.FILES_PER_QUERY
    inoindex.MERGE_MIN = merge_min  # merge often (4), or let the young run and the dict hold entries (64)
    inoindex.FILES_PER_QUERY = per_query  # 0: batches search the main run one query at a time, whatever its size
    try:
        ref: dict[int, int] = {}
        col = np.zeros(100_000, dtype=np.uint64)
        free: list[int] = []  # a forgotten file's slot goes to the next new file, as in the table
        made = [0]

        def fresh(ino: int) -> int:
            if free:
                slot = free.pop()
            else:
                slot, made[0] = made[0], made[0] + 1
            col[slot] = ino  # the table writes the column, then the index
            return slot

        idx = InoIndex(lambda: col)
        for op, ino, n in ops:
            if op == "set":
                ref[ino] = idx[ino] = ref[ino] if ino in ref else fresh(ino)
            elif op == "del" and ino in ref:
                free.append(ref.pop(ino))
                del idx[ino]
            elif op == "del_many":  # distinct live ones, as forget_many passes them
                gone = [i for i in range(ino, ino + 7) if i in ref]
                for i in gone:
                    free.append(ref.pop(i))
                idx.delete_many(np.array(gone, dtype=np.uint64))
            elif op == "bulk":
                new = {i: fresh(i) for i in range(ino, ino + n % 6 + 1) if i not in ref}
                ref.update(new)
                idx.update(new)
            assert len(idx) == len(ref)
        assert dict(idx.items()) == ref
        probe = np.arange(0, 70, dtype=np.uint64)
        assert idx.lookup_many(probe).tolist() == [ref.get(i, -1) for i in range(70)]
        assert all(idx.get(i) == ref.get(i) for i in range(70))
    finally:
        inoindex.MERGE_MIN, inoindex.FILES_PER_QUERY = old


def test_a_few_queries_search_the_main_run_without_gathering_its_keys() -> None:
    """A tick's handful of deletes in an index of 100 000 files: looked up and taken out by a search per query, not
    by gathering the main run's 100 000 keys from the column (a pass over the whole column, three a tick, issue 32);
    the answers are the gather's. A large batch still gathers once."""
    col = np.arange(100_000, dtype=np.uint64) * 3 + 12
    idx = InoIndex(lambda: col)
    idx.update({i * 3 + 12: i for i in range(100_000)})
    idx._merge()
    gathers = [0]
    gather = idx.main_keys

    def counted() -> np.ndarray:
        gathers[0] += 1
        return gather()

    idx.main_keys = counted  # type: ignore[method-assign]
    q = np.array([12 + 3 * 99_999, 13, 12 + 3 * 5, 1 << 40, 12], dtype=np.uint64)
    assert idx.lookup_many(q).tolist() == [99_999, -1, 5, -1, 0]
    idx.delete_many(np.array([12 + 3 * 5, 12 + 3 * 70_000], dtype=np.uint64))
    assert gathers[0] == 0
    assert idx.lookup_many(q).tolist() == [99_999, -1, -1, -1, 0] and len(idx) == 99_998
    many = np.arange(12, 12 + 3 * 200, 3, dtype=np.uint64)
    assert (idx.lookup_many(many) >= 0).sum() == 199 and gathers[0] == 1


def test_small_footprint() -> None:
    col = np.arange(100_000, dtype=np.uint64) * 3 + 12
    idx = InoIndex(lambda: col)
    idx.update({i * 3 + 12: i for i in range(100_000)})
    idx._merge()
    assert idx.memory_bytes() <= 4 * 100_000 and not idx.recent
    assert idx.get(12 + 3 * 777) == 777 and idx.get(13) is None


def test_a_deleted_entry_leaves_the_main_run_before_its_slot_is_reused() -> None:
    """The main run reads its keys from the column: a deleted file's slot, given to a file of another inode number,
    must not be found under either number (one delete at a time and in a batch)."""
    col = np.arange(1000, dtype=np.uint64) * 2 + 10  # slot s holds inode 10 + 2 s
    idx = InoIndex(lambda: col)
    idx.update({10 + 2 * s: s for s in range(1000)})
    idx._merge()
    del idx[10 + 2 * 7]
    idx.delete_many(np.array([10 + 2 * 8, 10 + 2 * 900], dtype=np.uint64))
    col[[7, 8, 900]] = [5001, 5003, 5005]  # the table gives the slots to new files ...
    idx.update({5001: 7, 5003: 8, 5005: 900})  # ... and indexes them
    assert len(idx) == 1000
    gone = np.array([24, 26, 1810], dtype=np.uint64)
    assert idx.lookup_many(gone).tolist() == [-1, -1, -1] and all(idx.get(int(i)) is None for i in gone)
    assert idx.lookup_many(np.array([5001, 5003, 5005, 12], dtype=np.uint64)).tolist() == [7, 8, 900, 1]
    for _ in range(2):  # before the merge and after it: each slot once
        assert sorted(idx.slots().tolist()) == list(range(1000))
        assert sorted(idx.items()) == sorted((int(col[s]), s) for s in range(1000))
        idx._merge()
