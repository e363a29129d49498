"""The daemon's one snapshot: a typed tree built once per tick by the loop, read by the control socket (``status``,
``top``, ``explain``: :meth:`Status.to_json` gives the JSON keys ``cachepilot status`` reads) and by the metrics
exporter (:func:`exporter_snapshot` builds its ``DaemonSnapshot`` from it, counters by kind as they were counted).
Readers hold one reference: the loop replaces the snapshot whole, never edits it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from cachepilot import __version__, records
from cachepilot.capabilities import ERROR_COUNTS, SHARED_CACHE_SETS
from cachepilot.daemon import actuation, ticktime
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.decisionlog import DecisionView
from cachepilot.daemon.volume import ManagedVolume, devname
from cachepilot.engine import operatordetach
from cachepilot.engine.engine import Engine
from cachepilot.engine.volumectl import VolumeCtl, normalise_mode
from cachepilot.exporter.snapshot import (
    EPOCH_BUCKETS,
    DaemonSnapshot,
    DetachedVolume,
    Histogram,
    UnmanagedVolume,
    VolumeSnapshot,
)
from cachepilot.models.sizing import Curve

NS = 1_000_000_000
# the exporter's event counts by kind (the daemon counts them by class name); Drops are counters of their own
_EVENT_KINDS = {k.event.__name__: k.name for k in records.KINDS if k is not records.DROPS}


@dataclass(frozen=True)
class VolumeStatus:
    name: str
    dev: str
    kind: str
    observe_only: bool
    mountpoint: str
    fs_uuid: str
    cache_bytes: int
    policy: str
    failure_model: str
    mode: str | None
    target_mode: str | None
    dirty_bytes: int | None
    max_dirty_bytes: int
    exposure_age_s: float
    hit_ratio: float | None
    hits: int | None
    misses: int | None
    io_errors: int
    health: str
    latched: bool
    latch_reason: str | None
    breach: str | None
    last_failure: str | None
    pending: list[str]
    retries: int
    promo_queue: int
    believed_cached: int
    discard_pending_blocks: int
    held_switches: int
    promotions_skipped: dict[str, int]  # promotions not made, by reason
    pins: dict[str, Any] | None  # pinned files and their residency (models/pins.py), None: no pins
    importing: int  # files of an imported hot list not re-warmed yet (``hotlist import --wait``)
    operator_drain: dict[str, Any] | None = None  # `cachepilot drain`'s request: state, bytes left, rate (None: none)
    operator_detach: dict[str, Any] | None = None  # `cachepilot detach`'s request: state, detail (None: none)
    # what a detach would lose now, checked by the control socket before it queues one: the failed cache's dirty
    # bytes (read before it failed where it reports none: dm-cache); None: the cache has not failed
    detach_loss_bytes: int | None = None
    # is write-back making progress (models/writeback.py): a stall and why, every mapped block dirty, time to clean
    writeback: dict[str, Any] | None = None
    # the promoter's pace: read-miss inserts the cache refused (bcache) and its current rate (None: no promoter)
    promotion: dict[str, Any] | None = None
    # the exporter's view of the volume, built once a tick from its state (volume_snapshot); None: not exported (not
    # sampled yet, observed only, or its labels refused: metrics_refused says why)
    metrics: VolumeSnapshot | None = field(default=None, metadata={"json": False})
    metrics_refused: str | None = field(default=None, metadata={"json": False})

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("json", True)}


@dataclass(frozen=True)
class PolicyStatus:
    source: str
    generation: int
    last_error: str | None


@dataclass(frozen=True)
class ProbeStatus:
    attached: bool
    summary: str


@dataclass(frozen=True)
class DropCounts:
    ringbuf_full: int = 0
    hotness_map_full: int = 0
    other: int = 0


@dataclass(frozen=True)
class TickStatus:
    time: float
    duration_s: float
    n: int
    skipped: int


@dataclass(frozen=True)
class StateFileStatus:
    path: str
    writes: int
    failed_writes: int
    last_error: str | None


@dataclass(frozen=True)
class UnmanagedStatus:
    name: str  # the volume's label
    dev: str  # its kernel name
    reason: str  # one of exporter.snapshot.UNMANAGED_REASONS


@dataclass(frozen=True)
class Counts:
    """The exporter's counters by kind (never parsed back from the flat names)."""

    events: dict[str, int]
    decisions: dict[str, int]
    failures: dict[str, int]
    reloads: int
    reloads_failed: int
    stage_wall_ns: dict[str, int] = field(default_factory=dict)  # the loop's time by stage (daemon/ticktime.py)
    stage_cpu_ns: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Status:
    version: int
    pid: int
    started: float
    uptime_s: float
    dry_run: bool
    observe_only: bool
    actuators: bool
    config: str
    policy: PolicyStatus
    probe: ProbeStatus
    drops: DropCounts
    last_tick: TickStatus
    tracked_files: int
    counters: dict[str, int]
    state_file: StateFileStatus
    volumes: tuple[VolumeStatus, ...]
    unmanaged: tuple[UnmanagedStatus, ...]
    top: dict[str, list[dict[str, int]]]
    decisions: DecisionView  # merged into a list when read (explain, to_json)
    # cached devices without their cache (a bcache device with no cache set, a volume `cachepilot detach` took its
    # cache from): not managed, not alerted on; what `cachepilot attach` would put back (daemon/lifecycle.py)
    detached: tuple[dict[str, str], ...] = ()
    # for the exporter only
    ready: bool = field(default=False, metadata={"json": False})
    has_drops: bool = field(default=False, metadata={"json": False})
    counts: Counts | None = field(default=None, metadata={"json": False})
    bpf_object: str = field(default="none", metadata={"json": False})
    capture: str = field(default="none", metadata={"json": False})  # the probe's capture path (core, bcc)
    curves: dict[str, Curve] = field(default_factory=dict, metadata={"json": False})  # the advisor's, by volume

    def to_json(self, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if not f.metadata.get("json", True) or f.name in leave_out:
                continue
            value = getattr(self, f.name)
            if f.name == "volumes":
                out[f.name] = [v.to_json() for v in value]
            elif f.name == "unmanaged":
                out[f.name] = [asdict(u) for u in value]
            elif f.name == "detached":
                out[f.name] = [dict(d) for d in value]
            elif f.name == "decisions":
                out[f.name] = list(value)
            elif hasattr(value, "__dataclass_fields__"):
                out[f.name] = asdict(value)
            else:
                out[f.name] = value
        return out


def volume_status(v: ManagedVolume, c: VolumeCtl, now: int, engine: Engine) -> VolumeStatus:
    info = v.info
    st = c.state
    req = c.requested_mode
    mode = normalise_mode(st.mode) if st.samples else None
    pend = v.backend.pending() if v.backend is not None else []
    s = v.last_sample
    operator = c.operator.to_json(st.dirty_bytes, now) if c.operator is not None else None
    metrics, refused = None, None
    if s is not None and not v.observe_only:
        try:
            metrics = volume_snapshot(v, c, engine.now_ns, operator)
        except ValueError as exc:  # a label the exporter refuses: the volume is left out of the metrics, said once
            refused = str(exc)
    return VolumeStatus(
        name=info.name, dev=devname(info.dev), kind=info.kind, observe_only=v.observe_only,
        mountpoint=info.mountpoint, fs_uuid=info.fs_uuid, cache_bytes=info.cache_bytes,
        policy=c.chosen_by, failure_model=c.policy.failure_model, mode=mode,
        target_mode=req[0] if req else mode, dirty_bytes=st.dirty_bytes if st.samples else None,
        max_dirty_bytes=c.policy.exposure.max_dirty, exposure_age_s=round(st.exposure_age_s(now), 3),
        hit_ratio=st.hit_ratio, hits=s.hits if s else None, misses=s.misses if s else None,
        io_errors=st.io_errors, health=st.health.name,
        latched=c.latch is not None, latch_reason=c.latch.reason if c.latch else None,
        breach=c.breach, last_failure=c.last_failure or None,
        pending=[a.line() for a in pend], retries=len(v.retries),
        promo_queue=len(c.promo_queue), believed_cached=len(c.cached),
        discard_pending_blocks=c.freed.pending_blocks, held_switches=c.held_switches,
        promotions_skipped=dict(c.promotions_skipped),
        pins=c.pins.status(engine.hotness) if len(c.pins) or c.pins.note else None, importing=v.importing(),
        operator_drain=operator, writeback=_writeback(c, now) if st.samples else None,
        operator_detach=c.detach.to_json(now) if c.detach is not None else None,
        detach_loss_bytes=operatordetach.at_risk(c),
        promotion=_promotion_pacing(v) if getattr(v.files, "promoter", None) is not None else None,
        metrics=metrics, metrics_refused=refused)


def _writeback(c: VolumeCtl, now: int) -> dict[str, Any]:
    """What status says of write-back's progress: stalled and why, every mapped block dirty, the measured rate and
    the time to clean at it."""
    w, dirty = c.writeback, c.state.dirty_bytes
    eta = w.clean_eta_s(dirty)
    return {"stalled": w.stalled_ns is not None, "not_falling_s": round(w.stalled_s(now), 1),
            "stall_after_s": c.policy.health.stall_after_s, "cause": w.cause or None,
            "all_dirty": w.all_dirty_ns is not None, "came_back_all_dirty": w.all_dirty_ns is not None and w.came_back,
            "rate_bytes_s": round(w.rate), "clean_eta_s": None if eta is None else round(eta, 1)}


def volume_snapshot(v: ManagedVolume, c: VolumeCtl, engine_now: int,
                    operator: dict[str, Any] | None) -> VolumeSnapshot:
    """The exporter's view of a sampled, managed volume, built once a tick from its state (``operator``: the
    operator drain's status, as status shows it). The advisor's points are the one thing left to the scrape that
    wants them (exporter_snapshot): they cost a model's evaluation. ValueError if the exporter refuses a label."""
    st, s, info = c.state, v.last_sample, v.info
    assert s is not None  # a sampled volume
    mode = normalise_mode(st.mode)
    req = c.requested_mode
    recoverable = c.policy.failure_model == "recoverable"
    return VolumeSnapshot(
        volume=v.found.label, device=info.name, kind=info.kind, mode=mode, target_mode=req[0] if req else mode,
        health=int(st.health), latched=c.latch is not None, draining=c.drain is not None or bool(v.in_flight),
        cache_bytes=info.cache_bytes, cache_io_errors=st.io_errors_risen if info.kind in ERROR_COUNTS else None,
        dirty_bytes=st.dirty_bytes, dirty_age_seconds=st.exposure_age_s(engine_now),
        dirty_bound_bytes=None if recoverable else c.policy.exposure.max_dirty,
        age_bound_seconds=None if recoverable else c.policy.exposure.max_age_s,
        drains=v.drains, exposure_breaches=c.breaches, hits=s.hits, misses=s.misses, bypasses=s.bypasses,
        promoted_bytes=v.promoted_bytes, discard_issued_bytes=v.discard_issued_bytes,
        discard_landed_bytes=v.discard_landed_bytes, barriers=v.barriers,
        epoch_bytes=v.epoch_bytes.freeze() if v.epoch_bytes is not None else Histogram.empty(EPOCH_BUCKETS),
        bypassed_bytes=s.bypassed_bytes,
        cache_set=(st.cache_id or None) if info.kind in SHARED_CACHE_SETS else None,
        **_promotion_pacing(v), **_operator_drain(operator), **_progress(c, engine_now), advice=())


def _progress(c: VolumeCtl, now: int) -> dict[str, Any]:
    """The exporter's write-back progress gauges (models/writeback.py); all-dirty only where the kind maps blocks."""
    w, dirty = c.writeback, c.state.dirty_bytes
    eta = w.clean_eta_s(dirty) if dirty > 0 else None
    return {"writeback_stalled": w.stalled_ns is not None, "writeback_stalled_seconds": w.stalled_s(now),
            "all_dirty": w.all_dirty_ns is not None if w.maps else None, "clean_eta_seconds": eta}


def _operator_drain(op: dict[str, Any] | None) -> dict[str, Any]:
    """The exporter's operator-drain gauges: only while one runs (None otherwise)."""
    if op is None or op.get("state") != "running":
        return {"operator_drain_remaining_bytes": None, "operator_drain_rate_bytes": None}
    return {"operator_drain_remaining_bytes": op["dirty_bytes"], "operator_drain_rate_bytes": float(op["rate_bytes_s"])}


def _promotion_pacing(v: ManagedVolume) -> dict[str, Any]:
    promoter = getattr(v.files, "promoter", None)
    if promoter is None:
        return {"alloc_failures": None, "promotion_rate": None}
    backoff = promoter.backoff
    return {"alloc_failures": backoff.failures_total if backoff is not None else None,
            "promotion_rate": float(promoter.rate)}


def _advice(curve: Curve | None, cache_bytes: int) -> tuple[tuple[int, float, float, int, int], ...]:
    if curve is None or not curve.samples:
        return ()
    return tuple((p.size_bytes, p.hit_ratio, p.error, p.origin_read_bytes, p.origin_write_bytes)
                 for p in curve.points(cache_bytes, curve.calibration(cache_bytes)))


def exporter_snapshot(status: Status, tick_duration: Histogram, now_wall: float, left_out: list[str]) -> DaemonSnapshot:
    """The exporter's DaemonSnapshot of ``status``: each volume's snapshot as the tick built it, with the advisor's
    points; a volume whose labels the exporter refuses is left out (its reason appended to ``left_out``)."""
    vols = []
    for v in status.volumes:
        if v.metrics_refused is not None:
            left_out.append(f"metrics: {v.name} left out: {v.metrics_refused}")
        elif v.metrics is not None:
            advice = _advice(status.curves.get(v.name), v.cache_bytes)
            vols.append(replace(v.metrics, advice=advice) if advice else v.metrics)
    unmanaged = []
    for u in status.unmanaged:
        try:
            unmanaged.append(UnmanagedVolume(volume=u.name, device=u.dev, reason=u.reason))
        except ValueError as exc:
            left_out.append(f"metrics: unmanaged {u.dev!r} left out: {exc}")
    detached = []
    for x in status.detached:
        try:
            detached.append(DetachedVolume(volume=x["label"], device=x["name"], kind=x["kind"],
                                           reason="operator" if x["why"] == "detached" else "no_cache"))
        except ValueError as exc:
            left_out.append(f"metrics: detached {x['name']!r} left out: {exc}")
    c = status.counts
    assert c is not None
    d = status.drops
    return DaemonSnapshot(
        timestamp=now_wall, start_time=status.started, ready=status.ready, dry_run=status.dry_run,
        observe_only=status.observe_only,
        events={_EVENT_KINDS[k]: n for k, n in c.events.items() if k in _EVENT_KINDS},
        drops=asdict(d) if status.has_drops else {}, ticks=status.last_tick.n, tick_duration=tick_duration,
        last_tick_timestamp=now_wall, stage_seconds=_seconds(c.stage_wall_ns),
        stage_cpu_seconds=_seconds(c.stage_cpu_ns), decisions=c.decisions, action_failures=c.failures,
        policy_reloads=c.reloads - c.reloads_failed, policy_reload_failures=c.reloads_failed,
        policy_last_reload_success=status.policy.last_error is None, state_writes=status.state_file.writes,
        state_write_failures=status.state_file.failed_writes, volumes=tuple(vols), unmanaged=tuple(unmanaged),
        detached=tuple(detached),
        version=__version__, kernel=os.uname().release, bpf_object=status.bpf_object,
        capture=status.capture)


def _seconds(ns: dict[str, int]) -> dict[str, float]:
    return {k: v / NS for k, v in ns.items()}


@dataclass(frozen=True, slots=True)
class DaemonFacts:
    """What the daemon knows at the end of a tick, as it hands it to :func:`build` (status reads this record, never
    the daemon: no daemon <-> status circle)."""

    started_wall: float
    started_ns: int
    dry_run: bool
    observe_only: bool  # every volume observed only
    config_source: str
    policy: PolicyStatus
    probe: ProbeStatus
    drops: DropCounts
    has_drops: bool  # the probe has reported drop counts
    counters: Counters
    loop_skipped: int  # ticks the loop missed
    tracked_files: int
    state_file: StateFileStatus
    unmanaged: tuple[UnmanagedStatus, ...]
    top: dict[str, list[dict[str, int]]]
    decisions: DecisionView
    ready: bool
    bpf_object: str
    capture: str
    curves: dict[str, Curve]
    detached: tuple[dict[str, str], ...] = ()


def build(f: DaemonFacts, vols: tuple[VolumeStatus, ...], now: int, tick_ns: int) -> Status:
    """The daemon's snapshot at the end of a tick (``vols``: its volumes' statuses, see :func:`volume_status`)."""
    c = f.counters
    return Status(
        version=1, pid=os.getpid(), started=f.started_wall, uptime_s=round((now - f.started_ns) / NS, 3),
        dry_run=f.dry_run, observe_only=f.observe_only, actuators=actuation.has_real_backends(),
        config=f.config_source, policy=f.policy, probe=f.probe, drops=f.drops,
        last_tick=TickStatus(time.time(), tick_ns / NS, c["ticks"], f.loop_skipped),
        tracked_files=f.tracked_files, counters=dict(c), state_file=f.state_file, volumes=vols,
        unmanaged=f.unmanaged, top=f.top, decisions=f.decisions, ready=f.ready, has_drops=f.has_drops,
        counts=Counts(c.group("events"), c.group("decisions"), c.group("failed"), c["reloads"], c["reloads_failed"],
                      c.group(ticktime.WALL), c.group(ticktime.CPU)),
        bpf_object=f.bpf_object, capture=f.capture, curves=f.curves, detached=f.detached)


def file_id(path: Any) -> str:
    """A short hash of a file (which build of the BPF object runs), or "none"."""
    if path is None:
        return "none"
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(64 << 20)).hexdigest()[:12]
    except OSError:
        return "none"
