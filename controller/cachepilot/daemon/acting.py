"""Carrying out the engine's decisions on the managed volumes: each action once, its outcome recorded (the decision
log that ``explain`` and the state file show) and told to the engine; a busy device retried with backoff (the engine
hears only the final result); a device gone drops its volume; the backends' pending operations stepped each tick.
File actions start only while the tick's budget lasts (ticktime.TickBudget): past it, one the engine decided or a
retry brought back is recorded as postponed and waits on its volume's deferred list like one pacing deferred, and
the deferred ones not reached stay queued, ahead of the rest, for the next tick. Control actions always run.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from cachepilot.actions import FILE_ACTIONS, Action
from cachepilot.backends.base import FAILED, PENDING, Backend, Outcome
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.decisionlog import FILE_KINDS, DecisionLog, FileDecision, decision, detail
from cachepilot.daemon.loglimit import WINDOW_S, LineBudget
from cachepilot.daemon.ticktime import TickBudget
from cachepilot.daemon.volume import ManagedVolume, VolumeTable
from cachepilot.engine.engine import Engine
from cachepilot.errors import CachepilotError, DeviceGone, DeviceIOError, RetryLater
from cachepilot.models.writeback import Finding

log = logging.getLogger("cachepilot")

MAX_RETRIES = 5
DECISIONS_KEPT = 1000
POSTPONED = "postponed: this tick's time for file actions is spent"


class Actor:
    def __init__(self, engine: Engine, vols: VolumeTable, counters: Counters,
                 drop: Callable[[int, str], None], once: Callable[[str], None],
                 budget: TickBudget | None = None) -> None:
        self.engine = engine
        self.vols = vols
        self.counters = counters
        self.drop = drop  # the daemon's: a volume whose device is gone leaves every index
        self.once = once
        self.decisions = DecisionLog(DECISIONS_KEPT)
        self.lines = LineBudget()  # file actions' INFO lines under storms (loglimit.py)
        self.budget = budget or TickBudget()  # never opened: never spent
        self._turn = 0  # which volume's deferred actions go first this tick

    def execute(self, action: Action, now: int, dry_run: bool, attempt: int = 0, *, again: bool = False) -> None:
        """Carry out ``action``; ``again``: it is one that pacing deferred, and one that waits on still (no read,
        no discard) is not a new decision -- said once, when first deferred, not on every tick it waits (a
        re-warmed hot set waited tens of promotions a tick, a log line and a decision record each). One that moved
        on, or a retry (``attempt`` > 0), is recorded again (its trail: pending, then done) but counted once, when
        first carried out. Past the tick's budget a file action not ``again`` is postponed: recorded, and deferred
        whole (the deferred stage stops on its own)."""
        v = self.vols.named(action.volume)
        if v is None or v.observe_only:
            self.counters.add("decisions", action.kind)
            why = "volume gone" if v is None else "not carried out: observe-only volume"
            self.record(v, Outcome(action, FAILED, detail=why))
            return
        if not again and isinstance(action, FILE_ACTIONS) and self.budget.spent():
            out = Outcome(action, PENDING, dry_run, deferred=action, detail=POSTPONED)
            self.counters["postponed"] += 1
        else:
            out = v.run(action, dry_run)
        if again and waits_still(out):
            v.settle(out, {})  # back on the volume's deferred list
            self.counters["deferred_waits"] += 1
            return
        if not again and attempt == 0:  # a deferred action's later outcome (a promotion read by a reader thread:
            self.counters.add("decisions", action.kind)  # pending, then done) or a retry is recorded: one decision
        self._outcome(v, out, now, attempt)

    def _outcome(self, v: ManagedVolume, out: Outcome, now: int, attempt: int) -> None:
        v.settle(out, self.record(v, out, attempt=attempt))
        a = out.action
        err = out.error
        retry = isinstance(err, RetryLater) and attempt < MAX_RETRIES
        if not retry and not (isinstance(a, FILE_ACTIONS) and out.status == PENDING):
            self.engine.outcome(out)  # the engine learns how it ended (re-queues failed discards, ends drains)
        if err is None:
            return
        if isinstance(err, DeviceIOError) and v.backend is not None:
            v.backend.io_failed()  # the cache device may be dead: its next sample looks (a dm-cache's commits)
        self.counters.add("failed", err.kind)
        if retry:  # busy: the daemon retries with backoff; the engine hears only the final result
            v.retry_later(now, attempt, out.action)
            self.counters["retries"] += 1
        elif isinstance(err, DeviceGone) and not isinstance(a, FILE_ACTIONS):
            self.drop(v.info.dev, f"device gone ({err})")  # (a filesystem gone under a file action: the rescan)

    def deferred(self, now: int, dry_run: bool) -> None:
        """What pacing left last tick, in order, until the tick's budget is spent; promotions wait while the volume's
        drain is at risk. At least one action runs a tick, so pacing always moves on, and the volumes take turns at
        going first; what was not reached goes back ahead of what this tick deferred again (each gets its turn)."""
        vols = list(self.vols.values())
        k = self._turn % len(vols) if vols else 0
        self._turn += 1
        ran = 0
        for v in vols[k:] + vols[:k]:
            if ran and self.budget.spent():
                return
            todo = deque(v.take_deferred(self.engine.holds_promotions(v.info.name)))
            while todo and not (ran and self.budget.spent()):
                self.execute(todo.popleft(), now, dry_run, again=True)
                ran += 1
            if todo:
                self.counters["deferred_left"] += len(todo)
                v.deferred[:0] = todo

    def retry_due(self, now: int, dry_run: bool) -> None:
        for v in list(self.vols.values()):
            for attempt, action in v.due_retries(now):
                if self.vols.get(v.info.dev) is v:
                    self.execute(action, now, dry_run, attempt)

    def sample(self, now: int) -> None:
        """One sample of every backend, to the engine."""
        for v, s in self.each_backend("sample", lambda b: b.sample(now)):
            v.last_sample = s
            self.engine.sample(s)

    def findings(self, found: list[Finding]) -> None:
        """Stalls and all-dirty caches found or ended (models/writeback.py): each a record in the decision log --
        what ``explain`` shows, with why -- and a log line; nothing is written to the cache."""
        for f in found:
            state = "found" if f.found else "ended"
            self.decisions.append({
                "ts": time.time(), "volume": f.volume, "kind": f.kind, "action": f"{f.kind} {f.volume} {state}",
                "reason": f.why, "status": state, "dry_run": False, "writes": [], "error": None,
                "error_kind": None, "detail": "", "attempt": 0})
            log.log(logging.WARNING if f.found else logging.INFO, "%s: %s %s: %s", f.volume, f.kind, state, f.why)

    def step(self, now: int) -> None:
        for v, outs in self.each_backend("step", lambda b: b.step(now)):
            for out in outs:
                v.in_flight.pop(out.action, None)
                self._outcome(v, out, now, attempt=MAX_RETRIES)

    def restore(self, v: ManagedVolume, why: str) -> None:
        """Put back what the volume's unfinished operations changed."""
        if v.backend is None:
            return
        try:
            outs = v.backend.restore()
        except CachepilotError as exc:
            log.warning("%s: restore (%s) failed: %s", v.info.name, why, exc)
            return
        for out in outs:
            self.record(v, out, note=f"restored ({why})")
        v.forget()

    def each_backend(self, what: str, call: Callable[[Backend], Any]) -> Iterator[tuple[ManagedVolume, Any]]:
        """``call`` on every volume with a backend: a volume whose device is gone is dropped, another error is
        counted and said once; yields (volume, result) for the rest."""
        for dev, v in list(self.vols.items()):
            if v.backend is None:
                continue
            try:
                got = call(v.backend)
            except DeviceGone as exc:
                self.drop(dev, f"device gone ({exc})")
                continue
            except CachepilotError as exc:
                self.counters.add(f"{what}_errors", exc.kind)
                self.once(f"{v.info.name}: {what} failed: {exc}")
                continue
            yield v, got

    def record(self, v: ManagedVolume | None, out: Outcome, attempt: int = 0, note: str = "") -> dict[str, Any]:
        """Book an outcome in the decision log and say it (a file action's INFO line within its budget); returns the
        record (a file action's is made only when read: an empty dict here, which settle does not keep)."""
        a = out.action
        kind = a.kind
        ts = time.time()
        if kind in FILE_KINDS:
            self.decisions.append_file(FileDecision(out, ts, attempt, note))
            d: dict[str, Any] = {}
        else:
            d = decision(out, ts, attempt, note)
            self.decisions.append(d)
        level = logging.WARNING if out.status == FAILED and out.error is not None else logging.INFO
        if v is not None and v.observe_only:
            level = logging.DEBUG  # what it would do on a volume it only observes: explain shows it
        if level == logging.INFO and kind in FILE_KINDS and not self._may_say(kind):
            return d
        if log.isEnabledFor(level):
            said = detail(out, note)
            line = out.line(d.get("action")) + (f" [{said}]" if said else "")
            log.log(level, "%s%s", "DRY RUN " if out.dry_run else "", line)
        return d

    def _may_say(self, kind: str) -> bool:
        """A file action's INFO line within its kind's budget (loglimit.py); those held back are said as one line
        when the kind's next window opens."""
        ok, held = self.lines.take(kind)
        if held:
            log.info("%d more %s decisions in %g s were not logged one by one (cachepilot explain has them)", held,
                     kind, WINDOW_S)
        return ok


def waits_still(out: Outcome) -> bool:
    """A file action that came back deferred whole: nothing read or discarded, nothing failed."""
    return (out.deferred is out.action and out.status == PENDING and out.error is None and not out.reads
            and not out.issued)

