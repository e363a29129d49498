"""The daemon's half of pinning: the volume's pin patterns resolved to files (a bounded walk of its mounted
filesystem, fsfiles.walk) at adoption and after every reload, within the policy's cap, and handed to the engine
(models/pins.py keeps them cached). A file created later is pinned at the next reload."""

from __future__ import annotations

import logging
from collections.abc import Callable

from cachepilot.engine.engine import Engine
from cachepilot.fsfiles import WalkResult, walk
from cachepilot.models.pins import MAX_PIN_FILES, PinnedFile
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy.model import Pin
from cachepilot.policy.pinpaths import Pattern, compile_patterns

log = logging.getLogger("cachepilot")

Walker = Callable[[str, tuple[Pattern, ...]], WalkResult]


def _walk(mount: str, pats: tuple[Pattern, ...]) -> WalkResult:
    return walk(mount, pats, max_files=MAX_PIN_FILES)


def resolve(info: VolumeInfo, pin: Pin, walker: Walker = _walk) -> tuple[list[PinnedFile], str]:
    """(files within the cap in walk order, a note on what was left out)."""
    if not pin.paths:
        return [], ""
    if not info.mountpoint:
        return [], "no filesystem mounted: nothing pinned"
    r = walker(info.mountpoint, compile_patterns(pin.paths))
    files: list[PinnedFile] = []
    total = over = 0
    for f in r.files:
        if total + f.size > pin.max_bytes:
            over += 1
            continue
        files.append(PinnedFile(f.path, f.ino, f.gen, f.size))
        total += f.size
    notes = []
    if over:
        notes.append(f"{over} matching file(s) left out: over the cap of {pin.max_bytes} bytes")
    if r.truncated:
        notes.append(f"walk stopped early ({r.truncated}): later files not pinned")
    if not r.files:
        notes.append("no file matches the patterns")
    return files, "; ".join(notes)


def apply(engine: Engine, info: VolumeInfo, walker: Walker = _walk) -> None:
    """Resolve and hand over (also when the patterns went away: the pins are then cleared)."""
    ctl = engine.vols.get(info.dev)
    if ctl is None:
        return
    pin = ctl.policy.pin
    if not pin.paths and not len(ctl.pins):
        return
    files, note = resolve(info, pin, walker)
    engine.set_pins(info.name, files, note)
    log.info("%s: %d file(s) pinned (%d bytes)%s", info.name, len(files), sum(f.size for f in files),
             f": {note!r}" if note else "")  # repr: the note may carry the mount point
