"""Views of the engine's tables for humans and the state file, built in bulk with numpy (one pass per volume,
O(files of the volume): its slots come from its own inode index, not from a scan of every tracked file); the loop
refreshes them every few seconds, never on a request. :class:`HotLists` computes a volume's list once a tick at the
largest length asked (the state file's) and slices it for shorter ones (``top``'s): with 1 M files on 16 volumes the
two together had cost a tick 250 ms (bench_daemon_files.py, issue 32)."""

from __future__ import annotations

import numpy as np

from cachepilot.models.hotness import HotnessTable

Columns = dict[str, np.ndarray]
FIELDS = ("ino", "gen", "score", "read_score", "write_score", "size", "last_ns")
_EMPTY: Columns = {f: np.empty(0, dtype=np.int64) for f in FIELDS}
BINCOUNT_MAX = 1 << 16  # scores below this are counted (a 512 KiB count array at most), larger ones partitioned


def hot_columns(t: HotnessTable, dev: int, k: int) -> Columns:
    """The k hottest live files of a filesystem, hottest first (the most recent wins a tie, then the later slot), as
    columns: identity, aged scores, size, last access."""
    slots = t.slots_of(dev)  # in no particular order: only the candidates are sorted, the slot as last key
    if len(slots) == 0 or k <= 0:
        return _EMPTY
    shift = (t.epoch - np.frombuffer(t.stamp, dtype=np.uint32)[slots].astype(np.int64)).clip(0, 63)
    rs = np.frombuffer(t.rscore, dtype=np.uint32)[slots].astype(np.int64) >> shift
    ws = np.frombuffer(t.wscore, dtype=np.uint32)[slots].astype(np.int64) >> shift
    score = rs + ws
    # sort only the candidates: every file scoring at least the k-th best (ties included); what only the candidates
    # or the k chosen need is read for them alone
    cand = np.nonzero(score >= kth_largest(score, k))[0] if len(score) > k else np.arange(len(score))
    cslots = slots[cand]
    clast = np.frombuffer(t.last, dtype=np.int64)[cslots]
    pick = np.lexsort((cslots, clast, score[cand]))[::-1][:k]
    order, top = cand[pick], cslots[pick]
    return {"ino": np.frombuffer(t.ino, dtype=np.uint64)[top], "gen": np.frombuffer(t.gen, dtype=np.uint32)[top],
            "score": score[order], "read_score": rs[order], "write_score": ws[order],
            "size": np.frombuffer(t.size, dtype=np.int64)[top], "last_ns": clast[pick]}


def kth_largest(x: np.ndarray, k: int) -> int:
    """The k-th largest of non-negative integers (1 <= k <= len(x)). Scores are few distinct small numbers (sums of
    64s, halved by ageing): counted in one pass when the largest is small; np.partition, the general way, took 7 ms
    on 62 500 such scores (its pivots degrade on many equal values)."""
    top = int(x.max())
    if top < BINCOUNT_MAX:
        from_top = np.cumsum(np.bincount(x)[::-1])
        return top - int(np.searchsorted(from_top, k))
    return int(np.partition(x, len(x) - k)[len(x) - k])


def as_dicts(cols: Columns, k: int | None = None) -> list[dict[str, int]]:
    """The first k rows (all: None) as one dict a file."""
    lists = [cols[f][:k].tolist() for f in FIELDS]
    return [dict(zip(FIELDS, row, strict=True)) for row in zip(*lists, strict=True)]


def as_rows(cols: Columns, fields: tuple[str, ...]) -> list[list[int]]:
    """The rows as lists of the given fields (the state file's hot list)."""
    return list(map(list, zip(*(cols[f].tolist() for f in fields), strict=True)))


def hottest(t: HotnessTable, dev: int, k: int) -> list[dict[str, int]]:
    """The k hottest live files of a filesystem, one dict each (see :func:`hot_columns`)."""
    return as_dicts(hot_columns(t, dev, k))


class HotLists:
    """Each filesystem's hot list at one moment (``at``: the loop's tick count; the table does not change between
    the tick's publish and its state file), made once at the largest length asked; a shorter one is its head (the
    same order)."""

    def __init__(self, t: HotnessTable) -> None:
        self.t = t
        self._at: int | None = None
        self._made: dict[int, tuple[int, Columns]] = {}

    def columns(self, dev: int, k: int, at: int) -> Columns:
        if at != self._at:
            self._at, self._made = at, {}
        made = self._made.get(dev)
        if made is not None and (k <= made[0] or len(made[1]["ino"]) < made[0]):  # longer, or every file already
            return {f: c[:k] for f, c in made[1].items()}
        cols = hot_columns(self.t, dev, k)
        self._made[dev] = (k, cols)
        return cols
