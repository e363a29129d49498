"""The daemon: probe → engine → backends and actuators, once per tick, on every cached volume of the host.

Per tick (``Daemon.tick``): a pending SIGHUP reload; the probe's per-tick aggregates into the engine (discrete
events are fed as they arrive, while the loop waits); a rescan for volumes that appeared or vanished; one sample of
every backend; the file actions pacing deferred; the engine's decisions carried out (``apply(action, dry_run)``, the
actuators for promotions and discards; file actions only while the tick's budget lasts); retries that are due;
``step`` of every backend's pending operations; then the snapshot that the control socket and the metrics exporter
serve, the watchdog ping, and now and then the state file.

Errors by class (cachepilot.errors): a configuration or policy error keeps the last good one; DeviceGone drops the
volume (one log line, its pending actions cancelled); RetryLater retries with backoff, counted; KernelRejected is
counted and not retried; the probe unusable at start is a FatalError. Expected conditions are one log line, never a
traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.actions import Action
from cachepilot.daemon import actuation, answers, heap, rescans, status, volumes
from cachepilot.daemon.acting import Actor
from cachepilot.daemon.adoption import ActuatorsFactory, Adopter, BackendFactory, Discover
from cachepilot.daemon.allocfail import pace_promotions
from cachepilot.daemon.answers import TOP_K
from cachepilot.daemon.config import DaemonConfig, load_config
from cachepilot.daemon.control import ControlServer
from cachepilot.daemon.counters import Counters
from cachepilot.daemon.gcpause import GcPauses
from cachepilot.daemon.guard import Guard
from cachepilot.daemon.imports import Imports
from cachepilot.daemon.intake import Intake
from cachepilot.daemon.lifecycle import Lifecycle
from cachepilot.daemon.lock import DaemonLock, host_lock_path
from cachepilot.daemon.loop import TickLoop
from cachepilot.daemon.metrics import Metrics
from cachepilot.daemon.notify import Notifier
from cachepilot.daemon.persist import Persistence
from cachepilot.daemon.reloads import BackgroundParse, ReloadRequests, Verdict, keep_fixed
from cachepilot.daemon.rescans import EventsFactory, RescanSchedule
from cachepilot.daemon.snapshot import HotLists, as_dicts
from cachepilot.daemon.state import MAX_HOT, StateFile
from cachepilot.daemon.statewriter import StateWriter
from cachepilot.daemon.ticktime import StageTimes, TickBudget
from cachepilot.daemon.volume import VolumeTable
from cachepilot.engine.engine import Engine
from cachepilot.errors import FatalError, UserError
from cachepilot.models.sizing import Curve

log = logging.getLogger("cachepilot")

NS = 1_000_000_000
TOP_EVERY_S = 2.0
RELOAD_WAIT_S = 30.0  # a control-socket reload waits this long for the loop's verdict (a tick or two normally)
RELOAD_IN_TICK_S = 0.1  # a parse done by then is applied in the same tick; a longer one at a later tick


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        *,
        config_path: Path | None = None,
        probe_factory: Callable[[int], Any] | None = None,
        discover: Discover = volumes.discover,
        backend_factory: BackendFactory = actuation.open_backend,
        actuators_factory: ActuatorsFactory = actuation.FileActuators,
        notifier: Notifier | None = None,
        rescan_events: EventsFactory = rescans.open_events,
    ) -> None:
        heap.keep_large_blocks_mapped()  # before the engine's tables exist (daemon/heap.py)
        self.config = config
        self.config_path = config_path
        self.probe_factory = probe_factory
        self.notifier = notifier or Notifier()
        self.engine = Engine(config.policy, start_ns=time.monotonic_ns(), advisor=config.advisor)
        self.vols = VolumeTable()
        self.state = StateFile(config.state_dir)
        self.lock = DaemonLock(config.state_dir, host_lock_path())
        self.control = ControlServer(config.socket, self.answer)
        # the wait returns at a stop request (Intake.wait: the stop flag's pipe is in the probe's epoll)
        self.loop = TickLoop(config.tick_s, self.tick, wait=self._between_ticks, wait_sees_stop=True)
        self.counters = Counters()
        self.times = StageTimes(self.counters)
        self.budget = TickBudget()
        self.gc = GcPauses(self.counters)
        self.guard = Guard(self.counters)
        self.hot = HotLists(self.engine.hotness, MAX_HOT, TOP_EVERY_S, head=TOP_K)
        self.writer = StateWriter(self.state)
        self.persist = Persistence(self.state, self.engine, self.counters, self.guard.once, self.hot, self.writer)
        epochs = bool(config.metrics_listen or config.metrics_textfile)
        self.adopter = Adopter(self.engine, self.vols, self.counters, self.guard, self.persist, discover=discover,
                               backend_factory=backend_factory, actuators_factory=actuators_factory, epochs=epochs)
        self.actor = Actor(self.engine, self.vols, self.counters, self.adopter.drop, self.guard.once,
                           self.budget)
        self.decisions = self.actor.decisions
        self.intake = Intake(self.engine, self.vols, self.counters, self.guard, self.loop.stop_event,
                             lambda: self.adopter.probe, self.execute)
        self._wait, self._feed = self.intake.wait, self.intake.feed
        self.stages = self._stages()
        self.snapshot: status.Status | None = None  # the last published, replaced whole (read by other threads)
        self.top: dict[str, list[dict[str, int]]] = {}
        self.curves: dict[str, Curve] = {}  # the sizing advisor's, by volume name
        self.policy_error: str | None = None
        self.policy_generation = 1
        self.reloads = ReloadRequests()
        self._parse: tuple[BackgroundParse, list[Any]] | None = None  # a reload being parsed, and who waits for it
        self.started_wall = time.time()
        self.started_ns = time.monotonic_ns()
        self._rescan_events = rescan_events
        self.rescans = RescanSchedule(None)  # its event sources open at start (daemon/rescans.py)
        self._next_state = 0
        self.clear_requests: list[str] = []  # from the control socket, done on the loop thread
        self.drain_requests: list[dict[str, Any]] = []  # `cachepilot drain`, likewise
        self.lifecycle = Lifecycle(config.state_dir)  # `cachepilot detach` and `attach`, likewise
        self.adopter.released = lambda name: name in self.lifecycle.records.items
        self.imports = Imports()  # hot lists from the control socket, handed to the engine on the loop thread
        self.metrics: Metrics | None = None  # the exporter, when configured and in this build
        self.ready = False
        self.bpf_object = "none"  # a short hash of the loaded BPF object (cachepilot_build_info)
        self.capture = "none"  # the probe's capture path (cachepilot_capture_info)

    # ------------------------------------------------------------------ start / stop
    @property
    def dry_run(self) -> bool:
        return self.config.effective_dry_run

    def start(self) -> None:
        """Everything before the first tick; FatalError if the daemon cannot run here."""
        self.lock.acquire()  # makes and checks the state directory; nothing acts before the locks are ours
        self.persist.read(self.decisions)
        self.lifecycle.records.load()
        self.rescans = RescanSchedule(self._rescan_events())  # before the first look: nothing between goes unseen
        now = time.monotonic_ns()
        # Reconcile before the probe loads (seconds on a slow host): a setting an interrupted operation left behind
        # (a drain's writeback_percent 0) is put back at once, not after the verifier has run.
        self.adopter.rescan(now, self.config.observe)
        self.persist.reconcile(list(self.vols.values()), now, self.execute)
        self._before_ready(now)
        self._attach_probe()
        self.control.start()
        self.metrics = Metrics.attach(self.config)
        self.rescans.looked(now, self.config.rescan_s)
        self._next_state = now + int(self.config.state_interval_s * NS)
        # ready before the first publish: a scrape (or /ready) right after systemd's READY=1 must say 1, not wait
        # for the first tick's snapshot (a lab guest's start returned with cachepilot_ready 0)
        self.ready = True
        self._publish(now, 0)
        what = ", ".join(f"{v.info.name} ({v.info.kind})" for v in self.vols.values()) or "no volume"
        mode = " DRY RUN:" if self.dry_run else ""
        self.gc.freeze()
        self.gc.watch()
        self.notifier.ready(f"watching {what}")
        log.info("ready:%s watching %s; control socket %s", mode, what, self.config.socket)

    def _before_ready(self, now: int) -> None:
        """One sample, then the settings the exposure guarantee needs before any write it bounds (the engine's
        ``before_ready``), ahead of the probe's load: a workload started once the daemon is ready finds them."""
        if self.guard.call("sample", self.actor.sample, now):
            for action in self.engine.before_ready(now):
                self.execute(action, now)

    def run(self) -> None:
        self.loop.run()

    def shutdown(self) -> None:
        """Leave every cache safe and stable: unfinished operations are put back, the state file written."""
        self.notifier.stopping()
        if self._parse is not None:  # its thread dies with the process: nothing was applied
            log.warning("reload abandoned: stopping (the running policy is kept)")
        self._stop_readers()
        for v in list(self.vols.values()):
            self.actor.restore(v, "stopping")
        self.guard.call("restore_knobs", self._restore_knobs, time.monotonic_ns())
        self._save_state()
        self.writer.close()
        self.rescans.close()
        self.control.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.probe is not None:
            self.probe.close()
            self.probe = None
        self.lock.release()
        self.gc.unwatch()
        log.info("stopped")

    def _stop_readers(self) -> None:
        """The promoters' reader threads stop before the caches are put back (a paced read is minutes long)."""
        for v in self.vols.values():
            close = getattr(v.files, "close", None)
            if close is not None:
                close()

    def _restore_knobs(self, now: int) -> None:
        """What the engine steered (not what the policy pins) goes back as it was found."""
        for action in self.engine.restore_knobs():
            self.execute(action, now)

    def abandon(self) -> None:
        """A start that cannot go on (FatalError): put back what reconciling started, release what start took."""
        for v in list(self.vols.values()):
            self.actor.restore(v, "cannot run")
        self.rescans.close()
        self.control.stop()
        if self.probe is not None:
            self.probe.close()
            self.probe = None
        self.lock.release()

    # ------------------------------------------------------------------ signals (called from handlers: flags only)
    def request_stop(self) -> None:
        self.loop.stop()

    def request_reload(self) -> None:
        self.reloads.request()

    # ------------------------------------------------------------------ the loop
    def tick(self, now: int) -> None:
        """One tick: the stages in order, each guarded (a failing stage is counted and the next one runs)."""
        t0 = time.monotonic_ns()
        self.times.begin()
        self.budget.open(t0, self.loop.tick_ns)
        try:
            for name, stage in self.stages:
                self._stage(name, stage, now)
        finally:
            self.budget.close()
        self.counters["ticks"] += 1
        dur = time.monotonic_ns() - t0
        self.counters["tick_ns"] += dur
        self._stage("publish", lambda n: self._publish(n, dur), now)
        self.notifier.watchdog()
        if now >= self._next_state:
            self._stage("state", lambda n: self._save_state(n), now)
            self._next_state = now + int(self.config.state_interval_s * NS)
        self._stage("heap", lambda n: heap.give_back(), now)  # the tick's free pages back to the kernel (~1 ms)
        done = time.monotonic_ns()
        self.times.end(done - t0, self.loop.tick_ns, done)

    def _between_ticks(self, seconds: float) -> None:
        """The wait for the next tick, where the probe's events are taken as they come (its time: ``between``)."""
        self.times.timed("between", lambda: self.intake.wait(seconds))

    def _stage(self, name: str, fn: Callable[[int], object], now: int) -> None:
        self.times.timed(name, lambda: self.guard.call(name, fn, now))

    def _stages(self) -> list[tuple[str, Callable[[int], object]]]:
        """The work of a tick, in order (its name counts its failures: ``stage_errors.<name>``, ``stage_bugs.``)."""
        return [
            ("reload", self._reload_if_asked),
            ("drain", self.intake.drain),
            ("rescan", self._rescan_if_due),
            ("sample", self.actor.sample),
            ("findings", lambda now: self.actor.findings(self.engine.take_findings())),
            ("clear_latches", self._clear_latches),
            ("operator", self._operator_drains),
            ("lifecycle", self._lifecycle),
            ("alloc", lambda now: pace_promotions(self.vols.values(), self.probe, now)),
            ("imports", lambda now: self.imports.apply(self.engine)),
            ("pins", lambda now: self.adopter.pins.collect(self.engine)),
            ("deferred", lambda now: self.actor.deferred(now, self.dry_run)),
            ("decide", self._decide),
            ("retries", lambda now: self.actor.retry_due(now, self.dry_run)),
            ("step", self.actor.step),
            ("release", lambda now: self.lifecycle.release(self.engine, self.vols, self.adopter.drop)),
        ]

    def _decide(self, now: int) -> None:
        dry_run, execute = self.dry_run, self.actor.execute  # looked up once: thousands of promotions a tick
        for action in self.engine.tick(now, hot_fresh=self.intake.hot_fresh):
            execute(action, now, dry_run)

    def _reload_if_asked(self, now: int) -> None:
        if self._parse is None and self.reloads.pending():
            self.notifier.reloading()
            self.counters["reloads"] += 1
            self._parse = (BackgroundParse(self._load), self.reloads.take())
        if self._parse is not None and self._parse[0].wait(RELOAD_IN_TICK_S):
            parse, waiting = self._parse
            self._parse = None
            ok = self._apply(parse)
            said = f"reloaded {self.config.source}" if ok else str(self.policy_error)
            self.reloads.answer(waiting, Verdict(ok, said))

    def _rescan_if_due(self, now: int) -> None:
        why = self.rescans.due(now, self.config.rescan_s)
        if why is not None:
            kind, detail = why
            self.counters.add("rescans", kind)
            if kind != "poll":
                log.debug("rescan: %s", detail)
            self.adopter.rescan(now, self.config.observe)

    # ------------------------------------------------------------------ volumes
    @property
    def probe(self) -> Any:
        return self.adopter.probe

    @probe.setter
    def probe(self, probe: Any) -> None:
        self.adopter.probe = probe

    def _attach_probe(self) -> None:
        """Load the probe (FatalError if it cannot run here) and watch every volume adopted before it loaded."""
        if self.probe_factory is None:
            return
        try:
            self.probe = self.probe_factory(self.config.max_files)
        except UserError as exc:
            raise FatalError(f"the eBPF probe is unusable: {exc}") from None
        log.info("probe: %s", "; ".join(self.probe.report.summary().splitlines()))
        self.bpf_object = status.file_id(getattr(self.probe, "object_path", None))
        self.capture = str(getattr(self.probe, "capture_path", "core"))
        self.adopter.watch_all()

    # ------------------------------------------------------------------ acting
    def execute(self, action: Action, now: int, attempt: int = 0) -> None:
        self.actor.execute(action, now, self.dry_run, attempt)

    def _clear_latches(self, now: int) -> None:
        for name in self.clear_requests:
            try:
                was = self.engine.clear_latch(name)
            except UserError as exc:
                log.warning("clear latch: %s", exc)
                continue
            log.warning("%s: latch cleared by the operator%s", name, f" (was: {was})" if was else " (none was set)")
        self.clear_requests = []

    def _operator_drains(self, now: int) -> None:
        """`cachepilot drain` requests, in order (engine/operatordrain.py); one log line each."""
        todo, self.drain_requests = self.drain_requests, []
        for r in todo:
            try:
                if r.get("release"):
                    log.info("%s: operator drain: %s by the operator", r["volume"],
                             self.engine.operator_release(r["volume"]))
                    continue
                self.engine.operator_drain(r["volume"], r["deadline"], r["end"], r.get("rate", 0), r.get("request", 0),
                                           now)
                log.info("%s: operator drain started: deadline %g s, then %s%s", r["volume"], r["deadline"], r["end"],
                         f", at {r['rate']} B/s" if r.get("rate") else "")
            except UserError as exc:
                log.warning("operator drain: %s", exc)

    def _lifecycle(self, now: int) -> None:
        """`cachepilot detach` requests to the engine; `cachepilot attach` carried out (daemon/lifecycle.py)."""
        self.lifecycle.requests(self.engine, now)
        self.lifecycle.attaches(lambda o: self.actor.record(None, o),
                                lambda: self.adopter.rescan(now, self.config.observe), self.adopter.uncached)

    def _detached(self) -> tuple[dict[str, str], ...]:
        """What status lists as detached: found without a cache, or released by a detach (and not back since)."""
        managed = {v.info.name for v in self.vols.values()}
        out = {name: r.to_json() for name, r in self.adopter.uncached.items()}
        out.update((name, r.to_json()) for name, r in self.lifecycle.records.items.items() if name not in managed)
        for name, res in self.lifecycle.results.items():
            if name in out and res["state"] == "failed":
                out[name]["attach_error"] = res["detail"]
        return tuple(out[k] for k in sorted(out))

    # ------------------------------------------------------------------ reload
    def _load(self) -> DaemonConfig:
        """Re-read the configuration and its policies (off the loop thread: reads and parses only)."""
        if self.config_path is None:
            raise UserError("no configuration file to reload")
        return load_config(self.config_path)

    def _apply(self, parse: BackgroundParse) -> bool:
        """The parsed reload put in place; anything invalid keeps the running configuration (logged)."""
        try:
            if parse.error is not None:
                raise parse.error  # a UserError is a refusal; anything else a bug, for the stage's guard
            assert parse.result is not None
            new = parse.result
            self.engine.set_policy(new.policy)
        except UserError as exc:
            self.counters["reloads_failed"] += 1
            self.policy_error = str(exc)
            log.error("reload failed, keeping the running policy: %s", exc)
            self.notifier.ready("reload failed; running policy kept")
            return False
        self.config = keep_fixed(new, self.config)
        for v in list(self.vols.values()):
            self.adopter.pins.submit(self.engine, v.info)  # the patterns may have changed, and files appeared
        self.policy_error = None
        self.policy_generation += 1
        log.info("reloaded %s (policies: %s)%s", new.source, new.policy.source, " DRY RUN" if self.dry_run else "")
        self.notifier.ready("reloaded")
        return True

    def _save_state(self, now: int | None = None) -> None:
        """``now``: a tick's time: the state file takes the hot lists the loop keeps (at most TOP_EVERY_S old) and
        is written by the writer thread; None: lists made now, written before this returns."""
        self.persist.save(self.vols.values(), self.decisions, now)

    # ------------------------------------------------------------------ snapshot and answers
    def _publish(self, now: int, tick_ns: int) -> None:
        self.persist.collect()  # the state writes finished since the last tick, counted
        managed = list(self.vols.values())
        if self.hot.refresh([v.info.dev for v in managed], now, self.loop.tick_ns):  # the hot lists, in turn
            self.top = {v.info.name: as_dicts(self.hot.columns(v.info.dev, now), TOP_K) for v in managed}
        sizing = self.engine.sizing
        self.curves = {} if sizing is None else {v.info.name: sizing.curve_of(v.info.dev) for v in self.vols.values()}
        vols = tuple(status.volume_status(v, v.ctl, now, self.engine) for v in self.vols.values()
                     if v.ctl is not None)
        self.snapshot = snap = status.build(self._facts(), vols, now, tick_ns)
        if self.metrics is not None:
            self.metrics.publish(snap, tick_ns, time.time(), self.guard.once)

    def _facts(self) -> status.DaemonFacts:
        """What status reports of the daemon, handed over as one record (status never reads the daemon)."""
        drops, probe, state = self.intake.drops, self.probe, self.state
        return status.DaemonFacts(
            started_wall=self.started_wall, started_ns=self.started_ns, dry_run=self.dry_run,
            observe_only=all(v.observe_only for v in self.vols.values()), config_source=self.config.source,
            policy=status.PolicyStatus(self.config.policy.source, self.policy_generation, self.policy_error),
            probe=status.ProbeStatus(probe is not None, probe.report.summary() if probe is not None else "no probe"),
            drops=status.DropCounts(drops.ringbuf_full, drops.hotness_map_full, drops.other) if drops
            else status.DropCounts(), has_drops=drops is not None,
            counters=self.counters, loop_skipped=self.loop.skipped, tracked_files=len(self.engine.hotness),
            state_file=status.StateFileStatus(str(state.path), state.writes, state.failed_writes, state.last_error),
            unmanaged=tuple(status.UnmanagedStatus(label, device, reason)
                            for device, (label, reason) in sorted(self.adopter.unmanaged.items())),
            top=self.top, decisions=self.decisions.view(), ready=self.ready, bpf_object=self.bpf_object,
            capture=self.capture, curves=self.curves, detached=self._detached())

    def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        """Control-socket requests (called on the server thread): daemon/answers.py."""
        return answers.answer(self.snapshot, req, self.clear_requests,
                              lambda: self.reloads.ask(max(RELOAD_WAIT_S, 3 * self.config.tick_s)), self.imports,
                              self.drain_requests, self.lifecycle)
