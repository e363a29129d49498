"""Hotness table: inverse bitmap, aging, tie-breaks, sieving, admission set."""

from __future__ import annotations

from operator import itemgetter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachepilot.events import Delete, FileKey, HotnessDelta
from cachepilot.models.admission import CachedSet
from cachepilot.models.hotness import (
    COUNTER_MAX,
    F_APPEND,
    F_OVERWRITE,
    F_READ,
    F_TOUCHED,
    RBYTES_MAX,
    HotnessTable,
    inverse_bitmap_score,
)
from cachepilot.models.inoindex import InoIndex

NS = 1_000_000_000
_DEV, _RB, _WB = itemgetter(0), itemgetter(5), itemgetter(6)


class ScalarOracle(HotnessTable):
    """The hotness rule written plainly, one record at a time (the reference the package's vectorised
    :meth:`HotnessTable.apply_array` is held to; it lives here because nothing but the tests runs it)."""

    def _slow_slot(self, dev: int, ino: int, gen: int, known_only: bool) -> int:
        """The rare path: unknown filesystem, new file, or a new generation. -1 = skip."""
        idx = self.index.get(dev)
        if idx is None:
            if known_only:
                return -1
            self.register_dev(dev)
            idx = self.index[dev]
        slot = idx.get(ino)
        if slot is None:
            return self._alloc(dev, ino, gen)
        self._reset(slot, gen)
        return slot

    def _normalise(self, slot: int) -> None:
        sh = self.epoch - self.stamp[slot]
        self.rscore[slot] >>= sh
        self.wscore[slot] >>= sh
        self.rbytes[slot] >>= min(sh, 63)
        self.stamp[slot] = self.epoch

    def apply_records(self, records: list[tuple[int, ...]], known_only: bool = False) -> int:
        """The scalar rule over tuples in trace layout (dev, ino, gen, read_score, write_score, read_bytes,
        write_bytes, last_access_ns, size): :meth:`update` inlined. With known_only, records of filesystems never
        registered are skipped; returns how many."""
        index = self.index
        gens, rsa, wsa, sta = self.gen, self.rscore, self.wscore, self.stamp
        lasta, sizea, flags, touched = self.last, self.size, self.flags, self.touched
        slow, normalise = self._slow_slot, self._normalise
        e = self.epoch
        cmax = COUNTER_MAX
        skipped = 0
        cur_dev = -1
        idx: InoIndex | None = None
        for dev, ino, gen, rs, ws, rb, wb, last_ns, size in records:
            if dev != cur_dev:
                cur_dev = dev
                idx = index.get(dev)
            slot = None if idx is None else idx.get(ino)
            if slot is None or gens[slot] != gen:
                slot = slow(dev, ino, gen, known_only)
                if slot < 0:
                    skipped += 1
                    continue
                idx = index[dev]
            if sta[slot] != e:
                normalise(slot)
            f = flags[slot]
            if rs:
                r = rsa[slot] + rs
                rsa[slot] = r if r < cmax else cmax
                f |= F_READ
            self.rbytes[slot] = min(self.rbytes[slot] + rb, RBYTES_MAX)
            if ws:
                w = wsa[slot] + ws
                wsa[slot] = w if w < cmax else cmax
                old = sizea[slot]
                if size >= 0 and old >= 0 and size - old >= wb > 0:
                    f |= F_APPEND
                elif old >= 0 or size < 0:
                    f |= F_OVERWRITE
            if size >= 0:
                sizea[slot] = size
            if last_ns > lasta[slot]:
                lasta[slot] = last_ns
            if not f & F_TOUCHED:
                f |= F_TOUCHED
                touched.append(slot)
            flags[slot] = f
        self._add_dev_bytes(records, known_only)
        return skipped

    def _add_dev_bytes(self, records: list[tuple[int, ...]], known_only: bool) -> None:
        if not records:
            return
        db = self.dev_bytes
        devs = set(map(_DEV, records))
        if len(devs) == 1:
            d = devs.pop()
            if d in db:
                acc = db[d]
                acc[0] += sum(map(_RB, records))
                acc[1] += sum(map(_WB, records))
            return
        for r in records:
            one = db.get(r[0])
            if one is not None:
                one[0] += r[5]
                one[1] += r[6]



@pytest.mark.parametrize(("nbytes", "b"), [
    (512, 64), (4096, 64), (8192, 32), (12288, 32), (16384, 16), (65536, 4), (128 * 1024, 2),
    (256 * 1024, 1), (1 << 30, 1), (0, 64),
])
def test_inverse_bitmap(nbytes: int, b: int) -> None:
    assert inverse_bitmap_score(nbytes) == b


def test_aging_halves_per_half_life() -> None:
    t = HotnessTable(half_life_s=10)
    s = t.update(1, 5, 0, 64, 0, 0, 1)
    assert t.score(s) == 64
    t.advance(10 * NS)
    assert t.score(s) == 32
    t.advance(35 * NS)
    assert t.score(s) == 8
    t.update(1, 5, 0, 64, 0, 0, 36 * NS)
    assert t.score(s) == 72


def test_hottest_and_coldest_tie_breaks() -> None:
    t = HotnessTable()
    ms = 1_000_000  # the table keeps access times to the millisecond (models/columns.py Millis32)
    a = t.update(1, 1, 0, 10, 0, 0, last_ns=100 * ms)
    b = t.update(1, 2, 0, 10, 0, 0, last_ns=200 * ms)
    c = t.update(1, 3, 0, 50, 0, 0, last_ns=50 * ms)
    assert t.hottest(3) == [c, b, a]  # highest first; most recent wins the tie
    assert t.coldest(3) == [a, b, c]  # lowest first; least recent wins the tie
    assert t.hottest(1, dev=2) == []


def test_generation_change_resets_slot_and_delete_forgets() -> None:
    t = HotnessTable()
    s = t.update(1, 7, 1, 64, 0, 0, 1)
    assert t.update(1, 7, 2, 2, 0, 0, 2) == s
    assert t.score(s) == 2
    assert t.delete(Delete(FileKey(1, 7, 2), 0, 3)) == s
    assert t.lookup(1, 7) is None and len(t) == 0
    s2 = t.update(1, 8, 0, 1, 0, 0, 4)
    assert s2 == s  # slot reused


def test_sieve() -> None:
    t = HotnessTable()
    big = t.apply(HotnessDelta(FileKey(1, 1), 64, 0, 4096, 0, 1, size=2 << 20))
    assert "larger than sieve" in (t.sieve(big, 1 << 20) or "")
    wo = t.apply(HotnessDelta(FileKey(1, 2), 0, 64, 0, 4096, 1, size=4096))
    assert t.sieve(wo, 1 << 20) == "write-only"
    log = t.apply(HotnessDelta(FileKey(1, 3), 1, 0, 4096, 0, 1, size=4096))
    t.apply(HotnessDelta(FileKey(1, 3), 0, 64, 0, 4096, 2, size=8192))
    t.apply(HotnessDelta(FileKey(1, 3), 0, 64, 0, 4096, 3, size=12288))
    assert t.append_only(log) and t.sieve(log, 1 << 20) == "append-only"
    ok = t.apply(HotnessDelta(FileKey(1, 4), 64, 0, 4096, 0, 1, size=4096))
    assert t.sieve(ok, 1 << 20) is None
    t.apply(HotnessDelta(FileKey(1, 4), 0, 64, 0, 4096, 2, size=4096))  # overwrite in place
    assert t.sieve(ok, 1 << 20) is None and not t.append_only(ok)


def test_touched_drained_once() -> None:
    t = HotnessTable()
    a = t.update(1, 1, 0, 1, 0, 0, 1)
    t.update(1, 1, 0, 1, 0, 0, 2)
    b = t.update(1, 2, 0, 1, 0, 0, 2)
    assert t.drain_touched() == [a, b]
    assert t.drain_touched() == []


def test_negative_delta_rejected() -> None:
    from cachepilot.errors import UserError

    with pytest.raises(UserError):
        HotnessTable().update(1, 1, 0, -1, 0, 0, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, COUNTER_MAX), st.integers(0, COUNTER_MAX),
                          st.integers(0, 400)), min_size=1, max_size=40))
def test_counters_never_overflow(ops: list[tuple[int, int, int, int]]) -> None:
    t = ScalarOracle(half_life_s=1)
    now = 0
    for ino, rs, ws, dt in ops:
        now += dt * 10_000_000
        t.advance(now)
        s = t.update(7, ino, 0, rs, ws, 0, now)  # the arrays themselves raise on overflow
        assert 0 <= t.score(s) <= COUNTER_MAX
        assert t.rscore[s] <= COUNTER_MAX and t.wscore[s] <= COUNTER_MAX
    t.apply_records([(7, 1, 0, COUNTER_MAX, COUNTER_MAX, 0, 0, now, 4096)] * 3)
    assert t.score(t.lookup(7, 1)) == COUNTER_MAX  # type: ignore[arg-type]


def test_admission_against_last_evicted() -> None:
    t = HotnessTable()
    cs = CachedSet(2 * 4096, t)
    a = t.update(1, 1, 0, 10, 0, 0, 1)
    b = t.update(1, 2, 0, 20, 0, 0, 2)
    assert cs.consider(a, 4096) == (True, [])
    assert cs.consider(b, 4096) == (True, [])
    c = t.update(1, 3, 0, 30, 0, 0, 3)
    admitted, evicted = cs.consider(c, 4096)
    assert admitted and evicted == [a]  # the coldest left
    assert cs.admission_bar(t.epoch) == 10
    d = t.update(1, 4, 0, 10, 0, 0, 4)  # not above the last evicted counter
    assert cs.consider(d, 4096) == (False, [])
    e = t.update(1, 5, 0, 11, 0, 0, 5)
    admitted, evicted = cs.consider(e, 4096)
    assert not admitted and evicted == [e]  # admitted, but it is the coldest: it leaves at once
    assert cs.used_bytes <= cs.capacity_bytes
    assert set(cs.members()) == {b, c}
    assert cs.discard(b) == 4096 and b not in cs


def test_admission_ties_evict_least_recent() -> None:
    t = HotnessTable()
    cs = CachedSet(2 * 4096, t)
    a = t.update(1, 1, 0, 10, 0, 0, 5 << 20)
    b = t.update(1, 2, 0, 10, 0, 0, 1 << 20)
    cs.consider(a, 4096)
    cs.consider(b, 4096)
    c = t.update(1, 3, 0, 50, 0, 0, 9 << 20)
    _, evicted = cs.consider(c, 4096)
    assert evicted == [b]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 200), st.integers(1, 5)), max_size=120))
def test_cached_set_capacity_and_membership(ops: list[tuple[int, int, int]]) -> None:
    t = HotnessTable(half_life_s=1)
    cs = CachedSet(10 * 4096, t)
    now = 0
    for ino, score, pages in ops:
        now += 300_000_000
        t.advance(now)
        s = t.update(1, ino, 0, score, 0, 0, now, pages * 4096)
        cs.consider(s, pages * 4096)
        assert cs.used_bytes <= cs.capacity_bytes
        members = list(cs.members())
        assert len(members) == len(set(members)) == len(cs)
        assert cs.used_bytes == sum(t.charged[m] * 4096 for m in members)
        assert sorted(cs.hottest_members()) == sorted(members)


REC = st.tuples(st.sampled_from([7, 8, 9]), st.integers(1, 12), st.integers(0, 2), st.integers(0, 1 << 31),
                st.integers(0, 1 << 31), st.integers(0, 1 << 20), st.integers(0, 1 << 20),
                st.integers(0, 10**12), st.integers(-1, 1 << 22))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(REC, max_size=25), st.integers(0, 3)), max_size=6), st.booleans())
def test_vectorised_apply_matches_sequential(batches: list, known_only: bool) -> None:  # type: ignore[type-arg]
    import numpy as np

    from cachepilot.models.hotness import HOT_DTYPE

    a, b = ScalarOracle(half_life_s=1), HotnessTable(half_life_s=1)
    for t in (a, b):
        t.register_dev(7)
    now = 0
    for recs, dt in batches:
        now += dt * NS
        a.advance(now)
        b.advance(now)
        assert a.apply_records(recs, known_only) == b.apply_array(np.array(recs, dtype=HOT_DTYPE), known_only)
        for ino in sorted(a.index.get(7, ()))[:dt]:  # deletes: their slots are reused by later new files
            a.forget(7, ino)
            b.forget(7, ino)
    cols = ("dev", "ino", "gen", "rscore", "wscore", "rbytes", "stamp", "last", "size", "flags")
    assert a.dev_bytes == b.dev_bytes
    assert {d: set(i) for d, i in a.index.items()} == {d: set(i) for d, i in b.index.items()}
    for d, idx in a.index.items():  # slot numbers may differ; per-file state may not
        for ino, sa in idx.items():
            sb = b.index[d][ino]
            assert [getattr(a, c)[sa] for c in cols] == [getattr(b, c)[sb] for c in cols], (d, ino)
    key = lambda t, s: (t.dev[s], t.ino[s])  # noqa: E731
    assert sorted(key(a, s) for s in a.drain_touched()) == sorted(key(b, s) for s in b.drain_touched())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 3 << 20), st.integers(0, 7)), min_size=1, max_size=50),
       st.sampled_from([0, 4096, 1 << 20]))
def test_sieve_mask_is_the_sieve(files: list[tuple[int, int]], sieve_size: int) -> None:
    """The engine's vectorised sieve and the one-slot sieve (with its reasons) are one rule."""
    t = HotnessTable()
    slots = []
    for i, (size, flags) in enumerate(files):
        s = t.update(1, i + 1, 0, 1, 0, 0, 0, size)
        t.size[s] = size
        t.flags[s] = (t.flags[s] & ~7) | flags
        slots.append(s)
    mask = t.sieve_mask(np.array(slots, dtype=np.int64), sieve_size)
    assert mask.tolist() == [t.sieve(s, sieve_size) is None for s in slots]


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 200), st.integers(1, 5)), max_size=60),
       st.lists(st.integers(0, 40), max_size=30))
def test_discard_many_is_discard_one_at_a_time(ops: list[tuple[int, int, int]], drop: list[int]) -> None:
    sets = []
    for _ in range(2):
        t = HotnessTable(half_life_s=1)
        cs = CachedSet(10 * 4096, t)
        for i, (ino, score, pages) in enumerate(ops):
            t.advance(i * 300_000_000)
            cs.consider(t.update(1, ino, 0, score, 0, 0, i * 300_000_000, pages * 4096), pages * 4096)
        sets.append((t, cs))
    (t1, one), (t2, many) = sets
    slots = [s for s in drop if s < len(t1.flags)]
    freed = sum(one.discard(s) for s in slots)
    assert many.discard_many(np.array(slots, dtype=np.int64)) == freed
    assert (many.used_bytes, many.count, sorted(many.members())) == (one.used_bytes, one.count, sorted(one.members()))
    assert bytes(t1.flags) == bytes(t2.flags) and list(t1.charged) == list(t2.charged)
