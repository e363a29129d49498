"""`cachepilot record --out FILE`: capture the live event stream (eBPF probe) into a trace file."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from cachepilot.backends.host import Host
from cachepilot.backends.inspect import block_name, describe_volume, sample_volume
from cachepilot.commands.probe import MAX_RUN_S, MAX_TICK_S, device_node, number
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
        host = Host()
        mountpoint, _ = host.mount_of(dev)
        # freed extents are counted in filesystem blocks: 1 KiB on a small ext4, not always 4 KiB
        return VolumeInfo(dev=dev, name=name, kind="none", fs_block_size=host.fs_block_size(mountpoint))


def record(args: argparse.Namespace) -> int:
    duration = number("duration", args.duration, low=0, high=MAX_RUN_S)
    tick_s = number("tick", args.tick, low=0, high=MAX_TICK_S, low_ok=False)
    volumes = [_volume(device_node(v)) for v in args.volume]  # the forms `probe --dev` takes
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

        loop = TickLoop(tick_s, tick, wait=lambda s: write(probe.poll(timeout_ms=int(s * 1000))))
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        signal.signal(signal.SIGINT, lambda *_: loop.stop())
        # Said once the programs are attached, so that a caller can start its workload then.
        print(f"cachepilot record: recording {', '.join(v.name for v in volumes)} to {args.out}",
              file=sys.stderr, flush=True)
        loop.run(deadline_ns=loop.clock_ns() + int(duration * 1e9) if duration else None)
        n = w.total
    print(f"wrote {n} records to {args.out}")
    for v in volumes:
        print(f"epochs {v.name}: {epochs[v.dev].summary()}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("record", help="record the live event stream to a trace file (needs root + eBPF)")
    p.add_argument("--out", required=True, metavar="FILE")
    p.add_argument("--volume", action="append", required=True, metavar="DEV|DIR",
                   help="required, repeatable: a cached block device, or a directory on a mounted filesystem that "
                   "has a block device (as `probe --dev`)")
    p.add_argument("--duration", default="0", metavar="S",
                   help="seconds, finite >= 0 (default 0: until SIGINT/SIGTERM)")
    p.add_argument("--tick", default="1", metavar="S",
                   help="seconds between drains/ticks, finite in (0, 3600] (default 1)")
    p.set_defaults(handler=record)
