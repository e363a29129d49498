"""`cachepilot detach VOLUME`: take a volume's cache away safely through the running daemon (issue 36): an operator's
drain to verified clean (the progress line of `cachepilot drain`), then the kind's own detach, read back; the volume
stays mounted and serving from its origin, and the daemon stops managing it (status lists it under ``detached``).
A failed cache device that still holds dirty data is refused with one line naming the bytes (exit 2);
``--accept-loss`` detaches anyway. Exit 0 once detached, 1 when the drain or the detach failed (what is left said)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from cachepilot.commands.drain import GRACE_S, POLL_S, _progress
from cachepilot.commands.status import _bytes, socket_path, volume_command
from cachepilot.display import escape
from cachepilot.errors import UserError


def detach(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request
    from cachepilot.policy.values import parse_duration

    try:
        deadline = parse_duration(args.deadline)
    except ValueError as exc:
        raise UserError(f"--deadline: {exc}") from None
    sock = socket_path(args)
    answer = request(sock, {"cmd": "detach", "volume": args.volume, "deadline": deadline,
                            "accept_loss": bool(args.accept_loss)})
    name = escape(args.volume)
    loss = ", accepting the loss of its dirty data" if args.accept_loss else ""
    print(f"{name}: detach queued ({_bytes(answer.get('dirty_bytes'))} dirty): drain, verify clean, then detach,"
          f" deadline {deadline:g} s{loss}")
    return 0 if args.no_wait else follow(sock, args.volume, deadline, answer.get("request"))


def follow(sock: Path, volume: str, deadline: float, number: int | None = None) -> int:
    """Poll ``status``: the drain's progress, then the detach; done when status lists the volume as detached.
    ``number``: the daemon's for this request (None from a daemon that numbers none): status shows an earlier
    request's end until the daemon's next tick takes this one up."""
    from cachepilot.daemon.control import request

    tty = sys.stdout.isatty()
    end = time.monotonic() + deadline + GRACE_S
    said = ""  # the last state line printed: a state is said once, not every poll (bcache polls to "no cache")
    while time.monotonic() < end:
        time.sleep(POLL_S)
        s = request(sock, {"cmd": "status"})
        vol = next((v for v in s.get("volumes", []) if v.get("name") == volume), None)
        gone = next((d for d in s.get("detached", []) if volume in (d.get("name"), d.get("label"))), None)
        if vol is None and gone is not None:
            if tty:
                print()
            print(f"{escape(volume)}: detached ({escape(gone.get('why', ''))}); serving from its origin; "
                  f"attach puts back {escape(gone.get('cache') or 'a cache you name')}")
            return 0
        det = (vol or {}).get("operator_detach")
        if det is None or number is not None and det.get("request") != number:
            continue  # not taken up yet (the next tick)
        if det["state"] == "failed":
            if tty:
                print()
            print(f"{escape(volume)}: detach failed after {det['elapsed_s']:g} s: {escape(det['detail'])}")
            return 1
        op = (vol or {}).get("operator_drain")
        if det["state"] == "draining" and op is not None and op.get("state") == "running":
            print(_progress(volume, op), end="\r" if tty else "\n", flush=True)
        elif det["state"] != "draining" and det["state"] != said:
            said = det["state"]
            print(f"{escape(volume)}: {said}", end="\r" if tty else "\n", flush=True)
    print(f"{escape(volume)}: the daemon did not report the detach's end within {deadline + GRACE_S:g} s")
    return 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = volume_command(sub, "detach", "drain, verify clean and take a volume's cache away, the volume left serving"
                       " (control socket; root)", detach)
    p.add_argument("--deadline", default="10m", help="give up after this long (e.g. 90s, 10m; default 10m)")
    p.add_argument("--accept-loss", action="store_true",
                   help="detach a failed cache device even though its dirty data is lost with it")
    p.add_argument("--no-wait", action="store_true", help="queue the detach and return (follow it in status)")
