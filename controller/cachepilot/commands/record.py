"""`cachepilot record --out FILE`: capture the live event stream (eBPF probe) into a trace file."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from cachepilot.backends import inspect
from cachepilot.backends.inspect import block_name, describe_volume, fs_block_size, sample_volume
from cachepilot.daemon.loop import TickLoop
from cachepilot.errors import CachepilotError, UserError
from cachepilot.events import Barrier, SyncCalls
from cachepilot.models.epochs import EpochTracker
from cachepilot.models.volume import VolumeInfo
from cachepilot.trace.format import Tick, TraceWriter


def _volume(path: str) -> VolumeInfo:
    """The cached volume behind a device node; a plain block device is recorded too (events only, no samples)."""
    try:
        return describe_volume(path)
    except CachepilotError as exc:
        name, dev = block_name(path)  # re-raises a clear error for a missing or non-block path
        print(f"cachepilot record: {exc}; recording its events without cache samples", file=sys.stderr)
        mountpoint, _ = inspect._mount_of(dev)  # noqa: SLF001 - the one mountinfo reader
        # freed extents are counted in filesystem blocks: 1 KiB on a small ext4, not always 4 KiB
        return VolumeInfo(dev=dev, name=name, kind="none", fs_block_size=fs_block_size(mountpoint))


def record(args: argparse.Namespace) -> int:
    volumes = [_volume(v) for v in args.volume]
    if not volumes:
        raise UserError("name at least one --volume to record (e.g. --volume /dev/bcache0)")
    try:
        from cachepilot.probe import Probe  # the live probe is optional: lazy import
    except ImportError as exc:
        raise UserError(f"the live probe (cachepilot.probe) is not available: {exc}") from None
    epochs = {v.dev: EpochTracker() for v in volumes}  # the live epochs, to compare with a replay

    def write(events: list) -> None:  # type: ignore[type-arg]
        for ev in events:
            if isinstance(ev, Barrier | SyncCalls) and ev.dev in epochs:
                epochs[ev.dev].feed(ev)
        w.write_many(events)

    with Probe() as probe, TraceWriter(args.out, volumes, {"source": "cachepilot record"}) as w:
        for v in volumes:
            probe.watch_volume(v.dev)
        sampled = [v for v in volumes if v.kind != "none"]

        def tick(now_ns: int) -> None:
            write(probe.drain())
            for v in list(sampled):
                try:
                    w.write(sample_volume(v))
                except CachepilotError as exc:  # a vanished device ends its samples, not the recording
                    print(f"cachepilot record: {v.name}: {exc}", file=sys.stderr)
                    sampled.remove(v)
            w.write(Tick(time.monotonic_ns()))
            w.flush_block()  # every tick on disk: a killed recording loses at most the events since the last one

        loop = TickLoop(args.tick, tick, wait=lambda s: write(probe.poll(timeout_ms=int(s * 1000))))
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        signal.signal(signal.SIGINT, lambda *_: loop.stop())
        # Said once the programs are attached, so that a caller can start its workload then.
        print(f"cachepilot record: recording {', '.join(v.name for v in volumes)} to {args.out}",
              file=sys.stderr, flush=True)
        loop.run(deadline_ns=loop.clock_ns() + int(args.duration * 1e9) if args.duration else None)
        n = w.total
    print(f"wrote {n} records to {args.out}")
    for v in volumes:
        print(f"epochs {v.name}: {epochs[v.dev].summary()}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("record", help="record the live event stream to a trace file (needs root + eBPF)")
    p.add_argument("--out", required=True, metavar="FILE")
    p.add_argument("--volume", action="append", default=[], metavar="DEV", help="cached block device")
    p.add_argument("--duration", type=float, default=0.0, help="seconds (default: until SIGINT/SIGTERM)")
    p.add_argument("--tick", type=float, default=1.0, help="seconds between drains/ticks")
    p.set_defaults(handler=record)
