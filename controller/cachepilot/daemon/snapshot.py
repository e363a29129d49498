"""Views of the engine's tables for humans and the state file, built in bulk with numpy (one pass per volume,
O(files of the volume)); the loop refreshes them every few seconds, never on a request."""

from __future__ import annotations

import numpy as np

from cachepilot.models.hotness import F_LIVE, HotnessTable


def hottest(t: HotnessTable, dev: int, k: int) -> list[dict[str, int]]:
    """The k hottest live files of a filesystem: identity, aged scores, size, last access."""
    n = len(t.dev)
    if n == 0 or k <= 0:
        return []
    devs = np.frombuffer(t.dev, dtype=np.uint32, count=n)
    flags = np.frombuffer(t.flags, dtype=np.uint8, count=n)
    slots = np.nonzero((devs == dev) & (flags & F_LIVE != 0))[0]
    if len(slots) == 0:
        return []
    shift = (t.epoch - np.frombuffer(t.stamp, dtype=np.uint32, count=n)[slots].astype(np.int64)).clip(0, 63)
    rs = np.frombuffer(t.rscore, dtype=np.uint32, count=n)[slots].astype(np.int64) >> shift
    ws = np.frombuffer(t.wscore, dtype=np.uint32, count=n)[slots].astype(np.int64) >> shift
    last = np.frombuffer(t.last, dtype=np.int64, count=n)[slots]
    score = rs + ws
    if len(score) > k:  # sort only the candidates: every file scoring at least the k-th best (ties included)
        kth = np.partition(score, len(score) - k)[len(score) - k]
        cand = np.nonzero(score >= kth)[0]
        order = cand[np.lexsort((last[cand], score[cand]))[::-1][:k]]
    else:
        order = np.lexsort((last, score))[::-1][:k]
    ino = np.frombuffer(t.ino, dtype=np.uint64, count=n)
    gen = np.frombuffer(t.gen, dtype=np.uint32, count=n)
    size = np.frombuffer(t.size, dtype=np.int64, count=n)
    out = []
    for i in order.tolist():
        s = int(slots[i])
        out.append({"ino": int(ino[s]), "gen": int(gen[s]), "score": int(score[i]), "read_score": int(rs[i]),
                    "write_score": int(ws[i]), "size": int(size[s]), "last_ns": int(last[i])})
    return out
