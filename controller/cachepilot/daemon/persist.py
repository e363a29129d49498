"""What the daemon carries across a restart, through the state file (daemon/state.py): the hot lists (re-warmed
into the engine), the failure latches (kept unless the cache device was replaced), the counters and recent
decisions, the operations in flight at the last stop (reconciled, never repeated), and the knobs it steered (put
back at the next start if a kill left them as steered). It reaches the engine through its methods only
(``restore_latch``, ``rewarm_file``, ``latch_of``, ``health_of``, ``sample``, ``steered_knobs``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from cachepilot.actions import Action, SetKnob, SetKnobs
from cachepilot.capabilities import KNOBS
from cachepilot.daemon.decisionlog import DecisionLog
from cachepilot.daemon.snapshot import HotLists, HotRows, as_rows, hot_columns
from cachepilot.daemon.state import MAX_DECISIONS, MAX_HOT, NO_STATE, StateFile
from cachepilot.daemon.statewriter import StateWriter
from cachepilot.daemon.volume import ManagedVolume, devname
from cachepilot.engine.engine import Engine
from cachepilot.engine.knobs import same_knob_value
from cachepilot.engine.seqcutoff import KNOB as SEQ_KNOB
from cachepilot.errors import CachepilotError

log = logging.getLogger("cachepilot")
HOT_ROW = ("ino", "gen", "score", "size")  # a state file's hot-list entry
MAX_STALL_GAP_S = 86_400.0  # a stall stretch is carried over a restart only if the daemon was down less than this


class Persistence:
    def __init__(self, state: StateFile, engine: Engine, counters: Counter[str], once: Callable[[str], None],
                 hot: HotLists | None = None, writer: StateWriter | None = None) -> None:
        self.state = state
        self.engine = engine
        self.hot = hot  # the hot lists the loop keeps (shared with `top`), if any
        self.writer = writer  # writes a tick's state file off the loop thread, if any
        self.counters = counters
        self.once = once
        self.saved: dict[str, Any] = {}
        self.previous_counters: dict[str, int] = {}  # the last run's, from the state file

    def read(self, decisions: DecisionLog) -> None:
        """Read the state file (a missing or corrupt one: start fresh, said once); its decisions go to
        ``decisions``."""
        doc, why = self.state.read()
        if doc is None:  # a first start has no state file: INFO; a corrupt or refused one: WARNING
            log.log(logging.INFO if why.startswith(NO_STATE) else logging.WARNING, "starting fresh: %s", why)
            return
        self.saved = doc
        saved = [v for v in doc.get("volumes", {}).values() if isinstance(v, dict)]
        n = sum(len(v.get("hot", [])) for v in saved)
        inflight = sum(len(v.get("in_flight", [])) for v in saved)
        log.info("state file %s: %d volume(s), %d hot file(s), %d in-flight action(s)", self.state.path,
                 len(saved), n, inflight)
        prev = doc.get("counters", {})
        if isinstance(prev, dict):
            self.previous_counters = {k: v for k, v in prev.items() if isinstance(v, int)}
        for d in doc.get("decisions", [])[-MAX_DECISIONS:]:
            if isinstance(d, dict):
                decisions.append(d)

    def saved_volume(self, info: Any) -> dict[str, Any] | None:
        for sv in self.saved.get("volumes", {}).values():
            if not isinstance(sv, dict):
                continue
            if info.fs_uuid and sv.get("fs_uuid") == info.fs_uuid:
                return sv
            if not info.fs_uuid and sv.get("name") == info.name and sv.get("kind") == info.kind:
                return sv
        return None

    def adopted(self, v: ManagedVolume, now: int) -> None:
        """A volume just adopted: its latch and its hot list as the last run left them."""
        self.restore_latch(v, now)
        self.resume_stall_watch(v, now)
        self.rewarm(v, now)

    def resume_stall_watch(self, v: ManagedVolume, now: int) -> None:
        """A stretch without write-back progress goes on across a restart (the time the daemon was down counts:
        dirty data is compared with the saved figure at the first sample), so a daemon restarted now and then
        still reports a stall after ``health.stall_after``."""
        sv = self.saved_volume(v.info) or {}
        wb, written = sv.get("writeback_stall"), self.saved.get("written")
        if not isinstance(wb, dict) or not isinstance(written, int | float):
            return
        stalled, dirty, down = wb.get("stalled_s"), wb.get("dirty"), time.time() - written
        if isinstance(stalled, int | float) and isinstance(dirty, int | float) and 0 <= down <= MAX_STALL_GAP_S:
            self.engine.resume_writeback_watch(v.info.dev, float(stalled) + down, int(dirty), now)

    def restore_latch(self, v: ManagedVolume, now: int) -> None:
        """A latched volume stays latched across restarts (unless its cache device was replaced since)."""
        latch = (self.saved_volume(v.info) or {}).get("latch")
        if not isinstance(latch, dict) or self.engine.latch_of(v.info.dev) is not None:
            return
        cache_id = str(latch.get("cache_id", ""))
        if cache_id and v.info.cache_id and cache_id != v.info.cache_id:
            log.info("%s: was latched on cache %s; the cache device was replaced: not latched", v.info.name, cache_id)
            return
        got = self.engine.restore_latch(v.info.dev, f"{latch.get('reason', 'latched')} (kept from the state file)",
                                        now, cache_id)
        if got is not None:
            log.warning("%s: still latched: %s", v.info.name, got.reason)

    def rewarm(self, v: ManagedVolume, now: int) -> None:
        """Put the saved hot list back into the hotness table: the engine admits and promotes the files at the
        volume's promotion rate (paced), hottest first."""
        sv = self.saved_volume(v.info)
        if sv is None:
            return
        n = 0
        for item in sv.get("hot", [])[:MAX_HOT]:
            try:
                ino, gen, score, size = (int(x) for x in item)
            except (TypeError, ValueError):
                continue
            if ino <= 0 or score <= 0:
                continue
            self.engine.rewarm_file(v.info.dev, ino, gen, score, size, now)
            n += 1
        if n:
            log.info("%s: re-warming %d file(s) from the state file (paced by the promotion rate)", v.info.name, n)
            self.counters["rewarm_files"] += n

    def reconcile(self, vols: Iterable[ManagedVolume], now: int, execute: Callable[[Action, int], None]) -> None:
        """Before the first decision: read every cache's actual state, and report what the last run left
        unfinished. An interrupted step is never repeated; only a setting the interrupted operation changed and
        that still reads back as it left it is put back."""
        for v in vols:
            if v.backend is None:
                continue
            saved = self.saved_volume(v.info) or {}
            try:
                s = v.backend.sample(now)
                # An interrupted operation's own writes first (a drain killed mid-way left writeback_percent at its
                # 0, over the pinned value it had saved), then what the last run steered: the knob then reads as
                # that run left it, and goes back to the value found before it (the lab's 20-kill test ended at the
                # pinned 40, the steered put-back having seen the drain's 0 and skipped)
                inflight = [d for d in saved.get("in_flight", []) if isinstance(d, dict)]
                for d in inflight:
                    self._put_back(v, d, s.knobs, now, execute)
                if inflight:
                    s = v.backend.sample(now)
                if self._put_back_steered(v, saved.get("steered"), s.knobs, now, execute):
                    s = v.backend.sample(now)  # the engine must find the operator's values, not ours, as the base
                self._adopt_steered(v, saved.get("steered"))
            except CachepilotError as exc:
                self.once(f"{v.info.name}: cannot read its state before acting: {exc}")
                continue
            v.last_sample = s
            self.engine.sample(s)
            log.info("%s: actual state: mode %s, %d dirty bytes", v.info.name, s.mode, s.dirty_bytes)

    @staticmethod
    def _put_back(v: ManagedVolume, d: dict[str, Any], knobs: dict[str, str], now: int,
                  execute: Callable[[Action, int], None]) -> None:
        log.warning("%s: interrupted at the last stop: %s (not repeated)", v.info.name, d.get("action"))
        for w in d.get("writes", []):
            knob = str(w.get("target", "")).split()[-1:]
            if knob and knobs.get(knob[0]) == w.get("value") and w.get("before") not in (None, ""):
                execute(SetKnob(v.info.name, knob[0], str(w["before"]),
                                f"put back after an interrupted {d.get('kind')}"), now)

    def _adopt_steered(self, v: ManagedVolume, steered: Any) -> None:
        """What the last run set over a value it found stays this run's to put back at its stop, with that found
        value (OperationBackend.adopt_steered): the knob may read anything now -- put back above, or left by an
        operation killed before the state file recorded it -- and this run's first write of it would take that
        for the found value. Not the knob the engine steers itself (it restores its own)."""
        adopt = getattr(v.backend, "adopt_steered", None)
        if adopt is None:
            return
        c = self.engine.vols.get(v.info.dev)
        pinned = c.policy.knobs if c is not None else {}
        for knob, (found, ours) in _pairs(steered).items():
            if knob != SEQ_KNOB or knob in pinned:
                adopt(knob, found, ours)

    @staticmethod
    def _put_back_steered(v: ManagedVolume, steered: Any, knobs: dict[str, str], now: int,
                          execute: Callable[[Action, int], None]) -> int:
        """Knobs the last run steered and could not put back (it was killed): back to the value it found, if the
        knob still reads as it left it (else someone has set it since: theirs to keep), together (one dm-writecache
        reload for the delegated bound's four table arguments). How many were put back."""
        back: list[tuple[str, str, str]] = []
        for knob, (before, ours) in sorted(_pairs(steered).items()):
            if knob not in knobs or not same_knob_value(knob, knobs[knob], ours) or \
                    same_knob_value(knob, knobs[knob], before):
                continue
            back.append((knob, before, ours))
        why = "put back after an unclean stop: the last run steered"
        if len(back) == 1:
            knob, before, ours = back[0]
            execute(SetKnob(v.info.name, knob, before, f"{why} it to {ours}"), now)
        elif back:
            execute(SetKnobs(v.info.name, tuple((k, b) for k, b, _ in back),
                             f"{why} them to {', '.join(f'{k} {o}' for k, _, o in back)}"), now)
        return len(back)

    def steered(self, v: ManagedVolume) -> dict[str, list[str]]:
        """What this run would put back at stop, as the state file keeps it (knob -> [found, ours]); what the last
        run set and this one adopted (_adopt_steered) included, so a run killed before it wrote the knob itself
        passes the found value on."""
        got = dict(v.backend.steered_knobs()) if v.backend is not None else {}
        got.update(self.engine.steered_knobs(v.info.dev))
        return {k: [b, o] for k, (b, o) in sorted(got.items())}

    def doc(self, vols: Iterable[ManagedVolume], decisions: DecisionLog, at: int | None = None) -> dict[str, Any]:
        """The state document; ``at``: a tick's time, whose hot lists (the loop's, see snapshot.HotLists) it takes
        (None: made here)."""
        return hot_rows(self._doc(vols, decisions, at))

    def _doc(self, vols: Iterable[ManagedVolume], decisions: DecisionLog, at: int | None) -> dict[str, Any]:
        """doc() with each hot list still as its numpy columns (made into rows by hot_rows, off the loop thread
        when the writer thread writes it: 65 536 small lists with 1 M files on 16 volumes)."""
        out: dict[str, Any] = {}
        for v in vols:
            info = v.info
            latch = self.engine.latch_of(info.dev)
            hot = (hot_columns(self.engine.hotness, info.dev, MAX_HOT) if at is None or self.hot is None
                   else self.hot.columns(info.dev, at))
            out[info.name] = {
                "name": info.name, "kind": info.kind, "dev": devname(info.dev), "fs_uuid": info.fs_uuid,
                "hot": {f: hot[f] for f in HOT_ROW},
                "health": self.engine.health_of(info.dev),
                "latch": {"reason": latch.reason, "cache_id": latch.cache_id} if latch is not None else None,
                "in_flight": list(v.in_flight.values()),
                "writeback_stall": self.engine.writeback_carried(info.dev),
                "steered": self.steered(v),
            }
        return {
            "written": time.time(), "pid": os.getpid(), "volumes": out,
            "counters": {k: int(n) for k, n in self.counters.items()},
            "decisions": decisions.last(MAX_DECISIONS // 2),
        }

    def save(self, vols: Iterable[ManagedVolume], decisions: DecisionLog, at: int | None = None) -> None:
        """Write the state file: a tick's (``at``) is handed to the writer thread when there is one
        (daemon/statewriter.py); any other is written before this returns."""
        self.collect()
        doc = self._doc(vols, decisions, at)
        if at is not None and self.writer is not None:
            self.writer.submit(doc, hot_text)
            return
        doc = hot_text(doc)
        if self.writer is None:
            self._count(self.state.write(doc), self.state.last_error)
            return
        self.writer.write_now(doc)
        self.collect()

    def collect(self) -> None:
        """Count the writer thread's finished writes (on the loop thread: the counters are the loop's)."""
        if self.writer is not None:
            for ok, error in self.writer.results():
                self._count(ok, error)

    def _count(self, ok: bool, error: str | None) -> None:
        self.counters["state_writes" if ok else "state_writes_failed"] += 1
        if not ok:
            self.once(f"state file not written (carrying on): {error}")


def hot_text(doc: dict[str, Any]) -> dict[str, Any]:
    """The document as the state file encodes it: each volume's hot list as HotRows (its rows' JSON made a block at a
    time, the same bytes as hot_rows' lists)."""
    for v in doc["volumes"].values():
        v["hot"] = HotRows(v["hot"], HOT_ROW)
    return doc


def hot_rows(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with each volume's hot list as the state file keeps it: [ino, gen, score, size] rows."""
    for v in doc["volumes"].values():
        v["hot"] = as_rows(v["hot"], HOT_ROW)
    return doc


def _pairs(steered: Any) -> dict[str, list[str]]:
    """A state file's ``steered`` entry, only its well-formed pairs of known knobs."""
    if not isinstance(steered, dict):
        return {}
    return {k: list(p) for k, p in steered.items()
            if k in KNOBS and isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)}
