"""`cachepilot advise VOLUME`: this volume's estimated hit ratio and origin traffic at other cache sizes (½×, 1×,
2×, 4× the current cache and the size reaching 90% of the achievable hits), with an error estimate: from the
daemon's live sampler (control socket), or offline from a recorded trace (--trace)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cachepilot.commands.status import _bytes, socket_arg, socket_path
from cachepilot.display import escape
from cachepilot.errors import UserError
from cachepilot.units import parse_size


def from_trace(path: str, volume: str, cache_size: int | None, calibrate: bool = True) -> dict[str, Any]:
    """The advice for ``volume`` of the trace at ``path`` (its hotness records fed to a fresh advisor), calibrated
    by the cache's own hit ratio in the trace's samples unless ``calibrate`` is false."""
    from cachepilot.models.sizing import Advisors
    from cachepilot.trace.format import T_HOT, T_SAMPLE, TraceReader, volume_sample

    reader = TraceReader(path)
    info = next((v for v in reader.volumes if v.name == volume), None)
    if info is None:
        known = ", ".join(sorted(v.name for v in reader.volumes)) or "none"
        raise UserError(f"{path}: unknown volume {volume!r} (known: {known})")
    cache = cache_size if cache_size is not None else info.cache_bytes
    if cache <= 0:
        raise UserError(f"{path}: the trace does not say {volume}'s cache size: give --cache-size")
    advisors = Advisors()
    for t, recs in reader.blocks(hot_as_array=True):
        if t == T_HOT:
            advisors.observe(recs, (info.dev,))
        elif t == T_SAMPLE:
            for r in recs:
                s = volume_sample(r)
                if s.dev == info.dev:
                    advisors.note_sample(s.dev, s.hits, s.misses)
    out = {"volume": volume, **advisors.advice(info.dev, cache, calibrate)}
    if reader.cut:
        out["cut"] = reader.cut
    return out


def render(a: dict[str, Any]) -> str:
    lines = [f"{escape(str(a['volume']))}: cache {_bytes(a['cache_bytes'])}, {a['samples']} sampled reads"
             f" (an LRU estimate; ± = the spread across {a.get('seeds', 0)} hash seeds)"]
    if not a["points"]:
        lines.append("  no reads seen yet")
        return "\n".join(lines)
    if "efficiency" in a:
        lines.append(f"  calibrated: the cache measured {a['measured_hit_ratio']:.3f}, as an LRU of "
                     f"{a['efficiency']:.2f}x its size would (LRU column: uncalibrated)")
    lru = {p["size_bytes"]: p["hit_ratio"] for p in a.get("lru_points", [])}
    lines.append(f"  {'SIZE':>12} {'HIT RATIO':>10} {'±':>6} {'LRU':>6} {'ORIGIN READ':>12} {'ORIGIN WRITE':>12}")
    for p in a["points"]:
        mark = "  <- 90% of achievable" if p["size_bytes"] == a["size_for_90pct"] else ""
        mark = "  <- current" if p["size_bytes"] == a["cache_bytes"] else mark
        raw = f"{lru[p['size_bytes']]:.3f}" if p["size_bytes"] in lru else "-"
        lines.append(f"  {_bytes(p['size_bytes']):>12} {p['hit_ratio']:>10.3f} {p['error']:>6.3f} {raw:>6} "
                     f"{_bytes(p['origin_read_bytes']):>12} {_bytes(p['origin_write_bytes']):>12}{mark}")
    return "\n".join(lines)


def advise(args: argparse.Namespace) -> int:
    size = None
    if args.cache_size is not None:
        try:
            size = parse_size(args.cache_size)
        except ValueError:
            raise UserError(f"--cache-size: not a size: {args.cache_size!r} (e.g. 256MiB)") from None
        if size <= 0:
            raise UserError(f"--cache-size must be positive, got {args.cache_size!r}")
    if args.trace is not None:
        answer = from_trace(args.trace, args.volume, size, calibrate=not args.lru)
    else:
        from cachepilot.daemon.control import request

        answer = request(socket_path(args), {"cmd": "advise", "volume": args.volume,
                                             **({"cache_bytes": size} if size is not None else {})})
    print(json.dumps(answer, indent=2) if args.json else render(answer))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("advise", help="estimated hit ratio at other cache sizes (live, or from a trace)")
    p.add_argument("volume", metavar="VOLUME", help="the cached volume (e.g. bcache0)")
    p.add_argument("--trace", metavar="FILE", help="from a recorded trace (cachepilot record) instead of the daemon")
    p.add_argument("--cache-size", metavar="SIZE", help="the current cache size to scale from (default: the volume's)")
    p.add_argument("--lru", action="store_true",
                   help="--trace: the plain LRU estimate, not calibrated by the cache's own hit ratio")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    socket_arg(p)
    p.set_defaults(handler=advise)
