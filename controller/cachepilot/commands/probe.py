"""`cachepilot probe`: load the eBPF probe, watch volumes, print live events (debugging aid)."""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from dataclasses import asdict, is_dataclass

from cachepilot.daemon.loop import TickLoop
from cachepilot.errors import UserError
from cachepilot.events import Drops, kdev_from_st_dev, kdev_major_minor

MAX_RUN_S = 10 * 365 * 86400  # --seconds, record's --duration: ten years is "until stopped", not an overflow
MAX_TICK_S = 3600


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe",
        help="load the eBPF probe and print live events of watched volumes",
        description="Load the eBPF probe, watch the given volumes (block device or mountpoint) and print their "
        "events: freed extents, deletes, barriers, discards, journal commits as they come, per-file hotness and "
        "metadata deltas every tick, drop counters.",
    )
    p.add_argument("--dev", action="append", default=[], metavar="DEV",
                   help="cached block device (/dev/bcache0, /dev/mapper/x) or a mountpoint on it; repeatable")
    p.add_argument("--lower", action="append", default=[], metavar="DEV",
                   help="a backing or cache device below (its discards are reported); repeatable")
    p.add_argument("--seconds", default="0", help="stop after this long (0 = until Ctrl-C)")
    p.add_argument("--tick", default="1", help="seconds between hotness drains (default 1, at most 3600)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--dio-hook", choices=("auto", "iomap", "syscalls"), default="auto")
    p.add_argument("--max-files", default=str(1 << 18), help="files tracked per tick (kernel table size)")
    p.add_argument("--bpf-object", metavar="FILE",
                   help="the compiled probe (default: the packaged one, else the checkout's bpf/.output)")
    p.add_argument("--check", action="store_true",
                   help="load and attach, print what attached and the object used, then exit (no --dev needed)")
    p.set_defaults(handler=run)


def shown(arg: str) -> str:
    """A user-supplied string fit for a one-line message (newlines and control characters escaped)."""
    return ascii(arg)


def number(name: str, text: str, *, low: float, high: float, low_ok: bool = True) -> float:
    """A finite number within bounds, or a UserError naming the option (nan, inf and negatives never pass)."""
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--{name} {shown(text)}: not a number") from None
    if not math.isfinite(value) or value > high or value < low or (value == low and not low_ok):
        bound = f">= {low:g}" if low_ok else f"> {low:g}"
        raise UserError(f"--{name} {shown(text)}: must be a finite number {bound} and <= {high:g}")
    return value


def resolve_dev(arg: str) -> int:
    """Kernel dev_t of a block device node, or of the block device a mounted directory lives on."""
    try:
        st = os.stat(arg)
    except OSError as exc:
        raise UserError(f"{shown(arg)}: {exc.strerror}") from exc
    if stat.S_ISBLK(st.st_mode):
        return kdev_from_st_dev(st.st_rdev)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{shown(arg)}: neither a block device nor a directory on a mounted filesystem")
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if not os.path.exists(f"/sys/dev/block/{major}:{minor}"):
        raise UserError(f"{shown(arg)}: its filesystem has no block device ({major}:{minor}: tmpfs, proc, overlay...)")
    return kdev_from_st_dev(st.st_dev)


def device_node(arg: str) -> str:
    """The block device node for what ``resolve_dev`` accepts: the node itself, or /dev/NAME of the device a mounted
    directory's filesystem is on (so `record` takes the same forms as `probe`)."""
    dev = resolve_dev(arg)
    if stat.S_ISBLK(os.stat(arg).st_mode):
        return arg
    return f"/dev/{os.path.basename(os.path.realpath(f'/sys/dev/block/{_devname(dev)}'))}"


def _devname(dev: int) -> str:
    major, minor = kdev_major_minor(dev)
    return f"{major}:{minor}"


def format_event(ev: object, as_json: bool) -> str:
    assert is_dataclass(ev) and not isinstance(ev, type)
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

    seconds = number("seconds", args.seconds, low=0, high=MAX_RUN_S)
    tick = number("tick", args.tick, low=0, high=MAX_TICK_S, low_ok=False)
    max_files = number("max-files", args.max_files, low=1, high=1 << 26)
    if max_files != int(max_files):
        raise UserError(f"--max-files {shown(args.max_files)}: must be a whole number")
    if not args.dev and not args.check:
        raise UserError("--dev is required (or --check)")
    devs = [resolve_dev(d) for d in args.dev]
    lower = [resolve_dev(d) for d in args.lower]
    with Probe(args.bpf_object, max_files=int(max_files), dio_hook=args.dio_hook) as probe:
        print(probe.report.summary(), file=sys.stderr)
        if args.check:
            print(f"probe ok: {probe.object_path}")
            return 0
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

        def on_tick(_now: int) -> None:
            show(probe.drain())
            out.flush()

        loop = TickLoop(tick, on_tick, wait=lambda s: show(probe.poll(int(s * 1000))))
        loop.run(deadline_ns=loop.clock_ns() + int(seconds * 1e9) if seconds > 0 else None)
        show(probe.poll(0) + probe.drain())
    return 0
