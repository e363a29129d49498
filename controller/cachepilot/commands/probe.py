"""`cachepilot probe`: load the eBPF probe, watch volumes, print live events (debugging aid)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from dataclasses import asdict, is_dataclass

from cachepilot.daemon.loop import TickLoop
from cachepilot.errors import UserError
from cachepilot.events import Drops, kdev_from_st_dev, kdev_major_minor


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe",
        help="load the eBPF probe and print live events of watched volumes",
        description="Load the eBPF probe, watch the given volumes (block device or mountpoint) and print their "
        "events: freed extents, deletes, barriers, discards, journal commits as they come, per-file hotness and "
        "metadata deltas every tick, drop counters.",
    )
    p.add_argument("--dev", action="append", required=True, metavar="DEV",
                   help="cached block device (/dev/bcache0, /dev/mapper/x) or a mountpoint on it; repeatable")
    p.add_argument("--lower", action="append", default=[], metavar="DEV",
                   help="a backing or cache device below (its discards are reported); repeatable")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long (0 = until Ctrl-C)")
    p.add_argument("--tick", type=float, default=1.0, help="seconds between hotness drains (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--dio-hook", choices=("auto", "iomap", "syscalls"), default="auto")
    p.add_argument("--max-files", type=int, default=1 << 18, help="files tracked per tick (kernel table size)")
    p.set_defaults(handler=run)


def resolve_dev(arg: str) -> int:
    """Kernel dev_t of a block device node, or of the filesystem a path lives on."""
    try:
        st = os.stat(arg)
    except OSError as exc:
        raise UserError(f"{arg}: {exc.strerror}") from exc
    if stat.S_ISBLK(st.st_mode):
        return kdev_from_st_dev(st.st_rdev)
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return kdev_from_st_dev(st.st_dev)
    raise UserError(f"{arg}: neither a block device nor a path on a mounted filesystem")


def _devname(dev: int) -> str:
    major, minor = kdev_major_minor(dev)
    return f"{major}:{minor}"


def format_event(ev: object, as_json: bool) -> str:
    assert is_dataclass(ev)
    d = asdict(ev)
    for k in ("dev",):
        if k in d:
            d[k] = _devname(d[k])
    if isinstance(d.get("key"), dict):
        d["key"]["dev"] = _devname(d["key"]["dev"])
    if "kind" in d:
        d["kind"] = getattr(ev, "kind").name  # noqa: B009
    if as_json:
        return json.dumps({"event": type(ev).__name__, **d}, sort_keys=True)
    return f"{type(ev).__name__} " + " ".join(f"{k}={v}" for k, v in d.items())


def run(args: argparse.Namespace) -> int:
    from cachepilot.probe import Probe

    devs = [resolve_dev(d) for d in args.dev]
    lower = [resolve_dev(d) for d in args.lower]
    with Probe(max_files=args.max_files, dio_hook=args.dio_hook) as probe:
        print(probe.report.summary(), file=sys.stderr)
        for dev in devs:
            probe.watch_volume(dev, lower=lower)
        out = sys.stdout
        last_drops: object = None

        def show(events: list) -> None:
            nonlocal last_drops
            for ev in events:
                if not isinstance(ev, Drops) or ev != last_drops:  # unchanged drop counters once
                    print(format_event(ev, args.json), file=out)
                if isinstance(ev, Drops):
                    last_drops = ev

        def tick(_now: int) -> None:
            show(probe.drain())
            out.flush()

        loop = TickLoop(args.tick, tick, wait=lambda s: show(probe.poll(int(s * 1000))))
        loop.run(deadline_ns=loop.clock_ns() + int(args.seconds * 1e9) if args.seconds > 0 else None)
        show(probe.poll(0) + probe.drain())
    return 0
