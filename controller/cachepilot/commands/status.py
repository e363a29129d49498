"""`cachepilot status [--json]`: the daemon's volumes, modes and targets, dirty data against its bound, hit ratios,
health and latch, drops and the last tick, from its control socket."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cachepilot.daemon.control import DEFAULT_SOCKET
from cachepilot.display import escape


def socket_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", metavar="PATH", help=f"control socket (default {DEFAULT_SOCKET})")
    p.add_argument("--config", metavar="FILE",
                   help="take the control socket's path from this configuration (only that key is read)")


VOLUME_HELP = "the volume's name as status shows it (e.g. bcache0)"


def volume_command(sub: argparse._SubParsersAction, name: str, help: str,  # type: ignore[type-arg]
                   handler: Callable[[argparse.Namespace], int], volume_help: str = VOLUME_HELP
                   ) -> argparse.ArgumentParser:
    """The parser of a control-socket command on one volume (drain, detach, attach, clear-latch): --socket/--config,
    then VOLUME, run by ``handler``; the caller adds its own arguments after."""
    p = sub.add_parser(name, help=help)
    socket_arg(p)
    p.add_argument("volume", metavar="VOLUME", help=volume_help)
    p.set_defaults(handler=handler)
    return p


def socket_path(args: argparse.Namespace) -> Path:
    if args.socket:
        return Path(args.socket)
    if args.config:
        from cachepilot.daemon.config import load_socket  # lazy: the config reader (yaml, the policy) is slow to import

        return load_socket(args.config)
    return Path(DEFAULT_SOCKET)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render(s: dict[str, Any]) -> str:
    age = time.time() - s["last_tick"]["time"]
    head = [
        f"cachepilot daemon pid {s['pid']}, up {s['uptime_s']:.0f} s{', DRY RUN' if s['dry_run'] else ''}"
        f"{', observe-only (no cached volume)' if s['observe_only'] else ''}",
        f"policy: {escape(s['policy']['source'])} (generation {s['policy']['generation']})"
        + (f"; last reload failed: {escape(s['policy']['last_error'])}" if s["policy"]["last_error"] else ""),
        f"last tick: {age:.1f} s ago, took {s['last_tick']['duration_s'] * 1000:.1f} ms (#{s['last_tick']['n']},"
        f" {s['last_tick']['skipped']} skipped); tracked files {s['tracked_files']}",
        f"drops: ring buffer {s['drops']['ringbuf_full']}, hotness table {s['drops']['hotness_map_full']},"
        f" other {s['drops']['other']}; state file writes {s['state_file']['writes']}"
        f" (failed {s['state_file']['failed_writes']})",
        f"probe: {escape(s['probe']['summary'].splitlines()[0]) if s['probe']['summary'] else '-'}",
        "",
        f"{'VOLUME':<10} {'KIND':<14} {'MODE':<13} {'TARGET':<13} {'DIRTY':>10} {'BOUND':>10} {'HIT':>6} "
        f"{'HEALTH':<9} {'LATCH':<6} MOUNT",
    ]
    for v in s["volumes"]:
        hr = f"{v['hit_ratio']:.0%}" if v["hit_ratio"] is not None else "-"
        kind = "observe" if v["observe_only"] else escape(str(v["kind"]))
        mode, target = escape(str(v["mode"] or "-")), escape(str(v["target_mode"] or "-"))
        head.append(
            f"{escape(v['name']):<10} {kind:<14} {mode:<13} {target:<13} "
            f"{_bytes(v['dirty_bytes']):>10} {_bytes(v['max_dirty_bytes']):>10} {hr:>6} {escape(str(v['health'])):<9} "
            f"{'yes' if v['latched'] else 'no':<6} {escape(v['mountpoint']) or '-'}"
        )
        for p in v["pending"]:
            head.append(f"{'':<10} pending: {escape(p)}")
        head.extend(_pins(v.get("pins")))  # a daemon from before pinning has no such key
        head.extend(_writeback(v.get("writeback")))  # nor one from before issue 36
    if not s["volumes"]:
        head.append("(no volume)")
    for u in s.get("unmanaged", []):  # a daemon from before issue 24 has no such key
        head.append(f"{escape(u['name']):<10} NOT MANAGED ({escape(u['reason'])}; {escape(u['dev'])}): its cache runs "
                    "unbounded; see the journal")
    return "\n".join(head)


def _writeback(w: dict[str, Any] | None) -> list[str]:
    """A stalled write-back with why, and a dm-cache found with every mapped block dirty with its time to clean."""
    if not w:
        return []
    out = []
    if w.get("stalled"):
        out.append(f"{'':<10} WRITE-BACK STALLED: {escape(str(w.get('cause')))}")
    if w.get("all_dirty"):
        eta = w.get("clean_eta_s")
        how = "came back with" if w.get("came_back_all_dirty") else "has"
        out.append(f"{'':<10} ALL DIRTY: {how} every mapped block dirty (as after an unclean shutdown); "
                   + (f"{eta:.0f} s to clean at {_bytes(w.get('rate_bytes_s'))}/s" if eta is not None
                      else "time to clean not measured yet"))
    return out


def _pins(p: dict[str, Any] | None) -> list[str]:
    """The volume's pins: how many are resident, then the first files with their residency."""
    if not p:
        return []
    out = [f"{'':<10} pinned: {p['files']} file(s), {_bytes(p['bytes'])}; resident {p['resident_files']}"
           f" ({_bytes(p['resident_bytes'])}); {p['promotions']} promotion(s)"
           + (f"; {escape(p['note'])}" if p.get("note") else "")]
    for f in p.get("list", []):
        out.append(f"{'':<12} {'resident' if f['resident'] else 'NOT resident':<13} {_bytes(f['size']):>10}  "
                   f"{escape(f['path'])}")
    return out


def status(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request

    s = request(socket_path(args), {"cmd": "status"})
    print(json.dumps(s, indent=2, sort_keys=True) if args.json else render(s))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="what the running daemon sees and does (control socket; root)")
    socket_arg(p)
    p.add_argument("--json", action="store_true", help="the whole status as JSON")
    p.set_defaults(handler=status)
