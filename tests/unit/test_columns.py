"""The narrow per-file columns (models/columns.py) and what they buy (issue 32: RSS <= 100 MiB with 1 M files): exact
read-back, the byte bounds per tracked file, and the structures that held a copy per file before (the believed-cached
set's member list, the promotion queue's u64 entries, the state file's hot-list rows)."""

from __future__ import annotations

import json
import random
import tracemalloc

import numpy as np
import pytest

from cachepilot.daemon.snapshot import HotRows, as_rows
from cachepilot.daemon.state import _encode
from cachepilot.engine.promoqueue import COMPACT_MIN, PromoQueue
from cachepilot.errors import UserError
from cachepilot.models.admission import CachedSet
from cachepilot.models.columns import MS, U32_MAX, Epoch8, Millis32, SpillU32, WideningU32
from cachepilot.models.hotness import HOT_DTYPE, HotnessTable
from cachepilot.models.inoindex import InoIndex

NS = 1_000_000_000


def _table(n: int, dev: int = 7) -> HotnessTable:
    t = HotnessTable()
    rec = np.zeros(n, dtype=HOT_DTYPE)
    rec["dev"], rec["ino"], rec["gen"], rec["rs"], rec["rb"] = dev, np.arange(n) + 12, 1, 64, 16384
    rec["last"], rec["size"] = 5 * NS, 16384
    t.apply_array(rec)
    return t


def test_a_tracked_file_costs_at_most_38_bytes_of_columns_and_4_of_index() -> None:
    """The budget that makes 1 M files fit in the daemon's 100 MiB (bench_daemon_files.py): 65 bytes of columns and
    12 of index a file before issue 32, 8 of index before the index read its keys from the ino column. Holds for
    32-bit inode numbers (ext4's); once merged (the young run costs 8 bytes a file, up to 1/8 of the main run)."""
    n = 100_000
    t = _table(n)
    assert t.column_bytes() / n <= 38
    for i in t.index.values():
        i._merge()
    assert sum(i.memory_bytes() for i in t.index.values()) / n <= 4


def test_spill_columns_read_back_every_value() -> None:
    rng = random.Random(3)  # noqa: S311 - a reproducible draw, not a secret
    size = SpillU32(offset=1)  # -1: unknown
    ref: list[int] = []
    size.extend_fill(50, -1)
    ref += [-1] * 50
    for _ in range(2000):
        i = rng.randrange(50)
        v = rng.choice([-1, 0, 4096, U32_MAX - 2, U32_MAX - 1, U32_MAX, 5 << 32, 1 << 62])
        size[i] = v
        ref[i] = v
    assert [size[i] for i in range(50)] == ref
    slots = np.arange(50)
    assert size.take(slots).tolist() == ref
    vals = np.array([rng.choice([-1, 7, U32_MAX, 1 << 40]) for _ in range(50)], dtype=np.int64)
    size.put(slots, vals)
    assert size.take(slots).tolist() == vals.tolist()
    size.put(slots, np.zeros(50, dtype=np.int64))
    assert size.spill == {}  # a value that fits again leaves the dict
    with pytest.raises(UserError, match="below the column's range"):
        size[0] = -2
    pages = SpillU32(narrow="H")
    pages.extend_fill(3, 0)
    pages.put(np.arange(3), np.array([0xFFFE, 0xFFFF, 1 << 20]))
    assert pages.take(np.arange(3)).tolist() == [0xFFFE, 0xFFFF, 1 << 20] and pages.a.itemsize == 2


def test_inode_numbers_widen_the_column_once_one_needs_64_bits() -> None:
    c = WideningU32()
    c.extend(np.array([1, 2, 3], dtype=np.uint64))
    assert c.a.itemsize == 4
    c.append(1 << 40)
    assert c.a.itemsize == 8 and [c[i] for i in range(4)] == [1, 2, 3, 1 << 40]
    assert c.take(np.arange(4)).tolist() == [1, 2, 3, 1 << 40]


def test_the_index_with_u32_keys_never_takes_a_64_bit_inode_for_its_low_half() -> None:
    col = WideningU32()  # the table's ino column, which the main run reads its keys from
    col.extend(np.arange(5, 5 + 9000, dtype=np.uint64))
    idx = InoIndex(col.view)
    idx.update_arrays(np.arange(5, 5 + 9000, dtype=np.uint64), np.arange(9000))
    idx._merge()
    assert col.view().dtype == np.uint32 and idx.ykeys.dtype == np.uint32
    big = np.uint64((1 << 32) + 5)  # its low 32 bits are 5, a key of the index
    assert idx.lookup_many(np.array([big, 5], dtype=np.uint64)).tolist() == [-1, 0]
    assert idx.get(int(big)) is None
    col.append(int(big))  # slot 9000
    idx.update_arrays(np.array([big], dtype=np.uint64), np.array([9000]))
    assert idx.ykeys.dtype == np.uint64
    assert idx.lookup_many(np.array([big, 5, 9004], dtype=np.uint64)).tolist() == [9000, 0, 8999]
    idx._merge()
    assert col.view().dtype == np.uint64
    assert idx.lookup_many(np.array([big, 5, 9004], dtype=np.uint64)).tolist() == [9000, 0, 8999]
    idx.delete_many(np.array([5], dtype=np.uint64))
    assert idx.get(5) is None and idx.get(int(big)) == 9000


def test_one_byte_epochs_age_exactly_over_hundreds_of_half_lives() -> None:
    """Counters read as lazy ageing with full epochs would read them, across gaps of up to 1 000 half-lives; the
    one-byte stamps wrap every 256 (without the sweep a counter 256 half-lives old reads as new)."""
    rng = random.Random(11)  # noqa: S311 - a reproducible draw, not a secret
    t = HotnessTable(half_life_s=1.0)
    ref: dict[int, tuple[int, int, int]] = {}  # ino -> (read counter, write counter, epoch of both)
    now = 0
    for _ in range(400):
        now += rng.choice([0, 1, 3, 63, 64, 65, 127, 200, 255, 256, 300, 1000]) * NS
        t.advance(now)
        e = t.epoch
        ino = rng.randrange(1, 20)
        rs, ws = rng.choice([1, 64, 1 << 20, 1 << 31]), rng.choice([0, 8])
        r0, w0, s0 = ref.get(ino, (0, 0, e))
        sh = e - s0
        ref[ino] = (min((r0 >> sh) + rs, U32_MAX), min((w0 >> sh) + ws, U32_MAX), e)
        t.update(7, ino, 1, rs, ws, ws, now)
        for i, (r, w, s) in ref.items():
            slot = t.index[7][i]
            sh = e - s
            assert t.score(slot) == min((r >> sh) + (w >> sh), U32_MAX), (i, e, s)
            assert t.read_score(slot) == r >> sh


def test_epoch8_reads_back_the_epoch_it_was_given_while_within_256() -> None:
    c = Epoch8()
    c.extend_fill(3, 0)
    assert c.sweep(50).tolist() == []  # no multiple of 64 crossed
    c[1] = 50
    assert [c[i] for i in range(3)] == [0, 50, 0]
    gone = c.sweep(64)
    assert gone.tolist() == [0, 2]  # 64 behind: their counters are worth nothing now
    assert c.take(np.arange(3)).tolist() == [0, 50, 0]


def test_millisecond_times_keep_order_and_whole_milliseconds() -> None:
    base = 123 * NS + 456
    c = Millis32(base)
    c.extend_zero(5)
    times = np.array([0, base + 7 * MS, base + 7 * MS + 999_999, base + 8 * MS, 5], dtype=np.int64)
    c.put(np.arange(5), times)
    got = c.take(np.arange(5)).tolist()
    assert got == [0, base + 7 * MS, base + 7 * MS, base + 8 * MS, base]  # before the base: the base
    assert [c[i] for i in range(5)] == got
    assert c.rebase(base + (U32_MAX // 4) * 3 * MS)
    after = c.take(np.arange(5)).tolist()
    assert after[0] == 0 and after[1:] == [c.base] * 4  # long before the new base: it


def test_a_believed_cached_set_keeps_no_copy_of_its_members() -> None:
    """Membership is the table's flag bit; a set used to keep a u32 member list (4 bytes a member)."""
    n = 200_000
    t = _table(n)
    cs = CachedSet(n * 32768, t, dev=7)
    slots = np.arange(n, dtype=np.int64)
    sizes = np.full(n, 16384)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cs.admit_many(slots, sizes)
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(cs) == n and cs.members() == slots.tolist()
    assert kept < 64 * 1024, kept  # a member list: 800 KB


def test_the_promotion_queue_takes_4_bytes_a_file_and_keeps_each_reason() -> None:
    q = PromoQueue()
    q.push_many(np.arange(10_000), 0)
    q.push(10_000, q.reason_id("re-warm"))
    q.push_many(np.arange(10_001, 20_000), q.reason_id("imported"))
    assert q.items.itemsize == 4
    want = ["admitted"] * 10_000 + ["re-warm"] + ["imported"] * 9_999
    got = []
    while len(q):
        got.append(q.reasons[q.rid_at(q.head)])
        assert q.items[q.head] == len(got) - 1
        q.pop()  # compacts on the way
    assert got == want


def test_the_promotion_queue_keeps_at_most_a_quarter_of_its_array_consumed() -> None:
    """The promote loop takes a tick's files by moving the head and compacts through pop(): the consumed entries
    kept are at most a quarter of the array (half of it was 2 MiB with 1 M files queued, issue 32)."""
    q = PromoQueue()
    q.push_many(np.arange(100_000), 0)
    while len(q):
        q.head += min(len(q), 512) - 1  # as the promote loop does: head moved, then one pop
        q.pop()
        assert q.head <= COMPACT_MIN or q.head * 4 < len(q.items), (q.head, len(q.items))


def test_hot_rows_encode_as_their_lists_would_in_a_fraction_of_the_memory() -> None:
    rng = np.random.default_rng(5)
    vols = {}
    for v in range(16):
        cols = {"ino": rng.integers(0, 1 << 40, 4096).astype(np.uint64), "gen": rng.integers(0, 1 << 32, 4096),
                "score": rng.integers(0, 1 << 20, 4096), "size": rng.integers(-1, 1 << 30, 4096)}
        vols[f"v{v}"] = cols
    fields = ("ino", "gen", "score", "size")
    as_lists = {"volumes": {k: {"hot": as_rows(c, fields), "name": "\x00rows-0\x00"} for k, c in vols.items()}}
    as_text = {"volumes": {k: {"hot": HotRows(c, fields), "name": "\x00rows-0\x00"} for k, c in vols.items()}}
    assert _encode(as_text) == _encode(as_lists)
    assert json.loads(_encode(as_text))["state"]["volumes"]["v3"]["hot"][:2] == as_lists["volumes"]["v3"]["hot"][:2]
    del as_lists
    tracemalloc.start()
    _encode(as_text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak  # with the 65 536 row lists made first: 23 MiB


def test_a_ticks_hotness_apply_makes_few_python_calls() -> None:
    """A take of 60 files (20 known, 40 new: 20 of them into freed slots) costs a fixed number of
    numpy calls whatever their length; under the lab's TCG vCPU each Python-level call is tens of microseconds, so
    their count, not the rows, was the drain stage's cost (issue 32: the per-call wrappers of broadcast_to, clip,
    .any() and .max() in the column puts were a tenth of it). Python-level calls counted with sys.setprofile: 194
    before the columns' one-value and ufunc paths, 112 after."""
    import collections
    import sys

    from cachepilot.models.hotness import HOT_DTYPE, HotnessTable

    t = HotnessTable(half_life_s=10)
    t.register_dev(7)

    def recs(inos: np.ndarray, now: int) -> np.ndarray:
        a = np.zeros(len(inos), dtype=HOT_DTYPE)
        a["dev"], a["ino"], a["gen"], a["rs"], a["ws"] = 7, inos, 1, 64, 64
        a["rb"], a["wb"], a["last"], a["size"] = 4096, 4096, now, 8192
        return a

    t.apply_array(recs(np.arange(1, 2001), 1))
    for ino in range(1, 21):
        t.forget(7, ino)  # their slots go to the next new files (_reset_slots)
    t.advance(3 * 10**9)
    batch = recs(np.concatenate([np.arange(100, 120), np.arange(5001, 5041)]), 3 * 10**9)
    calls: collections.Counter[str] = collections.Counter()

    def count(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[frame.f_code.co_qualname] += 1  # type: ignore[attr-defined]

    sys.setprofile(count)
    try:
        t.apply_array(batch)
    finally:
        sys.setprofile(None)
    assert sum(calls.values()) <= 130, calls.most_common(10)
    assert len(t) == 2000 - 20 + 40


@pytest.mark.parametrize("v", [0, 5, -1, (1 << 32) - 2, (1 << 32) - 1, 1 << 40])
def test_one_value_put_equals_the_array_put(v: int) -> None:
    """The one-value path of SpillU32.put and Millis32.put stores what the array path stores, spills included."""
    def filled() -> tuple[SpillU32, Millis32]:
        s, m = SpillU32(offset=1), Millis32(base_ns=5 * MS)
        for i in range(40):
            s.a.append(0)
            s[i] = (1 << 33) + i if i % 3 == 0 else i  # some slots spilled already
            m.a.append(0)
            m[i] = 7 * MS * i
        return s, m

    slots = np.array([0, 3, 4, 9, 10, 39, 3])
    (s1, m1), (s2, m2) = filled(), filled()
    s1.put(slots, v)
    s2.put(slots, np.full(len(slots), v, dtype=np.int64))
    assert list(s1.a) == list(s2.a) and s1.spill == s2.spill
    assert [s1[i] for i in range(40)] == [s2[i] for i in range(40)]
    if v < 1 << 40:
        m1.put(slots, v * MS)
        m2.put(slots, np.full(len(slots), v * MS, dtype=np.int64))
        assert list(m1.a) == list(m2.a)
