"""`cachepilot top`: the hottest files per volume, refreshing (rich). Paths are looked up by handle when shown."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cachepilot.commands.probe import MAX_TICK_S, number
from cachepilot.commands.status import _bytes, socket_arg, socket_path
from cachepilot.display import escape, path_of


def table(answer: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Table | Text] = []
    now = time.monotonic_ns()
    for v in answer["volumes"]:
        title = escape(f"{v['name']} ({v['dev']}) {v['mountpoint'] or ''}")
        t = Table(title=Text(title), title_justify="left")
        for col, just in (("SCORE", "right"), ("READ", "right"), ("WRITE", "right"), ("SIZE", "right"),
                          ("IDLE", "right"), ("INODE", "right"), ("FILE", "left")):
            t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]  # never hide a name
        for f in v["files"]:
            idle = max(0.0, (now - f["last_ns"]) / 1e9) if f["last_ns"] else 0.0
            t.add_row(str(f["score"]), str(f["read_score"]), str(f["write_score"]),
                      _bytes(f["size"]) if f["size"] >= 0 else "?", f"{idle:.0f}s", str(f["ino"]),
                      Text(path_of(v["mountpoint"], f["ino"], f["gen"])))  # Text: names are never markup
        if not v["files"]:
            t.add_row("-", "-", "-", "-", "-", "-", Text("(no file activity yet)"))
        parts.append(t)
    if not parts:
        parts.append(Text("no volume"))
    return Group(*parts)


def top(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from cachepilot.daemon.control import request

    interval = number("interval", args.interval, low=0, high=MAX_TICK_S, low_ok=False)  # 0 would busy-loop
    path = socket_path(args)
    req = {"cmd": "top", "n": args.n, **({"volume": args.volume} if args.volume else {})}
    console = Console()
    if args.once:
        console.print(table(request(path, req)))
        return 0
    with Live(table(request(path, req)), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(table(request(path, req)))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("top", help="the hottest files per volume, refreshing (control socket; root)")
    socket_arg(p)
    p.add_argument("--volume", metavar="NAME", help="only this volume (e.g. bcache0)")
    p.add_argument("-n", type=int, default=20, help="files per volume (default 20)")
    p.add_argument("--interval", default="2", metavar="S",
                   help="seconds between refreshes, finite in (0, 3600] (default 2)")
    p.add_argument("--once", action="store_true", help="print once and exit")
    p.set_defaults(handler=top)
