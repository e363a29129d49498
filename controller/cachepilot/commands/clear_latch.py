"""`cachepilot clear-latch VOLUME`: let a latched volume back into write-back (after the operator checked or
replaced its cache device). The daemon clears it at its next tick; new cache errors latch it again."""

from __future__ import annotations

import argparse

from cachepilot.commands.status import socket_path, volume_command
from cachepilot.display import escape


def clear_latch(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request

    answer = request(socket_path(args), {"cmd": "clear_latch", "volume": args.volume})
    name = escape(args.volume)
    if answer.get("latched") is False:  # success all the same: the volume is not latched, as asked (exit 0)
        print(f"{name}: was not latched; nothing to clear")
    else:
        print(f"{name}: latch cleared at the daemon's next tick (see `cachepilot status`)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    volume_command(sub, "clear-latch", "let a latched volume back into write-back (control socket; root)",
                   clear_latch)
