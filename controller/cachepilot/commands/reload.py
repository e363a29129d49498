"""`cachepilot reload [--config FILE]`: make the running daemon re-read its configuration and policies, and wait for
its verdict (the unit's ExecReload). Exit 0 when the new ones run; exit 2 with the daemon's refusal line when they
are refused (the daemon keeps running the old ones); exit 2 too when no daemon answers."""

from __future__ import annotations

import argparse
import sys

from cachepilot.commands.status import socket_arg, socket_path

# the daemon waits up to 30 s (or three ticks) for its loop; the client waits a little longer for that answer
CLIENT_WAIT_S = 45.0


def reload(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request

    answer = request(socket_path(args), {"cmd": "reload"}, timeout=CLIENT_WAIT_S)
    if answer.get("reloaded") is True:
        print(f"cachepilot: {answer.get('message', 'reloaded')}")
        return 0
    print(f"cachepilot: reload refused, the running policy is kept: {answer.get('message', '?')}", file=sys.stderr)
    return 2


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("reload", help="re-read the configuration and policies; wait for the daemon's verdict (root)",
                       description=__doc__)
    socket_arg(p)
    p.set_defaults(handler=reload)
