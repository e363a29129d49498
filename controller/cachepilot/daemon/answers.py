"""The control socket's answers (called on the server thread): ``status``, ``top`` and ``explain`` from the last
published snapshot only; ``clear_latch`` and ``hotlist_import`` queue the request for the loop (the engine is the
loop's); ``reload`` waits, bounded, for the loop's verdict."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from cachepilot.daemon.acting import DECISIONS_KEPT
from cachepilot.daemon.imports import Imports
from cachepilot.daemon.lifecycle import Lifecycle, check_cache
from cachepilot.daemon.reloads import Verdict
from cachepilot.daemon.status import Status
from cachepilot.engine.operatordetach import refusal
from cachepilot.engine.operatordrain import check_rate
from cachepilot.errors import UserError
from cachepilot.models.sizing import EMPTY

TOP_K = 25
MAX_N = 1 << 20  # a count asked for (top's n, explain's limit): beyond any list the snapshot holds


def _managed(req: dict[str, Any], vols: Any, verb: str) -> tuple[str, Any]:
    """The request's volume by name, which must be managed (not observed only) for ``verb``: UserError naming it."""
    name = req.get("volume")
    vol = vols.get(name) if isinstance(name, str) else None
    if vol is None:
        raise UserError(f"unknown volume {str(name)[:80]!r} (known: {', '.join(sorted(vols)) or 'none'})")
    if vol.observe_only:
        raise UserError(f"{name}: observed only (not managed): cachepilot does not {verb} it")
    return str(name), vol  # a found volume had a str name


def _number(req: dict[str, Any], key: str, default: float, lo: float, hi: float, *, whole: bool = True) -> Any:
    """``req[key]`` checked (a JSON number, whole if ``whole``, in [lo, hi]); UserError naming the key otherwise:
    a request's wrong type is its one-line error, not an internal error (``{"n": []}`` was a TypeError)."""
    v = req.get(key, default)
    ok_type = (int,) if whole else (int, float)
    if isinstance(v, bool) or not isinstance(v, ok_type) or not lo <= v <= hi:
        kind = "an integer" if whole else "a number"
        raise UserError(f"{key}: {kind} in [{lo:g}, {hi:g}] expected, got {str(v)[:40]!r}")
    return v


def answer(snap: Status | None, req: dict[str, Any], clear_requests: list[str],
           ask_reload: Callable[[], Verdict], imports: Imports | None = None,
           drain_requests: list[dict[str, Any]] | None = None,
           lifecycle: Lifecycle | None = None) -> dict[str, Any]:
    cmd = req.get("cmd")
    if cmd == "reload":
        verdict = ask_reload()
        return {"reloaded": verdict.ok, "message": verdict.message}
    if cmd == "status":
        return snap.to_json(leave_out=("top", "decisions")) if snap is not None else {}
    vols = {v.name: v for v in snap.volumes} if snap is not None else {}
    if cmd == "top":
        return _top(snap, vols, req)
    if cmd == "explain":
        return _explain(list(snap.decisions) if snap is not None else [], vols, req)
    if cmd == "advise":
        return _advise(snap, vols, req)
    if cmd == "clear_latch":
        name = str(req.get("volume", ""))
        vol = vols.get(name)
        if vol is None:
            raise UserError(f"unknown volume {name!r}")
        # Queued even when the snapshot (one tick old) shows no latch: the tick in between may have set one.
        clear_requests.append(name)  # done by the loop at its next tick
        return {"queued": name, "latched": vol.latched}
    if cmd == "drain" and drain_requests is not None:
        return _drain(vols, req, drain_requests)
    if cmd == "detach" and lifecycle is not None:
        return _detach(vols, req, lifecycle.detach_requests)
    if cmd == "attach" and lifecycle is not None:
        return _attach(snap, req, lifecycle)
    if cmd == "hotlist_import" and imports is not None:
        name = str(req.get("volume", ""))
        if name not in vols:
            raise UserError(f"unknown volume {name!r}")
        return {"queued": imports.add(name, req.get("files"))}
    raise UserError(f"unknown command {cmd!r} (status, top, explain, advise, clear_latch, reload, hotlist_import,"
                    " drain, detach, attach)")


def _detach(vols: dict[str, Any], req: dict[str, Any], queue: list[dict[str, Any]]) -> dict[str, Any]:
    """``cachepilot detach``: checked here (the refusal of a failed cache holding dirty data is its one line, exit
    2 in the CLI), carried out by the loop (engine/operatordetach.py); the CLI follows it in ``status``."""
    name, vol = _managed(req, vols, "detach")
    deadline = _number(req, "deadline", 600, 1, 7 * 86400, whole=False)
    accept_loss = req.get("accept_loss", False)
    if not isinstance(accept_loss, bool):
        raise UserError(f"accept_loss: true or false expected, got {str(accept_loss)[:40]!r}")
    if (vol.operator_detach or {}).get("state") in ("draining", "detaching"):
        raise UserError(f"{name}: a detach is already under way")
    loss = vol.detach_loss_bytes
    line = refusal(name, loss is not None or vol.health == "FAILED", max(loss or 0, vol.dirty_bytes or 0),
                   accept_loss)
    if line is not None:
        raise UserError(line)
    number = next(_REQUESTS)
    queue.append({"volume": name, "deadline": deadline, "accept_loss": accept_loss, "request": number})
    return {"queued": name, "dirty_bytes": vol.dirty_bytes, "request": number}


def _attach(snap: Status | None, req: dict[str, Any], lifecycle: Lifecycle) -> dict[str, Any]:
    """``cachepilot attach``: a device status lists as detached, with the cache its kind attaches (default: the
    one detach saved), carried out by the loop (daemon/lifecycle.py)."""
    detached = {d["name"]: d for d in (snap.detached if snap is not None else ())}
    detached.update({d["label"]: d for d in (snap.detached if snap is not None else ())})
    name = req.get("volume")
    d = detached.get(name) if isinstance(name, str) else None
    if d is None:
        raise UserError(f"{str(name)[:80]!r} is not a detached device (detached: "
                        f"{', '.join(sorted(detached)) or 'none'})")
    cache = req.get("cache") or d["cache"]
    if not isinstance(cache, str) or not cache:
        raise UserError(f"{name}: no cache saved for it: give CACHE (bcache: the cache set UUID)")
    check_cache(d["kind"], cache)
    lifecycle.results.pop(d["name"], None)
    lifecycle.attach_requests.append({"volume": d["name"], "cache": cache})
    return {"queued": d["name"], "cache": cache, "kind": d["kind"]}


def _drain(vols: dict[str, Any], req: dict[str, Any], queue: list[dict[str, Any]]) -> dict[str, Any]:
    """``cachepilot drain``: checked here (one line for a bad request), carried out by the loop at its next tick
    (the engine is the loop's); the CLI follows it in ``status`` (the volume's ``operator_drain``)."""
    name, vol = _managed(req, vols, "drain")
    if req.get("release"):
        queue.append({"volume": name, "release": True})
        return {"queued": name, "release": True}
    deadline = _number(req, "deadline", 600, 1, 7 * 86400, whole=False)
    end = req.get("end", "policy")
    if end not in ("policy", "writethrough"):
        raise UserError(f"end: policy or writethrough expected, got {str(end)[:40]!r}")
    running = (vol.operator_drain or {}).get("state") == "running"
    if running:
        raise UserError(f"{name}: an operator's drain is already running")
    rate = _number(req, "rate", 0, 0, 1 << 40)
    check_rate(str(name), vol.kind, rate)
    number = next(_REQUESTS)
    queue.append({"volume": name, "deadline": deadline, "end": end, "rate": rate, "request": number})
    return {"queued": name, "dirty_bytes": vol.dirty_bytes, "request": number}


# Drain and detach requests numbered as they come: status shows the number of the request a volume's operator_drain
# (operator_detach) is, so the CLI follows its own (until the next tick takes it up, status still shows an earlier
# request's end: lab, a drain asked for right after one that expired printed that one's "drain expired" and exit 1
# at once; a detach retried after a failed one would have printed "detach failed" likewise)
_REQUESTS = itertools.count(1)


def _top(snap: Status | None, vols: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    want = req.get("volume")
    if want is not None and (not isinstance(want, str) or want not in vols):
        raise UserError(f"unknown volume {want!r} (known: {', '.join(sorted(vols)) or 'none'})")
    n = _number(req, "n", TOP_K, 0, MAX_N)
    top = snap.top if snap is not None else {}
    return {"volumes": [{"name": name, "mountpoint": vols[name].mountpoint, "dev": vols[name].dev,
                         "files": files[:n]}
                        for name, files in top.items() if name in vols and (want is None or name == want)]}


def _advise(snap: Status | None, vols: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    name = str(req.get("volume", ""))
    vol = vols.get(name)
    if snap is None or vol is None:
        raise UserError(f"unknown volume {name!r} (known: {', '.join(sorted(vols)) or 'none'})")
    cache = req.get("cache_bytes", vol.cache_bytes)
    if not isinstance(cache, int) or isinstance(cache, bool) or not 0 < cache < 1 << 62:
        raise UserError(f"cache_bytes must be a positive integer, got {cache!r}")
    if name not in snap.curves:
        raise UserError("the live sizing advisor is off: `advisor: true` in the daemon's configuration turns it on "
                        "(a restart takes it); offline: cachepilot advise VOLUME --trace RECORDING")
    curve = snap.curves.get(name, EMPTY)
    return {"volume": name, **curve.advice(cache, curve.measured)}


def _explain(decisions: list[dict[str, Any]], vols: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    since = float(_number(req, "since", 0, -1e12, 1e12, whole=False))
    want = req.get("volume")
    if want is not None and not isinstance(want, str):
        raise UserError(f"volume: a name expected, got {str(want)[:40]!r}")
    known = set(vols) | {d.get("volume") for d in decisions}
    if want is not None and want not in known:  # a volume gone since keeps its decisions
        raise UserError(f"unknown volume {want!r} (known: {', '.join(sorted(map(str, known))) or 'none'})")
    out = [d for d in decisions if d.get("ts", 0) >= since and (want is None or d.get("volume") == want)]
    limit = _number(req, "limit", DECISIONS_KEPT, 1, MAX_N)
    return {"decisions": out[-limit:]}
