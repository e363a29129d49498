"""`cachepilot explain [--volume V] [--since T]`: each recent decision of the daemon with its reason, what it
wrote (or, in a dry run, would write) and what the kernel read back."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from typing import Any

from cachepilot.commands.status import socket_arg, socket_path
from cachepilot.display import escape
from cachepilot.errors import UserError


def since_ts(text: str | None) -> float:
    """--since: a duration back from now (90s, 5m) or a date-time (2026-11-23T20:00:00)."""
    if not text:
        return 0.0
    from cachepilot.policy.values import parse_duration

    try:
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UserError(f"--since {text!r}: expected a duration (90s, 5m, 1h) or a date-time") from None


def render(d: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(d.get("ts", 0)).strftime("%H:%M:%S")
    dry = " (dry run)" if d.get("dry_run") else ""
    what = " ".join(escape(str(d.get(k))) for k in ("volume", "kind"))
    lines = [f"{when} {what} => {escape(str(d.get('status')))}{dry}",
             f"    why: {escape(str(d.get('reason', '')))}"]
    for w in d.get("writes", []):
        lines.append(f"    wrote {escape(str(w['target']))}: {escape(str(w['before']))} -> {escape(str(w['value']))}"
                     f" (read back {escape(str(w['readback']))})")
    if d.get("error"):
        lines.append(f"    error [{escape(str(d.get('error_kind')))}]: {escape(str(d['error']))}")
    if d.get("detail"):
        lines.append(f"    note: {escape(str(d['detail']))}")
    return "\n".join(lines)


def explain(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request

    req: dict[str, Any] = {"cmd": "explain", "since": since_ts(args.since)}
    if args.volume:
        req["volume"] = args.volume
    decisions = request(socket_path(args), req)["decisions"]
    if args.json:
        print(json.dumps(decisions, indent=2))
        return 0
    for d in decisions:
        print(render(d))
    if not decisions:
        print("no decision" + (f" since {args.since}" if args.since else "") + " yet")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("explain", help="recent decisions with their reasons and read-backs (control socket; root)")
    socket_arg(p)
    p.add_argument("--volume", metavar="NAME")
    p.add_argument("--since", metavar="T", help="a duration back from now (e.g. 10m) or a date-time")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=explain)
