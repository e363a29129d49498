"""`cachepilot attach VOLUME [CACHE]`: put a cache back under a device the daemon lists as detached (issue 36),
through the running daemon: bcache the cache set's UUID written to ``attach`` (read back from the ``cache`` link),
dm-cache / dm-writecache the table ``detach`` replaced loaded again, lvmcache ``lvconvert --type cache --cachepool
VG/POOL``; then the daemon adopts the volume again. CACHE defaults to what ``detach`` saved. Exit 0 once the volume
is managed again, 1 when the attach failed (the kernel's answer said)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from cachepilot.commands.status import socket_path, volume_command
from cachepilot.display import escape

WAIT_S = 30.0  # the attach is done at the daemon's next tick; adoption at the rescan it asks for


def attach(args: argparse.Namespace) -> int:
    from cachepilot.daemon.control import request

    sock = socket_path(args)
    req = {"cmd": "attach", "volume": args.volume} | ({"cache": args.cache} if args.cache else {})
    answer = request(sock, req)
    name = escape(str(answer.get("queued", args.volume)))
    print(f"{name}: attach queued ({escape(str(answer.get('kind')))}, cache {escape(str(answer.get('cache')))})")
    return follow(sock, str(answer.get("queued", args.volume)))


def follow(sock: Path, volume: str) -> int:
    from cachepilot.daemon.control import request

    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        time.sleep(1.0)
        s = request(sock, {"cmd": "status"})
        vol = next((v for v in s.get("volumes", []) if v.get("name") == volume), None)
        if vol is not None:
            mode = f", {escape(str(vol['mode']))}" if vol.get("mode") else ""  # None until its first sample
            print(f"{escape(volume)}: attached and managed again ({escape(str(vol.get('kind')))}{mode})")
            return 0
        d = next((d for d in s.get("detached", []) if d.get("name") == volume), None)
        if d is not None and d.get("attach_error"):
            print(f"{escape(volume)}: attach failed: {escape(d['attach_error'])}")
            return 1
    print(f"{escape(volume)}: not adopted within {WAIT_S:g} s (cachepilot status says why)")
    return 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = volume_command(sub, "attach", "put a cache back under a detached device, then manage it again (control"
                       " socket; root)", attach, "the device's name as status lists it under detached")
    p.add_argument("cache", metavar="CACHE", nargs="?",
                   help="bcache: the cache set UUID; lvmcache: VG/POOL; dm kinds: the table line (default: what"
                        " detach saved)")
