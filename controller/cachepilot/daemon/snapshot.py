"""Views of the engine's tables for humans and the state file, built in bulk with numpy (one pass per volume,
O(files of the volume): its slots come from its own inode index, not from a scan of every tracked file); the loop
refreshes them every few seconds, a share of the volumes a tick, never on a request (:class:`HotLists`): with 1 M
files on 16 volumes ``top`` and the state file had cost the tick that made both 250 ms (bench_daemon_files.py, issue
32)."""

from __future__ import annotations

import json

import numpy as np

from cachepilot.models.hotness import HotnessTable

Columns = dict[str, np.ndarray]
FIELDS = ("ino", "gen", "score", "read_score", "write_score", "size", "last_ns")
_EMPTY: Columns = {f: np.empty(0, dtype=np.int64) for f in FIELDS}
BINCOUNT_MAX = 1 << 16  # scores below this are counted (a 512 KiB count array at most), larger ones partitioned


HEAD_ONLY = ("read_score", "write_score", "last_ns")  # what only `top` shows: its head of the list


def hot_columns(t: HotnessTable, dev: int, k: int, head: int | None = None) -> Columns:
    """The k hottest live files of a filesystem, hottest first (the most recent wins a tie, then the later slot), as
    columns: identity, aged scores, size, last access -- the :data:`HEAD_ONLY` ones for the first ``head`` files
    only (None: all k), and each column as narrow as its values (the inode numbers as the table keeps them): the
    state file keeps 4096 files a volume of identity, score and size, `top` shows 25 (1.7 MiB less with 16 volumes,
    issue 32; a row reads back the same integers)."""
    slots = t.slots_of(dev)  # in no particular order: only the candidates are sorted, the slot as last key
    if len(slots) == 0 or k <= 0:
        return _EMPTY
    shift = (t.epoch - t.stamp.take(slots)).clip(0, 63)
    rs = np.frombuffer(t.rscore, dtype=np.uint32)[slots].astype(np.int64) >> shift
    ws = np.frombuffer(t.wscore, dtype=np.uint32)[slots].astype(np.int64) >> shift
    score = rs + ws
    # sort only the candidates: every file scoring at least the k-th best (ties included); what only the candidates
    # or the k chosen need is read for them alone
    cand = np.nonzero(score >= kth_largest(score, k))[0] if len(score) > k else np.arange(len(score))
    cslots = slots[cand]
    clast = t.last.take(cslots)
    pick = np.lexsort((cslots, clast, score[cand]))[::-1][:k]
    order, top = cand[pick], cslots[pick]
    h = order[:head]
    return {"ino": t.ino.view()[top], "gen": np.frombuffer(t.gen, dtype=np.uint32)[top],
            "score": score[order], "read_score": rs[h].astype(np.uint32), "write_score": ws[h].astype(np.uint32),
            "size": t.size.take(top), "last_ns": clast[pick[:head]]}


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


class HotRows:
    """A hot list's rows (the given fields of its columns), made into JSON text a block at a time: the state file's
    encoder takes it as it is (daemon/state.py RawRows), and no Python object a row exists at once."""

    BLOCK = 2048

    def __init__(self, cols: Columns, fields: tuple[str, ...]) -> None:
        self.cols = {f: cols[f] for f in fields}
        self.fields = fields

    def __len__(self) -> int:
        return len(self.cols[self.fields[0]]) if self.fields else 0

    def __getitem__(self, cut: slice) -> HotRows:
        return HotRows({f: c[cut] for f, c in self.cols.items()}, self.fields)

    def json(self) -> str:
        parts = []
        for i in range(0, len(self), self.BLOCK):
            block = as_rows({f: c[i:i + self.BLOCK] for f, c in self.cols.items()}, self.fields)
            parts.append(json.dumps(block, separators=(",", ":"))[1:-1])
        return "[" + ",".join(parts) + "]"


def hottest(t: HotnessTable, dev: int, k: int) -> list[dict[str, int]]:
    """The k hottest live files of a filesystem, one dict each (see :func:`hot_columns`)."""
    return as_dicts(hot_columns(t, dev, k))


class HotLists:
    """Each volume's hot list, ``k`` long (the state file keeps it, ``top`` shows its head), made again in turn: every
    volume at least every ``every_s``, the longest-waiting first, at most the share of them a tick that keeps that
    period (at least one). No tick makes every volume's list at once: with 1 M files on 16 volumes that was 15 ms in
    the tick that also wrote the state file, the slowest tick (issue 32)."""

    def __init__(self, t: HotnessTable, k: int, every_s: float, head: int | None = None) -> None:
        self.t, self.k, self.every_ns, self.head = t, k, int(every_s * 1e9), head  # head: see hot_columns
        self._made: dict[int, tuple[int, Columns]] = {}  # dev -> (made at, its list)

    def refresh(self, devs: list[int], now: int, tick_ns: int) -> int:
        """A tick at ``now``: make the lists that are due; returns how many were made."""
        for d in [d for d in self._made if d not in devs]:
            del self._made[d]
        due = sorted((self._made[d][0] if d in self._made else -1, d) for d in devs
                     if d not in self._made or now - self._made[d][0] >= self.every_ns)
        share = max(1, -(-len(devs) * tick_ns // self.every_ns))
        for _, d in due[:share]:
            self._made[d] = (now, hot_columns(self.t, d, self.k, self.head))
        return min(share, len(due))

    def columns(self, dev: int, now: int) -> Columns:
        """A volume's list as last made (made now if it never was)."""
        made = self._made.get(dev)
        if made is None:
            made = self._made[dev] = (now, hot_columns(self.t, dev, self.k, self.head))
        return made[1]
