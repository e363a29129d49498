"""One volume as the engine sees it: its policy, models, budgets, requests in flight, latch and drain."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cachepilot.actions import Detach, Drain, Write
from cachepilot.capabilities import CAPABILITIES, Capabilities
from cachepilot.engine.promoqueue import PromoQueue
from cachepilot.models.admission import CachedSet
from cachepilot.models.counterwindow import CounterWindow
from cachepilot.models.epochs import EpochTracker
from cachepilot.models.freed import FreedExtentQueue
from cachepilot.models.pins import PinSet
from cachepilot.models.volume import BYPASS, BYPASS_NAMES, WRITEBACK, WRITETHROUGH, VolumeInfo, VolumeState
from cachepilot.models.writeback import WritebackWatch
from cachepilot.policy.model import VolumePolicy

NS = 1_000_000_000
REQUEST_RETRY_NS = 60 * NS  # re-issue an unanswered mode/knob request after this long
DRAIN_HISTORY = 4  # completed drains whose write-back rate predicts the next one's duration (engine/drains.py)


def normalise_mode(mode: str) -> str:
    return BYPASS if mode in BYPASS_NAMES else mode


ANY_KIND = Capabilities("unknown", frozenset({WRITEBACK, WRITETHROUGH, BYPASS}), {}, drain="", destructive="")


def caps_of(kind: str) -> Capabilities:
    """The kind's capabilities; an unknown kind (e.g. a trace of a plain device) is assumed to take every mode."""
    return CAPABILITIES.get(kind, ANY_KIND)


@dataclass(frozen=True, slots=True)
class Latch:
    """A failed or degraded cache, kept out of write-back until its cache device changes or an operator clears it."""

    reason: str
    since_ns: int
    cache_id: str  # the cache device that failed ("" = unknown: only an operator can clear it)


@dataclass(frozen=True, slots=True)
class DrainInFlight:
    action: Drain
    start_ns: int
    dirty_bytes: int = 0  # dirty when it started: with its duration, the volume's write-back rate
    # an operator's (cachepilot drain): its deadline is the operator's, not the exposure bound's, so missing it or
    # failing is no exposure breach (engine/operatordrain.py ends the request as expired or failed)
    by_operator: bool = False


RUNNING, HELD = "running", "held"  # an operator's drain that holds the volume (OperatorDrain.active)


@dataclass
class OperatorDrain:
    """An operator's drain request (engine/operatordrain.py)."""

    start_ns: int
    deadline_ns: int
    end: str  # one of ENDS
    start_dirty: int
    state: str = RUNNING
    detail: str = ""
    ended_ns: int | None = None
    drains: int = 0  # drains this request started
    action: Drain | None = None  # the last of them
    asked_mode_ns: int | None = None  # held write-through: when the switch was last asked for
    rate: int = 0  # bytes/s asked for (cachepilot drain --rate): the kind's rate floor; 0: its full rate
    # The kind's sleep before write-back (Capabilities.drain_sleep_knob, bcache's writeback_delay) and its value
    # when the request came: a sleep the write-back thread began before the drain is not cut short, so nothing may
    # be written back for up to this long -- said instead of "0 B/s, ETA unknown".
    sleep_knob: str = ""
    sleep_s: float = 0.0
    # The control socket's number for the request (0: none given): the CLI follows its own request, not an earlier
    # one's end that status still shows until the next tick takes the new one up
    request: int = 0

    @property
    def active(self) -> bool:
        """Whether the daemon's own write policy stays off the volume: running, or held write-through."""
        return self.state in (RUNNING, HELD)

    def starts_within(self, gone: int, now: int) -> float | None:
        """Seconds within which write-back starts, while nothing was written back yet and the kind's sleep begun
        before the request may still run; None otherwise (write-back runs, or it should have by now)."""
        left = self.sleep_s - (now - self.start_ns) / NS
        return round(left, 1) if self.state == RUNNING and gone == 0 and left > 0 else None

    def to_json(self, dirty: int, now: int) -> dict[str, object]:
        """What status shows: the state, bytes left, the rate so far and the time to the deadline."""
        took = max(1, (self.ended_ns or now) - self.start_ns)
        gone = max(0, self.start_dirty - dirty)
        return {"state": self.state, "detail": self.detail, "end": self.end, "start_dirty_bytes": self.start_dirty,
                "dirty_bytes": dirty, "rate_bytes_s": round(gone * NS / took), "elapsed_s": round(took / NS, 1),
                "deadline_in_s": round((self.deadline_ns - now) / NS, 1), "rate_asked_bytes_s": self.rate,
                "writeback_starts_within_s": self.starts_within(gone, now), "sleep_knob": self.sleep_knob,
                "request": self.request}


DRAINING, DETACHING, DETACHED, FAILED = "draining", "detaching", "detached", "failed"  # OperatorDetach.state


@dataclass
class OperatorDetach:
    """An operator's detach request (engine/operatordetach.py)."""

    start_ns: int
    deadline_ns: int
    accept_loss: bool
    state: str = DRAINING
    detail: str = ""
    action: Detach | None = None
    writes: tuple[Write, ...] = field(default=())  # the Detach's, read back (the table or pool it replaced)
    request: int = 0  # the control socket's number for the request (OperatorDrain.request)

    @property
    def holds(self) -> bool:
        """Whether the policy stays off the volume: from the request until the daemon releases it."""
        return self.state in (DRAINING, DETACHING, DETACHED)

    def to_json(self, now: int) -> dict[str, object]:
        return {"state": self.state, "detail": self.detail, "accept_loss": self.accept_loss,
                "elapsed_s": round((now - self.start_ns) / NS, 1),
                "deadline_in_s": round((self.deadline_ns - now) / NS, 1), "request": self.request}


@dataclass(slots=True)
class BoundStretch:
    """A write-through stretch the exposure bound forced: how fast it drained is the volume's write-back rate."""

    since_ns: int
    dirty_bytes: int  # dirty when it began
    clean_ns: int | None = None  # the first sample in it that read clean


@dataclass
class VolumeCtl:
    info: VolumeInfo
    policy: VolumePolicy
    chosen_by: str
    state: VolumeState
    cached: CachedSet
    freed: FreedExtentQueue
    epochs: EpochTracker
    promo_queue: PromoQueue = field(default_factory=lambda: PromoQueue())
    tokens: float = 0.0
    import_credit: float = 0.0  # bytes of an imported hot list let out of the queue past the rate (handoff)
    import_room: int = 0  # bytes the believed-cached set may hold past its share for an imported list (handoff)
    import_last_ns: int = 0  # when the last request of an imported list arrived
    last_tick_ns: int | None = None
    last_switch_ns: int | None = None
    last_discard_ns: int = 0
    discard_tokens: float = -1.0  # bytes the discard budget allows now (-1: not started, a full bucket)
    discard_refill_ns: int = 0
    discard_due: bool = False  # a commit came since the last look: extents it freed may be ready
    discard_look_ns: int | None = None  # the last look a commit prompted (discards.DISCARD_GATHER_NS apart)
    bypasses_seen: int | None = None  # the cache's cumulative bypassed reads at the last sample (bcache)
    bypass_rose_ns: int | None = None  # the sample time at which that count last rose
    # admitted files (slot, generation, admitted at) that wait for a bypass within BYPASS_WINDOW_NS (oldest first)
    bypass_wait: deque[tuple[int, int, int]] = field(default_factory=deque)
    promotions_skipped: dict[str, int] = field(default_factory=dict)  # by reason (status)
    last_rewarm_ns: int | None = None
    cache_seen: str = ""  # the last cache device (set) seen attached: a different one is a replacement
    detached: bool = False  # the last sample saw no cache device behind the volume
    last_refresh_ns: int = 0
    requested_mode: tuple[str, int] | None = None
    requested_knobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    meta_score: int = 0
    meta_bytes: int = 0
    held_switches: int = 0
    touched_now: int = 0  # files outside the believed-cached set touched since the last scan check
    touched_bytes_now: int = 0  # their bytes
    touched_baseline: float = 0.0  # EWMA of such files touched per second outside scans
    scan_checked_ns: int = 0  # when the scan check last ran (a tick's length varies: rates, not counts)
    scanning: bool = False
    scan_bytes: int = 0  # cold bytes the scan under way touched
    caps: Capabilities = ANY_KIND
    latch: Latch | None = None
    drain: DrainInFlight | None = None
    drain_clean_ns: int | None = None  # when a sample last ended a drain (its backend may still be putting back)
    # the last completed drains: (dirty bytes at the start, ns to completion), oldest first
    drains_done: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=DRAIN_HISTORY))
    breach: str | None = None  # an unresolved exposure breach (cleared when the cache is seen clean)
    # until then the kind may still be in a pre-drain sleep begun before the engine shortened it (KnobPins._drain_sleep)
    drain_sleep_until_ns: int = 0
    breaches: int = 0
    last_failure: str = ""  # the last action that failed, for humans
    pins: PinSet = field(default_factory=PinSet)  # pinned files (models/pins.py)
    # the volume's read and write bytes so far, over the recent write share's window (Exposure.recent_io)
    recent_io: CounterWindow = field(default_factory=CounterWindow)
    # the volume's write bytes so far over a short window: the write rate write-back must outpace (Exposure.write_rate)
    write_io: CounterWindow = field(default_factory=CounterWindow)
    # write-through because the exposure bound forced it; write-back again once write-back at full rate can keep
    # the bound (WritePolicy._resume), not after a timer
    bound_wt: BoundStretch | None = None
    # an operator's drain (engine/operatordrain.py): while active the policy's own mode, drains and pacing stay off
    operator: OperatorDrain | None = None
    # an operator's detach (engine/operatordetach.py): its drain is ``operator``; the daemon releases the volume
    # once it reads ``detached``
    detach: OperatorDetach | None = None
    # is write-back making progress: a stall, or every mapped block dirty after an unclean shutdown (issue 36)
    writeback: WritebackWatch = field(default_factory=WritebackWatch)

    @property
    def promotes(self) -> bool:
        """Whether promotion runs here: the policy enables it and the kind caches reads (dm-writecache never does:
        each promotion there was a decision, a log line and a skip for nothing, hundreds a run in W4)."""
        return self.policy.promotion.enabled and self.caps.promote_rounds > 0

    def set_room(self) -> int:
        """The believed-cached set's capacity: its share of the cache (``max_cache_fraction``) less what pinned
        files take, plus what an imported hot list still queued borrows (engine/handoff.py), never past the
        cache less the pinned files."""
        share = max(0, int(self.info.cache_bytes * self.policy.promotion.max_cache_fraction) - self.pins.bytes)
        return max(share, min(self.info.cache_bytes - self.pins.bytes, share + self.import_room))
