"""Replay a trace through the models and the engine, deterministically (time comes from the trace)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from cachepilot.engine import Action, Engine
from cachepilot.errors import UserError
from cachepilot.models.volume import VolumeSample
from cachepilot.policy.model import Policy
from cachepilot.trace.format import (
    T_HOT,
    T_META,
    T_SAMPLE,
    T_TICK,
    TraceReader,
    record_to_event,
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


def replay(path: str | Path, policy: Policy, only_volume: str | None = None) -> ReplayResult:
    reader = TraceReader(path)
    if not reader.volumes:
        raise UserError(f"{path}: the trace names no volumes")
    engine = Engine(policy, reader.volumes)
    if only_volume is not None:
        engine.volume(only_volume)  # UserError naming the known volumes
    res = ReplayResult(engine=engine)
    t0 = time.process_time()
    feed = engine.feed
    for t, recs in reader.blocks(hot_as_array=True):
        if t == T_HOT:
            engine.feed_hotness_array(recs)
        elif t == T_TICK:
            for (ts,) in recs:
                for a in engine.tick(ts):
                    if only_volume is None or a.volume == only_volume:
                        res.decisions.append(Decision(ts, a))
                res.ticks += 1
        elif t == T_META:
            continue
        elif t == T_SAMPLE:
            for r in recs:
                try:
                    s = VolumeSample(**r)
                    engine.sample(s)
                except (TypeError, ValueError) as exc:
                    raise UserError(f"{path}: bad volume sample {r!r}: {exc}") from None
        else:
            for r in recs:
                feed(record_to_event(t, r))  # type: ignore[arg-type]
        res.events += len(recs)
    res.cpu_s = time.process_time() - t0
    return res
