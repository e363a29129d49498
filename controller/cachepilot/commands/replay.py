"""`cachepilot replay TRACE`: drive the models and the engine from a recorded trace, deterministically;
with --against, diff the decisions of two policies on the same trace."""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from cachepilot.errors import UserError
from cachepilot.policy import DEFAULT_POLICY, load_policy
from cachepilot.trace import replay as run_replay
from cachepilot.trace.replay import unknown_volumes_warning


def _policy(path: str | None):  # type: ignore[no-untyped-def]
    return DEFAULT_POLICY if path is None else load_policy(path)


def replay(args: argparse.Namespace) -> int:
    try:
        return _replay(args)
    except BrokenPipeError:  # `cachepilot replay T | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _replay(args: argparse.Namespace) -> int:
    a = run_replay(args.trace, _policy(args.policy), args.volume)
    warning = unknown_volumes_warning(a)
    if warning:
        print(f"cachepilot: {warning}", file=sys.stderr)
    if a.cut:
        print(f"cachepilot: warning: {args.trace}: {a.cut}", file=sys.stderr)
    cut = f"; {a.cut}" if a.cut else ""
    if args.against is None:
        if not args.quiet:
            for d in a.decisions:
                print(d.line())
        kinds: dict[str, int] = {}
        for d in a.decisions:
            kinds[d.action.kind] = kinds.get(d.action.kind, 0) + 1
        summary = ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())) or "no actions"
        print(f"# {a.events} records, {a.ticks} ticks, {len(a.decisions)} decisions ({summary}); "
              f"{a.cpu_s:.2f} s CPU{cut}")
        return 0
    if a.stream:
        raise UserError(f"{args.trace}: --against replays the trace twice: give a file, not a pipe")
    b = run_replay(args.trace, _policy(args.against), args.volume)
    la = [d.line() + "\n" for d in a.decisions]
    lb = [d.line() + "\n" for d in b.decisions]
    diff = list(difflib.unified_diff(la, lb, fromfile=args.policy or "<built-in default>",
                                     tofile=args.against, n=0))
    print("".join(diff), end="")
    print(f"# {len(la)} vs {len(lb)} decisions, {sum(1 for x in diff if x[:1] in '+-') - 2 if diff else 0} "
          f"differing lines{cut}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("replay", help="replay a trace through the models and the engine")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--policy", metavar="FILE", help="policy file (default: the built-in default policy)")
    p.add_argument("--against", metavar="FILE", help="second policy: print the diff of the decisions")
    p.add_argument("--volume", metavar="NAME", help="only this volume's decisions")
    p.add_argument("-q", "--quiet", action="store_true", help="summary only")
    p.set_defaults(handler=replay)
