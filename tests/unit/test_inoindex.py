"""The compact inode index behaves like a dict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.models import inoindex
from cachepilot.models.inoindex import InoIndex

OPS = st.lists(st.tuples(st.sampled_from(["set", "del", "bulk", "del_many"]), st.integers(0, 60), st.integers(0, 1000)),
               max_size=200)


@settings(max_examples=60, deadline=None)
@given(OPS, st.sampled_from([4, 64]))
def test_behaves_like_a_dict(ops: list[tuple[str, int, int]], merge_min: int) -> None:
    old = inoindex.MERGE_MIN
    inoindex.MERGE_MIN = merge_min  # merge often (4), or let the young run and the dict hold entries (64)
    try:
        ref: dict[int, int] = {}
        idx = InoIndex()
        for op, ino, slot in ops:
            if op == "set":
                ref[ino] = slot
                idx[ino] = slot
            elif op == "del" and ino in ref:
                del ref[ino]
                del idx[ino]
            elif op == "del_many":  # distinct live ones, as forget_many passes them
                gone = [i for i in range(ino, ino + 7) if i in ref]
                for i in gone:
                    del ref[i]
                idx.delete_many(np.array(gone, dtype=np.uint64))
            elif op == "bulk":
                new = {i: slot + i for i in range(ino, ino + slot % 6 + 1) if i not in ref}
                ref.update(new)
                idx.update(new)
            assert len(idx) == len(ref)
        assert dict(idx.items()) == ref
        probe = np.arange(0, 70, dtype=np.uint64)
        assert idx.lookup_many(probe).tolist() == [ref.get(i, -1) for i in range(70)]
        assert all(idx.get(i) == ref.get(i) for i in range(70))
    finally:
        inoindex.MERGE_MIN = old


def test_small_footprint() -> None:
    idx = InoIndex()
    idx.update({i * 3 + 12: i for i in range(100_000)})
    idx._merge()
    assert idx.memory_bytes() <= 12 * 100_000 and not idx.recent
    assert idx.get(12 + 3 * 777) == 777 and idx.get(13) is None
