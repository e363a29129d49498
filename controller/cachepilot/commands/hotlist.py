"""`cachepilot hotlist export VOLUME > FILE` (or `--out FILE`, written through safeio's one output path) and
`cachepilot hotlist import VOLUME FILE`: a warm handoff.

export: the hot list the daemon last wrote to its state file (every ``state_interval`` and at stop; the daemon may
run or not), each file named by its path relative to the volume's mount point (root: files are found by handle).
import: each path resolved under the volume's mount point on this host and checked (hotlist.py: generation and size,
else size and modification time), unknown and changed files skipped and counted, the rest handed to the running
daemon (control socket, root only), which re-warms them at once, faster than the volume's promotion rate
(engine/handoff.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cachepilot.commands.status import socket_arg, socket_path
from cachepilot.display import escape
from cachepilot.errors import UserError

REQUEST_BYTES = 3500  # below the control socket's 4 KiB per request


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir:
        return Path(args.state_dir)
    from cachepilot.daemon.config import DEFAULT_STATE_DIR, load_config

    return load_config(args.config).state_dir if args.config else Path(DEFAULT_STATE_DIR)


def _saved_volume(doc: dict[str, Any], name: str) -> dict[str, Any]:
    vols = doc.get("volumes", {})
    sv = vols.get(name) if isinstance(vols, dict) else None
    if not isinstance(sv, dict):
        known = ", ".join(sorted(str(k) for k in vols)) if isinstance(vols, dict) else ""
        raise UserError(f"the state file has no volume {name!r} (known: {known or 'none'})")
    return sv


def _mount_of(dev: str) -> str:
    from cachepilot.mountinfo import ProcMounts

    for m in ProcMounts().all():
        if m.dev == dev and m.root == "/":
            return m.mountpoint
    raise UserError(f"the filesystem of device {dev} is not mounted here: its files have no paths to export")


def export(args: argparse.Namespace) -> int:
    from cachepilot import hotlist
    from cachepilot.daemon.state import StateFile
    from cachepilot.safeio import check_output, write_atomic

    if args.out:
        check_output(args.out, "hot list")  # a planted link or an open directory: refused before anything is read
    state = StateFile(_state_dir(args))
    doc, why = state.read()
    if doc is None:
        raise UserError(f"no hot list to export: {why}")
    sv = _saved_volume(doc, args.volume)
    mount = _mount_of(str(sv.get("dev", "")))
    hot = sv.get("hot", [])
    hl, lost = hotlist.export(args.volume, str(sv.get("fs_uuid", "")), mount, hot if isinstance(hot, list) else [])
    if args.out:  # root writes it: through safeio's one output path (no link followed, 0644 set by descriptor)
        try:
            write_atomic(args.out, hl.dumps().encode(), "hot list", 0o644)
        except OSError as exc:
            raise UserError(f"{args.out}: cannot write hot list: {exc.strerror or exc}") from None
    else:
        sys.stdout.write(hl.dumps())
    print(f"{escape(args.volume)}: {len(hl.files)} hot file(s) exported from {escape(str(state.path))}"
          f" (written {_age(doc)}); {lost} left out (gone, renamed out of the mount, or unreadable)", file=sys.stderr)
    return 0


def _age(doc: dict[str, Any]) -> str:
    import time

    w = doc.get("written")
    return f"{time.time() - w:.0f} s ago" if isinstance(w, int | float) else "at an unknown time"


def _chunks(files: list[tuple[int, int, int, int]]) -> list[list[list[int]]]:
    """The files in requests of at most REQUEST_BYTES (and the daemon's per-request count)."""
    from cachepilot import hotlist

    out: list[list[list[int]]] = []
    cur: list[list[int]] = []
    size = 0
    for f in files:
        n = len(json.dumps(list(f))) + 2
        if cur and (size + n > REQUEST_BYTES or len(cur) >= hotlist.MAX_PER_REQUEST):
            out.append(cur)
            cur, size = [], 0
        cur.append(list(f))
        size += n
    if cur:
        out.append(cur)
    return out


def import_(args: argparse.Namespace) -> int:
    from cachepilot import hotlist
    from cachepilot.commands.probe import number
    from cachepilot.daemon.control import request
    from cachepilot.safeio import read_capped

    wait = number("wait", args.wait, low=0, high=86400)
    hl = hotlist.parse(read_capped(args.file, "hot-list file", hotlist.MAX_FILE_BYTES), str(args.file))
    sock = socket_path(args)
    vols = {v.get("name"): v for v in request(sock, {"cmd": "status"}).get("volumes", [])}
    v = vols.get(args.volume)
    if v is None:
        raise UserError(f"the daemon manages no volume {args.volume!r} (known: {', '.join(sorted(map(str, vols)))})")
    if not v.get("mountpoint"):
        raise UserError(f"volume {args.volume!r} has no filesystem mounted: nothing to resolve the paths in")
    queued, m = 0, hotlist.Matched()
    # hottest first, a request's worth at a time: the daemon starts on the hottest files while the rest resolve
    # (in the lab the CLI took 7 s before its one batch of requests; the re-warm waited meanwhile)
    for part in hotlist.match_in_parts(hl, str(v["mountpoint"]), hotlist.MAX_PER_REQUEST):
        m.add(part)
        for chunk in _chunks(part.files):
            queued += int(request(sock, {"cmd": "hotlist_import", "volume": args.volume, "files": chunk})["queued"])
    print(f"{escape(args.volume)}: {queued} of {len(hl.files)} file(s) handed to the daemon for re-warming"
          f" ({m.by_generation} matched by generation and size, {m.by_mtime} by size and mtime);"
          f" skipped: {m.unknown} unknown, {m.changed} changed")
    return _wait_rewarmed(sock, args.volume, wait) if wait else 0


def _wait_rewarmed(sock: Path, name: str, seconds: float) -> int:
    """Until the daemon has re-warmed what it was handed (0), or ``seconds`` passed (1). A handoff cuts the
    workload over once B is warm: measured in the lab, a re-warm that raced the workload's start won little,
    as the cache (dm-cache) promoted the hottest files from the workload's own misses as fast."""
    import time

    from cachepilot.daemon.control import request

    start = time.monotonic()
    first = None
    while True:
        st = request(sock, {"cmd": "status"})
        v = next((x for x in st.get("volumes", []) if x.get("name") == name), None)
        if v is None or "importing" not in v:
            raise UserError(f"--wait: the daemon reports no re-warm progress for {name!r} (gone, or a daemon older"
                            f" than this command)")
        ticks = int(st.get("last_tick", {}).get("n", 0))  # the daemon's tick count (status.TickStatus)
        first = ticks if first is None else first
        left = int(v["importing"])
        # a request may reach the loop a tick after the snapshot this read: two ticks on, the count includes it
        if ticks >= first + 2 and left == 0:
            print(f"{escape(name)}: re-warmed in {time.monotonic() - start:.1f} s")
            return 0
        if time.monotonic() - start >= seconds:
            print(f"{escape(name)}: {left} file(s) still being re-warmed after {seconds:g} s", file=sys.stderr)
            return 1
        time.sleep(0.2)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("hotlist", help="warm handoff: export a volume's hot list, import one into the daemon")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    e = verbs.add_parser("export", help="the hot list the daemon last saved, by path, as JSON on stdout (root)")
    e.add_argument("--config", metavar="FILE", help="the daemon's configuration (its state_dir)")
    e.add_argument("--state-dir", metavar="DIR", help="the daemon's state directory (default: its built-in one)")
    e.add_argument("--out", metavar="FILE", help="write the list to FILE (replaced atomically) instead of stdout")
    e.add_argument("volume", metavar="VOLUME", help="the volume's name as status shows it (e.g. bcache0)")
    e.set_defaults(handler=export)
    i = verbs.add_parser("import", help="re-warm a volume from an exported hot list (control socket; root)")
    socket_arg(i)
    i.add_argument("volume", metavar="VOLUME", help="the volume's name as status shows it (e.g. bcache0)")
    i.add_argument("file", metavar="FILE", help="a file written by `cachepilot hotlist export`")
    i.add_argument("--wait", metavar="SECONDS", default="0",
                   help="return once the daemon has re-warmed the list (exit 0) or after SECONDS (exit 1); finite in"
                        " [0, 86400], default 0: at once")
    i.set_defaults(handler=import_)
