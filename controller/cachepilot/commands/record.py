"""`cachepilot record --out FILE`: capture the live event stream (eBPF probe) into a trace file."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import time
from pathlib import Path

from cachepilot.errors import UserError
from cachepilot.events import kdev_from_st_dev
from cachepilot.models.volume import VolumeInfo
from cachepilot.trace.format import Tick, TraceWriter


def _volume(path: str) -> VolumeInfo:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISBLK(st.st_mode):
        raise UserError(f"{path}: not a block device")
    return VolumeInfo(dev=kdev_from_st_dev(st.st_rdev), name=Path(path).name)


def record(args: argparse.Namespace) -> int:
    volumes = [_volume(v) for v in args.volume]
    if not volumes:
        raise UserError("name at least one --volume to record (e.g. --volume /dev/bcache0)")
    try:
        from cachepilot.probe import Probe  # the live probe is optional: lazy import
    except ImportError as exc:
        raise UserError(f"the live probe (cachepilot.probe) is not available: {exc}") from None
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    deadline = time.monotonic() + args.duration if args.duration else None
    with Probe() as probe, TraceWriter(args.out, volumes, {"source": "cachepilot record"}) as w:
        for v in volumes:
            probe.watch_volume(v.dev)
        next_tick = time.monotonic() + args.tick
        while not stop and (deadline is None or time.monotonic() < deadline):
            w.write_many(probe.poll(timeout_ms=int(max(0.0, next_tick - time.monotonic()) * 1000)))
            if time.monotonic() >= next_tick:
                w.write_many(probe.drain())
                w.write(Tick(time.monotonic_ns()))
                next_tick += args.tick
        n = w.total
    print(f"wrote {n} records to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("record", help="record the live event stream to a trace file (needs root + eBPF)")
    p.add_argument("--out", required=True, metavar="FILE")
    p.add_argument("--volume", action="append", default=[], metavar="DEV", help="cached block device")
    p.add_argument("--duration", type=float, default=0.0, help="seconds (default: until SIGINT/SIGTERM)")
    p.add_argument("--tick", type=float, default=1.0, help="seconds between drains/ticks")
    p.set_defaults(handler=record)
