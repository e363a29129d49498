"""`cachepilot drain VOLUME`: drive a volume's dirty data to zero through the running daemon (issue 36), with a
progress line (bytes left, rate, time to go) until the backend reads the cache clean, or one line and exit 1 when
the deadline passes with what is left. The daemon holds its own policy off the volume meanwhile; ``--end
writethrough`` leaves it write-through until ``--release``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from cachepilot.commands.status import _bytes, socket_path, volume_command
from cachepilot.display import escape
from cachepilot.errors import UserError

POLL_S = 1.0
GRACE_S = 30.0  # past the deadline, how long the CLI waits for the daemon to say how it ended


def drain(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request
    from cachepilot.policy.values import parse_duration, parse_size

    try:
        deadline = parse_duration(args.deadline)
    except ValueError as exc:
        raise UserError(f"--deadline: {exc}") from None
    try:
        rate = parse_size(args.rate) if args.rate else 0
    except ValueError as exc:
        raise UserError(f"--rate: {exc}") from None
    sock = socket_path(args)
    req: dict[str, Any] = {"cmd": "drain", "volume": args.volume}
    req.update({"release": True} if args.release else {"deadline": deadline, "end": args.end, "rate": rate})
    answer = request(sock, req)
    name = escape(args.volume)
    if args.release:
        print(f"{name}: released to the policy at the daemon's next tick")
        return 0
    print(f"{name}: drain queued ({_bytes(answer.get('dirty_bytes'))} dirty), deadline {deadline:g} s, then"
          f" {args.end}" + (f", at {_bytes(rate)}/s" if rate else ""))
    return 0 if args.no_wait else follow(sock, args.volume, deadline, answer.get("request"))


def follow(sock: Path, volume: str, deadline: float, number: int | None = None) -> int:
    """Poll ``status`` until the operator's drain ends; a progress line each poll (overwritten on a terminal).
    ``number``: the daemon's for this request (None from a daemon that numbers none): status shows an earlier
    request's end until the daemon's next tick takes this one up."""
    from cachepilot.daemon.control import request

    tty = sys.stdout.isatty()
    end = time.monotonic() + deadline + GRACE_S
    seen_running = False
    while time.monotonic() < end:
        time.sleep(POLL_S)
        vol = next((v for v in request(sock, {"cmd": "status"}).get("volumes", []) if v.get("name") == volume), None)
        op = (vol or {}).get("operator_drain")
        if op is None or number is not None and op.get("request") != number:
            continue  # not taken up yet (the next tick)
        if op["state"] == "running":
            seen_running = True
            print(_progress(volume, op), end="\r" if tty else "\n", flush=True)
            continue
        if not seen_running and op.get("elapsed_s", 0) > deadline + GRACE_S:
            continue  # an older request's end, not ours
        if tty:
            print()
        return _ended(volume, op)
    print(f"{escape(volume)}: the daemon did not report the drain's end within {deadline + GRACE_S:g} s")
    return 1


def _progress(volume: str, op: dict[str, Any]) -> str:
    left, rate = op["dirty_bytes"], op["rate_bytes_s"]
    within = op.get("writeback_starts_within_s")
    if within is not None:  # a sleep of the kernel's own, begun before the drain (bcache's writeback_delay)
        how = f"write-back starts within {within:.0f} s ({escape(str(op.get('sleep_knob')))})"
    else:
        how = f"{_bytes(rate)}/s, ETA {f'{left / rate:.0f} s' if rate > 0 else 'unknown'}"
    return (f"{escape(volume)}: {_bytes(left)} left of {_bytes(op['start_dirty_bytes'])}, {how},"
            f" deadline in {op['deadline_in_s']:g} s")


def _ended(volume: str, op: dict[str, Any]) -> int:
    ok = op["state"] in ("done", "held")
    print(f"{escape(volume)}: drain {op['state']} after {op['elapsed_s']:g} s: {escape(op['detail'])}"
          + ("" if ok else f" ({_bytes(op['dirty_bytes'])} still dirty)"))
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = volume_command(sub, "drain", "drive a volume's dirty data to zero now, with progress (control socket; root)",
                       drain)
    p.add_argument("--deadline", default="10m", help="give up after this long (e.g. 90s, 10m; default 10m)")
    p.add_argument("--end", choices=("policy", "writethrough"), default="policy",
                   help="after the drain: the policy takes the volume back (default), or it stays write-through"
                        " until --release")
    p.add_argument("--rate", metavar="BYTES", help="write back at about this many bytes per second (e.g. 8MiB) "
                   "instead of the kind's full speed; bcache only (its rate controller): dm-cache, lvmcache and "
                   "dm-writecache have no write-back rate, only caps on the I/O in flight")
    p.add_argument("--release", action="store_true", help="give a held (or draining) volume back to the policy")
    p.add_argument("--no-wait", action="store_true", help="queue the drain and return (follow it in status)")
