"""The machinery every backend shares: declared settings (a get/set pair per knob, tuned's shape) and
long-running operations (drains, drain-then-switch) advanced tick by tick.

A :class:`Setting` reads its current value, writes a new one, reads it back and compares the normalised
read-back with what was asked; :func:`put_setting` logs each change with its reason and the previous value, and a
dry run returns the write it would make, writing nothing. An :class:`Operation` is a control action in progress:
it holds the writes made so far and the settings it saved, so that a failure, a missed deadline or ``restore()``
puts them back and never leaves a half-applied change.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachepilot.actions import Detach, Drain, PutBackKnobs, SetKnob, SetKnobs, SetWritePolicy
from cachepilot.backends.base import DONE, FAILED, PENDING, SKIPPED, Backend, ControlAction, Outcome, Write
from cachepilot.backends.host import Host
from cachepilot.backends.kernelio import ErrorCounts
from cachepilot.capabilities import WRITEBACK, WRITETHROUGH, Capabilities
from cachepilot.errors import CachepilotError, KernelRejected, RetryLater
from cachepilot.models.volume import VolumeInfo

log = logging.getLogger("cachepilot.backends")

DRY = "(dry run)"


def _same(readback: str, wanted: str) -> bool:
    return readback == wanted


@dataclass(frozen=True)
class Setting:
    """One control knob of one volume: ``get`` returns the current value in normal form, ``put`` writes a value
    (already in the form the kernel takes), ``matches(readback, wanted)`` says whether the write took."""

    target: str  # "bcache0 cache_mode", "lab-cached migration_threshold" — names only, never from events
    get: Callable[[], str]
    put: Callable[[str], None]
    matches: Callable[[str, str], bool] = _same


def joined(values: Mapping[str, str]) -> str:
    """Several knobs' values as one Setting value: ``knob=value`` words ("" after the = : unset)."""
    return " ".join(f"{k}={v}" for k, v in values.items())


def split(value: str) -> dict[str, str]:
    """:func:`joined`'s words back as knob -> value."""
    out: dict[str, str] = {}
    for word in value.split():
        knob, _, v = word.partition("=")
        out[knob] = v
    return out


def grouped(target: str, get: Callable[[], dict[str, str]], put: Callable[[dict[str, str]], None]) -> Setting:
    """Several knobs as one Setting, changed by one write (its value: :func:`joined`); read back and compared
    knob by knob, so :func:`put_setting` logs, checks and reports them as one change."""
    return Setting(target, lambda: joined(get()), lambda v: put(split(v)), lambda a, b: split(a) == split(b))


def put_setting(s: Setting, value: str, reason: str, *, dry_run: bool) -> Write:
    """Save the old value, write, read back, compare, log. KernelRejected if the read-back differs."""
    before = s.get()
    if dry_run:
        log.info("%s: would write %s (now %s): %s", s.target, value, before, reason)
        return Write(s.target, before, value, DRY)
    if s.matches(before, value):
        log.info("%s: already %s: %s", s.target, before, reason)
        return Write(s.target, before, value, before)
    s.put(value)
    readback = s.get()
    if not s.matches(readback, value):
        raise KernelRejected(f"{s.target}: wrote {value!r}, reads back {readback!r} (was {before!r})")
    log.info("%s: %s -> %s (read back %s): %s", s.target, before, value, readback, reason)
    return Write(s.target, before, value, readback)


class KindOps(Protocol):
    """What a backend asks of its kind's entry in the table of kinds (backends.kinds.Kind, which it is built with:
    the table names each kind's backend class, so a backend never looks its kind up there)."""

    @property
    def caps(self) -> Capabilities: ...  # the declarative half: knob types and ranges

    @property
    def settings(self) -> dict[str, Callable[[Any], Setting]]: ...  # each knob's get/set pair

    @property
    def group(self) -> Callable[[Any, tuple[str, ...]], Setting] | None: ...  # several knobs in one write


CLOSE_BELOW = 1 << 20  # bytes: a drain goes write-through for its tail once dirty data is down to this
# How often a kind whose status shows a dead cache device only after a metadata commit
# (Capabilities.failure_seen_at_commit) is sampled with one: the bound on noticing a dead cache device, at the cost
# of a commit -- on an idle dm-cache a superblock write and two flushes of its metadata device (docs/operate.md,
# "A failed cache device").
FAILURE_COMMIT_S = 10


@dataclass
class Operation:
    """A control action in progress. ``phase`` is the backend's own state name; ``saved`` are the settings to
    put back (with their old values) when the operation ends, in any way."""

    action: ControlAction
    deadline_ns: int
    phase: str
    dry_run: bool = False
    writes: list[Write] = field(default_factory=list)
    saved: list[tuple[Setting, str]] = field(default_factory=list)
    retry_at_ns: int = 0
    retries: int = 0
    data: dict[str, str] = field(default_factory=dict)
    # actions that arrived while this one was in flight and end with it (OperationBackend._ride): a drain asked
    # for during a switch that drains anyway, a write-through switch folded into a drain
    riders: list[ControlAction] = field(default_factory=list)

    def save(self, s: Setting, value: str, reason: str) -> Write:
        """Write ``value`` now, remembering the old value to put back when the operation ends."""
        w = put_setting(s, value, reason, dry_run=self.dry_run)
        self.writes.append(w)
        if not self.dry_run:
            self.saved.append((s, w.before))
        return w

    def put(self, s: Setting, value: str, reason: str) -> Write:
        w = put_setting(s, value, reason, dry_run=self.dry_run)
        self.writes.append(w)
        return w

    def close_due(self, now_ns: int, dirty: int, floor: int) -> bool:
        """Whether a drain should close in write-through now. Under a steady write load dirty data never reads 0 in
        write-back (new writes land as fast as old ones leave), so a drain goes write-through for its tail: once
        write-back is visibly moving (dirty down to an eighth of the drain's start, or ``floor``), so that
        write-through lasts only the tail and not a pause of the kind's write-back, and in any case once three
        quarters of the window are gone. ``dirty`` in the kind's unit, ``data["start_dirty"]`` set by the
        backend when the drain began; the start time is taken at the first call (the steps' clock)."""
        start = int(self.data.setdefault("start_ns", str(now_ns)))
        late = now_ns >= self.deadline_ns - (self.deadline_ns - start) // 4
        return late or dirty <= max(floor, int(self.data.get("start_dirty", "0")) // 8)


class OperationBackend(Backend):
    """Backend whose actions may take several ticks. Subclasses implement :meth:`_start` (first writes; returns
    the finished Outcome or an Operation) and :meth:`_advance` (True when the operation is complete)."""

    default_timeout_s = 600.0  # how long a mode switch may spend draining before it is reported as failed
    # Knobs no operation of the kind writes or puts back, each its own attribute (no table reload): set while a
    # drain or switch is in flight instead of waiting for it (a drain can last most of a max_age/2 window).
    knobs_beside_operations: frozenset[str] = frozenset()
    max_backoff_ns = 30_000_000_000

    def __init__(self, info: VolumeInfo, *, kind: KindOps, host: Host | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        """``kind``: this backend's entry in the table of kinds (its knobs' get/set pairs, its group setting)."""
        super().__init__(info, host=host)
        self.declared = kind
        self.errors = ErrorCounts()
        self.clock = clock
        self._ops: list[Operation] = []
        # knobs set with put_back_on_exit: (setting, the value found before the first such write, the last value
        # written), put back by restore()
        self._on_exit: dict[str, tuple[Setting, str, str]] = {}
        self._committed_ns: int | None = None  # the last sample read with a metadata commit (commit_due)

    # -------------------------------------------------------------- the contract
    def apply(self, action: ControlAction, *, dry_run: bool = False) -> Outcome:
        if action.volume not in (self.info.name, self.volume_label):
            return self._failed(action, dry_run, [], KernelRejected(
                f"{action.kind} for volume {action.volume!r} sent to the backend of {self.info.name}"))
        busy = next((op for op in self._ops if op.action.volume == action.volume and not op.dry_run), None)
        if busy is not None and not dry_run and not set(_knobs_of(action)) <= self.knobs_beside_operations:
            return self._ride(busy, action)
        deadline = action.deadline_ns if isinstance(action, Drain | Detach) else \
            self.clock() + int(self.default_timeout_s * 1e9)
        if isinstance(action, PutBackKnobs):
            return self._put_back_now(action, dry_run)
        op = Operation(action, deadline, phase="start", dry_run=dry_run)
        try:
            if self._set_knobs(op) if isinstance(action, SetKnob | SetKnobs) else self._start(op):
                return self._finish(op)
        except CachepilotError as exc:
            return self._abandon(op, exc)
        if dry_run:
            return Outcome(action, PENDING, True, tuple(op.writes), detail=f"would wait: {op.phase}")
        self._ops.append(op)
        return Outcome(action, PENDING, False, tuple(op.writes), detail=op.phase)

    def _ride(self, op: Operation, action: ControlAction) -> Outcome:
        """An action asked for while ``op`` is in flight. A drain and a mode switch never collide: a drain asked
        for while a switch away from write-back drains anyway (or while another drain runs) ends with it; a
        write-through switch asked for during a drain is folded into it where the kind can (:meth:`_fold_writethrough`:
        write-through now, the drain goes on, its end leaves write-through). Anything else waits (RetryLater)."""
        rides = isinstance(action, Drain) and (
            isinstance(op.action, Drain)
            or (isinstance(op.action, SetWritePolicy) and op.action.mode != WRITEBACK))
        if not rides and isinstance(action, SetWritePolicy) and isinstance(op.action, Drain) \
                and action.mode == WRITETHROUGH and not any(isinstance(r, SetWritePolicy) for r in op.riders):
            try:
                rides = self._fold_writethrough(op, action.reason)
            except CachepilotError as exc:
                return self._failed(action, False, [], exc)
        if not rides:
            return self._failed(action, False, [], RetryLater(
                f"{self.info.name}: another operation is in progress ({op.action.line()})"))
        op.riders.append(action)
        detail = f"rides on the {op.action.kind} in flight ({op.phase}): ends when it ends"
        log.info("%s: %s %s", self.info.name, action.line(), detail)
        return Outcome(action, PENDING, False, (), detail=detail)

    def _fold_writethrough(self, op: Operation, reason: str) -> bool:
        """Fold a write-through switch into the drain ``op`` in flight: write-through now, and the drain's end must
        leave it so. False: the kind cannot (the switch waits for the drain)."""
        return False

    def _riders_ended(self, op: Operation, done: Outcome) -> list[Outcome]:
        """The outcomes of the actions that rode on ``op``, which ended with ``done``."""
        out = []
        for r in op.riders:
            how = f"ended with the {op.action.kind} it rode on: {done.detail}"
            if done.status == DONE:
                out.append(Outcome(r, DONE, False, (), detail=how))
            else:  # abandoned by restore (no error): not an error of the rider's either
                out.append(self._failed(r, False, [], done.error, how))
        op.riders.clear()
        return out

    def _late_riders(self, op: Operation, now_ns: int) -> list[Outcome]:
        """A drain that rides on an operation still has its own deadline: past it, it fails (a breach) while the
        operation goes on."""
        late = [r for r in op.riders if isinstance(r, Drain) and now_ns > r.deadline_ns]
        for r in late:
            op.riders.remove(r)
        return [self._failed(r, False, [], RetryLater(
            f"{self.info.name}: drain missed its deadline riding on the {op.action.kind} in flight ({op.phase})"))
            for r in late]

    def step(self, now_ns: int) -> list[Outcome]:
        out: list[Outcome] = []
        for op in list(self._ops):
            out += self._late_riders(op, now_ns)
            if now_ns < op.retry_at_ns:
                continue
            try:
                finished = self._advance(op, now_ns)
            except RetryLater as exc:
                self.errors.count(exc)
                op.retries += 1
                op.retry_at_ns = now_ns + min(self.max_backoff_ns, 250_000_000 << min(op.retries, 7))
                log.warning("%s: %s (retry %d)", self.info.name, exc, op.retries)
                finished = False
            except CachepilotError as exc:
                self._ops.remove(op)
                out += self._ended(op, self._abandon(op, exc))
                continue
            if finished:
                self._ops.remove(op)
                out += self._ended(op, self._finish(op))
            elif now_ns > op.deadline_ns:
                self._ops.remove(op)
                out += self._ended(op, self._abandon(op, RetryLater(
                    f"{self.info.name}: {op.action.kind} missed its deadline in phase {op.phase}")))
        return out

    def _ended(self, op: Operation, done: Outcome) -> list[Outcome]:
        return [done, *self._riders_ended(op, done)]

    def pending(self) -> list[ControlAction]:
        return [a for op in self._ops for a in (op.action, *op.riders)]

    def restore(self) -> list[Outcome]:
        out = [o for op in self._ops for o in self._ended(op, self._abandon(op, None))]
        self._ops.clear()
        out += self._put_back_steered(sorted(self._on_exit), "put back on exit")
        return out

    def _put_back_now(self, action: PutBackKnobs, dry_run: bool) -> Outcome:
        """A PutBackKnobs: what :meth:`restore` does at exit, for these knobs, now; one outcome for the action."""
        if dry_run or not any(k in self._on_exit for k in action.knobs):
            return Outcome(action, SKIPPED, dry_run, detail="none of them steered by this run: nothing to put back")
        outs = self._put_back_steered(action.knobs, action.reason)
        failed = next((o for o in outs if o.status == FAILED), None)
        status = FAILED if failed else DONE if any(o.status == DONE for o in outs) else SKIPPED
        return Outcome(action, status, False, tuple(w for o in outs for w in o.writes),
                       error=failed.error if failed else None, detail="; ".join(o.detail for o in outs if o.detail))

    def _put_back_steered(self, knobs: Iterable[str], why: str) -> list[Outcome]:
        """Steered knobs back to the values found before the engine steered them, each if it still reads as we
        left it; together in one write where the kind has one (kinds.Kind.group), else one by one."""
        steered = {k: self._on_exit.pop(k) for k in knobs if k in self._on_exit}
        group = self.declared.group
        if group is None or len(steered) < 2:
            return [self._put_back_knob(k, s, before, ours, why) for k, (s, before, ours) in steered.items()]
        ours = joined({k: mine for k, (_, _, mine) in steered.items()})
        a = PutBackKnobs(self.info.name, tuple(steered), f"{why} (steered to {ours})")
        try:
            now = split(group(self, tuple(steered)).get())
            back = {k: before for k, (s, before, mine) in steered.items() if s.matches(now.get(k, ""), mine)}
            w = put_setting(group(self, tuple(back)), joined(back), a.reason, dry_run=False) if back else None
        except CachepilotError as exc:
            return [self._failed(a, False, [], exc)]
        theirs = [f"{k} (reads {now.get(k) or 'unset'})" for k in steered if k not in back]
        detail = f"changed since by someone else, left alone: {', '.join(theirs)}" if theirs else ""
        return [Outcome(a, DONE if w else SKIPPED, False, (w,) if w else (), detail=detail)]

    def steered_knobs(self) -> dict[str, tuple[str, str]]:
        return {knob: (before, ours) for knob, (_, before, ours) in self._on_exit.items()}

    def adopt_steered(self, knob: str, found: str, ours: str) -> None:
        """A knob a previous (killed) run set to ``ours`` over ``found``, as its state file says: put back at this
        run's stop like one this run set, to the value found before that run -- not to whatever a killed
        operation left it at when this run first wrote it (a later write keeps this found value)."""
        k = self.declared
        if knob in k.settings and knob not in self._on_exit:
            self._on_exit[knob] = (k.settings[knob](self), found, ours)

    def _put_back_knob(self, knob: str, s: Setting, before: str, ours: str, why: str) -> Outcome:
        """A steered knob back to the value found before the engine steered it, if it still reads as we left it."""
        a = SetKnob(self.info.name, knob, before, f"{why} (steered to {ours})")
        try:
            now = s.get()
            if not s.matches(now, ours):
                return Outcome(a, SKIPPED, detail=f"changed since by someone else (reads {now}): left alone")
            w = put_setting(s, before, a.reason, dry_run=False)
        except CachepilotError as exc:
            return self._failed(a, False, [], exc)
        return Outcome(a, DONE, False, (w,))

    def commit_due(self, now_ns: int) -> bool:
        """Whether the sample at ``now_ns`` reads status with a metadata commit: on a kind that shows a dead cache
        device only then (Capabilities.failure_seen_at_commit), the first sample and one every
        FAILURE_COMMIT_S."""
        if not self.caps.failure_seen_at_commit:
            return False
        if self._committed_ns is not None and now_ns - self._committed_ns < FAILURE_COMMIT_S * 1_000_000_000:
            return False
        self._committed_ns = now_ns
        return True

    def io_failed(self) -> None:
        """The next sample commits (commit_due), not one up to FAILURE_COMMIT_S later: a dead cache device shows
        then on a kind that shows it only at a commit."""
        self._committed_ns = None

    # -------------------------------------------------------------- helpers
    def dmsetup(self, args: Sequence[str], timeout: float = 10.0) -> str:
        return self.host.dm(args, timeout)

    def _set_knobs(self, op: Operation) -> bool:
        """The one set-knob path (SetKnob, SetKnobs): the kind's declared get/set pair, each value parsed and ranged
        first; several knobs in one write where the kind has one (kinds.Kind.group: one dm-writecache reload)."""
        a = op.action
        assert isinstance(a, SetKnob | SetKnobs)
        k = self.declared
        values: dict[str, str] = {}
        for knob, value in _knob_values(a):
            if knob not in k.settings:
                raise KernelRejected(f"{self.kind} has no knob {knob!r}")
            # "": unset, the kind's default (a value found unset, put back after an unclean stop: dm-writecache's
            # max_age taken out of the table again); else the value as the knob's type and range allow
            values[knob] = value and str(k.caps.knobs()[knob].parse(value))
        if len(values) > 1 and k.group is not None:
            w = op.put(k.group(self, tuple(values)), joined(values), a.reason)
            before = split(w.before)
        else:
            before = {knob: op.put(k.settings[knob](self), value, a.reason).before for knob, value in values.items()}
        for knob, value in values.items():
            if not a.put_back_on_exit:
                self._on_exit.pop(knob, None)  # set for its own sake now: the value it had is not ours to restore
            elif not op.dry_run:
                s = k.settings[knob](self)
                self._on_exit[knob] = (s, self._on_exit.get(knob, (s, before.get(knob, ""), ""))[1], value)
        return True

    @property
    def volume_label(self) -> str:
        return self.info.name

    def _finish(self, op: Operation) -> Outcome:
        try:
            self._put_back(op, "operation complete")
        except CachepilotError as exc:
            return self._failed(op.action, op.dry_run, op.writes, exc)
        return Outcome(op.action, DONE, op.dry_run, tuple(op.writes), detail=op.phase)

    def _abandon(self, op: Operation, exc: CachepilotError | None) -> Outcome:
        """Put back what the operation saved; report it failed with ``exc`` (None: abandoned by restore)."""
        undo_error: CachepilotError | None = None
        try:
            self._undo(op)
            self._put_back(op, f"undo {op.action.kind}: {exc or 'abandoned'}")
        except CachepilotError as e:
            undo_error = e
        detail = f"abandoned in phase {op.phase}" if exc is None else f"failed in phase {op.phase}"
        if undo_error is not None:
            detail += f"; putting back saved values failed too: {undo_error}"
            self.errors.count(undo_error)
        return self._failed(op.action, op.dry_run, op.writes, exc or undo_error, detail)

    def _failed(self, action: ControlAction, dry_run: bool, writes: list[Write],
                exc: CachepilotError | None, detail: str = "") -> Outcome:
        if exc is not None:
            self.errors.count(exc)
            log.warning("%s: %s failed: %s", self.info.name, action.line(), exc)
        return Outcome(action, FAILED, dry_run, tuple(writes), error=exc, detail=detail)

    def _put_back(self, op: Operation, reason: str) -> None:
        while op.saved:
            s, before = op.saved.pop()
            op.writes.append(put_setting(s, before, reason, dry_run=False))

    def _undo(self, op: Operation) -> None:
        """Kind-specific clean-up beyond saved settings (e.g. a dm-cache policy put back). Default: nothing."""

    @abc.abstractmethod
    def _start(self, op: Operation) -> bool:
        """First writes of the action; True if it is already complete."""

    @abc.abstractmethod
    def _advance(self, op: Operation, now_ns: int) -> bool:
        """One tick of a pending operation; True when complete. Raise to fail (RetryLater: try again later)."""


def _knob_values(a: SetKnob | SetKnobs) -> tuple[tuple[str, str], ...]:
    return ((a.knob, a.value),) if isinstance(a, SetKnob) else a.values


def _knobs_of(a: ControlAction) -> tuple[str, ...]:
    """The knobs a control action writes; a mode switch or a drain: ("",), none a knob set beside an operation."""
    if isinstance(a, SetKnob | SetKnobs):
        return tuple(k for k, _ in _knob_values(a))
    return a.knobs if isinstance(a, PutBackKnobs) else ("",)
