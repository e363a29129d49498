"""What the engine decides, and how it ended. Every action carries a human-readable reason; backends and actuators
carry them out and answer with one :class:`Outcome` type, whatever the action."""

from __future__ import annotations

from dataclasses import dataclass

from cachepilot.errors import CachepilotError

DONE, PENDING, FAILED, SKIPPED = "done", "pending", "failed", "skipped"
IMPORTED = "imported hot list (warm handoff)"  # a Promote's reason (engine/handoff.py; the promoter paces it)


@dataclass(frozen=True, slots=True)
class Promote:
    """Read these byte ranges of a file through the cached volume so the cache admits them."""

    volume: str
    dev: int
    ino: int
    gen: int
    ranges: tuple[tuple[int, int], ...]  # (offset, length) in bytes
    reason: str

    @property
    def kind(self) -> str:
        return "promote"

    def line(self) -> str:
        size = sum(n for _, n in self.ranges)
        return f"promote {self.volume} ino={self.ino} gen={self.gen} bytes={size}: {self.reason}"


@dataclass(frozen=True, slots=True)
class DiscardRanges:
    """FITRIM these byte ranges of the filesystem on the volume (only still-free blocks get discarded)."""

    volume: str
    fs_dev: int
    ranges: tuple[tuple[int, int], ...]  # (offset, length) in bytes
    reason: str

    @property
    def kind(self) -> str:
        return "discard"

    def line(self) -> str:
        size = sum(n for _, n in self.ranges)
        return f"discard {self.volume} ranges={len(self.ranges)} bytes={size}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SetWritePolicy:
    volume: str
    mode: str  # writeback | writethrough | bypass (bcache "none", dm-cache "passthrough")
    reason: str

    @property
    def kind(self) -> str:
        return "set_write_policy"

    def line(self) -> str:
        return f"set_write_policy {self.volume} {self.mode}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SetKnob:
    volume: str
    knob: str
    value: str
    reason: str
    # a value the engine steers (the lifetime hold), not the operator's: the backend puts the value it found back
    # when the daemon stops, unless something else changed the knob since
    put_back_on_exit: bool = False

    @property
    def kind(self) -> str:
        return "set_knob"

    def line(self) -> str:
        return f"set_knob {self.volume} {self.knob}={self.value}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SetKnobs:
    """Several knobs of one volume changed together, in one write where the kind has one (dm-writecache: one table
    reload, where a knob at a time was a reload, a suspend and a resume each). A decision of the ``set_knob`` kind."""

    volume: str
    values: tuple[tuple[str, str], ...]  # (knob, value)
    reason: str
    put_back_on_exit: bool = False  # as SetKnob's

    @property
    def kind(self) -> str:
        return "set_knob"

    def line(self) -> str:
        return f"set_knob {self.volume} {' '.join(f'{k}={v}' for k, v in self.values)}: {self.reason}"


@dataclass(frozen=True, slots=True)
class PutBackKnobs:
    """Knobs the engine steered (``put_back_on_exit``) back to the values the backend found before it first steered
    them, now rather than at exit (a rule that no longer applies), together as SetKnobs; one that reads otherwise
    than it was left is someone else's and stays."""

    volume: str
    knobs: tuple[str, ...]
    reason: str

    @property
    def kind(self) -> str:
        return "set_knob"

    def line(self) -> str:
        return f"set_knob {self.volume} put back {','.join(self.knobs)}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Drain:
    """Drive the volume's dirty data to zero by ``deadline_ns`` (CLOCK_MONOTONIC), then restore the previous
    settings: bcache ``writeback_percent`` 0 until ``dirty_data`` is 0, dm-cache the ``cleaner`` policy until dirty
    is 0, dm-writecache the ``flush`` message. The write-back flush point of Qin et al., made periodic: it is what
    makes the destructive model's age bound hold by construction. A drain that misses its deadline is a breach."""

    volume: str
    deadline_ns: int
    reason: str
    rate: int = 0  # bytes/s a paced drain asks of the kind's rate floor (engine/pacing.py); 0: the kernel's full rate

    @property
    def kind(self) -> str:
        return "drain"

    def line(self) -> str:
        paced = f" rate={self.rate}" if self.rate else ""
        return f"drain {self.volume} deadline={self.deadline_ns}{paced}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Detach:
    """Take the cache out from under the volume through the kind's own interface (issue 36, ``cachepilot detach``),
    the volume left serving from its origin: bcache ``detach`` (the kernel writes back what is still dirty first),
    dm-cache / dm-writecache a reload onto a ``linear`` table over the origin, lvmcache ``lvconvert --splitcache``.
    Sent only once an operator's drain read the cache clean, or with ``accept_loss`` (a failed cache device whose
    dirty data cannot be written back any more: the operator accepted losing it)."""

    volume: str
    deadline_ns: int
    reason: str
    accept_loss: bool = False

    @property
    def kind(self) -> str:
        return "detach"

    def line(self) -> str:
        loss = " accept_loss" if self.accept_loss else ""
        return f"detach {self.volume}{loss}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Attach:
    """Put a cache back under a device the daemon does not manage (``cachepilot attach``): carried out by the
    daemon itself (daemon/lifecycle.py), not a backend, since no volume is managed there until it is attached."""

    volume: str
    cache: str  # bcache: a cache set UUID; dm kinds: a table line; lvmcache: VG/POOL
    reason: str

    @property
    def kind(self) -> str:
        return "attach"

    def line(self) -> str:
        return f"attach {self.volume} cache={self.cache}: {self.reason}"


Action = Promote | DiscardRanges | SetWritePolicy | SetKnob | SetKnobs | PutBackKnobs | Drain | Detach | Attach

ControlAction = SetWritePolicy | SetKnob | SetKnobs | PutBackKnobs | Drain | Detach
FileAction = Promote | DiscardRanges
FILE_ACTIONS = (Promote, DiscardRanges)  # for isinstance: a `X | Y` is built anew each time it is evaluated


@dataclass(frozen=True, slots=True)
class Write:
    """One control write: where, the value before, the value written, and what the kernel read back."""

    target: str  # e.g. "bcache0 cache_mode" or "lab-cached message 0 flush" (names only, never from events)
    before: str
    value: str
    readback: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an action ended, or how far it got: the one answer of backends (control actions) and actuators (file
    actions). A backend fills ``writes``; a file actuator that ran sets ``actuated`` and its counters (discards:
    ``issued``/``trimmed_bytes``, promotions: ``reads``/``read_bytes``) and hands back what pacing left in
    ``deferred`` (not before ``not_before_ns`` when that is a later round)."""

    action: Action
    status: str  # DONE | PENDING | FAILED | SKIPPED (a file action with nothing to do, e.g. the file is gone)
    dry_run: bool = False
    writes: tuple[Write, ...] = ()
    error: CachepilotError | None = None
    detail: str = ""
    actuated: bool = False  # a file actuator ran: its counters below are what it did (False: not carried out)
    deferred: FileAction | None = None
    not_before_ns: int = 0  # when to run ``deferred`` (a later round), 0: as soon as the budget allows
    issued: tuple[tuple[int, int], ...] = ()  # discards: (start, length) bytes handed to FITRIM
    trimmed_bytes: int = 0  # discards: what the filesystem reported
    reads: int = 0  # promotions
    read_bytes: int = 0

    @property
    def issued_bytes(self) -> int:
        return sum(n for _, n in self.issued) if self.issued else 0  # booked for every outcome: most have none

    def line(self, action_line: str | None = None) -> str:
        """The outcome for a log; ``action_line`` is the action's own line when the caller has it already."""
        dry = " (dry run)" if self.dry_run else ""
        err = f" error[{self.error.kind}]: {self.error}" if self.error else ""
        head = self.action.line() if action_line is None else action_line
        return f"{head} => {self.status}{dry}{self._what()}{err}"

    def _what(self) -> str:
        later = f", {sum(n for _, n in self.deferred.ranges)} bytes deferred" if self.deferred else ""
        why = f" ({self.detail})" if self.detail else ""
        if self.actuated and isinstance(self.action, DiscardRanges):
            return (f": issued {len(self.issued)} range(s) {self.issued_bytes} bytes, filesystem trimmed "
                    f"{self.trimmed_bytes} bytes{later}{why}")
        if self.actuated and isinstance(self.action, Promote):
            return f": {self.reads} reads, {self.read_bytes} bytes{later}{why}"
        what = "; ".join(f"{w.target}: {w.before} -> {w.value} (read back {w.readback})" for w in self.writes)
        return f": {what}" if what else ""
