"""Replay a trace through the models and the engine, deterministically (time comes from the trace).

Blocks are decoded as numpy arrays: hotness blocks go to the engine's vectorised update whole; other
fixed-size records become typed events once (their columns converted to Python lists in one call, not
unpacked field by field); samples are checked against their fields' types.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cachepilot.engine import Action, Engine
from cachepilot.errors import UserError
from cachepilot.events import kdev_major_minor
from cachepilot.policy.model import Policy
from cachepilot.trace.format import (
    MAKERS,
    NAMES,
    T_DELETE,
    T_DROPS,
    T_FREED,
    T_HOT,
    T_META,
    T_SAMPLE,
    T_TICK,
    TraceReader,
    volume_sample,
)


@dataclass(frozen=True, slots=True)
class Decision:
    ts_ns: int
    action: Action

    def line(self) -> str:
        return f"t={self.ts_ns / 1e9:10.3f}s {self.action.line()}"


@dataclass
class ReplayResult:
    decisions: list[Decision] = field(default_factory=list)
    events: int = 0
    ticks: int = 0
    cpu_s: float = 0.0
    engine: Engine | None = None
    unknown_volumes: dict[int, int] = field(default_factory=dict)  # dev -> events of volumes not in the meta
    cut: str | None = None  # the trace ends early (its writer was stopped): where, and what was read
    stream: bool = False  # read from a pipe (it cannot be read again)


MAX_UNKNOWN_DEVS = 1024
# Files the replayed engine tracks at once (its hotness table, ~120 B a file). Checked after each hotness block,
# so at most this plus one block's 2^20: 1.5 M files, ~400 MB, within the unit's 512 MiB.
MAX_REPLAY_FILES = 1 << 19
OTHER_DEVS = "other devices"


def unknown_volumes_warning(res: ReplayResult) -> str | None:
    """One line about events of volumes the meta block does not name (replay ignores them), or None."""
    if not res.unknown_volumes:
        return None
    devs = sorted(res.unknown_volumes, key=lambda d: (not isinstance(d, int), str(d)))
    names = ", ".join("{}:{}".format(*kdev_major_minor(d)) if isinstance(d, int) else repr(d) for d in devs[:8])
    more = f" and {len(devs) - 8} more" if len(devs) > 8 else ""
    return (f"warning: {sum(res.unknown_volumes.values())} events of volumes missing from the trace's meta "
            f"block were ignored (dev {names}{more})")


def replay(path: str | Path, policy: Policy, only_volume: str | None = None) -> ReplayResult:
    reader = TraceReader(path)
    if not reader.volumes:
        raise UserError(f"{path}: the trace names no volumes")
    engine = Engine(policy, reader.volumes)
    if only_volume is not None:
        engine.volume(only_volume)  # UserError naming the known volumes
    res = ReplayResult(engine=engine)
    t0 = time.process_time()
    r = _Replayer(path, engine, res, {v.dev for v in reader.volumes}, only_volume)
    for off, t, recs in reader.raw_blocks():
        r.block(off, t, recs)
        res.events += len(recs)
    res.unknown_volumes = dict(r.unknown)
    res.cut, res.stream = reader.cut, reader.stream
    res.cpu_s = time.process_time() - t0
    return res


class _Replayer:
    """Feeds one decoded trace block at a time to the engine, by block type."""

    def __init__(self, path: str | Path, engine: Engine, res: ReplayResult, known: set[int],
                 only_volume: str | None) -> None:
        self.path, self.engine, self.res, self.known, self.only = path, engine, res, known, only_volume
        self.known_devs = np.array(sorted(known), dtype=np.uint32)
        self.unknown: Counter[Any] = Counter()

    def block(self, off: int, t: int, recs: Any) -> None:
        if t == T_HOT:
            self.hot(off, recs)
        elif t == T_TICK:
            self.ticks(recs)
        elif t == T_SAMPLE:
            self.samples(off, recs)
        elif t != T_META:
            self.events(off, t, recs)

    def hot(self, off: int, recs: Any) -> None:
        devs = recs["dev"]
        known = np.isin(devs, self.known_devs)  # a sort of the block, not a Python loop
        if not known.all():
            odd, counts = np.unique(devs[~known], return_counts=True)
            self._unknown(zip(odd.tolist(), counts.tolist(), strict=True))
            recs = recs[known]  # the engine groups a block by device (a pass per device): only ours reach it
        self.engine.feed_hotness_array(recs)
        if len(self.engine.hotness) > MAX_REPLAY_FILES:  # ~120 B each: 4 blocks of new files took 690 MB
            raise UserError(f"{self.path}: offset {off}: more than {MAX_REPLAY_FILES} distinct files tracked at once "
                            "(replay's cap; a block adds at most 2^20)")

    def _unknown(self, counts: Any) -> None:
        """Count events of devices the meta block does not name: at most MAX_UNKNOWN_DEVS by name, the rest
        together (a block of a million distinct devices was a million keys, and quadratic in the engine)."""
        for dev, n in counts:
            key = dev if dev in self.unknown or len(self.unknown) < MAX_UNKNOWN_DEVS else OTHER_DEVS
            self.unknown[key] += n

    def ticks(self, recs: Any) -> None:
        for (ts,) in recs:
            for a in self.engine.tick(ts):
                if self.only is None or a.volume == self.only:
                    self.res.decisions.append(Decision(ts, a))
            self.res.ticks += 1

    def samples(self, off: int, recs: Any) -> None:
        for r in recs:
            if r.get("dev") not in self.known:
                self._unknown(((r.get("dev"), 1),))
            try:
                self.engine.sample(volume_sample(r))
            except (TypeError, ValueError) as exc:
                raise UserError(f"{self.path}: offset {off}: bad volume sample: {exc}") from None

    def events(self, off: int, t: int, recs: Any) -> None:
        if t != T_DROPS:
            self._unknown(Counter(r[0] for r in recs if r[0] not in self.known).items())
        make, feed = MAKERS[t], self.engine.feed
        try:
            if t == T_DELETE:
                self.engine.feed_deletes(recs)
            elif t == T_FREED:
                self.engine.feed_freed(recs)
            else:
                for r in recs:
                    feed(make(r))
        except (TypeError, ValueError, OverflowError) as exc:
            raise UserError(f"{self.path}: offset {off}: bad {NAMES[t]} record: {exc}") from None
