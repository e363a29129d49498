"""Detach and attach through the running daemon (issue 36, ``cachepilot detach VOLUME`` / ``attach VOLUME [CACHE]``).

Detach: the request goes to the engine (engine/operatordetach.py: an operator's drain to verified clean, then one
Detach action through the volume's backend, read back there). Once the engine reads it ``detached`` the volume is
released here: dropped from management (its backend's steered knobs put back, the probe stops watching it) and
remembered in ``detached.json`` in the state directory with what ``attach`` puts back -- bcache the cache set's
UUID, dm-cache / dm-writecache the table the linear one replaced, lvmcache the cache pool. A device without its
cache is not managed (daemon/adoption.py): no latch, no alert; status lists it under ``detached``.

Attach: the kind's own interface on the device the daemon does not manage (bcache ``attach`` with the cache set's
UUID, read back from the ``cache`` link; dm kinds the saved table loaded again, read back; lvmcache ``lvconvert
--type cache --cachepool``), the decision logged with what was written and read back, then a rescan that adopts
the volume again. Names come from the control socket and are checked against what the daemon itself found; no
path is taken from a request."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachepilot.actions import DONE, FAILED, Attach, Outcome, Write
from cachepilot.backends import kinds
from cachepilot.backends.host import Host
from cachepilot.errors import CachepilotError, UserError
from cachepilot.safeio import read_text, write_atomic

log = logging.getLogger("cachepilot")

RECORDS_NAME = "detached.json"


@dataclass(frozen=True)
class Detached:
    """A device whose cache is away: its kernel name, label (dm name), kind and what attach puts back."""

    name: str
    label: str
    kind: str
    cache: str  # bcache: cache set UUID; dm kinds: the table line; lvmcache: VG/POOL ("" unknown)
    why: str  # "detached" (by cachepilot detach) or "no cache" (found so)
    since: float = 0.0

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "label": self.label, "kind": self.kind, "cache": self.cache, "why": self.why,
                "since": f"{self.since:.0f}"}


def saved_cache(kind: str, cache_id: str, writes: tuple[Write, ...]) -> str:
    """What attach needs to put the cache back, from the Detach's read-back writes (kinds.Reattach.saved)."""
    how = kinds.kind(kind).reattach
    return how.saved(cache_id, writes) if how is not None else ""


class Records:
    """The detached devices the daemon released, kept across restarts (``detached.json`` in the state directory)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RECORDS_NAME
        self.items: dict[str, Detached] = {}

    def load(self) -> None:
        if not self.path.exists():
            return
        try:
            doc = json.loads(read_text(self.path, "detached volumes", 1 << 20))
        except (OSError, ValueError, UserError) as exc:
            log.warning("%s: not read (%s): attach needs its CACHE argument", self.path, exc)
            return
        for d in doc.get("detached", []) if isinstance(doc, dict) else []:
            try:
                r = Detached(str(d["name"]), str(d["label"]), str(d["kind"]), str(d["cache"]), "detached",
                             float(d.get("since", 0)))
            except (KeyError, TypeError, ValueError):
                continue
            self.items[r.name] = r

    def add(self, r: Detached) -> None:
        self.items[r.name] = r
        self._save()

    def pop(self, name: str) -> Detached | None:
        r = self.items.pop(name, None)
        if r is not None:
            self._save()
        return r

    def _save(self) -> None:
        doc = {"detached": [r.to_json() for r in self.items.values()]}
        try:
            write_atomic(self.path, json.dumps(doc, indent=1).encode(), "detached volumes")
        except (OSError, UserError) as exc:
            log.warning("%s: not written (%s): attach will need its CACHE argument", self.path, exc)


def check_cache(kind: str, cache: str) -> None:
    """UserError for a CACHE argument that cannot be what the kind attaches (nothing of it reaches a shell)."""
    how = kinds.kind(kind).reattach
    if how is None:
        raise UserError(f"{kind}: cachepilot cannot attach a cache of this kind")
    if not how.valid(cache):
        raise UserError(f"CACHE: {how.what} expected for {kind}, got {cache[:60]!r}")


def attach(host: Host, r: Detached, cache: str) -> Write:
    """Put ``cache`` back under the detached device ``r`` through its kind (kinds.Reattach); the Write read back
    (KernelRejected if the kernel does not show it attached)."""
    check_cache(r.kind, cache)
    how = kinds.kind(r.kind).reattach
    assert how is not None
    return how.attach(host, r.name, r.label if r.label != r.name else "", cache)


class Lifecycle:
    """The daemon's detach and attach requests (queued by the control socket, carried out by the loop)."""

    def __init__(self, state_dir: Path, host: Callable[[], Host] = Host) -> None:
        self.records = Records(state_dir)
        self.detach_requests: list[dict[str, Any]] = []
        self.attach_requests: list[dict[str, Any]] = []
        self.host = host
        self.results: dict[str, dict[str, str]] = {}  # the last attach per name: its state, for the CLI

    def requests(self, engine: Any, now: int) -> None:
        """The detach requests, to the engine (one log line each); ``now``: the daemon's time for this tick, which
        their deadlines run from."""
        todo, self.detach_requests = self.detach_requests, []
        for r in todo:
            try:
                engine.operator_detach(r["volume"], r["deadline"], r.get("accept_loss", False), r.get("request", 0),
                                       now)
                log.info("%s: operator detach started: deadline %g s%s", r["volume"], r["deadline"],
                         ", accepting the loss of dirty data" if r.get("accept_loss") else "")
            except UserError as exc:
                log.warning("operator detach: %s", exc)

    def release(self, engine: Any, vols: Any, drop: Callable[[int, str], None]) -> None:
        """Volumes whose cache the engine read detached: remembered with what attach puts back, then dropped."""
        for c in engine.detached():
            v = vols.get(c.info.dev)
            label = v.found.label if v is not None else c.info.name
            cache = saved_cache(c.info.kind, c.state.cache_id or c.info.cache_id, c.detach.writes)
            self.records.add(Detached(c.info.name, label, c.info.kind, cache, "detached", time.time()))
            drop(c.info.dev, f"detached by the operator (cachepilot detach): {c.detach.detail}")

    def attaches(self, record: Callable[[Outcome], object], rescan: Callable[[], None],
                 found: dict[str, Detached]) -> None:
        """The attach requests: each through its kind, recorded as a decision; a rescan adopts what came back."""
        todo, self.attach_requests = self.attach_requests, []
        for req in todo:
            name = req["volume"]
            r = found.get(name) or self.records.items.get(name)
            cache = req.get("cache") or (r.cache if r is not None else "")
            a = Attach(name, cache, "operator attach (cachepilot attach)")
            try:
                if r is None:
                    raise UserError(f"{name}: not a detached device (status lists them under detached)")
                if not cache:
                    raise UserError(f"{name}: no cache saved for it: give CACHE")
                w = attach(self.host(), r, cache)
            except CachepilotError as exc:
                record(Outcome(a, FAILED, error=exc, detail=str(exc)))
                self.results[name] = {"state": "failed", "detail": str(exc)}
                continue
            self.records.pop(name)
            record(Outcome(a, DONE, writes=(w,), detail="attached; adopted at this rescan"))
            self.results[name] = {"state": "attached", "detail": f"{w.target}: read back {w.readback}"}
            rescan()
