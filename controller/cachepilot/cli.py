"""The `cachepilot` command line.

Each subcommand lives in its own module under `cachepilot.commands` and exposes
`register(subparsers)`; that keeps one concept per module and lets a subcommand be
added without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from cachepilot import __version__, commands
from cachepilot.errors import CachepilotError


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with ``only`` (a command name) just that command's, so e.g. ``policy check`` does
    not import what the other commands need (the engine, numpy...): on a slow host, such as a fleet rollout's
    check of each policy, the start-up is most of its cost."""
    parser = argparse.ArgumentParser(prog="cachepilot", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"cachepilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if only is not None and info.name != only.replace("-", "_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = {m.name.replace("_", "-") for m in pkgutil.iter_modules(commands.__path__)}
    parser = build_parser(argv[0] if argv and argv[0] in names else None)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except CachepilotError as exc:  # bad input, or a device that vanished or refused: one line
        from cachepilot.display import escape  # the message may carry a name or the daemon's words: one safe line

        print(f"cachepilot: {escape(str(exc), backslash=False)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`cachepilot replay ... | head`): stop quietly, like any Unix filter.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
