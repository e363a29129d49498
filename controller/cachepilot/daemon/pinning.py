"""The daemon's half of pinning: the volume's pin patterns resolved to files (a bounded walk of its mounted
filesystem, fsfiles.walk) at adoption and after every reload, within the policy's cap, and handed to the engine
(models/pins.py keeps them cached). A file created later is pinned at the next reload.

The walk runs on a worker thread (:class:`PinWalks`), never on the loop's: on a large tree it took 6-9 s, every
reload stalled the ticks that long and `status` with them. The walk is bounded by its own budget (entries and
seconds, fsfiles.walk) and touches only the filesystem; the loop hands the result to the engine at its next tick,
unless a newer walk for the volume was asked for meanwhile (then that one runs next and this result is dropped)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachepilot.engine.engine import Engine
from cachepilot.fsfiles import WalkResult, walk
from cachepilot.models.pins import MAX_PIN_FILES, PinnedFile
from cachepilot.models.volume import VolumeInfo
from cachepilot.policy.model import Pin
from cachepilot.policy.pinpaths import Pattern, compile_patterns

log = logging.getLogger("cachepilot")

Walker = Callable[[str, tuple[Pattern, ...]], WalkResult]
SAY_AFTER_S = 2.0  # a walk running longer is said in the log (once)


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
    """Resolve and hand over at once, on the caller's thread (tests, tools; the daemon uses :class:`PinWalks`)."""
    pin = _wanted(engine, info)
    if pin is not None:
        _hand_over(engine, info, *resolve(info, pin, walker), 0.0)


def _wanted(engine: Engine, info: VolumeInfo) -> Pin | None:
    """The volume's pin section if there is anything to do (also when the patterns went away: pins are cleared)."""
    ctl = engine.vols.get(info.dev)
    if ctl is None:
        return None
    pin = ctl.policy.pin
    return pin if pin.paths or len(ctl.pins) else None


def _hand_over(engine: Engine, info: VolumeInfo, files: list[PinnedFile], note: str, took_s: float) -> None:
    engine.set_pins(info.name, files, note)
    log.info("%s: %d file(s) pinned (%d bytes, walked in %.1f s)%s", info.name, len(files),
             sum(f.size for f in files), took_s, f": {note!r}" if note else "")  # repr: the note may carry the mount


@dataclass
class _Walk:
    info: VolumeInfo
    pin: Pin
    thread: threading.Thread | None = None
    started: float = 0.0
    result: tuple[list[PinnedFile], str] | None = None
    again: tuple[VolumeInfo, Pin] | None = None  # asked for while this one ran: walked next
    said: bool = False  # "still walking" logged


class PinWalks:
    """The daemon's pin walks, one worker thread per volume at a time; ``submit`` and ``collect`` are the loop's."""

    def __init__(self, walker: Walker = _walk) -> None:
        self.walker = walker
        self._walks: dict[int, _Walk] = {}

    def submit(self, engine: Engine, info: VolumeInfo) -> None:
        pin = _wanted(engine, info)
        if pin is None:
            return
        w = self._walks.get(info.dev)
        if w is not None:
            w.again = (info, pin)  # the running walk's result is stale: the newer one runs after it
            return
        self._start(info, pin)

    def _start(self, info: VolumeInfo, pin: Pin) -> None:
        w = _Walk(info, pin, started=time.monotonic())

        def run() -> None:
            try:
                w.result = resolve(info, pin, self.walker)
            except Exception as exc:  # noqa: BLE001 - a walk's bug is its volume's note, not the daemon's end
                w.result = ([], f"pin walk failed: {type(exc).__name__}: {exc}")

        w.thread = threading.Thread(target=run, name=f"cachepilot-pins-{info.name}", daemon=True)
        self._walks[info.dev] = w
        w.thread.start()

    def collect(self, engine: Engine) -> None:
        """Hand finished walks to the engine; start the walks asked for while one ran; say how long ones take."""
        for dev, w in list(self._walks.items()):
            if w.thread is not None and w.thread.is_alive():
                if not w.said and time.monotonic() - w.started > SAY_AFTER_S:
                    w.said = True
                    log.info("%s: pin walk still running after %.0f s (off the loop; bounded by its budget)",
                             w.info.name, time.monotonic() - w.started)
                continue
            del self._walks[dev]
            if w.again is not None:
                self._start(*w.again)
            elif w.result is not None and dev in engine.vols:
                _hand_over(engine, w.info, *w.result, time.monotonic() - w.started)

    def busy(self) -> int:
        """Walks running (or waiting for the loop to collect them)."""
        return len(self._walks)
